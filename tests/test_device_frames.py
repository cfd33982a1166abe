"""Frames that stay where the renderer drew them (GPU memory for NVENC), through the host
emulation of the CUDA renderer: the same launch sequence, ring of buffers and DLPack export
as on a GPU, in host memory. On a GPU the frame is a CUDA frame instead of an nv12 one; that
part is in tests/test_cuda_gpu.py and tests/test_nvenc_gpu.py."""

from __future__ import annotations

import ctypes
import gc
import logging
from collections.abc import Iterator

import av
import numpy as np
import pytest

from render_server.backends.choice import Backends, choose_backends
from render_server.backends.gpu import CudaStatus, GpuDevice, NvencStatus
from render_server.config import Resolution, StreamConfig, default_bitrate
from render_server.encode.nvenc import create_nvenc_encoder
from render_server.encode.x264 import create_x264_encoder
from render_server.metrics import Metrics
from render_server.render import OrbitCamera, Scene, default_scene
from render_server.render.cuda import dlpack
from render_server.render.cuda import renderer as cuda_module
from render_server.render.cuda.emulation import EmulatedCudaRenderer, compiler
from render_server.render.cuda.launch import DEVICE_FRAMES
from render_server.render.cuda.pycuda_backend import share_primary_context
from render_server.stream.pictures import CudaPictures, nvenc_on_device
from render_server.worker.local import LocalWorker

from .test_encoder import psnr

WIDTH, HEIGHT = 320, 180


@pytest.fixture(scope="module")
def world() -> Scene:
    return default_scene()


@pytest.fixture
def renderer(world: Scene) -> Iterator[EmulatedCudaRenderer]:
    if compiler() is None:
        pytest.skip("no C++ compiler (g++ or $CXX) to build the kernels for the host")
    with EmulatedCudaRenderer(world, WIDTH, HEIGHT) as emulated:
        yield emulated


def camera_for(scene: Scene, yaw: float = 0.0) -> OrbitCamera:
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    camera.orbit(yaw, 0.0)
    return camera


def test_a_device_frame_equals_the_copied_frame(
    world: Scene, renderer: EmulatedCudaRenderer
) -> None:
    camera = camera_for(world, 0.3)
    copied = renderer.render_frame(camera, "nv12").to_ndarray().copy()
    frame = renderer.render_device_frame(camera)
    assert (frame.format.name, frame.width, frame.height) == ("nv12", WIDTH, HEIGHT)
    assert np.array_equal(frame.to_ndarray(), copied)
    assert renderer.last_timings["convert"] > 0  # converted on the "device"


def test_device_frames_are_not_copied_and_take_turns(
    world: Scene, renderer: EmulatedCudaRenderer
) -> None:
    frames, pictures = [], []
    for k in range(DEVICE_FRAMES):
        frame = renderer.render_device_frame(camera_for(world, 0.2 * k))
        frames.append(frame)
        pictures.append(frame.to_ndarray().copy())
    addresses = [f.planes[0].buffer_ptr for f in frames]
    assert len(set(addresses)) == DEVICE_FRAMES
    # the UV plane follows the Y plane in the same buffer, as NVENC reads a CUDA NV12 frame
    pitch = renderer.pipeline.device_pitch
    assert pitch % 256 == 0 and pitch >= WIDTH  # as FFmpeg's CUDA frames, which NVENC expects
    for frame, address in zip(frames, addresses, strict=True):
        assert frame.planes[0].line_size == frame.planes[1].line_size == pitch
        assert frame.planes[1].buffer_ptr == address + pitch * HEIGHT
    # the frames drawn before are intact until their buffer's turn comes round again
    for frame, picture in zip(frames, pictures, strict=True):
        assert np.array_equal(frame.to_ndarray(), picture)
    assert not np.array_equal(pictures[0], pictures[1])
    blank = renderer.blank_device_frame()
    assert blank.planes[0].buffer_ptr == addresses[0]  # the next one to be drawn
    again = renderer.render_device_frame(camera_for(world, 1.0))
    assert again.planes[0].buffer_ptr == addresses[0]


