"""What an uploaded file is, told from its bytes (never its name), and archives unpacked safely.

Designers upload what their tool exported, or what they thought it exported: a .glb that is a
PNG, a zip of a whole project folder. `check_upload` answers the file's kind or a `SceneError`
that says, in a designer's words, what the file is and what to upload instead; `NotAModel` (a
SceneError) marks a file that is no 3D model at all (an image, a document). It runs where a file
arrives (signaling) and again where a worker loads it: a worker trusts no earlier check.

A .zip is hostile until shown otherwise: its names may point outside the folder it unpacks to,
its entries may be links, encrypted, or expand a thousandfold. `check_archive` reads its table of
contents (bounded first from the end record, so that a forged table cannot make `zipfile` read
millions of entries); `unpack_archive` counts the bytes it really writes.
"""

from __future__ import annotations

import json
import re
import stat
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any, Final

from render_server.scene_formats.errors import SceneError

UPLOAD_HINT: Final = "upload .glb, .gltf+resources as .zip, or .obj+.mtl as .zip"
MODEL_SUFFIXES: Final = (".glb", ".gltf", ".obj")
MAX_ENTRIES: Final = 512
MAX_RATIO: Final = 200
# smaller entries cannot make a bomb, and a short repetitive .mtl may well compress that far
RATIO_FLOOR: Final = 64 * 1024
MAX_DIRECTORY_BYTES: Final = 4 * 1024 * 1024  # a zip's table of contents: 512 entries, long names
MAX_JSON_BYTES: Final = 64 * 1024 * 1024  # a glTF's JSON (embedded buffers included)
HEAD_BYTES: Final = 64 * 1024  # what the sniffing reads
OBJ_LINES_CHECKED: Final = 20
COPY_CHUNK: Final = 1024 * 1024
# OBJ's statements (the ones exporters write first, and the rarer geometry ones)
OBJ_STATEMENTS: Final = frozenset(
    "v vn vt vp f l p o g s mtllib usemtl cstype deg bmat step curv curv2 surf parm trim hole "
    "scrv sp end con mg lod usemap maplib bevel c_interp d_interp shadow_obj trace_obj ctech "
    "stech call csh".split()
)
_ZIP_METHODS: Final = (
    zipfile.ZIP_STORED,
    zipfile.ZIP_DEFLATED,
    zipfile.ZIP_BZIP2,
    zipfile.ZIP_LZMA,
)
_EOCD: Final = b"PK\x05\x06"
_EOCD_SIZE: Final = 22


class NotAModel(SceneError):
    """A file that is no 3D model at all (an image, a document, a program)."""


# (magic at offset 0, what it is, whether it is a 3D format this server does not read)
_FOREIGN: Final[tuple[tuple[bytes, str, bool], ...]] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image", False),
    (b"\xff\xd8\xff", "a JPEG image", False),
    (b"GIF8", "a GIF image", False),
    (b"II*\x00", "a TIFF image", False),
    (b"MM\x00*", "a TIFF image", False),
    (b"%PDF", "a PDF document", False),
    (b"\xd0\xcf\x11\xe0", "an Office document", False),
    (b"\x1f\x8b", "a gzip archive", False),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", False),
    (b"Rar!", "a RAR archive", False),
    (b"\x7fELF", "a program", False),
    (b"MZ", "a Windows program", False),
    (b"ID3", "an MP3 file", False),
    (b"Kaydara FBX Binary", "an FBX file", True),
    (b"BLENDER", "a Blender file", True),
)


def _not_a_model(what: str, three_d: bool = False) -> NotAModel:
    if three_d:
        return NotAModel(
            f"this is {what}, which this server does not read: export it as glTF 2.0 (.glb) or "
            f"OBJ, then {UPLOAD_HINT}"
        )
    return NotAModel(f"this is {what}, not a 3D model: {UPLOAD_HINT}")


