// The one place a communication backend is chosen: build-time guards, no static registration.
// Invariant: the backend always matches the device (nccl <-> cuda, mpi <-> cpu), and one rank
// always gets the local communicator, whatever was asked for.
#include <fmt/format.h>

#include "comm/backends.h"
#include "comm/communicator.h"
#include "common/error.h"

namespace ferry {

bool nccl_built() {
#if FERRY_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> create_communicator(CommBackendChoice choice, Device& device,
                                                  const RankInfo& ranks, double timeout_s) {
  const bool cuda = device.backend() == Backend::kCuda;
  if (choice == CommBackendChoice::kAuto) {
    choice = cuda ? CommBackendChoice::kNccl : CommBackendChoice::kMpi;
  }
  if (choice == CommBackendChoice::kMpi && cuda) {
    throw ConfigError(
        fmt::format("comm.backend is mpi but the device is {}: the mpi backend reduces host "
                    "memory and cannot read CUDA device memory",
                    device.name()),
        "set comm.backend to nccl (or auto) for device.backend=cuda");
  }
  if (choice == CommBackendChoice::kNccl && !cuda) {
    throw ConfigError(
        fmt::format("comm.backend is nccl but the device is {}: NCCL needs CUDA device memory",
                    device.name()),
        "set comm.backend to mpi (or auto) for device.backend=cpu");
  }
  if (choice == CommBackendChoice::kNccl && !nccl_built()) {
    throw UnsupportedError("comm.backend is nccl but this build has no NCCL backend",
                           "install the CUDA toolkit with NCCL and rebuild, or use device.backend="
                           "cpu with comm.backend=mpi");
  }
  if (ranks.size == 1) return detail::make_local_communicator(ranks);
  if (!ranks.under_mpi) {
    throw UnsupportedError(
        fmt::format("{} ranks were given but MPI is not initialised", ranks.size),
        "launch with mpirun and take the RankInfo from init_ranks()");
  }
  if (choice == CommBackendChoice::kMpi)
    return detail::make_mpi_communicator(device, ranks, detail::MpiWait::kBlocking, timeout_s);
#if FERRY_HAVE_NCCL
  return detail::make_nccl_communicator(device, ranks, timeout_s);
#else
  FERRY_ASSERT(false, "unreachable: nccl without NCCL was rejected above");
  return nullptr;
#endif
}

}  // namespace ferry
