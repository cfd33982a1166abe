// First-move input-to-photon, read from the pixels as a photodiode would.
//
// After the picture has been still (no steering input for STILL_MS, and no change between the
// last two samples the meter takes every IDLE_SAMPLE_MS once input stops), the next input that
// moves the camera arms the meter: it keeps a sample of the picture on screen at that moment
// and compares each displayed frame (`requestVideoFrameCallback`) with it. The first frame
// whose pixels changed ends the measurement: from the input event's timestamp to the time that
// frame is displayed. It trusts none of the worker's records, so it also measures what they
// cannot see (a frame that waited, a stream that repeats a still picture).
//
// A sample is the brightness on a grid about SAMPLE_COLUMNS wide over the whole picture, read
// with WebCodecs (`new VideoFrame(video)` then `copyTo`: the decoded planes as they are, ~2 ms
// for 1080p) where the browser gives the frame as planes of luma, else by drawing the video
// into a small canvas (which converts the whole frame first: ~9 ms for 1080p in headless
// Chromium, on the page's main thread; Firefox 153 gives a WebRTC frame as BGRA, whose copyTo
// took 12 ms at 720p against 8 for the canvas). Samples are taken while a first move is
// awaited, and every IDLE_SAMPLE_MS while the input is still; `summary().sampleMs` says what
// one costs. A first move on a picture that was
// changing by itself (an animated scene) is counted as `moving`, not measured. Call `onSteer`
// after the input has been sent: the reference sample is taken there.

import { percentile } from './latency.js';

export const STILL_MS = 500;  // no steering input this long: the next move is a first move
const IDLE_SAMPLE_MS = 200;  // while the input is still: is the picture still too?
const TIMEOUT_MS = 1000;  // no changed frame this long after the input: the move changed nothing
const SAMPLE_COLUMNS = 160;
const LEVEL_STEP = 24;  // brightness differs by more than this (of 255): the point changed
const CHANGED_SHARE = 0.0005;  // this share of the grid's points (at least 3) changed: a new picture
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
    // {seq, at, ms, rtp} of the first moves measured, newest last: the input's `seq` and the
    // changed frame's RTP timestamp find their records
    this.moves = [];
    this.unchanged = 0;  // first moves after which no frame changed within `timeoutMs`
    this.moving = 0;  // first moves not measured: the picture was changing before them
    this._lastMeta = null;  // the last callback's {mediaTime, presentedFrames}
    this._mediaTimeStuck = false;  // mediaTime names no frame here (Firefox's WebRTC: 0)
    this._lastMove = -Infinity;
    this._idle = null;  // the last idle sample's grid
    this._idleAt = -Infinity;  // ... and when it was taken
    this._pictureStill = false;  // the last two idle samples were alike
    this._armed = null;  // {at, seq, reference: Promise, chain: Promise}
    this._sampleMs = [];  // the last few samples' cost
  }

  /** The first moves' figures (ms), newest last. */
  get samples() { return this.moves.map((move) => move.ms); }

  /** Stop waiting for the picture to change (the stream itself is being replaced). */
  disarm() {
    this._armed = null;
    this._idle = null;
    this._pictureStill = false;
  }

  /** A steering input was sent at `timeStamp` (performance.now() time, an event's timeStamp). */
  onSteer(event, timeStamp) {
    if (!movesCamera(event)) return;
    this._expire(timeStamp);
    const still = timeStamp - this._lastMove >= this.stillMs;
    this._lastMove = Math.max(this._lastMove, timeStamp);
    const pictureStill = this._pictureStill;
    this._idle = null;  // the picture moves now: stillness is watched afresh after this input
    this._pictureStill = false;
    if (!still || this._armed) return;
    if (!pictureStill) {
      this.moving += 1;
      return;
    }
    const reference = this._sample();
    if (!reference) return;
    this._armed = { at: timeStamp, seq: event.seq ?? null, reference, chain: reference };
  }

  /** `requestVideoFrameCallback`'s arguments for one displayed frame. */
  onFrameShown(now, meta) {
    this._expire(now);
    const naming = this._naming(meta);
    const armed = this._armed;
    if (!armed) {
      this._watchStillness(now, naming);
      return;
    }
    // taken now, read whenever: the frame being shown (null if the element has moved on to a
    // newer frame, which its own callback will bring)
    const sample = this._sample(naming);
    if (!sample) return;
    const shownAt = meta && meta.expectedDisplayTime !== undefined ? meta.expectedDisplayTime : now;
    const rtp = meta && meta.rtpTimestamp !== undefined ? meta.rtpTimestamp >>> 0 : null;
    // compared in the order shown, each once the reference and it have been read
    armed.chain = armed.chain.then(async () => {
      const [reference, grid] = await Promise.all([armed.reference, sample]);
      if (this._armed !== armed || !reference || !grid || !changed(reference, grid)) return;
      this._armed = null;
      this.moves.push({ seq: armed.seq, at: armed.at, ms: shownAt - armed.at, rtp });
      if (this.moves.length > KEEP) this.moves.shift();
    });
  }

  /** Percentiles (ms) of the first moves kept, how many, how many changed nothing, how many
   * came while the picture was changing anyway, and what one sample costs (median ms). */
  summary() {
    const sorted = this.samples.sort((a, b) => a - b);  // a new array
    return {
      p50: percentile(sorted, 50), p95: percentile(sorted, 95), count: sorted.length,
      max: sorted.length ? sorted[sorted.length - 1] : null, unchanged: this.unchanged,
      moving: this.moving,
      sampleMs: percentile([...this._sampleMs].sort((a, b) => a - b), 50),
    };
  }

  /** `meta` where its mediaTime names the frame shown, else null: Firefox 153 gives a WebRTC
   * stream's frames mediaTime 0 (presentedFrames moves on, mediaTime stays), and matching
   * it against the element's frame would refuse every sample after the first second; the
   * element then holds the frame shown at this callback's tick anyway. */
  _naming(meta) {
    if (!meta || meta.mediaTime === undefined) return meta;
    const last = this._lastMeta;
    this._lastMeta = { mediaTime: meta.mediaTime, presentedFrames: meta.presentedFrames };
    if (last && meta.presentedFrames !== last.presentedFrames && meta.mediaTime === last.mediaTime) {
      this._mediaTimeStuck = true;
    }
    return this._mediaTimeStuck ? null : meta;
  }

  /** Every IDLE_SAMPLE_MS once input is still: whether the picture stands still as well. */
  _watchStillness(now, meta) {
    if (now - this._lastMove < IDLE_SAMPLE_MS || now - this._idleAt < IDLE_SAMPLE_MS) return;
    this._idleAt = now;
    const sample = this._sample(meta);
    if (!sample) return;
    const since = this._lastMove;
    sample.then((grid) => {
      if (!grid || this._lastMove !== since || this._armed) return;  // input came meanwhile
      this._pictureStill = this._idle !== null && !changed(this._idle, grid);
      this._idle = grid;
    });
  }

  _expire(now) {
    if (this._armed && now - this._armed.at > this.timeoutMs) {
      this._armed = null;
      this.unchanged += 1;
    }
  }

  /** A promise of the shown picture's brightness grid ({columns, rows, levels}), or null
   * when there is no picture, or when `meta` (a displayed frame's) names another frame than
   * the element now holds. The frame is taken now; reading it may finish later. */
  _sample(meta = null) {
    const video = this.video;
    if (!video || !video.videoWidth || !video.videoHeight) return null;
    const t0 = performance.now();
    const done = (grid) => {
      if (grid) {
        this._sampleMs.push(performance.now() - t0);
        if (this._sampleMs.length > 50) this._sampleMs.shift();
      }
      return grid;
    };
    const frame = grabFrame(video);
    if (frame) {
      const wanted = meta && meta.mediaTime !== undefined ? Math.round(meta.mediaTime * 1e6) : null;
      // Firefox 153 stamps a MediaStream's VideoFrame in whole seconds; its `currentTime`, equal
      // to the callback's mediaTime while the element holds that frame, says the same
      const held = (micros) => Math.abs(micros - wanted) <= 1;
      if (wanted !== null && !held(frame.timestamp) && !held(Math.round(video.currentTime * 1e6))) {
        frame.close();
        return null;
      }
      if (LUMA_FIRST.has(frame.format)) return readFrame(frame).catch(() => null).then(done);
      frame.close();  // RGB (Firefox): copyTo converts the whole frame, dearer than a canvas
    }
    return Promise.resolve(done(this._drawn(video)));
  }

  _drawn(video) {
    const columns = SAMPLE_COLUMNS;
    const rows = Math.max(1, Math.round((columns * video.videoHeight) / video.videoWidth));
    if (!this._canvas || this._canvas.width !== columns || this._canvas.height !== rows) {
      this._canvas = document.createElement('canvas');
      this._canvas.width = columns;
      this._canvas.height = rows;
      this._context = this._canvas.getContext('2d', { willReadFrequently: true, alpha: false });
    }
    this._context.drawImage(video, 0, 0, columns, rows);
    const rgba = this._context.getImageData(0, 0, columns, rows).data;
    const levels = new Uint8Array(columns * rows);
    for (let i = 0; i < levels.length; i += 1) {
      levels[i] = (rgba[4 * i] + 2 * rgba[4 * i + 1] + rgba[4 * i + 2]) >> 2;
    }
    return { columns, rows, levels };
  }
}

