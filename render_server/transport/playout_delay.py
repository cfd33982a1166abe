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
negotiation (Chromium offers it) and gives a sender a header-extension map that writes it into
every packet.

Checked against aiortc 1.16: the module-level list `aiortc.codecs.HEADER_EXTENSIONS`, the
private `RTCRtpSender.__rtp_header_extensions_map`, and `HeaderExtensionsMap.set`'s signature.
"""

from __future__ import annotations

from struct import pack
from typing import Any

from aiortc import codecs
from aiortc.rtcrtpparameters import RTCRtpHeaderExtensionParameters, RTCRtpParameters
from aiortc.rtp import (
    HeaderExtensions,
    HeaderExtensionsMap,
    pack_header_extensions,
    unpack_header_extensions,
)

PLAYOUT_DELAY_URI = "http://www.webrtc.org/experiments/rtp-hdrext/playout-delay"


def register_playout_delay() -> None:
    """Offer and answer the extension for video (process-wide: aiortc keeps one list)."""
    video = codecs.HEADER_EXTENSIONS["video"]
    if not any(ext.uri == PLAYOUT_DELAY_URI for ext in video):
        video.append(RTCRtpHeaderExtensionParameters(id=len(video) + 1, uri=PLAYOUT_DELAY_URI))


class PlayoutDelayExtensionsMap(HeaderExtensionsMap):
    """aiortc's map, plus playout delay (min, max in 10 ms units) on every packet it writes."""

    def __init__(self, min_10ms: int = 0, max_10ms: int = 0) -> None:
        super().__init__()
        self._id: int | None = None
        # 12 bits each: min then max
        self._value = pack("!I", (min_10ms & 0xFFF) << 12 | (max_10ms & 0xFFF))[1:]

    def configure(self, parameters: RTCRtpParameters) -> None:
        super().configure(parameters)
        self._id = next(
            (e.id for e in parameters.headerExtensions if e.uri == PLAYOUT_DELAY_URI), None
        )

    def set(self, values: HeaderExtensions) -> tuple[int, bytes]:
        profile, data = super().set(values)
        if self._id is None:
            return profile, data
        extensions = list(unpack_header_extensions(profile, data)) if data else []
        extensions.append((self._id, self._value))
        return pack_header_extensions(extensions)


_BOUNDS_10MS = {"low": (0, 50), "zero": (0, 0)}


def request_playout_delay(sender: Any, mode: str) -> None:
    """Make `sender` (before it starts) ask the receiver for playout delay `mode`."""
    if mode in _BOUNDS_10MS:
        sender._RTCRtpSender__rtp_header_extensions_map = PlayoutDelayExtensionsMap(
            *_BOUNDS_10MS[mode]
        )
