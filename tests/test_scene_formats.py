"""Model files as designers' tools write them (scene_formats' prepasses, through `load_scene`):
small glTF, .glb and OBJ files built here, each loaded right or refused with its cause."""

from __future__ import annotations

import base64
import json
import re
import struct
import time
from pathlib import Path
from typing import Any

import DracoPy
import numpy as np
import pytest
import trimesh
from PIL import Image

from render_server.render import scene_files
from render_server.render.scene import Scene, srgb_to_linear
from render_server.render.scene_files import load_scene
from render_server.scene_formats.errors import SceneError
from render_server.scene_formats.obj_prepass import triangulate_polygon

# a unit square in z = 0, corners counter-clockwise seen from +z
SQUARE = np.array([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], np.float32)
GREY = tuple(srgb_to_linear(np.full(3, 0.8)))
PYTHON_WORDS = re.compile(r"object has no attribute|not subscriptable|NoneType|Traceback")


def data_uri(blob: bytes) -> str:
    return "data:application/octet-stream;base64," + base64.b64encode(blob).decode()


def gltf(
    positions: np.ndarray, indices: np.ndarray | None = None, mode: int | None = None
) -> dict[str, Any]:
    """A one-mesh glTF with its buffer embedded: positions, then indices (uint32) if given."""
    blob = positions.astype("<f4").tobytes()
    views: list[dict[str, Any]] = [{"buffer": 0, "byteLength": len(blob)}]
    accessors: list[dict[str, Any]] = [
        {"bufferView": 0, "componentType": 5126, "count": len(positions), "type": "VEC3"}
    ]
    primitive: dict[str, Any] = {"attributes": {"POSITION": 0}}
    if indices is not None:
        index_blob = indices.astype("<u4").tobytes()
        views.append({"buffer": 0, "byteOffset": len(blob), "byteLength": len(index_blob)})
        accessors.append(
            {"bufferView": 1, "componentType": 5125, "count": len(indices), "type": "SCALAR"}
        )
        primitive["indices"] = 1
        blob += index_blob
    if mode is not None:
        primitive["mode"] = mode
    return {
        "asset": {"version": "2.0"},
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [primitive]}],
        "accessors": accessors,
        "bufferViews": views,
        "buffers": [{"byteLength": len(blob), "uri": data_uri(blob)}],
    }


def glb(doc: dict[str, Any], binary: bytes) -> bytes:
    text = json.dumps(doc).encode()
    text += b" " * (-len(text) % 4)
    binary += b"\0" * (-len(binary) % 4)
    chunks = struct.pack("<I4s", len(text), b"JSON") + text
    chunks += struct.pack("<I4s", len(binary), b"BIN\0") + binary
    return struct.pack("<4sII", b"glTF", 2, 12 + len(chunks)) + chunks


def write(tmp_path: Path, name: str, content: dict[str, Any] | bytes | str) -> Path:
    path = tmp_path / name
    if isinstance(content, dict):
        path.write_text(json.dumps(content))
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def areas(scene: Scene) -> np.ndarray:
    p = scene.positions.astype(np.float64)
    result: np.ndarray = np.linalg.norm(np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), axis=1) / 2
    return result


def face_normals(scene: Scene) -> np.ndarray:
    p = scene.positions.astype(np.float64)
    n = np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0])
    result: np.ndarray = n / np.linalg.norm(n, axis=1, keepdims=True)
    return result


def refusal(path: Path) -> str:
    """The message `load_scene` refuses `path` with: it names the file, in no Python words."""
    with pytest.raises(SceneError) as caught:
        load_scene(path)
    message = str(caught.value)
    assert path.name in message and not PYTHON_WORDS.search(message), message
    return message


# -- glTF ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("indexed", [False, True], ids=["drawn", "indexed"])
@pytest.mark.parametrize(("mode", "corners"), [(6, [0, 1, 2, 3]), (5, [0, 1, 3, 2])],
                         ids=["fan", "strip"])  # fmt: skip
def test_fans_and_strips_load_as_triangles(
    tmp_path: Path, mode: int, corners: list[int], indexed: bool
) -> None:
    # the square as a fan around corner 0 or as a zig-zag strip, each wound counter-clockwise
    if indexed:
        doc = gltf(SQUARE, np.array(corners), mode)
    else:
        doc = gltf(SQUARE[corners], None, mode)
    scene = load_scene(write(tmp_path, "square.gltf", doc))
    assert scene.triangle_count == 2
    assert areas(scene).sum() == pytest.approx(1.0)
    assert (face_normals(scene)[:, 2] > 0.99).all()  # every triangle keeps the square's front


def test_a_scene_of_points_only_is_refused(tmp_path: Path) -> None:
    message = refusal(write(tmp_path, "cloud.gltf", gltf(SQUARE, None, 0)))
    assert "only points/lines" in message


