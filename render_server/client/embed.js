// The iframe embed (/embed): a stream that its parent page drives through postMessage.
// The message set is in docs/embedding.md. Only the parent window, and only when its origin is
// the server's own or one the server allows (--allow-origin), may talk to the stream; everything
// else is ignored and counted.
import { RenderStream } from './render-stream.js';
import { showStatus } from './status.js';

const MARK = 'renderStream';
const stage = document.getElementById('stage');
const meta = document.querySelector('meta[name="render-server-allowed-origins"]');
const allowed = new Set([location.origin, ...(meta?.content || '').split(/\s+/).filter(Boolean)]);
const parentOrigin = location.ancestorOrigins?.length
  ? location.ancestorOrigins[0]
  : (document.referrer ? new URL(document.referrer).origin : null);
const params = new URLSearchParams(location.search);
const fragment = new URLSearchParams(location.hash.slice(1));

const embed = { stream: null, ignoredMessages: 0, parentOrigin };
window.renderEmbed = embed;  // for tests and the console

function post(message) {
  // never '*': the figures and results go to the one parent that is allowed to see them
  if (window.parent !== window && allowed.has(parentOrigin)) {
    window.parent.postMessage({ [MARK]: 1, ...message }, parentOrigin);
  }
}

// a share link's token (#watch=<token>, or `watch` in `connect`) watches that session instead
function connect({ token = fragment.get('token'), quality = params.get('quality'), watch = fragment.get('watch') } = {}) {
  if (embed.stream) return;
  const codecs = (params.get('codec') || '').split(',').filter(Boolean);
  const stream = new RenderStream(stage, {
    token, quality: quality || null, pointerLock: params.get('pointerLock') === '1',
    codecs: codecs.length ? codecs : null,
    watch: typeof watch === 'string' ? { token: watch, name: params.get('name') } : null,
  });
  embed.stream = stream;
  window.renderStream = stream;
  stream.addEventListener('state', ({ detail }) => {
    document.body.dataset.state = detail.state;
    showStatus({
      connecting: 'Connecting…', queued: 'Waiting in line…', reconnecting: 'Reconnecting…',
      ended: 'Session ended.', error: `Error: ${detail.reason}`,
    }[detail.state] || '', detail.state === 'error');
    post({ type: 'state', ...detail });
  });
  stream.addEventListener('queue', ({ detail }) => post({ type: 'queue', ...detail }));
  stream.addEventListener('stats', ({ detail }) => post({ type: 'stats', stats: detail }));
  stream.addEventListener('quality', ({ detail }) => post({ type: 'quality', quality: detail }));
  stream.addEventListener('presence', ({ detail }) => post({ type: 'presence', presence: detail }));
  stream.addEventListener('error', ({ detail }) => {
    if (detail.id === undefined) post({ type: 'error', code: detail.code, message: detail.message });
  });
  stream.start().catch(() => {});
}

async function handle(message) {
  const stream = embed.stream;
  switch (message.type) {
    case 'connect':
      connect({
        token: typeof message.token === 'string' ? message.token : null, quality: message.quality,
        watch: typeof message.watch === 'string' ? message.watch : null,
      });
      break;
    case 'input':
      if (message.event && typeof message.event === 'object') stream?.sendInput(message.event);
      break;
    case 'command': {
      const id = message.id;
      try {
        if (!stream) throw Object.assign(new Error('not connected'), { code: 'not_connected' });
        post({ type: 'result', id, value: await stream.command(String(message.name), message.args || {}) });
      } catch (error) {
        post({ type: 'error', id, code: error.code || 'failed', message: error.message });
      }
      break;
    }
    case 'loadScene': {
      // the parent's File or Blob (postMessage clones it); progress and outcome carry the id
      const id = message.id;
      try {
        if (!stream) throw Object.assign(new Error('not connected'), { code: 'not_connected' });
        if (!(message.file instanceof Blob)) throw Object.assign(new Error('`file` must be a File or Blob'), { code: 'bad_message' });
        const file = message.file instanceof File ? message.file
          : new File([message.file], String(message.name || 'model.glb'));
        const shown = await stream.loadScene(file, {
          onProgress: (progress) => post({ type: 'sceneProgress', id, ...progress }),
        });
        post({ type: 'result', id, value: { id: shown.id, triangles: shown.triangles, objects: shown.objects } });
      } catch (error) {
        post({ type: 'error', id, code: error.code || 'failed', message: error.message });
      }
      break;
    }
    case 'quality':
      stream?.setQuality(message.quality ?? null).catch(() => {});
      break;
    case 'keyframe':
      stream?.requestKeyframe();
      break;
    case 'close':
      stream?.close('closed_by_host');
      break;
    default:
      post({ type: 'error', code: 'unknown_message', message: `unknown message type ${String(message.type).slice(0, 40)}` });
  }
}

window.addEventListener('message', (event) => {
  const data = event.data;
  if (event.source !== window.parent || event.origin !== parentOrigin || !allowed.has(event.origin)
      || !data || typeof data !== 'object' || data[MARK] !== 1 || typeof data.type !== 'string') {
    embed.ignoredMessages += 1;
    return;
  }
  handle(data);
});

if (window.parent === window) {
  connect();  // opened on its own: just stream
} else if (!allowed.has(parentOrigin)) {
  showStatus(`This stream may not be embedded in ${parentOrigin || 'this page'}.`, true);
} else {
  if (fragment.has('token') || fragment.has('watch') || params.get('connect') === '1') connect();
  post({ type: 'ready' });
}
// the session ends with the page, its slot freed at once: Firefox closes the page's sockets
// after beforeunload and before pagehide, so a session.end sent from pagehide never leaves
for (const type of ['beforeunload', 'pagehide']) window.addEventListener(type, () => embed.stream?.close('page_closed'));