def test_exports_are_released_with_their_frames(
    world: Scene, renderer: EmulatedCudaRenderer
) -> None:
    gc.collect()
    before = dlpack.live_exports()
    for k in range(10):
        renderer.render_device_frame(camera_for(world, 0.1 * k))
    gc.collect()
    assert dlpack.live_exports() == before


def test_device_frames_encode_and_decode(world: Scene, renderer: EmulatedCudaRenderer) -> None:
    """An encoder reads the frames in place: what comes out matches the copied frames."""
    resolution = Resolution(WIDTH, HEIGHT)
    encoder = create_x264_encoder(resolution, 30.0, default_bitrate(resolution, 30.0) * 4)
    decoder = av.CodecContext.create("h264", "r")
    for k in range(6):
        camera = camera_for(world, 0.15 * k)
        expected = renderer.render_frame(camera, "nv12").to_ndarray().copy()
        packet = encoder.encode(renderer.render_device_frame(camera), pts=k * 3000)
        assert packet is not None
        (decoded,) = decoder.decode(av.Packet(bytes(packet)))
        got = decoded.reformat(format="nv12").to_ndarray()
        assert psnr(got, expected) >= 38.0, k


def test_cuda_pictures_on_the_device(world: Scene, renderer: EmulatedCudaRenderer) -> None:
    pictures = CudaPictures(renderer, "cuda")
    blank = pictures.blank()  # the buffer the next picture is drawn into
    assert (blank.width, blank.height) == (WIDTH, HEIGHT)
    camera = camera_for(world, 0.4)
    frame = pictures.picture(camera)
    assert frame.planes[0].buffer_ptr == blank.planes[0].buffer_ptr
    assert set(pictures.stage_ms) >= {"shade", "convert", "copy"}
    expected = renderer.render_frame(camera, "nv12").to_ndarray()
    assert np.array_equal(frame.to_ndarray(), expected)
    assert CudaPictures(renderer, "nv12").blank().format.name == "nv12"


def test_an_encoder_of_cuda_frames_must_open_on_one() -> None:
    resolution = Resolution(256, 256)
    with pytest.raises(ValueError, match="opens on a CUDA frame"):
        create_nvenc_encoder("h264", resolution, 30.0, 1_000_000, pix_fmt="cuda")
    host_frame = av.VideoFrame(256, 256, "nv12")
    with pytest.raises(ValueError, match="opens on a CUDA frame"):
        create_nvenc_encoder("h264", resolution, 30.0, 1_000_000, pix_fmt="cuda", prime=host_frame)


GPU = GpuDevice(0, "NVIDIA L4", "8.9", 23034)
CUDA_OK = CudaStatus(True, "1 device", "12.4", "550.54", (GPU,))
NVENC_OK = NvencStatus("h264", True, "opened")


def test_device_frames_are_chosen_with_the_cuda_renderer_and_nvenc() -> None:
    both = choose_backends("auto", "auto", CUDA_OK, NVENC_OK)
    assert both.device_frames and both.nvenc_input == "device" and both.pix_fmt == "cuda"
    host = choose_backends("auto", "auto", CUDA_OK, NVENC_OK, nvenc_input="host")
    assert not host.device_frames and host.pix_fmt == "nv12"
    # NVENC behind the CPU renderer reads its planar 4:2:0 as it is, with no conversion
    cpu = choose_backends("cpu", "auto", CUDA_OK, NVENC_OK)
    assert not cpu.device_frames and cpu.pix_fmt == "yuv420p"
    x264 = choose_backends("auto", "x264", CUDA_OK, NVENC_OK)
    assert not x264.device_frames and x264.pix_fmt == "yuv420p"


