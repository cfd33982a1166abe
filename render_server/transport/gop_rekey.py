"""Keep FEC away from the moment libwebrtc's H.264 receiver re-keys its group of pictures.

An H.264 stream carries no frame ids, so libwebrtc (`RtpSeqNumOnlyRefFinder`) chains its
frames by sequence number from the last keyframe's last number, its GOP key, and counts
ULPFEC packets as "padding" that keeps the chain continuous. Every 10,000 numbers past the key
it moves the key to the number it is handling then (`UpdateLastPictureIdWithPadding`, "to
prevent [frames appearing older than their keyframe] we advance the picture id of the
keyframe every so often"). When that number is a FEC packet's, and a frame before it is
still waiting for a lost packet (ULPFEC packets are counted before they rebuild anything),
that frame then finds no GOP before it and is dropped, and every later frame waits for it:
the picture stands still until the browser gives up after 3 s and asks for a keyframe. In the
lab at 2 % loss this came about once every two or three 30 s runs, 10,045 media packets after
the keyframe each time (tests/link_emulator.py's trace).

So around that number no FEC goes out: the first frame to end past it (the crossing frame)
makes the receiver move its key to that frame's last number once the frame is whole, and
from `NEAR` numbers before the key + 10,000 until `SETTLE_S` after the crossing frame
(time for its lost packets, and its elders', to come back) frames are sent without FEC
(`near`); the caller protects them otherwise: fec_path sends each of their packets twice,
the copy on the RTX stream, which the receiver restores as media, not as padding. A frame
that started before and whose FEC would pass the key + 10,000 goes without it
(`fec_may_follow`). A keyframe starts a new key. Pure: numbers and times in, decisions out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

REKEY_SPAN: Final = 10_000  # libwebrtc's GOP key moves when a number is this far past it
SETTLE_S: Final = 1.0  # after the crossing frame: its NACKs and retransmissions, with margin
NEAR: Final = 300  # numbers before the key + REKEY_SPAN from which frames start without FEC
IDR: Final = 5  # NAL unit types: an IDR slice, an SPS
SPS: Final = 7
STAP_A: Final = 24
FU_A: Final = 28


def starts_keyframe(payload: bytes) -> bool:
    """Whether an H.264 RTP payload (RFC 6184) carries an IDR slice's start or an SPS: a
    single NAL unit, the units of a STAP-A, or the first fragment of a FU-A."""
    if not payload:
        return False
    kind = payload[0] & 0x1F
    if kind == FU_A:
        return len(payload) > 1 and bool(payload[1] & 0x80) and payload[1] & 0x1F in (IDR, SPS)
    if kind == STAP_A:
        at = 1
        while at + 2 < len(payload):
            size = int.from_bytes(payload[at : at + 2], "big")
            if payload[at + 2] & 0x1F in (IDR, SPS):
                return True
            at += 2 + size
        return False
    return kind in (IDR, SPS)


class RekeyGuard:
    """Whether a frame's FEC packets may follow it (see the module's docstring)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.key: int | None = None  # the receiver's GOP key, as far as the sender can tell
        self._crossing: tuple[int, float] | None = None  # the crossing frame: last number, when
        self.withheld = 0  # frames that went without their FEC

    def frame_ended(self, last: int, keyframe: bool) -> None:
        """A frame whose last packet has wire number `last` went out."""
        now = self._clock()
        if keyframe:
            self.key, self._crossing = last, None
        elif self._crossing is not None:
            if now - self._crossing[1] >= SETTLE_S:
                self.key, self._crossing = self._crossing[0], None
        elif self.key is not None and _ahead(self.key, last) > REKEY_SPAN:
            self._crossing = (last, now)

    def near(self, number: int) -> bool:
        """Whether a frame starting at wire number `number` should go without FEC."""
        if self.key is None:
            return False
        return self._crossing is not None or _ahead(self.key, number) > REKEY_SPAN - NEAR

    def fec_may_follow(self, last: int, count: int) -> bool:
        """Whether `count` FEC packets may take the numbers after `last` (after
        `frame_ended` for that frame)."""
        if self.key is None:
            return True
        if self._crossing is not None or _ahead(self.key, last + count) > REKEY_SPAN:
            self.withheld += 1
            return False
        return True


def _ahead(base: int, number: int) -> int:
    return (number - base) & 0xFFFF
