// CUDA device: the one device block (or, under memory.share, a range mapped on use), pinned host
// memory, the four prioritised streams and copies. Device memory is freed only after every stream
// has drained (destructor).
#include "device/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "device/backend_traits.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/gpu_shortage.h"
#include "device/cuda/kernel_ops.h"
#include "device/host_pages.h"

namespace ferry::cuda {

// Note [Stream priorities]
// Compute runs at the least priority (the default, 0); d2h, h2d and comm at the greatest.
// The runtime documents that priorities only order kernels: cudaMemcpyAsync on a copy engine
// ignores them, so for today's copies the transfer priorities change nothing and only state the
// intent that offload/prefetch traffic is deadline-bound (it starts to matter if a copy is ever
// done by a kernel). For comm they matter now: NCCL's all-reduce kernels get SMs ahead of the
// queued blocks of backward compute, so gradient reduction overlapped with backward is not
// starved and does not end up on the critical path.

int device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  // No driver (cudaErrorInsufficientDriver) or no GPU (cudaErrorNoDevice) means none present.
  // Either is an initialisation failure that every later runtime call reports again.
  return status == cudaSuccess ? count : 0;
}

std::vector<std::string> pci_bus_ids() {
  std::vector<std::string> ids;
  const int count = device_count();
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    char id[32] = {};  // "00000000:3B:00.0" and its terminator fit
    CUDA_CHECK(cudaDeviceGetPCIBusId(id, static_cast<int>(sizeof(id)), ordinal));
    ids.emplace_back(id);
  }
  return ids;
}

std::string bf16_gpu_gap(int major, int minor, std::string_view name) {
  if (major >= 8) return {};
  return fmt::format(
      "device.precision: bf16 needs a GPU of compute capability 8.0 or newer "
      "(A100, H100), but {} is {}.{}",
      name, major, minor);
}

std::unique_ptr<Device> create_cuda_device(const DeviceOptions& options) {
  const int count = device_count();
  if (options.ordinal < 0 || options.ordinal >= count) {
    throw UnsupportedError(fmt::format("CUDA device {} is not present ({} CUDA device(s) found)",
                                       options.ordinal, count),
                           "use an ordinal below the device count, or set device.backend=cpu");
  }
  if (options.precision == Precision::kBf16) {
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, options.ordinal));
    const std::string gap = bf16_gpu_gap(prop.major, prop.minor, prop.name);
    if (!gap.empty()) throw ConfigError(gap, "set device.precision=fp32 on this GPU");
  }
  return std::make_unique<CudaDevice>(options);
}

void* CudaPinnedAllocator::allocate_placed(uint64_t bytes) {
  void* ptr = map_host_pages(bytes);
  const uint64_t mapped = host_page_bytes(bytes);
  try {
    place_(ptr, mapped);
  } catch (...) {
    unmap_host_pages(ptr, bytes);
    throw;
  }
  // Pinning touches the pages: they land where the placement said.
  const cudaError_t status = cudaHostRegister(ptr, mapped, cudaHostRegisterPortable);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    unmap_host_pages(ptr, bytes);
    if (status == cudaErrorMemoryAllocation) {
      throw OutOfMemoryError(OutOfMemoryError::Where::kHostPool, "pinned block", bytes, 0, 0, {},
                             fmt::format("the host could not pin {} more: lower "
                                         "memory.host_limit or data.batch_size",
                                         format_bytes(bytes)));
    }
    throw_cuda_error(status, "cudaHostRegister(ptr, bytes, cudaHostRegisterPortable)", __FILE__,
                     __LINE__);
  }
  return ptr;
}

