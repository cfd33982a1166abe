"""OBJ and MTL as exporters write them, made into what trimesh reads right, or refused by name.

trimesh guesses a file's encoding with charset_normalizer (not installed here: a UTF-16 OBJ
fails with "No module named 'charset_normalizer'"), fills polygons as fans (wrong for concave
ones), counts negative indices from the end of the file instead of the face, and leaves
Windows paths (`map_Kd .\\tex.jpg`) unresolved. `prepare_obj` and `prepare_mtl` run first:
they decode the text, triangulate polygons with earcut on their best-fit plane, make indices
absolute, write paths with "/", and refuse files that hold nothing to draw.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import mapbox_earcut
import numpy as np

from render_server.scene_formats.errors import SceneError

Point = tuple[float, float, float]
Triangle = tuple[int, int, int]
PATH_STATEMENTS: Final = frozenset({"mtllib", "bump", "disp", "decal", "refl", "norm"})
NAN_POINT: Final = (math.nan, math.nan, math.nan)


def decode_text(data: bytes) -> str:
    """UTF-8 (with or without BOM), UTF-16 with a BOM, else latin-1, which decodes anything."""
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8) :].decode("utf-8", errors="replace")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return data.decode("utf-16", errors="replace")  # the codec reads the BOM's byte order
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _lines(data: bytes) -> list[str]:
    text = decode_text(data).replace("\r\n", "\n").replace("\r", "\n")
    return text.replace("\\\n", "").split("\n")  # a trailing backslash continues the line


def _with_slashes(line: str, words: Sequence[str]) -> str:
    """A statement naming a file, its Windows separators written as "/"."""
    key = words[0].lower()
    if key in PATH_STATEMENTS or key.startswith("map_"):
        return line.replace("\\", "/")
    return line


@dataclass
class MtlText:
    data: bytes  # UTF-8, paths with "/"
    names: set[str] = field(default_factory=set)  # the materials it defines, as trimesh names them


def prepare_mtl(data: bytes) -> MtlText:
    out: list[str] = []
    names: set[str] = set()
    for line in _lines(data):
        words = line.split()
        if words:
            line = _with_slashes(line, words)
            if words[0].lower() == "newmtl" and len(words) > 1:
                names.add(" ".join(words[1:]))
        out.append(line)
    return MtlText("\n".join(out).encode(), names)


def _is_vertex(line: str) -> bool:
    stripped = line.lstrip()
    return stripped[:2] in ("v ", "v\t") or stripped == "v"


class _Faces:
    """The rewriting of face statements, knowing the vertices (by their raw lines)."""

    def __init__(self, lines: list[str], source: str) -> None:
        self.source = source
        self.vertex_lines = [line for line in lines if _is_vertex(line)]
        self.positions: dict[int, Point] = {}
        self.seen = {"v": 0, "vt": 0, "vn": 0}  # how many of each came before the current line

    def rewrite(self, number: int, line: str, corners: list[str]) -> list[str]:
        """The face's statements: itself (with absolute indices), or its triangles."""
        if "-" in line:  # relative indices, which trimesh would count from the file's end
            corners = [self._absolute(number, corner) for corner in corners]
            line = "f " + " ".join(corners)
        try:
            heads = [int(corner.split("/", 1)[0]) for corner in corners]
        except ValueError:
            heads = [0]
        if min(heads) < 1 or max(heads) > len(self.vertex_lines):
            for corner in corners:
                self._absolute(number, corner)  # raises, naming the corner
        if len(corners) == 3:
            return [line]
        points = [self._position(head - 1) for head in heads]
        return [
            "f " + " ".join(corners[k] for k in triangle)
            for triangle in triangulate_polygon(points)
        ]

    def _absolute(self, number: int, corner: str) -> str:
        parts = corner.split("/")
        kinds = ("v", "vt", "vn")
        for i, part in enumerate(parts[:3]):
            if not part and i:
                continue  # "1//3": no texture coordinate
            try:
                value = int(part)
            except ValueError:
                raise SceneError(
                    f"{self.source}: line {number}: {corner[:40]!r} in a face is no vertex number"
                ) from None
            parts[i] = str(self._resolve(number, kinds[i], value))
        return "/".join(parts)

    def _resolve(self, number: int, kind: str, value: int) -> int:
        seen = self.seen[kind]
        total = len(self.vertex_lines) if kind == "v" else None
        if value < 0 and -value <= seen:
            return seen + value + 1
        if value > 0 and (total is None or value <= total):
            return value
        what = {"v": "vertex", "vt": "texture coordinate", "vn": "normal"}[kind]
        if value == 0:
            problem = f"{what} 0, but OBJ counts from 1"
        elif value < 0:
            problem = f"{what} {value}, further back than the {seen} before it"
        else:
            problem = f"{what} {value}, but the file has only {total} vertices"
        raise SceneError(f"{self.source}: line {number}: a face refers to {problem}")

    def _position(self, index: int) -> Point:
        if index not in self.positions:
            words = self.vertex_lines[index].split()[1:4]
            try:
                x, y, z = (float(word) for word in words)
                self.positions[index] = (x, y, z)
            except ValueError:
                self.positions[index] = NAN_POINT  # unreadable: triangulated as a fan
        return self.positions[index]


