// Gated copies: the driver's stream memory operations, found through the runtime, around each
// chunk's cudaMemcpyAsync; the host side of the flags for the gate.
#include "device/cuda/cuda_gated_copy.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstddef>
#include <new>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_stream.h"

namespace ferry::cuda {

// Note [Stream memory operations on this driver]
// cuStreamWriteValue32 / cuStreamWaitValue32 in their v2 form (CUDA 11.7 and later) are available
// on every platform without the nvidia module option the v1 form needed, and the v1 device
// attribute (CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1) is deprecated: so "supported" here
// means the driver hands out the v2 entry points and the GPU can map host memory (the flags live
// in pinned host memory that the GPU reads and writes over PCIe). The waits compare cyclically
// (CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0), as seq_reached() does.
// A held stream holds up only the work behind it: the device's four streams fit the driver's
// default eight hardware queues, so no other stream shares its queue (and a token is only ever
// held by a chunk whose stream is at its gate, so a hold always ends).

namespace {

void* entry_point(const char* symbol, int ordinal) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status =
      cudaGetDriverEntryPointByVersion(symbol, &fn, 11070, cudaEnableDefault, &found);
  if (status != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    (void)cudaGetLastError();
    throw UnsupportedError(
        fmt::format("topology.scheduler: topology needs CUDA stream memory operations ({} from a "
                    "CUDA 11.7 or later driver) on cuda:{}, which this driver does not provide",
                    symbol, ordinal),
        "update the NVIDIA driver, or use topology.scheduler=fifo");
  }
  return fn;
}

class CudaGateSignals : public MappedGateSignals {
 public:
  CudaGateSignals(GateFlags* flags, int ordinal, cudaStream_t d2h, cudaStream_t h2d)
      : MappedGateSignals(flags), ordinal_(ordinal), streams_{d2h, h2d} {}
  // A failed copy never writes its done word: report the stream's (or the context's) failure.
  void check_device(int dir) override {
    use_device(ordinal_);
    const cudaError_t status = cudaStreamQuery(streams_[dir]);
    if (status != cudaSuccess && status != cudaErrorNotReady) {
      throw_cuda_error(status, "cudaStreamQuery(gated copy stream)", __FILE__, __LINE__);
    }
  }

 private:
  int ordinal_;
  cudaStream_t streams_[2];
};

}  // namespace

GatedCopies::GatedCopies(int ordinal, std::shared_ptr<CopyGate> gate, cudaStream_t d2h,
                         cudaStream_t h2d)
    : ordinal_(ordinal), gate_(std::move(gate)) {
  use_device(ordinal_);
  int can_map = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, ordinal_));
  if (can_map == 0) {
    throw UnsupportedError(
        fmt::format("topology.scheduler: topology needs cuda:{} to map host memory (its gates are "
                    "host words the GPU waits on), which it cannot",
                    ordinal_),
        "use topology.scheduler=fifo");
  }
  write_value32_ = entry_point("cuStreamWriteValue32", ordinal_);
  wait_value32_ = entry_point("cuStreamWaitValue32", ordinal_);
  get_error_name_ = entry_point("cuGetErrorName", ordinal_);
  void* words = nullptr;
  CUDA_CHECK(cudaHostAlloc(&words, sizeof(GateFlags), cudaHostAllocMapped | cudaHostAllocPortable));
  host_ = new (words) GateFlags{};
  void* device = nullptr;
  const cudaError_t status = cudaHostGetDevicePointer(&device, words, 0);
  if (status != cudaSuccess) {
    CUDA_WARN(cudaFreeHost(words));
    throw_cuda_error(status, "cudaHostGetDevicePointer(&device, words, 0)", __FILE__, __LINE__);
  }
  device_ = static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(device));
  gate_->bind(std::make_shared<CudaGateSignals>(host_, ordinal_, d2h, h2d));
}

GatedCopies::~GatedCopies() {
  gate_->close();
  CUDA_WARN(cudaFreeHost(host_));
}

void GatedCopies::copy(void* dst, const void* src, uint64_t bytes, bool to_device,
                       cudaStream_t stream, const CopyDeadline& deadline) {
  const GateTicket t = gate_->enqueue(to_device, bytes, deadline);
  if (t.chunks == 0) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
    return;
  }
  const auto write = reinterpret_cast<PFN_cuStreamWriteValue32_v11070>(write_value32_);
  const auto wait = reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(wait_value32_);
  const auto check = [&](CUresult r, const char* call) {
    if (r == CUDA_SUCCESS) return;
    const char* name = nullptr;
    reinterpret_cast<PFN_cuGetErrorName_v6000>(get_error_name_)(r, &name);
    throw_library_error("CUDA driver", call, name, nullptr, __FILE__, __LINE__);
  };
  const int d = to_device ? 1 : 0;
  const CUdeviceptr words = device_ + static_cast<CUdeviceptr>(d * sizeof(GateWords));
  const CUdeviceptr arrived = words + offsetof(GateWords, arrived);
  const CUdeviceptr gate = words + offsetof(GateWords, gate);
  const CUdeviceptr done = words + offsetof(GateWords, done);
  const auto cu = reinterpret_cast<CUstream>(stream);
  for (uint32_t i = 0; i < t.chunks; ++i) {
    const uint32_t seq = t.first_seq + i;
    const uint64_t offset = uint64_t{i} * t.chunk_bytes;
    const uint64_t length = std::min(t.chunk_bytes, bytes - offset);
    check(write(cu, arrived, seq, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32(arrived)");
    check(wait(cu, gate, seq, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32(gate, GEQ)");
    CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + offset,
                               static_cast<const char*>(src) + offset, length, cudaMemcpyDefault,
                               stream));
    // The default write fences: the chunk's bytes are visible before `done` is.
    check(write(cu, done, seq, CU_STREAM_WRITE_VALUE_DEFAULT), "cuStreamWriteValue32(done)");
  }
}

}  // namespace ferry::cuda
