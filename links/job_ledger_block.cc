// The job ledger's shared block: its well-known name, creation published atomically, attachment.
// Invariant: the well-known name only ever names a block whose mutex and header are initialised.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "links/job_ledger.h"
#include "links/job_ledger_impl.h"
#include "links/shared_block.h"
#include "links/shm_names.h"

namespace ferry {

namespace {

using namespace job_ledger_impl;
using Shared = JobLedger::Shared;

// The block `name` if it exists (nullptr: ENOENT), checked to be an initialised job ledger of
// this build.
Shared* open_block(const std::string& name) {
  auto* s = static_cast<Shared*>(shared_block::open(name, sizeof(Shared), "a job ledger"));
  if (s == nullptr) return nullptr;
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s->magic != kMagic || s->version != kVersion) {
    munmap(s, sizeof(Shared));
    throw LibraryError("posix", "open " + name, "not an initialised job ledger", __FILE__,
                       __LINE__);
  }
  return s;
}

// Publishes an initialised block onto `name` (Note [A well-known block created once] in
// links/shared_block.h); nullptr when another process published first.
Shared* create_block(const std::string& name) {
  return static_cast<Shared*>(shared_block::publish(name, sizeof(Shared), [](void* block) {
    auto* s = static_cast<Shared*>(block);  // zero-filled: set what is not zero
    s->version = kVersion;
    s->next_id = 1;
    s->next_seq = 1;
    shared_block::init_robust_mutex(&s->mu);
    std::atomic_thread_fence(std::memory_order_release);
    s->magic = kMagic;
  }));
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
    if (Shared* s = open_block(name)) return std::shared_ptr<JobLedger>(new JobLedger(s, options));
    if (Shared* s = create_block(name))
      return std::shared_ptr<JobLedger>(new JobLedger(s, options));
    // Another job published between our open and our link: open that one.
  }
  throw LibraryError("posix", "attach " + name, "the job ledger keeps appearing and vanishing",
                     __FILE__, __LINE__);
}

std::shared_ptr<JobLedger> JobLedger::open_existing(const std::string& name,
                                                    const JobLedgerOptions& options) {
  Shared* s = open_block(name);
  return s ? std::shared_ptr<JobLedger>(new JobLedger(s, options)) : nullptr;
}

void JobLedger::unlink(const std::string& name) { shm_unlink(name.c_str()); }

JobLedger::~JobLedger() { munmap(s_, sizeof(Shared)); }

}  // namespace ferry
