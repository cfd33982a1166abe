"""What a video sender hands the send path, measured per window: its rate, and the share of
the wire's bits that the encoder made (what the encoder's target is scaled by).

The congestion controller's estimate counts wire bytes (RTP header and extensions, SRTP tag,
UDP, IP), as the link does. An encoder asked for the estimate makes that much payload and puts
5–6 % more on the wire at 1,200-byte packets, more again for what it resends: on a 2 Mbit/s
link, a target that climbs to 1.9 Mbit/s already overfills it and the queue grows until the
delay detector trips. libwebrtc takes the packets' overhead and the retransmissions' rate off
the target before the encoder hears of it (RtpVideoSender::OnBitrateUpdated); so does the send
path, with the share measured on what it sent rather than assumed.

Sans-IO: `add` for each frame's packets as the sender hands them over and for each packet sent
again, `update` as time passes (a window closes every `window_s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from .red import rtp_layout

PRIOR_SHARE: Final = 0.94  # before a window is measured: 1,200-byte packets, ~30 header bytes
MIN_PACKETS: Final = 20  # fewer in a window say too little of the share (a still camera)
FLOOR: Final = 0.5  # a burst of resends never takes more than half the target


class WireMeter:
    def __init__(self, now: float, window_s: float = 0.5) -> None:
        self.share = PRIOR_SHARE  # the encoder's payload over the wire's bytes, smoothed
        self.rate: float | None = None  # bits/s of RTP the sender handed over, smoothed
        self._window_s = window_s
        self._since = now
        self._rtp = 0  # RTP bytes since `_since`
        self._wire = 0  # the same on the wire
        self._payload = 0  # of them, the encoder's own
        self._packets = 0

    def add(
        self, packets: Sequence[bytes | bytearray], overhead: int, repeat: bool = False
    ) -> None:
        """A frame's RTP packets (or one packet), each `overhead` bytes more on the wire; or
        packets sent again (`repeat`: a NACK's answer), all wire and no new payload. The header
        of the first and the last stand for the rest: a frame's first packet may carry
        extensions its followers do not (timing, playout delay), never the other way."""
        count = len(packets)
        if not count:
            return
        size = sum(map(len, packets))
        self._rtp += size
        self._wire += size + count * overhead
        self._packets += count
        if not repeat:
            first = rtp_layout(packets[0]).header_size
            rest = rtp_layout(packets[-1]).header_size if count > 1 else first
            self._payload += size - first - rest * (count - 1)

    def update(self, now: float) -> None:
        """Close the window once `window_s` has passed: each figure half the new measure and
        half the old."""
        elapsed = now - self._since
        if elapsed < self._window_s:
            return
        rate = self._rtp * 8 / elapsed
        self.rate = rate if self.rate is None else 0.5 * (self.rate + rate)
        if self._packets >= MIN_PACKETS and self._wire > 0:
            measured = max(FLOOR, min(1.0, self._payload / self._wire))
            self.share = 0.5 * (self.share + measured)
        self._since = now
        self._rtp = self._wire = self._payload = self._packets = 0
