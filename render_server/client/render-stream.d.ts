// Types of the render server's browser SDK (render-stream.js). A test compares the exports
// declared here with the module's real exports, so the two cannot drift.

export declare const PROTOCOL_VERSION: 1;
export declare const SUBPROTOCOL: 'render-server.v1';

export declare const State: Readonly<{
  IDLE: 'idle';
  CONNECTING: 'connecting';
  QUEUED: 'queued';
  STREAMING: 'streaming';
  RECONNECTING: 'reconnecting';
  ENDED: 'ended';
  ERROR: 'error';
}>;
export type StreamState = (typeof State)[keyof typeof State];

/** An error from the server or the worker, with its machine-readable code. */
export declare class RenderStreamError extends Error {
  constructor(code: string, message: string);
  readonly code: string;
}

/** A `maxKbps` above any worker's own cap: no cap but the worker's configured bitrate. */
export declare const NO_BITRATE_CAP: 1000000;

/** The codecs a render server can send, in its default order. */
export declare const SENDABLE_CODECS: readonly ['H264', 'VP8', 'AV1'];

/**
 * The codecs a stream would ask for here, best first: those of `wanted` (default
 * SENDABLE_CODECS) that this browser decodes, hardware-decoded ones first.
 */
export declare function rankCodecs(wanted?: string[] | null): Promise<string[]>;

/** `'1280x720'` → `{width: 1280, height: 720}`; null for anything else. */
export declare function parseSize(text: string | null | undefined): { width: number; height: number } | null;

export interface Quality {
  width?: number;
  height?: number;
  fps?: number;
  maxKbps?: number;
  /** Render at the element's size in device pixels, and follow it on resize. */
  matchWindow?: boolean;
}

/** What the worker renders and sends now, and its limits (the worker's `quality` message). */
export interface AppliedQuality {
  type: 'quality';
  width: number;
  height: number;
  fps: number;
  maxKbps: number;
  maxWidth: number;
  maxHeight: number;
  /** The worker could not switch to the requested format: these are the figures it kept. */
  error?: 'format_failed';
}

export interface ReconnectPolicy {
  attempts?: number;
  baseDelayMs?: number;
  maxDelayMs?: number;
}

export interface RenderStreamOptions {
  /** The render server's base URL; the page's own origin by default. */
  server?: string;
  path?: string;
  /** A JWT (viewer or controller role) where the server requires one. */
  token?: string | null;
  /** Worker requirements: labels, region, minimum free slots (see the REST API). */
  requirements?: Record<string, unknown> | null;
  /** Capture mouse, keys, touch and gamepad on a container element (default true). */
  input?: boolean;
  /** A click on the element captures the mouse; Esc releases it. */
  pointerLock?: boolean;
  quality?: Quality | 'window' | null;
  statsIntervalMs?: number;
  reconnect?: ReconnectPolicy;
  /**
   * The codecs the stream may arrive in, best first, of `SENDABLE_CODECS` ('H264', 'VP8',
   * 'AV1'). Default: every one this browser decodes, those it decodes in hardware first, then
   * H.264, VP8, AV1. Only a worker that sends one of them is chosen.
   */
  codecs?: string[] | null;
  /**
   * Watch a session someone shared instead of starting one (docs/sharing.md): `token` is the
   * share link's (its `#watch=` fragment; it also opens the socket), `name` (1–40 printable
   * characters, default "viewer") how the session's other pages see this one.
   */
  watch?: WatchOptions | null;
}

export interface WatchOptions {
  token: string;
  name?: string | null;
}

/** A link that lets others watch the session live (`session.shared`). */
export interface ShareLink {
  /** The share token: `RenderStream.watch(element, {token})` watches with it. */
  token: string;
  /** The page's URL with `#watch=<token>` (null where no `pageUrl` was given). */
  url: string | null;
  /** Unix seconds: no one may start watching with the link after this. */
  expiresAt: number;
  /** The URL's QR code, an SVG document made by the server (null without `url`). */
  qrSvg: string | null;
  sessionId: string;
}

export interface Peer {
  /** `'owner'` for the session's own page, a viewer's `viewerId` for a viewer. */
  id: string;
  name: string;
  role: 'owner' | 'viewer';
}

