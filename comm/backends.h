// The backend constructors behind create_communicator (comm/registry.cc). Private to comm/:
// each backend's class lives in its own source file; only these factories are shared.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace ferry::detail {

// One rank: every collective is complete at once.
std::unique_ptr<Communicator> make_local_communicator(const RankInfo& ranks);

// How the MPI backend waits for a collective on the comm stream's thread.
// Either way the host does not block: the call runs on the comm stream's thread. Blocking is
// the default: Open MPI's tuned blocking algorithms measured up to 2x the bandwidth of libnbc's
// non-blocking ones at 16-64 MiB, and 3-10x lower latency at 4-16 KiB (bench/comm).
enum class MpiWait {
  kBlocking,     // MPI_Allreduce / MPI_Bcast / MPI_Barrier
  kNonblocking,  // MPI_Iallreduce / MPI_Ibcast / MPI_Ibarrier, then MPI_Test with sched_yield
};

// MPI collectives run as tasks on the CPU device's comm stream. Needs ranks.under_mpi.
// timeout_s > 0: a collective that waits longer ends the job, naming the ranks that did not
// arrive (Note [The collective watchdog] in comm/collective_watchdog.h); 0: no watchdog.
std::unique_ptr<Communicator> make_mpi_communicator(Device& device, const RankInfo& ranks,
                                                    MpiWait wait = MpiWait::kBlocking,
                                                    double timeout_s = 0);

#if FERRY_HAVE_NCCL
// NCCL collectives on the CUDA device's comm stream. With more than one rank the unique id
// goes from rank 0 to the others over MPI; a single rank needs no MPI. timeout_s > 0: a
// collective that lasts longer ends the job (Note [comm.timeout_s on NCCL]).
std::unique_ptr<Communicator> make_nccl_communicator(Device& device, const RankInfo& ranks,
                                                     double timeout_s = 0);
#endif

// steady_clock nanoseconds now.
int64_t now_ns();

}  // namespace ferry::detail