function grabFrame(video) {
  if (typeof VideoFrame !== 'function') return null;
  try {
    return new VideoFrame(video);
  } catch {
    return null;  // no frame yet, or a source WebCodecs cannot wrap: the canvas then
  }
}

const LUMA_FIRST = new Set(['I420', 'I420A', 'I422', 'I422A', 'I444', 'I444A', 'NV12']);

/** The brightness grid of `frame` (a LUMA_FIRST format; closed here): its luma plane as
 * decoded, one point every `step` pixels. */
async function readFrame(frame) {
  try {
    const { width, height } = frame.visibleRect;
    const buffer = new Uint8Array(frame.allocationSize());
    const [plane] = await frame.copyTo(buffer);
    const step = Math.max(1, Math.floor(width / SAMPLE_COLUMNS));
    const columns = Math.floor(width / step);
    const rows = Math.floor(height / step);
    const levels = new Uint8Array(columns * rows);
    for (let r = 0; r < rows; r += 1) {
      const line = plane.offset + r * step * plane.stride;
      for (let c = 0; c < columns; c += 1) levels[r * columns + c] = buffer[line + c * step];
    }
    return { columns, rows, levels };
  } finally {
    frame.close();
  }
}

function changed(a, b) {
  if (a.columns !== b.columns || a.rows !== b.rows) return true;  // the stream changed size
  const needed = Math.max(3, Math.ceil(a.levels.length * CHANGED_SHARE));
  let count = 0;
  for (let i = 0; i < a.levels.length; i += 1) {
    if (Math.abs(a.levels[i] - b.levels[i]) > LEVEL_STEP) {
      count += 1;
      if (count >= needed) return true;
    }
  }
  return false;
}
