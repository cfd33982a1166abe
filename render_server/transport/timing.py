"""Per-frame timing records, completed as each frame's last RTP packet leaves.

Every frame gets one record: the input it shows, when it started, when rendering and encoding
ended, when it was handed to aiortc and when its last RTP packet went to the DTLS transport.
The record is keyed by the frame's RTP timestamp as it is on the wire, which is what the
browser's `requestVideoFrameCallback` reports for the frame it displays. aiortc adds a random
origin to our timestamps that it keeps to itself; the first frame's last packet reveals it.
The records' wire form and clock are `protocol.timing`'s. `watch_sent_packets` wraps aiortc's
private `RTCDtlsTransport._send_rtp` (checked against aiortc 1.16, see transport/__init__.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from render_server.protocol.timing import RTP_MASK, TimingRecord, now_ms

STALE_S = 1.0  # a record whose packets never went out (a closed peer) is dropped after this


@dataclass(frozen=True, slots=True)
class FrameRecord:
    """A frame handed to aiortc, waiting for its last packet to leave (worker ms)."""

    pts: int  # our 90 kHz timestamp; the wire's is `origin + pts`
    seq: int  # the newest input this frame shows, -1 for none newer than the last frame's
    input_ms: float | None  # when that input arrived
    start_ms: float  # the frame's start: render (or the reuse of the last picture) begins
    rendered_ms: float
    encoded_ms: float
    handed_ms: float  # the packet went to aiortc's sender
    bytes: int
    keyframe: bool

    def sent(self, rtp: int, sent_ms: float) -> TimingRecord:
        """The complete record, once the frame's last packet, RTP timestamp `rtp`, has left."""
        return TimingRecord(
            rtp, self.seq, self.input_ms, self.start_ms, self.rendered_ms, self.encoded_ms,
            self.handed_ms, sent_ms, self.bytes, self.keyframe,
        )  # fmt: skip


class FrameTimingLog:
    """Records of one peer connection's frames, completed when their last packet leaves."""

    def __init__(self) -> None:
        self._origin: int | None = None
        self._waiting: deque[FrameRecord] = deque()  # handed to aiortc, not yet on the wire
        self._ready: list[TimingRecord] = []

    def handed(self, record: FrameRecord) -> None:
        self._waiting.append(record)
        while self._waiting and record.handed_ms - self._waiting[0].handed_ms > STALE_S * 1e3:
            self._waiting.popleft()

    def packet_sent(self, timestamp: int, sent_ms: float) -> None:
        """A marker packet (the last of a frame) with RTP `timestamp` went to the transport."""
        while self._waiting:
            record = self._waiting[0]
            if self._origin is None:
                self._origin = (timestamp - record.pts) & RTP_MASK
            if (self._origin + record.pts) & RTP_MASK != timestamp:
                if self._precedes(record, timestamp):
                    self._waiting.popleft()  # a frame aiortc never sent (a disabled sender)
                    continue
                return  # a retransmission or a frame we hold no record of
            self._waiting.popleft()
            self._ready.append(record.sent(timestamp, sent_ms))
            return

    def drain(self) -> list[TimingRecord]:
        """The records completed since the last call, in the order their frames left."""
        ready, self._ready = self._ready, []
        return ready

    def _precedes(self, record: FrameRecord, timestamp: int) -> bool:
        assert self._origin is not None
        ahead = (timestamp - ((self._origin + record.pts) & RTP_MASK)) & RTP_MASK
        return 0 < ahead < 2**31


def watch_sent_packets(sender: Any, on_marker: Callable[[int, float], None]) -> None:
    """Call `on_marker(rtp_timestamp, ms)` when each frame's last RTP packet of `sender` goes
    to its DTLS transport (unencrypted at that point, so the header can be read)."""
    transport = sender.transport
    original: Callable[[bytes], Awaitable[None]] = transport._send_rtp
    ssrc = sender._ssrc.to_bytes(4, "big")

    async def send_rtp(data: bytes) -> None:
        await original(data)
        # RTP (not RTCP: its second byte is a packet type 200..207), marker bit set, our SSRC
        if len(data) >= 12 and data[1] & 0x80 and not 72 <= data[1] & 0x7F <= 79:
            if data[8:12] == ssrc:
                on_marker(int.from_bytes(data[4:8], "big"), now_ms())

    transport._send_rtp = send_rtp
