// The Communicator: collectives across the ranks of a data-parallel job, asynchronous with
// respect to the host. Every collective is ordered after the work already enqueued on the
// stream it is given, runs on the device's comm stream, and returns a CommWork handle; nothing
// is visible to another stream until that stream is ordered after the handle (order_before).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "comm/ranks.h"
#include "device/device.h"

namespace ferry {

// Host-clock span of one collective: std::chrono::steady_clock nanoseconds since its epoch,
// the clock the trainer's traces use.
struct CommSpan {
  int64_t start_ns = 0;
  int64_t end_ns = 0;
};

// Filled by a backend as its collective runs (start, then end); read once the work is ready.
struct CommSpanRecord {
  std::atomic<int64_t> start_ns{-1};
  std::atomic<int64_t> end_ns{-1};
};

// The completion of one collective. Copyable; a default-constructed handle is complete.
class CommWork {
 public:
  CommWork() = default;
  // `done` completes with the collective (null: already complete); `span` may be null (the
  // backend does not measure).
  CommWork(std::shared_ptr<Event> done, std::shared_ptr<CommSpanRecord> span)
      : done_(std::move(done)), span_(std::move(span)) {}

  // Whether the collective has completed. Does not block.
  bool ready() const { return done_ == nullptr || done_->ready(); }
  // Blocks the host until the collective has completed; rethrows its failure.
  void wait() const {
    if (done_) done_->synchronize();
  }
  // Work enqueued on `stream` after this call runs after the collective (its results are
  // visible to it). Does not block the host.
  void order_before(Stream& stream) const {
    if (done_) stream.wait(*done_);
  }
  // The collective's host-clock span once ready(); nullopt before that or when the backend did
  // not measure (the single-rank communicator does no work).
  std::optional<CommSpan> span() const;

 private:
  std::shared_ptr<Event> done_;
  std::shared_ptr<CommSpanRecord> span_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual const RankInfo& ranks() const = 0;
  // "mpi", "nccl" or "local" (one rank, no MPI).
  virtual std::string_view backend_name() const = 0;

  // data[0, count) <- (sum over ranks of data[0, count)) / size, in place, in device memory.
  // Starts after the work enqueued on `after` so far; the result is identical (bitwise) on
  // every rank. Every rank must issue the same collectives in the same order.
  virtual CommWork all_reduce_mean(float* data, int64_t count, Stream& after) = 0;

  // comm.dtype bf16: as all_reduce_mean, but data crosses the wire as bf16. data[0, count) is
  // narrowed to bf16 (round to nearest even) into the communicator's wire buffer, summed over
  // ranks in bf16 (fp32 adds, one rounding per pairwise combine), and the sum is widened back
  // into data and divided by the rank count in fp32 (Note [A bf16 all-reduce] in
  // comm/bf16_wire.h gives the rounding users get). Bitwise equal on every rank. One rank: data
  // is left as it is (nothing crosses a wire). The default throws UnsupportedError.
  virtual CommWork all_reduce_mean_bf16(float* data, int64_t count, Stream& after);

  // Payload bytes this rank has handed to all-reduce collectives since construction (count times
  // the wire element's size; not the algorithm's traffic). 0 for one rank, which sends nothing.
  uint64_t all_reduce_bytes() const { return all_reduce_bytes_.load(std::memory_order_relaxed); }

  // data[0, bytes) of rank `root` copied to every rank, in place, in device memory. Starts
  // after the work enqueued on `after` so far.
  virtual CommWork broadcast(void* data, uint64_t bytes, int root, Stream& after) = 0;

  // Reduce-scatter (ZeRO), in place, in device memory: `parts` gives every rank's part of data,
  // contiguous and in rank order (parts[r + 1].offset = parts[r].offset + parts[r].count, counts
  // may be 0). Afterwards this rank's part holds the mean over ranks of that part (the same bits
  // an all_reduce_mean of a two-rank job gives; with more ranks the summation order may differ
  // from it), and the other parts are undefined. Starts after the work enqueued on `after`.
  // The default throws UnsupportedError (a communicator that has no reduce-scatter).
  struct Part {
    int64_t offset = 0;  // floats from data
    int64_t count = 0;
  };
  virtual CommWork reduce_scatter_mean(float* data, std::span<const Part> parts, Stream& after);

  // All-gather, in place, in device memory: rank r's data[parts[r].offset, + parts[r].count) is
  // copied to the same place on every rank (parts need not touch). Starts after the work
  // enqueued on `after`. The default throws UnsupportedError.
  virtual CommWork all_gather(float* data, std::span<const Part> parts, Stream& after);

  // data[0, bytes) of rank `root` copied to every rank, in place, in host memory (any host
  // memory, pinned or not; never device memory). Blocks the host until this rank holds the
  // root's bytes; ordered after the collectives this communicator has issued before, as
  // barrier(). For small control data (names, ids) before or between steps: it stalls the
  // host, and under nccl it goes over MPI, not the GPUs' links.
  virtual void broadcast_host(void* data, uint64_t bytes, int root) = 0;

  // Blocks the host until every rank has entered the barrier. Ordered after the collectives
  // this communicator has issued before (they run first on the comm stream).
  virtual void barrier() = 0;

 protected:
  void count_all_reduce_bytes(uint64_t bytes) {
    all_reduce_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> all_reduce_bytes_{0};
};

enum class CommBackendChoice { kAuto, kMpi, kNccl };

// "auto", "mpi", "nccl".
std::string_view comm_backend_name(CommBackendChoice choice);
// Parses comm.backend; throws ConfigError naming the value (with the nearest valid name).
CommBackendChoice parse_comm_backend(std::string_view text);

// The one place a communication backend is chosen. kAuto: nccl for a CUDA device, mpi for a CPU
// device. A single rank (ranks.size == 1, with or without MPI) gets the local communicator,
// whose collectives are complete at once (the mean over one rank is the data itself), so the
// caller needs no special case. Throws UnsupportedError for nccl in a build without NCCL;
// LibraryError when MPI or NCCL fails.
// The device and (under MPI) MPI must outlive the communicator; destroy it before
// finalize_ranks(). Collective: every rank calls it with the same choice.
// timeout_s > 0 (comm.timeout_s): a rank that waits longer than this in one collective ends the
// job through fail_job; the mpi backend names the ranks that did not arrive (Note [The collective
// watchdog] in comm/collective_watchdog.h), the nccl backend does not (Note [comm.timeout_s on
// NCCL] in comm/nccl_communicator.cc).
// ConfigError for mpi with a CUDA device or nccl with a CPU device.
std::unique_ptr<Communicator> create_communicator(CommBackendChoice choice, Device& device,
                                                  const RankInfo& ranks, double timeout_s = 0);

// Whether this build has the NCCL backend.
bool nccl_built();

}  // namespace ferry
