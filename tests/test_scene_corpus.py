"""Every glTF and OBJ file of Debian's assimp-testmodels (real exports and the broken files
assimp keeps as regression tests) loads with something to see or is refused with its cause.

The files load in one child process, each under a hard bound: a file that hangs the loader
costs PER_FILE_S, the child is killed, and the next file gets a fresh one. The child is a plain
subprocess speaking JSON lines (multiprocessing's spawn would leave its resource tracker behind).
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from render_server.render.scene import srgb_to_linear

PACKAGE = "assimp-testmodels"
ROOTS = (Path("/usr/share/assimp-testmodels"), Path("/usr/share/assimp/models"))
SUFFIXES = (".gltf", ".glb", ".obj")
REPO = Path(__file__).resolve().parent.parent
PER_FILE_S = 60.0
TOTAL_S = 90.0  # the whole corpus; it takes a few seconds
NEAR_BLACK = 0.01  # linear: no file here asks for nothing but black surfaces
RESULT = b"corpus-result "  # marks the child's answers among anything else it prints
WORKER = "from tests.test_scene_corpus import serve; serve()"
PYTHON_WORDS = re.compile(
    r"object has no attribute|not subscriptable|NoneType|No module named|index out of range|"
    r"out of bounds|update sequence|Traceback|unhashable|invalid literal"
)
# the files that cannot be drawn, and the words that must name the cause
REFUSED = {
    "glTF/BoxTextured-glTF/BoxTextured.gltf": "only glTF 2.0 is read",
    "glTF/BoxTextured-glTF-Binary/BoxTextured.glb": "only glTF 2.0 is read",
    "glTF/CesiumMilkTruck/CesiumMilkTruck.gltf": "only glTF 2.0 is read",
    "BoxTextured-glTF-techniqueWebGL/BoxTextured.gltf": "extension KHR_technique_webgl",
    "BoxWithInfinites.glb": "non-finite",
    "glTF2/IncorrectVertexArrays/Cube.gltf": "bufferViews[2] spans bytes 504 to 936",
    "AllIndicesOutOfRange.gltf": "faces that index missing vertices",
    "MissingBin/BoxTextured.gltf": "needs the file 'BoxTextured0.bin'",
    "RecursiveNodes.gltf": "the node tree has a cycle",
    "sceneWrongType.gltf": "scene is 'hello'",
    "SceneWithoutNodes.gltf": "holds no meshes",
    "Mesh_PrimitiveMode_00.gltf": "only points/lines",
    "Mesh_PrimitiveMode_03.gltf": "only points/lines",
    "Mesh_PrimitiveMode_07.gltf": "only points/lines",
    "wrongTypes/badArray.gltf": "primitives must be an array",
    "wrongTypes/badObject.gltf": "pbrMetallicRoughness must be an object",
    "OBJ/number_formats.obj": "all 1 triangles have zero area",
    "OBJ/point_cloud.obj": "only points/lines",
    "OBJ/testline.obj": "only points/lines",
    "invalid/empty.obj": "the file is empty",
    "invalid/malformed.obj": "a face refers to vertex 12",
}


def corpus_files() -> list[Path]:
    """The package's model files, where `dpkg -L` puts them (else the usual folders)."""
    listed: list[Path] = []
    try:
        found = subprocess.run(["dpkg", "-L", PACKAGE], capture_output=True, text=True, timeout=30)
        if found.returncode == 0:
            listed = [Path(line) for line in found.stdout.splitlines()]
    except (OSError, subprocess.TimeoutExpired):
        pass
    if not listed:
        listed = [path for root in ROOTS if root.is_dir() for path in root.rglob("*")]
    return sorted(p for p in listed if p.suffix.lower() in SUFFIXES and p.is_file())


def summarise(path: str) -> dict[str, Any]:
    """What a load of `path` gave, as plain data for the pipe (runs in the child)."""
    from render_server.render.scene_files import load_scene
    from render_server.scene_formats.errors import SceneError

    started = time.monotonic()
    try:
        scene = load_scene(path)
    except SceneError as exc:
        return {"refused": str(exc), "seconds": time.monotonic() - started}
    except Exception as exc:  # a failure that is no SceneError is the finding itself
        return {"crashed": f"{type(exc).__name__}: {exc}"}
    p = scene.positions.astype(np.float64)
    areas = np.linalg.norm(np.cross(p[:, 1] - p[:, 0], p[:, 2] - p[:, 0]), axis=1) / 2
    extent = float(np.ptp(p.reshape(-1, 3), axis=0).max())
    return {
        "triangles": len(p),
        "area": float(areas.sum()),
        "drawn": int((areas > 1e-12 * extent**2).sum()),
        "finite": bool(np.isfinite(scene.bounds_min).all() and np.isfinite(scene.bounds_max).all()),
        "materials": [(m.name, m.base_color, m.metallic) for m in scene.materials],
        "seconds": time.monotonic() - started,
    }


