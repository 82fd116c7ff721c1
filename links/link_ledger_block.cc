// The link ledger's shared block: its names (Note [Shared-memory names that outlive nothing] in
// links/shm_names.h), creation with its robust process-shared mutex and CLOCK_MONOTONIC
// condition variable, attachment and removal. Invariant: a block is opened only when its size,
// magic and version are this build's.
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "links/fluid_model.h"
#include "links/link_ledger.h"
#include "links/link_ledger_impl.h"
#include "links/shm_names.h"

namespace ferry {
namespace {

using namespace link_ledger_impl;
using Shared = LinkLedger::Shared;

[[noreturn]] void sys_error(const std::string& call, const std::string& name) {
  throw LibraryError("posix", call + " " + name, std::strerror(errno), __FILE__, __LINE__);
}

Shared* map_block(int fd, const std::string& name) {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    sys_error("mmap", name);
  }
  close(fd);
  return static_cast<Shared*>(p);
}

}  // namespace

std::string LinkLedger::name_for(const std::string& job_token) {
  return shm_names::block_name(kNamePrefix, job_token);
}

std::string LinkLedger::find(const std::string& job_token) {
  return shm_names::find_block(kNamePrefix, job_token);
}

std::string LinkLedger::unique_name() { return name_for(shm_names::job_token()); }

std::shared_ptr<LinkLedger> LinkLedger::create(const std::string& name,
                                               const std::vector<NamedLink>& links,
                                               const LedgerOptions& options) {
  if (links.size() > static_cast<size_t>(kMaxLinks)) {
    throw ConfigError(fmt::format("topology.file: {} links, the link ledger holds at most {}",
                                  links.size(), kMaxLinks));
  }
  shm_names::remove_stale_blocks(kNamePrefix);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) sys_error("shm_open", name);
  if (ftruncate(fd, sizeof(Shared)) != 0) {
    close(fd);
    shm_unlink(name.c_str());
    sys_error("ftruncate", name);
  }
  Shared* s = map_block(fd, name);
  // The block is zero-filled by ftruncate; set what is not zero.
  s->version = kVersion;
  FluidModel::init(s->fluid, links, options.bin_s, now());
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&s->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  std::atomic_thread_fence(std::memory_order_release);
  s->magic = kMagic;
  return std::shared_ptr<LinkLedger>(new LinkLedger(s, options));
}

std::shared_ptr<LinkLedger> LinkLedger::open(const std::string& name,
                                             const LedgerOptions& options) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) sys_error("shm_open", name);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != sizeof(Shared)) {
    close(fd);
    throw LibraryError("posix", "open " + name, "not a link ledger of this build", __FILE__,
                       __LINE__);
  }
  Shared* s = map_block(fd, name);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s->magic != kMagic || s->version != kVersion) {
    munmap(s, sizeof(Shared));
    throw LibraryError("posix", "open " + name, "not an initialised link ledger", __FILE__,
                       __LINE__);
  }
  return std::shared_ptr<LinkLedger>(new LinkLedger(s, options));
}

void LinkLedger::unlink(const std::string& name) { shm_unlink(name.c_str()); }

LinkLedger::~LinkLedger() { munmap(s_, sizeof(Shared)); }

}  // namespace ferry
