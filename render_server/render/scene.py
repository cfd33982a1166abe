"""The scene every renderer draws: world-space triangles, materials and one sun; and its loaders."""

from __future__ import annotations

import io
import math
import os
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trimesh
from trimesh.resolvers import FilePathResolver
from trimesh.visual.material import PBRMaterial, SimpleMaterial
from trimesh.visual.texture import TextureVisuals

SUPPORTED_SUFFIXES = (".glb", ".gltf", ".obj")
CREASE_ANGLE = math.radians(30.0)  # a smooth normal further than this from its face is a crease
DEFAULT_LIGHT_DIRECTION = (0.27, -0.77, -0.58)  # travels down and away from the default view
DEFAULT_LIGHT_COLOR = (1.0, 0.95, 0.86)  # linear RGB, warm white sun


class SceneError(ValueError):
    """A scene that cannot be used; the message names the file, the problem and any limit."""


@dataclass(frozen=True)
class Material:
    """A metallic-roughness surface; `base_color` is linear RGB in 0..1."""

    name: str
    base_color: tuple[float, float, float]
    roughness: float
    metallic: float
    double_sided: bool


# The renderers draw an endless floor of this material below the scene; the default scene's
# ground plate has it too, so the plate merges into the floor.
FLOOR_MATERIAL = Material("floor", (0.45, 0.43, 0.4), 0.85, 0.0, False)


@dataclass(frozen=True)
class SceneLimits:
    """What a loaded scene may cost: triangles after loading, bytes on disk."""

    max_triangles: int = 2_000_000
    max_bytes: int = 256 * 1024 * 1024


