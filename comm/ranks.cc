// Rank discovery through MPI when a launcher started the process; one rank otherwise.
#include "comm/ranks.h"

#include <unistd.h>

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "comm/mpi_check.h"
#include "common/error.h"

namespace ferry {
namespace {

bool env_set(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0';
}

bool mpi_initialized() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized != 0;
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

bool g_we_initialized = false;  // init_ranks called MPI_Init_thread (so finalize_ranks finalizes)

}  // namespace

bool launched_by_mpi() {
  return env_set("OMPI_COMM_WORLD_SIZE") || env_set("PMIX_RANK") || env_set("PMI_RANK") ||
         env_set("PMI_SIZE");
}

RankInfo init_ranks() {
  RankInfo info;
  if (!launched_by_mpi()) return info;
  if (mpi_finalized()) {
    throw UnsupportedError("init_ranks: MPI was already finalised in this process",
                           "call init_ranks once, before finalize_ranks");
  }
  if (!mpi_initialized()) {
    int provided = MPI_THREAD_SINGLE;
    // Errors during initialisation are fatal in MPI (it prints and aborts), so no check here.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    g_we_initialized = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      throw UnsupportedError(
          fmt::format("the MPI library gives thread level {} but ferry needs MPI_THREAD_MULTIPLE "
                      "({}): collectives run on the comm stream's thread",
                      provided, MPI_THREAD_MULTIPLE),
          "use an MPI built with thread support (Open MPI 4 has it by default)");
    }
  } else {
    int provided = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&provided));
    if (provided < MPI_THREAD_MULTIPLE) {
      throw UnsupportedError("MPI was initialised without MPI_THREAD_MULTIPLE",
                             "initialise MPI through init_ranks, or with MPI_Init_thread("
                             "MPI_THREAD_MULTIPLE)");
    }
  }
  // Failures after this point come back as codes, so MPI_CHECK can report them.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &info.rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &info.size));
  MPI_Comm local = MPI_COMM_NULL;
  MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &local));
  MPI_CHECK(MPI_Comm_rank(local, &info.local_rank));
  MPI_CHECK(MPI_Comm_size(local, &info.local_size));
  MPI_CHECK(MPI_Comm_free(&local));
  info.under_mpi = true;
  return info;
}

bool mpi_active() { return mpi_initialized() && !mpi_finalized(); }

void finalize_ranks() {
  if (!g_we_initialized || mpi_finalized()) return;
  MPI_CHECK(MPI_Finalize());
}

void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_active()) {
    MPI_Abort(MPI_COMM_WORLD, code == 0 ? 1 : code);
    std::_Exit(code == 0 ? 1 : code);  // MPI_Abort does not return; if it did, still end
  }
  std::exit(code);
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "";
  return host;
}

}  // namespace ferry
