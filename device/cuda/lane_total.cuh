// The fixed-tree sum of a block's shared lanes, shared by the layer-norm and softmax kernels;
// include after launch.cuh (the real one or the host emulation's). Invariant: the order of the
// additions depends on the lane count alone, so the bits do not depend on the block size.
#pragma once

namespace ferry::cuda {

// The sum of lanes[0..Lanes) by a fixed tree, returned to every thread of the block; the caller
// filled the lanes, which are free to refill when it returns. Lanes is a power of two.
template <int Lanes>
__device__ double lane_total(double* lanes) {
  __syncthreads();
  for (int half = Lanes / 2; half > 0; half /= 2) {
    for (int l = static_cast<int>(threadIdx.x); l < half; l += static_cast<int>(blockDim.x)) {
      lanes[l] += lanes[l + half];
    }
    __syncthreads();
  }
  const double total = lanes[0];
  __syncthreads();
  return total;
}

}  // namespace ferry::cuda
