"""The RTP payload format for AV1 (aomediacodec.github.io/av1-rtp-spec), both directions.

aiortc packs only VP8 and H.264. An encoder emits a temporal unit in the low-overhead bitstream
format: a temporal delimiter, then OBUs that each carry their length (`obu_size`). On the wire
each RTP payload is an aggregation header and OBU elements:

     0 1 2 3 4 5 6 7
    +-+-+-+-+-+-+-+-+
    |Z|Y| W |N|-|-|-|   Z: the first element continues an OBU of the previous packet
    +-+-+-+-+-+-+-+-+   Y: the last element continues in the next packet
    | OBU elements  |   W: the number of elements (0: any), N: a coded video sequence begins

Every element is preceded by its length (LEB128) except, when W is 1 to 3, the last one. As
libwebrtc's rtp_packetizer_av1.cc does, the sender drops temporal delimiters, tile lists and
padding, clears `obu_has_size_field` (the element length says it already), sets W whenever the
packet holds at most three elements, and fills each packet before it starts the next, splitting
an OBU across packets where it does not fit. The receiver puts the `obu_size` fields back and
a temporal delimiter in front, which is what a decoder takes as one packet.

Pure: no aiortc. `av1_codec` plugs it into aiortc's sender and receiver.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

OBU_SEQUENCE_HEADER: Final = 1
OBU_TEMPORAL_DELIMITER: Final = 2
OBU_FRAME_HEADER: Final = 3
OBU_FRAME: Final = 6
OBU_TILE_LIST: Final = 8
OBU_PADDING: Final = 15
NOT_SENT: Final = (OBU_TEMPORAL_DELIMITER, OBU_TILE_LIST, OBU_PADDING)
NOT_RECEIVED: Final = (OBU_TEMPORAL_DELIMITER, OBU_TILE_LIST)  # the spec: receivers ignore them

HAS_EXTENSION: Final = 0x04
HAS_SIZE: Final = 0x02
FORBIDDEN: Final = 0x80
TEMPORAL_DELIMITER: Final = bytes([OBU_TEMPORAL_DELIMITER << 3 | HAS_SIZE, 0])

Z_BIT: Final = 0x80
Y_BIT: Final = 0x40
N_BIT: Final = 0x08
W_SHIFT: Final = 4
MAX_W: Final = 3  # up to this many elements the last one goes without a length

LEB128_MAX_BYTES: Final = 8  # the AV1 specification's bound (4.10.5)
LEB128_MAX_VALUE: Final = (1 << 32) - 1
KEY_FRAME: Final = 0  # frame_type in an uncompressed frame header


# -- LEB128 and OBU headers ------------------------------------------------------------------


def leb128(value: int) -> bytes:
    """`value` as unsigned LEB128, in as few bytes as it takes."""
    if value < 0:
        raise ValueError(f"LEB128 of a negative number: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def leb128_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def read_leb128(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The LEB128 number at `pos` in `data`, and the position after it."""
    value = 0
    for i in range(LEB128_MAX_BYTES):
        if pos + i >= len(data):
            raise ValueError(f"truncated LEB128 at byte {pos}")
        byte = data[pos + i]
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value > LEB128_MAX_VALUE:
                raise ValueError(f"LEB128 at byte {pos} exceeds 2^32 - 1")
            return value, pos + i + 1
    raise ValueError(f"LEB128 at byte {pos} runs past {LEB128_MAX_BYTES} bytes")


def obu_type(header: int) -> int:
    return (header >> 3) & 0x0F


@dataclass(frozen=True, slots=True)
class Obu:
    """One OBU without its `obu_size` field: header byte(s) with `obu_has_size_field` cleared,
    then the payload, as it travels in OBU elements."""

    type: int
    data: bytes  # header, extension header if any, payload
    header_size: int  # 1, or 2 with an extension header

    @property
    def payload(self) -> bytes:
        return self.data[self.header_size :]


