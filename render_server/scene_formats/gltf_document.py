"""glTF's bytes: the .glb container, the JSON, buffers and accessors, read and written back.

The prepass hands trimesh one layout whatever the file was: a .glb whose single buffer holds the
file's buffers (a .gltf's .bin and data: URIs alike) and what the prepass added, so that
trimesh never reads a buffer itself and every check here holds for what it reads.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from render_server.scene_formats.errors import SceneError

GLB_MAGIC: Final = b"glTF"
JSON_CHUNK: Final = 0x4E4F534A
BIN_CHUNK: Final = 0x004E4942
FLOAT: Final = 5126
UNSIGNED_INT: Final = 5125
COMPONENT_DTYPES: Final[dict[int, np.dtype[Any]]] = {
    5120: np.dtype("<i1"),
    5121: np.dtype("<u1"),
    5122: np.dtype("<i2"),
    5123: np.dtype("<u2"),
    5125: np.dtype("<u4"),
    5126: np.dtype("<f4"),
}
TYPE_SIZES: Final = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4, "MAT2": 4, "MAT3": 9, "MAT4": 16}
ALIGN: Final = 8  # every component type stays aligned where buffers are joined

ReadFile = Callable[[str], bytes]  # a file beside the model, by the name the model gives


@dataclass
class Document:
    """A parsed glTF: its JSON and its buffers' bytes (empty for a buffer no view uses)."""

    doc: dict[str, Any]
    buffers: list[bytes]
    source: str


def split_container(data: bytes, source: str, kind: str) -> tuple[Any, bytes | None]:
    """The JSON (parsed, not yet checked) and the binary chunk of a .glb or a .gltf's text."""
    if data[:4] == GLB_MAGIC:
        json_bytes, bin_chunk = _glb_chunks(data, source, kind)
        return parse_json(json_bytes, source, kind), bin_chunk
    if kind == "GLB" and not data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        raise SceneError(
            f"{source}: not a readable GLB file: it does not start with the binary glTF header"
        )
    return parse_json(data, source, kind), None


def _glb_chunks(data: bytes, source: str, kind: str) -> tuple[bytes, bytes | None]:
    broken = f"{source}: not a readable {kind} file:"
    if len(data) < 20:
        raise SceneError(f"{broken} it ends inside its header (cut short)")
    _, version, length = struct.unpack_from("<4sII", data)
    if version != 2:
        raise SceneError(
            f"{source}: is a glTF {version}.x binary: only glTF 2.0 is read; export it as glTF 2.0"
        )
    if length > len(data):
        raise SceneError(f"{broken} it says it is {length} bytes long but is {len(data)}")
    chunks: list[tuple[int, bytes]] = []
    offset = 12
    while offset + 8 <= length:  # each pass moves on by at least the 8 bytes of a chunk header
        size, kind_code = struct.unpack_from("<II", data, offset)
        offset += 8
        if offset + size > length:
            raise SceneError(f"{broken} a chunk runs past the end of the file (cut short)")
        chunks.append((kind_code, data[offset : offset + size]))
        offset += size
    if not chunks or chunks[0][0] != JSON_CHUNK:
        raise SceneError(f"{broken} its first chunk is not its JSON")
    binary = next((chunk for code, chunk in chunks[1:] if code == BIN_CHUNK), None)
    return chunks[0][1], binary


def parse_json(data: bytes, source: str, kind: str) -> Any:
    broken = f"{source}: not a readable {kind} file:"
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise SceneError(f"{broken} its JSON is not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SceneError(
            f"{broken} not valid JSON at line {exc.lineno} col {exc.colno} ({exc.msg})"
        ) from None
    except RecursionError:
        raise SceneError(f"{broken} its JSON is nested too deeply") from None


def load_buffers(
    doc: dict[str, Any], bin_chunk: bytes | None, read: ReadFile, source: str
) -> list[bytes]:
    """Each buffer's bytes, read only where a bufferView uses it; SceneError for one that is
    missing or shorter than the file says (`check_document` checked the views against it)."""
    used = {view["buffer"] for view in doc.get("bufferViews", [])}
    out: list[bytes] = []
    for index, buffer in enumerate(doc.get("buffers", [])):
        data = _buffer_bytes(index, buffer, bin_chunk, read, source) if index in used else b""
        if index in used and len(data) < buffer["byteLength"]:
            raise SceneError(
                f"{source}: buffers[{index}] holds {len(data)} bytes where the file says "
                f"{buffer['byteLength']}: {_buffer_name(index, buffer)} is cut short or belongs "
                "to another export"
            )
        out.append(data)
    return out


def _buffer_name(index: int, buffer: dict[str, Any]) -> str:
    uri = buffer.get("uri")
    if uri is None:
        return "the .glb's binary chunk"
    return "its embedded data" if uri.startswith("data:") else repr(uri)


