"""RED (RFC 2198) for video, as libwebrtc sends and receives it: one primary block, no redundancy.

Where an offer carries `red/90000` and `ulpfec/90000`, libwebrtc's receiver
(`RtpVideoStreamReceiver2::ReceivePacket`) hands every packet of the RED payload type to its
`UlpfecReceiver`, which takes the one-byte RED header off: media comes out as the RTP packet it
was, FEC goes to the decoder. libwebrtc's sender (`BuildRedPayload` in rtp_sender_video.cc,
`UlpfecGenerator::GetFecPackets`) writes exactly this:

     0 1 2 3 4 5 6 7
    +-+-+-+-+-+-+-+-+
    |F|  block PT   |   F = 0: the last (here the only) block; block PT: the media's (or
    +-+-+-+-+-+-+-+-+   ULPFEC's) payload type. The 4-byte header of a redundant block
                        (F = 1) is never sent for video, and the receiver drops such a packet.

The RTP header stays as it was (CSRCs and header extensions included) but for its payload type,
which becomes RED's; the RED header goes between the header and the payload. RTP padding stays
at the end of the packet with the P bit (libwebrtc's receiver copies "payload and padding data,
after the RED header"); libwebrtc itself never wraps a packet that has padding.

Only the receiver's media packets that arrive inside RED reach its FEC decoder: with ULPFEC on,
every protected media packet must go out wrapped.

Pure and sans-IO: serialized RTP packets in, serialized RTP packets out, ValueError for input
that is not an RTP packet libwebrtc would parse (`RtpPacket::ParseBuffer`'s rules).
"""

from __future__ import annotations

from typing import Final, NamedTuple

RTP_VERSION: Final = 2
RTP_HEADER_SIZE: Final = 12  # the fixed header, kRtpHeaderSize
RED_HEADER_SIZE: Final = 1  # kRedForFecHeaderLength
F_BIT: Final = 0x80
MARKER_BIT: Final = 0x80
PAYLOAD_TYPE_MASK: Final = 0x7F


class RtpLayout(NamedTuple):
    """Where the parts of a serialized RTP packet are: the header (fixed header, CSRCs, header
    extension block) is `packet[:header_size]`, the payload follows, `padding_size` bytes of
    padding (its last byte the count, P set) end the packet."""

    header_size: int
    payload_size: int
    padding_size: int


def rtp_layout(packet: bytes | bytearray) -> RtpLayout:
    """The layout of `packet`; ValueError where libwebrtc's parser would refuse it: shorter
    than its header, version not 2, a CSRC list or extension block past the end, padding with a
    zero count or longer than what follows the header."""
    size = len(packet)
    if size < RTP_HEADER_SIZE:
        raise ValueError(f"an RTP packet of {size} bytes: shorter than the fixed header")
    if packet[0] >> 6 != RTP_VERSION:
        raise ValueError(f"RTP version {packet[0] >> 6}, not 2")
    header_size = RTP_HEADER_SIZE + 4 * (packet[0] & 0x0F)
    if header_size > size:
        raise ValueError("the CSRC list runs past the end of the packet")
    if packet[0] & 0x10:
        if header_size + 4 > size:
            raise ValueError("the header extension runs past the end of the packet")
        length = 4 * int.from_bytes(packet[header_size + 2 : header_size + 4], "big")
        header_size += 4 + length
        if header_size > size:
            raise ValueError("the header extension runs past the end of the packet")
    padding_size = 0
    if packet[0] & 0x20 and header_size < size:
        padding_size = packet[-1]
        if padding_size == 0:
            raise ValueError("the P bit is set but the padding count is zero")
        if header_size + padding_size > size:
            raise ValueError("the padding is longer than what follows the header")
    return RtpLayout(header_size, size - header_size - padding_size, padding_size)


def _check_payload_type(payload_type: int, what: str) -> None:
    if not 0 <= payload_type <= PAYLOAD_TYPE_MASK:
        raise ValueError(f"{what} payload type {payload_type}: not in 0..127")


def wrap_red(packet: bytes, red_pt: int) -> bytes:
    """`packet` (a serialized RTP packet) as libwebrtc sends it inside RED: payload type
    `red_pt`, then the one-byte RED header (F = 0, block PT = the packet's own payload type)
    in front of the payload. Header fields, CSRCs, header extensions, marker and padding are
    kept. ValueError for a packet that does not parse or a payload type out of 0..127."""
    _check_payload_type(red_pt, "RED")
    header_size = rtp_layout(packet).header_size
    media_pt = packet[1] & PAYLOAD_TYPE_MASK
    return b"".join(
        (
            packet[:1],
            bytes((packet[1] & MARKER_BIT | red_pt, *packet[2:header_size], media_pt)),
            packet[header_size:],
        )
    )


def red_block_payload_type(packet: bytes) -> int:
    """The block PT of the RED packet `packet` (the payload type of what it carries: media, or
    ULPFEC), as libwebrtc's receiver reads it to tell FEC from media. ValueError as for
    `unwrap_red`."""
    header_size = _red_header_offset(packet)
    return packet[header_size] & PAYLOAD_TYPE_MASK


def unwrap_red(packet: bytes, red_pt: int | None = None) -> bytes:
    """The RTP packet that the RED packet `packet` carries, as libwebrtc's `UlpfecReceiver`
    rebuilds it: the RTP header with the block PT for payload type (marker kept), then the
    payload and padding that follow the RED header. For ULPFEC the result's payload is the
    ULPFEC payload (FEC header first). `red_pt`, where given, must be the packet's payload type.
    ValueError for a packet that does not parse, an empty RED payload, or more than one block
    (F = 1: libwebrtc drops those for video)."""
    if red_pt is not None:
        _check_payload_type(red_pt, "RED")
        if packet[1:2] and packet[1] & PAYLOAD_TYPE_MASK != red_pt:
            raise ValueError(f"payload type {packet[1] & PAYLOAD_TYPE_MASK}, not RED's {red_pt}")
    header_size = _red_header_offset(packet)
    block = packet[header_size]
    return b"".join(
        (
            packet[:1],
            bytes((packet[1] & MARKER_BIT | block & PAYLOAD_TYPE_MASK,)),
            packet[2:header_size],
            packet[header_size + RED_HEADER_SIZE :],
        )
    )


def _red_header_offset(packet: bytes) -> int:
    layout = rtp_layout(packet)
    if layout.payload_size < RED_HEADER_SIZE:
        raise ValueError("a RED packet without a RED header (empty payload)")
    if packet[layout.header_size] & F_BIT:
        raise ValueError("a RED packet of more than one block (F = 1): not used for video")
    return layout.header_size
