// The render server's browser SDK: one stream into a page element. Plain ES module, no build
// step, no dependencies; typed by render-stream.d.ts (a test keeps the two in step).
//
//   import { RenderStream } from 'https://render.example/client/render-stream.js';
//   const stream = await RenderStream.connect(document.querySelector('#view'), { token });

import { InputCapture } from './input-capture.js';
import { SENDABLE_CODECS, answeredCodec, preferCodecs, rankCodecs } from './codecs.js';
import { FirstMoveMeter } from './first-move.js';
import { LatencyMeter, STAGES } from './latency.js';
import { UploadError, uploadScene } from './scene-upload.js';

export { FirstMoveMeter, InputCapture, LatencyMeter, SENDABLE_CODECS, STAGES, UploadError, rankCodecs };

export const PROTOCOL_VERSION = 1;
export const SUBPROTOCOL = 'render-server.v1';

/** Connection states, in the order a healthy session goes through them. */
export const State = Object.freeze({
  IDLE: 'idle',
  CONNECTING: 'connecting',
  QUEUED: 'queued',
  STREAMING: 'streaming',
  RECONNECTING: 'reconnecting',
  ENDED: 'ended',
  ERROR: 'error',
});

const TERMINAL = new Set([State.ENDED, State.ERROR]);
// states that the first displayed frame turns into `streaming`
const AWAITING_FRAMES = new Set([State.CONNECTING, State.QUEUED, State.RECONNECTING]);
const DEFAULT_RECONNECT = Object.freeze({ attempts: 8, baseDelayMs: 250, maxDelayMs: 4000 });
const PEER_DISCONNECT_GRACE_MS = 1500;  // ICE "disconnected" often heals by itself
const PEER_CONNECT_TIMEOUT_MS = 10000;
const REQUEST_TIMEOUT_MS = 10000;
const SHARE_TIMEOUT_MS = 10000;
const RESIZE_DEBOUNCE_MS = 300;
const PING_FIRST_MS = 100;  // five quick pings align the clocks at once, then one a second
const PING_EVERY_MS = 1000;
// input that steers the camera: numbered, so that frames can say which input they show
const STEERING = new Set(['pointer', 'wheel', 'key', 'touch', 'gamepad']);
// input that a page sends only while it steers (`presence`): anyone else's is refused
const STEERING_ONLY = new Set([...STEERING, 'blur']);
// errors on resume (or on watching again) that no retry can fix
const FINAL_RESUME_ERRORS = new Set(['unknown_session', 'forbidden', 'unauthorized']);
// a session that ended with one of these failed: the `error` event fires too
const FAILURE_ENDINGS = new Set(['worker_failed', 'no_capacity', 'open_timeout', 'lease_expired']);
// socket close codes of a replica that stops on purpose: resume on another one at once
const RESUME_AT_ONCE = new Set([1001, 1012, 1013]);

// an uploaded model's fetch, check, parse and tables on the worker (a big model on a slow CPU)
const SCENE_TIMEOUT_MS = 120000;

/** A `maxKbps` above any worker's own cap: no cap but the worker's configured bitrate. */
export const NO_BITRATE_CAP = 1000000;

/** An error from the server or the worker, with its machine-readable code. */
export class RenderStreamError extends Error {
  constructor(code, message) {
    super(message);
    this.name = 'RenderStreamError';
    this.code = code;
  }
}

/** What may go on the unordered `moves` channel: deltas, whose order does not matter. */
function isMove(event) {
  return event.type === 'wheel' || (event.type === 'pointer' && event.action === 'move');
}

function signalingUrl(server, path) {
  const url = new URL(path, server);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  return url.href;
}

function normalizeQuality(quality) {
  if (quality === 'window') return { matchWindow: true };
  return quality ? { ...quality } : null;
}

function even(n) { return Math.max(2, 2 * Math.floor(n / 2)); }

/** `'1280x720'` → `{width: 1280, height: 720}`; null for anything else. */
export function parseSize(text) {
  const size = /^(\d{2,5})x(\d{2,5})$/.exec(text || '');
  return size ? { width: Number(size[1]), height: Number(size[2]) } : null;
}

/**
 * One stream from the render server into `element`: a <video>, or any container (the SDK puts
 * a <video> in it and, unless `input: false`, captures mouse, keys, touch and gamepad on it).
 *
 * Events: `state` {state, reason}, `queue` {position}, `stats` (figures, once a second),
 * `quality` (what the worker applied), `presence` (who is connected, who steers), `error`
 * {code, message}, `message` (other worker messages).
 *
 * With `watch: {token, name}` (or `RenderStream.watch`) it watches a session someone shared
 * (docs/sharing.md) instead of starting one: the same stream, no steering until handed control.
 */
export class RenderStream extends EventTarget {
  /** Connects and resolves once the first frame plays; rejects with the reason it cannot. */
  static connect(element, options = {}) {
    const stream = new RenderStream(element, options);
    return stream.start().then(() => stream);
  }