def serve() -> None:
    """The child: loads each path it reads on stdin, one answer line each, until stdin ends."""
    for line in sys.stdin:
        answer = json.dumps(summarise(line.rstrip("\n")))
        sys.stdout.buffer.write(RESULT + answer.encode() + b"\n")
        sys.stdout.flush()


class Loader:
    """One child process loading files in turn; killed and replaced when a file overruns."""

    def __init__(self, worker: str = WORKER) -> None:
        self.worker = worker
        self.process: subprocess.Popen[bytes] | None = None
        self.pending = b""

    def load(self, path: Path, timeout: float) -> dict[str, Any]:
        if self.process is None:
            self.process = subprocess.Popen(
                [sys.executable, "-c", self.worker], cwd=REPO, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )  # fmt: skip
            self.pending = b""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(str(path).encode() + b"\n")
            self.process.stdin.flush()
            answer = self._answer(time.monotonic() + timeout)
        except (BrokenPipeError, EOFError):
            self.stop()
            return {"crashed": "the loading process died"}
        if answer is None:
            self.stop()
            return {"timeout": timeout}
        result: dict[str, Any] = json.loads(answer)
        return result

    def _answer(self, deadline: float) -> bytes | None:
        """The child's next answer, or None once `deadline` passes without one."""
        assert self.process is not None and self.process.stdout is not None
        out = self.process.stdout.fileno()
        while True:
            line, newline, rest = self.pending.partition(b"\n")
            if newline:
                self.pending = rest
                if line.startswith(RESULT):
                    return line[len(RESULT) :]
                continue  # something else the child printed
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                return None
            chunk = os.read(out, 1 << 16)
            if not chunk:
                raise EOFError
            self.pending += chunk

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self._close_pipes()

    def close(self) -> None:
        if self.process is not None and self.process.stdin is not None:
            self.process.stdin.close()  # the child's loop ends with its input
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
            self._close_pipes()

    def _close_pipes(self) -> None:
        assert self.process is not None
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except BrokenPipeError:
                    pass
        self.process = None


@pytest.fixture(scope="module")
def corpus() -> dict[str, dict[str, Any]]:
    files = corpus_files()
    if not files:
        pytest.skip(f"Debian's {PACKAGE} is not installed (apt-get install {PACKAGE})")
    results: dict[str, dict[str, Any]] = {}
    loader = Loader()
    started = time.monotonic()
    try:
        for path in files:
            left = TOTAL_S - (time.monotonic() - started)
            if left <= 0:
                results[path.as_posix()] = {"timeout": "the corpus ran out of its time"}
                continue
            results[path.as_posix()] = loader.load(path, min(PER_FILE_S, left))
    finally:
        loader.close()
    loaded = sum("triangles" in r for r in results.values())
    seconds = time.monotonic() - started
    refused = len(results) - loaded
    print(f"\n{len(results)} corpus files: {loaded} load, {refused} refused, in {seconds:.1f} s")
    return results


@pytest.mark.parametrize(
    ("worker", "expected"),
    [("import time; time.sleep(600)", {"timeout": 1.0}),
     ("import sys; sys.stdin.readline(); sys.exit(3)", {"crashed": "the loading process died"})],
    ids=["hangs", "dies"],
)  # fmt: skip
def test_a_load_that_hangs_or_dies_is_cut_off(worker: str, expected: dict[str, Any]) -> None:
    loader = Loader(worker)
    started = time.monotonic()
    assert loader.load(Path("any.glb"), timeout=1.0) == expected
    assert loader.process is None and time.monotonic() - started < 15
    loader.close()


def result(corpus: dict[str, dict[str, Any]], tail: str) -> dict[str, Any]:
    (match,) = [r for path, r in corpus.items() if path.endswith("/" + tail)]
    return match


