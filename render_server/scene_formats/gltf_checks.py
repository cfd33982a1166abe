"""The structure of a glTF document, checked before anything reads it.

trimesh trusts the JSON: a string where an object belongs or a view past its buffer's end
surfaces as "'str' object has no attribute 'get'" or an AssertionError without a message. Every
index and byte range the prepass and trimesh follow is checked here, and a broken one named.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

from render_server.scene_formats.errors import SceneError
from render_server.scene_formats.gltf_document import COMPONENT_DTYPES, TYPE_SIZES

ARRAYS: Final = (
    "accessors", "animations", "buffers", "bufferViews", "cameras", "images", "materials",
    "meshes", "nodes", "samplers", "scenes", "skins", "textures",
)  # fmt: skip
INDEX_TYPES: Final = (5121, 5123, 5125)
TRANSFORM_SIZES: Final = {"matrix": 16, "translation": 3, "rotation": 4, "scale": 3}
TRIANGLES: Final = 4


class _Checker:
    def __init__(self, doc: dict[str, Any], source: str) -> None:
        self.doc = doc
        self.source = source

    def fail(self, where: str, problem: str) -> NoReturn:
        raise SceneError(f"{self.source}: the glTF is malformed: {where} {problem}")

    def items(self, key: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.doc.get(key, [])
        return items

    def index(self, where: str, value: Any, key: str) -> int:
        """`value` as an index into the top-level array `key`."""
        if type(value) is not int or not 0 <= value < len(self.items(key)):
            count = len(self.items(key))
            shown = "missing" if value is None else repr(value)
            self.fail(where, f"is {shown}, not one of the file's {count} {key}")
        return value

    def whole(self, where: str, value: Any, low: int = 0) -> int:
        if type(value) is not int or value < low:
            self.fail(where, f"must be a whole number of at least {low}, not {value!r}")
        return value

    def dict_at(self, where: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, f"must be an object, not {_kind(value)}")
        return value

    def list_at(self, where: str, value: Any) -> list[Any]:
        if not isinstance(value, list):
            self.fail(where, f"must be an array, not {_kind(value)}")
        return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "true/false"}.get(
        type(value), "a number" if isinstance(value, int | float) else "null"
    )


def check_document(doc: Any, source: str) -> None:
    """SceneError naming the first structural fault of `doc` (a parsed glTF JSON)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("asset"), dict):
        raise SceneError(f"{source}: not a glTF file: its JSON has no `asset` object")
    version = str(doc["asset"].get("version", ""))
    if not version.startswith("2."):
        raise SceneError(
            f"{source}: is glTF {version or 'of no version'}: only glTF 2.0 is read; export it "
            "as glTF 2.0"
        )
    check = _Checker(doc, source)
    for key in ARRAYS:
        for i, item in enumerate(check.list_at(key, doc.get(key, []))):
            check.dict_at(f"{key}[{i}]", item)
    _check_buffers(check)
    _check_accessors(check)
    _check_meshes(check)
    _check_nodes(check)
    _check_materials(check)


def _check_buffers(check: _Checker) -> None:
    for i, buffer in enumerate(check.items("buffers")):
        check.whole(f"buffers[{i}].byteLength", buffer.get("byteLength"))
        if "uri" in buffer and not isinstance(buffer["uri"], str):
            check.fail(f"buffers[{i}].uri", "must be a string")
    for i, view in enumerate(check.items("bufferViews")):
        where = f"bufferViews[{i}]"
        owner = check.index(f"{where}.buffer", view.get("buffer"), "buffers")
        start = check.whole(f"{where}.byteOffset", view.get("byteOffset", 0))
        length = check.whole(f"{where}.byteLength", view.get("byteLength"), 1)
        stride = view.get("byteStride")
        if stride is not None and (type(stride) is not int or not 4 <= stride <= 252):
            check.fail(f"{where}.byteStride", f"must be 4 to 252, not {stride!r}")
        size = check.items("buffers")[owner]["byteLength"]
        if start + length > size:
            check.fail(
                where,
                f"spans bytes {start} to {start + length} of buffers[{owner}], which is only "
                f"{size} bytes long: the file is damaged or its .bin belongs to another export",
            )
    for i, image in enumerate(check.items("images")):
        if "bufferView" in image:
            check.index(f"images[{i}].bufferView", image["bufferView"], "bufferViews")
        elif not isinstance(image.get("uri"), str):
            check.fail(f"images[{i}]", "has neither a uri nor a bufferView")


