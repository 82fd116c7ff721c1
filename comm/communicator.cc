// The backend-independent pieces of comm/communicator.h: completion spans, backend names, and
// the host clock that every span uses.
#include "comm/communicator.h"

#include <chrono>

#include <fmt/format.h>

#include "comm/backends.h"
#include "common/error.h"
#include "common/strings.h"

namespace ferry {

std::optional<CommSpan> CommWork::span() const {
  if (span_ == nullptr || !ready()) return std::nullopt;
  const int64_t start = span_->start_ns.load(std::memory_order_acquire);
  const int64_t end = span_->end_ns.load(std::memory_order_acquire);
  if (start < 0 || end < 0) return std::nullopt;
  return CommSpan{start, end};
}

CommWork Communicator::all_reduce_mean_bf16(float*, int64_t, Stream&) {
  throw UnsupportedError(fmt::format("the {} communicator has no bf16 all-reduce", backend_name()),
                         "set comm.dtype=fp32");
}

CommWork Communicator::reduce_scatter_mean(float*, std::span<const Part>, Stream&) {
  throw UnsupportedError(fmt::format("the {} communicator has no reduce-scatter", backend_name()),
                         "use memory.zero 0");
}

CommWork Communicator::all_gather(float*, std::span<const Part>, Stream&) {
  throw UnsupportedError(fmt::format("the {} communicator has no all-gather", backend_name()),
                         "use memory.zero 0");
}

std::string_view comm_backend_name(CommBackendChoice choice) {
  switch (choice) {
    case CommBackendChoice::kAuto:
      return "auto";
    case CommBackendChoice::kMpi:
      return "mpi";
    case CommBackendChoice::kNccl:
      return "nccl";
  }
  return "?";
}

CommBackendChoice parse_comm_backend(std::string_view text) {
  for (auto choice :
       {CommBackendChoice::kAuto, CommBackendChoice::kMpi, CommBackendChoice::kNccl}) {
    if (text == comm_backend_name(choice)) return choice;
  }
  const std::string near = nearest(text, {"auto", "mpi", "nccl"});
  throw ConfigError(fmt::format("comm.backend: unknown backend '{}'{}", text,
                                near.empty() ? "" : fmt::format(" (did you mean '{}'?)", near)),
                    "set comm.backend to auto, mpi (cpu devices) or nccl (cuda devices)");
}

namespace detail {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace detail

}  // namespace ferry
