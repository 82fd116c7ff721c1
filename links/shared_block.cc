// See shared_block.h.
#include "links/shared_block.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "links/shm_names.h"

namespace ferry::shared_block {
namespace {

std::string without_slash(const std::string& name) {
  return name.starts_with('/') ? name.substr(1) : name;
}

void* map(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) fail("mmap", name);
  return p;
}

}  // namespace

void fail(const std::string& call, const std::string& name) {
  throw LibraryError("posix", call + " " + name, std::strerror(errno), __FILE__, __LINE__);
}

void* create(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail("shm_open", name);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int saved = errno;
    close(fd);
    shm_unlink(name.c_str());
    errno = saved;
    fail("ftruncate", name);
  }
  try {
    return map(fd, bytes, name);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
}

void* open(const std::string& name, size_t bytes, const std::string& what) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    if (errno == ENOENT) return nullptr;
    fail("shm_open", name);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    throw LibraryError("posix", "open " + name, "not " + what + " of this build", __FILE__,
                       __LINE__);
  }
  return map(fd, bytes, name);
}

void* publish(const std::string& name, size_t bytes, const std::function<void(void*)>& init) {
  const std::string prefix = without_slash(name) + "-new";
  shm_names::remove_stale_blocks(prefix);
  const std::string tmp = shm_names::block_name(prefix, shm_names::job_token());
  void* block = create(tmp, bytes);
  try {
    init(block);
  } catch (...) {
    munmap(block, bytes);
    shm_unlink(tmp.c_str());
    throw;
  }
  const int rc = ::link(("/dev/shm" + tmp).c_str(), ("/dev/shm/" + without_slash(name)).c_str());
  const int link_errno = errno;
  shm_unlink(tmp.c_str());
  if (rc == 0) return block;
  munmap(block, bytes);
  if (link_errno == EEXIST) return nullptr;
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

}  // namespace ferry::shared_block
