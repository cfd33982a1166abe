"""What an uploaded file is, told from its bytes, and archives refused or unpacked safely
(scene_formats/upload_file.py): real files, built here."""

from __future__ import annotations

import io
import json
import random
import stat
import struct
import zipfile
from pathlib import Path

import pytest
import trimesh

from render_server.scene_formats.errors import SceneError
from render_server.scene_formats.upload_file import (
    MAX_ENTRIES,
    NotAModel,
    check_archive,
    check_upload,
    unpack_archive,
)

LIMIT = 4 * 1024 * 1024
OBJ = b"# a triangle\nmtllib tri.mtl\no tri\nv 0 0 0\nv 1 0 0\nv 0 1 0\nusemtl red\nf 1 2 3\n"
MTL = b"newmtl red\nKd 1 0 0\n"
NOISE = random.Random(1).randbytes(100_000)  # what does not compress


def box_glb() -> bytes:
    data = trimesh.creation.box().export(file_type="glb")
    assert isinstance(data, bytes)
    return data


def glb_with_json(text: bytes) -> bytes:
    text += b" " * (-len(text) % 4)
    chunk = struct.pack("<I4s", len(text), b"JSON") + text
    return struct.pack("<4sII", b"glTF", 2, 12 + len(chunk)) + chunk


def zip_of(entries: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return out.getvalue()


def write(tmp_path: Path, data: bytes, name: str = "upload") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def kind_of(tmp_path: Path, data: bytes, limit: int = LIMIT) -> str:
    return check_upload(write(tmp_path, data), limit)


def test_models_are_told_by_their_bytes(tmp_path: Path) -> None:
    assert kind_of(tmp_path, box_glb()) == "glb"
    assert kind_of(tmp_path, OBJ) == "obj"
    assert kind_of(tmp_path, b"\xef\xbb\xbf\r\n" + OBJ) == "obj"  # a BOM and a blank line first
    gltf = {"asset": {"version": "2.0"}, "buffers": [{"uri": "data:;base64,AAAA"}]}
    assert kind_of(tmp_path, json.dumps(gltf).encode()) == "gltf"
    assert kind_of(tmp_path, zip_of({"scene/tri.obj": OBJ, "scene/tri.mtl": MTL})) == "zip"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 100, "this is a PNG image, not a 3D model: upload .glb"),
        (b"\xff\xd8\xff\xe0" + b"\0" * 100, "JPEG image"),
        (b"%PDF-1.7\n", "PDF document"),
        (b"Kaydara FBX Binary  \0" + b"\0" * 50, "FBX file, which this server does not read"),
        (b"hello designers\n", "this is text, not a 3D model"),
        (b'{"scenes": []}', "JSON but no glTF"),
        (b"solid cube\n facet normal 0 0 1\n", "STL file"),
        (b"\x00\x01\x02binary", "binary data of an unknown kind"),
    ],
)
def test_what_is_no_model_is_named(tmp_path: Path, data: bytes, words: str) -> None:
    with pytest.raises(NotAModel, match=words):
        kind_of(tmp_path, data)


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (box_glb()[:-8], "cut short"),
        (glb_with_json(b'{"asset": {"version": "2.0"}, "meshes": [}'), "glTF JSON .* malformed"),
        (glb_with_json(b'{"asset": {"version": "1.0"}}'), "only glTF 2.0"),
        (struct.pack("<4sII", b"glTF", 1, 12), "glTF 1.x binary"),
        (b'{"asset": {"version": "2.0"}, "buffers": [{"uri": "tri.bin"}]}', "tri.bin.*zip"),
        (b"", "empty"),
    ],
)
def test_broken_models_are_scene_errors(tmp_path: Path, data: bytes, words: str) -> None:
    with pytest.raises(SceneError, match=words) as caught:
        kind_of(tmp_path, data)
    assert not isinstance(caught.value, NotAModel)


def test_a_file_over_the_limit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SceneError, match="over the limit of 100 bytes"):
        kind_of(tmp_path, OBJ * 10, limit=100)


def symlink_zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("tri.obj", OBJ)
        link = zipfile.ZipInfo("textures/wood.png")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "/etc/passwd")
    return out.getvalue()


def encrypted_zip() -> bytes:
    """zipfile writes no encryption: the flag is set in the table of contents by hand."""
    data = bytearray(zip_of({"tri.obj": OBJ}))
    at = data.find(b"PK\x01\x02")
    (flags,) = struct.unpack_from("<H", data, at + 8)
    struct.pack_into("<H", data, at + 8, flags | 0x1)
    return bytes(data)


BAD_ARCHIVES = [
    (zip_of({"../evil.obj": OBJ}), "points outside the archive"),
    (zip_of({"/etc/evil.obj": OBJ}), "points outside the archive"),
    (zip_of({"C:/evil.obj": OBJ}), "points outside the archive"),
    (zip_of({"scene\\..\\..\\evil.obj": OBJ}), "points outside the archive"),
    (symlink_zip(), "symbolic link"),
    (encrypted_zip(), "encrypted"),
    (zip_of({"bomb.obj": b"v 0 0 0\n" + b"#" * 3_000_000}), "compressed .*:1.*zip bomb"),
    (zip_of({"big.obj": OBJ, "noise.bin": NOISE + bytes(5_000_000)}), "unpacks to"),
    (zip_of({"a.obj": OBJ, "b.glb": box_glb()}), "holds 2 models"),
    (zip_of({"readme.txt": b"hi", "tex.png": b"\x89PNG"}), "holds no model"),
    (zip_of({f"t{i}.png": b"x" for i in range(MAX_ENTRIES + 1)}), "more than 512 files"),
    (b"PK\x03\x04" + b"\0" * 100, "damaged or incomplete"),
]


@pytest.mark.parametrize(("data", "words"), BAD_ARCHIVES)
def test_unsafe_archives_are_refused(tmp_path: Path, data: bytes, words: str) -> None:
    with pytest.raises(SceneError, match=words):
        kind_of(tmp_path, data, limit=LIMIT)
    assert not list(tmp_path.glob("**/evil.obj"))


def test_an_archive_unpacks_to_its_one_model(tmp_path: Path) -> None:
    data = zip_of({
        "scene/tri.obj": OBJ, "scene/tri.mtl": MTL, "__MACOSX/scene/._tri.obj": b"\0\5\26\7",
        "scene/.DS_Store": b"\0", "scene/sub/": b"",
    })  # fmt: skip
    path = write(tmp_path, data, "model.zip")
    assert check_archive(path, LIMIT) == "scene/tri.obj"
    model = unpack_archive(path, tmp_path / "out" / "unpacked", LIMIT)
    assert model == (tmp_path / "out" / "unpacked" / "scene" / "tri.obj").resolve()
    assert model.read_bytes() == OBJ and (model.parent / "tri.mtl").read_bytes() == MTL
    assert not (tmp_path / "out" / "unpacked" / "__MACOSX").exists()


def test_unpacking_trusts_no_header_size(tmp_path: Path) -> None:
    """Sizes forged low in both headers: the check passes, the unpacking stops at the lie."""
    real = OBJ + b"# " + b"x" * 200_000 + b"\n"
    data = bytearray(zip_of({"tri.obj": real}, zipfile.ZIP_STORED))
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = data.find(signature)
        struct.pack_into("<I", data, at + offset, 1000)
    path = write(tmp_path, bytes(data), "forged.zip")
    assert check_archive(path, 10_000) == "tri.obj"
    with pytest.raises(SceneError):
        unpack_archive(path, tmp_path / "out", 10_000)
    written = sum(p.stat().st_size for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert written <= 10_000
