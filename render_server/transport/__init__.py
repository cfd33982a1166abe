"""Everything that patches or extends aiortc, which only packetizes our already-encoded frames.

aiortc has no public API for most of what a low-latency stream needs, so these modules reach
into its private attributes. Every one was checked against aiortc 1.16 (`AIORTC_CHECKED`;
pyproject.toml pins `aiortc>=1.16,<1.17` for this reason):

- `track`: `recv()` returns an `av.Packet`, which `RTCRtpSender._next_encoded_frame` packs
  without encoding (the pre-encoded path).
- `rtcp_feedback`: wraps `RTCRtpSender._send_keyframe` and `_handle_rtcp_packet`, reads
  `RTCRtpSender._ssrc`.
- `playout_delay`: appends to `aiortc.codecs.HEADER_EXTENSIONS`, replaces
  `RTCRtpSender.__rtp_header_extensions_map` with `header_extensions.SenderExtensionsMap`
  (playout delay and the transport-wide sequence number's placeholder).
- `paced_negotiation`: appends the transport-cc header extension and RTCP feedback, RED (with
  its RTX) and ULPFEC to aiortc's video codecs, and holds `PACKET_MAX` of aiortc's H.264 and
  VP8 packers to 1200 bytes (a ULPFEC packet must still fit what pylibsrtp protects).
- `send_path` (the paced path: `pacer`, the sans-IO `congestion` controller, and `fec_path`
  with the pure wire formats `red`, `ulpfec`, `transport_feedback` behind it): wraps
  `RTCDtlsTransport._send_rtp` (RTP is queued and paced, numbered as it leaves) and
  `_handle_rtcp_data` (transport feedback read out before aiortc sees the datagram), wraps
  `RTCRtpSender._retransmit` (retransmissions first); `probe_padding` reads the sender's
  `_RTCRtpSender__rtp_history`, `__rtx_payload_type`, `_rtx_ssrc` and advances
  `__rtx_sequence_number` (probes are RTX copies of recent packets).
- `frame_sender` (the paced path's RTP loop): replaces `RTCRtpSender._run_rtp` on the
  instance, calls `_next_encoded_frame`, and keeps aiortc's private `__rtp_history`, sender
  report counters, `__rtp_started`/`__rtp_exited`, `__track` and `__encoder` as aiortc's loop
  does, and sets `__encoder` to `h264_packer.H264Packer` for H.264 (a subclass of aiortc's
  `H264Encoder`: its `pack` reads `aiortc.codecs.h264.PACKET_MAX` and calls the private
  `_packetize_stap_a`); `rtp_transmit` protects with `RTCDtlsTransport._tx_srtp`, reads
  `_state`, counts into `__tx_bytes`/`__tx_packets`, and sends on aioice's
  `Connection._nominated` pair.
- `timing.watch_sent_packets` (aiortc's own send path, `--send-path stock`): wraps
  `RTCDtlsTransport._send_rtp`, reads `RTCRtpSender._ssrc`.
- `receiver_hook.observe_receiver` (the measuring clients' side): replaces
  `RTCRtpReceiver._handle_rtp_packet` and the private decoder queue, reads its codecs and RTX
  map.
- `feedback_generator.send_transport_feedback` (the measuring clients' side: aiortc sends no
  transport-cc feedback): replaces `RTCRtpReceiver._handle_rtp_packet` on the instance, wrapping
  whatever is there (so it composes with `receiver_hook` in either order), sends through
  `RTCRtpReceiver._send_rtcp`, reads its private `__rtcp_ssrc` and `__rtcp_task`
  (`transport_feedback`, the wire format it writes, is pure and patches nothing);
  `feedback_sender` only sends, for `lean_receiver`, which reads the transport-wide id from
  `RTCDtlsTransport._rtp_header_extensions_map` (its private `_HeaderExtensionsMap__ids`).
- `av1_codec.register_av1` (AV1, which aiortc lacks; `av1_rtp` is its pure payload format):
  appends to `aiortc.codecs.CODECS["video"]`, widens `aiortc.rtp.DYNAMIC_PAYLOAD_TYPES` to
  35-63 (Chromium's AV1 payload types), wraps `aiortc.rtcpeerconnection.is_codec_compatible`
  (AV1 profiles must match), and `get_encoder` in `aiortc.rtcrtpsender`, `get_decoder` and
  `depayload` in `aiortc.rtcrtpreceiver` (AV1 packing, depacketizing, libdav1d decoding).
- `guard.guard_data_channels`: wraps `RTCSctpTransport._data_channel_receive` (a text message
  that is not UTF-8, a malformed DCEP message must not end the transport).
- `retransmission`: sets `aiortc.rtcrtpsender.RTP_HISTORY_SIZE` (the NACK history) to span
  time, wraps `RTCRtpSender._retransmit` and reads `_RTCRtpSender__rtp_history` to count.
- `fan_out` (a shared session's viewers): `recv()` returns the owner's encoded `av.Packet`s,
  which the codecs' `pack` only reads; `watch_rtcp` wraps the sender instance's
  `_handle_rtcp_packet` (is the viewer still there).
- `video_sender`: puts them together on a session's peer connection (no patch of its own).

Another aiortc may rename any of these: `check_aiortc_version` says so in the log, once.
"""

from __future__ import annotations

import functools
import logging
from importlib.metadata import PackageNotFoundError, version

log = logging.getLogger(__name__)

AIORTC_CHECKED = "1.16"  # the release (major.minor) the modules above were checked against


def check_aiortc_version(installed: str | None = None) -> bool:
    """True when the installed aiortc (or `installed`) is an `AIORTC_CHECKED` release; else
    False, and a warning in the log, once per version."""
    if installed is None:
        installed = _installed_aiortc()
    if installed == AIORTC_CHECKED or installed.startswith(AIORTC_CHECKED + "."):
        return True
    _warn_unchecked(installed)
    return False


@functools.cache  # the installed release does not change while the process runs
def _installed_aiortc() -> str:
    try:
        return version("aiortc")
    except PackageNotFoundError:
        return "unknown"


@functools.cache  # once per version: every session asks, one line says it
def _warn_unchecked(installed: str) -> None:
    log.warning(
        "transport.aiortc_unchecked",
        extra={
            "installed": installed,
            "checked": AIORTC_CHECKED,
            "reason": "keyframe requests, REMB, playout delay and timing records patch "
            "aiortc's private attributes and may not work with this release",
        },
    )
