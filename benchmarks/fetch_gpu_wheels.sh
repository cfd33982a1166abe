#!/usr/bin/env bash
# Fill .gpu-wheels/ (git-ignored) with what benchmarks/gpu_check.sh installs on a GPU machine
# that has no internet: the pycuda source (it has no binary wheel) and the wheels it and the
# render path need that such a machine may lack. Run it where PyPI is reachable.
#   PYTHON_VERSION=3.12 bash benchmarks/fetch_gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.gpu-wheels
pyver=${PYTHON_VERSION:-3.12}
mkdir -p "$dest"

# pycuda: the sdist itself (pip cannot `download` it without building its metadata here)
python3 - "$dest" <<'PY'
import json, pathlib, sys, urllib.request
dest = pathlib.Path(sys.argv[1])
info = json.load(urllib.request.urlopen("https://pypi.org/pypi/pycuda/json", timeout=60))
sdist = next(f for f in info["urls"] if f["packagetype"] == "sdist")
target = dest / sdist["filename"]
if not target.exists():
    urllib.request.urlretrieve(sdist["url"], target)
print(f"pycuda {info['info']['version']}: {target}")
PY

# the versions this checkout is tested with here, so the GPU run differs only by the GPU
av_version=$(python3 -c "import av; print(av.__version__)" 2>/dev/null || echo 18.1.0)
trimesh_version=$(python3 -c "import trimesh; print(trimesh.__version__)" 2>/dev/null || echo 5.2.0)

platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
python3 -m pip download --no-deps --only-binary=:all: --python-version "$pyver" \
    --implementation cp "${platforms[@]}" -d "$dest" \
    "av==$av_version" "trimesh==$trimesh_version" pytools platformdirs siphash24 mako markupsafe
ls -la "$dest"
du -sh "$dest"
