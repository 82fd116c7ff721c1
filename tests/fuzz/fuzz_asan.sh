#!/usr/bin/env bash
# Every fuzz driver under AddressSanitizer and UBSan: configures one sanitizer build beside the
# main one (<build>-asan/), builds the named fuzz targets there in one go (only the libraries
# they link), then runs each, so a single ctest entry owns the sanitizer build dir.
# Usage: tests/fuzz/fuzz_asan.sh SOURCE_DIR BINARY_DIR TARGET...
set -euo pipefail
src="$1"
asan="$2-asan"
shift 2
targets=("$@")
start=$SECONDS
# The sanitizer build is most of this test's time: with ASan and UBSan one file compiles in
# about 1/6 of the time at -O0 -g1 (line tables for the stack traces) as at -O2 -g, and the
# fuzzers still run in seconds. Configured once (a re-run costs seconds).
flags="-O0 -g1"
if [[ ! -f "$asan/build.ninja" ]] || ! grep -q "^CMAKE_CXX_FLAGS_RELWITHDEBINFO:STRING=$flags\$" \
    "$asan/CMakeCache.txt"; then
  cmake -S "$src" -B "$asan" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="$flags" -DCMAKE_C_FLAGS_RELWITHDEBINFO="$flags" \
    -DFERRY_SANITIZE=address,undefined -DFERRY_CUDA=off -DFERRY_BUILD_BENCH=OFF \
    > "$asan.configure.log" 2>&1 || { tail -30 "$asan.configure.log"; exit 1; }
fi
cmake --build "$asan" --target "${targets[@]}" > "$asan.build.log" 2>&1 ||
  { tail -30 "$asan.build.log"; exit 1; }
echo "sanitizer build of ${targets[*]}: $((SECONDS - start)) s"
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# Any allocation above 2 GiB fails the run: no parser may allocate from a header's claim.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_stack_use_after_return=1:max_allocation_size_mb=2048:allocator_may_return_null=0}
failed=()
for t in "${targets[@]}"; do
  t0=$SECONDS
  if "$asan/tests/$t" --gtest_brief=1; then
    echo "$t: passed under ASan+UBSan in $((SECONDS - t0)) s"
  else
    echo "$t: FAILED under ASan+UBSan"
    failed+=("$t")
  fi
done
echo "fuzz_asan total: $((SECONDS - start)) s"
if ((${#failed[@]})); then
  echo "failed: ${failed[*]}"
  exit 1
fi