def test_every_file_loads_visibly_or_is_refused_with_its_cause(
    corpus: dict[str, dict[str, Any]],
) -> None:
    wrong: list[str] = []
    for path, r in corpus.items():
        name = Path(path).name
        if "refused" in r:
            message = r["refused"]
            if name not in message or PYTHON_WORDS.search(message) or len(message) < len(path) + 8:
                wrong.append(f"{path}: refused without a clear cause: {message!r}")
        elif "triangles" in r:
            colours = [max(colour) for _, colour, _ in r["materials"]]
            if not (r["drawn"] and r["area"] > 0 and r["finite"]):
                wrong.append(f"{path}: loads without visible geometry: {r}")
            elif max(colours) < NEAR_BLACK:
                wrong.append(f"{path}: loads all black: {r['materials']}")
        else:
            wrong.append(f"{path}: {r}")  # crashed or overran its time
    assert wrong == []
    assert len(corpus) >= 70
    assert max(r.get("seconds", 0.0) for r in corpus.values()) < 10


@pytest.mark.parametrize("tail", sorted(REFUSED))
def test_broken_files_are_refused_by_their_cause(
    corpus: dict[str, dict[str, Any]], tail: str
) -> None:
    assert REFUSED[tail] in result(corpus, tail).get("refused", "(it loaded)")


def test_the_draco_gltf_decodes(corpus: dict[str, dict[str, Any]]) -> None:
    draco = result(corpus, "glTF2/draco/2CylinderEngine.gltf")
    assert draco["triangles"] > 100_000
    assert draco["drawn"] > 0.99 * draco["triangles"]  # not a heap of zero-area placeholders


@pytest.mark.parametrize(
    "number", ["04", "05", "11", "12"], ids=["strip", "fan", "indexed-strip", "indexed-fan"]
)
def test_strips_and_fans_load(corpus: dict[str, dict[str, Any]], number: str) -> None:
    square = result(corpus, f"Mesh_PrimitiveMode_{number}.gltf")
    assert square["triangles"] == 2 and square["area"] == pytest.approx(1.0)


def test_the_concave_obj_polygon_covers_its_outline(corpus: dict[str, dict[str, Any]]) -> None:
    (path,) = [Path(p) for p in corpus if p.endswith("/OBJ/concave_polygon.obj")]
    lines = path.read_text().splitlines()
    vertices = np.array([[float(w) for w in line.split()[1:4]] for line in lines
                         if line.startswith("v ")])  # fmt: skip
    (face,) = [line.split()[1:] for line in lines if line.startswith("f ")]
    corners = vertices[[int(c.split("/")[0]) - 1 for c in face]]
    outline = np.linalg.norm(np.cross(corners, np.roll(corners, -1, axis=0)).sum(axis=0)) / 2
    # trimesh's fan folds over the notches: over 3.2 where the outline holds 0.25
    assert result(corpus, "OBJ/concave_polygon.obj")["area"] == pytest.approx(outline, rel=1e-4)


def test_an_obj_without_material_is_grey(corpus: dict[str, dict[str, Any]]) -> None:
    ((name, colour, _),) = result(corpus, "OBJ/WusonOBJ.obj")["materials"]
    assert name == "default" and min(colour) > 0.5


def test_backslash_texture_paths_are_read(corpus: dict[str, dict[str, Any]]) -> None:
    # spider.mtl: `map_Kd .\SpiderTex.jpg`; a texture read makes the colour differ from Kd's
    colours = {name: colour for name, colour, _ in result(corpus, "OBJ/spider.obj")["materials"]}
    kd_only = tuple(srgb_to_linear(np.array([0.690196, 0.639216, 0.615686])))  # HLeibTex's Kd
    assert colours["HLeibTex"] != pytest.approx(kd_only, abs=0.02)


def test_the_spec_gloss_box_is_not_dark_metal(corpus: dict[str, dict[str, Any]]) -> None:
    plain = result(corpus, "glTF2/BoxTextured-glTF/BoxTextured.gltf")["materials"]
    gloss = result(corpus, "BoxTextured-glTF-pbrSpecularGlossiness/BoxTextured.gltf")["materials"]
    ((_, colour, metallic),) = gloss
    assert metallic == 0.0 and colour == pytest.approx(plain[0][1])


def test_the_utf16_obj_loads(corpus: dict[str, dict[str, Any]]) -> None:
    assert result(corpus, "OBJ/box_UTF16BE.obj")["triangles"] == 12