def _check_accessors(check: _Checker) -> None:
    for i, accessor in enumerate(check.items("accessors")):
        where = f"accessors[{i}]"
        component = accessor.get("componentType")
        if component not in COMPONENT_DTYPES:
            check.fail(f"{where}.componentType", f"is {component!r}, no glTF component type")
        kind = accessor.get("type")
        if kind not in TYPE_SIZES:
            check.fail(f"{where}.type", f"is {kind!r}, not one of {', '.join(TYPE_SIZES)}")
        count = check.whole(f"{where}.count", accessor.get("count"), 1)
        element = COMPONENT_DTYPES[component].itemsize * TYPE_SIZES[kind]
        if "bufferView" in accessor:
            _check_fits(check, where, accessor, accessor["bufferView"], count, element)
        sparse = accessor.get("sparse")
        if sparse is not None:
            part = check.dict_at(f"{where}.sparse", sparse)
            _check_sparse(check, f"{where}.sparse", part, element)


def _check_fits(
    check: _Checker, where: str, part: dict[str, Any], view_ref: Any, count: int, element: int
) -> None:
    """The `count` elements of `element` bytes that `part` reads lie inside its bufferView."""
    view_index = check.index(f"{where}.bufferView", view_ref, "bufferViews")
    view = check.items("bufferViews")[view_index]
    offset = check.whole(f"{where}.byteOffset", part.get("byteOffset", 0))
    stride = view.get("byteStride") or element
    end = offset + (count - 1) * stride + element
    if end > view["byteLength"]:
        check.fail(
            where,
            f"reads {count} elements up to byte {end} of bufferViews[{view_index}], which is "
            f"only {view['byteLength']} bytes long: the file is damaged",
        )


def _check_sparse(check: _Checker, where: str, sparse: dict[str, Any], element: int) -> None:
    count = check.whole(f"{where}.count", sparse.get("count"), 1)
    indices = check.dict_at(f"{where}.indices", sparse.get("indices"))
    if indices.get("componentType") not in INDEX_TYPES:
        check.fail(f"{where}.indices.componentType", "must be an unsigned integer type")
    size = COMPONENT_DTYPES[indices["componentType"]].itemsize
    _check_fits(check, f"{where}.indices", indices, indices.get("bufferView"), count, size)
    values = check.dict_at(f"{where}.values", sparse.get("values"))
    _check_fits(check, f"{where}.values", values, values.get("bufferView"), count, element)


def _check_meshes(check: _Checker) -> None:
    for m, mesh in enumerate(check.items("meshes")):
        primitives = check.list_at(f"meshes[{m}].primitives", mesh.get("primitives"))
        if not primitives:
            check.fail(f"meshes[{m}]", "has no primitives: a mesh needs at least one")
        for p, primitive in enumerate(primitives):
            where = f"meshes[{m}].primitives[{p}]"
            _check_primitive(check, where, check.dict_at(where, primitive))


