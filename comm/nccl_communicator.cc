// The NCCL backend for CUDA devices, collectives on the device's comm stream. Invariant: every NCCL
// call is issued from the calling thread, in one order on every rank, with its GPU current, but
// the watchdog's (Note [Who calls NCCL]).
#include <mpi.h>
#include <nccl.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "comm/async_error_watchdog.h"
#include "comm/backends.h"
#include "comm/collective_watchdog.h"
#include "comm/fault.h"
#include "comm/mpi_check.h"
#include "comm/nccl_check.h"
#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_stream.h"
#include "device/event_recycler.h"
#include "device/kernels.h"

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0), "ncclAvg needs NCCL 2.10 or newer");

namespace ferry::detail {

// Note [Who calls NCCL]
// The NCCL backend for CUDA devices: one NCCL communicator per rank, created from a unique id
// that rank 0 draws and broadcasts over MPI; collectives run on the device's comm stream after
// a cudaStreamWaitEvent on the caller's stream. Invariant: every NCCL call of this
// communicator is issued from the thread that calls its methods, in the same order on every
// rank, with the rank's own GPU current (Note [Current device] in device/cuda/cuda_stream.h);
// the only exceptions are the watchdog's ncclCommGetAsyncError and ncclCommAbort (Note [Ending
// a job when a collective cannot finish] in comm/async_error_watchdog.h).
namespace {

// Host callbacks on the comm stream stamp a collective's span in host-clock time: the stream
// reaches the first callback when the collective can start and the second when it has ended.
// Each callback owns one reference to the record, so a dropped CommWork cannot free it early.
void CUDART_CB stamp_start(void* user) {
  auto* record = static_cast<std::shared_ptr<CommSpanRecord>*>(user);
  (*record)->start_ns.store(now_ns(), std::memory_order_release);
  delete record;
}

void CUDART_CB stamp_end(void* user) {
  auto* record = static_cast<std::shared_ptr<CommSpanRecord>*>(user);
  (*record)->end_ns.store(now_ns(), std::memory_order_release);
  delete record;
}

// Host callbacks on the comm stream around a collective tell the collective watchdog when the
// stream reaches it and when it has ended (Note [comm.timeout_s on NCCL]). Each owns one
// reference to the watchdog, so a callback that runs late never meets a destroyed one.
struct WatchStamp {
  std::shared_ptr<CollectiveWatchdog> watchdog;
  const char* what = "";
  int64_t sequence = 0;
};

void CUDART_CB watch_begin(void* user) {
  auto* stamp = static_cast<WatchStamp*>(user);
  stamp->watchdog->begin(stamp->what, stamp->sequence);
  delete stamp;
}

void CUDART_CB watch_end(void* user) {
  auto* stamp = static_cast<WatchStamp*>(user);
  stamp->watchdog->end();
  delete stamp;
}

// Note [comm.timeout_s on NCCL]
// An NCCL collective is a kernel that spins until its peers join: a stopped peer is no error, so
// NCCL's asynchronous error (AsyncErrorWatchdog) never fires. As PyTorch's NCCL watchdog, a
// CollectiveWatchdog times each collective from the moment the comm stream reaches it (a host
// callback) to its end (another); past comm.timeout_s it ends the job through fail_job, whose
// fault actions abort the communicator first. Unlike the mpi backend, it does not name the
// ranks that did not arrive (that needs the arrivals window of comm/mpi_arrivals.h over MPI).

// NCCL's asynchronous error on `comm`, "" while it has none.
std::string async_error(ncclComm_t comm) {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t status = ncclCommGetAsyncError(comm, &async);
  if (status != ncclSuccess) {
    return fmt::format("ncclCommGetAsyncError failed: {}", ncclGetErrorString(status));
  }
  if (async == ncclSuccess || async == ncclInProgress) return "";
  const char* detail = ncclGetLastError(comm);
  return fmt::format("NCCL reported {}{}{}", ncclGetErrorString(async),
                     detail != nullptr && *detail != '\0' ? ": " : "",
                     detail != nullptr ? detail : "");
}

// The completion of one collective. Waiting on it polls (the event and NCCL's health) instead of
// blocking in cudaEventSynchronize, so a collective that cannot finish ends in an abort and a
// LibraryError rather than a hang. A stream waits on it as on any CudaEvent.
class CollectiveDone final : public cuda::CudaEvent {
 public:
  CollectiveDone(int ordinal, std::shared_ptr<AsyncErrorWatchdog> watchdog)
      : cuda::CudaEvent(ordinal), watchdog_(std::move(watchdog)) {}
  void synchronize() override {
    watchdog_->wait([this] { return ready(); }, "waiting for a collective");
  }

