"""Our send path packs H.264 as aiortc does (transport/h264_packer.py, encode/h264_bitstream.py)."""

from __future__ import annotations

import random
import subprocess
import sys
from fractions import Fraction
from typing import Any

import av
import numpy as np
import pytest
from aiortc.codecs import h264

from render_server.config import Resolution
from render_server.encode.convert import rgb_to_yuv420
from render_server.encode.h264_bitstream import SCAN_BLOCK, start_codes
from render_server.encode.x264 import create_x264_encoder
from render_server.transport.h264_packer import H264Packer

PAYLOAD_MAX = 1200  # what paced_negotiation holds aiortc's PACKET_MAX to


def _packet(data: bytes, pts: int = 3000) -> av.Packet[Any]:
    packet = av.Packet(data)
    packet.pts = pts
    packet.time_base = Fraction(1, 90_000)
    return packet


def _packed(packer: h264.H264Encoder, data: bytes) -> tuple[list[bytes], int] | type[Exception]:
    try:
        return packer.pack(_packet(data))
    except Exception as error:  # what aiortc raises, ours must too
        return type(error)


def _aiortcs(data: bytes) -> tuple[list[bytes], int] | type[Exception]:
    return _packed(h264.H264Encoder(), data)


def _ours(data: bytes) -> tuple[list[bytes], int] | type[Exception]:
    return _packed(H264Packer(), data)


@pytest.fixture(params=[1300, PAYLOAD_MAX], ids=["aiortc", "paced"])
def packet_max(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(h264, "PACKET_MAX", request.param)
    return int(request.param)


def _x264_frames(resolution: Resolution, bitrate: int, count: int) -> list[bytes]:
    encoder = create_x264_encoder(resolution, 30, bitrate)
    rng = np.random.default_rng(7)
    base = rng.integers(0, 256, (resolution.height, resolution.width, 3), dtype=np.uint8)
    units = []
    try:
        for i in range(count):
            picture = np.roll(base, 3 * i, axis=1)  # motion, and noise that costs bits
            picture[: 8 * i] = 255 - picture[: 8 * i]
            packet = encoder.encode(rgb_to_yuv420(picture), i * 3000, keyframe=i == 0)
            assert packet is not None
            units.append(bytes(packet))
    finally:
        encoder.close()
    return units


def test_x264s_frames_pack_as_aiortc_packs_them(packet_max: int) -> None:
    frames = _x264_frames(Resolution(640, 360), 8_000_000, 6)
    fragmented = 0
    for data in frames:
        ours, theirs = _ours(data), _aiortcs(data)
        assert ours == theirs
        assert isinstance(ours, tuple)
        assert all(isinstance(p, bytes) and len(p) <= packet_max for p in ours[0])
        fragmented += sum(p[0] & 0x1F == h264.NAL_TYPE_FU_A for p in ours[0])
    assert fragmented > 100, "frames this large are mostly FU-A fragments"
    # the keyframe's SPS, PPS and SEI travel in one STAP-A, as aiortc aggregates them
    assert _ours(frames[0])[0][0][0] & 0x1F == h264.NAL_TYPE_STAP_A  # type: ignore[index]


def _random_unit(rng: random.Random, packet_max: int) -> bytes:
    """An Annex B access unit with the cases aiortc's splitter and packers have: 3- and
    4-byte start codes, trailing zeros, bytes before the first start code, NAL units of
    every size around the packet limit, and now and then a start code at the very end."""
    out = bytearray(rng.choice([b"", b"\x09", b"\xff\x00"]))
    for _ in range(rng.randint(0, 12)):
        out += rng.choice([b"\x00\x00\x01", b"\x00\x00\x00\x01"])
        size = rng.choice(
            [1, 2, 5, rng.randint(1, 4 * packet_max), packet_max - 3, packet_max - 1,
             packet_max, packet_max + 1, 2 * packet_max - 1, 2 * packet_max + 5, 7 * packet_max]
        )  # fmt: skip
        body = bytearray(rng.randbytes(size))
        body[0] = body[0] & 0x7F or 0x65  # forbidden bit clear; never a 0 header byte
        for k in range(2, len(body)):  # emulation prevention: no start code inside
            if body[k] <= 3 and body[k - 1] == 0 and body[k - 2] == 0:
                body[k] = 0x80
        out += body
        out += b"\x00" * rng.choice([0, 0, 0, 1, 2])
    if rng.random() < 0.05:
        out += b"\x00\x00\x01"
    return bytes(out)


def test_random_access_units_pack_or_fail_as_aiortcs(packet_max: int) -> None:
    rng = random.Random(18)
    for _ in range(400):
        data = _random_unit(rng, packet_max)
        assert _ours(data) == _aiortcs(data), data[:64].hex()


def test_every_start_code_is_found_wherever_the_scan_blocks_fall() -> None:
    size = 3 * SCAN_BLOCK + 7
    for at in range(size - 2):
        data = bytearray(b"\xff" * size)
        data[at : at + 3] = b"\x00\x00\x01"
        assert start_codes(bytes(data)) == [at]
    zeros = bytearray(size)
    zeros[-1] = 1
    assert start_codes(bytes(zeros)) == [size - 3]  # the last three bytes
    assert start_codes(b"") == start_codes(b"\x00\x01") == start_codes(b"\x01\x00\x00") == []
    assert start_codes(b"\x00\x00\x00\x01\x00\x00\x01") == [1, 4]


def test_more_start_codes_than_kept_at_once_are_all_found() -> None:
    data = b"\x00\x00\x01\x65" * 1000
    assert start_codes(data) == list(range(0, 4000, 4))
    assert _ours(data) == _aiortcs(data)


def test_the_packer_keeps_aiortcs_encoder_for_pictures() -> None:
    packer = H264Packer()
    assert isinstance(packer, h264.H264Encoder)
    packer.target_bitrate = 2_000_000  # what aiortc sets on REMB
    assert packer.target_bitrate == 2_000_000


def test_a_workers_warm_up_readies_the_scan() -> None:
    """Compiled (or loaded from numba's cache) before the first session, not on its first frame:
    a fresh process, so no other test's call counts."""
    code = """
from render_server.backends.choice import Backends
from render_server.config import Resolution, StreamConfig
from render_server.metrics import Metrics
from render_server.render.builtin_scenes import default_scene
from render_server.encode.h264_bitstream import _start_codes
from render_server.worker.local import LocalWorker
stream = StreamConfig(resolution=Resolution(64, 64))
backends = Backends("cpu", "x264", "", "")
worker = LocalWorker("w", default_scene(), stream, 1, Metrics(), (), backends)
before = len(_start_codes.signatures)
worker.warm_up()
print(before, len(_start_codes.signatures))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "1"]
