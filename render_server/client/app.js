// The designer page: a full-window stream with a toolbar (quality, bitrate cap, mouse capture,
// stats, fullscreen, share) and a stats panel. Everything stream-related lives in the SDK;
// sharing (the Share panel, viewer mode for #watch=<token>, presence) in share-panel.js.
import { NO_BITRATE_CAP, RenderStream, STAGES, State, parseSize } from './render-stream.js';
import { MODEL_ACCEPT } from './scene-upload.js';
import { setupSharing, viewerMode, watchEndSentence } from './share-panel.js';
import { showStatus } from './status.js';

const $ = (id) => document.getElementById(id);
const stage = $('stage');

// a token, where the server asks for one, comes in the URL's fragment (#token=...): the
// fragment never leaves the browser, so it lands in no server log
const fragment = new URLSearchParams(location.hash.slice(1));
// ?codec=VP8 (or VP8,AV1): the codecs the stream may arrive in, best first; default: the SDK's
const codecs = (new URLSearchParams(location.search).get('codec') || '').split(',').filter(Boolean);
// a share link (#watch=<token>) opens the page as a viewer: it watches someone's session
const watching = viewerMode();
const stream = new RenderStream(stage, {
  token: fragment.get('token'), codecs: codecs.length ? codecs : null, watch: watching,
});
window.renderStream = stream;  // for tests and the browser console
setupSharing(stream, { watching });
// another link pasted over this one changes only the fragment, which loads nothing: the page
// starts again with the link it now shows (another session to watch, or a session of its own)
window.addEventListener('hashchange', () => location.reload());

// while streaming, the status line says only how to release a captured mouse
const streamingStatus = (locked) => (locked ? 'Mouse captured: Esc releases it' : '');

const REASONS = {
  signaling_lost: 'the connection to the server dropped',
  peer_lost: 'the video connection dropped',
  worker_lost: 'the worker went away: moving to another one',
  worker_disconnected: 'the worker went away: moving to another one',
  heartbeat_timeout: 'the worker stopped answering: moving to another one',
  worker_draining: 'the worker is being replaced: moving your session, camera and edits',
  moved: 'the session moves to another worker',
  not_streaming: 'the session is not streaming right now',
};

stream.addEventListener('state', ({ detail }) => {
  document.body.dataset.state = detail.state;
  switch (detail.state) {
    case State.CONNECTING: showStatus('Connecting…'); break;
    case State.STREAMING: showStatus(streamingStatus(stream.capture?.locked)); break;
    case State.QUEUED: showStatus('Every worker is busy: waiting in line…'); break;
    case State.RECONNECTING: showStatus(`Reconnecting (${REASONS[detail.reason] || detail.reason})…`); break;
    case State.ENDED:
      showStatus((watching && watchEndSentence(detail)) || `Session ended (${detail.reason || 'closed'}). Reload to start again.`);
      break;
    case State.ERROR: showStatus((watching && watchEndSentence(detail)) || `Error: ${detail.reason}`, true); break;
    default: break;
  }
});

stream.addEventListener('queue', ({ detail }) => {
  showStatus(`Every worker is busy: you are number ${detail.position} in line…`);
});

const ms = (value) => (value === null || value === undefined ? '–' : `${value.toFixed(1)} ms`);

stream.addEventListener('stats', ({ detail: s }) => {
  $('stat-fps').textContent = s.fps.toFixed(1);
  $('stat-bitrate').textContent = s.kbps >= 1000 ? `${(s.kbps / 1000).toFixed(2)} Mbps` : `${s.kbps.toFixed(0)} kbps`;
  $('stat-resolution').textContent = s.width ? `${s.width}×${s.height}` : '–';
  $('stat-codec').textContent = s.codec || '–';
  $('stat-loss').textContent = `${s.lossPercent.toFixed(2)} % (${s.packetsLost})`;
  $('stat-jitter').textContent = ms(s.jitterMs);
  $('stat-buffer').textContent = ms(s.jitterBufferDelayMs);
  $('stat-decode').textContent = ms(s.decodeMs);
  $('stat-rtt').textContent = ms(s.rttMs);
  $('stat-estimate').textContent = describeNetwork(s.network);
  showLatency(s.latency);
  $('stat-session').textContent = (s.sessionId || '').slice(0, 8);
  $('stat-session').title = s.sessionId || '';
});

// the worker's congestion control: its target and, below the size asked for, the step it sends
function describeNetwork(network) {
  if (!network) return '–';
  const rate = network.targetKbps >= 1000 ? `${(network.targetKbps / 1000).toFixed(1)} Mbps` : `${network.targetKbps} kbps`;
  const step = network.step ? ` · step ${network.step}: ${network.width}×${network.height}@${network.fps}` : '';
  return `${rate}${step}`;
}

const STAGE_LABELS = {
  input: 'input', wait: 'wait for frame', render: 'render', encode: 'encode', send: 'send',
  network: 'network', jitterBuffer: 'jitter buffer', decode: 'decode', display: 'display',
};

