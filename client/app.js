// The designer page: full-window stream, mouse/wheel/keyboard/touch input, a stats overlay.
import { RenderStream, State } from './render-stream.js';

const stage = document.getElementById('stage');
const video = document.getElementById('video');
const statusBox = document.getElementById('status');
const $ = (id) => document.getElementById(id);

// a token, where the server asks for one, comes in the URL's fragment (#token=...): the
// fragment never leaves the browser, so it lands in no server log
const fragment = new URLSearchParams(location.hash.slice(1));
const stream = new RenderStream(video, { token: fragment.get('token') });
window.renderStream = stream;  // for tests and the browser console

function showStatus(text, isError = false) {
  statusBox.textContent = text;
  statusBox.classList.toggle('hidden', !text);
  statusBox.classList.toggle('error', isError);
}

stream.addEventListener('state', ({ detail }) => {
  document.body.dataset.state = detail.state;
  if (detail.state === State.CONNECTING) showStatus('Connecting…');
  else if (detail.state === State.STREAMING) showStatus('');
  else if (detail.state === State.QUEUED) showStatus('Every worker is busy: waiting in line…');
  else if (detail.state === State.RECONNECTING) showStatus('The worker went away: moving to another one…');
  else if (detail.state === State.ENDED) showStatus(`Session ended (${detail.reason || 'closed'}). Reload to start again.`);
  else if (detail.state === State.ERROR) showStatus(`Error: ${detail.reason}`, true);
});

stream.addEventListener('stats', ({ detail: s }) => {
  $('stat-fps').textContent = s.fps.toFixed(1);
  $('stat-bitrate').textContent = s.kbps >= 1000 ? `${(s.kbps / 1000).toFixed(2)} Mbps` : `${s.kbps.toFixed(0)} kbps`;
  $('stat-resolution').textContent = s.width ? `${s.width}×${s.height}` : '–';
  $('stat-codec').textContent = s.codec || '–';
  $('stat-rtt').textContent = s.rttMs === null ? '–' : `${s.rttMs.toFixed(1)} ms`;
  $('stat-session').textContent = (s.sessionId || '').slice(0, 8);
  $('stat-session').title = s.sessionId || '';
});

stream.addEventListener('queue', ({ detail }) => {
  showStatus(`Every worker is busy: you are number ${detail.position} in line…`);
});

stream.addEventListener('error', ({ detail }) => console.warn('render-server:', detail.code, detail.message));

// -- input: every coordinate in units of the element's height --------------------------------

function unit() { return stage.getBoundingClientRect().height || 1; }

function position(event) {
  const rect = stage.getBoundingClientRect();
  return { x: (event.clientX - rect.left) / rect.height, y: (event.clientY - rect.top) / rect.height };
}

function sendPointer(action, event) {
  const h = unit();
  stream.sendInput({
    type: 'pointer', action, ...position(event),
    dx: (event.movementX || 0) / h, dy: (event.movementY || 0) / h,
    buttons: event.buttons, shift: event.shiftKey,
  });
}

stage.addEventListener('pointerdown', (event) => {
  if (event.pointerType === 'touch') return;  // touch has its own handlers below
  stage.focus();
  stage.setPointerCapture(event.pointerId);
  sendPointer('down', event);
});
stage.addEventListener('pointermove', (event) => {
  if (event.pointerType !== 'touch') sendPointer('move', event);
});
stage.addEventListener('pointerup', (event) => {
  if (event.pointerType !== 'touch') sendPointer('up', event);
});
stage.addEventListener('contextmenu', (event) => event.preventDefault());

stage.addEventListener('wheel', (event) => {
  event.preventDefault();
  const scale = event.deltaMode === 1 ? 16 : event.deltaMode === 2 ? unit() : 1;
  stream.sendInput({ type: 'wheel', dy: event.deltaY * scale });
}, { passive: false });

const NAVIGATION_KEYS = new Set(['ArrowUp', 'ArrowDown', 'ArrowLeft', 'ArrowRight', 'PageUp', 'PageDown', 'Space']);
for (const action of ['down', 'up']) {
  stage.addEventListener(`key${action}`, (event) => {
    if (NAVIGATION_KEYS.has(event.code)) event.preventDefault();
    if (event.repeat) return;
    stream.sendInput({ type: 'key', action, code: event.code });
  });
}
window.addEventListener('blur', () => stream.sendInput({ type: 'blur' }));

function sendTouches(action, event) {
  event.preventDefault();
  const rect = stage.getBoundingClientRect();
  const touches = [...event.touches].slice(0, 10).map((t) => ({
    id: t.identifier, x: (t.clientX - rect.left) / rect.height, y: (t.clientY - rect.top) / rect.height,
  }));
  stream.sendInput({ type: 'touch', action, touches });
}
for (const [dom, action] of [['touchstart', 'start'], ['touchmove', 'move'], ['touchend', 'end'], ['touchcancel', 'cancel']]) {
  stage.addEventListener(dom, (event) => sendTouches(action, event), { passive: false });
}

stream.start().then(() => stage.focus(), (error) => console.warn('render-server: cannot stream:', error.message));
window.addEventListener('pagehide', () => stream.close('page_closed'));
