# Fails when CUDA code in the tree issues work on the legacy default stream, which ferry's
# cudaStreamNonBlocking streams are not ordered with (issue 16, defect 3): a synchronous
# cudaMemcpy/cudaMemset (a pageable cudaMemcpy may even return before its DMA lands), an
# asynchronous call or library stream binding given the null stream, or cudaStreamLegacy.
# A line may opt out with "ferry-lint: legacy-stream-ok (why)" on it or on the line above.
#   cmake -DROOT=<source dir> -DDIRS="device;comm;tests" -P no_legacy_stream.cmake
set(sync_call "cudaMemcpy\\(|cudaMemset\\(|cudaMemcpy2D\\(|cudaMemcpy3D\\(|cudaMemcpyToSymbol\\(|cudaMemcpyFromSymbol\\(")
set(null_stream "(Async|SetStream)\\([^;]*, *(nullptr|NULL|0)\\)")
set(legacy "cudaStreamLegacy")
set(found "")
foreach(dir ${DIRS})
  file(GLOB_RECURSE files "${ROOT}/${dir}/*.cc" "${ROOT}/${dir}/*.cu" "${ROOT}/${dir}/*.h"
       "${ROOT}/${dir}/*.cuh")
  foreach(f ${files})
    # The host emulation stands in for the runtime: its definitions are not calls.
    if(f MATCHES "/host_emulation/")
      continue()
    endif()
    file(STRINGS "${f}" lines)
    set(previous "")
    set(number 0)
    foreach(line IN LISTS lines)
      math(EXPR number "${number} + 1")
      string(REGEX REPLACE "//.*$" "" code "${line}")
      if(NOT "${line}${previous}" MATCHES "ferry-lint: legacy-stream-ok")
        if(code MATCHES "${sync_call}" OR code MATCHES "${null_stream}" OR code MATCHES "${legacy}")
          file(RELATIVE_PATH rel "${ROOT}" "${f}")
          string(STRIP "${line}" text)
          string(APPEND found "  ${rel}:${number}: ${text}\n")
        endif()
      endif()
      set(previous "${line}")
    endforeach()
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "work on the legacy default stream (use the device's streams and the "
                      "*Async calls on them, then synchronise that stream):\n${found}")
endif()
message("ok: no work on the legacy default stream under ${DIRS}")
