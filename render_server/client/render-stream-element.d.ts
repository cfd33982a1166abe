// Types of <render-stream> (render-stream-element.js).
import type { RenderStream } from './render-stream.js';

/**
 * `<render-stream server="https://render.example" token="…" quality="window"></render-stream>`.
 * Attributes: server, token, quality ("window" or "WxH"), max-kbps, pointer-lock, no-input.
 * Re-dispatches the stream's events: state, queue, stats, quality, error, message.
 */
export declare class RenderStreamElement extends HTMLElement {
  readonly stream: RenderStream | null;
  readonly ready: Promise<RenderStream>;
}

declare global {
  interface HTMLElementTagNameMap {
    'render-stream': RenderStreamElement;
  }
}