def prepare_obj(data: bytes, source: str) -> bytes:
    """The OBJ `data` as UTF-8 text with triangles only, absolute indices and "/" paths;
    SceneError naming the file (`source`) and line for a face that refers to no vertex, and
    for a file without faces."""
    lines = _lines(data)
    faces = _Faces(lines, source)
    out: list[str] = []
    triangles = 0
    points_or_lines = False
    for number, line in enumerate(lines, 1):
        words = line.split()
        key = words[0] if words else ""
        if key in faces.seen:
            faces.seen[key] += 1
        elif key == "f":
            line = line.split("#", 1)[0]  # a comment after the corners is no corner
            words = line.split()
            if len(words) >= 4:  # fewer than three corners fill nothing
                rewritten = faces.rewrite(number, line.strip(), words[1:])
                triangles += len(rewritten)
                out.extend(rewritten)
            continue
        elif key in ("p", "l"):
            points_or_lines = True
        elif words:
            line = _with_slashes(line, words)
        out.append(line)
    if not triangles:
        if faces.vertex_lines or points_or_lines:
            raise SceneError(
                f"{source}: the file holds only points/lines, no triangles to draw: export "
                "the model's surfaces (faces)"
            )
        raise SceneError(f"{source}: the file is empty: it holds no vertices and no faces")
    return "\n".join(out).encode()


def triangulate_polygon(points: Sequence[Point]) -> list[Triangle]:
    """Triangles (indices into `points`) filling a polygon, concave ones included: earcut on
    the polygon's best-fit plane, each triangle wound as the polygon is. A fan where the
    polygon has no plane (all corners on a line, unreadable coordinates)."""
    if len(points) == 4 and math.isfinite(sum(map(sum, points))):  # no nan, no inf in any
        return _split_quad(points)
    corners = np.asarray(points, dtype=np.float64)
    normal = _newell_normal(corners)
    length = float(np.linalg.norm(normal)) if np.isfinite(normal).all() else 0.0
    if length <= 1e-300:
        return _fan(len(points))
    normal /= length
    u = np.cross(normal, (1.0, 0.0, 0.0) if abs(normal[0]) < 0.9 else (0.0, 1.0, 0.0))
    u /= np.linalg.norm(u)
    v = np.cross(normal, u)  # u, v, normal right-handed: the polygon winds counter-clockwise
    flat = np.column_stack([corners @ u, corners @ v])
    rings = np.array([len(points)], dtype=np.uint32)
    found = mapbox_earcut.triangulate_float64(flat, rings).reshape(-1, 3).astype(np.int64)
    if not len(found):
        return _fan(len(points))
    a, b, c = flat[found[:, 0]], flat[found[:, 1]], flat[found[:, 2]]
    clockwise = (b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (
        c[:, 0] - a[:, 0]
    ) < 0
    found[clockwise] = found[clockwise][:, [0, 2, 1]]
    return [(int(i), int(j), int(k)) for i, j, k in found]


def _newell_normal(corners: np.ndarray) -> np.ndarray:
    following = np.roll(corners, -1, axis=0)
    normal: np.ndarray = np.cross(corners, following).sum(axis=0)
    return normal


def _fan(count: int) -> list[Triangle]:
    return [(0, k, k + 1) for k in range(1, count - 1)]


def _split_quad(q: Sequence[Point]) -> list[Triangle]:
    """A quad split along the diagonal inside it: the one from its reflex corner, if any (two
    triangles wound alike), so a dart-shaped quad is not filled across its notch."""
    first = _cross(q[0], q[1], q[2])
    second = _cross(q[0], q[2], q[3])
    if sum(x * y for x, y in zip(first, second, strict=True)) >= 0:
        return [(0, 1, 2), (0, 2, 3)]
    return [(1, 2, 3), (1, 3, 0)]


def _cross(a: Point, b: Point, c: Point) -> Point:
    ux, uy, uz = b[0] - a[0], b[1] - a[1], b[2] - a[2]
    vx, vy, vz = c[0] - a[0], c[1] - a[1], c[2] - a[2]
    return (uy * vz - uz * vy, uz * vx - ux * vz, ux * vy - uy * vx)
