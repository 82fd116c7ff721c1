#!/usr/bin/env bash
# The one-command GPU check, made to fit one 10-minute GPU loan. On a machine with an NVIDIA
# GPU, from the tree's root, through the bundle that scripts/gpu-bundle.sh built on the
# development machine:
#   .gpubundle/run scripts/gpu-check.sh
# First the first-look probes (what cuDNN's Find and heuristics report under FMA math, the
# gated copies under a short timeout), then every CUDA test binary in the bundle (the op parity
# suites and the training tests, one row per training test: CUDA/CPU loss parity and bitwise
# offload; two CUDA jobs sharing the GPU under memory.share, one row per test),
# compute-sanitizer memcheck on 3 steps of resnet18_cifar under vdnn-all with the heuristics'
# algorithms (device.algorithms=heuristic: the sanitizer never times every algorithm), and the
# benchmark (scripts/gpu-bench.sh); then one table: test, result (PASS,
# FAIL, SKIP, INFO), figure. Every row runs under its own `timeout` (a hung row is a FAIL that
# says so, and the next row runs) and every SKIP and FAIL says why.
# Exit status: 0 all ran and passed, 1 something failed, 77 no GPU here (nothing run).
# The whole check keeps to FERRY_CHECK_BUDGET_S seconds (default 540, 9 minutes) counted from
# FERRY_CHECK_T0 (the bundle's `run` sets it before unpacking, so unpacking counts): each row
# gets at most its own cap and what is left, and a row that finds too little left is a SKIP.
# FERRY_CHECK_NO_BENCH=1 leaves the benchmark out; FERRY_CHECK_FORCE=1 runs everything even
# where no GPU is seen (to try the script itself: the tests then skip or fail). Logs:
# /tmp/ferry-gpu-check/.
set -uo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || dirname "$(dirname "$0")")"
out=${FERRY_CHECK_DIR:-/tmp/ferry-gpu-check}
rm -rf "$out"
mkdir -p "$out"
rows=$out/rows.tsv
: > "$rows"
start=${FERRY_CHECK_T0:-$(date +%s)}

row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$rows"; }

budget=${FERRY_CHECK_BUDGET_S:-540}
left() { echo $((budget - ($(date +%s) - start))); }
# The time a stage may take: at most `cap` seconds and what is left of the budget; 0 when less
# than a minimum is left.
allow() {  # cap [min]
  local l
  l=$(left)
  ((l < ${2:-20})) && { echo 0; return; }
  echo $((l < $1 ? l : $1))
}

table() {
  python3 - "$rows" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
rows = [("test", "result", "figure")] + [tuple((r + ["", "", ""])[:3]) for r in rows]
w0 = max(len(r[0]) for r in rows)
w1 = max(len(r[1]) for r in rows)
for i, r in enumerate(rows):
    print(f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]}")
    if i == 0:
        print(f"{'-' * w0}  {'-' * w1}  {'-' * 6}")
PY
}

gpu_present() {
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi -L 2> /dev/null | grep -q '^GPU '
  else
    [[ -e /dev/nvidia0 ]]
  fi
}

if ! gpu_present && [[ ${FERRY_CHECK_FORCE:-0} != 1 ]]; then
  echo "gpu-check: no GPU on this machine (no nvidia-smi listing, no /dev/nvidia0); nothing was run."
  echo "gpu-check: build the bundle here with scripts/gpu-bundle.sh, then run"
  echo "gpu-check: '.gpubundle/run scripts/gpu-check.sh' on a machine with an NVIDIA GPU."
  exit 77
fi
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
  head -n 1)
echo "gpu-check: ${gpu:-no GPU seen (FERRY_CHECK_FORCE=1)}; logs in $out"

