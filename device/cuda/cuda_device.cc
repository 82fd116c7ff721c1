// PLACEHOLDER until the CUDA device lands.
#include "device/cuda/cuda_device.h"

#include <cuda_runtime.h>

namespace ferry::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::unique_ptr<Device> create_cuda_device(const DeviceOptions&) {
  throw UnsupportedError("the CUDA device is not implemented yet");
}

}  // namespace ferry::cuda
