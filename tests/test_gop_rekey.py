"""No FEC where libwebrtc's H.264 receiver moves its GOP key (transport/gop_rekey.py): keyframes
told from H.264 payloads, FEC withheld for the frames whose FEC packets would take numbers
past the key + 10,000 and for SETTLE_S after the first frame to end past it, the key moved to
that frame's last number then, and a keyframe starting a new key; through FecPath, no FEC
packet of an H.264 stream ever lands in the window, with RTX copies the frames near the key
go twice instead (each copy restoring its packet, marker and all), and other codecs are not
touched."""

from __future__ import annotations

import itertools

from aiortc.rtp import RtpPacket

from render_server.transport.fec_path import FecPath, FecPayloadTypes, protection_for
from render_server.transport.gop_rekey import (
    REKEY_SPAN,
    SETTLE_S,
    RekeyGuard,
    starts_keyframe,
)

from .test_fec_path import unwrap_rtx

H264 = FecPayloadTypes(media=102, red=120, ulpfec=121, rtx_red=122, in_order=True)
VP8 = FecPayloadTypes(media=96, red=120, ulpfec=121, rtx_red=122, in_order=False)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_keyframes_are_told_from_h264_payloads() -> None:
    sps, pps, idr, p_slice = b"\x67\x42", b"\x68\xce", b"\x65\x88\x84", b"\x41\x9a"
    stap = b"\x18" + b"".join(len(n).to_bytes(2, "big") + n for n in (sps, pps))
    assert starts_keyframe(stap) and starts_keyframe(idr) and starts_keyframe(sps)
    assert starts_keyframe(b"\x7c\x85\x00")  # FU-A, start bit, IDR
    assert not starts_keyframe(b"\x7c\x05\x00")  # FU-A, a later fragment of the IDR
    assert not starts_keyframe(b"\x5c\x81\x00")  # FU-A of a P slice
    assert not starts_keyframe(p_slice) and not starts_keyframe(b"")
    assert not starts_keyframe(b"\x18\x00\x02\x41\x9a")  # STAP-A of a P slice
    assert not starts_keyframe(b"\x18\xff")  # a STAP-A cut short: no unit read past the end


def test_fec_is_withheld_around_the_rekey_and_the_key_moves_after_it() -> None:
    clock = Clock()
    guard = RekeyGuard(clock)
    assert guard.fec_may_follow(100, 4)  # no keyframe seen: nothing to guard against
    guard.frame_ended(60_000, keyframe=True)
    key = 60_000
    assert guard.key == key and guard.fec_may_follow(key, 4)
    near = (key + REKEY_SPAN - 3) & 0xFFFF  # the numbers wrap: 60,000 + 10,000 > 65,535
    guard.frame_ended(near, keyframe=False)
    assert guard.fec_may_follow(near, 3)  # its FEC ends at key + 10,000 exactly
    assert not guard.fec_may_follow(near, 4)  # one more would cross
    crossing = (key + REKEY_SPAN + 12) & 0xFFFF
    guard.frame_ended(crossing, keyframe=False)
    assert not guard.fec_may_follow(crossing, 1)
    clock.now += SETTLE_S / 2
    later = (crossing + 20) & 0xFFFF
    guard.frame_ended(later, keyframe=False)
    assert not guard.fec_may_follow(later, 1) and guard.key == key  # still settling
    clock.now += SETTLE_S
    later = (later + 20) & 0xFFFF
    guard.frame_ended(later, keyframe=False)
    assert guard.key == crossing and guard.fec_may_follow(later, 6)
    assert guard.withheld == 3
    guard.frame_ended(later + 40, keyframe=True)  # a keyframe: a new key, no crossing pending
    assert guard.key == later + 40


def frame(first: int, count: int, timestamp: int, key: bool) -> list[bytes]:
    payload = (b"\x65" if key else b"\x41") + b"\x00" * 900
    return [
        RtpPacket(payload_type=102, marker=int(i == count - 1),
                  sequence_number=(first + i) & 0xFFFF, timestamp=timestamp, ssrc=1111,
                  payload=payload).serialize()
        for i in range(count)
    ]  # fmt: skip


