"""Scene files: glTF 2.0 (.glb, .gltf) and OBJ (with its .mtl) loaded through trimesh.

trimesh parses the file into a scene graph; `scene_from_trimesh` flattens the graph into the
renderers' `Scene` of world-space triangles, per-corner normals and materials.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trimesh
from trimesh.resolvers import FilePathResolver
from trimesh.visual.material import PBRMaterial, SimpleMaterial
from trimesh.visual.texture import TextureVisuals

from render_server.render.scene import Material, Scene, SceneError, srgb_to_linear

SUPPORTED_SUFFIXES = (".glb", ".gltf", ".obj")
CREASE_ANGLE = math.radians(30.0)  # a smooth normal further than this from its face is a crease


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
    try:
        loaded = trimesh.load_scene(
            io.BytesIO(data), file_type=suffix[1:], resolver=resolver, process=False
        )
    except SceneError:
        raise
    except Exception as exc:  # trimesh raises anything from KeyError to struct.error
        raise SceneError(f"{path}: not a readable {suffix[1:].upper()} file ({exc})") from exc
    return scene_from_trimesh(loaded, str(path), obj=suffix == ".obj", limits=limits)


def scene_from_trimesh(
    loaded: trimesh.Scene, source: str, obj: bool, limits: SceneLimits | None = None
) -> Scene:
    """Flatten a trimesh scene graph into world-space triangles, one object per node.

    `source` names the scene in errors; `obj`: the OBJ rules for materials and normals (see
    `load_scene`); `limits`: refuse more triangles than `limits.max_triangles`.
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
