// Connection logic of the render server's web client: signaling socket, peer connection,
// the `input` data channel and live statistics. Plain ES module, no dependencies.

export const PROTOCOL_VERSION = 1;

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

export const SUBPROTOCOL = 'render-server.v1';

function signalingUrl(server, path) {
  const url = new URL(path, server);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  return url.href;
}

/**
 * One stream from the render server into a <video> element.
 * Events: `state` ({state, reason}), `queue` ({position}), `stats` (figures, once a second),
 * `error` ({code, message}), `message` (data-channel messages from the worker).
 */
export class RenderStream extends EventTarget {
  /** Connects `video` to `server` and resolves once the first frame is playing. */
  static async connect(video, options = {}) {
    const stream = new RenderStream(video, options);
    await stream.start();
    return stream;
  }

  constructor(video, {
    server = location.origin, path = '/ws', token = null, requirements = null, statsIntervalMs = 1000,
  } = {}) {
    super();
    this.video = video;
    this.server = server;
    this.path = path;
    this.token = token;
    this.requirements = requirements;
    this.resumeToken = null;
    this.statsIntervalMs = statsIntervalMs;
    this.state = State.IDLE;
    this.session = null;  // {sessionId, workerId, width, height, fps, codec}
    this.ws = null;
    this.pc = null;
    this.input = null;
    this._statsTimer = null;
    this._lastInbound = null;
  }

  /** Opens the session; resolves when video plays, rejects with the reason it cannot. */
  start() {
    if (this.state !== State.IDLE) throw new Error(`already ${this.state}`);
    this._setState(State.CONNECTING);
    return new Promise((resolve, reject) => {
      this._resolveStart = resolve;
      this._rejectStart = reject;
      // the token rides in a subprotocol: browsers cannot set headers on a WebSocket, and a
      // token in the URL would end up in logs
      const protocols = this.token ? [SUBPROTOCOL, `bearer.${this.token}`] : [SUBPROTOCOL];
      const ws = new WebSocket(signalingUrl(this.server, this.path), protocols);
      this.ws = ws;
      ws.onopen = () => this._send(this.requirements
        ? { type: 'session.start', requirements: this.requirements } : { type: 'session.start' });
      ws.onmessage = (event) => this._onSignal(event.data);
      ws.onclose = (event) => {
        if ([State.CONNECTING, State.QUEUED, State.STREAMING, State.RECONNECTING].includes(this.state)) {
          this._fail('signaling_closed', `signaling socket closed (${event.code}${event.reason ? ': ' + event.reason : ''})`);
        }
      };
    });
  }

  /** Sends one input event (see the README's input protocol); false if the channel is not open. */
  sendInput(event) {
    if (!this.input || this.input.readyState !== 'open') return false;
    this.input.send(JSON.stringify(event));
    return true;
  }

  /** Ends the session and releases the worker slot. */
  close(reason = 'client_closed') {
    if (this.state === State.ENDED || this.state === State.ERROR) return;
    this._send({ type: 'session.end' });
    this._teardown();
    this._setState(State.ENDED, reason);
  }

  // -- signaling --------------------------------------------------------------------------

