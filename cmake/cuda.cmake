# Detects the CUDA toolkit with cuDNN, cuBLAS and NCCL. Sets FERRY_HAVE_CUDA and, when found,
# the imported targets ferry::cudnn and ferry::nccl. A machine without them builds the CPU
# backend alone and says so here.
set(FERRY_HAVE_CUDA OFF)
if(NOT FERRY_CUDA STREQUAL "off")
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  set(_cuda_missing "")
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # A100 (sm_80) and H100 (sm_90) machine code, plus PTX of both for the driver to JIT on
      # newer GPUs; set CMAKE_CUDA_ARCHITECTURES for others.
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25 knows no nvcc dialect past C++17; .cc files stay C++20.
    set(CMAKE_CUDA_STANDARD 17)
    # One CUDA runtime in every binary: the shared one.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    find_package(CUDAToolkit REQUIRED)
    find_path(CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    foreach(_v CUDNN_INCLUDE_DIR CUDNN_LIBRARY NCCL_INCLUDE_DIR NCCL_LIBRARY)
      if(NOT ${_v})
        list(APPEND _cuda_missing ${_v})
      endif()
    endforeach()
    if(NOT TARGET CUDA::cublas)
      list(APPEND _cuda_missing cuBLAS)
    endif()
  else()
    set(_cuda_missing "nvcc")
  endif()

  if(_cuda_missing STREQUAL "")
    set(FERRY_HAVE_CUDA ON)
    add_library(ferry::cudnn UNKNOWN IMPORTED)
    set_target_properties(ferry::cudnn PROPERTIES IMPORTED_LOCATION ${CUDNN_LIBRARY}
                                                  INTERFACE_INCLUDE_DIRECTORIES ${CUDNN_INCLUDE_DIR})
    add_library(ferry::nccl UNKNOWN IMPORTED)
    set_target_properties(ferry::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                                                 INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
    message(STATUS "ferry: CUDA backend ON (CUDA ${CUDAToolkit_VERSION}, cuDNN ${CUDNN_LIBRARY}, "
                   "NCCL ${NCCL_LIBRARY}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(FERRY_CUDA STREQUAL "on")
    message(FATAL_ERROR "ferry: FERRY_CUDA=on but not found: ${_cuda_missing}")
  else()
    message(STATUS "ferry: CUDA backend OFF: not found: ${_cuda_missing}. "
                   "Building the CPU backend alone.")
  endif()
else()
  message(STATUS "ferry: CUDA backend OFF (FERRY_CUDA=off). Building the CPU backend alone.")
endif()
