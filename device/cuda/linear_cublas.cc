// cuBLAS linear layers. Note [Row-major products on cuBLAS]: a row-major (R, C) matrix is the
// column-major (C, R) matrix with leading dimension C, so each product of kernels.h is computed
// transposed: y = x w^T is y^T = w x^T, i.e. SGEMM(op_w = T, op_x = N) on the stored arrays.
// A weight stored (K, N) (LinearGeom.weight_in_out) is already the transposed array, so each
// product flips the weight's transpose flag and takes leading dimension N for it.
//
// Note [Linear layers in bf16]
// In bf16 storage (x, w, y, dy, dx bf16; bias, dw, dbias fp32: Note [Storage dtype of a kernel]
// in device/kernels.h) every product is one cublasGemmEx on bf16 inputs with fp32 accumulation
// (CUBLAS_COMPUTE_32F, tensor cores). y and dx are written bf16 by cuBLAS, rounded once; with a
// bias the forward's product goes to an fp32 block of the workspace (M x N) and one kernel adds
// the bias and rounds (launch_bias_to_bf16), so y is rounded once, as oneDNN's bf16 inner
// product does on the CPU. dw comes out fp32 straight from the GEMM (the fp32 gradient the
// design keeps), dbias as a GemmEx of dy by a bf16 vector of ones into fp32.
#include "device/cuda/linear_cublas.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_stream.h"
#include "device/cuda/elementwise.h"
#include "device/dtype.h"
#include "device/kernel_checks.h"

namespace ferry::cuda {

namespace {

uint64_t aligned(uint64_t bytes) { return CublasHandle::aligned(bytes); }

// The backend-neutral rule (device/kernel_checks.h), then cuBLAS's int dimensions.
void check(const LinearGeom& g, const char* what) {
  check_linear_geom(g, what);
  if (g.m > INT_MAX || g.k > INT_MAX || g.n > INT_MAX) {
    throw UnsupportedError(
        fmt::format("{}: M={} K={} N={} exceeds cuBLAS's int dimensions", what, g.m, g.k, g.n),
        "lower data.batch_size");
  }
}

int i32(int64_t v) { return static_cast<int>(v); }

// Bytes of a vector of `rows` ones, after the cuBLAS workspace; 0 without a bias.
uint64_t ones_bytes(bool bias, int64_t rows) {
  return bias ? aligned(static_cast<uint64_t>(rows) * sizeof(float)) : 0;
}

// The vector of `rows` ones after cuBLAS's `blas` bytes of ws, filled on `stream`.
const float* ones_after(const Workspace& ws, uint64_t blas, int64_t rows, cudaStream_t stream) {
  float* ones = reinterpret_cast<float*>(static_cast<char*>(ws.ptr) + blas);
  launch_fill(ones, rows, 1.0f, DType::kF32, stream);
  return ones;
}

constexpr float kOne = 1.0f;
constexpr float kZero = 0.0f;

bool bf16(DType dtype) { return dtype == DType::kBF16; }

// The kernel's storage dtype, kF32 or kBF16 (anything else is refused by name).
DType storage(DType dtype, const char* what) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    throw UnsupportedError(fmt::format("{}: the CUDA linear layer stores {} as fp32 or bf16 only",
                                       what, dtype_name(dtype)),
                           "set device.precision to fp32 or bf16");
  }
  return dtype;
}

// The fp32 (M x N) product a bf16 forward with a bias adds its bias to, after cuBLAS's scratch.
uint64_t bias_block_bytes(const LinearForward& a) {
  return bf16(a.dtype) && a.bias != nullptr
             ? aligned(static_cast<uint64_t>(a.g.m) * a.g.n * sizeof(float))
             : 0;
}

// C (m x n) = op(A) op(B) with bf16 A and B and `c_type` C, fp32 accumulation.
void gemm_bf16(cublasHandle_t h, cublasOperation_t op_a, cublasOperation_t op_b, int m, int n,
               int k, const float* a, int lda, const float* b, int ldb, void* c,
               cudaDataType_t c_type, int ldc) {
  CUBLAS_CHECK(cublasGemmEx(h, op_a, op_b, m, n, k, &kOne, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb,
                            &kZero, c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

CublasLinear::CublasLinear(const DeviceOptions& options) : blas_(options) {}

uint64_t CublasLinear::needed(bool bias, int64_t rows) {
  return blas_.workspace() + ones_bytes(bias, rows);
}

uint64_t CublasLinear::workspace_bytes(const LinearForward& a) {
  check(a.g, "linear_forward");
  std::lock_guard lock(mutex_);
  if (bf16(storage(a.dtype, "linear_forward"))) return needed(false, a.g.m) + bias_block_bytes(a);
  return needed(a.bias != nullptr, a.g.m);
}

uint64_t CublasLinear::workspace_bytes(const LinearBackwardData& a) {
  check(a.g, "linear_backward_data");
  storage(a.dtype, "linear_backward_data");
  std::lock_guard lock(mutex_);
  return needed(false, a.g.m);
}

uint64_t CublasLinear::workspace_bytes(const LinearBackwardWeights& a) {
  check(a.g, "linear_backward_weights");
  storage(a.dtype, "linear_backward_weights");
  std::lock_guard lock(mutex_);
  return needed(a.dbias != nullptr, a.g.m);
}

// y (M, N) = x (M, K) w^T [+ bias]: Y (N x M, ld N) = op_T(W (K x N, ld K)) X (K x M, ld K).
void CublasLinear::launch(const LinearForward& a, cudaStream_t stream) {
  check(a.g, "linear_forward");
  std::lock_guard lock(mutex_);
  const int m = i32(a.g.m), k = i32(a.g.k), n = i32(a.g.n);
  if (bf16(storage(a.dtype, "linear_forward"))) {
    cublasHandle_t h =
        blas_.bind(stream, a.ws, needed(false, a.g.m) + bias_block_bytes(a), "linear_forward");
    // With a bias, the fp32 product first (Note [Linear layers in bf16]).
    float* acc = a.bias != nullptr
                     ? reinterpret_cast<float*>(static_cast<char*>(a.ws.ptr) + blas_.workspace())
                     : a.y;
    const cudaDataType_t acc_type = a.bias != nullptr ? CUDA_R_32F : CUDA_R_16BF;
    if (a.g.weight_in_out) {
      gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, a.w, n, a.x, k, acc, acc_type, n);
    } else {
      gemm_bf16(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, a.w, k, a.x, k, acc, acc_type, n);
    }
    if (a.bias != nullptr) launch_bias_to_bf16(a.g.m, a.g.n, acc, a.bias, a.y, stream);
    return;
  }
  cublasHandle_t h = blas_.bind(stream, a.ws, needed(a.bias != nullptr, a.g.m), "linear_forward");
  if (a.g.weight_in_out) {
    // w (K, N) is the column-major (N x K, ld N) matrix W^T itself: no transpose.
    CUBLAS_CHECK(
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &kOne, a.w, n, a.x, k, &kZero, a.y, n));
  } else {
    CUBLAS_CHECK(
        cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &kOne, a.w, k, a.x, k, &kZero, a.y, n));
  }
  if (a.bias != nullptr) {
    // Y (N x M) += bias (N) * ones (M)^T.
    const float* ones = ones_after(a.ws, blas_.workspace(), a.g.m, stream);
    CUBLAS_CHECK(cublasSger(h, n, m, &kOne, a.bias, 1, ones, 1, a.y, n));
  }
}