@dataclass
class Scene:
    """Triangles in world space with per-corner normals, their materials and a directional sun.

    `light_direction` is the unit vector the sunlight travels along (pointing down for a sun
    above); `light_color` is its linear RGB intensity. `objects` names the scene's parts (the
    node names of a glTF/OBJ file) and `object_ids` gives each triangle's part; without them
    the whole scene is one object, "scene". The bounds are derived from the positions, or given
    as `bounds` (min, max): a scene derived from another (some objects hidden) keeps its
    parent's bounds, and only with given bounds may a scene hold no triangles at all.
    """

    positions: np.ndarray  # float32 (T, 3, 3): triangle corners, counter-clockwise is the front
    normals: np.ndarray  # float32 (T, 3, 3): unit shading normal per corner
    material_ids: np.ndarray  # int32 (T,): index into `materials`
    materials: list[Material]
    light_direction: np.ndarray = field(
        default_factory=lambda: np.array(DEFAULT_LIGHT_DIRECTION, dtype=np.float32)
    )
    light_color: tuple[float, float, float] = DEFAULT_LIGHT_COLOR
    daylight: float = 1.0  # how bright the sky and its ambient light are: 1 day … 0 night
    objects: list[str] = field(default_factory=lambda: ["scene"])
    object_ids: np.ndarray | None = None  # int32 (T,): index into `objects`; None: all 0
    bounds: InitVar[tuple[np.ndarray, np.ndarray] | None] = None
    bounds_min: np.ndarray = field(init=False)  # float32 (3,)
    bounds_max: np.ndarray = field(init=False)  # float32 (3,)

    def __post_init__(self, bounds: tuple[np.ndarray, np.ndarray] | None) -> None:
        self.positions = np.ascontiguousarray(self.positions, dtype=np.float32)
        self.normals = np.ascontiguousarray(self.normals, dtype=np.float32)
        self.material_ids = np.ascontiguousarray(self.material_ids, dtype=np.int32)
        count = self.positions.shape[0] if self.positions.ndim == 3 else -1
        if count < (0 if bounds is not None else 1) or self.positions.shape != (count, 3, 3):
            raise SceneError(f"positions must be (T, 3, 3) with T > 0, got {self.positions.shape}")
        if self.normals.shape != (count, 3, 3):
            raise SceneError(f"normals must be {(count, 3, 3)}, got {self.normals.shape}")
        if self.material_ids.shape != (count,):
            raise SceneError(f"material_ids must be ({count},), got {self.material_ids.shape}")
        if not np.isfinite(self.positions).all():
            raise SceneError("positions hold non-finite coordinates")
        if not np.isfinite(self.normals).all():
            raise SceneError("normals hold non-finite values")
        length = np.linalg.norm(self.normals, axis=2)
        if count and np.abs(length - 1.0).max() > 1e-3:
            raise SceneError("normals must be unit vectors")
        if not self.materials:
            raise SceneError("a scene needs at least one material")
        if count and (
            self.material_ids.min() < 0 or self.material_ids.max() >= len(self.materials)
        ):
            raise SceneError(f"material_ids must lie in [0, {len(self.materials)})")
        if not self.objects or not all(isinstance(name, str) for name in self.objects):
            raise SceneError("objects must be a non-empty list of names")
        ids = np.zeros(count, np.int32) if self.object_ids is None else self.object_ids
        self.object_ids = np.ascontiguousarray(ids, dtype=np.int32)
        if self.object_ids.shape != (count,):
            raise SceneError(f"object_ids must be ({count},), got {self.object_ids.shape}")
        if count and (self.object_ids.min() < 0 or self.object_ids.max() >= len(self.objects)):
            raise SceneError(f"object_ids must lie in [0, {len(self.objects)})")
        light = np.asarray(self.light_direction, dtype=np.float64).reshape(3)
        norm = float(np.linalg.norm(light))
        if not math.isfinite(norm) or norm < 1e-9:
            raise SceneError("light_direction must be a finite non-zero vector")
        self.light_direction = (light / norm).astype(np.float32)
        if len(self.light_color) != 3 or not all(math.isfinite(c) for c in self.light_color):
            raise SceneError("light_color must be three finite numbers")
        if bounds is not None:
            lo, hi = (np.asarray(b, dtype=np.float32).reshape(3) for b in bounds)
            if not (np.isfinite(lo).all() and np.isfinite(hi).all() and (lo <= hi).all()):
                raise SceneError("bounds must be finite with min <= max")
            self.bounds_min, self.bounds_max = lo, hi
        else:
            self.bounds_min = self.positions.reshape(-1, 3).min(axis=0)
            self.bounds_max = self.positions.reshape(-1, 3).max(axis=0)

    @property
    def triangle_count(self) -> int:
        return int(self.positions.shape[0])


