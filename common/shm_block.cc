// See shm_block.h: creation, publication and the one checked open of a shared block.
#include "common/shm_block.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "common/error.h"
#include "common/shm_names.h"

namespace ferry::shm_block {
namespace {

// An open of a bad block that a live process maps is retried this often, this far apart, before
// it fails (another opener may be removing it: Note [Who maps a block]).
constexpr int kOpenAttempts = 40;
constexpr auto kOpenRetry = std::chrono::milliseconds(25);

std::string without_slash(const std::string& name) {
  return name.starts_with('/') ? name.substr(1) : name;
}

std::string shm_path(const std::string& name) { return "/dev/shm/" + without_slash(name); }

void* map(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("mmap", name);  // the caller closes `fd`
  return p;
}

// Whether the mutex at `mu` was set up by init_robust_mutex() (its kind word: robust,
// process-shared), so that locking it cannot take a path a random word would pick.
bool robust_mutex_kind(const pthread_mutex_t* mu) {
#if defined(__GLIBC__)
  pthread_mutex_t model;
  init_robust_mutex(&model);
  const bool same = mu->__data.__kind == model.__data.__kind;
  pthread_mutex_destroy(&model);
  return same;
#else
  (void)mu;
  return true;
#endif
}

// Checks the block open at `fd` against `layout` (Note [A block is input]): "" and the mapping in
// `*addr`, or what is wrong (nothing left mapped).
std::string inspect(int fd, const std::string& name, const Layout& layout, void** addr) {
  struct stat st;
  if (fstat(fd, &st) != 0) fail("fstat", name);
  if (static_cast<uint64_t>(st.st_size) != layout.bytes)
    return fmt::format("it is {} bytes, not {}", static_cast<long long>(st.st_size), layout.bytes);
  void* p = map(fd, layout.bytes, name);
  uint64_t magic = 0;
  uint32_t version = 0;
  std::memcpy(&magic, p, sizeof(magic));
  std::memcpy(&version, static_cast<const char*>(p) + sizeof(magic), sizeof(version));
  std::atomic_thread_fence(std::memory_order_acquire);
  auto* mu = reinterpret_cast<pthread_mutex_t*>(static_cast<char*>(p) + layout.mutex_offset);
  std::string problem;
  if (magic != layout.magic) {
    problem = fmt::format("its magic is {:#x}, not {:#x}", magic, layout.magic);
  } else if (version != layout.version) {
    problem = fmt::format("its layout version is {}, not {}", version, layout.version);
  } else if (!robust_mutex_kind(mu)) {
    problem = "its mutex is not a robust process-shared mutex";
  } else {
    bool owner_died = false;
    const int rc = lock_robust(mu, kMutexTimeout_s, &owner_died);
    if (rc != 0) {
      problem = fmt::format("its mutex cannot be locked ({})", std::strerror(rc));
    } else {
      try {
        problem = layout.check(p, owner_died);
      } catch (...) {
        pthread_mutex_unlock(mu);
        munmap(p, layout.bytes);
        throw;
      }
      pthread_mutex_unlock(mu);
    }
  }
  if (!problem.empty()) {
    munmap(p, layout.bytes);
    return problem;
  }
  *addr = p;
  return "";
}

// Removes the block open at `fd` from `name` when no process maps it (an exclusive flock
// succeeds) and the name still names it; false when a process maps it. Drops this process's own
// shared lock first.
bool remove_if_unused(int fd, const std::string& name) {
  flock(fd, LOCK_UN);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) return false;
  struct stat mine, named;
  if (fstat(fd, &mine) == 0 && stat(shm_path(name).c_str(), &named) == 0 &&
      mine.st_ino == named.st_ino && mine.st_dev == named.st_dev) {
    shm_unlink(name.c_str());
  }
  flock(fd, LOCK_UN);
  return true;
}

}  // namespace

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    reset();
    addr_ = other.addr_;
    bytes_ = other.bytes_;
    fd_ = other.fd_;
    other.addr_ = nullptr;
    other.bytes_ = 0;
    other.fd_ = -1;
  }
  return *this;
}

