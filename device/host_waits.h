// A per-thread count of the calls that block a host thread on device work, on every backend.
// Invariant: every such call counts once on the thread that makes it, so a caller can prove a
// stretch of its code never waited (Note [No host wait inside a step] in trainer/session/train.cc).
#pragma once

#include <cstdint>

// Note [Which calls count as a host wait]
// A call counts when it is a stream, event or device synchronize that finds the work not yet
// complete. A synchronize of finished work blocks nothing and counts nothing.

namespace ferry {

// Blocking waits this thread has made so far.
uint64_t host_waits_on_this_thread();
// Called by each backend's blocking calls.
void count_host_wait();

}  // namespace ferry
