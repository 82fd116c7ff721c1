#!/usr/bin/env bash
# Builds, on this (development) machine, everything scripts/gpu-check.sh runs on a GPU machine,
# and packs it with ../shared/tools/gpu-bundle into .gpubundle/: the trainer and every CUDA test
# binary this tree defines, with the libraries the GPU machine lacks (oneDNN, hwloc, OpenMPI,
# yaml-cpp, fmt). Bring the tree with .gpubundle/ to the GPU machine and run there:
#   .gpubundle/run scripts/gpu-check.sh
# It also packs compute-sanitizer (for the memcheck row), taken from PyPI's
# nvidia-cuda-sanitizer-api wheel of CUDA 13.0, as .gpubundle/sanitizer.tar.xz; gpu-check.sh
# unpacks it when the GPU machine has none. --no-sanitizer leaves it out. The bundle's `run`
# replaces a stale unpacked bundle on a reused machine (scripts/gpu-bundle-refresh.sh).
# Usage: scripts/gpu-bundle.sh [--no-sanitizer] [BUILD_DIR]   (default build; configured here
# if needed, with CUDA on). GPU_BUNDLE names the packing tool when ../shared is elsewhere.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
sanitizer=true
if [[ ${1:-} == --no-sanitizer ]]; then
  sanitizer=false
  shift
fi
build=${1:-build}
tool=${GPU_BUNDLE:-$root/../shared/tools/gpu-bundle}
[[ -x $tool ]] || { echo "gpu-bundle.sh: $tool not found (set GPU_BUNDLE)" >&2; exit 2; }
[[ -f $build/CMakeCache.txt ]] || cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
if ! cmake --build "$build" --target help | grep -q '^ferry_device_cuda:'; then
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
# The packing tool writes .gpubundle/ at the root of the git checkout it runs in and records it
# in that checkout's .git/info/exclude, which a worktree (.git is a file) does not have: pack in
# a scratch checkout holding copies of the binaries, then move the bundle here.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
git init -q "$stage"
for b in "${bins[@]}"; do
  mkdir -p "$stage/$(dirname "$b")"
  cp "$b" "$stage/$b"
done
(cd "$stage" && "$tool" "${bins[@]}")
rm -rf .gpubundle
mv "$stage/.gpubundle" .gpubundle
# The tool's `run` would keep a stale bundle on a reused GPU machine: make it replace one.
"$root/scripts/gpu-bundle-refresh.sh" .gpubundle/run
if $sanitizer; then
  wheels=$stage/wheels
  if pip download --quiet --no-deps "nvidia-cuda-sanitizer-api==13.0.*" -d "$wheels" 2>&1; then
    python3 - "$wheels"/nvidia_cuda_sanitizer_api-*.whl "$stage/sanitizer" <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        parts = name.split("/")
        if len(parts) >= 4 and parts[0] == "nvidia" and parts[2] in ("bin", "lib"):
            dest = os.path.join(out, *parts[2:])
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(z.read(name))
            os.chmod(dest, 0o755)
PY
    tar cJf .gpubundle/sanitizer.tar.xz -C "$stage" sanitizer
    echo "gpu-bundle.sh: compute-sanitizer packed ($(du -h .gpubundle/sanitizer.tar.xz | cut -f1))"
  else
    echo "gpu-bundle.sh: could not fetch nvidia-cuda-sanitizer-api; the memcheck row will need" \
      "compute-sanitizer on the GPU machine" >&2
  fi
fi
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF "/.gpubundle/" "$exclude" 2>/dev/null || echo "/.gpubundle/" >> "$exclude"
echo "gpu-bundle.sh: on the GPU machine run: .gpubundle/run scripts/gpu-check.sh"