def parse_temporal_unit(temporal_unit: bytes) -> list[Obu]:
    """The OBUs of a temporal unit in the low-overhead bitstream format. Every OBU but the last
    must carry `obu_size`; the last without it runs to the end."""
    obus: list[Obu] = []
    view = memoryview(temporal_unit)
    pos = 0
    while pos < len(view):
        start = pos
        header = view[pos]
        if header & FORBIDDEN:
            raise ValueError(f"OBU at byte {start} has its forbidden bit set")
        header_size = 2 if header & HAS_EXTENSION else 1
        if pos + header_size > len(view):
            raise ValueError(f"OBU at byte {start} is truncated in its header")
        pos += header_size
        if header & HAS_SIZE:
            size, pos = read_leb128(view, pos)
            if pos + size > len(view):
                raise ValueError(
                    f"OBU at byte {start} declares {size} bytes, {len(view) - pos} remain"
                )
        else:
            size = len(view) - pos
        head = bytes([header & ~HAS_SIZE]) + bytes(view[start + 1 : start + header_size])
        obus.append(Obu(obu_type(header), head + bytes(view[pos : pos + size]), header_size))
        pos += size
    return obus


def starts_coded_video_sequence(obus: Sequence[Obu]) -> bool:
    """Whether a temporal unit holds a sequence header and its first frame is a key frame: the
    start of a coded video sequence, which a decoder can begin with (the N bit)."""
    sequence = next((o for o in obus if o.type == OBU_SEQUENCE_HEADER), None)
    frame = next((o for o in obus if o.type in (OBU_FRAME_HEADER, OBU_FRAME)), None)
    if sequence is None or frame is None or not sequence.payload or not frame.payload:
        return False
    if sequence.payload[0] & 0x08:  # reduced_still_picture_header: key frames only
        return True
    first = frame.payload[0]  # show_existing_frame (1 bit), frame_type (2 bits)
    return not first & 0x80 and (first >> 5) & 0x03 == KEY_FRAME


# -- packetizing -------------------------------------------------------------------------------


@dataclass(slots=True)
class _Packet:
    elements: list[bytes]
    starts_with_fragment: bool
    ends_with_fragment: bool = False

    def serialize(self, new_sequence: bool) -> bytes:
        count = len(self.elements)
        header = (Z_BIT if self.starts_with_fragment else 0) | (
            Y_BIT if self.ends_with_fragment else 0
        )
        if new_sequence:
            header |= N_BIT
        if count <= MAX_W:
            header |= count << W_SHIFT
            sized, last = self.elements[:-1], [self.elements[-1]]
        else:
            sized, last = self.elements, []
        return bytes([header]) + b"".join([leb128(len(e)) + e for e in sized] + last)


def _largest_fit(packet: _Packet, budget: int, wanted: int) -> int:
    """The most bytes (at most `wanted`) of one more element that still fit `packet` in
    `budget`. The elements already there all need their length then; the new one too unless
    it is at most the `MAX_W`th."""
    room = budget - sum(len(e) + leb128_size(len(e)) for e in packet.elements)
    if len(packet.elements) + 1 <= MAX_W:
        return max(0, min(wanted, room))
    fit = min(wanted, room - 1)
    while fit > 0 and fit + leb128_size(fit) > room:
        fit -= 1
    return max(0, fit)


def packetize_av1(temporal_unit: bytes, max_payload: int = 1200) -> list[bytes]:
    """RTP payloads, at most `max_payload` bytes each, for one temporal unit. Empty when it
    holds nothing to send (a temporal delimiter alone)."""
    if max_payload < 2:
        raise ValueError(f"an AV1 RTP payload needs at least 2 bytes, not {max_payload}")
    obus = [o for o in parse_temporal_unit(temporal_unit) if o.type not in NOT_SENT]
    budget = max_payload - 1  # after the aggregation header
    packets = [_Packet([], starts_with_fragment=False)]
    for obu in obus:
        data, offset = obu.data, 0
        while offset < len(data):
            packet = packets[-1]
            fit = _largest_fit(packet, budget, len(data) - offset)
            if fit > 0:
                packet.elements.append(data[offset : offset + fit])
                offset += fit
            if offset < len(data):  # the rest goes on in the next packet
                if not packet.elements:
                    raise AssertionError("an empty packet has room for a byte")
                packet.ends_with_fragment = fit > 0
                packets.append(_Packet([], starts_with_fragment=fit > 0))
    if not packets[0].elements:
        return []
    new_sequence = starts_coded_video_sequence(obus)
    return [p.serialize(new_sequence and i == 0) for i, p in enumerate(packets)]