 private:
  std::shared_ptr<AsyncErrorWatchdog> watchdog_;
};

// Whether `stream` has finished its work; a CUDA error on it throws.
bool stream_idle(cudaStream_t stream) {
  const cudaError_t status = cudaStreamQuery(stream);
  if (status == cudaErrorNotReady) return false;
  if (status != cudaSuccess)
    cuda::throw_cuda_error(status, "cudaStreamQuery(stream)", __FILE__, __LINE__);
  return true;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Device& device, const RankInfo& ranks, double timeout_s)
      : device_(device), ranks_(ranks) {
    if (device.backend() != Backend::kCuda) {
      throw UnsupportedError(
          fmt::format("the nccl communicator needs a cuda device, got {}", device.name()),
          "set comm.backend to mpi (or auto) for device.backend=cpu");
    }
    stream_ = &cuda::as_cuda(device.stream(StreamKind::kComm));
    ordinal_ = stream_->ordinal();
    ncclUniqueId id{};
    if (ranks.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    if (ranks.size > 1) {
      if (!ranks.under_mpi || !mpi_active()) {
        throw UnsupportedError("the nccl communicator of several ranks needs MPI for its id",
                               "launch with mpirun and take the RankInfo from init_ranks()");
      }
      MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, MPI_COMM_WORLD));
    }
    cuda::use_device(ordinal_);
    NCCL_CHECK(ncclCommInitRank(&comm_, ranks.size, id, ranks.rank));
    watchdog_ = std::make_shared<AsyncErrorWatchdog>(
        "NCCL", [comm = comm_] { return async_error(comm); },
        [comm = comm_, ordinal = ordinal_] {
          (void)cudaSetDevice(ordinal);
          const ncclResult_t status = ncclCommAbort(comm);
          if (status != ncclSuccess) {
            std::fprintf(stderr, "ferry: warning: ncclCommAbort failed: %s\n",
                         ncclGetErrorString(status));
          }
        });
    // Note [No CUDA event per collective]: the ordering event is reused (a stream wait captures
    // the record it sees when enqueued), and completion events come back for reuse once every
    // CommWork of their last collective is gone.
    produced_ = device.create_event();
    done_events_ = std::make_shared<EventRecycler>([ordinal = ordinal_, watchdog = watchdog_] {
      return std::make_unique<CollectiveDone>(ordinal, watchdog);
    });
    // This rank failing elsewhere (fail_job) aborts the communicator before MPI_Abort.
    fault_action_ = std::make_unique<ScopedFaultAction>(
        [watchdog = watchdog_] { watchdog->abort("this rank failed (fail_job)"); });
    if (timeout_s > 0) {
      // Captures copies only: the watchdog may outlive this communicator in a late callback.
      collective_watchdog_ = std::make_shared<CollectiveWatchdog>(
          timeout_s,
          [ranks, timeout_s, watchdog = watchdog_](const CollectiveWatchdog::Stalled& s) {
            const std::string what = fmt::format(
                "comm.timeout_s: NCCL {} #{} waited {:.1f} s (timeout {:g} s): a peer did not join",
                s.what, s.sequence, s.waited_s, timeout_s);
            fail_job(ranks, what,
                     "a rank stopped, hangs or died without an error; raise comm.timeout_s if "
                     "collectives of this job are legitimately that slow",
                     1);
            watchdog->abort(what);  // one process without MPI: the waits throw
          });
    }
  }

