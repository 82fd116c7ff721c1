#!/usr/bin/env bash
# Builds, on this (development) machine, everything scripts/gpu-check.sh runs on a GPU machine,
# and packs it with ../shared/tools/gpu-bundle into .gpubundle/: the trainer and every CUDA test
# binary this tree defines, with the libraries the GPU machine lacks (oneDNN, hwloc, OpenMPI,
# yaml-cpp, fmt). Bring the tree with .gpubundle/ to the GPU machine and run there:
#   .gpubundle/run scripts/gpu-check.sh
# Usage: scripts/gpu-bundle.sh [BUILD_DIR]   (default build; configured here if needed, with
# CUDA on). GPU_BUNDLE names the packing tool when ../shared is elsewhere.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
build=${1:-build}
tool=${GPU_BUNDLE:-$root/../shared/tools/gpu-bundle}
[[ -x $tool ]] || { echo "gpu-bundle.sh: $tool not found (set GPU_BUNDLE)" >&2; exit 2; }
[[ -f $build/CMakeCache.txt ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
if ! grep -q '^CMAKE_CUDA_COMPILER:.*nvcc' "$build/CMakeCache.txt"; then
  echo "gpu-bundle.sh: $build was configured without CUDA (no nvcc); nothing to bundle" >&2
  exit 2
fi
# The trainer plus every test target whose name says CUDA or NCCL.
targets=(trainer)
while read -r t; do
  targets+=("$t")
done < <(cmake --build "$build" --target help | sed -n 's/^\([a-z0-9_]*\(cuda\|nccl\)[a-z0-9_]*_test\):.*/\1/p' |
  sort -u)
echo "gpu-bundle.sh: building ${targets[*]}"
cmake --build "$build" -j"${JOBS:-2}" --target "${targets[@]}"
bins=("$build/trainer")
for t in "${targets[@]:1}"; do bins+=("$build/tests/$t"); done
"$tool" "${bins[@]}"
echo "gpu-bundle.sh: on the GPU machine run: .gpubundle/run scripts/gpu-check.sh"
