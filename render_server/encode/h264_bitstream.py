"""Reading H.264 Annex B byte streams: just enough to tell what an access unit holds."""

from __future__ import annotations

import re

NAL_IDR = 5
NAL_SEI = 6
NAL_SPS = 7
NAL_PPS = 8

_START_CODE = re.compile(b"\x00\x00\x01")


def nal_unit_types(data: bytes) -> list[int]:
    """The nal_unit_type of each NAL unit in an Annex B access unit, in order."""
    return [data[m.end()] & 0x1F for m in _START_CODE.finditer(data) if m.end() < len(data)]


def is_self_contained_idr(data: bytes) -> bool:
    """True if a decoder can start here: SPS and PPS come before an IDR slice."""
    types = nal_unit_types(data)
    if NAL_IDR not in types:
        return False
    first_idr = types.index(NAL_IDR)
    return NAL_SPS in types[:first_idr] and NAL_PPS in types[:first_idr]
