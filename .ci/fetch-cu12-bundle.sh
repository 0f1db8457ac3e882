#!/usr/bin/env bash
# Build the CUDA 12 user-space bundle that can travel to the GPU machine (a CUDA 13 driver
# runs CUDA 12 libraries), to prove the `cu12` path there: cuda-bindings 12.9,
# cuda-pathfinder and NVRTC 12 (its wheel alone is ~90 MB, over what a device call
# carries), unpacked as `pip install --target` would lay them out (dist-info kept: the
# cache key names the NVRTC wheel's version), without NVRTC's *.alt.so variants and the
# Cython sources, packed with xz: ~36 MB.
# Output: ./.cu12/cu12.tar.xz (ignored by git via .git/info/exclude).
# On the GPU machine (carry: [".cu12"]), start the command with:
#   mkdir -p /tmp/cu12 && tar -xJf .cu12/cu12.tar.xz -C /tmp/cu12 && export PYTHONPATH=/tmp/cu12:src || exit;
# and preload /tmp/cu12/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 (ctypes.CDLL) before gpuactors
# loads NVRTC: cuda-pathfinder would otherwise find the machine's NVRTC 13 (nvidia/cu13).
# Usage: .ci/fetch-cu12-bundle.sh [CUDA_BINDINGS_VERSION] [NVRTC_VERSION]
#        (defaults 12.9.* and 12.9.*; the GPU machine's Python is 3.12)
set -euo pipefail
bindings=${1:-12.9.*}
nvrtc=${2:-12.9.*}
top=$(git rev-parse --show-toplevel)
cd "$top"
exclude="$(git rev-parse --git-path info/exclude)"
grep -qx '/.cu12/' "$exclude" 2>/dev/null || echo '/.cu12/' >> "$exclude"
rm -rf .cu12 && mkdir -p .cu12/unpack
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d .cu12 "cuda-bindings==$bindings" cuda-pathfinder \
    "nvidia-cuda-nvrtc-cu12==$nvrtc" 2>&1 | grep -v '^WARNING: Location' || true
for wheel in .cu12/*.whl; do
    (cd .cu12/unpack && python3 -m zipfile -e "../${wheel##*/}" .)
done
find .cu12/unpack \( -name '*.alt.so*' -o -name '*.pyx' -o -name '*.pxd' \) -delete
tar -C .cu12/unpack -cf - . | xz -T0 -6 > .cu12/cu12.tar.xz
rm -rf .cu12/unpack .cu12/*.whl
ls -la .cu12
du -sh .cu12