  // A clean end drains the comm stream (polling the health) and destroys the communicator. An
  // aborted communicator is gone already; one destroyed while an exception unwinds, or whose
  // drain fails, is aborted instead: its peers may never join what is still queued.
  ~NcclCommunicator() override {
    collective_watchdog_.reset();  // late callbacks keep their own reference
    fault_action_.reset();
    CUDA_WARN(cudaSetDevice(ordinal_));
    bool clean = std::uncaught_exceptions() == 0 && !watchdog_->aborted();
    if (clean) {
      try {
        watchdog_->wait([this] { return stream_idle(stream_->handle()); }, "ncclCommDestroy");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ferry: warning: the NCCL comm stream did not drain: %s\n", e.what());
        clean = false;
      }
    }
    if (!clean) watchdog_->abort("the communicator was destroyed during a failure");
    const bool aborted = watchdog_->aborted();
    watchdog_->stop();                                             // never asks comm_ again
    if (wire_ != nullptr && !aborted) CUDA_WARN(cudaFree(wire_));  // the stream has drained
    if (aborted) return;
    const ncclResult_t status = ncclCommDestroy(comm_);
    if (status != ncclSuccess) {
      std::fprintf(stderr, "ferry: warning: ncclCommDestroy failed during cleanup: %s\n",
                   ncclGetErrorString(status));
    }
  }

  const RankInfo& ranks() const override { return ranks_; }
  std::string_view backend_name() const override { return "nccl"; }

