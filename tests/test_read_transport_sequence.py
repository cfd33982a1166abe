"""A receiver reads the transport-wide number where aiortc's parser would find it: one-byte and
two-byte header extensions, with CSRCs, padding and other elements around it."""

from __future__ import annotations

import struct

import pytest
from aiortc.rtp import RtpPacket, pack_header_extensions

from render_server.transport.header_extensions import read_transport_sequence


def packet(elements: list[tuple[int, bytes]], csrc: int = 0, pad: int = 0) -> bytes:
    profile, data = pack_header_extensions(elements)
    rtp = RtpPacket(payload_type=96, sequence_number=3, timestamp=9, ssrc=77, payload=b"p" * 40)
    rtp.csrc = list(range(1, csrc + 1))
    head = bytes([0x90 | csrc, 96]) + struct.pack("!HII", 3, 9, 77)
    body = b"".join(struct.pack("!I", c) for c in rtp.csrc)
    # `pad` words of padding inside the block: its length counts them
    ext = struct.pack("!HH", profile, len(data) // 4 + pad) + data + b"\x00" * pad * 4
    return head + body + ext + rtp.payload


@pytest.mark.parametrize("csrc", [0, 2])
def test_one_byte_elements_before_and_after(csrc: int) -> None:
    data = packet([(1, b"0"), (3, b"\x00\x12\x34"), (5, b"\xab\xcd"), (9, b"xyz")], csrc)
    assert read_transport_sequence(data, 5) == 0xABCD
    assert read_transport_sequence(data, 7) is None  # not there
    assert read_transport_sequence(data, 3) is None  # there, but not two bytes long


def test_two_byte_elements() -> None:
    data = packet([(20, b"a" * 20), (15, b"\x01\x02")])  # ids or lengths that need two bytes
    assert data[12:14] == b"\x10\x00"
    assert read_transport_sequence(data, 15) == 0x0102


def test_padding_inside_the_block_and_packets_without_one() -> None:
    assert read_transport_sequence(packet([(5, b"\x00\x07")], pad=1), 5) == 7
    plain = RtpPacket(payload_type=96, sequence_number=1, ssrc=1, payload=b"x").serialize()
    assert read_transport_sequence(plain, 5) is None


def test_a_block_cut_short_is_not_read_past_its_end() -> None:
    data = packet([(5, b"\x00\x07")])
    assert read_transport_sequence(data[:17], 5) is None
    lying = bytearray(data)
    lying[14:16] = b"\x00\x40"  # claims 64 words: the packet ends first
    assert read_transport_sequence(bytes(lying[:18]), 5) is None
