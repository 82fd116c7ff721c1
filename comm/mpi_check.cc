// The out-of-line half of MPI_CHECK: the error string and the throw.
#include "comm/mpi_check.h"

#include <string>

#include "common/error.h"

namespace ferry::mpi {

const char* error_text(int code, char (&buffer)[MPI_MAX_ERROR_STRING]) {
  int length = 0;
  if (MPI_Error_string(code, buffer, &length) != MPI_SUCCESS) return "unknown MPI error";
  buffer[length < MPI_MAX_ERROR_STRING ? length : MPI_MAX_ERROR_STRING - 1] = '\0';
  return buffer;
}

void throw_mpi_error(int code, const char* call, const char* file, int line) {
  char buffer[MPI_MAX_ERROR_STRING];
  std::string message = error_text(code, buffer);
  int error_class = 0;
  if (MPI_Error_class(code, &error_class) == MPI_SUCCESS && error_class != code) {
    char class_buffer[MPI_MAX_ERROR_STRING];
    message += std::string(" (class: ") + error_text(error_class, class_buffer) + ")";
  }
  throw LibraryError("MPI", call, message, file, line);
}

}  // namespace ferry::mpi
