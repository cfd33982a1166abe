// Types of <render-stream> (render-stream-element.js).
import type { LoadedScene, RenderStream, SceneProgress } from './render-stream.js';

/**
 * `<render-stream server="https://render.example" token="…" quality="window"></render-stream>`.
 * Attributes: server, token, quality ("window" or "WxH"), max-kbps, codecs, pointer-lock,
 * no-input, accept-models (a dropped model file is opened; the outcome is a `scene` event),
 * watch-token (a share link's token: watch that shared session instead of starting one) with
 * viewer-name (how the session's other pages see this one).
 * Re-dispatches the stream's events: state, queue, stats, quality, presence, error, message,
 * sceneprogress.
 */
export declare class RenderStreamElement extends HTMLElement {
  readonly stream: RenderStream | null;
  readonly ready: Promise<RenderStream>;
  loadScene(file: File, options?: { onProgress?: (progress: SceneProgress) => void; signal?: AbortSignal }): Promise<LoadedScene>;
}

declare global {
  interface HTMLElementTagNameMap {
    'render-stream': RenderStreamElement;
  }
}
