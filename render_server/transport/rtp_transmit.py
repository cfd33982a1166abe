"""Where the send path's packets leave: plain RTP protected and handed to the socket in one loop
per batch, RTCP through aiortc's own transport.

aiortc sends each RTP packet through four coroutines (`RTCDtlsTransport._send_rtp`,
`Connection.send`, `Connection.sendto`, `StunProtocol.send_data`) before the datagram
transport's `sendto`; none of them ever waits, so for a frame's packets that is only cost.
Here the same steps run once per batch: the DTLS transport's state is checked, the nominated
pair looked up, then every packet is protected and written. The pair's protocol transport is
the UDP socket's, or aioice's TURN transport for a relayed pair (which wraps each datagram in
ChannelData itself), so relay-only sessions take the same path. A batch is protected into one
buffer (`srtp_batch`) and leaves the UDP socket in runs of equal-sized datagrams, one system
call each (`udp_segments`).

Checked against aiortc 1.16 and aioice 0.10: `RTCDtlsTransport._state`, `_tx_srtp`,
`__tx_bytes`, `__tx_packets` (its stats), `RTCIceTransport._connection`,
`Connection._nominated` (component 1) and `CandidatePair.protocol`, `.remote_addr`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiortc.rtcdtlstransport import RTCDtlsTransport, State

from render_server.protocol.timing import now_ms
from render_server.transport.srtp_batch import BatchProtector, batches
from render_server.transport.udp_segments import SegmentedSender

log = logging.getLogger(__name__)


class PacketOutput:
    """The packets of one sender's DTLS transport on their way out; `on_marker(timestamp, ms)`
    hears of each frame's last packet (of the sender's SSRC) as it leaves."""

    def __init__(self, transport: Any, media_ssrc: int) -> None:
        self._transport = transport
        self._send: Callable[[bytes], Awaitable[None]] = transport._send_rtp  # aiortc's own
        self._direct = isinstance(transport, RTCDtlsTransport)  # else a test's stand-in
        self._ssrc = media_ssrc.to_bytes(4, "big")
        self.on_marker: Callable[[int, float], None] | None = None
        self.errors = 0  # packets that could not be sent (SRTP refuses an over-long one)
        self._segments: SegmentedSender | None = None  # for the nominated pair's transport
        self._protector: BatchProtector | None = None  # for the DTLS transport's SRTP session

    async def rtp(self, batch: Sequence[bytes | bytearray]) -> None:
        """Plain RTP packets, in order; nothing where the transport is no longer connected
        (the sender's loop ends on its own check)."""
        if not self._direct:
            for data in batch:
                await self.rtcp(bytes(data))
                self._sent(data)
            return
        dtls: Any = self._transport
        pair = dtls.transport._connection._nominated.get(1)
        if dtls._state != State.CONNECTED or pair is None or pair.protocol.transport is None:
            return
        segments = self._segments
        if segments is None or segments.transport is not pair.protocol.transport:
            segments = self._segments = SegmentedSender(pair.protocol.transport)
        protector = self._protector
        if protector is None or protector.session is not dtls._tx_srtp:
            protector = self._protector = BatchProtector(dtls._tx_srtp)
        size = sent = 0
        for turn in batches(batch):
            wires, plains = protector.protect(turn, self._failed)
            segments.send(wires, pair.remote_addr)  # before the next turn reuses the buffer
            for plain in plains:
                self._sent(plain)
            size, sent = size + sum(map(len, wires)), sent + len(wires)
        dtls._RTCDtlsTransport__tx_bytes += size
        dtls._RTCDtlsTransport__tx_packets += sent

    @property
    def segmented(self) -> int:
        """Packets that left in runs of one system call (`udp_segments`)."""
        return self._segments.segmented if self._segments is not None else 0

    async def rtcp(self, data: bytes) -> None:
        """A packet through aiortc's transport (RTCP; every packet on a test's stand-in)."""
        try:
            await self._send(data)
        except ConnectionError:
            pass  # the peer went: the sender's loop ends
        except Exception as exc:  # one packet SRTP refuses (too long) must not end the path
            self._failed(exc)

    def _sent(self, data: bytes | bytearray) -> None:
        on_marker = self.on_marker
        # RTP (not RTCP: its second byte is a packet type 200..207), marker bit set, our SSRC
        if on_marker is not None and data[1] & 0x80 and not 72 <= data[1] & 0x7F <= 79:
            if data[8:12] == self._ssrc:
                on_marker(int.from_bytes(data[4:8], "big"), now_ms())

    def _failed(self, error: Exception) -> None:
        self.errors += 1
        if self.errors == 1:  # said once
            log.warning("send_path.send_failed", extra={"error": str(error)[:200]})
