"""The kernels compiled ahead of time, for an image without the CUDA toolkit.

`python -m render_server.render.cuda.precompiled DIR` (a GPU image's build stage, where nvcc
is) writes each shader as PTX for the oldest GPU generation the image serves; at start the
renderer loads those files from `RENDER_SERVER_PTX_DIR` and the driver compiles the PTX for the
GPU it has (and caches it), so the runtime image needs no nvcc. A file is named after a digest
of everything that went into it (the source, the shared header, the -D constants and the
options): kernels or constants that changed since the image was built have no file, and the
renderer compiles at start as it does without the directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from render_server.render.cuda.kernels import (
    COMMON_HEADER,
    NVCC_OPTIONS,
    SHADER_FILES,
    SHADERS_DIR,
    shader_defines,
    shader_source,
)

PTX_ARCH = "compute_75"  # Turing (T4) and every GPU since: PTX is compiled forward by the driver
PTX_DIR_ENV = "RENDER_SERVER_PTX_DIR"


def compile_options() -> list[str]:
    return [*NVCC_OPTIONS, *(f"-D{name}={value}" for name, value in shader_defines().items())]


def ptx_name(source: str) -> str:
    digest = hashlib.sha256()
    for part in (shader_source(source), (SHADERS_DIR / COMMON_HEADER).read_text(), PTX_ARCH,
                 *compile_options()):  # fmt: skip
        digest.update(part.encode())
        digest.update(b"\0")
    return f"{Path(source).stem}.{digest.hexdigest()[:16]}.ptx"


def precompiled_ptx(source: str, directory: str | None = None) -> bytes | None:
    """The PTX of `source` from $RENDER_SERVER_PTX_DIR (or `directory`), NUL-terminated as the
    driver wants it; None where there is no directory or no file for these kernels."""
    where = directory if directory is not None else os.environ.get(PTX_DIR_ENV)
    if not where:
        return None
    path = Path(where) / ptx_name(source)
    return path.read_bytes() + b"\0" if path.is_file() else None


def compile_all(directory: Path, nvcc: str) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for source in SHADER_FILES:
        out = directory / ptx_name(source)
        subprocess.run(
            [nvcc, "--ptx", f"-arch={PTX_ARCH}", *compile_options(), f"-I{SHADERS_DIR}",
             str(SHADERS_DIR / source), "-o", str(out)],
            check=True,
        )  # fmt: skip
        written.append(out)
    return written


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m render_server.render.cuda.precompiled DIR", file=sys.stderr)
        return 2
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if not Path(nvcc).exists():
        print("nvcc (the CUDA toolkit) is not found", file=sys.stderr)
        return 2
    for path in compile_all(Path(argv[0]), nvcc):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