// dx (M, K) = dy (M, N) w (N, K): DX (K x M, ld K) = W (K x N, ld K) DY (N x M, ld N).
void CublasLinear::launch(const LinearBackwardData& a, cudaStream_t stream) {
  check(a.g, "linear_backward_data");
  std::lock_guard lock(mutex_);
  cublasHandle_t h = blas_.bind(stream, a.ws, needed(false, a.g.m), "linear_backward_data");
  const int m = i32(a.g.m), k = i32(a.g.k), n = i32(a.g.n);
  if (bf16(storage(a.dtype, "linear_backward_data"))) {
    if (a.g.weight_in_out) {
      gemm_bf16(h, CUBLAS_OP_T, CUBLAS_OP_N, k, m, n, a.w, n, a.dy, n, a.dx, CUDA_R_16BF, k);
    } else {
      gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, a.w, k, a.dy, n, a.dx, CUDA_R_16BF, k);
    }
    return;
  }
  if (a.g.weight_in_out) {
    // dx = dy w^T, w (K, N): DX (K x M) = op_T(W^T (N x K, ld N)) DY.
    CUBLAS_CHECK(
        cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, k, m, n, &kOne, a.w, n, a.dy, n, &kZero, a.dx, k));
  } else {
    CUBLAS_CHECK(
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, &kOne, a.w, k, a.dy, n, &kZero, a.dx, k));
  }
}

// dw (N, K) = dy^T (N, M) x (M, K): DW (K x N, ld K) = X (K x M, ld K) op_T(DY (N x M, ld N)).
// dbias (N) = DY (N x M) * ones (M): the column sums of dy.
void CublasLinear::launch(const LinearBackwardWeights& a, cudaStream_t stream) {
  check(a.g, "linear_backward_weights");
  std::lock_guard lock(mutex_);
  cublasHandle_t h =
      blas_.bind(stream, a.ws, needed(a.dbias != nullptr, a.g.m), "linear_backward_weights");
  const int m = i32(a.g.m), k = i32(a.g.k), n = i32(a.g.n);
  if (bf16(storage(a.dtype, "linear_backward_weights"))) {
    // dw fp32 from bf16 x and dy (Note [Linear layers in bf16]).
    if (a.g.weight_in_out) {
      gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_T, n, k, m, a.dy, n, a.x, k, a.dw, CUDA_R_32F, n);
    } else {
      gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, a.x, k, a.dy, n, a.dw, CUDA_R_32F, k);
    }
    if (a.dbias != nullptr) {
      // DBIAS (N x 1) = DY (N x M, ld N) ONES (M x 1), ones in bf16.
      float* ones = reinterpret_cast<float*>(static_cast<char*>(a.ws.ptr) + blas_.workspace());
      launch_fill(ones, a.g.m, 1.0f, DType::kBF16, stream);
      gemm_bf16(h, CUBLAS_OP_N, CUBLAS_OP_N, n, 1, m, a.dy, n, ones, m, a.dbias, CUDA_R_32F, n);
    }
    return;
  }
  if (a.g.weight_in_out) {
    // dw (K, N) = x^T dy: DW^T (N x K, ld N) = DY (N x M, ld N) op_T(X (K x M, ld K)).
    CUBLAS_CHECK(
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, n, k, m, &kOne, a.dy, n, a.x, k, &kZero, a.dw, n));
  } else {
    CUBLAS_CHECK(
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, &kOne, a.x, k, a.dy, n, &kZero, a.dw, k));
  }
  if (a.dbias != nullptr) {
    const float* ones = ones_after(a.ws, blas_.workspace(), a.g.m, stream);
    CUBLAS_CHECK(cublasSgemv(h, CUBLAS_OP_N, n, m, &kOne, a.dy, n, ones, 1, &kZero, a.dbias, 1));
  }
}

}  // namespace ferry::cuda