void* CudaPinnedAllocator::allocate(uint64_t bytes) {
  use_device(ordinal_);
  if (place_) return allocate_placed(bytes);
  void* ptr = nullptr;
  const cudaError_t status =
      cudaHostAlloc(&ptr, std::max<uint64_t>(bytes, 1), cudaHostAllocPortable);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw OutOfMemoryError(OutOfMemoryError::Where::kHostPool, "pinned block", bytes, 0, 0, {},
                           fmt::format("the host could not pin {} more: lower memory.host_limit "
                                       "or data.batch_size",
                                       format_bytes(bytes)));
  }
  if (status != cudaSuccess) {
    throw_cuda_error(status, "cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable)", __FILE__,
                     __LINE__);
  }
  return ptr;
}

void CudaPinnedAllocator::deallocate(void* ptr, uint64_t bytes) {
  if (ptr == nullptr) return;
  if (!place_) {
    CUDA_WARN(cudaFreeHost(ptr));
    return;
  }
  CUDA_WARN(cudaHostUnregister(ptr));
  unmap_host_pages(ptr, bytes);
}

namespace {

// cudaMalloc of `bytes` on the current device, GPU `ordinal`; OutOfMemoryError (with what the
// driver reports free) when the GPU has not got them.
void* device_block(int ordinal, uint64_t bytes, const char* what) {
  void* block = nullptr;
  const cudaError_t status = cudaMalloc(&block, bytes);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky; keep it out of later cudaGetLastError() checks
    throw gpu_shortage(ordinal, fmt::format("cuda:{} {}", ordinal, what), bytes,
                       gpu_memory(ordinal), "lower device.memory");
  }
  if (status != cudaSuccess)
    throw_cuda_error(status, "cudaMalloc(&block, bytes)", __FILE__, __LINE__);
  return block;
}

}  // namespace

void CudaDevice::BlockFree::operator()(void* ptr) const {
  CUDA_WARN(cudaSetDevice(ordinal));
  CUDA_WARN(cudaFree(ptr));
}

CudaDevice::CudaDevice(const DeviceOptions& options)
    : ordinal_(options.ordinal),
      block_(nullptr, BlockFree{options.ordinal}),
      pinned_(options.ordinal, options.place_host_memory),
      kernels_(options) {
  if (options.memory == 0) {
    throw ConfigError("device.memory must be positive", "set device.memory, e.g. 8GiB");
  }
  use_device(ordinal_);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
  name_ = fmt::format("cuda:{} ({}, {} total, {} device memory{} + {} kernel scratch)", ordinal_,
                      static_cast<const char*>(prop.name), format_bytes(prop.totalGlobalMem),
                      format_bytes(options.memory),
                      options.map_on_use ? fmt::format(" mapped on use in {} granules",
                                                       format_bytes(kSharedGranule))
                                         : "",
                      format_bytes(kReductionScratchBytes));

  if (options.map_on_use) {
    // Note [Device memory of a shared GPU]: the heap's range mapped on use, the scratch alone.
    range_ = std::make_unique<MappedRange>(ordinal_, options.memory, kSharedGranule);
    heap_ = std::make_unique<DeviceHeap>(range_->base(), options.memory, range_.get());
    block_.reset(device_block(ordinal_, kReductionScratchBytes, "kernel scratch"));
    kernels_.set_reduction_scratch(static_cast<double*>(block_.get()), prop.multiProcessorCount);
  } else {
    // Note [Reduction scratch beside the heap]: one allocation holds the heap's device.memory
    // bytes and, after them, the kernels' fixed reduction scratch.
    const uint64_t scratch_at = (options.memory + 255) / 256 * 256;
    block_.reset(device_block(ordinal_, scratch_at + kReductionScratchBytes, "device block"));
    heap_ = std::make_unique<DeviceHeap>(block_.get(), options.memory);
    kernels_.set_reduction_scratch(
        reinterpret_cast<double*>(static_cast<char*>(block_.get()) + scratch_at),
        prop.multiProcessorCount);
  }

  // Note [Stream priorities]. Numerically lower is higher priority: greatest <= least.
  int least = 0;
  int greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (StreamKind kind : {StreamKind::kCompute, StreamKind::kDeviceToHost,
                          StreamKind::kHostToDevice, StreamKind::kComm}) {
    const int priority = kind == StreamKind::kCompute ? least : greatest;
    streams_[static_cast<int>(kind)] = std::make_unique<CudaStream>(kind, ordinal_, priority);
  }
  if (options.arbiter) {
    // Note [One hook, two protocols] in device/copy_arbiter.h: a GPU's copies are gated.
    CopyGate* gate = options.arbiter->gate();
    if (!gate) {
      throw UnsupportedError("a cuda device's copies are gated, and its copy arbiter does not gate",
                             "give a cuda device a gating arbiter (links/link_gatekeeper.h)");
    }
    gated_ = std::make_unique<GatedCopies>(
        ordinal_, std::shared_ptr<CopyGate>(options.arbiter, gate),
        streams_[static_cast<int>(StreamKind::kDeviceToHost)]->handle(),
        streams_[static_cast<int>(StreamKind::kHostToDevice)]->handle());
  }
}

