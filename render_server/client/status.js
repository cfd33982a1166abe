// The status line over the stream (#status) of the designer page and the iframe embed.

/** Shows `text` in the status line (red where `isError`); an empty text hides it. */
export function showStatus(text, isError = false, box = document.getElementById('status')) {
  box.textContent = text;
  box.classList.toggle('hidden', !text);
  box.classList.toggle('error', isError);
}
