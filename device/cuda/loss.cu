// Softmax cross-entropy. Forward: rows spread over many blocks, one row per thread in double
// precision (as the CPU backend); each row's loss and hit go to scratch, and one thread adds them
// in row order, as the CPU backend does, so the loss is the same bits on every run and for every
// grid (Note [Deterministic multi-block reductions] in kernel_ops.h) and nothing waits on the
// host. Backward: one thread per logit. Logits, probabilities and their gradient in fp32 or bf16
// storage, the softmax, log-sum-exp and loss in double and fp32 (Note [bf16 storage in the CUDA
// kernels]).
#include "device/cuda/kernel_ops.h"
#include "device/cuda/launch.cuh"
#include "device/cuda/storage.cuh"

namespace ferry::cuda {
namespace {

// Rows per forward block (one warp): a batch of 256 rows spreads over 8 multiprocessors.
constexpr int kLossRowsPerBlock = 32;

// Rows [first, first + rows) of the batch: probabilities, and each row's loss and hit (1 or 0)
// into row_loss[r] and row_hit[r] for row first + r.
template <typename S>
__global__ void __launch_bounds__(kLossRowsPerBlock)
    xent_rows_kernel(int64_t first, int64_t rows, int64_t k, const S* logits, const int32_t* labels,
                     S* probs, double* row_loss, double* row_hit) {
  const double nan = __longlong_as_double(0x7ff8000000000000ll);
  FERRY_GRID_STRIDE(r, rows) {
    const int64_t i = first + r;
    const S* z = logits + i * k;
    const int32_t label = labels[i];
    const bool valid = label < k;  // a negative label: padding, which adds exactly 0
    const bool labelled = label >= 0;
    int64_t argmax = 0;
    for (int64_t j = 1; j < k; ++j) {
      if (as_f32(z[j]) > as_f32(z[argmax])) argmax = j;
    }
    const double top = as_f32(z[argmax]);
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += exp(static_cast<double>(as_f32(z[j])) - top);
    const double lse = valid ? top + log(sum) : nan;
    if (probs != nullptr) {
      S* p = probs + i * k;
      for (int64_t j = 0; j < k; ++j) {
        p[j] = as_storage<S>(static_cast<float>(exp(as_f32(z[j]) - lse)));
      }
    }
    row_loss[r] = !valid ? nan : labelled ? lse - static_cast<double>(as_f32(z[label])) : 0.0;
    row_hit[r] = valid && labelled && argmax == label ? 1.0 : 0.0;
  }
}

// Adds the piece's rows in row order onto the running total (running[0], running[1]; started
// at zero for the first piece); after the last piece writes the total over `divisor` and the
// correct count. One thread: N additions are cheap next to the rows' N*K exponentials.
__global__ void xent_total_kernel(int64_t first, int64_t rows, int64_t n, double divisor,
                                  const double* row_loss, const double* row_hit, double* running,
                                  float* loss, int32_t* correct) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = first == 0 ? 0.0 : running[0];
  double hits = first == 0 ? 0.0 : running[1];
  for (int64_t r = 0; r < rows; ++r) {
    total += row_loss[r];
    hits += row_hit[r];
  }
  running[0] = total;
  running[1] = hits;
  if (first + rows == n) {
    loss[0] = static_cast<float>(total / divisor);
    if (correct != nullptr) correct[0] = static_cast<int32_t>(hits);
  }
}

template <typename S>
__global__ void xent_backward_kernel(int64_t n, int64_t k, float factor, const S* probs,
                                     const int32_t* labels, S* dlogits) {
  const float nan = __int_as_float(0x7fc00000);
  FERRY_GRID_STRIDE(q, n * k) {
    const int64_t i = q / k, j = q % k;
    const int32_t label = labels[i];
    if (label >= k) {
      dlogits[q] = as_storage<S>(nan);
      continue;
    }
    if (label < 0) {  // padding: exactly no gradient
      dlogits[q] = as_storage<S>(0.0f);
      continue;
    }
    dlogits[q] = as_storage<S>((as_f32(probs[q]) - (j == label ? 1.0f : 0.0f)) * factor);
  }
}

}  // namespace

void launch_softmax_cross_entropy_forward(int64_t n, int64_t k, const float* logits,
                                          const int32_t* labels, float* loss, float* probs,
                                          int32_t* correct, double divisor, DType dtype,
                                          const ReductionScratch& scratch, cudaStream_t stream) {
  double* row_loss = scratch.ptr;
  double* row_hit = scratch.ptr + kReductionPartials;
  double* running = scratch.ptr + 2 * kReductionPartials;
  // Pieces of at most kReductionPartials rows, in order: the total stays the row-order sum.
  for (int64_t first = 0; first < n; first += kReductionPartials) {
    const int64_t rows = n - first < kReductionPartials ? n - first : kReductionPartials;
    const auto blocks =
        static_cast<unsigned int>((rows + kLossRowsPerBlock - 1) / kLossRowsPerBlock);
    with_storage(dtype, [&](auto tag) {
      using S = typename decltype(tag)::type;
      launch_kernel(xent_rows_kernel<S>, blocks, kLossRowsPerBlock, stream, first, rows, k,
                    stored<S>(logits), labels, stored<S>(probs), row_loss, row_hit);
    });
    launch_kernel(xent_total_kernel, 1, 1, stream, first, rows, n, divisor, row_loss, row_hit,
                  running, loss, correct);
  }
}

void launch_softmax_cross_entropy_backward(int64_t n, int64_t k, float factor, const float* probs,
                                           const int32_t* labels, float* dlogits, DType dtype,
                                           cudaStream_t stream) {
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(xent_backward_kernel<S>, grid_for(n * k), kThreads, stream, n, k, factor,
                  stored<S>(probs), labels, stored<S>(dlogits));
  });
}

}  // namespace ferry::cuda
