// The NCCL backend for CUDA devices: one NCCL communicator per rank, created from a unique id
// that rank 0 draws and broadcasts over MPI; collectives run on the device's comm stream after
// a cudaStreamWaitEvent on the caller's stream. Invariant: every NCCL call of this
// communicator is issued from the thread that calls its methods, in the same order on every
// rank, with the rank's own GPU current (Note [Current device] in device/cuda/cuda_stream.h).
#include <mpi.h>
#include <nccl.h>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>

#include <fmt/format.h>

#include "comm/backends.h"
#include "comm/mpi_check.h"
#include "comm/nccl_check.h"
#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_stream.h"

static_assert(NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0), "ncclAvg needs NCCL 2.10 or newer");

namespace ferry::detail {
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

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Device& device, const RankInfo& ranks) : device_(device), ranks_(ranks) {
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
  }

  ~NcclCommunicator() override {
    CUDA_WARN(cudaSetDevice(ordinal_));
    CUDA_WARN(cudaStreamSynchronize(stream_->handle()));
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
    return launch(after, [&](cudaStream_t stream) {
      NCCL_CHECK(
          ncclAllReduce(data, data, static_cast<size_t>(count), ncclFloat, ncclAvg, comm_, stream));
    });
  }

  CommWork broadcast(void* data, uint64_t bytes, int root, Stream& after) override {
    if (root < 0 || root >= ranks_.size) {
      throw UnsupportedError(
          fmt::format("broadcast from rank {} in a job of {} ranks", root, ranks_.size),
          "broadcast from a rank in [0, size)");
    }
    return launch(after, [&](cudaStream_t stream) {
      NCCL_CHECK(
          ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclUint8, root, comm_, stream));
    });
  }

  void barrier() override {
    stream_->synchronize();  // the collectives issued before have completed here
    if (ranks_.size > 1 && mpi_active()) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  }

 private:
  template <typename Issue>
  CommWork launch(Stream& after, Issue issue) {
    cuda::use_device(ordinal_);
    if (&after != stream_) {
      std::unique_ptr<Event> produced = device_.create_event();
      after.record(*produced);
      stream_->wait(*produced);  // captured now; the event may be destroyed after
    }
    const cudaStream_t stream = stream_->handle();
    auto span = std::make_shared<CommSpanRecord>();
    stamp(stream, stamp_start, span);
    issue(stream);
    stamp(stream, stamp_end, span);
    std::shared_ptr<Event> done = device_.create_event();
    stream_->record(*done);
    return CommWork(std::move(done), std::move(span));
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
  int ordinal_ = 0;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Device& device, const RankInfo& ranks) {
  return std::make_unique<NcclCommunicator>(device, ranks);
}

}  // namespace ferry::detail
