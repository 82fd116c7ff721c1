// The out-of-line half of NCCL_CHECK: the message and the throw.
#include "comm/nccl_check.h"

#include <string>

#include "common/error.h"

namespace ferry::nccl {

void throw_nccl_error(ncclResult_t status, const char* call, const char* file, int line) {
  std::string message = ncclGetErrorString(status);
  const char* detail = ncclGetLastError(nullptr);  // this thread's last error, if NCCL kept one
  if (detail != nullptr && *detail != '\0') message += std::string(": ") + detail;
  throw LibraryError("NCCL", call, message, file, line);
}

}  // namespace ferry::nccl
