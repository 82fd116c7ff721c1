// The MPI backend for CPU devices, whose device memory is host memory. Every collective is a
// task on the device's comm stream (a worker thread), ordered after the caller's stream by an
// event, so the host never blocks and backward keeps running while gradients are reduced.
// Invariant: only the comm stream's thread calls MPI on this communicator's MPI_Comm, so
// collectives are issued in one order on every rank (MPI requires it per communicator).
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <thread>

#include <fmt/format.h>

#include "comm/backends.h"
#include "comm/mpi_check.h"
#include "common/error.h"
#include "device/cpu/cpu_stream.h"

namespace ferry::detail {
namespace {

// MPI counts are int: longer buffers go in pieces of this many elements.
constexpr int64_t kMaxCount = INT_MAX / 2 + 1;  // 2^30: a multiple of every element size

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

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(Device& device, const RankInfo& ranks, MpiWait wait)
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
    // A communicator of our own: our collectives never match anyone else's on MPI_COMM_WORLD.
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  }

  ~MpiCommunicator() override {
    try {
      stream_->synchronize();  // no task may still use comm_
    } catch (...) {
      // A failed collective was reported to whoever waited on it; nothing more to do here.
    }
    if (mpi_active()) MPI_Comm_free(&comm_);
  }

  const RankInfo& ranks() const override { return ranks_; }
  std::string_view backend_name() const override { return "mpi"; }

  CommWork all_reduce_mean(float* data, int64_t count, Stream& after) override {
    FERRY_ASSERT(count >= 0, "all_reduce_mean: negative count");
    const int ranks = ranks_.size;
    return launch(after, [this, data, count, ranks] {
      for (int64_t offset = 0; offset < count; offset += kMaxCount) {
        const int n = static_cast<int>(std::min(kMaxCount, count - offset));
        if (wait_ == MpiWait::kBlocking) {
          MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + offset, n, MPI_FLOAT, MPI_SUM, comm_));
        } else {
          MPI_Request request;
          MPI_CHECK(
              MPI_Iallreduce(MPI_IN_PLACE, data + offset, n, MPI_FLOAT, MPI_SUM, comm_, &request));
          wait_request(request);
        }
      }
      // Every rank holds the same sum bits, so every rank gets the same quotient bits. For a
      // power-of-two rank count x * (1/n) is exactly x / n, and cheaper.
      if ((ranks & (ranks - 1)) == 0) {
        const float inverse = 1.0f / static_cast<float>(ranks);
        for (int64_t i = 0; i < count; ++i) data[i] *= inverse;
      } else {
        const auto n = static_cast<float>(ranks);
        for (int64_t i = 0; i < count; ++i) data[i] /= n;
      }
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
        if (wait_ == MpiWait::kBlocking) {
          MPI_CHECK(MPI_Bcast(base + offset, n, MPI_BYTE, root, comm_));
        } else {
          MPI_Request request;
          MPI_CHECK(MPI_Ibcast(base + offset, n, MPI_BYTE, root, comm_, &request));
          wait_request(request);
        }
      }
    });
  }

  void barrier() override {
    CommWork work = launch(*stream_, [this] {
      if (wait_ == MpiWait::kBlocking) {
        MPI_CHECK(MPI_Barrier(comm_));
      } else {
        MPI_Request request;
        MPI_CHECK(MPI_Ibarrier(comm_, &request));
        wait_request(request);
      }
    });
    work.wait();
  }

 private:
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
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(Device& device, const RankInfo& ranks,
                                                    MpiWait wait) {
  return std::make_unique<MpiCommunicator>(device, ranks, wait);
}

}  // namespace ferry::detail