void Mapping::reset() {
  if (addr_ != nullptr) munmap(addr_, bytes_);
  if (fd_ >= 0) close(fd_);  // drops the shared flock
  addr_ = nullptr;
  bytes_ = 0;
  fd_ = -1;
}

void fail(const std::string& call, const std::string& name) {
  throw LibraryError("posix", call + " " + name, std::strerror(errno), __FILE__, __LINE__);
}

Mapping create(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail("shm_open", name);
  if (flock(fd, LOCK_SH) != 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int saved = errno;
    close(fd);
    shm_unlink(name.c_str());
    errno = saved;
    fail("ftruncate", name);
  }
  try {
    return Mapping(map(fd, bytes, name), bytes, fd);
  } catch (...) {
    close(fd);
    shm_unlink(name.c_str());
    throw;
  }
}

Mapping open_checked(const std::string& name, const Layout& layout) {
  std::string problem;
  bool busy = false;  // the last attempt met a block someone else maps or removes
  for (int attempt = 0; attempt < kOpenAttempts; ++attempt) {
    if (busy) std::this_thread::sleep_for(kOpenRetry);
    busy = true;
    const int fd = shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0) {
      if (errno == ENOENT) return {};
      fail("shm_open", name);
    }
    if (flock(fd, LOCK_SH | LOCK_NB) != 0) {  // another opener is removing it
      const int saved = errno;
      close(fd);
      if (saved != EWOULDBLOCK) {
        errno = saved;
        fail("flock", name);
      }
      continue;
    }
    void* addr = nullptr;
    try {
      problem = inspect(fd, name, layout, &addr);
    } catch (...) {
      close(fd);
      throw;
    }
    if (problem.empty()) return Mapping(addr, layout.bytes, fd);
    busy = !remove_if_unused(fd, name);
    close(fd);
  }
  const std::string path = shm_path(name);
  throw DataError(fmt::format("{} is not a {} of this build ({}) and a running process maps it",
                              path, layout.what, problem),
                  fmt::format("remove {} once no ferry job runs", path));
}

Mapping publish(const std::string& name, size_t bytes, const std::function<void(void*)>& init) {
  const std::string prefix = without_slash(name) + "-new";
  shm_names::remove_stale_blocks(prefix);
  const std::string tmp = shm_names::block_name(prefix, shm_names::job_token());
  Mapping block = create(tmp, bytes);
  try {
    init(block.get());
  } catch (...) {
    shm_unlink(tmp.c_str());
    throw;
  }
  const int rc = ::link(shm_path(tmp).c_str(), shm_path(name).c_str());
  const int link_errno = errno;
  shm_unlink(tmp.c_str());
  if (rc == 0) return block;
  if (link_errno == EEXIST) return {};
  errno = link_errno;
  fail("link", name);
}

void init_robust_mutex(pthread_mutex_t* mu) {
  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(mu, &ma);
  pthread_mutexattr_destroy(&ma);
}

int lock_robust(pthread_mutex_t* mu, double timeout_s, bool* owner_died) {
  int rc = 0;
  if (timeout_s < 0) {
    rc = pthread_mutex_lock(mu);
  } else {
    timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    const double whole = std::floor(timeout_s);
    deadline.tv_sec += static_cast<time_t>(whole);
    deadline.tv_nsec += static_cast<long>((timeout_s - whole) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
      deadline.tv_sec += 1;
      deadline.tv_nsec -= 1000000000L;
    }
    rc = pthread_mutex_clocklock(mu, CLOCK_MONOTONIC, &deadline);
  }
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(mu);
    *owner_died = true;
    return 0;
  }
  return rc;
}

}  // namespace ferry::shm_block
