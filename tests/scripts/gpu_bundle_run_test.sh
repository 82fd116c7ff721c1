#!/usr/bin/env bash
# The bundle's `run` replaces a stale unpacked bundle (issue 16): packs a binary with
# ../shared/tools/gpu-bundle in a scratch checkout, rewrites `run` with
# scripts/gpu-bundle-refresh.sh, runs it, packs another binary under the same name, and runs again
# on the same (warm) unpack directory: the tree must then hold the new binary. Without the rewrite
# the second run keeps the first binary. Also: a fresh tree with the same bundle gets the
# binaries. Exit 77 (a ctest skip) when the packing tool is absent.
#   tests/scripts/gpu_bundle_run_test.sh SOURCE_DIR
set -euo pipefail
src=${1:?source dir}
tool=${GPU_BUNDLE:-$src/../shared/tools/gpu-bundle}
[[ -x $tool ]] || { echo "SKIP: $tool not found"; exit 77; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export GPUBUNDLE_DIR=$scratch/unpacked  # never the machine's /tmp/gpubundle

pack() {  # tree binary: packs `binary` as build/prog in `tree`
  local tree=$1 binary=$2
  mkdir -p "$tree/build"
  [[ -d $tree/.git ]] || git init -q "$tree"
  cp "$binary" "$tree/build/prog"
  (cd "$tree" && "$tool" build/prog > /dev/null)
  "$src/scripts/gpu-bundle-refresh.sh" "$tree/.gpubundle/run" > /dev/null
}
fail() { echo "FAIL: $*"; exit 1; }

# The development machine packs /bin/true; the GPU machine's tree has none of the binaries.
pack "$scratch/dev" /bin/true
mkdir -p "$scratch/gpu"
cp -r "$scratch/dev/.gpubundle" "$scratch/gpu/"
"$scratch/gpu/.gpubundle/run" true || fail "the first run failed"
cmp -s "$scratch/gpu/build/prog" /bin/true || fail "the first run did not unpack build/prog"

# A new bundle (another binary under the same name) on the same warm machine.
pack "$scratch/dev" /bin/false
rm -rf "$scratch/gpu/.gpubundle"
cp -r "$scratch/dev/.gpubundle" "$scratch/gpu/"
"$scratch/gpu/.gpubundle/run" true || fail "the second run failed"
cmp -s "$scratch/gpu/build/prog" /bin/false ||
  fail "the second run kept the stale binary (the unpack directory held the previous bundle)"
cmp -s "$GPUBUNDLE_DIR/tree/build/prog" /bin/false || fail "the unpack directory is stale"

# Another tree, the same bundle: the directory is current, the tree still gets the binaries.
mkdir -p "$scratch/gpu2"
cp -r "$scratch/dev/.gpubundle" "$scratch/gpu2/"
"$scratch/gpu2/.gpubundle/run" true || fail "the run in a second tree failed"
cmp -s "$scratch/gpu2/build/prog" /bin/false || fail "a second tree did not get the binaries"

# The command runs from the tree's root, with the start time exported for gpu-check.sh.
t0=$("$scratch/gpu/.gpubundle/run" bash -c 'echo "$FERRY_CHECK_T0 $PWD"')
[[ $t0 =~ ^[0-9]+\ $scratch/gpu$ ]] || fail "unexpected environment: $t0"
echo "ok: the bundle's run replaces a stale unpacked bundle"
