#!/usr/bin/env bash
# Fill .gpu-wheels/ (git-ignored) with what benchmarks/gpu_check.sh installs on a GPU machine
# that has no internet: the pycuda source (it has no binary wheel) and the wheels of everything
# the check runs that the lent machines' image lacks (about 50 MB; a device call carries 64 MiB
# with the working tree). Run it where PyPI is reachable; the lent machines run Python 3.12.
#   PYTHON_VERSION=3.12 bash benchmarks/fetch_gpu_wheels.sh
# One Python version at a time: gpu_check.sh installs every wheel here, and two builds of one
# package stop the install (empty .gpu-wheels/ before fetching for another version).
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

# What the check runs needs, less what the GPU machine's image already has (aiohttp, numpy,
# numba, scipy, networkx, pillow, prometheus-client, pytest and its timeout and xdist plugins,
# typing-extensions: /work/.library/device/KINDS.md's list), each at the version this checkout
# is tested with here, so the GPU run differs only by the GPU. `--no-deps`: this list is the
# whole closure (gpu_check.sh installs it with --no-deps), and one version of each.
version() {  # the version installed here, else the fallback
    python3 -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || echo "$2"
}
wanted=()
for spec in aiortc:1.16.0 aioice:0.13.0 av:18.1.0 cffi:2.1.1 cryptography:50.0.2 \
        dnspython:2.9.2 DracoPy:2.2.0 google-crc32c:1.9.0 ifaddr:0.2.0 mapbox-earcut:2.1.0 \
        pycparser:3.0 pyee:13.0.1 PyJWT:2.15.1 pylibsrtp:1.0.0 pyOpenSSL:26.4.0 \
        pytest-aiohttp:1.1.1 pytest-asyncio:1.5.0 redis:8.2.0 segno:1.6.6 trimesh:5.2.0 \
        pytools:2025.2.5 platformdirs:4.5.1 siphash24:1.8 mako:1.3.10; do
    name=${spec%%:*}
    wanted+=("$name==$(version "$name" "${spec#*:}")")
done

platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
           --platform manylinux1_x86_64 --platform any)
python3 -m pip download --no-deps --only-binary=:all: --python-version "$pyver" \
    --implementation cp "${platforms[@]}" -d "$dest" "${wanted[@]}"
ls -la "$dest"
du -sh "$dest"
