// CUDA streams and events behind the Stream/Event interface (device/stream.h has CUDA's
// semantics, so each call maps onto one runtime call). Every call that reaches the runtime
// first makes the owning GPU current on the calling thread (Note [Current device]).
#pragma once

#include <cuda_runtime_api.h>

#include "device/stream.h"

namespace ferry::cuda {

// Note [Current device]
// The runtime keeps a current device per host thread and creates device 0's context for a
// thread that never chose one. The trainer calls into a device from several threads (main,
// loader, transfer engine), and one rank per GPU must never touch another GPU's context, so
// every entry point that reaches the runtime calls use_device(ordinal) first. cudaSetDevice of
// the already-current device is cheap.

// cudaSetDevice(ordinal); throws LibraryError.
void use_device(int ordinal);

class CudaEvent : public Event {
 public:
  // An event of GPU `ordinal`. Without `timing` (the default) it keeps no timestamps
  // (cudaEventDisableTiming), which makes record, wait and query cheaper; timing events can
  // be measured with elapsed_ms(), for traces.
  explicit CudaEvent(int ordinal, bool timing = false);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  bool ready() override;        // cudaEventQuery; cudaErrorNotReady -> false
  void synchronize() override;  // cudaEventSynchronize

  cudaEvent_t handle() const { return event_; }
  int ordinal() const { return ordinal_; }
  bool timing() const { return timing_; }

 private:
  int ordinal_;
  bool timing_;
  cudaEvent_t event_ = nullptr;
};

// Milliseconds between the completed last records of two timing events (cudaEventElapsedTime).
float elapsed_ms(const CudaEvent& start, const CudaEvent& end);

class CudaStream : public Stream {
 public:
  // A non-blocking stream (no implicit ordering with the legacy default stream) of GPU
  // `ordinal` with `priority` (lower numbers run first; see cudaDeviceGetStreamPriorityRange).
  CudaStream(StreamKind kind, int ordinal, int priority);
  ~CudaStream() override;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  StreamKind kind() const override { return kind_; }
  void record(Event& event) override;  // cudaEventRecord; the event must be of the same GPU
  void wait(Event& event) override;    // cudaStreamWaitEvent; the event may be of any GPU
  void synchronize() override;         // cudaStreamSynchronize

  cudaStream_t handle() const { return stream_; }
  int ordinal() const { return ordinal_; }
  int priority() const { return priority_; }

 private:
  StreamKind kind_;
  int ordinal_;
  int priority_;
  cudaStream_t stream_ = nullptr;
};

// The CUDA stream or event behind an interface reference. Passing another backend's object is
// a programming error (FERRY_ASSERT).
CudaStream& as_cuda(Stream& stream);
CudaEvent& as_cuda(Event& event);

}  // namespace ferry::cuda