def test_an_unknown_required_extension_is_refused_by_name(tmp_path: Path) -> None:
    doc = gltf(SQUARE[:3])
    doc["extensionsUsed"] = doc["extensionsRequired"] = ["EXT_meshopt_compression"]
    message = refusal(write(tmp_path, "packed.gltf", doc))
    assert "needs the glTF extension EXT_meshopt_compression" in message
    assert "export without it" in message
    # one that changes nothing drawn here loads
    doc["extensionsUsed"] = doc["extensionsRequired"] = ["KHR_texture_transform"]
    assert load_scene(write(tmp_path, "plain.gltf", doc)).triangle_count == 1


def test_a_spec_gloss_material_gets_a_metallic_roughness_fallback(tmp_path: Path) -> None:
    doc = gltf(SQUARE[:3])
    gloss = {"diffuseFactor": [0.8, 0.2, 0.1, 1.0], "glossinessFactor": 0.3}
    doc["materials"] = [
        {"name": "paint", "extensions": {"KHR_materials_pbrSpecularGlossiness": gloss}}
    ]
    doc["meshes"][0]["primitives"][0]["material"] = 0
    doc["extensionsUsed"] = ["KHR_materials_pbrSpecularGlossiness"]
    (material,) = load_scene(write(tmp_path, "gloss.gltf", doc)).materials
    assert material.base_color == pytest.approx((0.8, 0.2, 0.1), abs=1 / 255)
    assert material.metallic == 0.0  # not trimesh's dark, fully metallic conversion
    assert material.roughness == pytest.approx(0.7)


@pytest.mark.parametrize("container", ["glb", "gltf"])
def test_a_draco_compressed_mesh_is_decoded(tmp_path: Path, container: str) -> None:
    box = trimesh.creation.box()  # a unit cube: 12 triangles of area 0.5
    blob = DracoPy.encode(np.asarray(box.vertices), np.asarray(box.faces, dtype=np.uint32))
    doc: dict[str, Any] = {
        "asset": {"version": "2.0"},
        "extensionsUsed": ["KHR_draco_mesh_compression"],
        "extensionsRequired": ["KHR_draco_mesh_compression"],
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{
            "attributes": {"POSITION": 0},
            "indices": 1,
            "extensions": {"KHR_draco_mesh_compression": {
                "bufferView": 0, "attributes": {"POSITION": 0},
            }},
        }]}],
        # the accessors describe the decoded data and point at no bufferView
        "accessors": [
            {"componentType": 5126, "count": len(box.vertices), "type": "VEC3"},
            {"componentType": 5125, "count": 3 * len(box.faces), "type": "SCALAR"},
        ],
        "bufferViews": [{"buffer": 0, "byteLength": len(blob)}],
        "buffers": [{"byteLength": len(blob)}],
    }  # fmt: skip
    if container == "glb":
        path = write(tmp_path, "box.glb", glb(doc, blob))
    else:
        doc["buffers"][0]["uri"] = "box.bin"
        write(tmp_path, "box.bin", blob)
        path = write(tmp_path, "box.gltf", doc)
    scene = load_scene(path)
    assert scene.triangle_count == 12
    assert areas(scene) == pytest.approx(np.full(12, 0.5), rel=1e-3)  # none collapsed


def test_quantized_and_sparse_positions_are_read_as_floats(tmp_path: Path) -> None:
    # KHR_mesh_quantization: normalized int16 corners (trimesh would read 32767 for 1.0)
    quantized = (SQUARE[:3] * 32767).astype("<i2")
    blob = np.pad(quantized, ((0, 0), (0, 1))).tobytes()  # each corner padded to 4 bytes
    doc = gltf(SQUARE[:3])
    doc["extensionsUsed"] = doc["extensionsRequired"] = ["KHR_mesh_quantization"]
    doc["bufferViews"][0].update(byteLength=len(blob), byteStride=8)
    doc["accessors"][0].update(componentType=5122, normalized=True)
    doc["buffers"][0].update(byteLength=len(blob), uri=data_uri(blob))
    scene = load_scene(write(tmp_path, "quantized.gltf", doc))
    assert areas(scene).sum() == pytest.approx(0.5, rel=1e-4)
    # sparse: zeros but for the three corners given (trimesh reads the zeros only)
    values = SQUARE[:3].astype("<f4").tobytes()
    indices = np.arange(3, dtype="<u1").tobytes() + b"\0"
    doc = gltf(SQUARE[:3])
    doc["accessors"][0] = {
        "componentType": 5126, "count": 3, "type": "VEC3",
        "sparse": {"count": 3, "indices": {"bufferView": 0, "byteOffset": 36,
                                           "componentType": 5121},
                   "values": {"bufferView": 0}},
    }  # fmt: skip
    doc["bufferViews"][0]["byteLength"] = len(values + indices)
    doc["buffers"][0].update(byteLength=len(values + indices), uri=data_uri(values + indices))
    scene = load_scene(write(tmp_path, "sparse.gltf", doc))
    assert areas(scene).sum() == pytest.approx(0.5)


