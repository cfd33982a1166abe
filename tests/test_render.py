"""The scene loaders, the orbit camera and the CPU rasterizer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from render_server.render import (
    CpuRenderer,
    Material,
    OrbitCamera,
    Scene,
    SceneError,
    SceneLimits,
    default_scene,
    export_default_scene,
    load_scene,
)
from render_server.render.scene import srgb_to_linear

from .make_reference import HEIGHT, REFERENCE, WIDTH, reference_camera, render_reference
from .pixel_coverage import cpu_coverage

OUTPUT_DIR = Path(__file__).parent.parent / "test-output"


@pytest.fixture(scope="module")
def world() -> Scene:
    return default_scene()


@pytest.fixture(scope="module")
def renderer(world: Scene) -> CpuRenderer:
    return CpuRenderer(world, WIDTH, HEIGHT)


@pytest.fixture
def camera(world: Scene) -> OrbitCamera:
    return reference_camera(world)


def differ(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Mean absolute difference per channel, and the share of pixels off by more than 8."""
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return float(diff.mean()), float((diff.max(axis=2) > 8).mean())


def flat_ground(size: float, color: tuple[float, float, float]) -> Scene:
    """One single-sided quad at y = 0, ±size wide."""
    s = size
    positions = np.array(
        [[[-s, 0, s], [s, 0, s], [s, 0, -s]], [[-s, 0, s], [s, 0, -s], [-s, 0, -s]]], np.float32
    )
    normals = np.tile(np.array([0, 1, 0], np.float32), (2, 3, 1))
    return Scene(positions, normals, np.zeros(2, np.int32), [Material("g", color, 0.8, 0, False)])


# -- rendering ----------------------------------------------------------------------------------


def test_default_frame_matches_the_reference(world: Scene) -> None:
    frame = render_reference(world)
    expected = np.asarray(Image.open(REFERENCE).convert("RGB"))
    mean, share = differ(frame, expected)
    if mean > 1.0 or share > 0.005:
        OUTPUT_DIR.mkdir(exist_ok=True)
        Image.fromarray(frame).save(OUTPUT_DIR / "default_320x180.actual.png")
    assert frame.shape == (HEIGHT, WIDTH, 3) and frame.dtype == np.uint8
    assert frame.flags.c_contiguous
    assert mean <= 1.0, (
        f"mean difference {mean:.2f}; see test-output/ (python -m tests.make_reference)"
    )
    assert share <= 0.005, f"{share:.2%} of pixels differ by more than 8"


def test_the_same_camera_gives_the_same_pixels(
    world: Scene, renderer: CpuRenderer, camera: OrbitCamera
) -> None:
    first = renderer.render(camera).copy()
    moved = camera.copy()
    moved.orbit(0.7, 0.2)
    renderer.render(moved)  # something else in between
    assert np.array_equal(renderer.render(camera.copy()), first)
    assert np.array_equal(CpuRenderer(world, WIDTH, HEIGHT).render(camera), first)


@pytest.mark.parametrize(
    "motion",
    [
        lambda c: c.orbit(0.05, 0.0),
        lambda c: c.orbit(0.0, -0.05),
        lambda c: c.zoom(0.9),
        lambda c: c.pan(0.02, 0.0),
        lambda c: c.move(0.3, 0.0, 0.0),
    ],
    ids=["yaw", "pitch", "zoom", "pan", "move"],
)
def test_camera_motion_changes_the_picture(
    renderer: CpuRenderer, camera: OrbitCamera, motion: object
) -> None:
    before = renderer.render(camera).copy()
    moved = camera.copy()
    motion(moved)  # type: ignore[operator]
    assert moved.state() != camera.state()
    after = renderer.render(moved)
    assert (np.abs(after.astype(int) - before).max(axis=2) > 8).mean() > 0.01


def test_gltf_round_trip_renders_the_same(
    world: Scene, renderer: CpuRenderer, camera: OrbitCamera, tmp_path: Path
) -> None:
    path = tmp_path / "default.glb"
    export_default_scene(path)
    loaded = load_scene(path)
    assert loaded.triangle_count == world.triangle_count
    assert loaded.materials == world.materials
    expected = renderer.render(camera).copy()
    mean, share = differ(CpuRenderer(loaded, WIDTH, HEIGHT).render(camera), expected)
    assert mean <= 0.5 and share <= 0.002


