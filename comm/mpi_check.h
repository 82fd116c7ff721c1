// MPI_CHECK: runs an MPI call once and, when it does not return MPI_SUCCESS, throws
// LibraryError("MPI", call text, MPI_Error_string's message, file, line). Calls only return
// errors on communicators with MPI_ERRORS_RETURN, which init_ranks and the MPI backend set.
#pragma once

#include <mpi.h>

namespace ferry::mpi {

// "MPI_ERR_TRUNCATE: message truncated" for an MPI error code.
const char* error_text(int code, char (&buffer)[MPI_MAX_ERROR_STRING]);

[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);

}  // namespace ferry::mpi

#define MPI_CHECK(expr)                                                            \
  do {                                                                             \
    const int ferry_mpi_status_ = (expr);                                          \
    if (ferry_mpi_status_ != MPI_SUCCESS) {                                        \
      ::ferry::mpi::throw_mpi_error(ferry_mpi_status_, #expr, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)
