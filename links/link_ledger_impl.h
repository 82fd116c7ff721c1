// The link ledger's shared block layout (private to links/link_ledger*.cc): the fluid model's
// plain state (links/fluid_model.h) behind a robust process-shared mutex and a condition variable
// on CLOCK_MONOTONIC. Invariant: kVersion changes whenever the layout does, so a block of another
// build is refused.
#pragma once

#include <pthread.h>

#include <cstdint>

#include "links/fluid_model.h"
#include "links/link_ledger.h"

namespace ferry {
namespace link_ledger_impl {

constexpr const char* kNamePrefix = "ferry-links";
constexpr uint64_t kMagic = 0x6665727279'6c6e6bULL;  // "ferrylnk"
constexpr uint32_t kVersion = 3;                     // 3: the fluid state in one struct

}  // namespace link_ledger_impl

struct LinkLedger::Shared {
  uint64_t magic;
  uint32_t version;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  FluidState fluid;
};

}  // namespace ferry
