"""The CUDA renderer on a real GPU. Skipped, with the reason, where pycuda or a device is
missing: these tests never fall back to the CPU or to the host emulation."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from render_server.encode.convert import rgb_to_yuv420
from render_server.render import CpuRenderer, OrbitCamera, Scene, default_scene
from render_server.render.builtin_scenes import sphere_field
from render_server.render.cuda.emulation import EmulatedCudaRenderer, compiler
from render_server.render.cuda.pycuda_backend import PyCudaBackend, share_primary_context
from render_server.render.cuda.renderer import CudaRenderer, CudaUnavailable

from .test_cuda_kernels import MIN_PSNR, cameras, double_sided_sheet, psnr, sheet_camera

pytestmark = pytest.mark.gpu

WIDTH, HEIGHT = 640, 360


@pytest.fixture(scope="module")
def world() -> Scene:
    return default_scene()


def gpu_renderer(scene: Scene, width: int, height: int) -> CudaRenderer:
    try:
        renderer = CudaRenderer(scene, width, height)
    except CudaUnavailable as exc:
        pytest.skip(f"no CUDA renderer here: {exc}")
    assert isinstance(renderer._backend, PyCudaBackend)  # the GPU, not a stand-in
    return renderer


@pytest.fixture(scope="module")
def cuda_renderer(world: Scene) -> Iterator[CudaRenderer]:
    renderer = gpu_renderer(world, WIDTH, HEIGHT)
    yield renderer
    renderer.close()


@pytest.mark.parametrize("view", ["framed", "close", "ground", "far"])
def test_cuda_frame_matches_the_cpu_frame(
    world: Scene, cuda_renderer: CudaRenderer, view: str
) -> None:
    camera = cameras(world)[view]
    frame = cuda_renderer.render(camera).copy()
    expected = CpuRenderer(world, WIDTH, HEIGHT).render(camera)
    db = psnr(frame, expected)
    print(f"{view}: PSNR {db:.1f} dB, timings {cuda_renderer.last_timings}")
    assert db >= MIN_PSNR, f"{view}: PSNR {db:.1f} dB"


def test_the_back_of_a_double_sided_surface(cuda_renderer: CudaRenderer) -> None:
    scene = double_sided_sheet()
    with gpu_renderer(scene, WIDTH, HEIGHT) as renderer:
        frame = renderer.render(sheet_camera()).copy()
    db = psnr(frame, CpuRenderer(scene, WIDTH, HEIGHT).render(sheet_camera()))
    assert db >= MIN_PSNR, f"back: PSNR {db:.1f} dB"


def test_cuda_frame_equals_the_emulated_frame(world: Scene, cuda_renderer: CudaRenderer) -> None:
    # the same sources without contraction, IEEE arithmetic on both sides: bit for bit
    if compiler() is None:
        pytest.skip("no C++ compiler for the host emulation")
    emulated = EmulatedCudaRenderer(world, WIDTH, HEIGHT)
    for view, camera in cameras(world).items():
        frame = cuda_renderer.render(camera).copy()
        differ = int(np.count_nonzero(np.any(frame != emulated.render(camera), axis=2)))
        assert differ == 0, f"{view}: {differ} pixels differ from the host emulation"


@pytest.mark.parametrize("pix_fmt", ["nv12", "yuv420p"])
def test_render_frame_equals_the_cpu_conversion(
    world: Scene, cuda_renderer: CudaRenderer, pix_fmt: str
) -> None:
    camera = cameras(world)["close"]
    rgb = cuda_renderer.render(camera).copy()
    frame = cuda_renderer.render_frame(camera, pix_fmt)
    assert (frame.format.name, frame.width, frame.height) == (pix_fmt, WIDTH, HEIGHT)
    planes = rgb_to_yuv420(rgb).to_ndarray()  # Y, U, V
    if pix_fmt == "nv12":
        chroma = planes[HEIGHT:].reshape(2, HEIGHT // 2, WIDTH // 2)
        uv = np.stack([chroma[0], chroma[1]], axis=-1).reshape(HEIGHT // 2, WIDTH)
        planes = np.concatenate([planes[:HEIGHT], uv])
    assert np.array_equal(frame.to_ndarray(), planes)


def test_a_million_triangles_at_4k(
    cuda_renderer: CudaRenderer, capsys: pytest.CaptureFixture[str]
) -> None:
    scene = sphere_field()
    assert scene.triangle_count > 1_000_000
    with gpu_renderer(scene, 3840, 2160) as renderer:
        camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
        for _ in range(5):  # warm up: the job buffers grow to the frame's needs
            renderer.render_frame(camera, "nv12")
        samples = []
        for _ in range(20):
            camera.orbit(0.01, 0.0)
            renderer.render_frame(camera, "nv12")
            samples.append(renderer.last_timings)
        frame = renderer.render(camera)
        assert frame.shape == (2160, 3840, 3)
        assert frame.std() > 10  # spheres, floor and sky, not a blank frame
    with capsys.disabled():
        print(f"\n1,003,522 triangles at 3840x2160, {len(samples)} frames, median ms per stage:")
        for stage in samples[0]:
            print(f"  {stage:9s} {np.median([s[stage] for s in samples]):8.3f}")


def test_a_device_frame_is_a_cuda_frame_with_the_copied_pixels(
    world: Scene, cuda_renderer: CudaRenderer
) -> None:
    """The frame NVENC would read in place: format cuda over our device buffer; PyAV's own
    download of it gives the same planes as the renderer's copy to pinned memory."""
    camera = cameras(world)["close"]
    copied = cuda_renderer.render_frame(camera, "nv12").to_ndarray().copy()
    frame = cuda_renderer.render_device_frame(camera)
    assert frame.format.name == "cuda"
    assert frame.sw_format is not None and frame.sw_format.name == "nv12"
    assert (frame.width, frame.height) == (WIDTH, HEIGHT)
    assert cuda_renderer.last_timings["copy"] < 0.05  # no device → host copy on this path
    assert np.array_equal(frame.to_ndarray(), copied)


def test_renderers_share_the_primary_context(world: Scene, cuda_renderer: CudaRenderer) -> None:
    import pycuda.driver as cuda

    with gpu_renderer(world, 320, 180) as other:
        ours, theirs = cuda_renderer._backend, other._backend
        assert isinstance(ours, PyCudaBackend) and isinstance(theirs, PyCudaBackend)
        with ours.active():
            current = cuda.Context.get_current()
            primary = cuda.Device(0).retain_primary_context()
            try:
                assert current.handle == primary.handle
            finally:
                primary.detach()
        assert ours._context.handle == theirs._context.handle
    # the flags FFmpeg's CUDA device insists on to share it: set before it was first active
    assert share_primary_context(0) is None
