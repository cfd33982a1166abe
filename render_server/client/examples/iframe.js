// The host page of the iframe embed: it hands the token over by postMessage (never in a URL)
// and drives the stream with the message set of docs/embedding.md.
const server = new URLSearchParams(location.search).get('server') || location.origin;
const serverOrigin = new URL(server).origin;
const token = new URLSearchParams(location.hash.slice(1)).get('token');

const frame = document.createElement('iframe');
frame.src = new URL('/embed?quality=window', server).href;
frame.allow = 'fullscreen; gamepad';
frame.title = '3D view';
document.getElementById('view').append(frame);

const stateBox = document.getElementById('state');
const pending = new Map();
let nextId = 1;
window.embedMessages = [];

function send(message) {
  frame.contentWindow.postMessage({ renderStream: 1, ...message }, serverOrigin);
}

window.addEventListener('message', (event) => {
  // only the embed, from the render server's origin, speaks to this page
  if (event.source !== frame.contentWindow || event.origin !== serverOrigin) return;
  const message = event.data;
  if (!message || message.renderStream !== 1) return;
  window.embedMessages.push(message.type);
  if (message.type === 'ready') send({ type: 'connect', token });
  else if (message.type === 'state') stateBox.textContent = `${message.state} ${message.reason || ''}`;
  else if (message.type === 'stats') {
    const s = message.stats;
    stateBox.textContent = `streaming\n${s.width}×${s.height} ${s.fps.toFixed(0)} fps`;
    window.lastStats = s;
  } else if ((message.type === 'result' || message.type === 'error') && pending.has(message.id)) {
    pending.get(message.id)(message);
    pending.delete(message.id);
  }
});

/** Runs a scene command in the embedded stream; resolves with the embed's reply. */
window.embedCommand = (name, args = {}) => new Promise((resolve) => {
  const id = nextId++;
  pending.set(id, resolve);
  send({ type: 'command', id, name, args });
});

/** Opens a model file in the embedded stream (the embed uploads it); resolves with its reply. */
window.embedLoadScene = (file) => new Promise((resolve) => {
  const id = nextId++;
  pending.set(id, resolve);
  send({ type: 'loadScene', id, file });
});

for (const button of document.querySelectorAll('button[data-command]')) {
  button.addEventListener('click', () => window.embedCommand(button.dataset.command, JSON.parse(button.dataset.args)));
}