def test_camera_inside_and_just_above_the_ground(world: Scene, camera: OrbitCamera) -> None:
    # a ground far larger than the view: it passes under and behind a low camera
    wide = CpuRenderer(flat_ground(1000.0, (0.6, 0.02, 0.02)), WIDTH, HEIGHT)
    for height in (1e-4, 0.01, 1.0):
        for yaw in (0.0, 2.0):
            cam = OrbitCamera(target=(3.0, height, -2.0), distance=1e-3, yaw=yaw, pitch=0.02,
                              min_distance=1e-4, scene_radius=1500.0)  # fmt: skip
            frame = wide.render(cam).astype(int)
            below = frame[HEIGHT // 2 + 6 :]
            assert (below[..., 0] > below[..., 1] + 40).mean() > 0.99, (height, yaw)
    # in the plane itself the ground is edge-on: nothing to draw, nothing to fail
    for pitch in (0.0, 0.3, -0.3):
        wide.render(
            OrbitCamera(target=(0.0, 0.0, 0.0), distance=1e-3, pitch=pitch, min_distance=1e-4)
        )

    # the default scene from just above its ground plate: the plate fills the lower half
    low = CpuRenderer(world, WIDTH, HEIGHT)
    cam = camera.copy()
    cam.target, cam.distance, cam.yaw, cam.pitch = (0.5, 0.02, 1.0), 0.05, 0.4, 0.01
    frame = low.render(cam)
    assert np.isfinite(frame).all()
    ground = [m.name for m in world.materials].index("ground")
    ids = low._ids[HEIGHT // 2 + 6 :]
    assert (ids >= 0).all() and (world.material_ids[ids] == ground).mean() > 0.95


def test_double_sided_surfaces_show_their_back() -> None:
    single = flat_ground(1.0, (0.8, 0.8, 0.8))
    double = flat_ground(1.0, (0.8, 0.8, 0.8))
    double.materials[0] = Material("g", (0.8, 0.8, 0.8), 0.8, 0.0, True)
    below = OrbitCamera(target=(0.0, 0.0, 0.0), distance=3.0, pitch=-0.6)
    seen_single = CpuRenderer(single, 64, 36)
    seen_single.render(below)
    seen_double = CpuRenderer(double, 64, 36)
    seen_double.render(below)
    assert (seen_single._ids < 0).all()  # culled from below
    assert (seen_double._ids >= 0).mean() > 0.1


# -- the fill rule ------------------------------------------------------------------------------


def test_an_axis_aligned_quad_covers_its_pixels_exactly_once() -> None:
    w, h = 40, 30
    # corners on pixel centres: the top and left edges' centres belong to the quad, the right
    # and bottom edges' centres to its neighbours, so x in [10.5, 20.5) → 10 columns
    x0, x1, y0, y1 = 10.5, 20.5, 5.5, 15.5
    nx0, nx1 = 2 * x0 / w - 1, 2 * x1 / w - 1
    ny0, ny1 = 1 - 2 * y0 / h, 1 - 2 * y1 / h
    quad = [[[nx0, ny0], [nx1, ny0], [nx1, ny1]], [[nx0, ny0], [nx1, ny1], [nx0, ny1]]]
    counts = cpu_coverage(np.array(quad), w, h)
    expected = np.zeros((h, w), np.int32)
    expected[5:15, 10:20] = 1
    assert np.array_equal(counts, expected)


def test_triangles_sharing_edges_never_leave_gaps_or_overlap() -> None:
    w, h = 64, 48
    px = (np.arange(w) + 0.5) / w * 2 - 1
    py = 1 - (np.arange(h) + 0.5) / h * 2
    gx, gy = np.meshgrid(px, py)
    rng = np.random.default_rng(7)
    for _ in range(40):
        # a fan around a point: neighbours share an edge and together tile a star-shaped
        # polygon; some corners lie far outside the view, some edges are long and thin
        centre = rng.uniform(-0.3, 0.3, 2)
        angles = np.arange(7) * 2 * math.pi / 7 + rng.uniform(-0.3, 0.3, 7)
        ring = centre + np.c_[np.cos(angles), np.sin(angles)] * rng.uniform(0.4, 2.5, (7, 1))
        fan = [[centre, ring[k], ring[(k + 1) % 7]] for k in range(7)]
        counts = cpu_coverage(np.array(fan), w, h)
        assert counts.max() <= 1, "a pixel drawn twice"
        # covered: every pixel centre clearly inside the polygon's kernel (inside all edges)
        inside = np.ones((h, w), bool)
        for a, b in zip(ring, np.roll(ring, -1, axis=0), strict=True):
            cross = (b[0] - a[0]) * (gy - a[1]) - (b[1] - a[1]) * (gx - a[0])
            inside &= cross > 1e-3 * np.hypot(*(b - a))
        assert (counts[inside] == 1).all(), "a gap"


# -- loading ------------------------------------------------------------------------------------


OBJ_CUBE = """mtllib cube.mtl
usemtl orange
v 0 0 0
v 1 0 0
v 1 1 0
v 0 1 0
v 0 0 1
v 1 0 1
v 1 1 1
v 0 1 1
f 1 4 3 2
f 5 6 7 8
f 1 2 6 5
f 3 4 8 7
f 2 3 7 6
f 1 5 8 4
"""


def test_obj_loads_with_its_kd_colour(tmp_path: Path) -> None:
    (tmp_path / "cube.obj").write_text(OBJ_CUBE)
    (tmp_path / "cube.mtl").write_text("newmtl orange\nKd 0.8 0.4 0.1\n")
    scene = load_scene(tmp_path / "cube.obj")
    assert scene.triangle_count == 12
    (material,) = scene.materials
    assert material.base_color == pytest.approx(tuple(srgb_to_linear(np.array([0.8, 0.4, 0.1]))))
    assert (material.roughness, material.metallic, material.double_sided) == (0.6, 0.0, True)
    # shared corners, no normals in the file: the 30° crease rule keeps every face flat
    face = np.cross(scene.positions[:, 1] - scene.positions[:, 0],
                    scene.positions[:, 2] - scene.positions[:, 0])  # fmt: skip
    face /= np.linalg.norm(face, axis=1, keepdims=True)
    assert np.allclose(scene.normals, face[:, None, :], atol=1e-6)
    np.testing.assert_allclose(scene.bounds_min, 0.0)
    np.testing.assert_allclose(scene.bounds_max, 1.0)


def test_smooth_obj_normals_stay_smooth(tmp_path: Path) -> None:
    import trimesh

    sphere = trimesh.creation.icosphere(subdivisions=2)
    (tmp_path / "ball.obj").write_text(
        trimesh.exchange.obj.export_obj(sphere, include_normals=False)
    )
    scene = load_scene(tmp_path / "ball.obj")
    radial = scene.positions / np.linalg.norm(scene.positions, axis=2, keepdims=True)
    assert np.einsum("tcj,tcj->tc", scene.normals, radial).min() > 0.99


@pytest.mark.parametrize(
    ("name", "content", "limits", "message"),
    [
        ("missing.glb", None, SceneLimits(), "no such file"),
        ("garbage.glb", b"\x00\x17not a glb at all" * 40, SceneLimits(), "not a readable GLB"),
        ("garbage.gltf", b"{ this is not json", SceneLimits(), "not a readable GLTF"),
        ("model.fbx", b"whatever", SceneLimits(), "unsupported file type '.fbx'"),
        ("big.obj", OBJ_CUBE.encode(), SceneLimits(max_bytes=100), "SceneLimits.max_bytes"),
        ("many.obj", OBJ_CUBE.encode(), SceneLimits(max_triangles=11), "SceneLimits.max_triangles"),
        ("points.obj", b"v 0 0 0\nv 1 0 0\nv 0 1 0\n", SceneLimits(), "no triangles"),
        ("nan.obj", b"v 0 0 0\nv 1 0 0\nv nan 1 0\nf 1 2 3\n", SceneLimits(), "non-finite"),
    ],
)
def test_unusable_files_raise_scene_errors(
    tmp_path: Path, name: str, content: bytes | None, limits: SceneLimits, message: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SceneError) as caught:
        load_scene(path, limits)
    assert message in str(caught.value)
    assert name in str(caught.value)


def test_a_scene_checks_its_arrays() -> None:
    positions = np.zeros((1, 3, 3), np.float32)
    normals = np.tile(np.array([0, 1, 0], np.float32), (1, 3, 1))
    ok = [Material("m", (1, 1, 1), 0.5, 0, False)]
    with pytest.raises(SceneError, match="normals"):
        Scene(positions, normals[:, :2], np.zeros(1, np.int32), ok)
    with pytest.raises(SceneError, match="non-finite"):
        Scene(positions + np.nan, normals, np.zeros(1, np.int32), ok)
    with pytest.raises(SceneError, match="material_ids"):
        Scene(positions, normals, np.ones(1, np.int32), ok)
    assert Scene(positions, normals, np.zeros(1, np.int32), ok).triangle_count == 1


# -- the camera ---------------------------------------------------------------------------------


def project(camera: OrbitCamera, points: np.ndarray, aspect: float = 16 / 9) -> np.ndarray:
    clip = np.c_[points, np.ones(len(points))] @ camera.view_projection(aspect).T
    return clip[:, :3] / clip[:, 3:]


def test_framed_on_shows_the_whole_box(world: Scene) -> None:
    cam = OrbitCamera.framed_on(world.bounds_min, world.bounds_max)
    lo, hi = world.bounds_min, world.bounds_max
    corners = np.array(np.meshgrid(*zip(lo, hi, strict=True))).T.reshape(-1, 3)
    ndc = project(cam, corners)
    assert (np.abs(ndc) <= 1.0).all()
    assert np.abs(ndc[:, 1]).max() > 0.8 or np.abs(ndc[:, 0]).max() > 0.8  # and fills the view
    assert math.degrees(cam.yaw) == pytest.approx(35) and cam.pitch > 0  # a 3/4 view from above


def test_view_and_projection_matrices() -> None:
    cam = OrbitCamera(target=(1.0, 2.0, 3.0), distance=4.0, yaw=0.3, pitch=0.4, scene_radius=2.0,
                      scene_center=(1.0, 2.0, 3.0))  # fmt: skip
    view = cam.view_matrix()
    np.testing.assert_allclose(view @ np.r_[cam.eye(), 1.0], [0, 0, 0, 1], atol=1e-12)
    np.testing.assert_allclose(view @ np.r_[cam.target, 1.0], [0, 0, -4, 1], atol=1e-12)
    np.testing.assert_allclose(view[:3, :3] @ view[:3, :3].T, np.eye(3), atol=1e-12)
    assert view[0, 1] == 0.0  # no roll: "right" stays horizontal
    near, far = cam.clip_planes()
    proj = cam.projection_matrix(2.0)
    for depth, ndc_z in ((near, -1.0), (far, 1.0)):
        p = proj @ np.array([0.0, 0.0, -depth, 1.0])
        assert p[2] / p[3] == pytest.approx(ndc_z)
    assert near == pytest.approx(2.0) and far == pytest.approx(6.0 * 1.01)


def test_orbit_and_pitch_clamp() -> None:
    cam = OrbitCamera(distance=5.0)
    cam.orbit(0.5, 0.2)
    assert (cam.yaw, cam.pitch) == pytest.approx((0.5, 0.2))
    cam.orbit(0.0, 10.0)
    assert math.degrees(cam.pitch) == pytest.approx(89.0)
    cam.orbit(0.0, -20.0)
    assert math.degrees(cam.pitch) == pytest.approx(-89.0)
    assert np.linalg.norm(cam.eye() - np.array(cam.target)) == pytest.approx(5.0)


def test_zoom_clamps_to_the_scene_size(world: Scene) -> None:
    cam = OrbitCamera.framed_on(world.bounds_min, world.bounds_max)
    start = cam.distance
    cam.zoom(0.5)
    assert cam.distance == pytest.approx(start / 2)
    cam.zoom(1e-9)
    assert cam.distance == cam.min_distance > 0
    cam.zoom(1e9)
    assert cam.distance == cam.max_distance < 1000 * start
    for bad in (0.0, -1.0, math.nan, math.inf):
        cam.zoom(bad)
        assert cam.distance == cam.max_distance


def test_pan_moves_in_view_heights() -> None:
    cam = OrbitCamera(distance=10.0, yaw=0.7, pitch=0.3)
    right = cam.view_matrix()[0, :3]
    up = cam.view_matrix()[1, :3]
    height = 2 * 10.0 * math.tan(cam.fov_y / 2)
    cam.pan(0.25, -0.1)
    np.testing.assert_allclose(cam.target, height * (0.25 * right - 0.1 * up), atol=1e-12)
    # the old target now sits a quarter of the view height left of the centre
    ndc = project(cam, np.zeros((1, 3)), aspect=1.0)[0]
    assert ndc[0] == pytest.approx(-0.5) and ndc[1] == pytest.approx(0.2)


def test_move_follows_the_ground() -> None:
    cam = OrbitCamera(distance=10.0, yaw=math.pi / 2, pitch=0.8)
    cam.move(1.0, 0.0, 0.0)  # forward: the view direction projected on the ground
    np.testing.assert_allclose(cam.target, (-1.0, 0.0, 0.0), atol=1e-12)
    cam.move(0.0, 2.0, 0.5)
    np.testing.assert_allclose(cam.target, (-1.0, 0.5, -2.0), atol=1e-12)


def test_state_and_copy() -> None:
    cam = OrbitCamera(target=(1.0, 0.0, 0.0))
    twin = cam.copy()
    assert twin.state() == cam.state() and hash(twin.state()) == hash(cam.state())
    twin.orbit(0.1, 0.0)
    assert twin.state() != cam.state()


@pytest.mark.parametrize("bands", [2, 3, 7])
def test_shading_in_bands_of_rows_gives_the_same_pixels(scene: Scene, bands: int) -> None:
    camera = OrbitCamera.framed_on(scene.bounds_min, scene.bounds_max)
    one = CpuRenderer(scene, 256, 150, bands=1).render(camera).copy()
    assert np.array_equal(CpuRenderer(scene, 256, 150, bands=bands).render(camera), one)