def test_a_pyav_without_device_frames_goes_through_host_memory(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(av.VideoFrame, "from_dlpack")
    chosen = choose_backends("auto", "auto", CUDA_OK, NVENC_OK)
    assert chosen.encoder == "nvenc" and not chosen.device_frames and chosen.pix_fmt == "nv12"
    assert any("PyAV" in getattr(r, "reason", "") for r in caplog.records)


def test_the_worker_falls_back_to_host_frames_where_nvenc_refuses_device_frames(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NVENC does not open on the device frames (here: no GPU, and the emulation's frames are
    host frames), so the worker goes through host memory from then on, and with NVENC not
    opening there either, this session encodes with libx264."""
    if compiler() is None:
        pytest.skip("no C++ compiler (g++ or $CXX) to build the kernels for the host")
    monkeypatch.setattr(cuda_module, "CudaRenderer", EmulatedCudaRenderer)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    backends = Backends("cuda", "nvenc", "test", "probed earlier", "auto", GPU, "device")
    stream = StreamConfig(resolution=Resolution(WIDTH, HEIGHT))
    worker = LocalWorker("w", default_scene(), stream, 1, Metrics(), (), backends)
    with caplog.at_level(logging.WARNING):
        pictures, encoder = worker.build_stages(stream.resolution, stream.fps, None)
    try:
        assert worker.backends.nvenc_input == "host" and worker.backends.pix_fmt == "nv12"
        assert encoder.codec_name == "libx264"
        assert isinstance(pictures, CudaPictures) and pictures.pix_fmt == "yuv420p"
        frame = pictures.picture(camera_for(default_scene()))
        assert encoder.encode(frame, pts=0) is not None
        stages = [getattr(r, "stage", None) for r in caplog.records]
        assert "nvenc_input" in stages
    finally:
        encoder.close()
        pictures.close()


def test_sharing_the_primary_context_says_why_not_without_a_driver() -> None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        reason = share_primary_context(0)
        assert reason is not None and "libcuda" in reason
    else:
        pytest.skip("a CUDA driver is here: tests/test_cuda_gpu.py checks the shared context")


def test_nvenc_on_device_closes_the_renderer_when_nvenc_refuses(world: Scene) -> None:
    if compiler() is None:
        pytest.skip("no C++ compiler (g++ or $CXX) to build the kernels for the host")
    renderer = EmulatedCudaRenderer(world, WIDTH, HEIGHT)
    with pytest.raises(ValueError, match="opens on a CUDA frame"):  # host frames, no NVENC
        nvenc_on_device(CudaPictures(renderer, "cuda"), 30.0, 1_000_000)
    with pytest.raises(RuntimeError, match="closed"):
        renderer.render(camera_for(world))


def test_after_device_frames_worked_a_refusal_costs_one_session_only(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """NVENC took device frames before (so a refusal now is a full GPU, not a path that cannot
    work): this session goes through host memory, as NV12 for NVENC rather than CUDA frames,
    and the worker keeps device frames for the next session."""
    if compiler() is None:
        pytest.skip("no C++ compiler (g++ or $CXX) to build the kernels for the host")
    monkeypatch.setattr(cuda_module, "CudaRenderer", EmulatedCudaRenderer)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    backends = Backends("cuda", "nvenc", "test", "probed earlier", "auto", GPU, "device")
    stream = StreamConfig(resolution=Resolution(WIDTH, HEIGHT))
    worker = LocalWorker("w", default_scene(), stream, 1, Metrics(), (), backends)
    worker._device_frames_opened = True
    with caplog.at_level(logging.WARNING):
        pictures, encoder = worker.build_stages(stream.resolution, stream.fps, None)
    try:
        assert worker.backends.device_frames  # the next session tries the GPU frames again
        assert encoder.codec_name == "libx264"  # NVENC on host frames did not open either
        fallbacks = [getattr(r, "reason", "") for r in caplog.records]
        assert any("NVENC on GPU frames" in reason for reason in fallbacks)
        assert any("NVENC" in reason and "GPU frames" not in reason for reason in fallbacks)
    finally:
        encoder.close()
        pictures.close()