# A gtest binary: one row (or one per test case with --per-test), under its own timeout of at
# most `cap` seconds (SIGKILL 5 s after SIGTERM, so a hung CUDA call cannot hold the row).
gtest() {  # label, binary, cap, [--per-test], [gtest filter]
  local label=$1 bin=$2 cap=$3 per_test=${4:-} filter=${5:-*}
  if [[ ! -x $bin ]]; then
    row "$label" SKIP "$bin is not in the bundle (not built on this branch)"
    return
  fi
  local name
  name=$(basename "$bin")
  [[ $filter != "*" ]] && name=$name.$(printf '%s' "$filter" | tr -c 'A-Za-z0-9' '_')
  local t0=$SECONDS limit
  limit=$(allow "$cap")
  if ((limit == 0)); then
    row "$label" SKIP "out of the ${budget}s budget"
    return
  fi
  timeout -k 5 "$limit" "$bin" --gtest_filter="$filter" --gtest_output="json:$out/$name.json" \
    > "$out/$name.log" 2>&1
  local rc=$?
  python3 - "$out/$name.json" "$label" "$rc" "$((SECONDS - t0))" "$per_test" "$out/$name.log" \
    >> "$rows" <<'PY'
import json, sys
path, label, rc, secs, per_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
# gtest's JSON may omit why a test skipped: the log has "file:line: Skipped" then the reason.
log = open(sys.argv[6], errors="replace").read().splitlines() if len(sys.argv) > 6 else []
skip_reason = next((log[i + 1].strip() for i in range(len(log) - 1)
                    if log[i].endswith(": Skipped") and log[i + 1].strip()), "")
try:
    suites = json.load(open(path))["testsuites"]
except Exception:
    why = "timed out (its own timeout)" if rc in (124, 137) else f"exit {rc}, no gtest report"
    print(f"{label}\tFAIL\t{why} ({secs}s)")
    sys.exit()
cases = [(s["name"] + "." + t["name"], t) for s in suites for t in s["testsuite"]]
def state(t):
    if t.get("failures"):
        return "FAIL"
    return "SKIP" if t.get("result") == "SKIPPED" else "PASS"
def first_line(t):
    msgs = [f["failure"] for f in t.get("failures", [])] + [t.get("skipped_message", "")]
    line = next((m.strip().splitlines()[-1] for m in msgs if m.strip()), "")
    return line or (skip_reason if state(t) == "SKIP" else "")
if per_test:
    for name, t in cases:
        s = state(t)
        fig = f"{float(t.get('time', '0s').rstrip('s')):.1f}s"
        if s != "PASS" and first_line(t):
            fig += ": " + first_line(t)[:100]
        print(f"{label}: {name}\t{s}\t{fig}")
    if rc != 0 and not any(state(t) == "FAIL" for _, t in cases):
        print(f"{label}\tFAIL\texit {rc}")
    sys.exit()
n = {k: sum(state(t) == k for _, t in cases) for k in ("PASS", "FAIL", "SKIP")}
result = "FAIL" if n["FAIL"] or rc != 0 else ("SKIP" if n["SKIP"] and not n["PASS"] else "PASS")
fig = f"{n['PASS']} passed, {n['SKIP']} skipped, {n['FAIL']} failed ({secs}s)"
failed = [name for name, t in cases if state(t) == "FAIL"]
if failed:
    fig += "; first failure " + failed[0]
elif result == "SKIP":
    fig += ": " + next((first_line(t) for _, t in cases if first_line(t)), "")[:100]
print(f"{label}\t{result}\t{fig}")
PY
}

# First-look probes: the facts the rest depends on, cheap, under short timeouts.
# 1. What Find and the heuristics report under FMA math (Note [Choosing convolution algorithms]).
probe=build/tests/cuda_find_probe_test
if [[ ! -x $probe ]]; then
  row "probe: cuDNN Find math types" SKIP "$probe is not in the bundle"
else
  timeout -k 5 "$(allow 60 10)" "$probe" > "$out/find_probe.log" 2>&1
  rc=$?
  summary=$(sed -n 's/^find-probe: \([a-z-]*\) \([a-z]*\): \([0-9]* ok, [0-9]* fma, [0-9]* fma+det\).*/\1 \2: \3/p' \
    "$out/find_probe.log" | paste -sd ';' | cut -c 1-300)
  if grep -q '\[  SKIPPED \]' "$out/find_probe.log"; then
    row "probe: cuDNN Find math types" SKIP "$(grep -m 1 -o 'no CUDA device present' "$out/find_probe.log")"
  elif ((rc == 0)); then
    row "probe: cuDNN Find math types" PASS "$summary"
  else
    row "probe: cuDNN Find math types" FAIL "exit $rc${summary:+: $summary}"
  fi
fi
# 2. The gated copies (host-memory polling of the gate flags; a VM where it does not work hangs
# here for at most a minute instead of eating the budget).
gtest "probe: gated copy streams" build/tests/cuda_gated_copy_test 60

# Every CUDA test binary the bundle holds, the known ones first with their role and cap.
gtest "cuda device" build/tests/cuda_device_test 60
gtest "conv algorithm cache" build/tests/cuda_algorithm_cache_test 20
gtest "op parity (cuDNN conv, cuBLAS linear)" build/tests/cuda_conv_linear_test 120
gtest "op parity (other kernels)" build/tests/cuda_kernel_parity_test 60
# bf16 storage (docs/precision.md, "On a GPU"): cuDNN/cuBLAS bf16 products and the bf16 .cu
# kernels against the CPU backend, one row each (the full binaries below run them again).
gtest "bf16: cuDNN conv, cuBLAS linear" build/tests/cuda_conv_linear_test 60 "" \
  "CudaBf16ConvLinear.*"
gtest "bf16: op parity (other kernels)" build/tests/cuda_kernel_parity_test 60 "" \
  "CudaBf16ParityTest.*"
gtest "bf16: transformer kernels, cuBLAS attention" build/tests/cuda_transformer_parity_test 60 "" \
  "CudaBf16TransformerParityTest.*"
gtest "bf16: fused attention (flash_attention.cu)" build/tests/cuda_transformer_parity_test 60 "" \
  "CudaFlashAttentionParityTest.Bf16*"
