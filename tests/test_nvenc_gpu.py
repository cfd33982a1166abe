"""NVENC on a GPU that has it. Skipped, with the probe's reason, everywhere else (no GPU, or a
GPU without NVENC such as the H200): these tests never run libx264 while claiming NVENC."""

from __future__ import annotations

import av
import numpy as np
import pytest

from render_server.backends.gpu import probe_cuda, probe_nvenc
from render_server.config import Resolution, default_bitrate
from render_server.encode.h264_bitstream import is_self_contained_idr
from render_server.encode.nvenc import create_nvenc_encoder

from .test_encoder import psnr, synthetic_frame

pytestmark = pytest.mark.gpu

RES = Resolution(1280, 720)


@pytest.fixture(scope="module")
def nvenc_ready() -> None:
    status = probe_nvenc("h264", probe_cuda().devices)
    if not status.available:
        pytest.skip(f"no NVENC here: {status.reason}")


def test_nvenc_packets_decode_and_keyframes_come_on_request(nvenc_ready: None) -> None:
    encoder = create_nvenc_encoder("h264", RES, 30.0, default_bitrate(RES, 30.0), pix_fmt="nv12")
    assert encoder.codec_name == "h264_nvenc"
    decoder = av.CodecContext.create("h264", "r")
    packets = []
    for i in range(10):
        rgb = synthetic_frame(shift=6 * i)
        frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
            format="nv12", dst_colorspace="itu709"
        )
        packet = encoder.encode(frame, pts=i * 3000, keyframe=(i in (0, 6)))
        assert packet is not None, "delay 0: one access unit per frame"
        packets.append(packet)
        (decoded,) = decoder.decode(av.Packet(bytes(packet)))
        back = decoded.reformat(format="rgb24", src_colorspace="itu709").to_ndarray()
        assert psnr(back, rgb) >= 35.0, i
    assert [p.is_keyframe for p in packets] == [i in (0, 6) for i in range(10)]
    assert is_self_contained_idr(bytes(packets[6]))  # SPS/PPS with the IDR: late joiners start


def test_nvenc_follows_a_bitrate_change(nvenc_ready: None) -> None:
    encoder = create_nvenc_encoder("h264", RES, 30.0, 8_000_000, pix_fmt="nv12")
    rng = np.random.default_rng(3)
    base = (rng.random((RES.height, RES.width, 3)) * 255).astype(np.uint8)
    frames = [
        av.VideoFrame.from_ndarray(np.roll(base, 8 * i, axis=1), format="rgb24").reformat(
            format="nv12"
        )
        for i in range(40)
    ]
    sizes = [encoder.encode(f, pts=i * 3000).size for i, f in enumerate(frames[:20])]
    encoder.set_bitrate(1_000_000)
    sizes += [encoder.encode(f, pts=(20 + i) * 3000).size for i, f in enumerate(frames[20:])]
    before, after = np.mean(sizes[5:20]), np.mean(sizes[22:])
    print(f"NVENC bytes per frame: {before:.0f} at 8 Mbit/s, {after:.0f} at 1 Mbit/s")
    assert after < 0.3 * before


def test_nvenc_reads_the_renderers_device_frames(nvenc_ready: None) -> None:
    """The zero-copy path: CUDA frames from the renderer's device memory straight into NVENC;
    what decodes matches the frames copied to the host."""
    from render_server.render import OrbitCamera, default_scene
    from render_server.render.cuda.renderer import CudaRenderer, CudaUnavailable

    scene = default_scene()
    try:
        renderer = CudaRenderer(scene, RES.width, RES.height)
    except CudaUnavailable as exc:
        pytest.skip(f"no CUDA renderer here: {exc}")
    with renderer:
        encoder = create_nvenc_encoder(
            "h264", RES, 30.0, 20_000_000, pix_fmt="cuda", prime=renderer.blank_device_frame()
        )
        assert encoder.pix_fmt == "cuda"
        decoder = av.CodecContext.create("h264", "r")
        camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
        for i in range(12):
            camera.orbit(0.05, 0.0)
            expected = renderer.render_frame(camera, "nv12").to_ndarray().copy()
            packet = encoder.encode(renderer.render_device_frame(camera), pts=i * 3000)
            assert packet is not None, "delay 0: one access unit per frame"
            assert packet.is_keyframe == (i == 0)  # the primed picture is never referenced
            (decoded,) = decoder.decode(av.Packet(bytes(packet)))
            db = psnr(decoded.reformat(format="nv12").to_ndarray(), expected)
            assert db >= 35.0, (i, db)