def test_a_buffer_view_past_its_buffer_is_named(tmp_path: Path) -> None:
    doc = gltf(SQUARE[:3])
    doc["buffers"][0]["byteLength"] = 30  # trimesh: an AssertionError with no message
    message = refusal(write(tmp_path, "short.gltf", doc))
    assert "bufferViews[0] spans bytes 0 to 36 of buffers[0], which is only 30 bytes" in message
    # a .glb whose binary chunk is shorter than its buffer says
    doc = gltf(SQUARE[:3])
    doc["buffers"][0].pop("uri")
    message = refusal(write(tmp_path, "cut.glb", glb(doc, SQUARE[:2].tobytes())))
    assert "buffers[0] holds 24 bytes where the file says 36" in message


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    text = b'{"asset": {"version": "2.0"},\n  "meshes": [,]}'
    message = refusal(write(tmp_path, "broken.gltf", text))
    assert "not valid JSON at line 2 col 14" in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["meshes"][0].update(primitives={"POSITION": 0}),
         "meshes[0].primitives must be an array, not an object"),
        (lambda d: d["accessors"][0].update(count=4), "reads 4 elements up to byte 48"),
        (lambda d: d["nodes"][0].update(children=[0]), "nodes[0] is its own ancestor"),
        (lambda d: d["asset"].update(version="1.0"), "only glTF 2.0 is read"),
        (lambda d: (d.pop("meshes"), d["nodes"][0].pop("mesh")), "holds no meshes"),
    ],
    ids=["not-an-array", "accessor-overflow", "cycle", "gltf-1", "no-meshes"],
)  # fmt: skip
def test_broken_structure_is_named(tmp_path: Path, change: Any, expected: str) -> None:
    doc = gltf(SQUARE[:3])
    change(doc)
    assert expected in refusal(write(tmp_path, "broken.gltf", doc))


def test_a_reader_failure_never_reads_as_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "odd.gltf", gltf(SQUARE[:3]))
    for failure in (AttributeError("'str' object has no attribute 'get'"), AssertionError()):

        def fail(*args: object, failure: Exception = failure, **kwargs: object) -> None:
            raise failure

        monkeypatch.setattr(scene_files.trimesh, "load_scene", fail)
        message = refusal(path)
        assert type(failure).__name__ in message and "not a readable GLTF file" in message


# -- OBJ -----------------------------------------------------------------------------------------


def test_all_zero_area_triangles_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "line.obj", "v 0 0 0\nv 1 1 1\nv 2 2 2\nv 3 3 3\nf 1 2 3\nf 2 3 4\n")
    assert "all 2 triangles have zero area" in refusal(path)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-8-sig"])
def test_obj_in_utf16_or_with_a_bom_loads(tmp_path: Path, encoding: str) -> None:
    text = "# Würfel\nv 0 0 0\nv 1 0 0\nv 1 1 0\nv 0 1 0\nf 1 2 3 4\n"
    data = text.encode(encoding)
    if encoding == "utf-16-be":
        data = b"\xfe\xff" + data  # as exporters write it: with its BOM
    scene = load_scene(write(tmp_path, "square.obj", data))
    assert scene.triangle_count == 2 and areas(scene).sum() == pytest.approx(1.0)


# an L, 2 x 2 less its upper right quarter (area 3), starting at its reflex corner: a fan from
# there would fill the notch and fold over itself
L_SHAPE = [(1, 1), (1, 2), (0, 2), (0, 0), (2, 0), (2, 1)]


def test_a_concave_obj_polygon_is_triangulated_inside_its_outline(tmp_path: Path) -> None:
    tilt = trimesh.transformations.rotation_matrix(0.7, [1, 2, 0])[:3, :3]
    corners = [tilt @ (x, y, 0.0) for x, y in L_SHAPE]  # off the axes: the best-fit plane
    lines = [f"v {x:.9f} {y:.9f} {z:.9f}" for x, y, z in corners]
    path = write(tmp_path, "ell.obj", "\n".join([*lines, "f 1 2 3 4 5 6", ""]))
    scene = load_scene(path)
    assert scene.triangle_count == 4
    assert areas(scene).sum() == pytest.approx(3.0)  # a fan's triangles add up to more
    normal = tilt @ (0.0, 0.0, 1.0)
    assert (face_normals(scene) @ normal > 0.999).all()  # wound as the polygon is
    flat = (scene.positions.astype(np.float64) @ tilt)[:, :, :2]  # back into the plane
    centres = flat.mean(axis=1)
    inside = (centres[:, 1] < 1) | (centres[:, 0] < 1)
    assert inside.all()