// Note [CudaDevice member order] in cuda_device.h: what is bound to a stream dies before it.
// offsetof on a class with virtual functions is conditionally supported; GCC and Clang compute
// it for classes without virtual bases, which is all this check needs.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
void CudaDevice::check_member_order() {
  static_assert(offsetof(CudaDevice, block_) < offsetof(CudaDevice, streams_),
                "the device block must outlive the streams (declare block_ before streams_)");
  static_assert(offsetof(CudaDevice, range_) < offsetof(CudaDevice, heap_) &&
                    offsetof(CudaDevice, range_) < offsetof(CudaDevice, streams_),
                "the mapped range must outlive the heap and the streams (declare range_ first)");
  static_assert(offsetof(CudaDevice, streams_) < offsetof(CudaDevice, gated_),
                "the gated copies use the copy streams (declare gated_ after streams_)");
  static_assert(offsetof(CudaDevice, streams_) < offsetof(CudaDevice, kernels_),
                "cuDNN/cuBLAS handles are bound to the streams (declare kernels_ after streams_)");
}
#pragma GCC diagnostic pop

CudaDevice::~CudaDevice() {
  // Drain every stream before the block (and the streams) go; members then die in reverse.
  for (auto& stream : streams_) {
    if (stream) CUDA_WARN(cudaStreamSynchronize(stream->handle()));
  }
  gated_.reset();  // the gate closes, then its flags go
}

Stream& CudaDevice::stream(StreamKind kind) { return *streams_[static_cast<int>(kind)]; }

std::unique_ptr<Event> CudaDevice::create_event() {
  return std::make_unique<CudaEvent>(ordinal_, /*timing=*/false);
}

std::unique_ptr<Event> CudaDevice::create_timing_event() {
  return std::make_unique<CudaEvent>(ordinal_, /*timing=*/true);
}

double CudaDevice::elapsed_ms(Event& start, Event& end) {
  return ferry::cuda::elapsed_ms(as_cuda(start), as_cuda(end));
}

void CudaDevice::copy_async(void* dst, const void* src, uint64_t bytes, Stream& stream,
                            const CopyDeadline& deadline) {
  if (bytes == 0) return;
  CudaStream& cuda = as_cuda(stream);
  use_device(ordinal_);
  if (gated_ &&
      (cuda.kind() == StreamKind::kDeviceToHost || cuda.kind() == StreamKind::kHostToDevice)) {
    gated_->copy(dst, src, bytes, cuda.kind() == StreamKind::kHostToDevice, cuda.handle(),
                 deadline);
    return;
  }
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda.handle()));
}

void CudaDevice::synchronize() {
  for (auto& stream : streams_) stream->synchronize();
}

std::unique_ptr<Kernels> create_cuda_kernels(const DeviceOptions& options) {
  return std::make_unique<CudaKernels>(options);
}

}  // namespace ferry::cuda
