"""A plain `pip install .` (not editable) must carry what the server reads from its package:
the web client it serves, the CUDA kernels it compiles and the registry's Lua scripts."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "render_server"
DATA = ("client", "shaders", "signaling/state/lua")
LEFTOVERS = (
    ".git",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    "test-output",
    ".venv",
)


def test_the_wheel_carries_the_client_the_kernels_and_the_lua_scripts(tmp_path: Path) -> None:
    # from a clean copy: a build/ or *.egg-info left by an earlier build would lend it files
    # that the package configuration alone would not ship
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LEFTOVERS))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
         "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("render_server-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    wanted = {
        path.relative_to(ROOT).as_posix()
        for folder in DATA
        for path in (PACKAGE / folder).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert {"render_server/client/index.html", "render_server/shaders/raster.cu"} <= wanted
    assert wanted - shipped == set()
    assert "render_server/py.typed" in shipped
