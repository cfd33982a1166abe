// The host app's page: the stream in one element, the app's own buttons beside it.
const server = new URLSearchParams(location.search).get('server') || location.origin;
const token = new URLSearchParams(location.hash.slice(1)).get('token');
await import(new URL('/client/render-stream-element.js', server).href);

const view = document.getElementById('view');
const element = document.createElement('render-stream');
element.setAttribute('server', server);
element.setAttribute('quality', 'window');
if (token) element.setAttribute('token', token);
view.append(element);

const stateBox = document.getElementById('state');
element.addEventListener('state', ({ detail }) => { stateBox.textContent = `${detail.state} ${detail.reason || ''}`; });
element.addEventListener('stats', ({ detail: s }) => {
  stateBox.textContent = `streaming\n${s.width}×${s.height} ${s.fps.toFixed(0)} fps ${(s.kbps / 1000).toFixed(1)} Mbps`;
});

window.lastResult = null;
for (const button of document.querySelectorAll('button[data-command]')) {
  button.addEventListener('click', async () => {
    try {
      window.lastResult = await element.stream.command(button.dataset.command, JSON.parse(button.dataset.args));
    } catch (error) {
      window.lastResult = { error: error.code, message: error.message };
    }
  });
}
window.renderElement = element;
