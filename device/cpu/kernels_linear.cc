// Fully connected layers on oneDNN matmul over the caller's row-major matrices (transposes are
// strided views, no copies, for either weight layout); the bias gradient is a fixed-order column
// sum. In bf16 storage (Note [Storage dtype of a kernel]) x, w, y, dx and dy are bf16 and bias,
// dw and dbias fp32, multiplied in fp32 (Note [bf16 products in fp32] in widened_matmul.cc).
#include <bit>

#include "device/cpu/bf16_storage.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

enum LinearPass : int64_t { kForward = 1, kBackwardData, kBackwardWeights };

// One pass's product dst = src * weights [+ bias] on the caller's layouts (strided views, no
// copies).
struct Product {
  dnnl::memory::desc src, weights, dst;
  bool bias = false;
};

Product forward_product(const LinearGeom& g, bool bias, DType dtype) {
  check_linear_geom(g, "linear_forward");
  const auto t = dnnl_type(dtype);
  // w^T (K, N): Conv1D's w as stored, or nn.Linear's w (N, K) viewed transposed.
  const auto w_t =
      g.weight_in_out ? plain_desc({g.k, g.n}, t) : strided_desc({g.k, g.n}, {1, g.k}, t);
  return {plain_desc({g.m, g.k}, t), w_t, plain_desc({g.m, g.n}, t), bias};
}

Product backward_data_product(const LinearGeom& g, DType dtype) {
  check_linear_geom(g, "linear_backward_data");
  const auto t = dnnl_type(dtype);
  // w (N, K): nn.Linear's as stored, or Conv1D's (K, N) viewed transposed.
  const auto w =
      g.weight_in_out ? strided_desc({g.n, g.k}, {1, g.n}, t) : plain_desc({g.n, g.k}, t);
  return {plain_desc({g.m, g.n}, t), w, plain_desc({g.m, g.k}, t)};
}

// dw is fp32 in either storage.
Product backward_weights_product(const LinearGeom& g, DType dtype) {
  check_linear_geom(g, "linear_backward_weights");
  const auto t = dnnl_type(dtype);
  if (g.weight_in_out) {  // dw (K, N) = x^T dy, x (M, K) viewed as (K, M)
    return {strided_desc({g.k, g.m}, {1, g.k}, t), plain_desc({g.m, g.n}, t),
            plain_desc({g.k, g.n})};
  }
  const auto dy_t = strided_desc({g.n, g.m}, {1, g.n}, t);  // dy (M, N) viewed as (N, M)
  return {dy_t, plain_desc({g.m, g.k}, t), plain_desc({g.n, g.k})};
}

// A pass's cached plan: oneDNN's own matmul in the storage dtype, or in bf16 storage with
// PlanCache::widen_bf16_products() the fp32 matmul on widened operands (Note [bf16 products in
// fp32] in widened_matmul.cc).
class LinearPlan {
 public:
  LinearPlan(PlanCache& plans, LinearPass pass, const LinearGeom& g, const Product& p,
             DType dtype) {
    const bool widened = dtype == DType::kBF16 && plans.widen_bf16_products();
    const PlanKey key = make_key({kernel_kind<LinearForward>(), pass, g.m, g.k, g.n, p.bias,
                                  g.weight_in_out, static_cast<int64_t>(dtype), widened});
    const auto bias = plain_desc({1, g.n});
    if (widened) {
      widened_ = widened_matmul_plan(plans, key, p.src, p.weights, p.bias ? &bias : nullptr, p.dst);
    } else {
      native_ = matmul_plan(plans, key, p.src, p.weights, p.bias ? &bias : nullptr, p.dst);
    }
  }
  uint64_t workspace_bytes() const {
    return widened_ ? widened_->workspace_bytes() : native_->workspace_bytes();
  }
  void execute(const void* src, const void* weights, const void* bias, void* dst,
               const Workspace& ws, std::string_view what) const {
    if (widened_) {
      widened_->execute(src, weights, bias, dst, ws, what);
      return;
    }
    std::vector<std::pair<int, const void*>> ptrs{
        {DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst}};
    if (bias != nullptr) ptrs.emplace_back(DNNL_ARG_BIAS, bias);
    native_->execute(ptrs, ws, what);
  }

 private:
  std::shared_ptr<const PrimitivePlan> native_;
  std::shared_ptr<const WidenedMatmul> widened_;
};

LinearPlan forward_plan(PlanCache& plans, const LinearGeom& g, bool bias, DType dtype) {
  return LinearPlan(plans, kForward, g, forward_product(g, bias, dtype), dtype);
}

LinearPlan backward_data_plan(PlanCache& plans, const LinearGeom& g, DType dtype) {
  return LinearPlan(plans, kBackwardData, g, backward_data_product(g, dtype), dtype);
}

LinearPlan backward_weights_plan(PlanCache& plans, const LinearGeom& g, DType dtype) {
  return LinearPlan(plans, kBackwardWeights, g, backward_weights_product(g, dtype), dtype);
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

// column_sums over bf16 dy (its bits), the same order.
FERRY_SIMD_CLONES void column_sums_bf16(const uint16_t* dy, int64_t rows, int64_t cols,
                                        int64_t begin, int64_t end, double* acc, float* out) {
  for (int64_t j = begin; j < end; ++j) acc[j - begin] = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const uint16_t* row = dy + i * cols;
    for (int64_t j = begin; j < end; ++j) {
      acc[j - begin] +=
          static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(row[j]) << 16));
    }
  }
  for (int64_t j = begin; j < end; ++j) out[j] = static_cast<float>(acc[j - begin]);
}

}  // namespace

uint64_t workspace(PlanCache& plans, const LinearForward& a) {
  return forward_plan(plans, a.g, a.bias != nullptr, a.dtype).workspace_bytes();
}

uint64_t workspace(PlanCache& plans, const LinearBackwardData& a) {
  return backward_data_plan(plans, a.g, a.dtype).workspace_bytes();
}

uint64_t workspace(PlanCache& plans, const LinearBackwardWeights& a) {
  return backward_weights_plan(plans, a.g, a.dtype).workspace_bytes();
}

void run(PlanCache& plans, const LinearForward& a) {
  forward_plan(plans, a.g, a.bias != nullptr, a.dtype)
      .execute(a.x, a.w, a.bias, a.y, a.ws, "linear_forward");
}

void run(PlanCache& plans, const LinearBackwardData& a) {
  backward_data_plan(plans, a.g, a.dtype)
      .execute(a.dy, a.w, nullptr, a.dx, a.ws, "linear_backward_data");
}

void run(PlanCache& plans, const LinearBackwardWeights& a) {
  const LinearGeom& g = a.g;
  const void* src = g.weight_in_out ? a.x : a.dy;
  const void* weights = g.weight_in_out ? a.dy : a.x;
  backward_weights_plan(plans, g, a.dtype)
      .execute(src, weights, nullptr, a.dw, a.ws, "linear_backward_weights");
  if (a.dbias == nullptr) return;
  constexpr int64_t kBlock = 256;  // columns per work item
  const int64_t blocks = (g.n + kBlock - 1) / kBlock;
  parallel_items(blocks, g.m * g.n, [&](int64_t b) {
    double acc[kBlock];
    const int64_t begin = b * kBlock;
    const int64_t end = std::min(g.n, begin + kBlock);
    if (a.dtype == DType::kBF16) {
      column_sums_bf16(bf16_bits(a.dy), g.m, g.n, begin, end, acc, a.dbias);
    } else {
      column_sums(a.dy, g.m, g.n, begin, end, acc, a.dbias);
    }
  });
}

}  // namespace ferry::cpu
