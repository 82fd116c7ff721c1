// Temp file + fsync + rename + directory fsync: the POSIX recipe for an atomic replace.
// Note [Atomic replace]: rename(2) within one directory is atomic, so `path` names either the
// old inode or the new, fully written and fsynced one; the directory fsync makes the rename
// itself durable. A crash before the rename leaves a stale `<path>.tmp.<pid>` and `path` intact.
#include "trainer/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"

namespace ferry {

namespace {

std::string directory_of(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  temp_path_ = fmt::format("{}.tmp.{}", path_, static_cast<long>(::getpid()));
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw DataError(fmt::format("cannot create '{}' (to write '{}'): {}", temp_path_, path_,
                                std::strerror(err)),
                    "check that the directory exists and is writable");
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) discard();
}

void AtomicFileWriter::discard() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!temp_path_.empty() && !committed_) ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::fail(const std::string& what, int err) {
  discard();
  temp_path_.clear();  // already removed; nothing more to clean
  throw DataError(fmt::format("cannot write '{}': {}: {}", path_, what, std::strerror(err)),
                  "check free space and permissions in the target directory; the previous file, "
                  "if any, is unchanged");
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  if (fd_ < 0) {
    throw DataError(
        fmt::format("cannot write '{}': the writer already failed or committed", path_));
  }
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // Linux writes at most ~2 GiB per call; chunk to keep each call well below that.
    const size_t chunk = std::min<size_t>(bytes, size_t{1} << 30);
    const ssize_t n = ::write(fd_, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write", errno);
    }
    if (n == 0) fail("write returned 0 bytes", EIO);
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  if (fd_ < 0) {
    throw DataError(
        fmt::format("cannot commit '{}': the writer already failed or committed", path_));
  }
  if (::fsync(fd_) != 0) fail("fsync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("close", errno);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("rename over the target", errno);
  committed_ = true;
  // Make the rename durable. A failure here is reported, but the new file is already in place.
  const std::string dir = directory_of(path_);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    const int err = errno;
    throw DataError(fmt::format("wrote '{}' but cannot open its directory to fsync it: {}", path_,
                                std::strerror(err)));
  }
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  if (rc != 0 && err != EINVAL) {  // some file systems do not support fsync on directories
    throw DataError(
        fmt::format("wrote '{}' but fsync of its directory failed: {}", path_, std::strerror(err)));
  }
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos) continue;
    const std::string digits = name.substr(at + 5);
    const std::optional<pid_t> pid =
        digits.size() <= 9 ? parse_digits<pid_t>(digits) : std::nullopt;
    if (!pid || *pid <= 0 || ::kill(*pid, 0) == 0 || errno != ESRCH)
      continue;  // alive, or not ours
    std::error_code remove_ec;
    if (fs::remove(entry.path(), remove_ec)) removed.push_back(entry.path().string());
  }
  return removed;
}

}  // namespace ferry
