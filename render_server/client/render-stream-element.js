// <render-stream server="https://render.example" token="…"></render-stream>: the stream in one
// line of HTML. Attributes: server, token, quality ("window", or "1280x720"), max-kbps,
// codecs ("VP8,H264": the codecs it may arrive in, best first), pointer-lock (boolean),
// no-input (boolean), accept-models (boolean: a model file dropped on it is opened, as
// `loadScene` does), watch-token (a share link's token: watch that shared session instead of
// starting one) with viewer-name. The element re-dispatches the stream's events
// (state, queue, stats, quality, presence, error, message) and exposes the stream as `.stream`.

import { RenderStream, parseSize } from './render-stream.js';

const FORWARDED = ['state', 'queue', 'stats', 'quality', 'presence', 'error', 'message', 'sceneprogress'];

function parseQuality(text, maxKbps) {
  if (text === 'window') return 'window';
  const quality = { ...parseSize(text) };
  if (maxKbps) quality.maxKbps = Number(maxKbps);
  return Object.keys(quality).length ? quality : null;
}

export class RenderStreamElement extends HTMLElement {
  constructor() {
    super();
    this.stream = null;
  }

  connectedCallback() {
    if (this.stream) return;
    if (!this.style.display) this.style.display = 'block';
    this.stream = new RenderStream(this, {
      server: this.getAttribute('server') || location.origin,
      token: this.getAttribute('token'),
      input: !this.hasAttribute('no-input'),
      pointerLock: this.hasAttribute('pointer-lock'),
      quality: parseQuality(this.getAttribute('quality'), this.getAttribute('max-kbps')),
      codecs: (this.getAttribute('codecs') || '').split(',').filter(Boolean),
      watch: this.hasAttribute('watch-token')
        ? { token: this.getAttribute('watch-token'), name: this.getAttribute('viewer-name') } : null,
    });
    for (const type of FORWARDED) {
      this.stream.addEventListener(type, (event) => {
        if (type === 'state') this.dataset.state = event.detail.state;
        this.dispatchEvent(new CustomEvent(type, { detail: event.detail }));
      });
    }
    this.stream.start().catch(() => {});  // failures arrive as `state` and `error` events
    if (!this._dropWired) {
      this._dropWired = true;
      this.addEventListener('dragover', (event) => {
        if (this.hasAttribute('accept-models') && event.dataTransfer?.types.includes('Files')) event.preventDefault();
      });
      this.addEventListener('drop', (event) => {
        if (!this.hasAttribute('accept-models')) return;
        event.preventDefault();
        const file = event.dataTransfer?.files[0];
        // the outcome arrives as a `scene` event: {file, id, triangles} or {file, error}
        if (file) {
          this.loadScene(file).then(
            (shown) => this.dispatchEvent(new CustomEvent('scene', { detail: { file: file.name, ...shown } })),
            (error) => this.dispatchEvent(new CustomEvent('scene', { detail: { file: file.name, error: { code: error.code, message: error.message } } })),
          );
        }
      });
    }
  }

  /** Opens the designer's own model in the stream (RenderStream.loadScene). */
  loadScene(file, options) {
    return this.stream ? this.stream.loadScene(file, options) : Promise.reject(new Error('not in the document'));
  }

  disconnectedCallback() {
    this.stream?.close('element_removed');
    this.stream = null;
  }

  /** Resolves with the stream once it plays. */
  get ready() { return this.stream ? this.stream.ready : Promise.reject(new Error('not in the document')); }
}

if (!customElements.get('render-stream')) customElements.define('render-stream', RenderStreamElement);
