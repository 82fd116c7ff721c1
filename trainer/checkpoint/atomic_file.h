// A file written so that a reader (or a crash) sees either the previous content of `path` or
// the complete new one: bytes go to `<path>.tmp.<pid>`, which commit() fsyncs and renames over
// `path`. Invariant: `path` is never half-written; the temp file is removed on every failure.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ferry {

class AtomicFileWriter {
 public:
  // Creates (truncates) `<path>.tmp.<pid>`. DataError when it cannot be created.
  explicit AtomicFileWriter(std::string path);
  // Removes the temp file unless commit() succeeded.
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends bytes (retries short writes and EINTR). DataError on failure (disk full, ...);
  // the writer is then unusable and the temp file is removed.
  void write(const void* data, size_t bytes);
  // fsync, close, rename over `path`, fsync the directory. DataError on failure, after which
  // the temp file is gone and `path` still holds its previous content.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }
  size_t bytes_written() const { return written_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  void discard();

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  size_t written_ = 0;
  bool committed_ = false;
};

// Removes the `<name>.tmp.<pid>` files in `dir` whose writer process is gone (a writer killed
// before its commit leaves one behind); returns their paths. A temp file of a live process, or
// whose pid cannot be read, is kept.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);

}  // namespace ferry
