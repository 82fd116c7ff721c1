// Host emulation of device/cuda/launch.cuh (Note [Host emulation of the CUDA kernels]): the
// CUDA keywords and built-ins the kernels use, a launch that runs each block's threads as host
// threads meeting at a barrier for __syncthreads; the fixed-order block_sum is the real one
// (device/cuda/block_sum.cuh). Found before the real header only on the emulated parity test's
// include path.
#pragma once

#include <cuda_runtime_api.h>  // types only (cudaStream_t); nothing here calls the runtime

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "device/bf16.h"

// Note [Host emulation of the CUDA kernels]
// This machine class (CI) has no GPU, so the real parity suite skips. The emulated suite
// compiles the very .cu sources with g++: __global__/__device__ vanish, __shared__ becomes a
// static shared by the block's host threads, blocks run one after another, each with
// kEmulatedThreads threads (fewer than on a GPU, so grid-stride loops and reductions take
// more turns), and grids are capped at kMaxBlocks = 16. It checks indexing, semantics and
// reduction logic against the CPU backend; it cannot see GPU-only faults (memory model,
// launch limits, device math libraries), which the GPU run of the same suite covers.

// cuda_runtime_api.h defined these for a host compiler as attributes; here they vanish.
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __launch_bounds__(...)

namespace ferry::cuda::emulation {

struct Dim3 {
  unsigned int x = 1, y = 1, z = 1;
};
inline Dim3 block_idx, block_dim, grid_dim;
inline thread_local Dim3 thread_idx;

// Note [The emulated __syncthreads]
// A barrier of one block's threads on a mutex and a condition variable, each phase counted by a
// generation. Not std::barrier: GCC 12's libstdc++ builds it on atomic wait/notify, whose
// waits can miss a notification (races fixed in later libstdc++), the suspected cause of the
// emulated parity suite's rare hangs under load (a test of 0.8 s killed at 120 s).
class BlockBarrier {
 public:
  explicit BlockBarrier(unsigned int threads) : threads_(threads) {}

  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned long long generation = generation_;
    if (++arrived_ == threads_) {
      arrived_ = 0;
      ++generation_;
      lock.unlock();
      woken_.notify_all();
      return;
    }
    woken_.wait(lock, [&] { return generation_ != generation; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable woken_;
  const unsigned int threads_;
  unsigned int arrived_ = 0;
  unsigned long long generation_ = 0;
};

inline std::unique_ptr<BlockBarrier> block_barrier;

}  // namespace ferry::cuda::emulation

#define blockIdx ::ferry::cuda::emulation::block_idx
#define blockDim ::ferry::cuda::emulation::block_dim
#define gridDim ::ferry::cuda::emulation::grid_dim
#define threadIdx ::ferry::cuda::emulation::thread_idx
#define __syncthreads() ::ferry::cuda::emulation::block_barrier->arrive_and_wait()

using std::exp;
using std::log;
using std::max;
using std::min;
using std::sqrt;
using std::tanh;

inline float __int_as_float(int bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline double __longlong_as_double(long long bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// The host stand-in for cuda_bf16.h's __nv_bfloat16 and the conversions the kernels call
// (device/cuda/storage.cuh): the bits of a bf16, widened exactly and built from raw bits, as on
// the GPU. No rounding function is emulated: the kernels round with device/bf16.h's
// float_to_bf16 on both (Note [bf16 storage in the CUDA kernels]).
struct __nv_bfloat16 {
  unsigned short bits;
};
inline float __bfloat162float(__nv_bfloat16 h) { return ferry::bf16_to_float(ferry::BF16{h.bits}); }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }

namespace ferry::cuda {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 16;
constexpr unsigned int kEmulatedThreads = 8;

inline unsigned int grid_for(int64_t n) {
  return static_cast<unsigned int>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// Runs the grid now: blocks in order, each block's threads concurrently (at most
// kEmulatedThreads, a power of two like every block size the kernels ask for).
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), unsigned int blocks, unsigned int threads,
                   cudaStream_t, Args... args) {
  const unsigned int t = std::min(threads, kEmulatedThreads);
  emulation::block_barrier = std::make_unique<emulation::BlockBarrier>(t);
  emulation::grid_dim.x = blocks;
  emulation::block_dim.x = t;
  for (unsigned int b = 0; b < blocks; ++b) {
    emulation::block_idx.x = b;
    std::vector<std::thread> team;
    for (unsigned int i = 0; i < t; ++i) {
      team.emplace_back([&, i] {
        emulation::thread_idx.x = i;
        kernel(static_cast<Params>(args)...);
      });
    }
    for (std::thread& member : team) member.join();
  }
}

#define FERRY_GRID_STRIDE(i, n)                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace ferry::cuda

// The real block_sum, compiled here with the keywords above.
#include "device/cuda/block_sum.cuh"