# -- depacketizing -----------------------------------------------------------------------------


def _elements(payload: bytes, index: int) -> list[bytes]:
    """The OBU elements of one RTP payload (after its aggregation header)."""
    count = (payload[0] >> W_SHIFT) & 0x03
    if len(payload) == 1 and count != 1:
        raise ValueError(f"payload {index} has an aggregation header and no OBU element")
    elements: list[bytes] = []
    pos = 1
    while pos < len(payload) or len(elements) + 1 == count:
        if len(elements) + 1 == count:  # W's last element: no length, the rest of the payload
            elements.append(payload[pos:])
            return elements
        size, pos = read_leb128(payload, pos)
        if pos + size > len(payload):
            raise ValueError(
                f"payload {index}: OBU element {len(elements) + 1} declares {size} bytes, "
                f"{len(payload) - pos} remain"
            )
        elements.append(payload[pos : pos + size])
        pos += size
    if count:
        raise ValueError(f"payload {index} has {len(elements)} OBU elements, W says {count}")
    return elements


def _with_size(obu: bytes) -> bytes:
    """An OBU as it travels (`obu_size` absent, or present and checked) → with `obu_size`."""
    if not obu:
        raise ValueError("an empty OBU")
    header = obu[0]
    if header & FORBIDDEN:
        raise ValueError("an OBU with its forbidden bit set")
    header_size = 2 if header & HAS_EXTENSION else 1
    if len(obu) < header_size:
        raise ValueError("an OBU truncated in its extension header")
    pos = header_size
    if header & HAS_SIZE:
        size, pos = read_leb128(obu, pos)
        if size != len(obu) - pos:
            raise ValueError(f"an OBU declares {size} bytes and has {len(obu) - pos}")
    payload = obu[pos:]
    return bytes([header | HAS_SIZE]) + obu[1:header_size] + leb128(len(payload)) + payload


def depacketize_av1(payloads: Sequence[bytes]) -> bytes:
    """One temporal unit, as a decoder takes it, from the RTP payloads of one frame in order:
    a temporal delimiter, then every OBU with its `obu_size`. ValueError when they do not make
    one (from the network: anything goes)."""
    if not payloads:
        raise ValueError("no AV1 RTP payload")
    obus: list[bytearray] = []
    continues = False  # the previous payload's Y: this one's first element continues an OBU
    for index, payload in enumerate(payloads):
        if not payload:
            raise ValueError(f"payload {index} is empty")
        header = payload[0]
        if header & N_BIT and header & Z_BIT:
            raise ValueError(f"payload {index} begins a coded video sequence with a fragment")
        if bool(header & Z_BIT) != continues:
            raise ValueError(
                f"payload {index} starts a new OBU but the previous one is unfinished (Y set)"
                if continues
                else f"payload {index} continues an OBU (Z set) that no payload began"
            )
        for i, element in enumerate(_elements(payload, index)):
            if i == 0 and continues:
                obus[-1] += element
            else:
                obus.append(bytearray(element))
        continues = bool(header & Y_BIT)
    if continues:
        raise ValueError("the last payload leaves its OBU unfinished (Y set)")
    parts = [TEMPORAL_DELIMITER]
    for obu in obus:
        if obu and obu_type(obu[0]) in NOT_RECEIVED:
            continue
        parts.append(_with_size(bytes(obu)))
    return b"".join(parts)


def av1_payload_starts_keyframe(payload: bytes) -> bool:
    """Whether an RTP payload is the first of a new coded video sequence (N set, and Z clear as
    the spec requires), without depacketizing it."""
    return bool(payload) and payload[0] & (N_BIT | Z_BIT) == N_BIT