/** Who is connected to the session and who steers (the worker's `presence` message). */
export interface Presence {
  type: 'presence';
  /** This page's peer id. */
  you: string;
  /** The peer id of the page whose input moves the camera. */
  steering: string;
  maxViewers: number;
  peers: Peer[];
}

/** The session a viewer watches (`session.watching`). */
export interface WatchInfo {
  type: 'session.watching';
  sessionId: string;
  viewerId: string;
  role: 'viewer';
  /** The codec that arrives, once answered. */
  codec?: string;
  iceServers?: RTCIceServer[];
}

/** Codes of `viewer.ended`, the reason a viewer's stream ended. */
export type WatchEndCode =
  | 'session_ended' | 'moved' | 'too_many_viewers' | 'sharing_off' | 'peer_lost'
  | 'not_streaming' | 'bad_offer' | (string & {});

export interface SessionInfo {
  type: 'session.started';
  sessionId: string;
  workerId: string;
  width: number;
  height: number;
  fps: number;
  codec: string;
  role: 'controller' | 'viewer';
  iceServers?: RTCIceServer[];
  /** Resumes the session on a new signaling socket after this one drops. */
  resumeToken?: string;
}

export interface StreamStats {
  sessionId?: string;
  fps: number;
  kbps: number;
  width: number;
  height: number;
  codec: string;
  rttMs: number | null;
  packetsLost: number;
  lossPercent: number;
  jitterMs: number | null;
  jitterBufferDelayMs: number | null;
  decodeMs: number | null;
  framesDecoded: number;
  framesDropped: number;
  freezeCount: number;
  nackCount: number;
  pliCount: number;
  quality: AppliedQuality | null;
  network: NetworkFigures | null;
  latency: StreamLatency;
}

/** The worker's view of the path, once a second (paced send path only). */
export interface NetworkFigures {
  type: 'network';
  /** "transport-cc" (the browser's feedback drives the estimate), "remb" or "waiting" */
  mode: string;
  estimateKbps: number;
  /** what the encoder aims at: the estimate within the stream's bitrate and the page's cap */
  targetKbps: number;
  pacingKbps: number;
  lossPercent: number;
  rttMs: number | null;
  queueMs: number;
  probing: boolean;
  /** 0: the size and frame rate asked for; higher: a smaller size, then fewer frames */
  step: number;
  width: number;
  height: number;
  fps: number;
  resent: number;
  resendMissing: number;
}

/** Latency stages in order: the input's, then a frame's from its start to the glass. */
export declare const STAGES: readonly ['input', 'wait', 'render', 'encode', 'send', 'network', 'jitterBuffer', 'decode', 'display'];
export type Stage = (typeof STAGES)[number];

export interface Percentiles { p50: number | null; p95: number | null; p99: number | null; count: number }

export interface LatencySummary {
  /** Frames with a breakdown (the most recent ones kept). */
  frames: number;
  displayed: number;
  matched: number;
  /** Displayed frames whose timing record never arrived. */
  unmatched: number;
  /** Worker clock − browser clock, from ping/pong (docs/data-channel.md). */
  clockOffsetMs: number | null;
  /** How far `clockOffsetMs` can be from the truth. */
  clockErrorMs: number | null;
  /** The fastest recent ping/pong round trip. */
  clockRttMs: number | null;
  /** Frame start on the worker → expected on the glass. */
  glassToGlass: Percentiles;
  /** The user's input → the first frame that shows it, on the glass. */
  inputToPhoton: Percentiles;
  stages: Record<Stage, Percentiles>;
}

export interface FrameLatency {
  rtp: number;
  seq: number;
  bytes: number;
  keyframe: boolean;
  stages: Partial<Record<Stage, number>>;
  glassToGlass: number;
  inputToPhoton: number | null;
}

/** Matches the worker's per-frame timing records with displayed frames on one clock. */
/** First-move input-to-photon, by the pixels: input after STILL_MS without steering → the
 * first displayed frame whose pixels changed. */
export interface FirstMoveSummary {
  p50: number | null;
  p95: number | null;
  max: number | null;
  /** First moves measured (the most recent ones kept). */
  count: number;
  /** First moves after which no frame changed within the meter's timeout. */
  unchanged: number;
  /** First moves not measured: the picture was changing before them (an animated scene). */
  moving: number;
  /** What one sample of the picture costs the page (median ms of the recent ones). */
  sampleMs: number | null;
}

