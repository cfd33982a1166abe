"""ULPFEC (RFC 5109) as libwebrtc generates it and as Chromium's receiver decodes it; sans-IO.

NACK repair costs a frame that lost a packet one round trip; a ULPFEC packet lets the receiver
rebuild a lost packet as soon as it arrives. This module (the generator), ulpfec_masks.py,
ulpfec_header.py and ulpfec_decoder.py are a port of libwebrtc's `UlpfecGenerator`,
`ForwardErrorCorrection` (encoder and decoder), `UlpfecHeaderWriter`/`UlpfecHeaderReader`
and the packet-mask tables (`fec_private_tables_random.cc`,
`fec_private_tables_bursty.cc`, `forward_error_correction_internal.cc`), checked against
webrtc-sdk/webrtc cd6792e5 (2024-10; the ULPFEC code has not changed in substance since 2023).

Wire format (RFC 5109 section 7.3, libwebrtc's `UlpfecHeaderWriter::FinalizeFecHeader`)::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |E|L|P|X|  CC   |M| PT recovery |            SN base            |  FEC header
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+  (10 bytes)
    |                          TS recovery                          |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |        length recovery        |       protection length       |  level-0 header
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+  (2 + 2 or 6 bytes)
    |     mask (16 bits)            | mask continued (32 bits, L=1) |
    +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
    |   XOR of the protected packets' bytes after their 12-byte fixed header ...

E = 0. P, X, CC, M, PT, TS are the XOR of the protected packets' fields; length recovery the XOR
of their lengths less 12. libwebrtc protects everything after the 12-byte fixed header, CSRCs
and header extensions included, and "protection length" is the longest of those (the whole
packet: one level, level 0 only). Mask bit i (MSB first) protects sequence number SN base + i;
L = 1 (48-bit mask) exactly when the protected sequence numbers span more than 16.

Masks: for N media and K FEC packets (K = `num_fec_packets(N, protection_factor)`, libwebrtc's
`NumFecPackets`: (N * factor + 128) >> 8, at least 1 where factor > 0) the rows are the table
entry (N, K) of the random (libwebrtc's default) or bursty table for N <= 12; from 13 media
packets on, libwebrtc generates an interleaved code at run time (media j in FEC row j mod K),
whatever the mask type. Where the media sequence numbers have gaps, the table's columns move to
the sequence numbers' positions (`InsertZerosInPacketMasks`); a batch spanning more than 48
sequence numbers gets no FEC.

The generator's batching is libwebrtc's (`UlpfecGenerator::AddPacketAndGenerateFec`): packets
are collected (at most 48; more are left unprotected) and FEC is made only when a packet with
the marker bit completes a frame, and then only once `max_fec_frames` frames are in, or earlier
where the overhead over the batch is close enough to the target (actual - target <
`MAX_EXCESS_OVERHEAD` Q8) and there are enough media packets (`MIN_MEDIA_PACKETS` when the
factor exceeds `HIGH_PROTECTION_THRESHOLD`, one more when frames average two packets or more).
With `max_fec_frames` 1 every frame gets its own FEC right after its last packet.

How the packets must go on the wire (what libwebrtc does, and what its receiver relies on):

* Media must carry its final sequence numbers before it is fed to the generator: SN base and
  mask name them as on the wire. libwebrtc feeds the generator in the pacer, after
  `AssignSequenceNumber`.
* Each FEC packet goes inside RED (block PT = ulpfec's PT; `FecPacket.to_rtp`) on the media
  SSRC, with the RTP header of the last protected media packet (CSRCs and header extensions
  kept; P and M cleared), the frame's timestamp, marker 0, and a sequence number of its own
  taken from the media's counter: the next ones after the frame (libwebrtc's pacer sends FEC
  behind the frame's last packet, same priority as video). FEC packets are never retransmitted
  (`set_allow_retransmission(false)`): a NACK for one goes unanswered.
* Every protected media packet must go out RED-wrapped as well (`red.wrap_red`): Chromium feeds
  its FEC decoder only with packets of the RED payload type; media sent with its own payload
  type is decoded but cannot take part in recovery.
* Header extensions the sender writes after FEC is computed must be zero in what the generator
  XORs: the receiver zeroes transport-cc (both versions), abs-send-time and toffset (and
  video-timing from its pacer-exit field) in each received packet before decoding
  (`RtpPacket::ZeroMutableExtensions`). Pass their negotiated ids as `zero_extension_ids`;
  otherwise those bytes come out wrong in a recovered packet.
* Retransmissions: Chromium maps an RTX payload type to RED's through `a=fmtp:<rtx> apt=<red>`
  (`red_rtx_payload_type`) as well as to the media's; a retransmitted packet (RTX unwrapped is
  marked recovered) is delivered but never given to the FEC decoder. libwebrtc retransmits the
  packet as it was sent, RED-wrapped, hence on the rtx PT whose apt is RED.

Receiver behaviour (`UlpfecReceiver`, `ForwardErrorCorrection::DecodeFec`, mirrored by
`UlpfecDecoder`): arrival order does not matter inside a window. FEC packets are kept sorted by
sequence number (the 48 newest), media and recovered packets likewise (the 192 newest); every
arriving packet triggers a pass over the stored FEC packets, each of which rebuilds a packet
when exactly one of those it protects is missing, again until nothing changes, so a rebuilt
packet helps rebuild the next. A FEC packet is dropped once nothing it protects is missing, or
once it is more than 0x3fff sequence numbers old; with 192 packets tracked, a packet more than
192 past the newest resets the decoder. (Where the stored packets span more than half the
sequence-number space, libwebrtc's sort order is undefined, and so are its results.)

The FEC packet's own sequence number is reported to the packet buffer and the NACK module as
received padding; a lost FEC packet is NACKed like a lost media packet. For VP8, VP9 and AV1
(first-packet-in-frame from the payload descriptor or the dependency descriptor) the hole does
not hold frames back. For H.264, PacketBuffer releases a delta frame only when no earlier
sequence number is missing (`missing_packets_`), so an unanswered NACK for a FEC packet stalls
H.264 until a keyframe: answer it (retransmit the RED packet) or keep ULPFEC off for H.264.
That is why libwebrtc's sender turns ULPFEC off with NACK for everything but VP8 and VP9
(`ShouldDisableRedAndUlpfec` in call/rtp_video_sender.cc); its receiver decodes ULPFEC whatever
the codec (`MaybeConstructUlpfecReceiver` only asks for a RED payload type).

Pure: no aiortc, no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from render_server.transport.red import (
    MARKER_BIT,
    PAYLOAD_TYPE_MASK,
    RTP_HEADER_SIZE,
    rtp_layout,
)
from render_server.transport.transport_feedback_sequence import is_newer
from render_server.transport.ulpfec_header import (
    L_BIT,
    SEQ_MASK,
    protected_value,
    zero_extensions,
)
from render_server.transport.ulpfec_masks import (
    MASK_SIZE_L_SET,
    MAX_MEDIA_PACKETS,
    MAX_PROTECTION_FACTOR,
    MaskType,
    num_fec_packets,
    packet_mask_size,
    packet_masks,
)

# UlpfecGenerator's constants
MAX_EXCESS_OVERHEAD: Final = 50  # kMaxExcessOverhead, Q8
MIN_MEDIA_PACKETS: Final = 4  # kMinMediaPackets
HIGH_PROTECTION_THRESHOLD: Final = 80  # kHighProtectionThreshold
MIN_MEDIA_PACKETS_ADAPTATION_THRESHOLD: Final = 2.0  # kMinMediaPacketsAdaptationThreshold


@dataclass(frozen=True, slots=True)
class FecParams:
    """libwebrtc's `FecProtectionParams`. `protection_factor` (`fec_rate`) is FEC packets per
    media packet in 1/256 (255: as many FEC as media packets; libwebrtc's `kMaxProtectionFactor`
    scale); `max_fec_frames`: the most frames one batch of FEC protects (0 and 1 alike: every
    frame its own)."""

    protection_factor: int = 0
    mask_type: MaskType = "random"
    max_fec_frames: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.protection_factor <= MAX_PROTECTION_FACTOR:
            raise ValueError(f"protection factor {self.protection_factor}: not in 0..255")
        if self.mask_type not in ("random", "bursty"):
            raise ValueError(f"mask type {self.mask_type!r}: not random or bursty")
        if self.max_fec_frames < 0:
            raise ValueError(f"max_fec_frames {self.max_fec_frames}")


@dataclass(frozen=True, slots=True)
class FecPacket:
    """One generated ULPFEC packet and what its RTP header must say.

    `payload` is the ULPFEC payload (FEC header, level-0 header, XOR'd data). On the wire it
    goes inside RED (block PT = ulpfec's) on the media SSRC `ssrc`, timestamp `timestamp` (that
    of the last protected media packet), marker 0, and a sequence number of the media's counter
    not used by media, normally the next one after the frame: the caller assigns it, as it must
    have assigned the media's before they were fed to the generator (`seq_num_base` and the mask
    name the protected packets' numbers as they go on the wire: `protected`). `header` is the
    RTP header of the last protected media packet (CSRCs and header extensions included), the
    template libwebrtc copies; `to_rtp` builds the packet from it."""

    payload: bytes
    ssrc: int
    timestamp: int
    seq_num_base: int
    protected: tuple[int, ...]
    header: bytes

    @property
    def marker(self) -> bool:
        """Always False: FEC packets never end a frame."""
        return False

    def red_payload(self, ulpfec_pt: int) -> bytes:
        """The RTP payload of the RED packet that carries this FEC packet."""
        if not 0 <= ulpfec_pt <= PAYLOAD_TYPE_MASK:
            raise ValueError(f"ULPFEC payload type {ulpfec_pt}: not in 0..127")
        return bytes((ulpfec_pt,)) + self.payload

    def to_rtp(
        self, sequence_number: int, red_pt: int, ulpfec_pt: int, *, keep_extensions: bool = True
    ) -> bytes:
        """The serialized RTP packet, as libwebrtc's `GetFecPackets` makes it: the last media
        packet's header with payload type `red_pt`, marker and padding bit cleared, sequence
        number `sequence_number`, then the RED header (block PT `ulpfec_pt`) and the payload.
        Its header extensions are kept (per-packet ones, such as the transport-wide sequence
        number, are the sender's to rewrite) unless `keep_extensions` is False."""
        if not 0 <= red_pt <= PAYLOAD_TYPE_MASK:
            raise ValueError(f"RED payload type {red_pt}: not in 0..127")
        header = self.header
        first = header[0] & ~0x20  # no padding
        if not keep_extensions:
            first &= ~0x10
            header = header[: RTP_HEADER_SIZE + 4 * (header[0] & 0x0F)]
        return b"".join(
            (
                bytes((first & 0xFF, red_pt)),
                (sequence_number & SEQ_MASK).to_bytes(2, "big"),
                header[4:],
                self.red_payload(ulpfec_pt),
            )
        )


@dataclass(slots=True)
class _Media:
    seq: int
    value: int  # protected_value of the packet, mutable extensions zeroed
    length: int  # bytes after the fixed header
    timestamp: int
    header: bytes


class UlpfecGenerator:
    """libwebrtc's `UlpfecGenerator`, sans-IO. Feed it each media packet of the stream, in
    sending order and already numbered (`add_media_packet`); after a packet with the marker bit
    take what it made (`fec_packets`, or just the payloads with `fec_payloads`).

    `params` apply to batches without a keyframe, `key_params` (default: `params`) to batches
    with one. `set_params` takes effect at the next packet, as in libwebrtc. `max_fec_packets`,
    where given, caps the FEC packets of one batch (not in libwebrtc: the masks are then the
    table's for the capped count, which the receiver decodes all the same).
    `zero_extension_ids`: the header-extension ids the receiver zeroes before decoding
    (transport-cc, abs-send-time, toffset where negotiated); their data is XOR'd as zeros.

    A packet that breaks the sequence (another SSRC, a sequence number not newer than the
    previous one's) starts a new batch, the old one unprotected; so does a batch whose sequence
    numbers span more than 48 (libwebrtc gives it no FEC). ValueError for bytes that are not an
    RTP packet; the generator is unchanged then."""

    def __init__(
        self,
        params: FecParams | None = None,
        key_params: FecParams | None = None,
        *,
        max_fec_packets: int | None = None,
        zero_extension_ids: Iterable[int] = (),
    ) -> None:
        if max_fec_packets is not None and max_fec_packets < 1:
            raise ValueError(f"max_fec_packets {max_fec_packets}: at least 1")
        self._max_fec_packets = max_fec_packets
        self._zero_ids = frozenset(zero_extension_ids)
        self._delta = FecParams()  # libwebrtc's start: no protection until params apply
        self._key = FecParams()
        self._pending: tuple[FecParams, FecParams] | None = None
        self._min_media_packets = 1
        self._media: list[_Media] = []
        self._ssrc = 0
        self._frames = 0
        self._keyframe = False
        self._generated: list[FecPacket] = []
        self.set_params(params if params is not None else FecParams(), key_params)

    def set_params(self, params: FecParams, key_params: FecParams | None = None) -> None:
        """New protection for delta and key frames, from the next packet added on."""
        self._pending = (params, key_params if key_params is not None else params)

    @property
    def params(self) -> FecParams:
        """The parameters that apply to the batch under way (`CurrentParams`)."""
        return self._key if self._keyframe else self._delta

    @property
    def pending_media_packets(self) -> int:
        """Media packets collected for the next FEC batch."""
        return len(self._media)

    def add_media_packet(self, packet: bytes, *, keyframe: bool = False) -> None:
        """One media packet as it goes on the wire (before RED wrapping: its own payload type;
        numbered), `keyframe` where it belongs to a keyframe. Where it ends a frame (marker
        bit) and the batch is due, the FEC packets are made: take them with `fec_packets`."""
        layout = rtp_layout(packet)  # ValueError before anything changes
        seq = int.from_bytes(packet[2:4], "big")
        ssrc = int.from_bytes(packet[8:12], "big")

        if self._pending is not None:
            self._delta, self._key = self._pending
            self._pending = None
            high = self.params.protection_factor > HIGH_PROTECTION_THRESHOLD
            self._min_media_packets = MIN_MEDIA_PACKETS if high else 1
        if self._media and (ssrc != self._ssrc or not is_newer(seq, self._media[-1].seq)):
            self._reset()
        if keyframe:
            self._keyframe = True
        complete_frame = bool(packet[1] & MARKER_BIT)
        if len(self._media) < MAX_MEDIA_PACKETS:
            self._ssrc = ssrc
            self._media.append(
                _Media(
                    seq=seq,
                    value=protected_value(zero_extensions(packet, self._zero_ids)),
                    length=len(packet) - RTP_HEADER_SIZE,
                    timestamp=int.from_bytes(packet[4:8], "big"),
                    header=bytes(packet[: layout.header_size]),
                )
            )
        if complete_frame:
            self._frames += 1
            params = self.params
            if self._frames >= params.max_fec_frames or (
                self._excess_overhead_below_max() and self._minimum_media_packets_reached()
            ):
                self._generated.extend(self._encode(params))
                self._reset()

    def fec_packets(self) -> list[FecPacket]:
        """The FEC packets made since the last call, oldest batch first; they are handed over
        once."""
        generated, self._generated = self._generated, []
        return generated

    def fec_payloads(self) -> list[bytes]:
        """`fec_packets`, just their ULPFEC payloads."""
        return [fec.payload for fec in self.fec_packets()]

    def _reset(self) -> None:
        self._media = []
        self._frames = 0
        self._keyframe = False

    def _excess_overhead_below_max(self) -> bool:
        factor = self.params.protection_factor
        overhead = (num_fec_packets(len(self._media), factor) << 8) // len(self._media)
        return overhead - factor < MAX_EXCESS_OVERHEAD

    def _minimum_media_packets_reached(self) -> bool:
        count = len(self._media)
        if count / self._frames < MIN_MEDIA_PACKETS_ADAPTATION_THRESHOLD:
            return count >= self._min_media_packets
        return count >= self._min_media_packets + 1

    def _encode(self, params: FecParams) -> list[FecPacket]:
        media = self._media
        count = num_fec_packets(len(media), params.protection_factor)
        if self._max_fec_packets is not None:
            count = min(count, self._max_fec_packets)
        if count == 0:
            return []
        base = media[0].seq
        columns = [(m.seq - base) & SEQ_MASK for m in media]
        span = columns[-1] + 1
        if span > MAX_MEDIA_PACKETS:
            return []  # "cannot protect media packets with a single block of FEC packets"
        mask_size = packet_mask_size(span)
        width = 8 * mask_size
        last = media[-1]
        out = []
        for row in packet_masks(len(media), count, params.mask_type):
            row_bits = int.from_bytes(row, "big")
            row_width = 8 * len(row)
            protected = [i for i in range(len(media)) if row_bits >> (row_width - 1 - i) & 1]
            mask = 0
            acc = 0
            protection_length = 0
            for i in protected:
                mask |= 1 << (width - 1 - columns[i])
                acc ^= media[i].value
                protection_length = max(protection_length, media[i].length)
            xored = acc.to_bytes(RTP_HEADER_SIZE + protection_length, "little")
            first = xored[0] & 0x3F | (L_BIT if mask_size == MASK_SIZE_L_SET else 0)
            payload = b"".join(
                (
                    bytes((first, xored[1])),
                    base.to_bytes(2, "big"),
                    xored[4:8],  # timestamp recovery
                    xored[2:4],  # length recovery
                    protection_length.to_bytes(2, "big"),
                    mask.to_bytes(mask_size, "big"),
                    xored[RTP_HEADER_SIZE:],
                )
            )
            out.append(
                FecPacket(
                    payload=payload,
                    ssrc=self._ssrc,
                    timestamp=last.timestamp,
                    seq_num_base=base,
                    protected=tuple(media[i].seq for i in protected),
                    header=last.header,
                )
            )
        return out
