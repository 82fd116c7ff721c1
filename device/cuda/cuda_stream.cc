// CUDA streams and events: one runtime call per operation, errors as LibraryError.
// Destructors never throw; a failure there is printed as a warning.
#include "device/cuda/cuda_stream.h"

#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/host_waits.h"

namespace ferry::cuda {

void use_device(int ordinal) { CUDA_CHECK(cudaSetDevice(ordinal)); }

CudaEvent::CudaEvent(int ordinal, bool timing) : ordinal_(ordinal), timing_(timing) {
  use_device(ordinal_);
  CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  // An event whose captured work is still running is released once that work completes.
  CUDA_WARN(cudaSetDevice(ordinal_));
  CUDA_WARN(cudaEventDestroy(event_));
}

bool CudaEvent::ready() {
  use_device(ordinal_);
  const cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  CUDA_CHECK(status);  // cudaSuccess, or a failure of the captured work
  return true;
}

void CudaEvent::synchronize() {
  use_device(ordinal_);
  if (cudaEventQuery(event_) == cudaErrorNotReady) count_host_wait();
  CUDA_CHECK(cudaEventSynchronize(event_));
}

float elapsed_ms(const CudaEvent& start, const CudaEvent& end) {
  FERRY_ASSERT(start.timing() && end.timing(), "elapsed_ms needs two timing events");
  use_device(end.ordinal());
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start.handle(), end.handle()));
  return ms;
}

CudaStream::CudaStream(StreamKind kind, int ordinal, int priority)
    : kind_(kind), ordinal_(ordinal), priority_(priority) {
  use_device(ordinal_);
  CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

CudaStream::~CudaStream() {
  // cudaStreamDestroy returns at once; work still queued completes before the stream goes.
  CUDA_WARN(cudaSetDevice(ordinal_));
  CUDA_WARN(cudaStreamDestroy(stream_));
}

void CudaStream::record(Event& event) {
  use_device(ordinal_);
  CUDA_CHECK(cudaEventRecord(as_cuda(event).handle(), stream_));
}

void CudaStream::wait(Event& event) {
  use_device(ordinal_);
  CUDA_CHECK(cudaStreamWaitEvent(stream_, as_cuda(event).handle(), 0));
}

void CudaStream::synchronize() {
  use_device(ordinal_);
  if (cudaStreamQuery(stream_) == cudaErrorNotReady) count_host_wait();
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaStream& as_cuda(Stream& stream) {
  auto* cuda = dynamic_cast<CudaStream*>(&stream);
  FERRY_ASSERT(cuda != nullptr, "a stream of another backend was passed to the CUDA backend");
  return *cuda;
}

CudaEvent& as_cuda(Event& event) {
  auto* cuda = dynamic_cast<CudaEvent*>(&event);
  FERRY_ASSERT(cuda != nullptr, "an event of another backend was passed to the CUDA backend");
  return *cuda;
}

}  // namespace ferry::cuda