export interface StreamLatency extends LatencySummary { firstMove: FirstMoveSummary }

export declare class FirstMoveMeter {
  constructor(video: HTMLVideoElement, options?: { stillMs?: number; timeoutMs?: number });
  readonly samples: number[];
  /** The same first moves: the input's `seq` (null if it had none), its time, the figure. */
  readonly moves: { seq: number | null; at: number; ms: number; rtp: number | null }[];
  readonly unchanged: number;
  readonly moving: number;
  reset(): void;
  disarm(): void;
  /** A steering input event, sent at `timeStamp` (performance.now() time). */
  onSteer(event: InputEvent | Record<string, unknown>, timeStamp: number): void;
  onFrameShown(now: number, meta: VideoFrameCallbackMetadata): void;
  summary(): FirstMoveSummary;
}

export declare class LatencyMeter {
  constructor();
  readonly frames: FrameLatency[];
  readonly displayed: number;
  readonly matched: number;
  readonly unmatched: number;
  readonly offset: number | null;
  readonly offsetErrorMs: number | null;
  readonly rttMs: number | null;
  reset(): void;
  onPong(message: { t: number; w: number }, receivedAt: number): void;
  onInput(seq: number, at: number): void;
  onTiming(rows: unknown[][]): void;
  onFrameShown(now: number, meta: VideoFrameCallbackMetadata): void;
  summary(): LatencySummary;
}

export interface StateDetail { state: StreamState; reason: string }
/** `id`: the command an error answers (`null` when it had none or an unusable one). */
export interface ErrorDetail { code: string; message: string; id?: number | null }

export interface RenderStreamEventMap {
  state: CustomEvent<StateDetail>;
  queue: CustomEvent<{ position: number }>;
  stats: CustomEvent<StreamStats>;
  quality: CustomEvent<AppliedQuality>;
  error: CustomEvent<ErrorDetail>;
  presence: CustomEvent<Presence>;
  message: CustomEvent<Record<string, unknown>>;
}

/** Input events of the data channel (docs/data-channel.md). */
export type InputEvent =
  | { type: 'pointer'; action: 'down' | 'move' | 'up'; x: number; y: number; dx: number; dy: number; buttons: number; shift?: boolean; locked?: boolean }
  | { type: 'wheel'; dy: number }
  | { type: 'key'; action: 'down' | 'up'; code: string }
  | { type: 'touch'; action: 'start' | 'move' | 'end' | 'cancel'; touches: { id: number; x: number; y: number }[] }
  | { type: 'gamepad'; axes: number[]; buttons: number[] }
  | { type: 'blur' };

export interface SceneProgress {
  phase: 'upload' | 'loading';
  /** Of the upload sent (0..1); null while loading. */
  fraction: number | null;
}

export interface LoadedScene {
  id: string;
  name: string;
  kind: 'glb' | 'gltf' | 'obj' | 'zip';
  bytes: number;
  ticket: string;
  triangles: number;
  objects: number;
}

/** An upload the server refused or that failed (`code`: the server's, or bad_file, network, aborted). */
export declare class UploadError extends Error {
  readonly code: string;
  readonly status: number;
}

export declare class RenderStream extends EventTarget {
  /** Connects `element` and resolves once the first frame plays. */
  static connect(element: HTMLElement, options?: RenderStreamOptions): Promise<RenderStream>;
  /**
   * Watches a shared session with its link's `token` (as `connect` with `watch`); resolves
   * once the first frame plays, rejects with `unauthorized` for an expired or bad link.
   */
  static watch(element: HTMLElement, options: Omit<RenderStreamOptions, 'watch'> & WatchOptions): Promise<RenderStream>;
  constructor(element: HTMLElement, options?: RenderStreamOptions);

