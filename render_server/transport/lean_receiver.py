"""A lean receive path for load-test clients: RTP read from the decrypted datagram, nothing else.

Checked against aiortc 1.16 (see transport/__init__.py). aiortc's DTLS transport unprotects
each SRTP datagram and hands it to `RTCDtlsTransport._handle_rtp_data`, which parses the whole
packet (header extensions included) and routes it to the receiver; the receiver then runs its
REMB estimator, NACK generator, depayloader and jitter buffer on every packet. A client that
only counts frames on the marker bit needs none of that: `receive_lean` replaces the transport's
`_handle_rtp_data` with one that reads the fixed header and the payload's bounds and gives the
packet to `on_packet` (the `receiver_hook` signature). ICE, DTLS, SRTP and the data channel are
aiortc's, unchanged.

Once the pair is up (`rehook` after negotiating), SRTP media does not wait in aioice's queue
either: aiortc hands each datagram through a failed STUN parse, an `asyncio.Queue` and three
coroutines before the DTLS transport unprotects it. The ICE connection's sockets
(`StunProtocol.datagram_received`, relayed ones included) now unprotect an RTP datagram where
it arrives and read it at once; STUN, DTLS and RTCP take aiortc's way as before, and RTP of
another codec is handed to aiortc's own handler already unprotected.

The sender still hears from us: each packet feeds aiortc's own `StreamStatistics`, from which
the receiver's RTCP task sends receiver reports (loss, jitter, LSR/DLSR for the RTT). No NACK,
PLI or REMB is sent: lost packets stay lost (counted by the frame assembler), and the worker's
bitrate is its own (REMB only ever lowers it). With `transport_feedback`, each packet's
transport-wide number and arrival (the kernel's receive time) also go to a transport-cc
feedback generator whose feedback the receiver sends every 50 ms, as a browser's would: the
worker then paces and estimates the path as it does for browsers.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pylibsrtp
from aioice.ice import StunProtocol
from aiortc import RTCRtpReceiver, clock
from aiortc.rtcdtlstransport import State
from aiortc.rtcrtpreceiver import StreamStatistics
from aiortc.rtp import is_rtcp

from render_server.transport.feedback_generator import feedback_sender
from render_server.transport.header_extensions import read_transport_sequence
from render_server.transport.receive_estimator import drop_receive_estimator
from render_server.transport.receiver_hook import CodecObserver, PacketObserver, _DiscardQueue
from render_server.transport.udp_gro import GroStats, ReadClock, read_coalesced

_HEADER = struct.Struct("!HII")  # sequence number, timestamp, SSRC (after the first 2 bytes)
_LENGTH = struct.Struct("!H")


@dataclass(slots=True)
class SeenPacket:
    """What `StreamStatistics.add` reads of a packet."""

    sequence_number: int
    timestamp: int


@dataclass
class LeanStats:
    packets: int = 0  # RTP packets of the receiver's codecs handled here
    padding: int = 0  # of them, RTX padding (bandwidth probes): no media to count
    malformed: int = 0  # too short for their own header
    passed_on: int = 0  # other RTP (not this receiver's codecs): left to aiortc
    direct: int = 0  # SRTP datagrams unprotected and read where they arrived
    unprotect_failed: int = 0  # of those, datagrams SRTP refused (dropped, as aiortc does)


def payload_bounds(data: bytes) -> tuple[int, int] | None:
    """Where an RTP packet's payload starts and ends (CSRCs, header extension and padding
    skipped); None when the packet is too short for its own header."""
    start = 12 + 4 * (data[0] & 0x0F)
    if data[0] & 0x10:  # a header extension: skipped whole
        if len(data) < start + 4:
            return None
        start += 4 + 4 * _LENGTH.unpack_from(data, start + 2)[0]
    end = len(data) - (data[-1] if data[0] & 0x20 else 0)
    return None if end < start else (start, end)


class LeanReceiver:
    """Takes one receiver's video off aiortc's per-packet path. Create it right after
    `addTransceiver`, and call `rehook` after negotiating (BUNDLE may have given the receiver
    another transport). RTX is unwrapped to the packet it repairs. aiortc's decoder gets
    nothing (as with `observe_receiver` without decoding)."""

    def __init__(
        self,
        receiver: RTCRtpReceiver,
        on_packet: PacketObserver,
        on_codec: CodecObserver | None = None,
        transport_feedback: bool = False,
    ) -> None:
        if getattr(receiver, "_RTCRtpReceiver__decoder_thread", None) is not None:
            raise RuntimeError("the receiver already decodes: hook it before negotiating")
        try:
            self._codecs: dict[int, Any] = receiver._RTCRtpReceiver__codecs  # type: ignore[attr-defined]
            self._rtx_ssrc: dict[int, int] = receiver._RTCRtpReceiver__rtx_ssrc  # type: ignore[attr-defined]
            self._streams: dict[int, StreamStatistics] = receiver._RTCRtpReceiver__remote_streams  # type: ignore[attr-defined]
        except AttributeError:
            raise RuntimeError("this aiortc's RTCRtpReceiver has no state to feed") from None
        receiver._RTCRtpReceiver__decoder_queue = _DiscardQueue()  # type: ignore[attr-defined]
        drop_receive_estimator(receiver)  # never fed: the media stops here
        self.receiver = receiver
        self.on_packet = on_packet
        self.on_codec = on_codec
        self.stats = LeanStats()
        self.gro = GroStats()  # the sockets' reads, where they took UDP_GRO (udp_gro)
        self.clock = ReadClock()  # packets' arrival: the kernel's receive time where it gave one
        # the kernel's receive time of the last datagram left to aiortc (STUN, DTLS, RTCP), on
        # `time.monotonic()` in ms; None where it came without one. A data-channel message is
        # parsed after its datagram was read, never before, so this is its arrival or later
        self.control_ms: float | None = None
        self._told: str | None = None  # the codec `on_codec` last heard of
        # transport-cc feedback (started with the loop running), and the extension's id once
        # negotiated
        self.feedback = feedback_sender(receiver) if transport_feedback else None
        self._feedback_id: int | None = None
        self.rehook()

    def rehook(self) -> None:
        """Hook the receiver's transport as it is now (once per transport), and the sockets its
        ICE connection has gathered by now (call again after negotiating)."""
        transport = self.receiver.transport
        current: Any = transport._handle_rtp_data
        if not getattr(current, "lean", False):
            original: Callable[[bytes, int], Awaitable[None]] = current
            handle = self._handle

            async def lean(data: bytes, arrival_time_ms: int) -> None:
                if not handle(data):
                    await original(data, arrival_time_ms)

            lean.lean = True  # type: ignore[attr-defined]
            lean.original = original  # type: ignore[attr-defined]
            transport._handle_rtp_data = lean  # type: ignore[method-assign]
            current = lean
        self._hook_sockets(transport, current.original)
        self._feedback_id = None  # read again from this transport's map

    def _hook_sockets(self, dtls: Any, aiortcs: Callable[[bytes, int], Awaitable[None]]) -> None:
        """Read SRTP media where the ICE connection's sockets receive it (once per socket);
        RTP that is not ours goes to `aiortcs` (the transport's own handler)."""
        connection = getattr(getattr(dtls, "transport", None), "_connection", None)
        for protocol in getattr(connection, "_protocols", ()):
            if not isinstance(protocol, StunProtocol):
                continue
            received = protocol.datagram_received
            if not getattr(received, "lean", False):
                direct, take_run = self._readers(dtls, self._stamped(received), aiortcs)
                setattr(protocol, "datagram_received", direct)  # noqa: B010 (aioice's object)
                transport = getattr(protocol, "transport", None)
                if transport is not None:  # a relayed "socket" (TURN) has none of its own
                    read_coalesced(
                        transport, direct, protocol.error_received, self.gro, take_run, self.clock
                    )

    def _stamped(self, original: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        """`original` (aiortc's way in), noting the read's kernel stamp as `control_ms` first."""
        clock = self.clock

        def to_aiortc(data: Any, addr: Any) -> None:
            self.control_ms = clock.kernel_ms
            original(data, addr)

        return to_aiortc

    def _readers(
        self,
        dtls: Any,
        original: Callable[[Any, Any], None],
        aiortcs: Callable[[bytes, int], Awaitable[None]],
    ) -> tuple[Callable[[Any, Any], None], Callable[[bytes, int, Any], int] | None]:
        """What reads one socket: a datagram at a time (marked `lean`), and a whole coalesced
        run where that is cheaper (`udp_gro.read_coalesced`'s `take_run`; None: datagrams)."""
        return self._direct(dtls, original, aiortcs), None

    def _direct(
        self,
        dtls: Any,
        original: Callable[[Any, Any], None],
        aiortcs: Callable[[bytes, int], Awaitable[None]],
    ) -> Callable[[Any, Any], None]:
        handle, stats = self._handle, self.stats

        def datagram_received(data: Any, addr: Any) -> None:
            srtp = dtls._rx_srtp
            if (
                srtp is None or len(data) < 12 or not 127 < data[0] < 192 or is_rtcp(data)
                or dtls._state != State.CONNECTED
            ):  # fmt: skip
                original(data, addr)  # STUN, DTLS, RTCP, or SRTP not keyed yet: aiortc's way
                return
            stats.direct += 1
            dtls._RTCDtlsTransport__rx_bytes += len(data)
            dtls._RTCDtlsTransport__rx_packets += 1
            try:
                plain = srtp.unprotect(data)
            except pylibsrtp.Error:
                stats.unprotect_failed += 1
                return
            if not handle(plain):
                asyncio.ensure_future(aiortcs(plain, clock.current_ms()))

        datagram_received.lean = True  # type: ignore[attr-defined]
        return datagram_received

    def _handle(self, data: bytes) -> bool:
        """True when the packet was ours (handled), False to leave it to aiortc."""
        stats = self.stats
        if len(data) < 12:
            stats.malformed += 1
            return True
        codec = self._codecs.get(data[1] & 0x7F)
        if codec is None:
            stats.passed_on += 1
            return False
        stats.packets += 1
        seq, timestamp, ssrc = _HEADER.unpack_from(data, 2)
        bounds = payload_bounds(data)
        if bounds is None:
            stats.malformed += 1
            return True
        start, end = bounds
        statistics = self._streams.get(ssrc)
        if statistics is None:
            statistics = self._streams[ssrc] = StreamStatistics(codec.clockRate)
        statistics.add(SeenPacket(seq, timestamp))  # type: ignore[arg-type]
        if self.feedback is not None:
            self._feed(data, ssrc)
        name = codec.name
        if name.lower() == "rtx":
            repaired = self._codecs.get(codec.parameters.get("apt"))
            if end - start < 2 or ssrc not in self._rtx_ssrc or repaired is None:
                stats.padding += 1  # a probe's padding, or nothing we could place
                return True
            name, seq = repaired.name, _LENGTH.unpack_from(data, start)[0]
            start += 2
        if self.on_codec is not None and name != self._told:
            self._told = name
            self.on_codec(name)
        self.on_packet(seq, timestamp, data[1] >> 7, data[start:end], self.clock.now_ms())
        return True

    def _feedback_extension(self) -> int | None:
        """The transport-wide number's extension id, where packets are to be reported: the id
        the DTLS transport's map was configured with (aiortc's private fields, read once);
        None while it is not negotiated (the worker follows REMB and receiver reports), or
        without feedback."""
        if self.feedback is None or self.feedback.stopped:
            return None
        if self._feedback_id is None:
            ids = getattr(self.receiver.transport._rtp_header_extensions_map,
                          "_HeaderExtensionsMap__ids", None)  # fmt: skip
            self._feedback_id = getattr(ids, "transport_sequence_number", None)
        return self._feedback_id

    def _feed(self, data: bytes, ssrc: int) -> None:
        """Give the packet's transport-wide number and arrival to the feedback generator."""
        extension_id = self._feedback_extension()
        if extension_id is None or self.feedback is None:
            return
        number = read_transport_sequence(data, extension_id)
        if number is not None:
            self.feedback.generator.on_packet(number, int(self.clock.now_ms() * 1000), ssrc)
