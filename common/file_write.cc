// Output files through POSIX calls (write, close), whose errors carry errno, and checks on
// streams opened elsewhere.
#include "common/file_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {
namespace {

constexpr const char* kDefaultHint =
    "check that the disk has space and the directory is writable, or write to another path";

constexpr const char* kStdoutHint =
    "standard output went to a full disk or a closed pipe: redirect it to a file with space";

[[noreturn]] void fail(const std::string& path, int error, const std::string& hint) {
  throw DataError(
      fmt::format("cannot write {}: {}", path, error != 0 ? std::strerror(error) : "write error"),
      hint.empty() ? kDefaultHint : hint);
}

}  // namespace

void write_file(const std::string& path, std::string_view text, const std::string& hint) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, errno, hint);
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      ::close(fd);
      fail(path, error, hint);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (::close(fd) != 0) fail(path, errno, hint);  // NFS and some filesystems report here
}

void check_stream(std::ostream& out, const std::string& path, const std::string& hint) {
  if (!out) fail(path, errno, hint);  // an earlier write failed: errno is its, most likely
  errno = 0;
  out.flush();
  const int error = errno;
  if (!out) fail(path, error, hint);
}

void check_stdout(const std::string& hint) {
  // A write that failed inside printf left errno behind (most likely its own): keep it.
  if (std::ferror(stdout)) fail("standard output", errno, hint.empty() ? kStdoutHint : hint);
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int error = errno;
  if (!flushed || std::ferror(stdout))
    fail("standard output", error, hint.empty() ? kStdoutHint : hint);
}

}  // namespace ferry
