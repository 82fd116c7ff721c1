// Typed errors shared by every layer. Library code throws these and never exits; `main`
// catches them, prints the message and the hint (what to change), and sets the exit code.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ferry {

// Base of every error the program reports to a user. `hint` says what to change.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, std::string hint = {})
      : std::runtime_error(what), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

// A bad config file, key, value or command-line argument. Exit code 2.
class ConfigError : public Error {
  using Error::Error;
};

// A memory plan that cannot fit memory.budget: below its lower bound, or above what the policy
// reaches. A ConfigError (exit code 2); memory.oversize: skip drops the batches of such a shape.
class BudgetError : public ConfigError {
  using ConfigError::ConfigError;
};

// A dataset, checkpoint or topology file that is missing, truncated or malformed. Exit code 2.
class DataError : public Error {
  using Error::Error;
};

// Something this build or machine cannot do (a backend not built, an op not supported).
class UnsupportedError : public Error {
  using Error::Error;
};

// A failed call into a vendor library (CUDA, cuDNN, NCCL, MPI, oneDNN, hwloc).
class LibraryError : public Error {
 public:
  LibraryError(const std::string& library, const std::string& call, const std::string& message,
               const char* file, int line);
  const std::string& library() const { return library_; }

 private:
  std::string library_;
};

// One live allocation, for out-of-memory reports.
struct ResidentBlock {
  std::string label;
  uint64_t bytes = 0;
};

// An allocation beyond a hard capacity: device memory or the pinned host pool.
class OutOfMemoryError : public Error {
 public:
  enum class Where { kDevice, kHostPool };
  OutOfMemoryError(Where where, std::string label, uint64_t requested, uint64_t in_use,
                   uint64_t capacity, std::vector<ResidentBlock> resident, std::string hint);
  Where where() const { return where_; }
  uint64_t requested() const { return requested_; }
  const std::vector<ResidentBlock>& resident() const { return resident_; }

 private:
  Where where_;
  uint64_t requested_;
  std::vector<ResidentBlock> resident_;
};

// The exit code for an error that ends the program: 2 when the user's input is at fault and
// changing it fixes the run (ConfigError, DataError, and OutOfMemoryError, which says the config
// asks for more memory than it gives), 1 for everything else.
int exit_code_for(const std::exception& error);

}  // namespace ferry

// Internal invariant: prints the condition and message, then aborts. Not for user errors.
#define FERRY_ASSERT(cond, msg)                                          \
  do {                                                                   \
    if (!(cond)) ::ferry::assert_fail(#cond, (msg), __FILE__, __LINE__); \
  } while (0)

namespace ferry {
[[noreturn]] void assert_fail(const char* cond, const std::string& msg, const char* file, int line);
}  // namespace ferry