  readonly video: HTMLVideoElement;
  readonly container: HTMLElement;
  readonly state: StreamState;
  readonly reason: string;
  readonly session: SessionInfo | WatchInfo | null;
  /** Watch mode: the share token watched with (null for a page that started its session). */
  readonly watchToken: string | null;
  /** Watch mode: the name the other pages see. */
  readonly viewerName: string | null;
  /** Watch mode: this page's peer id in `presence`, from `session.watching`. */
  readonly viewerId: string | null;
  /** The worker's last `presence`: who is connected, who steers (null before the first). */
  readonly presence: Presence | null;
  /**
   * Whether this page's input moves the camera: `presence.steering === presence.you` (before
   * the first `presence`: true for the owner, false for a viewer). Steering input (pointer,
   * wheel, key, touch, gamepad, blur) is not sent while false.
   */
  readonly steering: boolean;
  /** The session's id from its first `queue` or `session.started` message. */
  readonly sessionId: string | null;
  readonly quality: AppliedQuality | null;
  readonly position: number | null;
  readonly capture: InputCapture | null;
  readonly latencyMeter: LatencyMeter;
  readonly firstMoveMeter: FirstMoveMeter;
  /** The codecs asked for, best first, once ranked (null before); `session.codec` is the one sent. */
  readonly codecs: string[] | null;
  /** Resolves when the first frame plays; rejects if the stream fails before. */
  readonly ready: Promise<RenderStream>;
  /** Resolves when the stream ends or fails for good. */
  readonly closed: Promise<StateDetail>;

  start(): Promise<RenderStream>;
  /** `timeStamp`: when the user acted (an event's `timeStamp`), for input-to-photon. */
  sendInput(event: InputEvent | Record<string, unknown>, timeStamp?: number): boolean;
  /** Latency percentiles over the recent frames, and the first moves' by the pixels. */
  latency(): StreamLatency;
  setQuality(quality: Quality | 'window' | null): Promise<AppliedQuality>;
  requestKeyframe(): boolean;
  /**
   * Mints a link that lets others watch this session live (the owner only): `ttlS` 60 s … 7
   * days (default the server's, 1 hour), `pageUrl` the page viewers open (default this page:
   * `location.origin + location.pathname`). Rejects with a RenderStreamError (`forbidden`,
   * `not_connected`, `timeout`, or the server's code).
   */
  share(options?: { ttlS?: number | null; pageUrl?: string | null }): Promise<ShareLink>;
  /** Stops sharing (the owner only): every link made so far opens nothing, every viewer's stream ends. */
  stopSharing(): Promise<void>;
  /** Hands control to a peer of `presence` (its `id`): the owner at any time, or the steering peer. */
  handControl(peerId: string): Promise<unknown>;
  /** The owner takes control back. */
  takeControl(): Promise<unknown>;
  /** The owner removes a viewer (its `presence` id): its stream ends (`removed`); the link still opens until `stopSharing()`. */
  removeViewer(peerId: string): Promise<unknown>;
  /** A scene command (getCamera, setCamera, resetCamera, listScene, setMaterial, setVisible, setTimeOfDay, loadScene). */
  command<T = unknown>(name: string, args?: Record<string, unknown>): Promise<T>;
  /** Uploads the designer's model and switches the session to it (docs/scenes.md). */
  loadScene(file: File, options?: { onProgress?: (progress: SceneProgress) => void; signal?: AbortSignal }): Promise<LoadedScene>;
  /** Switches the session to a model uploaded before. */
  showScene(id: string, ticket: string): Promise<{ id: string; triangles: number; objects: number }>;
  stats(): Promise<StreamStats | null>;
  windowSize(): { width: number; height: number };
  close(reason?: string): void;

  addEventListener<K extends keyof RenderStreamEventMap>(type: K, listener: (event: RenderStreamEventMap[K]) => void, options?: boolean | AddEventListenerOptions): void;
  addEventListener(type: string, listener: EventListenerOrEventListenerObject | null, options?: boolean | AddEventListenerOptions): void;
}

export interface InputCaptureOptions {
  pointerLock?: boolean;
  keyboard?: boolean;
  gamepad?: boolean;
}

/** Mouse, wheel, keys, touch and gamepad on `surface` → `stream.sendInput`. */
export declare class InputCapture {
  constructor(stream: { sendInput(event: InputEvent, timeStamp?: number): boolean }, surface: HTMLElement, options?: InputCaptureOptions);
  pointerLock: boolean;
  readonly locked: boolean;
  lock(): Promise<void>;
  unlock(): void;
  detach(): void;
}
