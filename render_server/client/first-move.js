// First-move input-to-photon, read from the pixels as a photodiode would.
//
// After the picture has been still (no steering input for STILL_MS), the next input that
// moves the camera arms the meter: it keeps a small sample of the picture on screen at that
// moment and compares each displayed frame (`requestVideoFrameCallback`) with it. The first
// frame whose pixels changed ends the measurement: from the input event's timestamp to the
// time that frame is displayed. It trusts none of the worker's records, so it also measures
// what they cannot see (a frame that waited, a stream that repeats a still picture).
//
// It costs a draw of the video into a SAMPLE_WIDTH-wide canvas per displayed frame while
// armed (a few per move) and nothing otherwise.

export const STILL_MS = 500;  // no steering input this long: the next move is a first move
const TIMEOUT_MS = 1000;  // no changed frame this long after the input: the move changed nothing
const SAMPLE_WIDTH = 160;
const CHANNEL_STEP = 24;  // a colour channel differs by more than this: the pixel changed
const CHANGED_SHARE = 0.0005;  // this share of the sample's pixels (at least 3) changed: a new picture
const KEEP = 200;

/** True for an input event (docs/data-channel.md) that moves the camera, as opposed to a
 * button press, a hover or a release. */
export function movesCamera(event) {
  switch (event.type) {
    case 'pointer': return event.action === 'move' && (Boolean(event.buttons) || Boolean(event.locked));
    case 'wheel': return true;
    case 'key': return event.action === 'down';
    case 'touch': return event.action === 'move';
    case 'gamepad': return true;
    default: return false;
  }
}

function percentile(sorted, p) {
  if (!sorted.length) return null;
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo);
}

export class FirstMoveMeter {
  /** `video`: the element the stream plays in (the meter reads its pixels). */
  constructor(video, { stillMs = STILL_MS, timeoutMs = TIMEOUT_MS } = {}) {
    this.video = video;
    this.stillMs = stillMs;
    this.timeoutMs = timeoutMs;
    this._canvas = null;
    this._context = null;
    this.reset();
  }

  /** Forget the samples (a new peer connection). */
  reset() {
    this.samples = [];  // ms, newest last
    this.moves = [];  // {seq, at, ms} of the same first moves: `seq` finds their frames' records
    this.unchanged = 0;  // first moves after which no frame changed within `timeoutMs`
    this._lastMove = -Infinity;
    this._armed = null;  // {at, reference}
  }

  /** Stop waiting for the picture to change (the stream itself is being replaced). */
  disarm() { this._armed = null; }

  /** A steering input was sent at `timeStamp` (performance.now() time, an event's timeStamp). */
  onSteer(event, timeStamp) {
    if (!movesCamera(event)) return;
    this._expire(timeStamp);
    const still = timeStamp - this._lastMove >= this.stillMs;
    this._lastMove = Math.max(this._lastMove, timeStamp);
    if (!still || this._armed) return;
    const reference = this._sample();
    if (reference) this._armed = { at: timeStamp, seq: event.seq ?? null, reference };
  }

  /** `requestVideoFrameCallback`'s arguments for one displayed frame. */
  onFrameShown(now, meta) {
    this._expire(now);
    const armed = this._armed;
    if (!armed) return;
    const sample = this._sample();
    if (!sample || !changed(armed.reference, sample)) return;
    this._armed = null;
    const shownAt = meta && meta.expectedDisplayTime !== undefined ? meta.expectedDisplayTime : now;
    const ms = shownAt - armed.at;
    this.samples.push(ms);
    this.moves.push({ seq: armed.seq, at: armed.at, ms });
    if (this.samples.length > KEEP) { this.samples.shift(); this.moves.shift(); }
  }

  /** Percentiles (ms) of the first moves kept, how many, and how many changed nothing. */
  summary() {
    const sorted = [...this.samples].sort((a, b) => a - b);
    return {
      p50: percentile(sorted, 50), p95: percentile(sorted, 95), count: sorted.length,
      max: sorted.length ? sorted[sorted.length - 1] : null, unchanged: this.unchanged,
    };
  }

  _expire(now) {
    if (this._armed && now - this._armed.at > this.timeoutMs) {
      this._armed = null;
      this.unchanged += 1;
    }
  }

  _sample() {
    const video = this.video;
    if (!video || !video.videoWidth || !video.videoHeight) return null;
    const width = SAMPLE_WIDTH;
    const height = Math.max(1, Math.round((SAMPLE_WIDTH * video.videoHeight) / video.videoWidth));
    if (!this._canvas || this._canvas.width !== width || this._canvas.height !== height) {
      this._canvas = document.createElement('canvas');
      this._canvas.width = width;
      this._canvas.height = height;
      this._context = this._canvas.getContext('2d', { willReadFrequently: true, alpha: false });
    }
    this._context.drawImage(video, 0, 0, width, height);
    return this._context.getImageData(0, 0, width, height).data;
  }
}

function changed(a, b) {
  if (a.length !== b.length) return true;  // the stream changed size
  const pixels = a.length / 4;
  const needed = Math.max(3, Math.ceil(pixels * CHANGED_SHARE));
  let count = 0;
  for (let i = 0; i < a.length; i += 4) {
    if (Math.abs(a[i] - b[i]) > CHANNEL_STEP || Math.abs(a[i + 1] - b[i + 1]) > CHANNEL_STEP
        || Math.abs(a[i + 2] - b[i + 2]) > CHANNEL_STEP) {
      count += 1;
      if (count >= needed) return true;
    }
  }
  return false;
}
