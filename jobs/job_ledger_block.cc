// The job ledger's shared block: its well-known name, creation published atomically, the checked
// attachment. Invariant: the well-known name only ever names a block whose mutex and header are
// initialised, and a block is used only once its body passed check_block().
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/shm_block.h"
#include "jobs/job_ledger.h"
#include "jobs/job_ledger_impl.h"

namespace ferry {

namespace {

using namespace job_ledger_impl;
using Shared = JobLedger::Shared;

// What the checked open expects at a job ledger's name.
shm_block::Layout layout() {
  shm_block::Layout l;
  l.what = "job ledger";
  l.bytes = sizeof(Shared);
  l.magic = kMagic;
  l.version = kVersion;
  l.mutex_offset = offsetof(Shared, mu);
  l.check = [](void* block, bool owner_died) {
    return check_block(static_cast<Shared*>(block), owner_died);
  };
  return l;
}

// Publishes an initialised block onto `name` (Note [A well-known block created once] in
// common/shm_block.h); empty when another process published first.
shm_block::Mapping create_block(const std::string& name) {
  return shm_block::publish(name, sizeof(Shared), [](void* block) {
    auto* s = static_cast<Shared*>(block);  // zero-filled: set what is not zero
    s->version = kVersion;
    s->next_id = 1;
    s->next_seq = 1;
    shm_block::init_robust_mutex(&s->mu);
    std::atomic_thread_fence(std::memory_order_release);
    s->magic = kMagic;
  });
}

}  // namespace

std::string JobLedger::default_name() {
  const char* env = std::getenv("FERRY_JOB_LEDGER");
  if (env && env[0] == '/' && env[1] != '\0' && !std::strchr(env + 1, '/')) return env;
  return fmt::format("/ferry-jobs-v{}-u{}", kVersion, static_cast<unsigned>(getuid()));
}

std::shared_ptr<JobLedger> JobLedger::attach(const std::string& name,
                                             const JobLedgerOptions& options) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    shm_block::Mapping block = shm_block::open_checked(name, layout());
    if (!block) block = create_block(name);
    if (block) return std::shared_ptr<JobLedger>(new JobLedger(std::move(block), options));
    // Another job published between our open and our link: open that one.
  }
  throw LibraryError("posix", "attach " + name, "the job ledger keeps appearing and vanishing",
                     __FILE__, __LINE__);
}

std::shared_ptr<JobLedger> JobLedger::open_existing(const std::string& name,
                                                    const JobLedgerOptions& options) {
  shm_block::Mapping block = shm_block::open_checked(name, layout());
  return block ? std::shared_ptr<JobLedger>(new JobLedger(std::move(block), options)) : nullptr;
}

void JobLedger::unlink(const std::string& name) { shm_unlink(name.c_str()); }

JobLedger::JobLedger(shm_block::Mapping block, const JobLedgerOptions& options)
    : block_(std::move(block)), s_(static_cast<Shared*>(block_.get())), options_(options) {}

JobLedger::~JobLedger() = default;

}  // namespace ferry
