// Pacing of the host<->device copies of a CPU rank standing in for a described server's GPU,
// over that server's links shared with the node's other ranks. Invariant: carry() moves every
// byte exactly once, in order, through `move`, and returns once the emulated links carried them.
#pragma once

#include <cstdint>
#include <functional>

#include "device/copy_deadline.h"

namespace ferry {

class CopyPacer {
 public:
  virtual ~CopyPacer() = default;
  // On the thread that enqueues the copy, in stream order: a ticket for carry(). `deadline`
  // travels with the copy: a scheduled copy may be carried in arbitrated chunks.
  virtual uint64_t enqueue(bool to_device, uint64_t bytes, const CopyDeadline& deadline) = 0;
  // On the copy stream's worker: moves the copy through calls of move(offset, length) that cover
  // [0, bytes) in order, pacing them as the emulated links allow. Throws when pacing fails (the
  // stream is then poisoned and the error reaches whoever synchronizes).
  virtual void carry(uint64_t ticket, const std::function<void(uint64_t, uint64_t)>& move) = 0;
};

}  // namespace ferry
