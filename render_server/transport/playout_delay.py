"""The playout-delay RTP header extension: ask the browser not to smooth an interactive stream.

By default a browser's video receiver holds every frame for a smoothing delay (Chromium: its
jitter estimate plus a fixed 10 ms render delay, 15–20 ms on loopback), which suits films and
costs an interactive stream a third of its budget. The playout-delay extension
(http://www.webrtc.org/experiments/rtp-hdrext/playout-delay) lets the sender bound that delay.

- `low` (min 0, max 500 ms) switches Chromium to its low-latency renderer: in
  tests/test_latency_browser.py the jitter-buffer stage falls from ~15 ms to ~6 ms and
  glass-to-glass p50 from ~21 ms to ~13 ms.
- `zero` (min = max = 0) asks for frames to be shown the moment they are decoded; in headless
  Chromium they then wait ~24 ms for the compositor instead, so it is slower there.
- `off` sends no extension: the browser's own smoothing.

aiortc knows neither the extension nor how to write it, so this module registers it for
negotiation (Chromium offers it) and gives a sender a header-extension map
(`header_extensions.SenderExtensionsMap`) that writes it into every packet.

Checked against aiortc 1.16: the module-level list `aiortc.codecs.HEADER_EXTENSIONS` and the
private `RTCRtpSender.__rtp_header_extensions_map`.
"""

from __future__ import annotations

from typing import Any

from aiortc import codecs
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters

from render_server.transport.header_extensions import PLAYOUT_DELAY_URI, SenderExtensionsMap

__all__ = ["PLAYOUT_DELAY_URI", "register_playout_delay", "request_playout_delay"]


def register_playout_delay() -> None:
    """Offer and answer the extension for video (process-wide: aiortc keeps one list)."""
    register_video_extension(PLAYOUT_DELAY_URI)


def register_video_extension(uri: str) -> None:
    """Offer and answer header extension `uri` for video, on an id of its own. Idempotent."""
    video = codecs.HEADER_EXTENSIONS["video"]
    if not any(ext.uri == uri for ext in video):
        # ids are shared by audio and video under BUNDLE: one neither uses
        used = {ext.id for kind in codecs.HEADER_EXTENSIONS.values() for ext in kind}
        free = next(i for i in range(1, 15) if i not in used)
        video.append(RTCRtpHeaderExtensionParameters(id=free, uri=uri))


_BOUNDS_10MS = {"low": (0, 50), "zero": (0, 0)}


def request_playout_delay(sender: Any, mode: str, transport_cc: bool = False) -> None:
    """Make `sender` (before it starts) ask the receiver for playout delay `mode`, and write
    the transport-wide sequence number placeholder where `transport_cc`."""
    bounds = _BOUNDS_10MS.get(mode)
    if bounds is not None or transport_cc:
        sender._RTCRtpSender__rtp_header_extensions_map = SenderExtensionsMap(bounds, transport_cc)