def _buffer_bytes(
    index: int, buffer: dict[str, Any], bin_chunk: bytes | None, read: ReadFile, source: str
) -> bytes:
    uri = buffer.get("uri")
    if uri is None:
        if index == 0 and bin_chunk is not None:
            return bin_chunk
        raise SceneError(
            f"{source}: buffers[{index}] names no file and is not a .glb's binary chunk: the "
            "file is damaged"
        )
    if uri.startswith("data:"):
        return decode_data_uri(uri, f"{source}: buffers[{index}]")
    try:
        return read(uri)
    except SceneError:
        raise
    except (OSError, ValueError):
        raise SceneError(
            f"{source}: needs the file {uri[:100]!r} beside it, which is missing: upload the "
            ".gltf with its .bin and textures as a .zip, or export a single .glb"
        ) from None


def decode_data_uri(uri: str, where: str) -> bytes:
    head, comma, payload = uri.partition(",")
    if not comma or not head.endswith(";base64"):
        raise SceneError(f"{where}: its data: URI is not base64 data")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise SceneError(f"{where}: its data: URI holds broken base64") from None


def view_bytes(document: Document, view_index: int) -> bytes:
    view = document.doc["bufferViews"][view_index]
    start: int = view.get("byteOffset", 0)
    end: int = start + view["byteLength"]
    data: bytes = document.buffers[view["buffer"]]
    return data[start:end]


def read_accessor(document: Document, index: int) -> np.ndarray:
    """An accessor's values, (count, components) in its component type, sparse ones applied."""
    accessor = document.doc["accessors"][index]
    dtype = COMPONENT_DTYPES[accessor["componentType"]]
    width = TYPE_SIZES[accessor["type"]]
    count = accessor["count"]
    if "bufferView" in accessor:
        values = _strided(document, accessor, count, dtype, width)
    else:
        values = np.zeros((count, width), dtype)  # the spec's zeros, before sparse values
    sparse = accessor.get("sparse")
    if isinstance(sparse, dict):
        indices = sparse["indices"]
        index_type = COMPONENT_DTYPES[indices["componentType"]]
        rows = _strided(document, indices, sparse["count"], index_type, 1)[:, 0].astype(np.int64)
        replaced = _strided(document, sparse["values"], sparse["count"], dtype, width)
        if len(rows) and (rows.min() < 0 or rows.max() >= count):
            raise SceneError(
                f"{document.source}: accessors[{index}] has sparse values for elements it does "
                "not have: the file is damaged"
            )
        values[rows] = replaced
    return values


def _strided(
    document: Document, part: dict[str, Any], count: int, dtype: np.dtype[Any], width: int
) -> np.ndarray:
    """`count` elements of `width` components read where `part` (an accessor or one of a
    sparse accessor's parts) points: its bufferView, from its byteOffset."""
    view_index, offset = part["bufferView"], part.get("byteOffset", 0)
    raw = view_bytes(document, view_index)
    element = dtype.itemsize * width
    stride = document.doc["bufferViews"][view_index].get("byteStride") or element
    span = (count - 1) * stride + element if count else 0
    block = np.frombuffer(raw, np.uint8, count=span, offset=offset)
    rows = np.lib.stride_tricks.as_strided(block, (count, element), (stride, 1))
    return np.ascontiguousarray(rows).view(dtype).reshape(count, width)


def add_accessor(
    document: Document, values: np.ndarray, component_type: int, kind: str, normalized: bool = False
) -> int:
    """A new accessor over `values` in a buffer of its own; its index."""
    data = np.ascontiguousarray(values, dtype=COMPONENT_DTYPES[component_type])
    doc = document.doc
    document.buffers.append(data.tobytes())
    doc.setdefault("buffers", []).append({"byteLength": data.nbytes})
    doc.setdefault("bufferViews", []).append(
        {"buffer": len(doc["buffers"]) - 1, "byteLength": data.nbytes}
    )
    accessor: dict[str, Any] = {
        "bufferView": len(doc["bufferViews"]) - 1,
        "componentType": component_type,
        "type": kind,
        "count": len(data),  # values are (count,) or (count, components)
    }
    if normalized:
        accessor["normalized"] = True
    doc.setdefault("accessors", []).append(accessor)
    return len(doc["accessors"]) - 1


def pack_glb(document: Document) -> bytes:
    """The document as one .glb whose only buffer holds every buffer in use, in order."""
    doc = document.doc
    starts: list[int] = []
    parts: list[bytes] = []
    size = 0
    for data in document.buffers:
        starts.append(size)
        parts.append(data)
        size += len(data)
        pad = -size % ALIGN
        parts.append(b"\0" * pad)
        size += pad
    for view in doc.get("bufferViews", []):
        view["byteOffset"] = starts[view["buffer"]] + view.get("byteOffset", 0)
        view["buffer"] = 0
    binary = b"".join(parts)
    if binary:
        doc["buffers"] = [{"byteLength": len(binary)}]
    else:
        doc.pop("buffers", None)
    text = json.dumps(doc, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 4)
    binary += b"\0" * (-len(binary) % 4)
    chunks = struct.pack("<II", len(text), JSON_CHUNK) + text
    if binary:
        chunks += struct.pack("<II", len(binary), BIN_CHUNK) + binary
    return struct.pack("<4sII", GLB_MAGIC, 2, 12 + len(chunks)) + chunks
