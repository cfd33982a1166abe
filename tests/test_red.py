"""RED (RFC 2198) as libwebrtc sends video: one primary block in front of the payload, the RTP
header kept but for its payload type; the inverse; malformed input refused with ValueError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from render_server.transport.red import (
    RtpLayout,
    red_block_payload_type,
    rtp_layout,
    unwrap_red,
    wrap_red,
)

RED_PT, VP8_PT, ULPFEC_PT = 116, 96, 117


def rtp(
    payload: bytes,
    *,
    pt: int = VP8_PT,
    seq: int = 4660,
    ts: int = 0x01020304,
    ssrc: int = 0x0A0B0C0D,
    marker: bool = False,
    csrcs: tuple[int, ...] = (),
    extension: bytes | None = None,
    padding: int = 0,
) -> bytes:
    """A serialized RTP packet; `extension` is a one-byte-header block's elements (padded to
    a multiple of four here)."""
    first = 0x80 | len(csrcs) | (0x10 if extension is not None else 0) | (0x20 if padding else 0)
    out = bytes((first, (0x80 if marker else 0) | pt)) + struct.pack("!HII", seq, ts, ssrc)
    out += b"".join(struct.pack("!I", c) for c in csrcs)
    if extension is not None:
        body = extension + bytes(-len(extension) % 4)
        out += b"\xbe\xde" + struct.pack("!H", len(body) // 4) + body
    out += payload
    if padding:
        out += bytes(padding - 1) + bytes((padding,))
    return out


def test_wrap_puts_one_primary_block_header_before_the_payload() -> None:
    media = rtp(b"\xaa\xbb\xcc", marker=True)
    red = wrap_red(media, RED_PT)
    # 0x80 | 116 = 0xF4: marker kept, payload type RED's; then F=0 | block PT 96 (0x60)
    assert red == bytes.fromhex("80f4 1234 01020304 0a0b0c0d 60 aabbcc")
    assert unwrap_red(red) == media
    assert unwrap_red(red, RED_PT) == media
    assert red_block_payload_type(red) == VP8_PT


def test_csrcs_extensions_and_padding_are_kept() -> None:
    media = rtp(
        b"payload",
        csrcs=(1, 2),
        extension=b"\x10\xff\x22\x01\x02\x03",
        padding=4,
        marker=False,
    )
    layout = rtp_layout(media)
    assert layout == RtpLayout(header_size=12 + 8 + 4 + 8, payload_size=7, padding_size=4)
    red = wrap_red(media, RED_PT)
    assert len(red) == len(media) + 1
    assert red[: layout.header_size] == media[:1] + bytes((RED_PT,)) + media[2 : layout.header_size]
    assert red[layout.header_size] == VP8_PT
    assert red[layout.header_size + 1 :] == media[layout.header_size :]  # payload, then padding
    assert rtp_layout(red) == RtpLayout(layout.header_size, 8, 4)
    assert unwrap_red(red) == media


def test_fec_inside_red_unwraps_to_an_rtp_packet_with_the_ulpfec_payload_type() -> None:
    fec_payload = bytes(range(20))
    red = rtp(bytes((ULPFEC_PT,)) + fec_payload, pt=RED_PT)
    assert red_block_payload_type(red) == ULPFEC_PT
    inner = unwrap_red(red)
    assert inner[1] & 0x7F == ULPFEC_PT
    assert inner[12:] == fec_payload


@pytest.mark.parametrize(
    ("packet", "message"),
    [
        (b"\x80\x60\x00", "shorter than the fixed header"),
        (b"\x40" + bytes(11), "version"),
        (b"\x82" + bytes(11) + bytes(4), "CSRC"),
        (b"\x90" + bytes(11) + b"\xbe\xde", "extension"),
        (b"\x90" + bytes(11) + b"\xbe\xde\x00\x02" + bytes(4), "extension"),
        (b"\xa0" + bytes(11) + b"\x01\x00", "padding count is zero"),
        (b"\xa0" + bytes(11) + b"\x01\x05", "padding is longer"),
    ],
)
def test_malformed_rtp_is_refused(packet: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rtp_layout(packet)
    with pytest.raises(ValueError):
        wrap_red(packet, RED_PT)
    with pytest.raises(ValueError):
        unwrap_red(packet)


def test_red_payloads_libwebrtc_drops_are_refused() -> None:
    with pytest.raises(ValueError, match="empty payload"):
        unwrap_red(rtp(b"", pt=RED_PT))
    with pytest.raises(ValueError, match="empty payload"):
        unwrap_red(rtp(b"", pt=RED_PT, padding=3))  # padding only
    with pytest.raises(ValueError, match="more than one block"):
        unwrap_red(rtp(b"\xe0\x00\x00\x03" + b"\x60abc", pt=RED_PT))  # F = 1: redundant block
    with pytest.raises(ValueError, match="not RED's"):
        unwrap_red(wrap_red(rtp(b"x"), RED_PT), RED_PT + 1)
    with pytest.raises(ValueError, match="payload type"):
        wrap_red(rtp(b"x"), 128)


def test_a_payloadless_packet_wraps_and_unwraps() -> None:
    media = rtp(b"", padding=5)
    assert rtp_layout(media).payload_size == 0
    assert unwrap_red(wrap_red(media, RED_PT)) == media


rtp_packets = st.builds(
    rtp,
    st.binary(max_size=64),
    pt=st.integers(0, 127),
    seq=st.integers(0, 0xFFFF),
    ts=st.integers(0, 0xFFFFFFFF),
    ssrc=st.integers(0, 0xFFFFFFFF),
    marker=st.booleans(),
    csrcs=st.lists(st.integers(0, 0xFFFFFFFF), max_size=15).map(tuple),
    extension=st.none() | st.binary(max_size=20),
    padding=st.integers(0, 255),
)


@settings(max_examples=300, deadline=None)
@given(rtp_packets, st.integers(0, 127))
def test_wrap_then_unwrap_is_the_identity(packet: bytes, red_pt: int) -> None:
    red = wrap_red(packet, red_pt)
    assert red[1] & 0x7F == red_pt
    assert red[1] & 0x80 == packet[1] & 0x80
    assert red_block_payload_type(red) == packet[1] & 0x7F
    assert unwrap_red(red, red_pt) == packet


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80), st.integers(0, 127))
def test_arbitrary_bytes_raise_value_error_only(data: bytes, red_pt: int) -> None:
    for call in (
        lambda: rtp_layout(data),
        lambda: wrap_red(data, red_pt),
        lambda: unwrap_red(data),
        lambda: unwrap_red(data, red_pt),
        lambda: red_block_payload_type(data),
    ):
        try:
            call()
        except ValueError:
            pass


@settings(max_examples=300, deadline=None)
@given(rtp_packets, st.data())
def test_corrupted_red_packets_raise_value_error_only(packet: bytes, data: st.DataObject) -> None:
    red = bytearray(wrap_red(packet, RED_PT))
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(red) - 1))
        red[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(red)))
    for candidate in (bytes(red), bytes(red[:cut])):
        try:
            inner = unwrap_red(candidate)
        except ValueError:
            continue
        assert len(inner) == len(candidate) - 1