def load_scene(path: str | Path, limits: SceneLimits = SceneLimits()) -> Scene:
    """Load a glTF 2.0 (.glb, .gltf) or OBJ file (with its .mtl) into a `Scene`.

    Materials: glTF metallic-roughness factors (already linear); a base colour texture is
    reduced to its mean linear colour times the factor, an approximation since the renderer
    draws no textures. OBJ `Kd` is sRGB and converted to linear; OBJ surfaces are drawn double
    sided (their winding is unreliable). Raises `SceneError` for anything that cannot be drawn.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise SceneError(
            f"{path}: unsupported file type {suffix or '(none)'!r}; "
            f"expected one of {', '.join(SUPPORTED_SUFFIXES)}"
        )
    if not path.is_file():
        raise SceneError(f"{path}: no such file")
    size = path.stat().st_size
    if size > limits.max_bytes:
        raise SceneError(
            f"{path}: the file is {size} bytes, over the limit of {limits.max_bytes} bytes "
            "(SceneLimits.max_bytes)"
        )
    # Parse the bytes that were measured, not whatever the path holds a moment later.
    data = path.read_bytes()
    if len(data) > limits.max_bytes:
        raise SceneError(f"{path}: the file grew past {limits.max_bytes} bytes while read")
    resolver = _BoundedResolver(path, budget=limits.max_bytes - len(data))
    try:
        loaded = trimesh.load_scene(
            io.BytesIO(data), file_type=suffix[1:], resolver=resolver, process=False
        )
    except SceneError:
        raise
    except Exception as exc:  # trimesh raises anything from KeyError to struct.error
        raise SceneError(f"{path}: not a readable {suffix[1:].upper()} file ({exc})") from exc
    return _from_trimesh(loaded, str(path), obj=suffix == ".obj", limits=limits)


def default_scene() -> Scene:
    """The built-in scene: six shapes of distinct materials on a ground plate under a sun.

    The plate has the endless floor's material (FLOOR_MATERIAL), so it merges into the floor
    the renderers draw around it; it is sized to the shapes so that `OrbitCamera.framed_on` of
    the bounds frames them.
    """
    return _from_trimesh(_default_trimesh_scene(), "default scene", obj=False)


def export_default_scene(path: str | Path) -> None:
    """Write the built-in scene as a binary glTF (.glb) file."""
    data = _default_trimesh_scene().export(file_type="glb", include_normals=True)
    Path(path).write_bytes(data)


def srgb_to_linear(c: np.ndarray) -> np.ndarray:
    """sRGB-encoded values in 0..1 → linear values."""
    c = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def linear_to_srgb(c: np.ndarray) -> np.ndarray:
    """Linear values in 0..1 → sRGB-encoded values (the inverse of `srgb_to_linear`)."""
    c = np.clip(np.asarray(c, dtype=np.float64), 0.0, 1.0)
    return np.where(c <= 0.0031308, c * 12.92, 1.055 * c ** (1 / 2.4) - 0.055)


# -- conversion from trimesh ----------------------------------------------------------------------


class _BoundedResolver(FilePathResolver):
    """Reads files next to the scene (buffers, textures, .mtl) within a byte budget."""

    def __init__(self, source: Path, budget: int) -> None:
        super().__init__(str(source))  # refuses paths that leave the scene's folder
        self.budget = budget
        self.source = source

    def get(self, name: str) -> bytes:
        # the same candidates as trimesh's resolver, each confined to the folder
        for candidate in (name.strip(), name.strip().lstrip("/"), os.path.basename(name)):
            try:
                path = self.absolute(candidate)
            except ValueError:
                continue
            if path.is_file():
                size = os.path.getsize(path)
                if size > self.budget:
                    raise SceneError(
                        f"{self.source}: the file and what it references ({name}) pass the "
                        "limit of SceneLimits.max_bytes"
                    )
                self.budget -= size
                return path.read_bytes()
        raise FileNotFoundError(f"{name!r} is not a file in the scene's folder")


def _from_trimesh(
    loaded: trimesh.Scene, source: str, obj: bool, limits: SceneLimits | None = None
) -> Scene:
    """Flatten a trimesh scene graph into world-space triangles."""
    instances: list[tuple[np.ndarray, str, str]] = []  # transform, geometry, node
    total = 0
    # trimesh's graph order differs between a built and a reloaded scene; names are stable
    for node in sorted(loaded.graph.nodes_geometry, key=str):
        transform, geometry_name = loaded.graph[node]
        mesh = loaded.geometry.get(str(geometry_name))
        if isinstance(mesh, trimesh.Trimesh) and len(mesh.faces):
            transform = np.asarray(transform, dtype=np.float64)
            instances.append((transform, str(geometry_name), str(node)))
            total += len(mesh.faces)
    if limits is not None and total > limits.max_triangles:
        raise SceneError(
            f"{source}: {total} triangles, over the limit of {limits.max_triangles} "
            "(SceneLimits.max_triangles)"
        )
    if total == 0:
        raise SceneError(f"{source}: the scene holds no triangles")

    materials: list[Material] = []
    material_index: dict[Material, int] = {}
    corners: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}
    positions, normals, material_ids, object_ids = [], [], [], []
    objects: list[str] = []
    for transform, name, node_name in instances:
        if name not in corners:
            mesh = loaded.geometry[name]
            material = _material(mesh, name, obj)
            if material not in material_index:
                material_index[material] = len(materials)
                materials.append(material)
            pos, nrm = _corners(mesh, source, name, smooth_missing=obj)
            corners[name] = (pos, nrm, material_index[material])
        pos, nrm, mid = corners[name]
        if not np.isfinite(transform).all():
            raise SceneError(f"{source}: node transform of {name!r} is not finite")
        linear = transform[:3, :3]
        world = pos @ linear.T + transform[:3, 3]
        try:
            normal_matrix = np.linalg.inv(linear).T
        except np.linalg.LinAlgError:
            continue  # a node scaled to nothing draws nothing
        world_n = nrm @ normal_matrix.T
        world_n /= np.maximum(np.linalg.norm(world_n, axis=2, keepdims=True), 1e-30)
        if np.linalg.det(linear) < 0:
            # a mirroring transform turns the winding over; swap two corners to keep the front
            world = world[:, [0, 2, 1]]
            world_n = world_n[:, [0, 2, 1]]
        positions.append(world)
        normals.append(world_n)
        material_ids.append(np.full(len(world), mid, dtype=np.int32))
        object_ids.append(np.full(len(world), len(objects), dtype=np.int32))
        objects.append(node_name)
    if not positions:
        raise SceneError(f"{source}: the scene holds no drawable triangles")
    all_positions = np.concatenate(positions).astype(np.float32)
    if not np.isfinite(all_positions).all():
        raise SceneError(f"{source}: non-finite vertex coordinates")
    return Scene(
        positions=all_positions,
        normals=np.concatenate(normals).astype(np.float32),
        material_ids=np.concatenate(material_ids),
        materials=materials,
        objects=objects,
        object_ids=np.concatenate(object_ids),
    )


def _corners(
    mesh: trimesh.Trimesh, source: str, name: str, smooth_missing: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Corner positions and crease-aware corner normals of one mesh, (F, 3, 3) float64 each.

    A corner takes the vertex normal when it lies within CREASE_ANGLE of the face normal and the
    face normal otherwise, so boxes stay crisp and spheres smooth. Without normals in the file,
    OBJ meshes are smoothed over shared vertices; glTF ones are flat, as the glTF spec asks.
    """
    vertices = np.asarray(mesh.vertices, dtype=np.float64)
    faces = np.asarray(mesh.faces, dtype=np.int64)
    if not np.isfinite(vertices).all():
        raise SceneError(f"{source}: mesh {name!r} has non-finite vertex coordinates")
    if faces.ndim != 2 or faces.shape[1] != 3 or faces.min() < 0 or faces.max() >= len(vertices):
        raise SceneError(f"{source}: mesh {name!r} has faces that index missing vertices")
    pos = vertices[faces]
    face_n = np.cross(pos[:, 1] - pos[:, 0], pos[:, 2] - pos[:, 0])
    face_len = np.linalg.norm(face_n, axis=1, keepdims=True)
    degenerate = face_len[:, 0] <= 1e-20
    face_n = face_n / np.where(degenerate[:, None], 1.0, face_len)

    # "vertex_normals" is in the cache only when the file gave normals (trimesh's exporter
    # checks the same way); otherwise reading the property computes them from the faces.
    from_file = "vertex_normals" in mesh._cache
    if from_file or smooth_missing:
        vn = np.asarray(mesh.vertex_normals, dtype=np.float64)
        vn_len = np.linalg.norm(vn, axis=1, keepdims=True)
        vn = np.where(np.isfinite(vn_len) & (vn_len > 1e-12), vn / np.maximum(vn_len, 1e-30), 0.0)
        nrm = vn[faces]
    else:
        nrm = np.repeat(face_n[:, None, :], 3, axis=1)
    cos_crease = math.cos(CREASE_ANGLE)
    agree = np.einsum("fcj,fj->fc", nrm, face_n) >= cos_crease
    valid_vn = np.linalg.norm(nrm, axis=2) > 0.5
    use_vertex = (agree | degenerate[:, None]) & valid_vn
    nrm = np.where(use_vertex[:, :, None], nrm, face_n[:, None, :])
    # a degenerate face without usable vertex normals still needs a unit normal
    missing = np.linalg.norm(nrm, axis=2) < 0.5
    nrm[missing] = (0.0, 1.0, 0.0)
    return pos, nrm


