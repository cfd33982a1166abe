#!/usr/bin/env bash
# The GPU check: one short run on a machine with an NVIDIA GPU and no internet.
#
#   here, with PyPI:   bash benchmarks/fetch_gpu_wheels.sh        # fills .gpu-wheels/
#   on the GPU machine: bash benchmarks/gpu_check.sh [OUT_DIR]    # carry .gpu-wheels/ along
#
# It installs what .gpu-wheels/ carries (what the machine's image lacks) into a directory of its
# own on PYTHONPATH, builds pycuda there from its sdist against the machine's CUDA, runs the GPU
# tests (which refuse to pass on the CPU), times the CUDA renderer at 1080p and 4K over at least
# 200 frames, tries NVENC for each codec and prints what
# `render-server doctor` says (an A100/H100/H200 has no NVENC and must say so and fall back),
# then has the load-test harness decode every frame of 20 × 4K30 streams, on the CPU and with
# NVDEC (benchmarks/harness_decode.py). About ten minutes on an H200's 16 cores, unmeasured.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-gpu-check-output}}
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1
status=0
step() { echo; echo "== $*"; }

step "the machine"
if ! nvidia-smi; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi failed); nothing to check"
    exit 2
fi
python3 --version
site=${GPU_SITE:-/tmp/render-server-site}  # the carried packages go here, not into the image
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

step "dependencies from .gpu-wheels (what the image lacks: fetch_gpu_wheels.sh), into $site"
# a directory of their own, not the image's environment; --no-deps: the carried set is whole
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" .gpu-wheels/*.whl || status=1
if ! python3 -c "import pycuda.driver" 2>/dev/null; then
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    cuda_root=$(dirname "$(dirname "$nvcc")")
    libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so /{print $NF; exit}')
    [ -n "$libcuda" ] || libcuda=$(find /usr/local/nvidia /usr/lib /usr/lib64 "$cuda_root" \
        -name 'libcuda.so*' 2>/dev/null | head -n 1)
    echo "building pycuda against $cuda_root (driver library: ${libcuda:-not found})"
    build=$(mktemp -d)
    tar xzf .gpu-wheels/pycuda-*.tar.gz -C "$build"
    (
        cd "$build"/pycuda-* &&
        python3 configure.py --cuda-root="$cuda_root" --no-cuda-enable-curand \
            ${libcuda:+--cudadrv-lib-dir="$(dirname "$libcuda")"} &&
        python3 -m pip install -q --no-index --no-build-isolation --no-deps --target "$site" .
    ) || { echo "gpu_check: pycuda did not build"; status=1; }
fi
python3 -c "import pycuda.driver as d; d.init(); print('pycuda sees', d.Device.count(), 'GPU(s):', d.Device(0).name())" || status=1

step "doctor"
python3 -m render_server doctor --seconds 3 || status=1
python3 -m render_server doctor --seconds 0 --json > "$out/doctor.json" || status=1

step "GPU tests (marked gpu; they fail rather than pass on the CPU) and the kernel tests"
python3 -m pytest -p no:cacheprovider -q -rs \
    tests/test_cuda_gpu.py tests/test_nvenc_gpu.py tests/test_cuda_kernels.py tests/test_backends.py \
    tests/test_nvenc_options.py tests/test_render.py tests/test_device_frames.py \
    tests/test_dlpack.py || status=1

step "CUDA renderer timings (>= 200 frames per figure)"
python3 benchmarks/cuda_render.py --frames 200 || status=1

step "whole pipeline per backend pair"
python3 -m render_server bench --resolutions 1920x1080,3840x2160 --seconds 3 || status=1

step "the load-test harness decoding every frame of 20 × 4K30 (issue 18): CPU, then NVDEC"
python3 benchmarks/harness_decode.py --streams 20 --resolution 3840x2160 --fps 30 \
    --duration 30 --ramp 10 --processes 8 --decoders cpu,nvdec || status=1

step "done: status $status (logs in $out)"
exit $status
