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
#include "links/shm_names.h"

namespace ferry {

// Note [A well-known block created once]
// Every job on the node must find the ledger by name, so its name is fixed (per user and layout
// version) and it is never unlinked while jobs run: an empty ledger costs one block in /dev/shm
// and is reused by the next job. Two jobs starting together must not both create it, and a job
// killed while creating it must not leave a half-initialised block under the name. So the creator
// builds the block under a private creator-stamped name ("<name>-new-<pid>.<start>-<token>",
// Note [Shared-memory names that outlive nothing] in links/shm_names.h), initialises it, and
// publishes it with link(2) onto the well-known name in /dev/shm, which fails if another job
// published first (then it attaches that one). A private block left by a creator that died is
// removed by the next creator.

namespace {

using namespace job_ledger_impl;
using Shared = JobLedger::Shared;

[[noreturn]] void sys_error(const std::string& call, const std::string& name) {
  throw LibraryError("posix", call + " " + name, std::strerror(errno), __FILE__, __LINE__);
}

std::string without_slash(const std::string& name) {
  return name.starts_with('/') ? name.substr(1) : name;
}

Shared* map_block(int fd, const std::string& name) {
  void* p = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) sys_error("mmap", name);
  return static_cast<Shared*>(p);
}

// Opens `name` if it exists: the mapped block, or nullptr (ENOENT).
Shared* open_block(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    if (errno == ENOENT) return nullptr;
    sys_error("shm_open", name);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != sizeof(Shared)) {
    close(fd);
    throw LibraryError("posix", "open " + name, "not a job ledger of this build", __FILE__,
                       __LINE__);
  }
  Shared* s = map_block(fd, name);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s->magic != kMagic || s->version != kVersion) {
    munmap(s, sizeof(Shared));
    throw LibraryError("posix", "open " + name, "not an initialised job ledger", __FILE__,
                       __LINE__);
  }
  return s;
}

// Builds an initialised block under a private name and links it to `name`; nullptr when another
// process published first.
Shared* create_block(const std::string& name) {
  const std::string prefix = without_slash(name) + "-new";
  shm_names::remove_stale_blocks(prefix);
  const std::string tmp = shm_names::block_name(prefix, shm_names::job_token());
  const int fd = shm_open(tmp.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) sys_error("shm_open", tmp);
  if (ftruncate(fd, sizeof(Shared)) != 0) {
    close(fd);
    shm_unlink(tmp.c_str());
    sys_error("ftruncate", tmp);
  }
  Shared* s = nullptr;
  try {
    s = map_block(fd, tmp);
  } catch (...) {
    shm_unlink(tmp.c_str());
    throw;
  }
  // Zero-filled by ftruncate; set what is not zero.
  s->version = kVersion;
  s->next_id = 1;
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&s->mu, &ma);
  pthread_mutexattr_destroy(&ma);
  std::atomic_thread_fence(std::memory_order_release);
  s->magic = kMagic;
  const int rc = link(("/dev/shm" + tmp).c_str(), ("/dev/shm/" + without_slash(name)).c_str());
  const int link_errno = errno;
  shm_unlink(tmp.c_str());
  if (rc == 0) return s;
  munmap(s, sizeof(Shared));
  if (link_errno == EEXIST) return nullptr;
  errno = link_errno;
  sys_error("link", name);
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
