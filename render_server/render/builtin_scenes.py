"""The built-in scenes: the default scene every session starts with, and a dense field of
spheres for load tests."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import trimesh
from trimesh import creation
from trimesh.transformations import rotation_matrix
from trimesh.visual.material import PBRMaterial
from trimesh.visual.texture import TextureVisuals

from render_server.render.scene import FLOOR_MATERIAL, Material, Scene
from render_server.render.scene_files import scene_from_trimesh


def default_scene() -> Scene:
    """The built-in scene: six shapes of distinct materials on a ground plate under a sun.

    The plate has the endless floor's material (FLOOR_MATERIAL), so it merges into the floor
    the renderers draw around it; it is sized to the shapes so that `OrbitCamera.framed_on` of
    the bounds frames them.
    """
    return scene_from_trimesh(_default_trimesh_scene(), "default scene", obj=False)


def export_default_scene(path: str | Path) -> None:
    """Write the built-in scene as a binary glTF (.glb) file."""
    data: bytes = _default_trimesh_scene().export(  # type: ignore[no-untyped-call]
        file_type="glb", include_normals=True
    )
    Path(path).write_bytes(data)


def sphere_field(spheres_per_side: int = 7, subdivisions: int = 5) -> Scene:
    """A dense scene for load tests: a grid of smooth icospheres over a ground plate.

    7 × 7 spheres of subdivision 5 make 1,003,522 triangles (20,480 a sphere, 2 the plate).
    """
    ball = creation.icosphere(subdivisions=subdivisions)
    unit = np.asarray(ball.vertices, dtype=np.float64)[np.asarray(ball.faces)]  # (F, 3, 3)
    palette = [
        Material("clay", (0.7, 0.3, 0.2), 0.7, 0.0, False),
        Material("steel", (0.8, 0.8, 0.85), 0.25, 1.0, False),
        Material("jade", (0.2, 0.6, 0.4), 0.4, 0.0, False),
        replace(FLOOR_MATERIAL, name="ground"),
    ]
    positions, normals, ids = [], [], []
    for k in range(spheres_per_side**2):
        row, col = divmod(k, spheres_per_side)
        centre = np.array([col * 2.5, 1.0, row * 2.5])
        positions.append(unit + centre)
        normals.append(unit / np.linalg.norm(unit, axis=2, keepdims=True))
        ids.append(np.full(len(unit), k % 3, np.int32))
    extent = (spheres_per_side - 1) * 2.5
    lo, hi = -2.0, extent + 2.0
    plate = np.array(
        [[[lo, 0, lo], [lo, 0, hi], [hi, 0, hi]], [[lo, 0, lo], [hi, 0, hi], [hi, 0, lo]]]
    )
    positions.append(plate)
    normals.append(np.tile([0.0, 1.0, 0.0], (2, 3, 1)))
    ids.append(np.full(2, 3, np.int32))
    return Scene(np.concatenate(positions), np.concatenate(normals), np.concatenate(ids), palette)


def _default_trimesh_scene() -> trimesh.Scene:
    """The built-in scene as a trimesh scene graph (one node per shape, +Y up, metres)."""
    # trimesh builds round shapes along +Z
    z_to_y: np.ndarray = rotation_matrix(-math.pi / 2, (1, 0, 0))  # type: ignore[no-untyped-call]

    def place(x: float, y: float, z: float, turn: float = 0.0) -> np.ndarray:
        m: np.ndarray = rotation_matrix(turn, (0, 1, 0))  # type: ignore[no-untyped-call]
        m[:3, 3] = (x, y, z)
        return m

    ground = trimesh.Trimesh(
        vertices=[[-3.5, 0.0, 3.5], [3.5, 0.0, 3.5], [3.5, 0.0, -3.5], [-3.5, 0.0, -3.5]],
        faces=[[0, 1, 2], [0, 2, 3]],
        process=False,
    )
    floor = FLOOR_MATERIAL
    shapes: list[tuple[str, trimesh.Trimesh, np.ndarray, PBRMaterial]] = [
        ("ground", ground, place(0, 0, 0), _pbr("ground", floor.base_color, floor.roughness, 0.0)),
        (
            "red_sphere",
            creation.icosphere(subdivisions=4, radius=1.0),
            place(-1.1, 1.0, 1.2),
            _pbr("glossy_red", (0.7, 0.04, 0.03), 0.25, 0.0),
        ),
        (
            "blue_box",
            creation.box((1.5, 1.5, 1.5)),
            place(1.9, 0.75, -0.6, math.radians(30)),
            _pbr("matte_blue", (0.05, 0.14, 0.55), 0.9, 0.0),
        ),
        (
            # trimesh's torus rings the Z axis, so in a +Y-up world it stands on its rim
            "gold_torus",
            creation.torus(0.85, 0.3, major_sections=72, minor_sections=24),
            place(-0.1, 1.15, -1.5, math.radians(-20)),
            _pbr("gold", (1.0, 0.71, 0.29), 0.3, 1.0),
        ),
        (
            "white_cylinder",
            creation.cylinder(radius=0.5, height=2.4, sections=96),
            place(-2.3, 1.2, -0.9) @ z_to_y,
            _pbr("white", (0.8, 0.8, 0.78), 0.5, 0.0),
        ),
        (
            "green_capsule",
            creation.capsule(height=1.2, radius=0.5, count=[32, 32]),
            place(2.0, 1.1, 1.8) @ z_to_y,
            _pbr("green", (0.08, 0.4, 0.1), 0.45, 0.0),
        ),
        (
            "chrome_sphere",
            creation.icosphere(subdivisions=3, radius=0.5),
            place(0.6, 0.5, 2.6),
            _pbr("chrome", (0.9, 0.9, 0.92), 0.12, 1.0),
        ),
    ]
    scene = trimesh.Scene()
    for name, mesh, transform, material in shapes:
        smooth = mesh if name == "ground" else mesh.smooth_shaded
        smooth.vertex_normals  # noqa: B018  (reading caches them: they count as the file's)
        smooth.visual = TextureVisuals(material=material)  # type: ignore[no-untyped-call]
        scene.add_geometry(smooth, node_name=name, geom_name=name, transform=transform)
    return scene


def _pbr(
    name: str, color: tuple[float, float, float], roughness: float, metallic: float
) -> PBRMaterial:
    return PBRMaterial(  # type: ignore[no-untyped-call]
        name=name,
        baseColorFactor=[*color, 1.0],
        roughnessFactor=roughness,
        metallicFactor=metallic,
        doubleSided=False,
    )
