// The CUDA backend's entry points (the registry calls these).
#pragma once

#include <memory>

#include "device/device.h"

namespace ferry::cuda {

// Number of CUDA devices present; 0 when there is no driver or no GPU.
int device_count();

std::unique_ptr<Device> create_cuda_device(const DeviceOptions& options);

}  // namespace ferry::cuda
