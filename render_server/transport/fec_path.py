"""Forward error correction on the send path: ULPFEC packets in RED between the frames they
protect, so that a browser rebuilds a lost packet at once instead of after a NACK round trip.

aiortc numbers media packets one after another; ULPFEC packets must take sequence numbers of
the same stream right after the frame they protect (the receiver counts them, and the FEC
header names the protected packets by their numbers on the wire). So the media stream is
renumbered here as it enters the pacer: each packet of aiortc's gets the next number on the
wire, the frame's FEC packets the ones after it. NACKs from the browser name wire numbers: a
media packet's is turned back into aiortc's for its retransmission (whose RTX payload and
sequence number are turned back into the wire's), a FEC packet's is answered from the FEC
kept here (libwebrtc never resends FEC; for H.264, whose receiver releases a frame only once
every earlier number arrived, a lost FEC packet would stall the stream until a keyframe).

Protection follows the loss the congestion controller sees: none on a clean path, and from
1 % loss frames go out RED-wrapped with `protection_for(loss)` FEC packets per 255 media
packets (libwebrtc's scale; 2 % loss gives 51, two FEC packets per ten, which leaves about 1 %
of frames waiting for a NACK instead of 18 %). Frames are protected whole or not at all.
Pure: bytes in, bytes out (red.py and ulpfec.py are the wire formats).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass
from struct import unpack_from
from typing import Final, TypeVar

from render_server.transport.red import rtp_layout, wrap_red
from render_server.transport.rtcp_compound import rtcp_pieces
from render_server.transport.ulpfec import FecParams, UlpfecGenerator

RTCP_RTPFB: Final = 205
NACK_FMT: Final = 1
MARKER: Final = 0x80
LOSS_FLOOR: Final = 0.01  # under this much loss, no FEC (NACK repairs the rare loss)
MIN_FACTOR: Final = 26  # one FEC packet per ten media packets, at least, once protecting
MAX_FACTOR: Final = 128  # at most one per two: past that, loss is the controller's to cut
KEPT: Final = 4096  # wire numbers remembered for NACKs (over a second of a 4K stream)


V = TypeVar("V")


def protection_for(loss: float) -> int:
    """FEC packets per 255 media packets for a path losing `loss` of its packets."""
    if loss < LOSS_FLOOR:
        return 0
    return max(MIN_FACTOR, min(MAX_FACTOR, round(loss * 2550)))


@dataclass(frozen=True)
class FecPayloadTypes:
    """What the answer negotiated: the media codec's, RED's, ULPFEC's and RED's RTX
    payload types (None where the browser has no RTX for RED)."""

    media: int
    red: int
    ulpfec: int
    rtx_red: int | None


class FecPath:
    """Renumbers one video sender's media on the wire and adds ULPFEC packets after frames."""

    def __init__(
        self, media_ssrc: int, rtx_ssrc: int, types: FecPayloadTypes, zero_ids: tuple[int, ...]
    ) -> None:
        self.media_ssrc = media_ssrc
        self.rtx_ssrc = rtx_ssrc
        self.types = types
        self.factor = 0
        self.fec_sent = 0
        self.fec_resent = 0
        self._generator = UlpfecGenerator(zero_extension_ids=zero_ids)
        self._wire = random.getrandbits(16)
        self._frame_start = True
        self._protecting = False
        # aiortc's number → (the wire's, whether it went in RED); and the wire's → aiortc's
        self._to_wire: OrderedDict[int, tuple[int, bool]] = OrderedDict()
        self._to_aiortc: OrderedDict[int, int] = OrderedDict()
        self._fec: OrderedDict[int, bytes] = OrderedDict()  # wire number → FEC packet sent

    def set_protection(self, factor: int) -> None:
        """FEC packets per 255 media packets from the next frame on (0: none)."""
        self.factor = max(0, min(255, factor))

    def media(self, packet: bytes) -> list[bytes]:
        """aiortc's media packet as it goes on the wire, with the frame's FEC packets after
        it where it ends a protected frame."""
        if self._frame_start:
            self._protecting = self.factor > 0
            if self._protecting:
                self._generator.set_params(FecParams(self.factor))
        self._frame_start = bool(packet[1] & MARKER)
        aiortc = int.from_bytes(packet[2:4], "big")
        wire = self._number()
        renumbered = packet[:2] + wire.to_bytes(2, "big") + packet[4:]
        _remember(self._to_wire, aiortc, (wire, self._protecting))
        _remember(self._to_aiortc, wire, aiortc)
        if not self._protecting:
            return [renumbered]
        out = [wrap_red(renumbered, self.types.red)]
        self._generator.add_media_packet(renumbered)
        if self._frame_start:  # it ended the frame: the batch's FEC follows
            for fec in self._generator.fec_packets():
                number = self._number()
                data = fec.to_rtp(number, self.types.red, self.types.ulpfec)
                _remember(self._fec, number, data)
                out.append(data)
                self.fec_sent += 1
        return out

    def retransmission(self, packet: bytes) -> bytes | None:
        """aiortc's retransmission of one of its packets (on the RTX stream, or the media
        stream where RTX was not negotiated) as the wire knew it; None for a packet whose
        wire number is forgotten."""
        ssrc = int.from_bytes(packet[8:12], "big")
        header = rtp_layout(packet).header_size
        if ssrc == self.rtx_ssrc:
            original = self._to_wire.get(int.from_bytes(packet[header : header + 2], "big"))
            if original is None:
                return None
            wire, red = original
            osn = wire.to_bytes(2, "big")
            payload = packet[header + 2 :]
            if red and self.types.rtx_red is not None:
                first = bytes((packet[1] & MARKER | self.types.rtx_red,))
                block = bytes((self.types.media,))
                return packet[:1] + first + packet[2:header] + osn + block + payload
            return packet[:header] + osn + payload
        original = self._to_wire.get(int.from_bytes(packet[2:4], "big"))
        if original is None:
            return None
        wire, red = original
        renumbered = packet[:2] + wire.to_bytes(2, "big") + packet[4:]
        return wrap_red(renumbered, self.types.red) if red else renumbered

    def nack(self, wire_numbers: list[int]) -> tuple[list[int], list[bytes]]:
        """The browser NACKed `wire_numbers`: aiortc's numbers to retransmit, and the FEC
        packets to send again."""
        media: list[int] = []
        fec: list[bytes] = []
        for number in wire_numbers:
            if number in self._fec:
                fec.append(self._fec[number])
                self.fec_resent += 1
            elif number in self._to_aiortc:
                media.append(self._to_aiortc[number])
        return media, fec

    def _number(self) -> int:
        number = self._wire
        self._wire = (self._wire + 1) & 0xFFFF
        return number


def _remember(kept: OrderedDict[int, V], key: int, value: V) -> None:
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > KEPT:
        kept.popitem(last=False)


def split_nacks(data: bytes, media_ssrc: int) -> tuple[list[int], bytes]:
    """The sequence numbers the generic NACKs (RTPFB FMT 1) for `media_ssrc` in a compound
    RTCP datagram ask for, and the datagram without those NACKs (never raises: a datagram
    that does not parse is left whole)."""
    lost: list[int] = []
    rest: list[bytes] = []
    for piece in rtcp_pieces(data):
        first, body = piece.first, piece.body
        if (
            piece.packet_type == RTCP_RTPFB
            and first & 0x1F == NACK_FMT
            and not first & 0x20
            and len(body) >= 8
            and int.from_bytes(body[4:8], "big") == media_ssrc
        ):
            for at in range(8, len(body) - 3, 4):
                pid, blp = unpack_from("!HH", body, at)
                lost.append(pid)
                lost.extend((pid + bit + 1) & 0xFFFF for bit in range(16) if blp >> bit & 1)
        else:
            rest.append(piece.raw)
    return lost, b"".join(rest)
