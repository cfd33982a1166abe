// Per-frame latency in the browser: the worker's timing records (docs/data-channel.md) matched
// with the frames the page displays, on one clock.
//
// The worker sends, for every frame, when it started, rendered, encoded and sent it, keyed by
// the frame's RTP timestamp; `requestVideoFrameCallback` tells when each frame arrived, was
// decoded and will be displayed. Ping/pong on the data channel gives the offset between the
// two clocks: each pong bounds it between w − received and w − sent, and the middle of the
// recent bounds' intersection is the estimate (docs/data-channel.md, "ping → pong"). A busy
// page or worker holds one leg of a round trip longer than the other, which skews half the
// round trip; the intersection is as narrow as the quickest leg each way.

/** The stages, in order: input's first, then a frame's from its start to the glass. */
export const STAGES = Object.freeze(['input', 'wait', 'render', 'encode', 'send', 'network', 'jitterBuffer', 'decode', 'display']);
const CLOCK_SAMPLES = 20;
const KEEP_FRAMES = 600;  // breakdowns kept for the percentiles (20 s at 30 fps)
const RECORD_WAIT_MS = 2000;  // a displayed frame waits this long for its record
const MAX_INPUTS = 4096;

/** The `p`th percentile of ascending `sorted` (linear between ranks); null when empty. */
export function percentile(sorted, p) {
  if (!sorted.length) return null;
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo);
}

function percentiles(values) {
  const sorted = values.filter((v) => v !== null && Number.isFinite(v)).sort((a, b) => a - b);
  return { p50: percentile(sorted, 50), p95: percentile(sorted, 95), p99: percentile(sorted, 99), count: sorted.length };
}

export class LatencyMeter {
  constructor() { this.reset(); }

  /** Forget everything: a new peer connection may lead to another worker with another clock. */
  reset() {
    this._clock = [];  // {rtt, offset, low, high}: worker ms − browser ms and its bounds
    this._best = null;  // the sample of the fastest round trip in `_clock`
    this._bounds = null;  // [low, high]: the intersection of the samples' bounds; null: empty
    this._records = new Map();  // rtp → record row
    this._shown = [];  // displayed frames still waiting for their record
    this._inputs = new Map();  // seq → browser time of the input event
    this.frames = [];  // breakdowns, newest last
    this.displayed = 0;
    this.matched = 0;
    this.unmatched = 0;  // displayed frames whose record never came
  }

  // -- clock ------------------------------------------------------------------------------

  onPong(message, receivedAt) {
    const rtt = receivedAt - message.t;
    if (!(rtt >= 0)) return;
    this._clock.push({
      rtt,
      offset: message.w - (message.t + receivedAt) / 2,
      low: message.w - receivedAt,
      high: message.w - message.t,
    });
    if (this._clock.length > CLOCK_SAMPLES) this._clock.shift();
    // once a pong, not once a displayed frame
    this._best = this._clock.reduce((best, s) => (s.rtt < best.rtt ? s : best));
    const low = Math.max(...this._clock.map((s) => s.low));
    const high = Math.min(...this._clock.map((s) => s.high));
    this._bounds = low <= high ? [low, high] : null;
  }

  /** Worker clock − browser clock in ms: the middle of the recent bounds' intersection, or of
   * the fastest recent round trip where they do not meet (a clock stepped); null before any. */
  get offset() {
    if (!this._best) return null;
    return this._bounds ? (this._bounds[0] + this._bounds[1]) / 2 : this._best.offset;
  }

  /** How far `offset` can be from the truth (ms); null before any pong. */
  get offsetErrorMs() {
    if (!this._best) return null;
    return this._bounds ? (this._bounds[1] - this._bounds[0]) / 2 : this._best.rtt / 2;
  }

  /** The fastest recent round trip in ms; null before any. */
  get rttMs() { return this._best ? this._best.rtt : null; }

  // -- inputs, records and displayed frames ------------------------------------------------