def check_upload(path: Path, max_bytes: int) -> str:
    """The kind of the model file at `path`: "glb", "gltf", "obj" or "zip" (a safe archive that
    holds exactly one model); SceneError (NotAModel for no model at all) otherwise."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as exc:
        raise SceneError(f"the file cannot be read: {exc.strerror or exc}") from None
    if size == 0:
        raise SceneError(f"the file is empty: {UPLOAD_HINT}")
    if size > max_bytes:
        raise SceneError(f"the file is {size} bytes: over the limit of {max_bytes} bytes")
    if head.startswith(b"glTF"):
        _check_glb(path, size)
        return "glb"
    if head.startswith((b"PK\x03\x04", _EOCD)):
        check_archive(path, max_bytes)
        return "zip"
    for magic, what, three_d in _FOREIGN:
        if head.startswith(magic):
            raise _not_a_model(what, three_d)
    if head[4:8] == b"ftyp":
        raise _not_a_model("a video (MP4/MOV) or a HEIC photo")
    if head.startswith(b"RIFF"):
        raise _not_a_model("a WebP image" if head[8:12] == b"WEBP" else "an audio or video file")
    kind = _sniff_text(head, complete=size <= len(head))
    if kind == "gltf":
        if size > MAX_JSON_BYTES:
            raise SceneError(
                f"this .gltf is {size} bytes: over the {MAX_JSON_BYTES} a .gltf may be; export "
                "it as binary glTF (.glb), which is smaller"
            )
        _check_gltf_json(path.read_bytes(), "this .gltf", glb=False)
    return kind


def _sniff_text(head: bytes, complete: bool) -> str:
    """ "gltf" for what starts as a JSON object, "obj" for OBJ statements; NotAModel else."""
    if b"\x00" in head:
        raise _not_a_model("binary data of an unknown kind")
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if text.startswith("{"):
        return "gltf"
    lowered = text[:64].lower()
    if lowered.startswith("<"):
        raise _not_a_model("an HTML or XML document (a COLLADA .dae?)")
    if lowered.startswith("solid"):
        raise _not_a_model("an STL file", three_d=True)
    if lowered.startswith("ply"):
        raise _not_a_model("a PLY file", three_d=True)
    lines = text.splitlines()
    if not complete and lines:
        lines.pop()  # cut off where the sniffing stopped reading
    statements = 0
    for number, line in enumerate(lines, 1):
        words = line.split(None, 1)
        if not words or words[0].startswith("#"):
            continue
        if words[0] not in OBJ_STATEMENTS:
            shown = line.strip()[:40]
            raise NotAModel(
                f"this is text, not a 3D model: line {number} ({shown!r}) is no OBJ statement "
                f"(v, vn, vt, f, o, g, mtllib, usemtl, s, #); {UPLOAD_HINT}"
            )
        statements += 1
        if statements >= OBJ_LINES_CHECKED:
            break
    if statements == 0:
        raise NotAModel(
            f"this is text without a single OBJ statement, not a 3D model; {UPLOAD_HINT}"
        )
    return "obj"


def _check_glb(path: Path, size: int) -> None:
    with path.open("rb") as f:
        header = f.read(20)
        if len(header) < 12:
            raise SceneError("this .glb is cut short: it ends inside its header; export it again")
        _, version, length = struct.unpack_from("<4sII", header)
        if version != 2:
            raise SceneError(
                f"this is a glTF {version}.x binary: only glTF 2.0 is read; export it as glTF 2.0"
            )
        if length != size:
            raise SceneError(
                f"this .glb says it is {length} bytes long but is {size}: it was cut short or "
                "damaged on the way; export it again"
            )
        chunk_length, chunk_type = struct.unpack_from("<I4s", header.ljust(20, b"\0"), 12)
        if chunk_type != b"JSON" or 20 + chunk_length > size:
            raise SceneError("this .glb's first chunk is not its JSON: the file is damaged")
        if chunk_length > MAX_JSON_BYTES:
            raise SceneError(
                f"this .glb's JSON is {chunk_length} bytes: over the {MAX_JSON_BYTES} read here"
            )
        text = f.read(chunk_length)
    _check_gltf_json(text, "this .glb", glb=True)


def _check_gltf_json(text: bytes, what: str, glb: bool) -> None:
    """A glTF 2.0 document whose files are all inside it (a plain .gltf's beside it are not)."""
    try:
        doc: Any = json.loads(text)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise SceneError(f"the glTF JSON of {what} is malformed: {str(exc)[:200]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("asset"), dict):
        if glb:
            raise SceneError(f"the JSON of {what} has no `asset`: the file is damaged")
        raise _not_a_model("JSON but no glTF (it has no `asset`)")
    version = str(doc["asset"].get("version", ""))
    if not version.startswith("2."):
        raise SceneError(
            f"{what} is glTF {version or 'of no version'}: only glTF 2.0 is read; export it "
            "as glTF 2.0"
        )
    listed = [doc.get("buffers"), doc.get("images")]
    beside = [
        str(item["uri"])
        for items in listed
        if isinstance(items, list)
        for item in items
        if isinstance(item, dict)
        and isinstance(item.get("uri"), str)
        and not item["uri"].startswith("data:")
    ]
    if beside:
        shown = ", ".join(name[:60] for name in beside[:3]) + (", ..." if len(beside) > 3 else "")
        raise SceneError(
            f"{what} refers to files beside it ({shown}): upload it as a .zip holding the "
            ".gltf and those files, or export a single .glb"
        )


# -- archives --------------------------------------------------------------------------------


def _normal_name(name: str) -> str:
    """An entry's name with either separator as "/"; SceneError where it points outside."""
    normal = name.replace("\\", "/")
    if (
        "\x00" in normal
        or normal.startswith("/")
        or re.match(r"[A-Za-z]:", normal)
        or ".." in normal.split("/")
    ):
        raise SceneError(
            f"{name[:100]!r} in this .zip points outside the archive (.., an absolute path or a "
            "drive): zip the model's folder as it is"
        )
    return normal


def _ignored(name: str) -> bool:
    """What macOS adds to an archive (resource forks, folder settings): never a model."""
    base = name.rstrip("/").rsplit("/", 1)[-1]
    return name.startswith("__MACOSX/") or base.startswith("._") or base == ".DS_Store"


def _entry_count(path: Path) -> int:
    """The entries the end record promises, read before `zipfile` parses the table of contents
    (which it reads whole, however long); SceneError for a table that is no model archive's."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(max(0, size - (_EOCD_SIZE + 0xFFFF)))
        tail = f.read()
    at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < _EOCD_SIZE:
        raise SceneError("this .zip is damaged or incomplete (no end record): zip it again")
    _, _, _, _, entries, directory_size, _, _ = struct.unpack_from("<4s4H2LH", tail, at)
    if entries > MAX_ENTRIES or directory_size > MAX_DIRECTORY_BYTES:
        raise SceneError(
            f"this .zip holds more than {MAX_ENTRIES} files: zip only the model and its "
            "textures and buffers"
        )
    return int(entries)


def check_archive(path: Path, max_bytes: int) -> str:
    """The name of the one model in the archive at `path` (.glb, .gltf or .obj, "/"-separated);
    SceneError for an archive that is unsafe, too large, or holds no model or several."""
    _entry_count(path)
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        raise SceneError(f"this .zip is damaged or incomplete ({exc}): zip it again") from None
    if len(infos) > MAX_ENTRIES:
        raise SceneError(f"this .zip holds {len(infos)} files: more than {MAX_ENTRIES}")
    total = 0
    seen: set[str] = set()
    models: list[str] = []
    for info in infos:
        name = _normal_name(info.filename)
        if name.rstrip("/") in seen:
            raise SceneError(f"{name[:100]!r} appears twice in this .zip: zip it again")
        seen.add(name.rstrip("/"))
        if stat.S_ISLNK(info.external_attr >> 16):
            raise SceneError(f"{name[:100]!r} in this .zip is a symbolic link: zip the files")
        if info.flag_bits & 0x1:
            raise SceneError(
                f"{name[:100]!r} in this .zip is encrypted: zip it again without a password"
            )
        if info.compress_type not in _ZIP_METHODS:
            raise SceneError(
                f"{name[:100]!r} in this .zip is compressed with a method read nowhere here "
                f"(#{info.compress_type}): zip it again with ordinary (deflate) compression"
            )
        if info.is_dir():
            continue
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size > RATIO_FLOOR and ratio > MAX_RATIO:
            raise SceneError(
                f"{name[:100]!r} in this .zip is compressed {ratio:.0f}:1 (more than "
                f"{MAX_RATIO}:1): this looks like a zip bomb, not a model"
            )
        total += info.file_size
        if not _ignored(name) and name.lower().endswith(MODEL_SUFFIXES):
            models.append(name)
    if total > max_bytes:
        raise SceneError(f"this .zip unpacks to {total} bytes: over the limit of {max_bytes} bytes")
    if not models:
        raise SceneError(
            "this .zip holds no model: put one .glb, .gltf or .obj in it, with its buffers, "
            "textures or .mtl"
        )
    if len(models) > 1:
        shown = ", ".join(m[:60] for m in models[:4]) + (", ..." if len(models) > 4 else "")
        raise SceneError(
            f"this .zip holds {len(models)} models ({shown}): put exactly one .glb, .gltf or "
            ".obj in it"
        )
    return models[0]


def unpack_archive(path: Path, dest: Path, max_bytes: int) -> Path:
    """Unpack the archive at `path` into `dest` (made if missing) after checking it again; the
    unpacked model's path. Bytes are counted as written: the headers' sizes are not trusted."""
    model = check_archive(path, max_bytes)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    written = 0
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                name = _normal_name(info.filename)
                if info.is_dir() or _ignored(name):
                    continue
                target = (root / name).resolve()
                if not target.is_relative_to(root):  # what _normal_name missed, if anything
                    raise SceneError(f"{name[:100]!r} in this .zip points outside the archive")
                target.parent.mkdir(parents=True, exist_ok=True)
                entry = 0
                with archive.open(info) as source, target.open("xb") as out:  # x: no overwrite
                    while chunk := source.read(COPY_CHUNK):
                        entry += len(chunk)
                        written += len(chunk)
                        if written > max_bytes:
                            raise SceneError(
                                f"this .zip unpacks to more than the limit of {max_bytes} bytes"
                            )
                        if entry > info.file_size:
                            raise SceneError(
                                f"{name[:100]!r} in this .zip holds more than its header says: "
                                "the archive is damaged or forged"
                            )
                        out.write(chunk)
    # zipfile's own words for a damaged entry: NotImplementedError is a compression method it
    # lacks, RuntimeError an entry that needs a password (check_archive refuses both first)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        raise SceneError(f"this .zip cannot be unpacked ({exc}): zip it again") from None
    except OSError as exc:
        raise SceneError(f"this .zip cannot be unpacked: {exc.strerror or exc}") from None
    return root / model
