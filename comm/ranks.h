// Rank discovery: which process of the job this is. Under mpirun (or any PMI/PMIx launcher) MPI
// is initialised with MPI_THREAD_MULTIPLE; without a launcher the process is a single rank and
// MPI is never touched, so `trainer train` runs with or without mpirun and nothing else changes.
#pragma once

#include <string>

namespace ferry {

struct RankInfo {
  int rank = 0;            // world rank
  int size = 1;            // world size
  int local_rank = 0;      // rank among the processes of this machine: picks the device
  int local_size = 1;      // processes on this machine
  bool under_mpi = false;  // MPI was initialised by init_ranks (launched by mpirun)

  bool is_root() const { return rank == 0; }
};

// Whether a launcher started this process: OMPI_COMM_WORLD_SIZE (Open MPI), PMIX_RANK (PMIx:
// Open MPI 4+, Slurm), PMI_RANK / PMI_SIZE (MPICH's hydra, Intel MPI).
bool launched_by_mpi();

// Discovers the ranks. Under a launcher: MPI_Init_thread(MPI_THREAD_MULTIPLE) (once; a second
// call only queries), world rank and size, local rank and size through
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Otherwise one rank, MPI untouched. Throws
// UnsupportedError when the MPI library cannot give MPI_THREAD_MULTIPLE, LibraryError on MPI
// failures.
RankInfo init_ranks();

// This machine's host name (the node a rank runs on, in messages and per-node files); "" when
// it cannot be read.
std::string host_name();

// Whether MPI is initialised and not yet finalised in this process.
bool mpi_active();

// MPI_Finalize if init_ranks initialised MPI and it is not finalised yet; a no-op otherwise.
// Every communicator must be destroyed first. Collective: every rank calls it.
void finalize_ranks();

// Ends the whole job now with exit code `code`: MPI_Abort(MPI_COMM_WORLD, code) when MPI is
// initialised (the launcher then kills every rank, including those blocked in a collective),
// std::exit(code) otherwise. For `main` only (see comm/fault.h); library code never calls it.
[[noreturn]] void abort_job(int code);

}  // namespace ferry
