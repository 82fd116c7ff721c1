// The MPI backend for CPU devices: every collective is a task on the device's comm stream, so the
// host never blocks. Invariant: only the comm stream's thread calls MPI on this communicator, in
// one order on every rank (Note [One thread calls MPI]).
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "comm/backends.h"
#include "comm/bf16_wire.h"
#include "comm/collective_watchdog.h"
#include "comm/fault.h"
#include "comm/mpi_arrivals.h"
#include "comm/mpi_check.h"
#include "common/error.h"
#include "device/cpu/cpu_stream.h"

namespace ferry::detail {

// Note [One thread calls MPI]
// The MPI backend for CPU devices, whose device memory is host memory. Every collective is a
// task on the device's comm stream (a worker thread), ordered after the caller's stream by an
// event, so the host never blocks and backward keeps running while gradients are reduced.
// Invariant: only the comm stream's thread calls MPI on this communicator's MPI_Comm, so
// collectives are issued in one order on every rank (MPI requires it per communicator), each
// numbered by its place in that order and, with a timeout, watched (Note [The collective
// watchdog] in comm/collective_watchdog.h).
namespace {

// MPI counts are int: longer buffers go in pieces of this many elements.
constexpr int64_t kMaxCount = INT_MAX / 2 + 1;  // 2^30: a multiple of every element size

// How long a rank whose collective timed out waits for the others' arrival slots.
constexpr double kArrivalReadSeconds = 1.0;
// Heartbeats (MpiArrivals::kBeatSeconds) between the two reads of the arrivals: a rank whose
// counter did not move in that time is not running.
constexpr double kBeatsToWait = 6;
// How long a rank that timed out waits before it reports, when a lower rank that did arrive will
// report the same stall: one message per stall, unless the reporter itself cannot end the job.
constexpr double kReporterGraceSeconds = 3.0;
// What the watchdog calls the communicator's creation (MPI_Comm_dup, the arrivals window).
constexpr const char* kCreation = "communicator creation";

// Note [Waiting for a non-blocking collective]
// MpiWait::kNonblocking only (the default calls the blocking collective, which spins inside
// Open MPI). Open MPI progresses a non-blocking collective (libnbc) only inside MPI calls, so
// the comm thread polls MPI_Test. Between polls it yields the core: on a machine with as many busy
// compute threads as cores a spinning comm thread would slow backward, which the all-reduce is
// meant to hide behind; a sleep instead would stall every message fragment.
void wait_request(MPI_Request& request) {
  int done = 0;
  MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  while (!done) {
    std::this_thread::yield();
    MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
  }
}

// The user MPI_Op of the bf16 all-reduce: inout <- bf16 sum of in and inout, 16-bit words.
void sum_bf16_words(void* in, void* inout, int* len, MPI_Datatype*) {
  sum_bf16(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), *len);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(Device& device, const RankInfo& ranks, MpiWait wait, double timeout_s)
      : device_(device), ranks_(ranks), wait_(wait) {
    if (device.backend() != Backend::kCpu) {
      throw UnsupportedError(
          fmt::format("the mpi communicator needs a cpu device, got {}", device.name()),
          "set comm.backend to nccl (or auto) for device.backend=cuda");
    }
    if (!ranks.under_mpi || !mpi_active()) {
      throw UnsupportedError("the mpi communicator needs MPI, which is not initialised",
                             "launch with mpirun and take the RankInfo from init_ranks()");
    }
    stream_ = dynamic_cast<cpu::CpuStream*>(&device.stream(StreamKind::kComm));
    FERRY_ASSERT(stream_ != nullptr, "a cpu device's comm stream is a CpuStream");
    if (timeout_s > 0) {
      watchdog_ = std::make_unique<CollectiveWatchdog>(
          timeout_s, [this](const CollectiveWatchdog::Stalled& s) { report_stall(s); });
      watchdog_->begin(kCreation, 0);  // collective too: a rank may never come
    }
    // A communicator of our own: our collectives never match anyone else's on MPI_COMM_WORLD.
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Op_create(&sum_bf16_words, /*commute=*/1, &sum_bf16_));
    if (watchdog_) {
      arrivals_ = std::make_unique<MpiArrivals>(comm_);
      watchdog_->end();
    }
  }

