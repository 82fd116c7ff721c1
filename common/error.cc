// Formatting of the typed errors.
#include "common/error.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "common/bytes.h"

namespace ferry {

LibraryError::LibraryError(const std::string& library, const std::string& call,
                           const std::string& message, const char* file, int line)
    : Error(fmt::format("{} call failed: {}: {} ({}:{})", library, call, message, file, line)),
      library_(library) {}

namespace {

std::string describe_oom(OutOfMemoryError::Where where, const std::string& label,
                         uint64_t requested, uint64_t in_use, uint64_t capacity,
                         const std::vector<ResidentBlock>& resident) {
  const char* what =
      where == OutOfMemoryError::Where::kDevice ? "device memory" : "pinned host pool";
  std::string s =
      fmt::format("out of {}: '{}' needs {}, {} of {} in use", what, label, format_bytes(requested),
                  format_bytes(in_use), format_bytes(capacity));
  if (!resident.empty()) {
    s += "; resident:";
    size_t shown = 0;
    for (const auto& block : resident) {
      if (shown++ == 8) {
        s += fmt::format(" ... and {} more", resident.size() - 8);
        break;
      }
      s += fmt::format(" {} ({})", block.label, format_bytes(block.bytes));
    }
  }
  return s;
}

}  // namespace

OutOfMemoryError::OutOfMemoryError(Where where, std::string label, uint64_t requested,
                                   uint64_t in_use, uint64_t capacity,
                                   std::vector<ResidentBlock> resident, std::string hint)
    : Error(describe_oom(where, label, requested, in_use, capacity, resident), std::move(hint)),
      where_(where),
      requested_(requested),
      resident_(std::move(resident)) {}

int exit_code_for(const std::exception& error) {
  const bool user = dynamic_cast<const ConfigError*>(&error) != nullptr ||
                    dynamic_cast<const DataError*>(&error) != nullptr ||
                    dynamic_cast<const OutOfMemoryError*>(&error) != nullptr;
  return user ? 2 : 1;
}

void assert_fail(const char* cond, const std::string& msg, const char* file, int line) {
  std::fprintf(stderr, "ferry: internal error: %s (%s) at %s:%d\n", msg.c_str(), cond, file, line);
  std::abort();
}

}  // namespace ferry
