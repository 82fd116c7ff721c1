// Fully connected layers on oneDNN matmul over the caller's row-major matrices (transposes are
// strided views, no copies, for either weight layout); the bias gradient is a fixed-order column
// sum.
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

enum LinearPass : int64_t { kForward = 1, kBackwardData, kBackwardWeights };

PlanKey key(LinearPass pass, const LinearGeom& g, bool bias) {
  return make_key({kernel_kind<LinearForward>(), pass, g.m, g.k, g.n, bias, g.weight_in_out});
}

std::shared_ptr<const PrimitivePlan> forward_plan(PlanCache& plans, const LinearGeom& g,
                                                  bool bias) {
  check_linear_geom(g, "linear_forward");
  const auto x = plain_desc({g.m, g.k});
  // w^T (K, N): Conv1D's w as stored, or nn.Linear's w (N, K) viewed transposed.
  const auto w_t = g.weight_in_out ? plain_desc({g.k, g.n}) : strided_desc({g.k, g.n}, {1, g.k});
  const auto b = plain_desc({1, g.n});
  const auto y = plain_desc({g.m, g.n});
  return matmul_plan(plans, key(kForward, g, bias), x, w_t, bias ? &b : nullptr, y);
}

std::shared_ptr<const PrimitivePlan> backward_data_plan(PlanCache& plans, const LinearGeom& g) {
  check_linear_geom(g, "linear_backward_data");
  // w (N, K): nn.Linear's as stored, or Conv1D's (K, N) viewed transposed.
  const auto w = g.weight_in_out ? strided_desc({g.n, g.k}, {1, g.n}) : plain_desc({g.n, g.k});
  return matmul_plan(plans, key(kBackwardData, g, false), plain_desc({g.m, g.n}), w, nullptr,
                     plain_desc({g.m, g.k}));
}

std::shared_ptr<const PrimitivePlan> backward_weights_plan(PlanCache& plans, const LinearGeom& g) {
  check_linear_geom(g, "linear_backward_weights");
  if (g.weight_in_out) {  // dw (K, N) = x^T dy, x (M, K) viewed as (K, M)
    return matmul_plan(plans, key(kBackwardWeights, g, false), strided_desc({g.k, g.m}, {1, g.k}),
                       plain_desc({g.m, g.n}), nullptr, plain_desc({g.k, g.n}));
  }
  const auto dy_t = strided_desc({g.n, g.m}, {1, g.n});  // dy (M, N) viewed as (N, M)
  return matmul_plan(plans, key(kBackwardWeights, g, false), dy_t, plain_desc({g.m, g.k}), nullptr,
                     plain_desc({g.n, g.k}));
}

// out[j] = sum over rows i (in order) of dy[i * cols + j], for j in [begin, end).
FERRY_SIMD_CLONES void column_sums(const float* dy, int64_t rows, int64_t cols, int64_t begin,
                                   int64_t end, double* acc, float* out) {
  for (int64_t j = begin; j < end; ++j) acc[j - begin] = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = dy + i * cols;
    for (int64_t j = begin; j < end; ++j) acc[j - begin] += static_cast<double>(row[j]);
  }
  for (int64_t j = begin; j < end; ++j) out[j] = static_cast<float>(acc[j - begin]);
}

}  // namespace

uint64_t workspace(PlanCache& plans, const LinearForward& a) {
  return forward_plan(plans, a.g, a.bias != nullptr)->workspace_bytes();
}

uint64_t workspace(PlanCache& plans, const LinearBackwardData& a) {
  return backward_data_plan(plans, a.g)->workspace_bytes();
}

uint64_t workspace(PlanCache& plans, const LinearBackwardWeights& a) {
  return backward_weights_plan(plans, a.g)->workspace_bytes();
}

void run(PlanCache& plans, const LinearForward& a) {
  forward_plan(plans, a.g, a.bias != nullptr)
      ->execute({{DNNL_ARG_SRC, a.x},
                 {DNNL_ARG_WEIGHTS, a.w},
                 {DNNL_ARG_BIAS, a.bias},
                 {DNNL_ARG_DST, a.y}},
                a.ws, "linear_forward");
}

void run(PlanCache& plans, const LinearBackwardData& a) {
  backward_data_plan(plans, a.g)
      ->execute({{DNNL_ARG_SRC, a.dy}, {DNNL_ARG_WEIGHTS, a.w}, {DNNL_ARG_DST, a.dx}}, a.ws,
                "linear_backward_data");
}

void run(PlanCache& plans, const LinearBackwardWeights& a) {
  const LinearGeom& g = a.g;
  const void* src = g.weight_in_out ? a.x : a.dy;
  const void* weights = g.weight_in_out ? a.dy : a.x;
  backward_weights_plan(plans, g)->execute(
      {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, a.dw}}, a.ws,
      "linear_backward_weights");
  if (a.dbias == nullptr) return;
  constexpr int64_t kBlock = 256;  // columns per work item
  const int64_t blocks = (g.n + kBlock - 1) / kBlock;
  parallel_items(blocks, g.m * g.n, [&](int64_t b) {
    double acc[kBlock];
    const int64_t begin = b * kBlock;
    column_sums(a.dy, g.m, g.n, begin, std::min(g.n, begin + kBlock), acc, a.dbias);
  });
}

}  // namespace ferry::cpu
