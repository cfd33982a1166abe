"""Walking a compound RTCP datagram (plaintext, after SRTCP unprotect) packet by packet, for
the send path's readers that take their packets out before aiortc sees the rest. Pure."""

from __future__ import annotations

from collections.abc import Iterator
from struct import unpack_from
from typing import NamedTuple


class RtcpPiece(NamedTuple):
    first: int  # version, padding bit, count/FMT; -1 for a tail that does not parse
    packet_type: int
    body: bytes  # after the 4-byte common header
    raw: bytes  # the whole packet, as it stands in the datagram


def rtcp_pieces(data: bytes) -> Iterator[RtcpPiece]:
    """Each packet of `data`; where one does not parse (version, length), the rest of the
    datagram as one piece with `first` -1 (where the next packet starts is unknown)."""
    pos = 0
    while pos + 4 <= len(data):
        first, packet_type, length = unpack_from("!BBH", data, pos)
        end = pos + 4 + 4 * length
        if first >> 6 != 2 or end > len(data):
            break
        yield RtcpPiece(first, packet_type, data[pos + 4 : end], data[pos:end])
        pos = end
    if pos < len(data):
        yield RtcpPiece(-1, -1, b"", data[pos:])
