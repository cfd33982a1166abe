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
packets (libwebrtc's scale): 2 % loss gives 102, four FEC packets per ten media packets,
which leaves 0.2 % of ten-packet frames waiting for a NACK instead of 18 % (two per ten
left 1 %; tests/test_fec_path.py counts them). Frames are protected whole or not at all.
The loss that counts is the highest the controller reported in the last `LOSS_HOLD_S`
(`protection`), as libwebrtc's protection logic keeps the highest of its last ten seconds:
2 % random loss counted over the controller's half-second windows reads anywhere from 0 to
5 %, and following it turned FEC off for a second every few seconds (the frames then lost
waited for NACKs) and swung the encoder's share with it. A new path is protected at
MIN_FACTOR for its first `FRESH_S` whatever its reports say, as they say little yet: in the
lab at 2 % loss, FEC used to come on 0.6–1.8 s into a stream, and 8 of the 11 freezes in 11.5
minutes of 30 s sessions fell in their first 2.6 s (a lost packet, a lost NACK, a lost frame's
last packet seen missing only when the next frame came). A clean path pays that share for
those two seconds.

A lost FEC packet is itself a hole in the numbers, which H.264's receiver fills (by a NACK)
before it releases the next frame: in the lab, frames after a lost FEC packet waited 50 to
120 ms. So for such a codec (`FecPayloadTypes.in_order`), where RTX for RED was negotiated
and the caller hands out RTX sequence numbers (`rtx_numbers`), every FEC packet of a frame is
sent once more as an RTX copy: the receiver restores the copy as a duplicate, or in place of
the lost one, and the hole stays open only when both are lost (0.04 % each at 2 % loss). The
frame then gets `protection_for`'s count like any codec: tests/test_fec_path.py counts the
frames left waiting at 2 % loss, 0.28 % of twelve-packet H.264 frames against 4.3 % with one
FEC packet and no copy (2.4 % by the same count with the one copy of the design before,
where that FEC packet, the XOR of the frame, rebuilt a single loss: in the lab, a frame with
two lost packets then waited a NACK round trip and the page showed a gap of 100–200 ms).
Without copies an in-order frame keeps the one FEC packet: each more would be one more
chance to hold the next frame. And for H.264 no FEC goes out where libwebrtc's receiver
moves its GOP key, every 10,000 numbers (gop_rekey.py: a FEC packet there could make it drop
a frame and stand still for 3 s); with copies, each packet of the frames sent then goes
twice. VP8 and AV1 frames wait on nothing but their own packets; their last FEC packet is
copied (the copies have numbers of their own, so transport feedback counts them as any
packet). `share` counts the copies.
Pure: bytes in, bytes out (red.py and ulpfec.py are the wire formats).
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from struct import unpack_from
from typing import Final, TypeVar

from render_server.transport.congestion.types import PacketFeedback
from render_server.transport.fec_holes import FecHoles
from render_server.transport.gop_rekey import RekeyGuard, starts_keyframe
from render_server.transport.red import rtp_layout, wrap_red
from render_server.transport.rtcp_compound import rtcp_pieces
from render_server.transport.ulpfec import FecParams, UlpfecGenerator

RTCP_RTPFB: Final = 205
NACK_FMT: Final = 1
MARKER: Final = 0x80
LOSS_FLOOR: Final = 0.01  # under this much loss, no FEC (NACK repairs the rare loss)
MIN_FACTOR: Final = 51  # two FEC packets per ten media packets, at least, once protecting
MAX_FACTOR: Final = 128  # at most one per two: past that, loss is the controller's to cut
LOSS_HOLD_S: Final = 10.0  # protection follows the highest loss reported this long
FRESH_S: Final = 2.0  # a new path's loss is unknown this long: it is protected at MIN_FACTOR
COPY_SHARE: Final = 26  # a frame's one copy in `share`: one per ten media packets
KEPT: Final = 4096  # wire numbers remembered for NACKs (over a second of a 4K stream)


V = TypeVar("V")


def protection_for(loss: float) -> int:
    """FEC packets per 255 media packets for a path losing `loss` of its packets."""
    if loss < LOSS_FLOOR:
        return 0
    return max(MIN_FACTOR, min(MAX_FACTOR, round(loss * 5100)))


@dataclass(frozen=True)
class FecPayloadTypes:
    """What the answer negotiated: the media codec's, RED's, ULPFEC's and RED's RTX
    payload types (None where the browser has no RTX for RED); `in_order` where the codec's
    receiver holds a frame until every earlier number has come (H.264 in libwebrtc)."""

    media: int
    red: int
    ulpfec: int
    rtx_red: int | None
    in_order: bool = False


class FecPath:
    """Renumbers one video sender's media on the wire and adds ULPFEC packets after frames."""

    def __init__(
        self,
        media_ssrc: int,
        rtx_ssrc: int,
        types: FecPayloadTypes,
        zero_ids: tuple[int, ...],
        rtx_numbers: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.media_ssrc = media_ssrc
        self.rtx_ssrc = rtx_ssrc
        self.types = types
        # the next RTX sequence number (the sender's counter), where a frame's last FEC is copied
        self._rtx_numbers = rtx_numbers if types.rtx_red is not None else None
        self._losses: deque[tuple[float, float]] = deque()  # (when, loss) reported
        self._fresh_until = clock() + FRESH_S
        self.factor = MIN_FACTOR  # until the loss is known (`protection`)
        self.fec_sent = 0
        self.fec_resent = 0
        self.media_copies = 0  # media packets sent twice near a GOP key move (gop_rekey.py)
        self.resend_copies = 0  # retransmissions sent twice on a lossy path (`retransmissions`)
        # in order without copies: one FEC packet a frame, as each lost one holds the next frame
        self._copy_all = types.in_order and self._rtx_numbers is not None
        most = 1 if types.in_order and not self._copy_all else None
        self._generator = UlpfecGenerator(max_fec_packets=most, zero_extension_ids=zero_ids)
        self._wire = random.getrandbits(16)
        self._frame_start = True
        self._doubling = False
        # H.264: no FEC where libwebrtc's receiver moves its GOP key (gop_rekey.py)
        self.rekey = RekeyGuard(clock) if types.in_order else None
        # H.264's FEC packets lost with their copies, told by transport feedback (fec_holes.py)
        self.holes = FecHoles() if self._copy_all else None
        self._keyframe = False  # the frame under way is a keyframe (H.264)
        self._protecting = False
        # aiortc's number → (the wire's, whether it went in RED); and the wire's → aiortc's
        self._to_wire: OrderedDict[int, tuple[int, bool]] = OrderedDict()
        self._to_aiortc: OrderedDict[int, int] = OrderedDict()
        self._fec: OrderedDict[int, bytes] = OrderedDict()  # wire number → FEC packet sent

    def set_protection(self, factor: int) -> None:
        """FEC packets per 255 media packets from the next frame on (0: none)."""
        self.factor = max(0, min(255, factor))

    def protection(self, now: float, loss: float) -> int:
        """The factor for the loss the controller reports at `now`: `protection_for` the
        highest reported in the last LOSS_HOLD_S, and at least MIN_FACTOR in the path's first
        FRESH_S, before its reports mean anything."""
        while self._losses and self._losses[0][0] <= now - LOSS_HOLD_S:
            self._losses.popleft()
        while self._losses and self._losses[-1][1] <= loss:
            self._losses.pop()  # a report under a newer, higher one is never the highest again
        self._losses.append((now, loss))
        factor = protection_for(self._losses[0][1])
        return max(factor, MIN_FACTOR) if now < self._fresh_until else factor

    @property
    def share(self) -> int:
        """FEC packets sent per 255 media packets, the copies included (an in-order codec's
        copy of each; else one a frame, taken as one per ten media packets, as is the one FEC
        packet of an in-order codec without copies)."""
        if self._copy_all:
            return 2 * self.factor
        copies = COPY_SHARE if self.factor and self._rtx_numbers is not None else 0
        return (min(self.factor, COPY_SHARE) if self.types.in_order else self.factor) + copies

    def media(self, packet: bytes) -> list[bytes]:
        """aiortc's media packet as it goes on the wire, with the frame's FEC packets after
        it where it ends a protected frame."""
        if self._frame_start:
            self._protecting = self.factor > 0
            # near the receiver's GOP key move: each packet twice instead of FEC (gop_rekey.py)
            self._doubling = (
                self._protecting and self._copy_all and self.rekey is not None
                and self.rekey.near(self._wire)
            )  # fmt: skip
            if self._protecting:
                self._generator.set_params(FecParams(self.factor))
            # a keyframe's parameter sets lead it, in its first packet (a STAP-A)
            self._keyframe = self.rekey is not None and starts_keyframe(
                packet[rtp_layout(packet).header_size :]
            )
        self._frame_start = bool(packet[1] & MARKER)
        aiortc = int.from_bytes(packet[2:4], "big")
        wire = self._number()
        renumbered = packet[:2] + wire.to_bytes(2, "big") + packet[4:]
        _remember(self._to_wire, aiortc, (wire, self._protecting))
        _remember(self._to_aiortc, wire, aiortc)
        if self.rekey is not None and self._frame_start:
            self.rekey.frame_ended(wire, self._keyframe)
        if not self._protecting:
            return [renumbered]
        out = [wrap_red(renumbered, self.types.red)]
        if self._doubling:
            assert self._rtx_numbers is not None
            self.media_copies += 1
            return [*out, self._rtx_copy(out[0], self._rtx_numbers())]
        self._generator.add_media_packet(renumbered)
        if self._frame_start:  # it ended the frame: the batch's FEC follows
            fec_packets = []
            made = self._generator.fec_packets()
            if self.rekey is not None and not self.rekey.fec_may_follow(wire, len(made)):
                made = []  # the frame goes without: the receiver is about to move its key
            for fec in made:
                number = self._number()
                data = fec.to_rtp(number, self.types.red, self.types.ulpfec)
                _remember(self._fec, number, data)
                fec_packets.append(data)
                self.fec_sent += 1
            out += fec_packets
            if self._rtx_numbers is not None and fec_packets:
                copied = fec_packets if self._copy_all else fec_packets[-1:]
                out += [self._rtx_copy(fec, self._rtx_numbers()) for fec in copied]
        return out

    def _rtx_copy(self, fec: bytes, number: int) -> bytes:
        """RED packet `fec` (a FEC packet, or media) on the RTX stream (RFC 4588: its number
        first in the payload; the marker kept, as the receiver restores it from the copy)."""
        assert self.types.rtx_red is not None
        header = rtp_layout(fec).header_size
        return b"".join(
            (
                fec[:1],
                bytes((fec[1] & MARKER | self.types.rtx_red,)),
                (number & 0xFFFF).to_bytes(2, "big"),
                fec[4:8],
                self.rtx_ssrc.to_bytes(4, "big"),
                fec[12:header],
                fec[2:4],
                fec[header:],
            )
        )

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

    def on_sent(self, packet: bytes | bytearray, transport: int) -> None:
        """`packet` left under transport-wide number `transport`: kept where it is an in-order
        codec's FEC packet or an RTX copy of one (`on_feedback`)."""
        if self.holes is None:
            return
        ssrc = int.from_bytes(packet[8:12], "big")
        if ssrc == self.media_ssrc:  # a FEC packet's wire number is one `_fec` keeps
            wire = int.from_bytes(packet[2:4], "big")
        elif ssrc == self.rtx_ssrc and packet[1] & 0x7F == self.types.rtx_red:
            header = rtp_layout(packet).header_size  # the copy names its original
            wire = int.from_bytes(packet[header : header + 2], "big")
        else:
            return
        if wire in self._fec:
            self.holes.sent(transport, wire)

    def on_feedback(self, reports: Sequence[PacketFeedback]) -> list[bytes]:
        """Transport feedback: the FEC packets to send again (with copies, as `nack`) that it
        shows lost with every copy of theirs."""
        if self.holes is None:
            return []
        heard = ((r.sequence, r.arrival is not None) for r in reports)
        return self.nack(self.holes.feedback(heard))[1]

    def retransmissions(self, packet: bytes) -> list[bytes]:
        """`retransmission(packet)`, and where the path is lossy enough to be protected and
        RTX was negotiated, a copy of it on the RTX stream under a number of its own: a lost
        retransmission costs its frame (and, for H.264, every frame after it) another NACK
        round trip, which the browser asks for only after its retry interval (in the lab at
        2 % loss, a 183 ms freeze); the copy costs as many bytes as the retransmissions, a
        few percent of the stream's at that loss."""
        wire = self.retransmission(packet)
        if wire is None:
            return []
        on_rtx = int.from_bytes(wire[8:12], "big") == self.rtx_ssrc
        if not self.factor or self._rtx_numbers is None or not on_rtx:
            return [wire]
        self.resend_copies += 1
        return [wire, wire[:2] + (self._rtx_numbers() & 0xFFFF).to_bytes(2, "big") + wire[4:]]

    def nack(self, wire_numbers: list[int]) -> tuple[list[int], list[bytes]]:
        """The browser NACKed `wire_numbers`: aiortc's numbers to retransmit, and the FEC
        packets to send again (each with an RTX copy, as `retransmissions`)."""
        media: list[int] = []
        fec: list[bytes] = []
        for number in wire_numbers:
            if number in self._fec:
                fec.append(self._fec[number])
                self.fec_resent += 1
                if self.factor and self._rtx_numbers is not None:
                    fec.append(self._rtx_copy(self._fec[number], self._rtx_numbers()))
                    self.resend_copies += 1
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
