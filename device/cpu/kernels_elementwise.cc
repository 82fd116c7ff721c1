// Elementwise kernels (ReLU, add, accumulate, copy, fill, scale, dropout) as chunked loops.
// Every output element depends on its own inputs only, so any partition gives the same bits.
#include <cstring>

#include "device/counter_rng.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

// PyTorch's clamp_min(x, 0): a NaN stays NaN (oneDNN's eltwise ReLU turns it into 0, which
// would hide a diverged run; a loop is as fast, the kernel being bound by memory).
FERRY_SIMD_CLONES void relu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];
}

FERRY_SIMD_CLONES void relu_grad(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

FERRY_SIMD_CLONES void add(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

FERRY_SIMD_CLONES void accumulate(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

FERRY_SIMD_CLONES void fill(float* y, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) y[i] = value;
}

FERRY_SIMD_CLONES void scale(float* y, int64_t n, float alpha) {
  for (int64_t i = 0; i < n; ++i) y[i] *= alpha;
}

FERRY_SIMD_CLONES void dropout_grad(const float* dy, const uint8_t* mask, float* dx, int64_t n,
                                    float keep) {
  for (int64_t i = 0; i < n; ++i) dx[i] = mask[i] ? dy[i] / keep : 0.0f;
}

}  // namespace

void run(PlanCache&, const ReluForward& a) {
  check_element_count(a.n, "relu_forward");
  parallel_chunks(a.n, kParallelGrain,
                  [&](int64_t b, int64_t e) { relu(a.x + b, a.y + b, e - b); });
}

void run(PlanCache&, const ReluBackward& a) {
  check_element_count(a.n, "relu_backward");
  parallel_chunks(a.n, kParallelGrain,
                  [&](int64_t b, int64_t e) { relu_grad(a.y + b, a.dy + b, a.dx + b, e - b); });
}

void run(PlanCache&, const AddForward& a) {
  check_element_count(a.n, "add_forward");
  parallel_chunks(a.n, kParallelGrain,
                  [&](int64_t b, int64_t e) { add(a.a + b, a.b + b, a.y + b, e - b); });
}

void run(PlanCache&, const Accumulate& a) {
  check_element_count(a.n, "accumulate");
  parallel_chunks(a.n, kParallelGrain,
                  [&](int64_t b, int64_t e) { accumulate(a.x + b, a.y + b, e - b); });
}

void run(PlanCache&, const CopyDevice& a) {
  const auto* src = static_cast<const char*>(a.src);
  auto* dst = static_cast<char*>(a.dst);
  parallel_chunks(static_cast<int64_t>(a.bytes), 4 * kParallelGrain * sizeof(float),
                  [&](int64_t b, int64_t e) { std::memcpy(dst + b, src + b, e - b); });
}

void run(PlanCache&, const Fill& a) {
  check_element_count(a.n, "fill");
  parallel_chunks(a.n, kParallelGrain,
                  [&](int64_t b, int64_t e) { fill(a.y + b, e - b, a.value); });
}

void run(PlanCache&, const Scale& a) {
  check_element_count(a.n, "scale");
  parallel_chunks(a.n, kParallelGrain,
                  [&](int64_t b, int64_t e) { scale(a.y + b, e - b, a.alpha); });
}

void run(PlanCache&, const DropoutForward& a) {
  check_dropout_forward(a);
  const float keep = 1.0f - a.p;
  parallel_chunks(a.n, kParallelGrain / 4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const bool kept = counter_uniform(a.seed, a.offset + static_cast<uint64_t>(i)) >= a.p;
      a.mask[i] = kept ? 1 : 0;
      a.y[i] = kept ? a.x[i] / keep : 0.0f;
    }
  });
}

void run(PlanCache&, const DropoutBackward& a) {
  check_element_count(a.n, "dropout_backward");
  const float keep = 1.0f - a.p;
  parallel_chunks(a.n, kParallelGrain, [&](int64_t b, int64_t e) {
    dropout_grad(a.dy + b, a.mask + b, a.dx + b, e - b, keep);
  });
}

}  // namespace ferry::cpu
