"""The CPU renderer in bands of rows: the same bits as one pass over the whole frame, and the
band scheduler that hands bands to whichever thread is free."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from render_server.encode.convert import YuvConverter, rgb_to_yuv420
from render_server.render import CpuRenderer, Material, OrbitCamera, Scene
from render_server.render.bands import _band_pool, run_in_bands, split_rows
from render_server.render.cpu.prepare import prepare_scene, view_constants
from render_server.render.cpu.raster import PLANE_WIDTH, visibility
from render_server.render.cpu.shading import shade
from render_server.stream.pictures import CpuPictures
from tests import render_poses


def poses(scene: Scene) -> dict[str, OrbitCamera]:
    """The benchmark's poses, and one among the objects: near-plane and guard-band clipping."""
    inside = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    inside.target, inside.distance, inside.yaw, inside.pitch = (0.5, 0.3, 1.0), 0.05, 0.4, 0.1
    return {**render_poses.poses(scene), "inside": inside}


def whole_frame(
    scene: Scene, camera: OrbitCamera, width: int, height: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ids, depth and frame from one visibility pass and one shading pass over every row."""
    p = prepare_scene(scene)
    depth = np.empty((height, width), np.float32)
    ids = np.empty((height, width), np.int32)
    planes = np.zeros((scene.triangle_count, PLANE_WIDTH))
    row_lo, row_hi = np.empty(height, np.int32), np.empty(height, np.int32)
    frame = np.empty((height, width, 3), np.uint8)
    vp = camera.view_projection(width / height)
    visibility(p.positions, p.cull_back, vp, depth, ids, planes, row_lo, row_hi)
    view = view_constants(camera, width, height, p.floor)
    shade(
        ids, planes, p.triangles, p.material_ids, p.materials, view, p.light, p.shadow_matrix,
        p.shadow_tiles, p.shadow_coarse, p.lut, row_lo, row_hi, frame, 0, height,
    )  # fmt: skip
    return ids, depth, frame


def wide_ground() -> Scene:
    """Two triangles 2 km wide: they pass under and behind a low camera (clipped, and in rows
    of every band)."""
    s = 1000.0
    positions = np.array(
        [[[-s, 0, s], [s, 0, s], [s, 0, -s]], [[-s, 0, s], [s, 0, -s], [-s, 0, -s]]], np.float32
    )
    normals = np.tile(np.array([0, 1, 0], np.float32), (2, 3, 1))
    ground = Material("g", (0.6, 0.1, 0.1), 0.8, 0.0, False)
    return Scene(positions, normals, np.zeros(2, np.int32), [ground])


@pytest.mark.parametrize("size", [(256, 150), (200, 113), (64, 1)])
def test_bands_draw_the_same_bits_as_the_whole_frame(scene: Scene, size: tuple[int, int]) -> None:
    width, height = size
    renderers = {
        bands: CpuRenderer(scene, width, height, bands=bands) for bands in (1, 2, 3, 7, 16)
    }
    for name, camera in poses(scene).items():
        ids, depth, frame = whole_frame(scene, camera, width, height)
        for bands, renderer in renderers.items():
            assert np.array_equal(renderer.render(camera), frame), (name, bands)
            assert np.array_equal(renderer._ids, ids), (name, bands)
            assert np.array_equal(renderer._depth.view(np.int32), depth.view(np.int32))


def test_bands_draw_the_same_bits_with_a_camera_on_the_ground() -> None:
    scene = wide_ground()
    renderer = CpuRenderer(scene, 160, 90, bands=7)
    for height in (1e-4, 0.01, 1.0):
        for yaw, pitch in ((0.0, 0.02), (2.0, -0.3), (1.0, 0.5)):
            camera = OrbitCamera(
                target=(3.0, height, -2.0), distance=1e-3, yaw=yaw, pitch=pitch,
                min_distance=1e-4, scene_radius=1500.0,
            )  # fmt: skip
            ids, depth, frame = whole_frame(scene, camera, 160, 90)
            assert np.array_equal(renderer.render(camera), frame), (height, yaw)
            assert np.array_equal(renderer._ids, ids), (height, yaw)
            assert np.array_equal(renderer._depth.view(np.int32), depth.view(np.int32))


def test_each_band_sees_its_rows_final(scene: Scene) -> None:
    camera = poses(scene)["close"]
    renderer = CpuRenderer(scene, 256, 150, bands=5)
    seen: dict[tuple[int, int], np.ndarray] = {}

    def copy_rows(start: int, stop: int) -> None:
        seen[start, stop] = renderer.frame[start:stop].copy()

    frame = renderer.render(camera, copy_rows)
    assert sorted(seen) == split_rows(150, 5, step=2)
    assert all(start % 2 == 0 for start, _ in seen)
    for (start, stop), rows in seen.items():
        assert np.array_equal(rows, frame[start:stop])


def test_pictures_convert_as_they_draw(scene: Scene) -> None:
    pictures = CpuPictures(CpuRenderer(scene, 256, 150, bands=6))
    for camera in poses(scene).values():
        _, _, frame = whole_frame(scene, camera, 256, 150)
        picture = pictures.picture(camera)
        assert np.array_equal(picture.to_ndarray(), rgb_to_yuv420(frame).to_ndarray())
    assert set(pictures.stage_ms) == {"render"}


def yuv420_reference(rgb: np.ndarray) -> np.ndarray:
    """The BT.709 limited-range formulas of convert.py in numpy: Y, then U, then V rows."""
    c = rgb.astype(np.int32)
    r, g, b = c[..., 0], c[..., 1], c[..., 2]
    y = (47 * r + 157 * g + 16 * b + 128 + (16 << 8)) >> 8
    height, width = r.shape

    def block_sum(a: np.ndarray) -> np.ndarray:
        return a.reshape(height // 2, 2, width // 2, 2).sum(axis=(1, 3))

    rs, gs, bs = block_sum(r), block_sum(g), block_sum(b)
    u = (-26 * rs - 87 * gs + 112 * bs + 512 + (128 << 10)) >> 10
    v = (112 * rs - 102 * gs - 10 * bs + 512 + (128 << 10)) >> 10
    chroma = np.concatenate([u.reshape(-1), v.reshape(-1)]).reshape(height // 2, width)
    return np.concatenate([y, chroma]).astype(np.uint8)


def test_the_conversion_keeps_its_formulas() -> None:
    rgb = np.random.default_rng(1).integers(0, 256, (46, 62, 3), dtype=np.uint8)
    expected = yuv420_reference(rgb)
    assert np.array_equal(rgb_to_yuv420(rgb).to_ndarray(), expected)
    converter = YuvConverter(62, 46, bands=5)
    assert np.array_equal(converter.convert(rgb).to_ndarray(), expected)
    # a strided view converts as its copy; band by band it must be the frame itself
    wide = np.zeros((46, 124, 3), np.uint8)
    wide[:, ::2] = rgb
    assert np.array_equal(converter.convert(wide[:, ::2]).to_ndarray(), expected)
    with pytest.raises(ValueError, match="contiguous"):
        converter.rows(wide[:, ::2])


def test_every_band_runs_once() -> None:
    bands = split_rows(1000, 37)
    done: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(start: int, stop: int) -> None:
        with lock:
            done.append((start, stop))

    run_in_bands(work, bands, threads=4)
    assert sorted(done) == bands


def test_the_calling_thread_takes_the_bands_a_busy_pool_cannot() -> None:
    gate = threading.Event()
    pool = _band_pool()
    blocked = [pool.submit(gate.wait) for _ in range(pool._max_workers)]
    try:
        threads: list[int] = []
        run_in_bands(lambda start, stop: threads.append(threading.get_ident()), split_rows(90, 9))
        assert threads == [threading.get_ident()] * 9  # no waiting on the pool
    finally:
        gate.set()
        for future in blocked:
            future.result()


def test_a_failing_band_stops_the_others_and_raises_here() -> None:
    started: list[int] = []

    def work(start: int, stop: int) -> None:
        started.append(start)
        if start == 20:
            raise RuntimeError("band 20")

    with pytest.raises(RuntimeError, match="band 20"):
        run_in_bands(work, split_rows(100, 10), threads=1)
    assert started == [0, 10, 20]
