// HWLOC_CHECK: wraps an hwloc call that returns a negative value on failure, recording the call
// text, file, line and errno's message in a LibraryError. Private to topology/*.cc.
#pragma once

#include <cerrno>
#include <cstring>

#include "common/error.h"

#define HWLOC_CHECK(call)                                                                     \
  do {                                                                                        \
    errno = 0;                                                                                \
    if ((call) < 0) {                                                                         \
      const int ferry_hwloc_errno_ = errno;                                                   \
      throw ::ferry::LibraryError(                                                            \
          "hwloc", #call,                                                                     \
          ferry_hwloc_errno_ ? std::strerror(ferry_hwloc_errno_) : "failed without an errno", \
          __FILE__, __LINE__);                                                                \
    }                                                                                         \
  } while (0)
