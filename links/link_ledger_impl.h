// The link ledger's shared block layout (private to links/link_ledger*.cc): the fluid model's
// plain state (links/fluid_model.h) behind a robust process-shared mutex and a futex word for
// waiters. Invariant: kVersion changes with the layout, so a block of another build is refused.
#pragma once

#include <pthread.h>

#include <cstdint>
#include <string>
#include <vector>

#include "links/fluid_model.h"
#include "links/link_ledger.h"

namespace ferry {
namespace link_ledger_impl {

constexpr const char* kNamePrefix = "ferry-links";
constexpr uint64_t kMagic = 0x6665727279'6c6e6bULL;  // "ferrylnk"
// 3: the fluid state in one struct; 5: node-wide, users, futex; 6: each flow and claim's kind.
constexpr uint32_t kVersion = 6;
constexpr int kText = 160;
constexpr double kReapInterval_s = 0.25;  // a copy's wait reaps the dead at least this often

// A process attached to the ledger (LedgerUser).
struct UserSlot {
  int32_t used = 0;
  int32_t pid = 0;
  uint64_t start = 0;  // its start time (shm_names::ProcessId)
  int32_t rank = 0;
  int32_t pad = 0;
  double since = 0;
  char job[64] = {};
  char run_dir[kText] = {};
};

}  // namespace link_ledger_impl

struct LinkLedger::Shared {
  uint64_t magic;
  uint32_t version;
  pthread_mutex_t mu;
  uint32_t wake_seq;  // Note [Waiting without a shared condition variable] in link_ledger.cc
  uint32_t pad;
  uint64_t key;      // LinkLedger::topology_key of its links (0: a per-job block from create())
  double last_reap;  // when the dead were last reaped (the ledger's clock)
  link_ledger_impl::UserSlot users[LinkLedger::kMaxUsers];
  FluidState fluid;
};

namespace link_ledger_impl {

// Under the block's lock: reaps the dead, starts the fluid state afresh at `now` when no live
// user is left, checks the block's links against `links` (ConfigError naming the first
// difference) and registers this process as `user`; returns its slot.
int join(LinkLedger::Shared* s, const std::string& name, const std::vector<NamedLink>& links,
         const LedgerUser& user);
// Under the block's lock: frees the user slot `slot` if it is still this process's.
void leave(LinkLedger::Shared* s, int slot);

}  // namespace link_ledger_impl
}  // namespace ferry