gtest "bf16: Llama kernels (RMSNorm, rotary qkv, SwiGLU)" build/tests/cuda_llama_parity_test 60 "" \
  "CudaBf16LlamaParityTest.*"
gtest "training on the GPU" build/tests/cuda_training_test 200 --per-test
gtest "nccl" build/tests/comm_nccl_test 60
# memory.share: two trainer processes on GPU 0, each with device.memory of 60% of it (mapped on
# use), then a shrink and a growth as the second comes and goes (about a minute).
gtest "memory.share: two CUDA jobs on one GPU" build/tests/cuda_share_test 120 --per-test
for bin in build/tests/*cuda*_test; do
  case $(basename "$bin") in
    cuda_device_test | cuda_conv_linear_test | cuda_kernel_parity_test | cuda_training_test | \
      cuda_find_probe_test | cuda_gated_copy_test | cuda_algorithm_cache_test | cuda_share_test) ;;
    *) [[ -x $bin ]] && gtest "cuda $(basename "$bin")" "$bin" 60 ;;
  esac
done

# compute-sanitizer: on PATH, in the toolkit, or in a Python wheel.
sanitizer=$(command -v compute-sanitizer 2>/dev/null || true)
[[ -z $sanitizer && -x /usr/local/cuda/bin/compute-sanitizer ]] &&
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
if [[ -z $sanitizer ]]; then
  sanitizer=$(python3 -c 'import glob,nvidia
print(next(iter(sorted(p for d in nvidia.__path__ for p in glob.glob(d+"/**/compute-sanitizer", recursive=True)))),""))' 2>/dev/null)
fi
# ... or the one scripts/gpu-bundle.sh packed.
if [[ -z $sanitizer && -f .gpubundle/sanitizer.tar.xz ]]; then
  mkdir -p /tmp/ferry-sanitizer
  tar xJf .gpubundle/sanitizer.tar.xz -C /tmp/ferry-sanitizer &&
    sanitizer=/tmp/ferry-sanitizer/sanitizer/bin/compute-sanitizer
fi
label="memcheck resnet18_cifar vdnn-all 3 steps (heuristic algorithms)"
if [[ -z $sanitizer || ! -x $sanitizer ]]; then
  row "$label" SKIP "compute-sanitizer not found (PATH, /usr/local/cuda/bin, nvidia wheels)"
elif [[ ! -x build/trainer ]]; then
  row "$label" SKIP "build/trainer is not in the bundle"
elif (($(allow 180 60) == 0)); then
  row "$label" SKIP "out of the ${budget}s budget"
else
  t0=$SECONDS
  # device.algorithms=heuristic: cuDNN ranks the algorithms without running them, so memcheck
  # instruments only the kernels training runs, not every candidate of every geometry.
  timeout -k 5 "$(allow 180 60)" "$sanitizer" --tool memcheck --error-exitcode 9 --print-limit 20 \
    build/trainer train configs/quickstart.yaml model.name=resnet18_cifar device.backend=cuda \
    device.memory=4GiB device.algorithms=heuristic memory.policy=vdnn-all memory.measure=false \
    data.batch_size=32 run.steps=3 run.log_every=1 checkpoint.every=0 run.dir="$out/memcheck" \
    > "$out/memcheck.log" 2>&1
  rc=$?
  summary=$(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$out/memcheck.log" | tail -n 1)
  if [[ $rc -eq 0 && $summary == "ERROR SUMMARY: 0 errors" ]]; then
    row "$label" PASS "$summary ($((SECONDS - t0))s)"
  elif ((rc == 124 || rc == 137)); then
    row "$label" FAIL "timed out (its own timeout) after $((SECONDS - t0))s${summary:+, $summary}"
  else
    row "$label" FAIL "exit $rc, ${summary:-no summary}: $(grep -m 1 -iE 'invalid|error' "$out/memcheck.log" |
      cut -c 1-100)"
  fi
fi

if [[ ${FERRY_CHECK_NO_BENCH:-0} != 1 ]]; then
  limit=$(allow 100000 60)
  if ((limit == 0)); then
    row "benchmark" SKIP "out of the ${budget}s budget"
  else
    FERRY_BENCH_DIR=$out/bench FERRY_BENCH_STEPS=${FERRY_BENCH_STEPS:-6} timeout -k 5 "$limit" \
      scripts/gpu-bench.sh --rows > /dev/null 2> "$out/bench.log"
    rc=$?
    cat "$out/bench/rows.tsv" >> "$rows" 2> /dev/null
    ((rc == 124 || rc == 137)) &&
      row "benchmark" SKIP "stopped at the ${budget}s budget; rows above are complete"
    [[ -s $out/bench/rows.tsv ]] ||
      row "benchmark" FAIL "scripts/gpu-bench.sh wrote no rows (see $out/bench.log)"
  fi
fi

echo
table
failed=$(cut -f 2 "$rows" | grep -c '^FAIL$')
echo
echo "gpu-check: $failed failed, $(($(date +%s) - start))s in all${gpu:+, on $gpu}"
[[ $failed -eq 0 ]]
