"""Scene files: glTF 2.0 (.glb, .gltf) and OBJ (with its .mtl) loaded through trimesh.

The prepasses of `scene_formats` check and normalise the file first (glTF: structure, Draco,
fans, spec-gloss, required extensions; OBJ: encoding, polygons, paths), trimesh parses what
they hand on into a scene graph, and `scene_from_trimesh` flattens the graph into the
renderers' `Scene` of world-space triangles, per-corner normals and materials.
"""

from __future__ import annotations

import io
import math
import os
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import trimesh
from trimesh.resolvers import FilePathResolver
from trimesh.visual.material import PBRMaterial, SimpleMaterial
from trimesh.visual.texture import TextureVisuals

from render_server.render.scene import Material, Scene, SceneError, srgb_to_linear
from render_server.scene_formats.gltf_prepass import prepare_gltf
from render_server.scene_formats.obj_prepass import prepare_mtl, prepare_obj

SUPPORTED_SUFFIXES = (".glb", ".gltf", ".obj")
CREASE_ANGLE = math.radians(30.0)  # a smooth normal further than this from its face is a crease
ZERO_AREA = 1e-10  # of the scene's extent squared: far below a pixel, above float32's rounding
AREA_CHUNK = 65536  # triangles measured at a time, until one is not collapsed
# messages of Python's own that say nothing to a designer about their file
PYTHON_INTERNALS = re.compile(
    r"object has no attribute|object is not|not subscriptable|unhashable|out of bounds|"
    r"index out of range|update sequence|reshape|NoneType|No module named|unsupported operand|"
    r"positional argument|invalid literal|could not convert|must be real number"
)


@dataclass(frozen=True)
class SceneLimits:
    """What a loaded scene may cost: triangles after loading, bytes on disk."""

    max_triangles: int = 2_000_000
    max_bytes: int = 256 * 1024 * 1024


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
    obj = suffix == ".obj"
    try:
        if obj:
            prepared, file_type = prepare_obj(data, str(path)), "obj"
        else:
            prepared = prepare_gltf(data, str(path), suffix == ".glb", resolver.get)
            file_type = "glb"  # the prepass hands on every glTF as one .glb
        loaded = trimesh.load_scene(
            io.BytesIO(prepared), file_type=file_type, resolver=resolver, process=False
        )
        names = resolver.mtl_names if obj else None
        return scene_from_trimesh(loaded, str(path), obj, limits, obj_materials=names)
    except SceneError:
        raise
    except Exception as exc:  # trimesh raises anything from KeyError to struct.error
        raise _unreadable(path, suffix[1:].upper(), exc) from exc


def _unreadable(path: Path, kind: str, exc: Exception) -> SceneError:
    """A reader's failure in a designer's words: its message where it speaks of the file, else
    which failure it was (the checks before trimesh name the causes they know)."""
    detail = " ".join(str(exc).split())[:200]
    if not detail or PYTHON_INTERNALS.search(detail):
        detail = (
            f"the reader stopped with {type(exc).__name__}: the file breaks the format "
            "somewhere this server does not check; export it again"
        )
    return SceneError(f"{path}: not a readable {kind} file ({detail})")


def scene_from_trimesh(
    loaded: trimesh.Scene,
    source: str,
    obj: bool,
    limits: SceneLimits | None = None,
    obj_materials: Collection[str] | None = None,
) -> Scene:
    """Flatten a trimesh scene graph into world-space triangles, one object per node.

    `source` names the scene in errors; `obj`: the OBJ rules for materials and normals (see
    `load_scene`); `limits`: refuse more triangles than `limits.max_triangles`;
    `obj_materials`: the names the OBJ's .mtl defines (any other material is trimesh's stand-in
    for none, drawn in the default grey).
    """
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
            material = _material(mesh, name, obj, obj_materials)
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
    _refuse_zero_area(all_positions, source)
    return Scene(
        positions=all_positions,
        normals=np.concatenate(normals).astype(np.float32),
        material_ids=np.concatenate(material_ids),
        materials=materials,
        objects=objects,
        object_ids=np.concatenate(object_ids),
    )


def _refuse_zero_area(positions: np.ndarray, source: str) -> None:
    """A scene of lines and points only (every triangle collapsed) draws nothing."""
    extent = float(np.ptp(positions.reshape(-1, 3), axis=0).max())
    for start in range(0, len(positions), AREA_CHUNK):
        corners = positions[start : start + AREA_CHUNK].astype(np.float64)
        doubled = np.linalg.norm(
            np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]), axis=1
        )
        if (doubled > 2 * ZERO_AREA * extent**2).any():
            return
    raise SceneError(
        f"{source}: all {len(positions)} triangles have zero area (each is a line or a point): "
        "nothing to draw"
    )


class _BoundedResolver(FilePathResolver):
    """Reads files next to the scene (buffers, textures, .mtl) within a byte budget; an .mtl
    goes through `prepare_mtl`, and the material names it defines are kept in `mtl_names`."""

    def __init__(self, source: Path, budget: int) -> None:
        super().__init__(str(source))  # refuses paths that leave the scene's folder
        self.budget = budget
        self.source = source
        self.mtl_names: set[str] = set()

    def get(self, name: str) -> bytes:
        data = self._read(name)
        if name.strip().lower().endswith(".mtl"):
            mtl = prepare_mtl(data)
            self.mtl_names |= mtl.names
            return mtl.data
        return data

    def _read(self, name: str) -> bytes:
        # trimesh's candidates, each confined to the folder, with Windows separators as "/"
        # and a glTF URI's escapes (%20) undone
        plain = name.strip().replace("\\", "/")
        candidates = (plain, plain.lstrip("/"), unquote(plain), os.path.basename(unquote(plain)))
        for candidate in dict.fromkeys(candidates):
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


def _material(
    mesh: trimesh.Trimesh, name: str, obj: bool, obj_materials: Collection[str] | None
) -> Material:
    """The renderer's material for a mesh's visual (see `load_scene` for the rules)."""
    visual = mesh.visual
    material: Any = visual.material if isinstance(visual, TextureVisuals) else None
    if obj and obj_materials is not None and getattr(material, "name", None) not in obj_materials:
        material = None  # trimesh's stand-in (dark, with a placeholder texture) for no material
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