  /**
   * Watches a shared session: `token` is the share link's (its `#watch=` fragment), `name` how
   * the session's other pages see this one. Resolves once the first frame plays.
   */
  static watch(element, { token, name = null, ...options } = {}) {
    return RenderStream.connect(element, { ...options, watch: { token, name } });
  }

  constructor(element, {
    server = location.origin, path = '/ws', token = null, requirements = null,
    input = true, pointerLock = false, quality = null, statsIntervalMs = 1000,
    reconnect = DEFAULT_RECONNECT, codecs = null, watch = null,
  } = {}) {
    super();
    if (element instanceof HTMLVideoElement) {
      this.video = element;
      this.container = element.parentElement || element;
    } else {
      this.container = element;
      this.video = element.querySelector('video') || element.appendChild(document.createElement('video'));
      Object.assign(this.video.style, { width: '100%', height: '100%', objectFit: 'contain', display: 'block' });
    }
    this.video.autoplay = true;
    this.video.muted = true;
    this.video.playsInline = true;
    this.server = server;
    this.path = path;
    this.token = token;
    // watch mode: the share link's token opens the socket and names the session to watch
    this.watchToken = watch ? String(watch.token ?? '') : null;  // '' is refused by the server
    this.viewerName = watch?.name || null;
    this.viewerId = null;  // this page's peer id in `presence`, from `session.watching`
    this.presence = null;  // the worker's last `presence` message: who is connected, who steers
    this.steering = this.watchToken === null;  // whether this page's input moves the camera
    this.requirements = requirements;
    // the codecs to ask for, best first (codecs.js): sent with `session.start`, so that only a
    // worker that sends one of them is chosen, and set as the offer's order
    this.codecs = null;
    this._codecs = rankCodecs(codecs).then((ranked) => { this.codecs = ranked; return ranked; }, () => []);
    this.reconnectPolicy = { ...DEFAULT_RECONNECT, ...reconnect };
    this.statsIntervalMs = statsIntervalMs;
    this.state = State.IDLE;
    this.reason = '';
    this.session = null;  // {sessionId, workerId, width, height, fps, codec, role}
    this.sessionId = null;  // the session's id, from its first `queue` or `session.started`
    this.resumeToken = null;
    this.position = null;
    this.quality = null;  // the worker's last `quality` message: what it renders now, its limits
    this.network = null;  // the worker's last `network` message: its estimate of the path, the step
    this.ws = null;
    this.pc = null;
    this.input = null;
    this.moves = null;  // the unordered channel of pointer moves and wheel turns
    this._wantedQuality = normalizeQuality(quality);
    this._nextId = 1;
    this._pending = new Map();  // request id → {resolve, reject, timer}
    this._shares = [];  // share() calls awaiting `session.shared`, oldest first
    this._watchSent = false;  // a `session.watch` awaits its `session.watching`
    this._qualityWaiters = [];
    this._attempt = 0;
    this._retryTimer = null;
    this._peerTimer = null;
    this._statsTimer = null;
    this._lastInbound = null;
    this._frozen = false;
    this._movingFrom = null;  // the peer of a worker that drains: its frames are not the move's end
    this._inputSeq = 0;
    this._pingTimer = null;
    this._windowPeer = null;  // the peer connection that was last sent the window's size
    this.latencyMeter = new LatencyMeter();
    this.firstMoveMeter = new FirstMoveMeter(this.video);
    this._freeze = this._makeFreezeCanvas();
    this._watchSize();
    this.capture = !(element instanceof HTMLVideoElement) && input
      ? new InputCapture(this, this.container, { pointerLock }) : null;
    this.ready = new Promise((resolve, reject) => { this._ready = { resolve, reject }; });
    this.ready.catch(() => {});  // a caller that never awaits `ready` must not see it unhandled
    this.closed = new Promise((resolve) => { this._closed = resolve; });
  }

  /** Opens the session; resolves when video plays (same promise as `ready`). */
  start() {
    if (this.state !== State.IDLE) return this.ready;
    this._setState(State.CONNECTING);
    this._openSocket(null);
    return this.ready;
  }

  /**
   * Sends one input event (see docs/data-channel.md); false if the channel is not open.
   * `timeStamp` is when the user acted (an event's `timeStamp`), for input-to-photon figures.
   */
  sendInput(event, timeStamp = performance.now()) {
    if (!this.input || this.input.readyState !== 'open') return false;
    // someone else steers: the worker would refuse it (a viewer, or the owner after a hand-over)
    if (!this.steering && STEERING_ONLY.has(event.type)) return false;
    const steering = STEERING.has(event.type);
    if (steering) {
      const seq = ++this._inputSeq;
      this.latencyMeter.onInput(seq, timeStamp);
      event = { ...event, seq };
    }
    // a move or a wheel turn on the unordered channel where it is open: over a lossy path a
    // lost packet of the ordered one holds back every later move until it is resent
    const unordered = isMove(event) && this.moves?.readyState === 'open';
    (unordered ? this.moves : this.input).send(JSON.stringify(event));
    // after the send: the pixel meter's sample of the picture must not hold the input back
    if (steering) this.firstMoveMeter.onSteer(event, timeStamp);
    return true;
  }