def _material(mesh: trimesh.Trimesh, name: str, obj: bool) -> Material:
    """The renderer's material for a mesh's visual (see `load_scene` for the rules)."""
    visual = mesh.visual
    material: Any = visual.material if isinstance(visual, TextureVisuals) else None
    if isinstance(material, PBRMaterial):
        factor = material.baseColorFactor  # trimesh stores it as RGBA uint8: 1/255 steps
        base = np.ones(3) if factor is None else np.asarray(factor[:3], dtype=np.float64) / 255
        base = base * _mean_texture_color(material.baseColorTexture)
        roughness = 1.0 if material.roughnessFactor is None else material.roughnessFactor
        metallic = 1.0 if material.metallicFactor is None else material.metallicFactor
        return Material(
            name=material.name or name,
            base_color=_rgb(base),
            roughness=float(np.clip(roughness, 0.0, 1.0)),
            metallic=float(np.clip(metallic, 0.0, 1.0)),
            double_sided=bool(material.doubleSided) and not obj,
        )
    if isinstance(material, SimpleMaterial):
        kd = material.kwargs.get("kd")
        if isinstance(kd, list) and len(kd) >= 3:
            srgb = np.asarray(kd[:3], dtype=np.float64)
        else:
            srgb = np.asarray(material.diffuse[:3], dtype=np.float64) / 255
        base = srgb_to_linear(srgb) * _mean_texture_color(material.image)
        return Material(material.name or name, _rgb(base), 0.6, 0.0, True)
    if obj:
        return Material("default", _rgb(srgb_to_linear(np.full(3, 0.8))), 0.6, 0.0, True)
    # glTF's default material: white, fully metallic and fully rough, single sided
    return Material("default", (1.0, 1.0, 1.0), 1.0, 1.0, False)


