// The storage types of the CUDA kernels: fp32 (float) or bf16 (__nv_bfloat16) elements behind
// the kernels' float pointers (Note [Storage dtype of a kernel] in device/kernels.h), read as fp32
// and written rounded once. Invariant: a bf16 store rounds exactly as the CPU backend narrows
// (device/bf16.h's float_to_bf16), so one fp32 value gives the same bits on both backends.
#pragma once

#include "device/bf16.h"
#include "device/cuda/launch.cuh"
#include "device/dtype.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>  // the host emulation's launch.cuh supplies a stand-in
#endif

namespace ferry::cuda {

// Note [bf16 storage in the CUDA kernels]
// A kernel that takes bf16 operands is one template over its storage type S (float or Bf16), so
// fp32 and bf16 share one source: every read of an S operand goes through as_f32 (exact) and the
// math is the fp32 kernel's, unchanged; every write of an S operand goes through as_storage<S>,
// which for bf16 is ferry's own round to nearest even (float_to_bf16), not __float2bfloat16_rn.
// The two agree on every number, but the intrinsic writes a canonical NaN where ferry keeps the
// NaN's sign and payload, and the CPU backend's narrowing is ferry's: with the same function the
// backends agree bit for bit, poison NaNs included. The cost, a few integer operations per
// stored element, is nothing next to the memory traffic of these kernels. The CPU backend runs
// the same fp32 expressions on widened copies (device/cpu/kernels_bf16.cc), so where a CUDA
// kernel's fp32 result equals the CPU backend's, its bf16 result does too.
using Bf16 = __nv_bfloat16;

__device__ inline float as_f32(float v) { return v; }
__device__ inline float as_f32(Bf16 v) { return __bfloat162float(v); }

template <typename S>
__device__ inline S as_storage(float v);
template <>
__device__ inline float as_storage<float>(float v) {
  return v;
}
template <>
__device__ inline Bf16 as_storage<Bf16>(float v) {
  return __ushort_as_bfloat16(float_to_bf16(v).bits);
}

// A storage type, passed to a generic lambda by with_storage.
template <typename S>
struct StorageTag {
  using type = S;
};

// Calls f(StorageTag<S>{}) with S the storage type of `dtype` (kBF16: Bf16; anything else, the
// caller having checked it: float).
template <typename F>
void with_storage(DType dtype, F&& f) {
  if (dtype == DType::kBF16) {
    f(StorageTag<Bf16>{});
  } else {
    f(StorageTag<float>{});
  }
}

// A float pointer field of a kernel's arguments, as the storage type its elements really have.
template <typename S>
const S* stored(const float* p) {
  return reinterpret_cast<const S*>(p);
}
template <typename S>
S* stored(float* p) {
  return reinterpret_cast<S*>(p);
}

}  // namespace ferry::cuda
