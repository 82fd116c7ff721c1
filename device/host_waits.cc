// The per-thread host-wait counter.
#include "device/host_waits.h"

namespace ferry {

namespace {
thread_local uint64_t host_waits = 0;
}  // namespace

uint64_t host_waits_on_this_thread() { return host_waits; }
void count_host_wait() { ++host_waits; }

}  // namespace ferry
