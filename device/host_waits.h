// A count of the calls that block a host thread on device work (a stream, event or device
// synchronize that finds the work not yet complete, on every backend), kept per calling thread.
// Invariant: every such call counts once on the thread that makes it (a synchronize of finished
// work blocks nothing and counts nothing), so a caller can prove a stretch of its code never
// waited (Note [No host wait inside a step] in trainer/session/train.cc).
#pragma once

#include <cstdint>

namespace ferry {

// Blocking waits this thread has made so far.
uint64_t host_waits_on_this_thread();
// Called by each backend's blocking calls.
void count_host_wait();

}  // namespace ferry