  CommWork all_reduce_mean(float* data, int64_t count, Stream& after) override {
    FERRY_ASSERT(count >= 0, "all_reduce_mean: negative count");
    count_all_reduce_bytes(static_cast<uint64_t>(count) * sizeof(float));
    return launch("all-reduce", after, [&](cudaStream_t stream) {
      NCCL_CHECK(
          ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat, ncclAvg, comm_, stream));
    });
  }

  // Note [A bf16 all-reduce] in comm/bf16_wire.h: narrowed into wire_ and widened back by the
  // device's ConvertFloats kernel on the comm stream, summed with ncclBfloat16 (ncclSum: ncclAvg
  // would scale each rank's bf16 input first, one more rounding), divided by the rank count in
  // fp32 (Scale: times 1/ranks, exact for a power of two).
  CommWork all_reduce_mean_bf16(float* data, int64_t count, Stream& after) override {
    FERRY_ASSERT(count >= 0, "all_reduce_mean_bf16: negative count");
    if (!device_.kernels().supports(kernel_kind<ConvertFloats>(), DType::kF32)) {
      throw UnsupportedError(
          "comm.dtype: bf16 on nccl needs the cuda backend's ConvertFloats kernel (fp32 <-> bf16), "
          "which this build lacks",
          "set comm.dtype=fp32");
    }
    count_all_reduce_bytes(static_cast<uint64_t>(count) * sizeof(uint16_t));
    reserve_wire(count);
    return launch("all-reduce", after, [&](cudaStream_t stream) {
      Kernels& k = device_.kernels();
      k.launch(ConvertFloats{count, DType::kF32, DType::kBF16, data, wire_}, *stream_);
      NCCL_CHECK(ncclAllReduce(wire_, wire_, static_cast<size_t>(count), ncclBfloat16, ncclSum,
                               comm_, stream));
      k.launch(ConvertFloats{count, DType::kBF16, DType::kF32, wire_, data}, *stream_);
      k.launch(Scale{count, 1.0f / static_cast<float>(ranks_.size), data}, *stream_);
    });
  }

  CommWork broadcast(void* data, uint64_t bytes, int root, Stream& after) override {
    check_root(root);
    return launch("broadcast", after, [&](cudaStream_t stream) {
      NCCL_CHECK(
          ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream));
    });
  }

  // Equal parts at rank * count: ncclReduceScatter in place (its recvbuff is sendbuff + rank *
  // count). Unequal parts: one ncclReduce to each part's owner, grouped, in place on the owner.
  CommWork reduce_scatter_mean(float* data, std::span<const Part> parts, Stream& after) override {
    FERRY_ASSERT(parts.size() == static_cast<size_t>(ranks_.size), "one part per rank");
    const std::vector<Part> p(parts.begin(), parts.end());
    return launch("reduce-scatter", after, [&](cudaStream_t stream) {
      const Part& mine = p[static_cast<size_t>(ranks_.rank)];
      if (equal_parts(p)) {
        float* base = data + p.front().offset;
        NCCL_CHECK(ncclReduceScatter(base, data + mine.offset, static_cast<size_t>(mine.count),
                                     ncclFloat, ncclAvg, comm_, stream));
        return;
      }
      NCCL_CHECK(ncclGroupStart());
      for (size_t r = 0; r < p.size(); ++r) {
        if (p[r].count == 0) continue;
        float* at = data + p[r].offset;
        NCCL_CHECK(ncclReduce(at, at, static_cast<size_t>(p[r].count), ncclFloat, ncclAvg,
                              static_cast<int>(r), comm_, stream));
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  // Equal touching parts: ncclAllGather in place; otherwise one ncclBroadcast per part, grouped.
  CommWork all_gather(float* data, std::span<const Part> parts, Stream& after) override {
    FERRY_ASSERT(parts.size() == static_cast<size_t>(ranks_.size), "one part per rank");
    const std::vector<Part> p(parts.begin(), parts.end());
    return launch("all-gather", after, [&](cudaStream_t stream) {
      if (equal_parts(p)) {
        const Part& mine = p[static_cast<size_t>(ranks_.rank)];
        NCCL_CHECK(ncclAllGather(data + mine.offset, data + p.front().offset,
                                 static_cast<size_t>(mine.count), ncclFloat, comm_, stream));
        return;
      }
      NCCL_CHECK(ncclGroupStart());
      for (size_t r = 0; r < p.size(); ++r) {
        if (p[r].count == 0) continue;
        float* at = data + p[r].offset;
        NCCL_CHECK(ncclBroadcast(at, at, static_cast<size_t>(p[r].count), ncclFloat,
                                 static_cast<int>(r), comm_, stream));
      }
      NCCL_CHECK(ncclGroupEnd());
    });
  }

  // NCCL moves device memory only; host bytes go over MPI, which this communicator holds
  // already (its unique id came that way), once the collectives issued before have completed.
  void broadcast_host(void* data, uint64_t bytes, int root) override {
    check_root(root);
    cuda::use_device(ordinal_);
    watchdog_->wait([this] { return stream_idle(stream_->handle()); }, "host broadcast");
    if (ranks_.size == 1) return;
    if (!mpi_active()) {
      throw UnsupportedError("the nccl communicator's host broadcast needs MPI",
                             "launch with mpirun and take the RankInfo from init_ranks()");
    }
    auto* base = static_cast<char*>(data);
    for (uint64_t offset = 0; offset < bytes; offset += kMaxMpiCount) {
      const auto n = static_cast<int>(std::min<uint64_t>(kMaxMpiCount, bytes - offset));
      MPI_CHECK(MPI_Bcast(base + offset, n, MPI_BYTE, root, MPI_COMM_WORLD));
    }
  }

  void barrier() override {
    cuda::use_device(ordinal_);
    // The collectives issued before have completed here (or the communicator was aborted).
    watchdog_->wait([this] { return stream_idle(stream_->handle()); }, "barrier");
    if (ranks_.size > 1 && mpi_active()) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  }

 private:
  // Parts of one count each, every one starting where the one before ends.
  static bool equal_parts(const std::vector<Part>& p) {
    for (size_t r = 1; r < p.size(); ++r) {
      if (p[r].count != p[0].count || p[r].offset != p[r - 1].offset + p[r - 1].count) return false;
    }
    return true;
  }

  // Grows the bf16 wire buffer to `count` elements once the comm stream has drained (the
  // collectives before may still read the old one). Buckets keep their sizes, so this happens in
  // the first step only.
  void reserve_wire(int64_t count) {
    if (count <= wire_count_) return;
    cuda::use_device(ordinal_);
    watchdog_->wait([this] { return stream_idle(stream_->handle()); }, "growing the bf16 wire");
    if (wire_ != nullptr) CUDA_CHECK(cudaFree(wire_));
    wire_ = nullptr;
    CUDA_CHECK(cudaMalloc(&wire_, static_cast<size_t>(count) * sizeof(uint16_t)));
    wire_count_ = count;
  }

  // MPI counts are int: longer host buffers go in pieces of this many bytes.
  static constexpr uint64_t kMaxMpiCount = uint64_t{1} << 30;

  void check_root(int root) const {
    if (root < 0 || root >= ranks_.size) {
      throw UnsupportedError(
          fmt::format("broadcast from rank {} in a job of {} ranks", root, ranks_.size),
          "broadcast from a rank in [0, size)");
    }
  }

  template <typename Issue>
  CommWork launch(const char* what, Stream& after, Issue issue) {
    watchdog_->throw_if_failed("a collective after an abort");
    cuda::use_device(ordinal_);
    if (&after != stream_) {
      after.record(*produced_);
      stream_->wait(*produced_);  // captured now: the next collective may record it again
    }
    const cudaStream_t stream = stream_->handle();
    auto span = std::make_shared<CommSpanRecord>();
    stamp(stream, stamp_start, span);
    if (collective_watchdog_) watch(stream, watch_begin, what);
    issue(stream);
    if (collective_watchdog_) watch(stream, watch_end, what);
    stamp(stream, stamp_end, span);
    std::shared_ptr<Event> done = done_events_->take();
    stream_->record(*done);
    return CommWork(std::move(done), std::move(span));
  }

  void watch(cudaStream_t stream, cudaHostFn_t fn, const char* what) {
    if (fn == watch_begin) ++sequence_;
    auto owned = std::make_unique<WatchStamp>(WatchStamp{collective_watchdog_, what, sequence_});
    CUDA_CHECK(cudaLaunchHostFunc(stream, fn, owned.get()));
    owned.release();  // the callback deletes it
  }

  static void stamp(cudaStream_t stream, cudaHostFn_t fn,
                    const std::shared_ptr<CommSpanRecord>& span) {
    auto owned = std::make_unique<std::shared_ptr<CommSpanRecord>>(span);
    CUDA_CHECK(cudaLaunchHostFunc(stream, fn, owned.get()));
    owned.release();  // the callback deletes it
  }

  Device& device_;
  RankInfo ranks_;
  cuda::CudaStream* stream_ = nullptr;
  void* wire_ = nullptr;  // comm.dtype bf16's wire buffer (cudaMalloc, outside the heap)
  int64_t wire_count_ = 0;
  int ordinal_ = 0;
  ncclComm_t comm_ = nullptr;
  std::shared_ptr<AsyncErrorWatchdog>
      watchdog_;                     // polls comm_; shared with the CollectiveDone events
  std::unique_ptr<Event> produced_;  // orders a collective after the caller's stream
  std::shared_ptr<EventRecycler> done_events_;
  std::unique_ptr<ScopedFaultAction> fault_action_;
  std::shared_ptr<CollectiveWatchdog> collective_watchdog_;  // comm.timeout_s > 0
  int64_t sequence_ = 0;                                     // collectives launched so far
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Device& device, const RankInfo& ranks,
                                                     double timeout_s) {
  return std::make_unique<NcclCommunicator>(device, ranks, timeout_s);
}

}  // namespace ferry::detail
