"""aiortc's H.264 RTP payloads (RFC 6184: single NAL units, STAP-A, FU-A), cut with one copy
per payload.

aiortc's `H264Encoder.pack` copies every NAL unit out of the access unit, then every FU-A
fragment out of the NAL, then joins the fragment to its two-byte header: three copies of a
4K frame's 50 kB before the packets are even serialized. The same cut here slices views of
the access unit and copies each payload once, as it is built. The payloads are byte for byte
aiortc's (`tests/test_h264_packetizer.py` holds them equal): the same start-code scan, the same
fragment sizes (larger first), the same STAP-A aggregation of up to nine small NAL units.

Checked against aiortc 1.16's `aiortc/codecs/h264.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

PACKET_MAX: Final = 1300
NAL_TYPE_FU_A: Final = 28
NAL_TYPE_STAP_A: Final = 24
STAP_A_AVAILABLE: Final = PACKET_MAX - 3  # the STAP-A's NAL header and a length field
FU_A_AVAILABLE: Final = PACKET_MAX - 2
START_CODE: Final = b"\x00\x00\x01"


def nal_units(buf: bytes) -> Iterator[memoryview]:
    """The NAL units of an Annex B access unit, as views of it (aiortc's `_split_bitstream`)."""
    view, find = memoryview(buf), buf.find
    i = find(START_CODE)
    while i != -1:
        start = i + 3
        i = find(START_CODE, start)
        if i == -1:
            yield view[start:]
            return
        yield view[start : i - 1] if buf[i - 1] == 0 else view[start:i]


def fu_a(nal: memoryview) -> list[bytes]:
    """One NAL unit too long for a packet, in fragments of near-equal size, larger first."""
    header = nal[0]
    payload_size = len(nal) - 1
    count = -(-payload_size // FU_A_AVAILABLE)
    larger, size = payload_size % count, payload_size // count
    indicator = header & 0xE0 | NAL_TYPE_FU_A
    kind = header & 0x1F
    middle = bytes([indicator, kind])
    fragments: list[bytes] = []
    offset = 1
    for index in range(count):
        length = size + 1 if index < larger else size
        if index == 0:
            prefix = bytes([indicator, kind | 0x80])
        elif index == count - 1:
            prefix = bytes([indicator, kind | 0x40])
        else:
            prefix = middle
        fragments.append(prefix + nal[offset : offset + length])
        offset += length
    return fragments


def packetize(access_unit: bytes) -> list[bytes]:
    """The RTP payloads of one Annex B access unit, as aiortc's `H264Encoder.pack` makes them."""
    payloads: list[bytes] = []
    units = nal_units(access_unit)
    nal = next(units, None)
    while nal is not None:
        if len(nal) > PACKET_MAX:
            payloads.extend(fu_a(nal))
            nal = next(units, None)
            continue
        # STAP-A: this unit and those after it while they fit (at most nine); one alone goes
        # as a single NAL unit packet
        first, header = nal, NAL_TYPE_STAP_A | nal[0] & 0xE0
        parts: list[bytes | memoryview] = []
        available = STAP_A_AVAILABLE
        candidate: memoryview | None = nal
        while candidate is not None and len(candidate) <= available and len(parts) < 18:
            header |= candidate[0] & 0x80
            nri = candidate[0] & 0x60
            if header & 0x60 < nri:
                header = header & 0x9F | nri
            available -= 2 + len(candidate)
            parts += (len(candidate).to_bytes(2, "big"), candidate)
            candidate = next(units, None)
        if not parts:  # aiortc's loop: a first unit that does not fit is passed over
            candidate = next(units, None)
        if len(parts) <= 2:
            payloads.append(bytes(first))
        else:
            payloads.append(bytes([header]) + b"".join(parts))
        nal = candidate
    return payloads
