"""The video codecs a worker can send, and which encoder makes each.

Browsers differ in what they decode: Chromium takes H.264, VP8, VP9 and AV1; Firefox as Debian
ships it offers no H.264 at all (only through the OpenH264 plug-in it downloads at run time);
Safari takes H.264 and, on newer Apple hardware, AV1. A worker therefore offers every codec it
has an encoder for, and each session sends the one its browser ranks first (`choose_codec`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Final

import av

# Every codec the project can send, in the order it ranks them when the browser ranks none:
# H.264 is decoded in hardware nearly everywhere and is the cheapest to encode (libx264
# ultrafast, NVENC); VP8 is what every WebRTC browser must decode; AV1 compresses best but
# costs the most to encode on a CPU and decodes in software on most machines.
CODECS: Final = ("H264", "VP8", "AV1")

# codec → the CPU encoder (an FFmpeg name) that makes it
CPU_ENCODERS: Final = {"H264": "libx264", "VP8": "libvpx", "AV1": "libsvtav1"}


@functools.cache
def _has_encoder(name: str) -> bool:
    try:
        codec = av.Codec(name, "w")
    except (av.error.FFmpegError, ValueError):  # PyAV raises either for an unknown codec
        return False
    return codec.is_encoder


def cpu_codecs() -> tuple[str, ...]:
    """The codecs this PyAV can encode on the CPU."""
    return tuple(codec for codec in CODECS if _has_encoder(CPU_ENCODERS[codec]))


def parse_codecs(text: str) -> tuple[str, ...]:
    """A comma-separated codec list (`--codecs H264,VP8`), checked and in canonical spelling;
    ValueError for an unknown name or an empty list."""
    names = [part.strip().upper() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in CODECS]
    if unknown:
        raise ValueError(f"unknown codec {unknown[0]!r}: one of {', '.join(CODECS)}")
    if not names:
        raise ValueError(f"no codec given: one or more of {', '.join(CODECS)}")
    return tuple(dict.fromkeys(names))


def sendable(wanted: Sequence[str] | None, available: Iterable[str]) -> tuple[str, ...]:
    """The codecs a worker offers: those asked for (None: all) that it has an encoder for, in
    the order asked (else CODECS' order)."""
    have = set(available)
    return tuple(codec for codec in (wanted or CODECS) if codec in have)


def choose_codec(offered: Sequence[str], sendable: Sequence[str]) -> str | None:
    """The codec to send: the first the browser offers (its order is its preference: the SDK
    puts the codecs it decodes in hardware first) that the worker can send; None if none."""
    have = set(sendable)
    return next((codec for codec in offered if codec in have), None)