def _mean_texture_color(image: Any) -> np.ndarray:
    """Mean linear RGB of an sRGB texture (ones when there is none or it cannot be read)."""
    if image is None:
        return np.ones(3)
    try:
        small = image.convert("RGB")
        small.thumbnail((256, 256))  # the mean barely changes; a 8k texture would cost seconds
        pixels = np.asarray(small, dtype=np.float64).reshape(-1, 3) / 255
    except Exception:
        return np.ones(3)
    result: np.ndarray = srgb_to_linear(pixels).mean(axis=0)
    return result


def _rgb(values: np.ndarray) -> tuple[float, float, float]:
    r, g, b = (float(v) for v in np.clip(values, 0.0, 1.0))
    return (r, g, b)


# -- the default scene -----------------------------------------------------------------------------


def _default_trimesh_scene() -> trimesh.Scene:
    """The built-in scene as a trimesh scene graph (one node per shape, +Y up, metres)."""
    from trimesh import creation
    from trimesh.transformations import rotation_matrix

    z_to_y = rotation_matrix(-math.pi / 2, (1, 0, 0))  # trimesh builds round shapes along +Z

    def place(x: float, y: float, z: float, turn: float = 0.0) -> np.ndarray:
        m = rotation_matrix(turn, (0, 1, 0))
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
        smooth.visual = TextureVisuals(material=material)
        scene.add_geometry(smooth, node_name=name, geom_name=name, transform=transform)
    return scene


def _pbr(
    name: str, color: tuple[float, float, float], roughness: float, metallic: float
) -> PBRMaterial:
    return PBRMaterial(
        name=name,
        baseColorFactor=[*color, 1.0],
        roughnessFactor=roughness,
        metallicFactor=metallic,
        doubleSided=False,
    )