  onInput(seq, at) {
    this._inputs.set(seq, at);
    if (this._inputs.size > MAX_INPUTS) this._inputs.delete(this._inputs.keys().next().value);
  }

  onTiming(rows) {
    for (const row of rows) {
      if (Array.isArray(row) && row.length >= 10 && row[0] !== null) this._records.set(row[0] >>> 0, row);
    }
    while (this._records.size > KEEP_FRAMES * 2) this._records.delete(this._records.keys().next().value);
    this._match(performance.now());
  }

  /** `requestVideoFrameCallback`'s arguments for one displayed frame. */
  onFrameShown(now, meta) {
    if (meta.rtpTimestamp === undefined || meta.receiveTime === undefined) return;
    this.displayed += 1;
    this._shown.push({
      rtp: meta.rtpTimestamp >>> 0,
      receiveTime: meta.receiveTime,
      presentationTime: meta.presentationTime,
      expectedDisplayTime: meta.expectedDisplayTime,
      processingMs: meta.processingDuration !== undefined ? meta.processingDuration * 1000 : null,
      at: now,
    });
    this._match(now);
  }

  _match(now) {
    const offset = this.offset;
    if (offset === null) return;
    const waiting = [];
    for (const shown of this._shown) {
      const row = this._records.get(shown.rtp);
      if (row) {
        this._records.delete(shown.rtp);
        this.matched += 1;
        this._push(this._breakdown(shown, row, offset));
      } else if (now - shown.at > RECORD_WAIT_MS) {
        this.unmatched += 1;
      } else {
        waiting.push(shown);
      }
    }
    this._shown = waiting;
  }

  _breakdown(shown, row, offset) {
    const [rtp, seq, input, r0, r1, e1, , sent, bytes, key] = row;
    const toBrowser = (w) => w - offset;
    const queued = shown.presentationTime - shown.receiveTime;
    // the decoder's share of the time from arrival to presentation; the rest is the jitter buffer
    const decode = shown.processingMs !== null ? Math.min(Math.max(shown.processingMs, 0), Math.max(queued, 0)) : 0;
    const stages = {
      render: r1 - r0,
      encode: e1 - r1,
      send: sent - e1,
      network: shown.receiveTime - toBrowser(sent),
      jitterBuffer: queued - decode,
      decode,
      display: shown.expectedDisplayTime - shown.presentationTime,
    };
    const frame = {
      rtp, seq, bytes, keyframe: key === 1, stages,
      glassToGlass: shown.expectedDisplayTime - toBrowser(r0),
      inputToPhoton: null,
    };
    const inputAt = seq >= 0 ? this._inputs.get(seq) : undefined;
    if (inputAt !== undefined && input !== null) {
      stages.input = toBrowser(input) - inputAt;
      stages.wait = r0 - input;
      frame.inputToPhoton = shown.expectedDisplayTime - inputAt;
      for (const s of this._inputs.keys()) { if (s <= seq) this._inputs.delete(s); else break; }
    }
    return frame;
  }

  _push(frame) {
    this.frames.push(frame);
    if (this.frames.length > KEEP_FRAMES) this.frames.shift();
  }

  /** Percentiles (ms) of glass-to-glass, input-to-photon and every stage over the kept frames. */
  summary() {
    const stages = {};
    for (const name of STAGES) stages[name] = percentiles(this.frames.map((f) => (f.stages[name] ?? null)));
    return {
      frames: this.frames.length,
      displayed: this.displayed,
      matched: this.matched,
      unmatched: this.unmatched,
      clockOffsetMs: this.offset,
      clockErrorMs: this.offsetErrorMs,
      clockRttMs: this.rttMs,
      glassToGlass: percentiles(this.frames.map((f) => f.glassToGlass)),
      inputToPhoton: percentiles(this.frames.map((f) => f.inputToPhoton)),
      stages,
    };
  }
}
