// Gated copies on a GPU's copy streams (Note [Gating a GPU copy stream] in
// links/link_gatekeeper.h): per chunk, stream memory operations on pinned, mapped host words
// mark its arrival, hold the stream until the host opens its gate, and mark it done after the
// copy. Invariant: the flags outlive every operation that touches them (the owner drains the
// streams, then close()s the gate, then frees them), and the CUDA driver is reached only through
// entry points the runtime hands out (no link against libcuda).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "device/copy_gate.h"

namespace ferry::cuda {

class GatedCopies {
 public:
  // The flags of GPU `ordinal`, bound to `gate`; `d2h` and `h2d` are the copy streams (checked
  // for failures while the gate waits). Throws UnsupportedError when the GPU or its driver has
  // no stream memory operations or cannot map host memory.
  GatedCopies(int ordinal, std::shared_ptr<CopyGate> gate, cudaStream_t d2h, cudaStream_t h2d);
  // Closes the gate (every gate open, its threads stopped), then frees the flags: call only once
  // the streams have drained.
  ~GatedCopies();
  GatedCopies(const GatedCopies&) = delete;
  GatedCopies& operator=(const GatedCopies&) = delete;

  // Enqueues a copy of `bytes` on `stream` (the copy stream of its direction): chunked and gated
  // when the gate says so for its `deadline`, one cudaMemcpyAsync otherwise.
  void copy(void* dst, const void* src, uint64_t bytes, bool to_device, cudaStream_t stream,
            const CopyDeadline& deadline);

 private:
  int ordinal_;
  std::shared_ptr<CopyGate> gate_;
  GateFlags* host_ = nullptr;      // pinned, mapped
  unsigned long long device_ = 0;  // the same words, as the GPU addresses them
  // Driver entry points (cuStreamWriteValue32 and cuStreamWaitValue32 v2, cuGetErrorName),
  // typed in the source file.
  void* write_value32_ = nullptr;
  void* wait_value32_ = nullptr;
  void* get_error_name_ = nullptr;
};

}  // namespace ferry::cuda