@pytest.mark.parametrize("start", range(4))
def test_a_dart_shaped_quad_is_split_along_its_inner_diagonal(start: int) -> None:
    # an arrowhead of area 1 with its reflex corner at (0.5, 0.5), from each corner in turn
    dart = [(0.0, 0.0, 0.0), (2.0, 0.0, 0.0), (0.5, 0.5, 0.0), (0.0, 2.0, 0.0)]
    dart = dart[start:] + dart[:start]
    doubled = [
        float(np.cross(np.subtract(dart[b], dart[a]), np.subtract(dart[c], dart[a]))[2])
        for a, b, c in triangulate_polygon(dart)
    ]
    assert len(doubled) == 2 and min(doubled) > 0  # both inside, wound as the dart is
    assert sum(doubled) / 2 == pytest.approx(1.0)


def test_a_backslash_texture_path_resolves(tmp_path: Path) -> None:
    (tmp_path / "tex").mkdir()
    Image.new("RGB", (4, 4), (255, 0, 0)).save(tmp_path / "tex" / "red.png")
    write(tmp_path, "red.mtl", "newmtl red\nKd 1 1 1\nmap_Kd .\\tex\\red.png\n")
    text = "mtllib red.mtl\nv 0 0 0\nv 1 0 0\nv 0 1 0\nvt 0 0\nvt 1 0\nvt 0 1\nusemtl red\n"
    scene = load_scene(write(tmp_path, "red.obj", text + "f 1/1 2/2 3/3\n"))
    (material,) = scene.materials
    assert material.base_color == pytest.approx((1.0, 0.0, 0.0), abs=0.01)


def test_an_obj_without_material_is_default_grey(tmp_path: Path) -> None:
    # texture coordinates and no .mtl: trimesh's stand-in is a dark placeholder texture
    text = "v 0 0 0\nv 1 0 0\nv 0 1 0\nvt 0 0\nvt 1 0\nvt 0 1\nf 1/1 2/2 3/3\n"
    (material,) = load_scene(write(tmp_path, "bare.obj", text)).materials
    assert material.name == "default" and material.base_color == pytest.approx(GREY)


def test_a_latin1_mtl_keeps_its_colours(tmp_path: Path) -> None:
    write(
        tmp_path,
        "wood.mtl",
        "newmtl Holz\n# Eichenfarbe für Türen\nKd 0.8 0.4 0.1\n".encode("latin-1"),
    )
    text = "mtllib wood.mtl\nusemtl Holz\nv 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 3\n"
    (material,) = load_scene(write(tmp_path, "door.obj", text)).materials
    assert material.base_color == pytest.approx(tuple(srgb_to_linear(np.array([0.8, 0.4, 0.1]))))


def test_relative_obj_indices_count_back_from_the_face(tmp_path: Path) -> None:
    first = "v 0 0 0\nv 1 0 0\nv 0 1 0\nf -3 -2 -1\n"
    second = "v 5 0 0\nv 6 0 0\nv 5 1 0\nf -3 -2 -1\n"
    scene = load_scene(write(tmp_path, "two.obj", first + second))
    assert sorted(scene.positions[:, :, 0].min(axis=1).tolist()) == [0.0, 5.0]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 1 2 9\n", "line 4: a face refers to vertex 9, but the "
                                                "file has only 3 vertices"),
        ("v 0 0 0\nv 1 0 0\nv 0 1 0\nf 0 1 2\n", "vertex 0, but OBJ counts from 1"),
        ("v 0 0 0\nv 1 0 0\nl 1 2\n", "only points/lines"),
        ("# nothing\n", "the file is empty"),
    ],
    ids=["past-the-end", "zero", "lines", "empty"],
)  # fmt: skip
def test_obj_without_drawable_faces_is_refused(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in refusal(write(tmp_path, "bad.obj", text))


def test_a_large_obj_of_quads_loads_quickly(tmp_path: Path) -> None:
    # 200 x 200 quads: the prepass must not make an ordinary export slow to load
    n = 200
    grid = np.stack(np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij"), -1)
    vertices = "\n".join(f"v {x} {y} 0" for x, y in grid.reshape(-1, 2))
    k = np.arange(n * (n + 1)).reshape(n, n + 1)[:, :n].reshape(-1) + 1
    faces = "\n".join(f"f {a} {a + n + 1} {a + n + 2} {a + 1}" for a in k)
    path = write(tmp_path, "grid.obj", vertices + "\n" + faces + "\n")
    started = time.monotonic()
    scene = load_scene(path)
    assert scene.triangle_count == 2 * n * n
    assert areas(scene).sum() == pytest.approx(n * n)
    assert time.monotonic() - started < 20  # about a second here; generous for a busy CI
