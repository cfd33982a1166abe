"""The header extensions a session's sender writes beyond aiortc's own: playout delay and the
transport-wide sequence number.

aiortc's `HeaderExtensionsMap` writes mid, abs-send-time and a few others; it never writes
playout delay (unknown to it) nor a transport-wide sequence number (it has no use for one). A
sender given this map writes both where they were negotiated. The transport-wide number is
written as a placeholder in the first slot of the extension block, at a fixed offset of the
serialized packet, so that the send path (`send_path`) can number packets in the order they
actually leave, after pacing, retransmissions included, as transport-cc requires.

Checked against aiortc 1.16: `HeaderExtensionsMap.set`'s signature and one-byte-header
packing (`pack_header_extensions` chooses it for ids up to 14 and values up to 16 bytes).
"""

from __future__ import annotations

from struct import Struct, pack
from typing import Final, cast

from aiortc.rtcrtpparameters import RTCRtpParameters
from aiortc.rtp import (
    HeaderExtensions,
    HeaderExtensionsMap,
    pack_header_extensions,
    unpack_header_extensions,
)

PLAYOUT_DELAY_URI: Final = "http://www.webrtc.org/experiments/rtp-hdrext/playout-delay"
TRANSPORT_CC_URI: Final = (
    "http://www.ietf.org/id/draft-holmer-rmcat-transport-wide-cc-extensions-01"
)
# where the transport-wide number's first byte sits in a packet with no CSRC: 12 bytes of RTP
# header, the 4-byte extension header (0xBEDE, length), then the element's id/length byte
TRANSPORT_CC_OFFSET: Final = 17
ONE_BYTE_PROFILE: Final = b"\xbe\xde"
_BLOCK_HEADER: Final = Struct("!HH")  # a header extension block's profile and length in words


class SenderExtensionsMap(HeaderExtensionsMap):
    """aiortc's map, plus playout delay (`playout_delay`: min, max in 10 ms units) and a
    transport-wide sequence number placeholder (`transport_cc`) where negotiated."""

    def __init__(
        self, playout_delay: tuple[int, int] | None = None, transport_cc: bool = False
    ) -> None:
        super().__init__()
        self._playout_delay_id: int | None = None
        self._transport_cc_id: int | None = None
        self._transport_cc = transport_cc
        self._delay: bytes | None = None
        if playout_delay is not None:
            low, high = playout_delay  # 12 bits each: min then max
            self._delay = pack("!I", (low & 0xFFF) << 12 | (high & 0xFFF))[1:]

    @property
    def transport_cc_id(self) -> int | None:
        """The negotiated id of the transport-wide number this map writes, None where not."""
        return self._transport_cc_id if self._transport_cc else None

    def configure(self, parameters: RTCRtpParameters) -> None:
        super().configure(parameters)
        ids = {e.uri: e.id for e in parameters.headerExtensions}
        self._playout_delay_id = ids.get(PLAYOUT_DELAY_URI)
        transport_cc_id = ids.get(TRANSPORT_CC_URI)
        # the send path finds the placeholder at a fixed offset: one-byte header ids only
        self._transport_cc_id = transport_cc_id if transport_cc_id in range(1, 15) else None

    def set(self, values: HeaderExtensions) -> tuple[int, bytes]:
        extra: list[tuple[int, bytes]] = []
        if self.transport_cc_id is not None:
            extra.append((self.transport_cc_id, b"\x00\x00"))  # first: at TRANSPORT_CC_OFFSET
        if self._playout_delay_id is not None and self._delay is not None:
            extra.append((self._playout_delay_id, self._delay))
        if not extra:
            return super().set(values)
        profile, data = super().set(values)
        own = list(unpack_header_extensions(profile, data)) if data else []
        return pack_header_extensions(extra[:1] + own + extra[1:])


def write_transport_sequence(packet: bytearray, extension_id: int, sequence: int) -> bool:
    """Write `sequence` (16 bits) into the placeholder `SenderExtensionsMap` left in the
    serialized RTP `packet`; False (nothing written) where the packet has none."""
    if (
        len(packet) < TRANSPORT_CC_OFFSET + 2
        or packet[0] & 0x1F != 0x10  # extension bit set, no CSRC
        or packet[12:14] != ONE_BYTE_PROFILE
        or packet[16] != (extension_id << 4 | 1)  # id, length 2 (stored minus one)
    ):
        return False
    packet[TRANSPORT_CC_OFFSET] = sequence >> 8 & 0xFF
    packet[TRANSPORT_CC_OFFSET + 1] = sequence & 0xFF
    return True


def read_transport_sequence(packet: bytes | memoryview, extension_id: int) -> int | None:
    """The transport-wide number (16 bits) a serialized RTP `packet` carries in its header
    extension element `extension_id` (one-byte or two-byte headers, aiortc's parser); None
    where it has none, or the block is cut short. A view of a larger buffer is read in place."""
    start = 12 + 4 * (packet[0] & 0x0F)
    if not packet[0] & 0x10 or len(packet) < start + 4:
        return None
    profile, words = _BLOCK_HEADER.unpack_from(packet, start)
    try:
        # aiortc indexes and slices the block only, which a view does in place
        block = cast(bytes, packet[start + 4 : start + 4 + 4 * words])
        elements = unpack_header_extensions(profile, block)
    except ValueError:  # an element runs past the block (or the packet)
        return None
    for element, value in elements:
        if element == extension_id:
            return int.from_bytes(value, "big") if len(value) == 2 else None
    return None


def send_time_extension_ids(extensions: HeaderExtensionsMap) -> tuple[int, ...]:
    """The ids of the header extensions written as a packet is sent (the transport-wide
    number, abs-send-time), which a receiver zeroes before it decodes FEC (aiortc's private
    `_HeaderExtensionsMap__ids`)."""
    ids = getattr(extensions, "_HeaderExtensionsMap__ids", None)
    found = (getattr(extensions, "transport_cc_id", None), getattr(ids, "abs_send_time", None))
    return tuple(i for i in found if i is not None)
