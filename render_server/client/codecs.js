// Which video codec a stream should arrive in. The worker sends the first codec of the page's
// offer that it can encode, so the order of the offer is the page's choice: the codecs this
// browser decodes in hardware (MediaCapabilities' `powerEfficient`) first, then H.264, VP8,
// AV1 (cheap to encode and decode first). `codecs` (an SDK option, the designer page's `?codec=`)
// restricts and orders them instead.

/** The codecs a render server can send, in its default order. */
export const SENDABLE_CODECS = Object.freeze(['H264', 'VP8', 'AV1']);

const MIME = (name) => `video/${name}`.toLowerCase();

/** The codec names of this browser's receiver capabilities (`H264`, `VP8`, ...), as it spells them. */
export function decodableCodecs() {
  const caps = typeof RTCRtpReceiver !== 'undefined' && RTCRtpReceiver.getCapabilities
    ? RTCRtpReceiver.getCapabilities('video') : null;
  if (!caps) return [];
  const names = caps.codecs.map((c) => c.mimeType.replace(/^video\//i, '').toUpperCase());
  return [...new Set(names)];
}

async function decodesInHardware(name) {
  if (!navigator.mediaCapabilities || !navigator.mediaCapabilities.decodingInfo) return false;
  const contentType = name === 'H264' ? 'video/h264; profile-level-id=42e01f; packetization-mode=1' : MIME(name);
  try {
    const info = await navigator.mediaCapabilities.decodingInfo({
      type: 'webrtc', video: { contentType, width: 1920, height: 1080, bitrate: 8000000, framerate: 60 },
    });
    return Boolean(info.supported && info.powerEfficient);
  } catch {
    return false;  // a browser without the `webrtc` type (Safari before 17, Firefox before 125)
  }
}

/**
 * The codecs to ask for, best first: those of `wanted` (default: every sendable one) that this
 * browser decodes, hardware-decoded ones first, the rest in `wanted`'s order.
 */
export async function rankCodecs(wanted = null) {
  const order = (wanted && wanted.length ? wanted : SENDABLE_CODECS).map((n) => String(n).toUpperCase());
  const decodable = new Set(decodableCodecs());
  // a browser that does not list its capabilities (very old): let its offer speak for it
  const usable = decodable.size ? order.filter((n) => decodable.has(n)) : order;
  const hardware = await Promise.all(usable.map(decodesInHardware));
  return [...usable.filter((_, i) => hardware[i]), ...usable.filter((_, i) => !hardware[i])];
}

/**
 * Puts `ranked` codecs (and their retransmission, and RED and ULPFEC for the worker's forward
 * error correction) first and only in `transceiver`'s offer; a browser without
 * `setCodecPreferences` offers its own order, which the worker then follows.
 */
export function preferCodecs(transceiver, ranked) {
  if (!transceiver.setCodecPreferences || !RTCRtpReceiver.getCapabilities || !ranked.length) return false;
  const all = RTCRtpReceiver.getCapabilities('video').codecs;
  const chosen = ranked.flatMap((name) => all.filter((c) => c.mimeType.toLowerCase() === MIME(name)));
  const rtx = all.filter((c) => c.mimeType.toLowerCase() === 'video/rtx');
  const fec = all.filter((c) => ['video/red', 'video/ulpfec'].includes(c.mimeType.toLowerCase()));
  if (!chosen.length) return false;
  try {
    transceiver.setCodecPreferences([...chosen, ...fec, ...rtx]);
    return true;
  } catch {
    return false;
  }
}

/** The codec an SDP answer settled on: its video section's first payload type, by name. */
export function answeredCodec(sdp) {
  const mline = /^m=video \d+ [^ ]+ (\d+)/m.exec(sdp || '');
  if (!mline) return '';
  const rtpmap = new RegExp(`^a=rtpmap:${mline[1]} ([^/\\s]+)/`, 'm').exec(sdp);
  return rtpmap ? rtpmap[1].toUpperCase() : '';
}
