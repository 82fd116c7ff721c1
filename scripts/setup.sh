#!/usr/bin/env bash
# Installs what ferry needs from Debian's packages, then configures and builds into build/.
# Idempotent: installs only what is missing and rebuilds only what changed.
# Usage: scripts/setup.sh [--quickstart | --no-build]
#   (default)     everything: the build, the tests' peers (PyTorch, torchvision, the safetensors
#                 wheel) and every target
#   --quickstart  only what `trainer train` needs, and only the trainer target: what
#                 scripts/run.sh uses, so a new user sees training start sooner
#   --no-build    install everything, build nothing
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-all}"
case "$mode" in
  all | --quickstart | --no-build) ;;
  *)
    echo "usage: scripts/setup.sh [--quickstart | --no-build]" >&2
    exit 2
    ;;
esac

# What configuring and building needs. oneDNN's CMake config requires the OpenCL headers, which
# libdnnl-dev only recommends (so --no-install-recommends would leave them out).
build_packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libdnnl-dev ocl-icd-opencl-dev libhwloc-dev hwloc libopenmpi-dev openmpi-bin
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libturbojpeg0-dev libpng-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)
# The tests' and benchmarks' peers: PyTorch for golden and benchmark references, on the
# optimized BLAS a user gets (OpenBLAS's OpenMP build: its pthread build fights torch's own
# threads; the reference BLAS runs one core at ~5 GFLOP/s), threadpoolctl to report it.
test_packages=(
  clang-format python3 python3-pip python3-torch python3-torchvision python3-pil
  libopenblas0-openmp python3-threadpoolctl
  python3-regex python3-tqdm python3-filelock python3-packaging python3-requests python3-yaml
  iproute2 util-linux procps
)
packages=("${build_packages[@]}")
if [[ "$mode" != "--quickstart" ]]; then packages+=("${test_packages[@]}"); fi

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

# The peer's libblas.so.3 / liblapack.so.3 is OpenBLAS's OpenMP build (its alternative's
# priority wins in auto mode; set it in case an administrator chose another).
if [[ "$mode" != "--quickstart" ]]; then
  multiarch=$(gcc -print-multiarch)
  for lib in libblas.so.3 liblapack.so.3; do
    want=/usr/lib/$multiarch/openblas-openmp/$lib
    now=$(update-alternatives --query "$lib-$multiarch" 2>/dev/null | sed -n 's/^Value: //p')
    if [[ -e "$want" && "$now" != "$want" ]]; then
      echo "setup: selecting $want for $lib"
      sudo_cmd=()
      if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
      "${sudo_cmd[@]}" update-alternatives --set "$lib-$multiarch" "$want"
    fi
  done
fi

# The safetensors package (not in Debian) lets the tests check that PyPI's reader loads our
# checkpoints. Installed for the system python that has Debian's torch.
if [[ "$mode" != "--quickstart" ]] && ! /usr/bin/python3 -c "import safetensors" 2>/dev/null; then
  echo "setup: installing the safetensors wheel for /usr/bin/python3"
  /usr/bin/python3 -m pip install -q --break-system-packages safetensors ||
    echo "setup: warning: safetensors could not be installed; its interop test will skip"
fi

# Hugging Face transformers (not in Debian) is the GPT-2 reference, and tokenizers reads the
# tokenizer.json of scripts/prepare_tokens.py --tokenizer PATH. Pinned to the last releases
# that run on Debian's torch 1.13; their Python dependencies come from Debian (above).
hf_wheels=(transformers==4.46.3 tokenizers==0.20.3 huggingface_hub==0.26.2)
if [[ "$mode" != "--quickstart" ]] &&
  ! /usr/bin/python3 -c "import transformers, tokenizers" 2>/dev/null; then
  echo "setup: installing ${hf_wheels[*]} for /usr/bin/python3"
  hf_installed=0
  /usr/bin/python3 -m pip install -q --break-system-packages --no-deps "${hf_wheels[@]}" &&
    hf_installed=1
  if ((!hf_installed)); then
    echo "setup: warning: transformers could not be installed; the GPT-2 parity tests and" \
      "prepare_tokens_test will skip"
  fi
  missing+=(transformers)  # reconfigure: the parity tests register by what python3 imports
fi

if [[ "$mode" != "--no-build" ]]; then
  # Configure once; again when this run installed packages, since the configuration records
  # what is there (the tests' PyTorch peers register as skipped without /usr/bin/python3).
  if [[ ! -f build/build.ninja ]] || ((${#missing[@]})); then
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
  fi
  if [[ "$mode" == "--quickstart" ]]; then
    cmake --build build -j "$(nproc)" --target trainer
  else
    cmake --build build -j "$(nproc)"
  fi
fi