  /**
   * Latency percentiles (ms): glass-to-glass, input-to-photon and each stage, by the worker's
   * records; and `firstMove`, input-to-photon of the first move after stillness, by the pixels.
   */
  latency() { return { ...this.latencyMeter.summary(), firstMove: this.firstMoveMeter.summary() }; }

  /**
   * Asks the worker for a resolution, frame rate and bitrate cap: `{width, height, fps, maxKbps}`
   * (any subset); `matchWindow: true` (or just `'window'`) renders at the element's size in
   * device pixels and follows it on resize; `null` returns to the server's default. Resolves
   * with what the worker applied.
   */
  setQuality(quality) {
    this._wantedQuality = normalizeQuality(quality);
    return this._sendQuality();
  }

  /**
   * Mints a link that lets others watch this session live (its owner only; docs/sharing.md):
   * `ttlS` how long the link lets viewers join (60 s … 7 days, default the server's 1 hour),
   * `pageUrl` the page viewers open (default this one). Resolves with
   * `{token, url, expiresAt, qrSvg, sessionId}`; rejects with a RenderStreamError.
   */
  share({ ttlS = null, pageUrl = location.origin + location.pathname } = {}) {
    const message = { type: 'session.share' };
    if (pageUrl) message.pageUrl = pageUrl;
    if (ttlS !== null && ttlS !== undefined) message.ttlS = ttlS;
    return this._ownerRequest(message, 'session.shared').then((answer) => ({
      token: answer.token, url: answer.url ?? null, expiresAt: answer.expiresAt,
      qrSvg: answer.qrSvg ?? null, sessionId: answer.sessionId,
    }));
  }

  /**
   * Stops sharing (the owner only): every link minted so far opens nothing from now on, and
   * every viewer's stream ends (`revoked`). A later `share()` makes links that work.
   */
  stopSharing() {
    return this._ownerRequest({ type: 'session.unshare' }, 'session.unshared').then(() => undefined);
  }

  // a request of the session's owner on the signaling socket, answered by `answerType` (or
  // refused by the next `error`)
  _ownerRequest(message, answerType) {
    return new Promise((resolve, reject) => {
      if (this.watchToken !== null) {
        reject(new RenderStreamError('forbidden', 'a viewer cannot share the session'));
        return;
      }
      if (!this.session || !this.ws || this.ws.readyState !== WebSocket.OPEN
          || (this.state !== State.STREAMING && this.state !== State.RECONNECTING)) {
        reject(new RenderStreamError('not_connected', 'no session to share yet'));
        return;
      }
      const waiter = { resolve, reject, answerType };
      waiter.timer = setTimeout(() => {
        this._shares = this._shares.filter((w) => w !== waiter);
        reject(new RenderStreamError('timeout', `no ${answerType} in ${SHARE_TIMEOUT_MS} ms`));
      }, SHARE_TIMEOUT_MS);
      this._shares.push(waiter);
      this._send(message);
    });
  }

  /** Hands control (steering) to a peer of `presence` (its `id`; `'owner'` for the owner). */
  handControl(peerId) { return this.command('control.hand', { to: peerId }); }

  /** The owner takes control back from whichever viewer steers. */
  takeControl() { return this.command('control.take'); }

  /**
   * The owner removes a viewer (its `presence` id): its stream ends (`removed`) and its page
   * does not watch again by itself. The link still opens: `stopSharing()` keeps everyone out.
   */
  removeViewer(peerId) { return this.command('control.remove', { peer: peerId }); }

  /** Asks the worker for a keyframe (rate-limited on the worker). */
  requestKeyframe() { return this.sendInput({ type: 'keyframe' }); }

  /** Runs a scene command on the worker (docs/data-channel.md); resolves with its result. */
  command(name, args = {}) {
    const id = this._nextId++;
    return new Promise((resolve, reject) => {
      if (!this.sendInput({ type: 'command', id, name, args })) {
        reject(new RenderStreamError('not_connected', 'the stream is not connected'));
        return;
      }
      const timer = setTimeout(() => {
        this._pending.delete(id);
        reject(new RenderStreamError('timeout', `no answer to ${name} in ${REQUEST_TIMEOUT_MS} ms`));
      }, REQUEST_TIMEOUT_MS);
      this._pending.set(id, { resolve, reject, timer });
    });
  }

  /**
   * Opens the designer's own model (a File or Blob with a name: .glb, .gltf, .obj, or a .zip of
   * a .gltf or .obj with its files): uploads it, then switches the session to it. The old scene
   * streams until the new one is ready. Resolves with `{id, ticket, triangles, objects}`;
   * rejects with an error whose `code` says why (the upload's or the worker's).
   * `onProgress({phase, fraction})`: 'upload' with the fraction sent, then 'loading'.
   */
  async loadScene(file, { onProgress = null, signal = null } = {}) {
    const progress = (phase, fraction = null) => {
      onProgress?.({ phase, fraction });
      this.dispatchEvent(new CustomEvent('sceneprogress', { detail: { phase, fraction } }));
    };
    progress('upload', 0);
    const upload = await uploadScene(this.server, this.token, file, {
      signal, onProgress: (fraction) => progress('upload', fraction),
    });
    progress('loading');
    const shown = await this.showScene(upload.id, upload.ticket);
    return { ...upload, ...shown };
  }