def _check_primitive(check: _Checker, where: str, primitive: dict[str, Any]) -> None:
    attributes = check.dict_at(f"{where}.attributes", primitive.get("attributes"))
    for name, ref in attributes.items():
        check.index(f"{where}.attributes.{name}", ref, "accessors")
    if "POSITION" not in attributes:
        check.fail(where, "has no POSITION attribute: it has no vertices")
    accessors = check.items("accessors")
    if accessors[attributes["POSITION"]]["type"] != "VEC3":
        check.fail(f"{where}.attributes.POSITION", "must be VEC3 (x, y, z)")
    mode = primitive.get("mode", TRIANGLES)
    if type(mode) is not int or not 0 <= mode <= 6:
        check.fail(f"{where}.mode", f"is {mode!r}, no glTF primitive mode (0 to 6)")
    if "indices" in primitive:
        indices = accessors[check.index(f"{where}.indices", primitive["indices"], "accessors")]
        if indices["type"] != "SCALAR" or indices["componentType"] not in INDEX_TYPES:
            check.fail(f"{where}.indices", "must be unsigned integers (SCALAR)")
        drawn = indices["count"]
    else:
        drawn = accessors[attributes["POSITION"]]["count"]
    if mode == TRIANGLES and drawn % 3 and not _draco(primitive):
        check.fail(where, f"draws triangles from {drawn} corners, which is no multiple of 3")
    if "material" in primitive:
        check.index(f"{where}.material", primitive["material"], "materials")
    if "extensions" in primitive:
        check.dict_at(f"{where}.extensions", primitive["extensions"])


def _draco(primitive: dict[str, Any]) -> bool:
    # a Draco primitive's accessors describe the decoded data, which the prepass checks itself
    extensions = primitive.get("extensions")
    return isinstance(extensions, dict) and "KHR_draco_mesh_compression" in extensions


def _check_nodes(check: _Checker) -> None:
    for i, node in enumerate(check.items("nodes")):
        if "mesh" in node:
            check.index(f"nodes[{i}].mesh", node["mesh"], "meshes")
        for c, child in enumerate(check.list_at(f"nodes[{i}].children", node.get("children", []))):
            check.index(f"nodes[{i}].children[{c}]", child, "nodes")
        for key, size in TRANSFORM_SIZES.items():
            if key in node:
                values = check.list_at(f"nodes[{i}].{key}", node[key])
                if len(values) != size or not all(_number(v) for v in values):
                    check.fail(f"nodes[{i}].{key}", f"must be {size} numbers")
        if "matrix" in node and node["matrix"][3::4] != [0, 0, 0, 1]:
            check.fail(f"nodes[{i}].matrix", "is no placement (its last row must be 0 0 0 1)")
    _check_no_cycle(check)
    for i, scene in enumerate(check.items("scenes")):
        for n, node in enumerate(check.list_at(f"scenes[{i}].nodes", scene.get("nodes", []))):
            check.index(f"scenes[{i}].nodes[{n}]", node, "nodes")
    if "scene" in check.doc:
        check.index("scene", check.doc["scene"], "scenes")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_no_cycle(check: _Checker) -> None:
    """A node may not be its own ancestor: a reader walking the tree would never finish."""
    nodes = check.items("nodes")
    state = [0] * len(nodes)  # 0 unseen, 1 on the current path, 2 done
    for root in range(len(nodes)):
        if state[root]:
            continue
        stack: list[tuple[int, int]] = [(root, 0)]  # node, next child to visit
        state[root] = 1
        while stack:
            node, at = stack[-1]
            children = nodes[node].get("children", [])
            if at == len(children):
                state[node] = 2
                stack.pop()
                continue
            stack[-1] = (node, at + 1)
            child = children[at]
            if state[child] == 1:
                check.fail(f"nodes[{child}]", "is its own ancestor (the node tree has a cycle)")
            if state[child] == 0:
                state[child] = 1
                stack.append((child, 0))


def _check_materials(check: _Checker) -> None:
    for i, material in enumerate(check.items("materials")):
        where = f"materials[{i}]"
        pbr = check.dict_at(
            f"{where}.pbrMetallicRoughness", material.get("pbrMetallicRoughness", {})
        )
        factor = pbr.get("baseColorFactor", [1, 1, 1, 1])
        if not isinstance(factor, list) or len(factor) != 4 or not all(map(_number, factor)):
            check.fail(f"{where}.pbrMetallicRoughness.baseColorFactor", "must be 4 numbers")
        for key in ("metallicFactor", "roughnessFactor"):
            if key in pbr and not _number(pbr[key]):
                check.fail(f"{where}.pbrMetallicRoughness.{key}", "must be a number")
        if "extensions" in material:
            check.dict_at(f"{where}.extensions", material["extensions"])
    # a broken texture reference costs a texture, not the model: the prepass drops it