  _send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ v: PROTOCOL_VERSION, ...message }));
    }
  }

  async _onSignal(text) {
    let message;
    try { message = JSON.parse(text); } catch { return; }
    switch (message.type) {
      case 'session.started':
        // a first start, or a new worker after the last one was lost: (re)negotiate
        if (message.resumeToken) this.resumeToken = message.resumeToken;
        this.session = message;
        if (this.pc) { this.pc.close(); this.pc = null; }
        await this._negotiate(message.iceServers || []);
        break;
      case 'queue':
        this.position = message.position;
        if (this.state !== State.QUEUED) this._setState(State.QUEUED, `position ${message.position}`);
        this.dispatchEvent(new CustomEvent('queue', { detail: { position: message.position } }));
        break;
      case 'session.interrupted':
        this._setState(State.RECONNECTING, message.reason);
        break;
      case 'answer':
        await this.pc.setRemoteDescription({ type: 'answer', sdp: message.sdp });
        break;
      case 'session.ended':
        this._teardown();
        this._setState(State.ENDED, message.reason);
        this._rejectStart?.(new Error(`session ended: ${message.reason}`));
        break;
      case 'error':
        this.dispatchEvent(new CustomEvent('error', { detail: message }));
        if (this.state === State.CONNECTING || this.state === State.QUEUED) {
          this._fail(message.code, message.message);
        }
        break;
      default:
        break;
    }
  }

  async _negotiate(iceServers) {
    const pc = new RTCPeerConnection({ iceServers });
    this.pc = pc;
    pc.addTransceiver('video', { direction: 'recvonly' });
    this.input = pc.createDataChannel('input', { ordered: true });
    this.input.onmessage = (event) => this._onWorkerMessage(event.data);
    pc.onicecandidate = ({ candidate }) => {
      this._send(candidate
        ? { type: 'ice', candidate: candidate.candidate, sdpMid: candidate.sdpMid, sdpMLineIndex: candidate.sdpMLineIndex }
        : { type: 'ice', candidate: '' });
    };
    pc.ontrack = ({ track, receiver }) => {
      // a short jitter buffer: this is interactive video, not a film
      if ('jitterBufferTarget' in receiver) receiver.jitterBufferTarget = 0;
      this.video.srcObject = new MediaStream([track]);
      this.video.play().catch(() => {});
      // a renegotiated stream may not fire `playing` again: streaming resumes at its first frame
      this.video.requestVideoFrameCallback?.(() => this._onPlaying());
    };
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === 'failed') this._fail('peer_failed', 'the media connection failed');
    };
    this.video.addEventListener('playing', () => this._onPlaying(), { once: true });
    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    this._send({ type: 'offer', sdp: pc.localDescription.sdp });
  }

  _onPlaying() {
    if (![State.CONNECTING, State.QUEUED, State.RECONNECTING].includes(this.state)) return;
    this._setState(State.STREAMING);
    this._statsTimer = setInterval(() => this._pollStats(), this.statsIntervalMs);
    this._resolveStart?.(this);
    this._resolveStart = this._rejectStart = null;
  }

  _onWorkerMessage(text) {
    let message;
    try { message = JSON.parse(text); } catch { return; }
    if (message.type === 'error') this.dispatchEvent(new CustomEvent('error', { detail: message }));
    this.dispatchEvent(new CustomEvent('message', { detail: message }));
  }

  // -- statistics -------------------------------------------------------------------------

  /** The current figures: fps, kbps, width, height, codec, rttMs, framesDecoded, packetsLost. */
  async stats() {
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
    const previous = this._lastInbound;
    this._lastInbound = inbound;
    const seconds = previous ? (inbound.timestamp - previous.timestamp) / 1000 : 0;
    const kbps = seconds > 0 ? (8 * (inbound.bytesReceived - previous.bytesReceived)) / seconds / 1000 : 0;
    const fps = seconds > 0 ? (inbound.framesDecoded - previous.framesDecoded) / seconds : (inbound.framesPerSecond || 0);
    const codec = codecs.get(inbound.codecId);
    return {
      sessionId: this.session?.sessionId,
      fps,
      kbps,
      width: inbound.frameWidth || 0,
      height: inbound.frameHeight || 0,
      codec: codec ? codec.mimeType.replace(/^video\//, '') : '',
      rttMs: pair && pair.currentRoundTripTime !== undefined ? pair.currentRoundTripTime * 1000 : null,
      framesDecoded: inbound.framesDecoded || 0,
      framesDropped: inbound.framesDropped || 0,
      packetsLost: inbound.packetsLost || 0,
      jitterBufferDelayMs: inbound.jitterBufferEmittedCount
        ? (1000 * inbound.jitterBufferDelay) / inbound.jitterBufferEmittedCount : null,
    };
  }

  async _pollStats() {
    try {
      const figures = await this.stats();
      if (figures) this.dispatchEvent(new CustomEvent('stats', { detail: figures }));
    } catch { /* the connection is closing */ }
  }

  // -- lifecycle --------------------------------------------------------------------------

  _setState(state, reason = '') {
    this.state = state;
    this.dispatchEvent(new CustomEvent('state', { detail: { state, reason } }));
  }

  _fail(code, message) {
    if (this.state === State.ENDED || this.state === State.ERROR) return;
    this._teardown();
    this._setState(State.ERROR, `${code}: ${message}`);
    this._rejectStart?.(Object.assign(new Error(message), { code }));
    this._resolveStart = this._rejectStart = null;
  }

  _teardown() {
    clearInterval(this._statsTimer);
    this._statsTimer = null;
    const ws = this.ws;
    this.ws = null;
    if (ws) { ws.onclose = null; ws.close(); }
    if (this.pc) { this.pc.close(); this.pc = null; }
    this.input = null;
  }
}