// a live stacked bar of the median of each stage, input to photon (or glass to glass when the
// camera has not moved lately), scaled so that 100 ms fills the bar
function showLatency(latency) {
  const first = latency && latency.firstMove;
  if (first && first.count) $('stat-first-move').textContent = `${ms(first.p50)} / ${ms(first.p95)}`;
  if (!latency || !latency.frames) return;
  const p50 = (summary) => (summary && summary.p50 !== null ? summary.p50 : null);
  $('stat-g2g').textContent = ms(p50(latency.glassToGlass));
  $('stat-i2p').textContent = ms(p50(latency.inputToPhoton));
  const withInput = p50(latency.inputToPhoton) !== null;
  const bar = $('latency-bar');
  const legend = $('latency-legend');
  bar.replaceChildren();
  legend.replaceChildren();
  for (const stage of STAGES) {
    const value = p50(latency.stages[stage]);
    if (value === null || (!withInput && (stage === 'input' || stage === 'wait'))) continue;
    const segment = document.createElement('span');
    segment.className = `stage stage-${stage}`;
    segment.style.width = `${Math.max(0, Math.min(100, value))}%`;
    segment.title = `${STAGE_LABELS[stage]}: ${value.toFixed(1)} ms`;
    segment.dataset.stage = stage;
    bar.append(segment);
    const item = document.createElement('li');
    item.className = `stage-${stage}`;
    item.textContent = `${STAGE_LABELS[stage]} ${value.toFixed(1)}`;
    legend.append(item);
  }
}

stream.addEventListener('error', ({ detail }) => console.warn('render-server:', detail.code, detail.message));

// -- toolbar ----------------------------------------------------------------------------------

function wantedQuality() {
  const choice = $('quality').value;
  const size = parseSize(choice);
  const initial = stream.session || {};
  const base = choice === 'window' ? { matchWindow: true }
    : size || { width: initial.width, height: initial.height, fps: initial.fps };
  // "Auto" lifts any cap: the worker clamps to its own configured bitrate
  return { ...base, maxKbps: Number($('bitrate').value) || NO_BITRATE_CAP };
}

async function applyQuality() {
  try {
    await stream.setQuality(wantedQuality());
  } catch (error) {
    console.warn('render-server: quality not applied:', error.message);
  }
  stage.focus({ preventScroll: true });
}
$('quality').addEventListener('change', applyQuality);
$('bitrate').addEventListener('change', applyQuality);

$('lock').addEventListener('click', () => stream.capture.lock().then(() => stage.focus({ preventScroll: true })));
stage.addEventListener('pointerlockchange', ({ detail }) => {
  document.body.classList.toggle('locked', detail.locked);
  $('lock').textContent = detail.locked ? 'Esc releases the mouse' : 'Capture mouse';
  if (stream.state === State.STREAMING) showStatus(streamingStatus(detail.locked));
});

// -- the designer's own model: chosen or dropped, uploaded, then streamed -------------------------

function showSceneStatus(text, error = false) {
  const status = $('scene-status');
  status.textContent = text;
  status.classList.toggle('hidden', !text);
  status.classList.toggle('error', error);
}

async function openModel(file) {
  if (!file) return;
  const name = file.name;
  try {
    const shown = await stream.loadScene(file, {
      onProgress: ({ phase, fraction }) => showSceneStatus(phase === 'upload'
        ? `Uploading ${name}… ${Math.round((fraction || 0) * 100)} %` : `Loading ${name}…`),
    });
    showSceneStatus(`${name}: ${shown.triangles.toLocaleString('en')} triangles`);
    setTimeout(() => { if ($('scene-status').textContent.startsWith(`${name}:`)) showSceneStatus(''); }, 5000);
  } catch (error) {
    showSceneStatus(`${name} was not opened: ${error.message}`, true);
  }
  stage.focus({ preventScroll: true });
}

$('model-file').accept = MODEL_ACCEPT;
$('open-model').addEventListener('click', () => $('model-file').click());
$('model-file').addEventListener('change', () => {
  openModel($('model-file').files[0]);
  $('model-file').value = '';  // the same file chosen again opens again
});
stage.addEventListener('dragover', (event) => {
  if (!event.dataTransfer?.types.includes('Files')) return;
  event.preventDefault();
  stage.classList.add('drop-target');
});
stage.addEventListener('dragleave', () => stage.classList.remove('drop-target'));
stage.addEventListener('drop', (event) => {
  event.preventDefault();
  stage.classList.remove('drop-target');
  openModel(event.dataTransfer?.files[0]);
});

$('toggle-stats').addEventListener('click', () => {
  const hidden = $('overlay').classList.toggle('hidden');
  $('toggle-stats').setAttribute('aria-pressed', String(!hidden));
});

$('fullscreen').addEventListener('click', () => {
  if (document.fullscreenElement) document.exitFullscreen();
  else document.documentElement.requestFullscreen?.().catch(() => {});
});

stream.start().then(() => stage.focus(), (error) => console.warn('render-server: cannot stream:', error.message));
// the session ends with the page, its slot freed at once: Firefox closes the page's sockets
// after beforeunload and before pagehide, so a session.end sent from pagehide never leaves
for (const type of ['beforeunload', 'pagehide']) window.addEventListener(type, () => stream.close('page_closed'));