def run(types: FecPayloadTypes, frames: int) -> tuple[list[int], list[tuple[int, float]], Clock]:
    """`frames` frames of 12 packets at 30 fps through a FecPath at 2 % loss's protection, the
    first a keyframe: the wire numbers of the media's frame ends, and of each FEC packet with
    its time."""
    clock = Clock()
    path = FecPath(1111, 2222, types, (), clock=clock)
    path.set_protection(protection_for(0.02))
    ends: list[int] = []
    fec: list[tuple[int, float]] = []
    for n in range(frames):
        clock.now = n / 30
        for packet in frame(n * 12, 12, n * 3000, key=n == 0):
            for out in path.media(packet):
                number = int.from_bytes(out[2:4], "big")
                if int.from_bytes(out[8:12], "big") != 1111:
                    continue  # an RTX copy
                if out[12] == types.ulpfec:
                    fec.append((number, clock.now))
                elif out[1] & 0x80:
                    ends.append(number)
    return ends, fec, clock


def test_no_h264_fec_lands_where_the_receiver_moves_its_key() -> None:
    ends, fec, _ = run(H264, 1200)  # 14,400 media numbers: one rekey, 10,000 past the keyframe
    key = ends[0]
    crossing_index = next(i for i, e in enumerate(ends) if (e - key) & 0xFFFF > REKEY_SPAN)
    crossing = ends[crossing_index]
    crossed_at = crossing_index / 30
    past = [(n, t) for n, t in fec if (n - key) & 0xFFFF > REKEY_SPAN]
    # every FEC packet past key + 10,000 left after the settling, the key then the crossing
    assert past and all(t >= crossed_at + SETTLE_S for _, t in past)
    assert all((n - crossing) & 0xFFFF < REKEY_SPAN for n, _ in past)
    # a second of frames without FEC from the crossing on (SETTLE_S), and one before at most
    protected = {round(t * 30) for _, t in fec}
    assert 1200 - 32 <= len(protected) <= 1200 - 30


def test_other_codecs_get_their_fec_throughout() -> None:
    _, fec, _ = run(VP8, 1200)
    assert len({round(t * 30) for _, t in fec}) == 1200


def test_with_copies_the_frames_near_the_key_go_twice_instead_of_with_fec() -> None:
    clock = Clock()
    numbers = itertools.count(100)
    path = FecPath(1111, 2222, H264, (), lambda: next(numbers) & 0xFFFF, clock)
    path.set_protection(protection_for(0.02))
    doubled: list[int] = []  # frames sent with a copy of each packet
    for n in range(1500):
        clock.now = n / 30
        out = [p for packet in frame(n * 12, 12, n * 3000, key=n == 0) for p in path.media(packet)]
        media = [p for p in out if p[8:12] == (1111).to_bytes(4, "big") and p[12] == 102]
        fec = [p for p in out if p[8:12] == (1111).to_bytes(4, "big") and p[12] == 121]
        copies = [p for p in out if p[8:12] == (2222).to_bytes(4, "big")]
        assert len(media) == 12
        if len(copies) == 12 and not fec:
            doubled.append(n)
            # each copy restores its media packet bit for bit, the marker with it
            assert [unwrap_rtx(c, 1111, 120) for c in copies] == media
        else:
            assert fec and len(copies) == len(fec)  # FEC and a copy of each, as ever
    assert path.rekey is not None and path.rekey.key is not None
    # a window each 10,000 numbers (12 media and 5 FEC packets a frame: two in 1,500
    # frames), from 300 numbers before the key + 10,000 (12 numbers a frame there) to a
    # second after the crossing frame
    windows = [[doubled[0]]]
    for n in doubled[1:]:
        if n == windows[-1][-1] + 1:
            windows[-1].append(n)
        else:
            windows.append([n])
    assert len(windows) == 2
    assert all(30 + 300 // 12 - 2 <= len(w) <= 30 + 300 // 12 + 2 for w in windows), windows
    assert path.media_copies == 12 * len(doubled)
