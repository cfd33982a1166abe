"""glTF as designers' tools export it, made into what trimesh reads right, or refused by name.

trimesh drops triangle fans, reads Draco only where its version and DracoPy allow, turns
specular-glossiness materials dark and fully metallic, ignores `extensionsRequired`, and fails
on broken files with Python's own words. `prepare_gltf` runs before it: it checks the structure
(`gltf_checks`), decodes Draco into plain accessors, rewrites fans and strips as triangle lists,
gives spec-gloss materials a metallic-roughness equivalent, refuses extensions it cannot honour,
and hands trimesh a single .glb (`gltf_document.pack_glb`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import DracoPy
import numpy as np

from render_server.scene_formats.errors import SceneError
from render_server.scene_formats.gltf_checks import check_document
from render_server.scene_formats.gltf_document import (
    COMPONENT_DTYPES,
    FLOAT,
    TYPE_SIZES,
    UNSIGNED_INT,
    Document,
    ReadFile,
    add_accessor,
    load_buffers,
    pack_glb,
    read_accessor,
    split_container,
    view_bytes,
)

DRACO: Final = "KHR_draco_mesh_compression"
SPEC_GLOSS: Final = "KHR_materials_pbrSpecularGlossiness"
QUANTIZATION: Final = "KHR_mesh_quantization"
HANDLED: Final = frozenset({DRACO, SPEC_GLOSS, QUANTIZATION})  # rewritten away here
# what trimesh reads itself, or what changes nothing in a picture drawn without textures
HARMLESS: Final = frozenset({
    "KHR_texture_transform", "KHR_materials_emissive_strength", "KHR_materials_unlit",
    "KHR_materials_clearcoat", "KHR_materials_sheen", "KHR_materials_specular",
    "KHR_materials_ior", "KHR_materials_transmission", "KHR_materials_volume",
    "KHR_materials_iridescence", "KHR_materials_anisotropy", "KHR_materials_dispersion",
    "KHR_materials_diffuse_transmission", "KHR_materials_variants", "KHR_lights_punctual",
    "KHR_texture_basisu", "EXT_texture_webp", "EXT_texture_avif", "KHR_xmp_json_ld",
    "KHR_animation_pointer",
})  # fmt: skip
MATERIAL_TEXTURES: Final = ("normalTexture", "occlusionTexture", "emissiveTexture")
PBR_TEXTURES: Final = ("baseColorTexture", "metallicRoughnessTexture")
# what trimesh reads of a material besides colours and textures, by the type it must have
MATERIAL_FIELDS: Final = {"name": str, "doubleSided": bool, "alphaMode": str, "alphaCutoff": float}
NAMED: Final = ("meshes", "nodes", "scenes", "images", "textures")  # name the scene's parts
POINTS_AND_LINES: Final = (0, 1, 2, 3)
TRIANGLES, STRIP, FAN = 4, 5, 6
NORMALIZED_SCALE: Final = {5120: 127.0, 5121: 255.0, 5122: 32767.0, 5123: 65535.0}


def prepare_gltf(data: bytes, source: str, binary: bool, read: ReadFile) -> bytes:
    """The .gltf or .glb `data` as a .glb that trimesh reads right; SceneError naming the file
    (`source`) and the cause for one that cannot be drawn. `binary`: the file is named .glb;
    `read` reads the files beside it (buffers; textures are trimesh's to read)."""
    doc, bin_chunk = split_container(data, source, "GLB" if binary else "GLTF")
    check_document(doc, source)
    _refuse_unknown_extensions(doc, source)
    if not doc.get("meshes"):
        raise SceneError(f"{source}: the file holds no meshes: nothing to draw")
    document = Document(doc, load_buffers(doc, bin_chunk, read, source), source)
    for where, primitive in _primitives(doc):
        if DRACO in primitive.get("extensions", {}):
            _decode_draco(document, where, primitive)
        _float_vertices(document, primitive)
        if primitive.get("mode", TRIANGLES) in (STRIP, FAN):
            _as_triangle_list(document, primitive)
    if all(p.get("mode", TRIANGLES) in POINTS_AND_LINES for _, p in _primitives(doc)):
        raise SceneError(
            f"{source}: the file holds only points/lines, no triangles to draw: export the "
            "model's surfaces (faces)"
        )
    for material in doc.get("materials", []):
        _metallic_roughness_fallback(doc, material)
        _drop_broken_textures(doc, material)
        _drop_malformed(material, MATERIAL_FIELDS)
    for key in NAMED:
        for item in doc.get(key, []):
            _drop_malformed(item, {"name": str})
    _forget_extensions(doc, HANDLED)
    return pack_glb(document)


def _primitives(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for m, mesh in enumerate(doc.get("meshes", [])):
        for p, primitive in enumerate(mesh["primitives"]):
            yield f"meshes[{m}].primitives[{p}]", primitive


def _refuse_unknown_extensions(doc: dict[str, Any], source: str) -> None:
    required = doc.get("extensionsRequired", [])
    if not isinstance(required, list) or not all(isinstance(e, str) for e in required):
        raise SceneError(f"{source}: the glTF is malformed: extensionsRequired must be names")
    unknown = sorted(set(required) - HANDLED - HARMLESS)
    if unknown:
        names = " and ".join(unknown)
        plural = "s" if len(unknown) > 1 else ""
        raise SceneError(
            f"{source}: needs the glTF extension{plural} {names}, which this server cannot "
            "read; export without it"
        )


def _decode_draco(document: Document, where: str, primitive: dict[str, Any]) -> None:
    """The primitive's Draco blob decoded into plain accessors that replace the compressed
    ones (whose accessors describe the decoded data and point at nothing)."""
    source = document.source
    extension = primitive["extensions"].pop(DRACO)
    if not isinstance(extension, dict):
        raise SceneError(f"{source}: {where}: its Draco extension is not an object: damaged")
    view = extension.get("bufferView")
    ids = extension.get("attributes")
    if type(view) is not int or not 0 <= view < len(document.doc.get("bufferViews", [])):
        raise SceneError(f"{source}: {where}: its Draco data names no bufferView of the file")
    if not isinstance(ids, dict):
        raise SceneError(f"{source}: {where}: its Draco extension lists no attributes")
    try:
        decoded = DracoPy.decode(view_bytes(document, view))
    except Exception as exc:  # DracoPy raises its own types and ValueError for broken blobs
        raise SceneError(
            f"{source}: {where}: its Draco-compressed data cannot be decoded "
            f"({type(exc).__name__}): the file is damaged"
        ) from None
    accessors = document.doc["accessors"]
    for name, ref in primitive["attributes"].items():
        if name not in ids:
            continue
        attribute = decoded.get_attribute_by_unique_id(ids[name])
        if attribute is None:
            raise SceneError(f"{source}: {where}: its Draco data lacks the {name} attribute")
        declared = accessors[ref]
        values = np.asarray(attribute["data"]).reshape(len(attribute["data"]), -1)
        if values.shape[1] != TYPE_SIZES[declared["type"]]:
            raise SceneError(
                f"{source}: {where}: Draco decoded {values.shape[1]} values per vertex for "
                f"{name}, where its accessor says {declared['type']}: the file is damaged"
            )
        values = values.astype(COMPONENT_DTYPES[declared["componentType"]])
        normalized = bool(declared.get("normalized"))
        primitive["attributes"][name] = add_accessor(
            document, values, declared["componentType"], declared["type"], normalized
        )
    faces = getattr(decoded, "faces", None)
    if faces is not None and len(faces):
        corners = np.asarray(faces, dtype=np.uint32).reshape(-1)
        primitive["indices"] = add_accessor(document, corners, UNSIGNED_INT, "SCALAR")
    else:
        primitive.pop("indices", None)  # a point cloud


def _float_vertices(document: Document, primitive: dict[str, Any]) -> None:
    """Positions and normals as plain floats: trimesh reads neither the integers of
    KHR_mesh_quantization as normalized nor sparse accessors at all."""
    accessors = document.doc["accessors"]
    for name in ("POSITION", "NORMAL"):
        ref = primitive["attributes"].get(name)
        if ref is None:
            continue
        accessor = accessors[ref]
        if accessor["componentType"] == FLOAT and "sparse" not in accessor:
            continue
        values = read_accessor(document, ref).astype(np.float32)
        if accessor.get("normalized") and accessor["componentType"] in NORMALIZED_SCALE:
            values = np.maximum(values / NORMALIZED_SCALE[accessor["componentType"]], -1.0)
        primitive["attributes"][name] = add_accessor(document, values, FLOAT, accessor["type"])


def _as_triangle_list(document: Document, primitive: dict[str, Any]) -> None:
    """A strip or fan rewritten as a triangle list over the same vertices (trimesh drops fans
    and winds strips its own way); the glTF spec's corner order keeps each triangle's front."""
    if "indices" in primitive:
        corners = read_accessor(document, primitive["indices"])[:, 0].astype(np.int64)
    else:
        count = document.doc["accessors"][primitive["attributes"]["POSITION"]]["count"]
        corners = np.arange(count, dtype=np.int64)
    i = np.arange(max(len(corners) - 2, 0))
    if primitive["mode"] == STRIP:
        odd = i % 2 == 1
        first, second = np.where(odd, i + 2, i + 1), np.where(odd, i + 1, i + 2)
        triangles = np.stack([corners[i], corners[first], corners[second]], axis=1)
    else:
        triangles = np.stack([corners[i + 1], corners[i + 2], np.full_like(i, corners[0])], axis=1)
    if not len(triangles):
        primitive["mode"] = 0  # fewer than three corners: nothing to fill, as points
        primitive.pop("indices", None)
        return
    flat = triangles.reshape(-1).astype(np.uint32)
    primitive["indices"] = add_accessor(document, flat, UNSIGNED_INT, "SCALAR")
    primitive["mode"] = TRIANGLES


def _metallic_roughness_fallback(doc: dict[str, Any], material: dict[str, Any]) -> None:
    """A spec-gloss material read as metallic-roughness: its diffuse colour as base colour, not
    metallic, rough where it is not glossy. trimesh's own conversion makes it dark and metallic,
    so the extension goes either way (a material with both keeps its metallic-roughness)."""
    extensions = material.get("extensions", {})
    gloss = extensions.pop(SPEC_GLOSS, None)
    if gloss is None or "pbrMetallicRoughness" in material:
        return
    gloss = gloss if isinstance(gloss, dict) else {}
    diffuse = gloss.get("diffuseFactor")
    if not (isinstance(diffuse, list) and len(diffuse) == 4 and all(map(_number, diffuse))):
        diffuse = [1.0, 1.0, 1.0, 1.0]  # the extension's default
    glossiness = gloss.get("glossinessFactor", 1.0)
    if not _number(glossiness):
        glossiness = 1.0
    fallback: dict[str, Any] = {
        "baseColorFactor": diffuse,
        "metallicFactor": 0.0,
        "roughnessFactor": float(np.clip(1.0 - glossiness, 0.0, 1.0)),
    }
    texture = gloss.get("diffuseTexture")
    if isinstance(texture, dict) and _is_texture(doc, texture.get("index")):
        fallback["baseColorTexture"] = texture
    material["pbrMetallicRoughness"] = fallback


def _drop_broken_textures(doc: dict[str, Any], material: dict[str, Any]) -> None:
    """References to no texture dropped: trimesh would take index -1 as the last texture."""
    pbr = material.get("pbrMetallicRoughness", {})
    for holder, keys in ((pbr, PBR_TEXTURES), (material, MATERIAL_TEXTURES)):
        for key in keys:
            ref = holder.get(key)
            if ref is not None and not (
                isinstance(ref, dict) and _is_texture(doc, ref.get("index"))
            ):
                del holder[key]


def _drop_malformed(item: dict[str, Any], fields: dict[str, type]) -> None:
    """Fields of the wrong type dropped: a cosmetic slip (a name that is a number) costs the
    field, not the model, and never reaches trimesh as an array it cannot hash."""
    for key, kind in fields.items():
        value = item.get(key)
        if value is None:
            continue
        if kind is float and _number(value):
            continue
        if type(value) is not kind:
            del item[key]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_texture(doc: dict[str, Any], value: Any) -> bool:
    return type(value) is int and 0 <= value < len(doc.get("textures", []))


def _forget_extensions(doc: dict[str, Any], names: frozenset[str]) -> None:
    for key in ("extensionsUsed", "extensionsRequired"):
        listed = doc.get(key)
        if isinstance(listed, list):
            kept = [name for name in listed if name not in names]
            if kept:
                doc[key] = kept
            else:
                doc.pop(key)
