#!/usr/bin/env bash
# The topology fuzz driver under AddressSanitizer and UBSan: configures a sanitizer build of
# the topology targets only (build-asan/ beside build/), then runs the fuzzer there.
# Usage: tests/topology/fuzz_asan.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src="$1"
asan="$2-asan"
if [[ ! -f "$asan/build.ninja" ]]; then
  cmake -S "$src" -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFERRY_SANITIZE=address,undefined -DFERRY_CUDA=off -DFERRY_BUILD_BENCH=OFF > "$asan.configure.log"
fi
cmake --build "$asan" --target topology_fuzz_test topo-probe > "$asan.build.log" 2>&1 ||
  { tail -30 "$asan.build.log"; exit 1; }
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$asan/tests/topology_fuzz_test"