  /** Switches the session to an uploaded scene (its `id` and `ticket` from the upload). */
  showScene(id, ticket) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => { done(); reject(new RenderStreamError('timeout', `scene ${id} did not load in ${SCENE_TIMEOUT_MS / 1000} s`)); }, SCENE_TIMEOUT_MS);
      const onMessage = ({ detail }) => {
        if (detail.type !== 'scene' || detail.scene !== id) return;
        done();
        if (detail.status === 'loaded') resolve({ id, triangles: detail.triangles, objects: detail.objects });
        else reject(new RenderStreamError(detail.code || 'bad_scene', detail.message || 'the scene did not load'));
      };
      const done = () => { clearTimeout(timer); this.removeEventListener('message', onMessage); };
      this.addEventListener('message', onMessage);
      this.command('loadScene', { scene: id, ticket }).catch((error) => { done(); reject(error); });
    });
  }

  /** Ends the session and releases the worker slot. */
  close(reason = 'client_closed') {
    if (TERMINAL.has(this.state)) return;
    this._send({ type: 'session.end' });
    this._teardown();
    this._setState(State.ENDED, reason);
  }

  // -- signaling --------------------------------------------------------------------------

  _openSocket(resume) {
    // the token rides in a subprotocol: browsers cannot set headers on a WebSocket, and a
    // token in the URL would end up in logs
    const bearer = this.watchToken || this.token;
    const protocols = bearer ? [SUBPROTOCOL, `bearer.${bearer}`] : [SUBPROTOCOL];
    let ws;
    try {
      ws = new WebSocket(signalingUrl(this.server, this.path), protocols);
    } catch (error) {
      this._fail('bad_server', error.message);
      return;
    }
    this.ws = ws;
    ws.onopen = async () => {
      if (this.watchToken !== null) {
        this._sendWatch();
        return;
      }
      if (resume) {
        this._send({ type: 'session.resume', ...resume });
        return;
      }
      const codecs = await this._codecs;
      const requirements = codecs.length ? { ...(this.requirements || {}), codecs } : this.requirements;
      this._send(requirements ? { type: 'session.start', requirements } : { type: 'session.start' });
    };
    ws.onmessage = (event) => this._onSignal(event.data);
    ws.onclose = (event) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (TERMINAL.has(this.state)) return;
      const why = `signaling socket closed (${event.code}${event.reason ? ': ' + event.reason : ''})`;
      if (this.watchToken !== null && this.sessionId) {
        // closing the socket stopped the watch: watch again on a new one
        this._suspend('signaling_lost');
        this._retry(() => this._openSocket(null), why, RESUME_AT_ONCE.has(event.code) && this._attempt === 0);
      } else if (this.sessionId && this.resumeToken) {
        // the media may still flow peer to peer (or the page waits in the queue): keep it,
        // and get the session back
        this._setState(State.RECONNECTING, 'signaling_lost');
        const resume = () => this._openSocket({ sessionId: this.sessionId, resumeToken: this.resumeToken });
        this._retry(resume, why, RESUME_AT_ONCE.has(event.code) && this._attempt === 0);
      } else {
        this._fail('signaling_closed', why);
      }
    };
  }

  _sendWatch() {
    this._watchSent = true;
    this._send(this.viewerName ? { type: 'session.watch', token: this.watchToken, name: this.viewerName }
      : { type: 'session.watch', token: this.watchToken });
  }

  /** Watches again (a fresh `session.watch`, then a fresh offer): the worker's peer is gone. */
  _rewatch() {
    if (TERMINAL.has(this.state)) return;
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this._sendWatch();
    else if (!this.ws) this._openSocket(null);
    // a socket still opening sends it when it opens
  }

  _send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ v: PROTOCOL_VERSION, ...message }));
    }
  }

  async _onSignal(text) {
    let message;
    try { message = JSON.parse(text); } catch { return; }
    switch (message.type) {
      case 'session.started': {
        if (message.resumeToken) this.resumeToken = message.resumeToken;
        const sameWorker = this.session && this.session.workerId === message.workerId;
        this.session = message;
        this.sessionId = message.sessionId;
        if (sameWorker && this.pc && this.pc.connectionState === 'connected') {
          // a resumed signaling socket: the media never stopped
          this._attempt = 0;
          this._setState(State.STREAMING);
          break;
        }
        // another worker (a move, a lost worker): the last frame stays until the new one shows
        this._freezeFrame();
        await this._negotiate();
        break;
      }
      case 'session.watching':
        this._watchSent = false;
        // watching again (after a move, a dropped connection) takes this token: it outlives
        // the link's expiry while this page watches
        if (message.token) this.watchToken = message.token;
        this.viewerId = message.viewerId;
        this.session = { ...message, role: 'viewer' };
        this.sessionId = message.sessionId;
        this._freezeFrame();
        await this._negotiate();
        break;
      case 'viewer.ended':
        // an ending that belongs to the watch before the one just asked for
        if (this.watchToken === null || this._watchSent) break;
        if (message.retry) {
          this._suspend(message.code);
          this._retry(() => this._rewatch(), `${message.code}: ${message.message}`);
        } else if (message.code === 'session_ended') {
          this._teardown();
          this._setState(State.ENDED, message.code);
          this._ready.reject(new RenderStreamError(message.code, message.message));
        } else {
          this._fail(message.code, message.message);
        }
        break;
      case 'session.shared':
      case 'session.unshared': {
        const waiter = this._shares.find((w) => w.answerType === message.type);
        if (!waiter) break;
        this._shares = this._shares.filter((w) => w !== waiter);
        clearTimeout(waiter.timer);
        waiter.resolve(message);
        break;
      }
      case 'session.moving':
        // the worker drains: it streams on until the new worker's `session.started`, and its
        // frames meanwhile do not make the page `streaming` again (the move is still to come)
        this._movingFrom = this.pc;
        this._setState(State.RECONNECTING, message.reason || 'moving');
        break;
      case 'queue':
        // a waiting page that loses its socket resumes its place in the queue
        if (message.resumeToken) this.resumeToken = message.resumeToken;
        this.sessionId = message.sessionId;
        this.position = message.position;
        if (this.state !== State.QUEUED) this._setState(State.QUEUED, `position ${message.position}`);
        this.dispatchEvent(new CustomEvent('queue', { detail: { position: message.position } }));
        break;
      case 'session.interrupted':
        this._suspend(message.reason || 'worker_lost');
        break;
      case 'answer':
        if (this.session) this.session.codec = answeredCodec(message.sdp) || this.session.codec;
        if (this.pc) await this.pc.setRemoteDescription({ type: 'answer', sdp: message.sdp }).catch((e) => this._peerLost(`bad answer: ${e.message}`));
        break;
      case 'session.ended':
        this._teardown();
        this._setState(State.ENDED, message.reason);
        if (FAILURE_ENDINGS.has(message.reason)) {
          // failure is said, not hidden: the page's error handler hears of it
          this.dispatchEvent(new CustomEvent('error', { detail: { code: message.reason, message: `the session ended: ${message.reason}` } }));
        }
        this._ready.reject(new RenderStreamError('ended', `session ended: ${message.reason}`));
        break;
      case 'error':
        // a share refused: the caller of share() hears of it
        if (this._shares.length && (this.state === State.STREAMING || this.state === State.RECONNECTING)) {
          const waiter = this._shares.shift();
          clearTimeout(waiter.timer);
          waiter.reject(new RenderStreamError(message.code, message.message));
          break;
        }
        if (this.watchToken !== null && this._watchSent && this.state === State.RECONNECTING
            && !FINAL_RESUME_ERRORS.has(message.code)) {
          // watching again was not taken, for now: try again (on a socket of its own after
          // `bad_order`, for a server that wants one watch per socket)
          const fresh = message.code === 'bad_order';
          this._retry(() => { if (fresh) this._closeSocket(); this._rewatch(); }, `${message.code}: ${message.message}`);
          break;
        }
        // `_fail` dispatches the `error` event itself; an error the stream survives, here
        if (this.state === State.CONNECTING || this.state === State.QUEUED) {
          this._fail(message.code, message.message);
        } else if (this.state === State.RECONNECTING && FINAL_RESUME_ERRORS.has(message.code)) {
          this._fail(message.code, `cannot resume the session: ${message.message}`);
        } else {
          this.dispatchEvent(new CustomEvent('error', { detail: message }));
        }
        break;
      default:
        break;
    }
  }

  // -- media ------------------------------------------------------------------------------

  async _negotiate() {
    this._dropPeer();
    const pc = new RTCPeerConnection({ iceServers: this.session?.iceServers || [] });
    this.pc = pc;
    const transceiver = pc.addTransceiver('video', { direction: 'recvonly' });
    preferCodecs(transceiver, await this._codecs);
    const channel = pc.createDataChannel('input', { ordered: true });
    this.input = channel;
    // pointer moves and wheel turns: deltas, in any order (docs/data-channel.md)
    this.moves = pc.createDataChannel('moves', { ordered: false });
    // a size to match the window waits for the worker's first `quality` message: its limits
    channel.onopen = () => {
      if (this._wantedQuality && !this._wantedQuality.matchWindow) this._sendQuality().catch(() => {});
      this._startPings(channel);
    };
    channel.onmessage = (event) => this._onWorkerMessage(event.data);
    channel.onclose = () => { if (pc === this.pc) this._peerLost('data channel closed'); };
    pc.onicecandidate = ({ candidate }) => {
      if (pc !== this.pc) return;
      this._send(candidate
        ? { type: 'ice', candidate: candidate.candidate, sdpMid: candidate.sdpMid, sdpMLineIndex: candidate.sdpMLineIndex }
        : { type: 'ice', candidate: '' });
    };
    pc.ontrack = ({ track, receiver }) => {
      // a short jitter buffer: this is interactive video, not a film
      if ('jitterBufferTarget' in receiver) receiver.jitterBufferTarget = 0;
      this.video.srcObject = new MediaStream([track]);
      this._play();
      this._awaitFirstFrame(pc);
    };
    pc.onconnectionstatechange = () => {
      if (pc !== this.pc) return;
      const state = pc.connectionState;
      clearTimeout(this._peerTimer);
      if (state === 'failed' || state === 'closed') this._peerLost(`peer connection ${state}`);
      else if (state === 'disconnected') {
        this._peerTimer = setTimeout(() => this._peerLost('peer connection disconnected'), PEER_DISCONNECT_GRACE_MS);
      }
    };
    // a peer connection that never connects is as lost as one that dropped
    this._peerTimer = setTimeout(() => {
      if (pc === this.pc && pc.connectionState !== 'connected') this._peerLost('peer connection timed out');
    }, PEER_CONNECT_TIMEOUT_MS);
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    if (pc === this.pc) this._send({ type: 'offer', sdp: pc.localDescription.sdp });
  }

  _play() {
    // an autoplay policy (Safari's, a browser set to block autoplay) may refuse a play() that
    // no user gesture started, even muted: the next click, tap or key plays it
    this.video.play().catch(() => {
      const retry = () => this.video.play().catch(() => {});
      for (const type of ['pointerdown', 'keydown', 'touchend']) {
        document.addEventListener(type, retry, { once: true, capture: true });
      }
    });
  }

  _awaitFirstFrame(pc) {
    if (!this.video.requestVideoFrameCallback) {
      this.video.addEventListener('playing', () => {
        if (pc === this.pc && pc !== this._movingFrom) this._onStreaming();
      }, { once: true });
      return;
    }
    // every displayed frame: the first one means streaming; each one feeds the latency meter
    const shown = (now, meta) => {
      if (pc !== this.pc) return;
      if (this.state !== State.STREAMING && pc !== this._movingFrom) this._onStreaming();
      this.latencyMeter.onFrameShown(now, meta);
      this.firstMoveMeter.onFrameShown(now, meta);
      this.video.requestVideoFrameCallback(shown);
    };
    this.video.requestVideoFrameCallback(shown);
  }

  _startPings(channel) {
    clearTimeout(this._pingTimer);
    this.latencyMeter.reset();
    this.firstMoveMeter.disarm();  // a new peer's first frame is no answer to an earlier move
    let sent = 0;
    const ping = () => {
      if (channel !== this.input || channel.readyState !== 'open') return;
      channel.send(JSON.stringify({ type: 'ping', id: ++sent, t: performance.now() }));
      this._pingTimer = setTimeout(ping, sent < 5 ? PING_FIRST_MS : PING_EVERY_MS);
    };
    ping();
  }

  _onStreaming() {
    if (!AWAITING_FRAMES.has(this.state)) return;
    this._attempt = 0;
    this._unfreeze();
    this._setState(State.STREAMING);
    if (!this._statsTimer) this._statsTimer = setInterval(() => this._pollStats(), this.statsIntervalMs);
    this._ready.resolve(this);
  }

  _peerLost(why) {
    if (TERMINAL.has(this.state) || !this.pc) return;
    this._suspend('peer_lost');
    if (this.watchToken !== null) {
      // the worker let this viewer's peer go, or will: watch again, then offer again
      this._retry(() => this._rewatch(), why);
      return;
    }
    // a new offer on the same session: the worker keeps its camera, scene and encoder
    this._retry(() => {
      if (this.ws && this.ws.readyState === WebSocket.OPEN && this.session) this._negotiate();
      // without a socket, the socket's own reconnect renegotiates on `session.started`
    }, why);
  }

  /** The media is gone for now: keep its last frame on screen and wait for new media. */
  _suspend(reason) {
    this._freezeFrame();
    this._dropPeer();
    this._setState(State.RECONNECTING, reason);
  }

  _dropPeer() {
    clearTimeout(this._peerTimer);
    clearTimeout(this._pingTimer);
    const pc = this.pc;
    this.pc = null;
    this.input = null;
    this.moves = null;
    if (pc) pc.close();
  }

  _retry(action, why, atOnce = false) {
    clearTimeout(this._retryTimer);
    const { attempts, baseDelayMs, maxDelayMs } = this.reconnectPolicy;
    if (this._attempt >= attempts) {
      this._fail('reconnect_failed', `gave up after ${attempts} attempts: ${why}`);
      return;
    }
    const delay = atOnce ? 0 : Math.min(maxDelayMs, baseDelayMs * 2 ** this._attempt) * (0.75 + Math.random() / 2);
    this._attempt += 1;
    this._retryTimer = setTimeout(action, delay);
  }

  _onWorkerMessage(text) {
    const receivedAt = performance.now();
    let message;
    try { message = JSON.parse(text); } catch { return; }
    if (message.type === 'pong') { this.latencyMeter.onPong(message, receivedAt); return; }
    if (message.type === 'timing') { this.latencyMeter.onTiming(message.frames || []); return; }
    const pending = message.id !== undefined ? this._pending.get(message.id) : undefined;
    if (pending && (message.type === 'result' || message.type === 'error')) {
      this._pending.delete(message.id);
      clearTimeout(pending.timer);
      if (message.type === 'result') pending.resolve(message.value);
      else pending.reject(new RenderStreamError(message.code, message.message));
    }
    if (message.type === 'quality') {
      this.quality = message;
      for (const waiter of this._qualityWaiters.splice(0)) waiter(message);
      this.dispatchEvent(new CustomEvent('quality', { detail: message }));
      if (this._wantedQuality?.matchWindow && this._windowPeer !== this.pc) {
        this._windowPeer = this.pc;
        this._sendQuality().catch(() => {});
      }
    } else if (message.type === 'network') {
      this.network = message;
    } else if (message.type === 'presence') {
      this.presence = message;
      this.steering = message.steering === message.you;
      this.dispatchEvent(new CustomEvent('presence', { detail: message }));
    } else if (message.type === 'error') {
      this.dispatchEvent(new CustomEvent('error', { detail: message }));
    }
    this.dispatchEvent(new CustomEvent('message', { detail: message }));
  }

  // -- quality ----------------------------------------------------------------------------

  /** The element's size in device pixels, scaled down (keeping its shape) to the worker's limit. */
  windowSize() {
    const rect = this.container.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    let width = rect.width * dpr;
    let height = rect.height * dpr;
    const maxW = this.quality?.maxWidth || Infinity;
    const maxH = this.quality?.maxHeight || Infinity;
    const scale = Math.min(1, maxW / width, maxH / height);
    width *= scale; height *= scale;
    return { width: even(width), height: even(height) };
  }

  _sendQuality() {
    if (this.watchToken !== null) {
      // the stream's size, rate and bitrate are the owner's page's
      return Promise.reject(new RenderStreamError('forbidden', 'a viewer cannot set the quality'));
    }
    const wanted = this._wantedQuality;
    const initial = this.session || {};
    // null: back to the server's default size and rate, with no cap below the worker's own
    let message = wanted ? { type: 'quality', ...wanted }
      : { type: 'quality', width: initial.width, height: initial.height, fps: initial.fps, maxKbps: NO_BITRATE_CAP };
    if (wanted?.matchWindow) message = { ...message, ...this.windowSize() };
    delete message.matchWindow;
    for (const key of Object.keys(message)) if (message[key] === undefined) delete message[key];
    return new Promise((resolve, reject) => {
      if (!this.sendInput(message)) {
        reject(new RenderStreamError('not_connected', 'the stream is not connected'));
        return;
      }
      const timer = setTimeout(() => reject(new RenderStreamError('timeout', 'the worker did not confirm the quality')), REQUEST_TIMEOUT_MS);
      this._qualityWaiters.push((applied) => { clearTimeout(timer); resolve(applied); });
    });
  }

  _watchSize() {
    // aborted by `_teardown`: no media query listener or debounce timer outlives the stream
    this._sizeWatch = new AbortController();
    const { signal } = this._sizeWatch;
    this._resizeTimer = null;
    const changed = () => {
      if (signal.aborted) return;
      clearTimeout(this._resizeTimer);
      this._resizeTimer = setTimeout(() => {
        if (this._wantedQuality?.matchWindow && this.input?.readyState === 'open') this._sendQuality().catch(() => {});
      }, RESIZE_DEBOUNCE_MS);
    };
    if ('ResizeObserver' in window) {
      this._resizeObserver = new ResizeObserver(changed);
      this._resizeObserver.observe(this.container);
    }
    // a window dragged to a screen of another pixel density changes devicePixelRatio only;
    // the media query tells at once where the browser fires it, a slow poll catches the rest
    const watchDpr = () => {
      if (signal.aborted) return;
      const query = matchMedia(`(resolution: ${window.devicePixelRatio}dppx)`);
      query.addEventListener('change', () => { changed(); watchDpr(); }, { once: true, signal });
    };
    watchDpr();
    let dpr = window.devicePixelRatio;
    this._dprTimer = setInterval(() => {
      if (window.devicePixelRatio !== dpr) { dpr = window.devicePixelRatio; changed(); }
    }, 1000);
  }

  // -- the frozen frame -------------------------------------------------------------------

  _makeFreezeCanvas() {
    const canvas = document.createElement('canvas');
    canvas.className = 'render-stream-freeze';
    canvas.setAttribute('aria-hidden', 'true');
    Object.assign(canvas.style, {
      position: 'absolute', inset: '0', width: '100%', height: '100%', objectFit: 'contain',
      pointerEvents: 'none', display: 'none', background: 'transparent',
    });
    if (this.container !== this.video) {
      if (getComputedStyle(this.container).position === 'static') this.container.style.position = 'relative';
      this.video.after(canvas);
    }
    return canvas;
  }

  /** Keeps the last frame on screen while the media reconnects, instead of a black picture. */
  _freezeFrame() {
    if (this._frozen || !this.video.videoWidth || !this._freeze.isConnected) return;
    this._freeze.width = this.video.videoWidth;
    this._freeze.height = this.video.videoHeight;
    this._freeze.getContext('2d').drawImage(this.video, 0, 0);
    this._freeze.style.display = 'block';
    this._frozen = true;
  }

  _unfreeze() {
    this._freeze.style.display = 'none';
    this._frozen = false;
  }

  // -- statistics -------------------------------------------------------------------------

  /**
   * The current figures: fps, kbps, width, height, codec, rttMs, packetsLost, lossPercent,
   * jitterMs, jitterBufferDelayMs, decodeMs, framesDecoded, framesDropped, freezeCount,
   * nackCount, pliCount (rates over the time since the last periodic `stats` event), the
   * worker's `quality`, its `network` (congestion control: estimateKbps, targetKbps, step, ...;
   * null before the first or on a worker without it) and `latency` (as `latency()`).
   */
  async stats() {
    return this._stats(false);
  }

  async _stats(advance) {
    if (!this.pc) return null;
    const report = await this.pc.getStats();
    let inbound = null;
    let pair = null;
    const codecs = new Map();
    report.forEach((s) => {
      if (s.type === 'inbound-rtp' && s.kind === 'video') inbound = s;
      else if (s.type === 'candidate-pair' && s.nominated && s.state === 'succeeded') pair = s;
      else if (s.type === 'codec') codecs.set(s.id, s);
    });
    if (!inbound) return null;
    // rates are over the time since the last periodic poll, whoever asks
    const previous = this._lastInbound && this._lastInbound.id === inbound.id ? this._lastInbound : null;
    if (advance || !previous) this._lastInbound = inbound;
    const delta = (key) => (previous ? (inbound[key] || 0) - (previous[key] || 0) : (inbound[key] || 0));
    const seconds = previous ? (inbound.timestamp - previous.timestamp) / 1000 : 0;
    const frames = delta('framesDecoded');
    const emitted = delta('jitterBufferEmittedCount');
    const received = delta('packetsReceived');
    const lost = delta('packetsLost');
    const codec = codecs.get(inbound.codecId);
    return {
      sessionId: this.session?.sessionId,
      fps: seconds > 0 ? frames / seconds : (inbound.framesPerSecond || 0),
      kbps: seconds > 0 ? (8 * delta('bytesReceived')) / seconds / 1000 : 0,
      width: inbound.frameWidth || 0,
      height: inbound.frameHeight || 0,
      codec: codec ? codec.mimeType.replace(/^video\//, '') : '',
      rttMs: pair && pair.currentRoundTripTime !== undefined ? pair.currentRoundTripTime * 1000 : null,
      packetsLost: inbound.packetsLost || 0,
      lossPercent: received + lost > 0 ? (100 * Math.max(0, lost)) / (received + lost) : 0,
      jitterMs: inbound.jitter !== undefined ? inbound.jitter * 1000 : null,
      jitterBufferDelayMs: emitted > 0 ? (1000 * delta('jitterBufferDelay')) / emitted : null,
      decodeMs: frames > 0 ? (1000 * delta('totalDecodeTime')) / frames : null,
      framesDecoded: inbound.framesDecoded || 0,
      framesDropped: inbound.framesDropped || 0,
      freezeCount: inbound.freezeCount || 0,
      nackCount: inbound.nackCount || 0,
      pliCount: inbound.pliCount || 0,
      quality: this.quality,
      network: this.network,
      latency: this.latency(),
    };
  }

  async _pollStats() {
    try {
      const figures = await this._stats(true);
      if (figures) this.dispatchEvent(new CustomEvent('stats', { detail: figures }));
    } catch { /* the connection is closing */ }
  }

  // -- lifecycle --------------------------------------------------------------------------

  _setState(state, reason = '') {
    if (this.state === state && this.reason === reason) return;
    this.state = state;
    this.reason = reason;
    this.dispatchEvent(new CustomEvent('state', { detail: { state, reason } }));
    if (TERMINAL.has(state)) this._closed({ state, reason });
  }

  _fail(code, message) {
    if (TERMINAL.has(this.state)) return;
    this._teardown();
    this._setState(State.ERROR, `${code}: ${message}`);
    this.dispatchEvent(new CustomEvent('error', { detail: { code, message } }));
    this._ready.reject(new RenderStreamError(code, message));
  }

  _closeSocket() {
    const ws = this.ws;
    this.ws = null;
    if (ws) { ws.onclose = null; ws.close(); }
  }

  _teardown() {
    clearInterval(this._statsTimer);
    clearTimeout(this._retryTimer);
    this._statsTimer = null;
    this._resizeObserver?.disconnect();
    this._sizeWatch.abort();
    clearTimeout(this._resizeTimer);
    clearInterval(this._dprTimer);
    for (const { reject, timer } of this._pending.values()) {
      clearTimeout(timer);
      reject(new RenderStreamError('closed', 'the stream closed'));
    }
    this._pending.clear();
    for (const { reject, timer } of this._shares.splice(0)) {
      clearTimeout(timer);
      reject(new RenderStreamError('closed', 'the stream closed'));
    }
    this._closeSocket();
    this._dropPeer();
    this.capture?.detach();
  }
}
