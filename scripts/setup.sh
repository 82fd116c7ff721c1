#!/usr/bin/env bash
# Installs what ferry needs from Debian's packages (and the safetensors wheel from PyPI for the
# interop tests), then configures and builds into build/. Idempotent: installs only what is
# missing and rebuilds only what changed. Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  libdnnl-dev ocl-icd-opencl-dev libhwloc-dev hwloc libopenmpi-dev openmpi-bin
  libturbojpeg0-dev libpng-dev
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev clang-format
  python3 python3-pip python3-torch python3-torchvision
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# The safetensors package (not in Debian) lets the tests check that PyPI's reader loads our
# checkpoints. Installed for the system python that has Debian's torch.
if ! /usr/bin/python3 -c "import safetensors" 2>/dev/null; then
  echo "setup: installing the safetensors wheel for /usr/bin/python3"
  /usr/bin/python3 -m pip install -q --break-system-packages safetensors ||
    echo "setup: warning: safetensors could not be installed; its interop test will skip"
fi

if [[ "${1:-}" != "--no-build" ]]; then
  if [[ ! -f build/build.ninja ]]; then
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
  fi
  cmake --build build -j "$(nproc)"
fi
