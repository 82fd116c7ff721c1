// Shared by the benchmarks that train: one training step timed alone (the host waits for its end,
// so the time is the step's and not its launch's), and main's error line for a ferry::Error.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>

#include "common/error.h"
#include "trainer/exec/executor.h"
#include "trainer/session/session.h"

namespace ferry {

// Seconds from enqueueing `batch`'s step (forward and backward, reduce, update at `lr`) to its
// end.
inline double timed_step(Session& session, const HostBatch& batch, uint64_t step, float lr) {
  const auto start = std::chrono::steady_clock::now();
  session.forward_backward(batch, step);
  session.reduce_gradients();
  session.update(lr);
  (void)session.metrics();  // waits for the step's end
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `main_impl`; a ferry::Error it throws is one error line (and its hint), exit 2.
inline int bench_main(int (*main_impl)(int, char**), int argc, char** argv) {
  try {
    return main_impl(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n%s%s", e.what(), e.hint().empty() ? "" : "hint: ",
                 e.hint().empty() ? "" : (e.hint() + "\n").c_str());
    return 2;
  }
}

}  // namespace ferry