  ~MpiCommunicator() override {
    try {
      stream_->synchronize();  // no task may still use comm_
    } catch (...) {
      // A failed collective was reported to whoever waited on it; nothing more to do here.
    }
    watchdog_.reset();
    if (mpi_active()) {
      arrivals_.reset();  // collective, as the communicator's destruction
      MPI_Op_free(&sum_bf16_);
      MPI_Comm_free(&comm_);
    }
  }

  const RankInfo& ranks() const override { return ranks_; }
  std::string_view backend_name() const override { return "mpi"; }

  CommWork all_reduce_mean(float* data, int64_t count, Stream& after) override {
    FERRY_ASSERT(count >= 0, "all_reduce_mean: negative count");
    const int ranks = ranks_.size;
    count_all_reduce_bytes(static_cast<uint64_t>(count) * sizeof(float));
    return launch(after, [this, data, count, ranks] {
      for (int64_t offset = 0; offset < count; offset += kMaxCount) {
        const int n = static_cast<int>(std::min(kMaxCount, count - offset));
        watched("all-reduce", [&] {
          if (wait_ == MpiWait::kBlocking) {
            MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + offset, n, MPI_FLOAT, MPI_SUM, comm_));
          } else {
            MPI_Request request;
            MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data + offset, n, MPI_FLOAT, MPI_SUM, comm_,
                                     &request));
            wait_request(request);
          }
        });
      }
      // Every rank holds the same sum bits, so every rank gets the same quotient bits.
      divide_by_ranks(data, count, ranks);
    });
  }

  // Note [A bf16 all-reduce] in comm/bf16_wire.h: the 16-bit words go to MPI as MPI_UINT16_T
  // with a user op that sums them as bf16. wire_ is used by the comm thread only.
  CommWork all_reduce_mean_bf16(float* data, int64_t count, Stream& after) override {
    FERRY_ASSERT(count >= 0, "all_reduce_mean_bf16: negative count");
    const int ranks = ranks_.size;
    count_all_reduce_bytes(static_cast<uint64_t>(count) * sizeof(uint16_t));
    return launch(after, [this, data, count, ranks] {
      if (wire_.size() < static_cast<size_t>(count)) wire_.resize(static_cast<size_t>(count));
      uint16_t* wire = wire_.data();
      narrow_to_bf16(data, wire, count);
      for (int64_t offset = 0; offset < count; offset += kMaxCount) {
        const int n = static_cast<int>(std::min(kMaxCount, count - offset));
        watched("all-reduce", [&] {
          if (wait_ == MpiWait::kBlocking) {
            MPI_CHECK(
                MPI_Allreduce(MPI_IN_PLACE, wire + offset, n, MPI_UINT16_T, sum_bf16_, comm_));
          } else {
            MPI_Request request;
            MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, wire + offset, n, MPI_UINT16_T, sum_bf16_, comm_,
                                     &request));
            wait_request(request);
          }
        });
      }
      widen_mean(wire, data, count, ranks);
    });
  }

  CommWork broadcast(void* data, uint64_t bytes, int root, Stream& after) override {
    if (root < 0 || root >= ranks_.size) {
      throw UnsupportedError(
          fmt::format("broadcast from rank {} in a job of {} ranks", root, ranks_.size),
          "broadcast from a rank in [0, size)");
    }
    auto* base = static_cast<char*>(data);
    const auto total = static_cast<int64_t>(bytes);
    return launch(after, [this, base, total, root] {
      for (int64_t offset = 0; offset < total; offset += kMaxCount) {
        const int n = static_cast<int>(std::min(kMaxCount, total - offset));
        watched("broadcast", [&] {
          if (wait_ == MpiWait::kBlocking) {
            MPI_CHECK(MPI_Bcast(base + offset, n, MPI_BYTE, root, comm_));
          } else {
            MPI_Request request;
            MPI_CHECK(MPI_Ibcast(base + offset, n, MPI_BYTE, root, comm_, &request));
            wait_request(request);
          }
        });
      }
    });
  }

  // In place: MPI_IN_PLACE takes the input from the parts' span and leaves this rank's result at
  // its start, moved from there to the rank's own part.
  CommWork reduce_scatter_mean(float* data, std::span<const Part> parts, Stream& after) override {
    std::vector<int> counts = checked_counts(parts, /*contiguous=*/true);
    float* base = data + parts.front().offset;
    const Part mine = parts[static_cast<size_t>(ranks_.rank)];
    const int ranks = ranks_.size;
    return launch(after, [this, base, data, mine, ranks, counts = std::move(counts)] {
      watched("reduce-scatter", [&] {
        if (wait_ == MpiWait::kBlocking) {
          MPI_CHECK(
              MPI_Reduce_scatter(MPI_IN_PLACE, base, counts.data(), MPI_FLOAT, MPI_SUM, comm_));
        } else {
          MPI_Request request;
          MPI_CHECK(MPI_Ireduce_scatter(MPI_IN_PLACE, base, counts.data(), MPI_FLOAT, MPI_SUM,
                                        comm_, &request));
          wait_request(request);
        }
      });
      float* own = data + mine.offset;
      if (mine.count > 0 && own != base) std::memmove(own, base, mine.count * sizeof(float));
      divide_by_ranks(own, mine.count, ranks);  // the same division as all_reduce_mean's
    });
  }

  CommWork all_gather(float* data, std::span<const Part> parts, Stream& after) override {
    std::vector<int> counts = checked_counts(parts, /*contiguous=*/false);
    std::vector<int> displs;
    for (const Part& p : parts) displs.push_back(static_cast<int>(p.offset));
    return launch(after, [this, data, counts = std::move(counts), displs = std::move(displs)] {
      watched("all-gather", [&] {
        if (wait_ == MpiWait::kBlocking) {
          MPI_CHECK(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(),
                                   displs.data(), MPI_FLOAT, comm_));
        } else {
          MPI_Request request;
          MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(),
                                    displs.data(), MPI_FLOAT, comm_, &request));
          wait_request(request);
        }
      });
    });
  }

  // A CPU device's memory is host memory: the device broadcast, on the comm thread (the only
  // one that calls MPI on comm_), serves any host buffer.
  void broadcast_host(void* data, uint64_t bytes, int root) override {
    broadcast(data, bytes, root, *stream_).wait();
  }

  void barrier() override {
    CommWork work = launch(*stream_, [this] {
      watched("barrier", [&] {
        if (wait_ == MpiWait::kBlocking) {
          MPI_CHECK(MPI_Barrier(comm_));
        } else {
          MPI_Request request;
          MPI_CHECK(MPI_Ibarrier(comm_, &request));
          wait_request(request);
        }
      });
    });
    work.wait();
  }

 private:
  // One int count per rank (MPI's), checked: a part per rank, offsets and counts within int,
  // and (reduce-scatter) each part starting where the one before ends.
  std::vector<int> checked_counts(std::span<const Part> parts, bool contiguous) const {
    FERRY_ASSERT(parts.size() == static_cast<size_t>(ranks_.size), "one part per rank");
    std::vector<int> counts;
    for (size_t r = 0; r < parts.size(); ++r) {
      FERRY_ASSERT(parts[r].count >= 0 && parts[r].offset >= 0 &&
                       parts[r].offset + parts[r].count <= INT32_MAX,
                   "a part past MPI's int range");
      if (contiguous && r > 0) {
        FERRY_ASSERT(parts[r].offset == parts[r - 1].offset + parts[r - 1].count,
                     "reduce_scatter_mean: parts must touch, in rank order");
      }
      counts.push_back(static_cast<int>(parts[r].count));
    }
    return counts;
  }

  // Runs one MPI collective on the comm thread as collective number ++sequence_, under the
  // watchdog when there is one.
  template <typename Call>
  void watched(const char* what, Call call) {
    ++sequence_;
    if (!watchdog_) return call();
    arrivals_->post(sequence_);
    watchdog_->begin(what, sequence_);
    struct End {
      CollectiveWatchdog& w;
      ~End() { w.end(); }
    } end{*watchdog_};
    call();
  }

  // On the watchdog's thread: names the ranks that did not arrive and ends the job.
  void report_stall(const CollectiveWatchdog::Stalled& stalled) {
    const std::vector<int> named = stalled.sequence > 0 ? late_ranks(stalled) : std::vector<int>{};
    fail_job(ranks_,
             fmt::format("comm.timeout_s: {}{} waited {:.1f} s (timeout {:g} s): {}", stalled.what,
                         stalled.sequence > 0 ? fmt::format(" #{}", stalled.sequence) : "",
                         stalled.waited_s, watchdog_->timeout_s(), who_),
             fmt::format("{}; raise comm.timeout_s if a step can take longer, or set it to 0 "
                         "to turn the watchdog off",
                         named.empty()
                             ? std::string("check every rank's log")
                             : fmt::format("check what {} {} doing (stopped, hung, in a "
                                           "debugger, out of memory?)",
                                           rank_list(named), named.size() == 1 ? "is" : "are")),
             1);
  }

  // Reads the arrivals of collective `stalled.sequence` twice, some heartbeats apart: sets who_
  // (the late ranks in words, for the message) and returns them. A rank is late when it has not
  // entered the collective, when it entered it but stopped running (its heartbeat stands still),
  // or when its slot cannot be read. When a lower rank is in the collective and running, first
  // waits while that rank reports the same stall and ends the job: one message per stall.
  std::vector<int> late_ranks(const CollectiveWatchdog::Stalled& stalled) {
    if (!arrivals_->available()) {
      who_ = "which ranks did not arrive is unknown (MPI could not make a one-sided window)";
      return {};
    }
    const auto before = arrivals_->read_all(kArrivalReadSeconds);
    std::this_thread::sleep_for(
        std::chrono::duration<double>(kBeatsToWait * MpiArrivals::kBeatSeconds));
    const auto after = arrivals_->read_all(kArrivalReadSeconds);
    std::vector<int> missing, frozen, silent, late;
    std::string where;
    int reporter = ranks_.rank;
    for (int r = 0; r < ranks_.size; ++r) {
      const auto i = static_cast<size_t>(r);
      if (r == ranks_.rank) continue;
      if (!after[i]) {
        silent.push_back(r);
        continue;
      }
      const bool running = !before[i] || before[i]->beats != after[i]->beats;
      if (after[i]->sequence < stalled.sequence) {
        missing.push_back(r);
        where += fmt::format("{}rank {} is at #{}{}", where.empty() ? "" : ", ", r,
                             after[i]->sequence, running ? "" : " and not running");
      } else if (!running) {
        frozen.push_back(r);
      } else {
        reporter = std::min(reporter, r);
      }
    }
    if (reporter != ranks_.rank)
      std::this_thread::sleep_for(std::chrono::duration<double>(kReporterGraceSeconds));
    std::vector<std::string> parts;
    if (!missing.empty())
      parts.push_back(fmt::format("{} did not arrive ({})", rank_list(missing), where));
    if (!frozen.empty()) {
      parts.push_back(fmt::format("{} arrived but stopped running inside it (no heartbeat)",
                                  rank_list(frozen)));
    }
    if (!silent.empty())
      parts.push_back(fmt::format("{} did not answer (stopped or hung)", rank_list(silent)));
    who_ = parts.empty()
               ? "every rank arrived and is running, but the collective did not complete (an MPI "
                 "transport stall?)"
               : fmt::format("{}", fmt::join(parts, "; "));
    for (const auto* group : {&missing, &frozen, &silent})
      late.insert(late.end(), group->begin(), group->end());
    std::sort(late.begin(), late.end());
    return late;
  }

  // Enqueues `body` on the comm stream after the work enqueued on `after` so far, stamping its
  // host-clock span, and returns the handle of its completion.
  CommWork launch(Stream& after, std::function<void()> body) {
    if (&after != stream_) {
      std::unique_ptr<Event> produced = device_.create_event();
      after.record(*produced);
      stream_->wait(*produced);  // the wait keeps the event's state alive
    }
    auto span = std::make_shared<CommSpanRecord>();
    stream_->enqueue([body = std::move(body), span] {
      span->start_ns.store(now_ns(), std::memory_order_release);
      body();
      span->end_ns.store(now_ns(), std::memory_order_release);
    });
    std::shared_ptr<Event> done = device_.create_event();
    stream_->record(*done);
    return CommWork(std::move(done), std::move(span));
  }

  Device& device_;
  RankInfo ranks_;
  MpiWait wait_;
  cpu::CpuStream* stream_ = nullptr;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op sum_bf16_ = MPI_OP_NULL;  // sum_bf16_words
  std::vector<uint16_t> wire_;     // comm.dtype bf16's wire buffer; comm thread only
  int64_t sequence_ = 0;           // collectives issued so far; comm thread only
  std::unique_ptr<MpiArrivals> arrivals_;
  std::unique_ptr<CollectiveWatchdog> watchdog_;  // null: comm.timeout_s is 0
  // The late ranks in words; set by the watchdog's thread only. Before the communicator exists
  // (sequence 0) nothing can say which rank did not come.
  std::string who_ = "a rank did not join, and which one is unknown before the communicator exists";
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(Device& device, const RankInfo& ranks,
                                                    MpiWait wait, double timeout_s) {
  return std::make_unique<MpiCommunicator>(device, ranks, wait, timeout_s);
}

}  // namespace ferry::detail
