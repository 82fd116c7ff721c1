// FERRY_HOST_DEVICE marks a function that both backends compile: __host__ __device__ under nvcc,
// nothing in a host compiler. Headers that use it stay C++17 (nvcc).
#pragma once

#if defined(__CUDACC__)
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif
