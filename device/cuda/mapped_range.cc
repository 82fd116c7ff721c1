// A GPU address range mapped on use, through the driver's virtual memory management reached
// from the runtime (Note [The driver through the runtime] in mapped_range.h).
#include "device/cuda/mapped_range.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdio>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_stream.h"
#include "device/cuda/gpu_shortage.h"

namespace ferry::cuda {

namespace {

// The ABI asked of the driver: every entry point below exists in it unchanged.
constexpr unsigned int kDriverAbi = 12000;

struct Driver {
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuDeviceGetAttribute_v2000 attribute = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;
  std::string missing;  // the first entry point not found, and why; empty when all were
};

template <typename Fn>
void load(const char* symbol, Fn* fn, std::string* missing) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t status =
      cudaGetDriverEntryPointByVersion(symbol, &p, kDriverAbi, cudaEnableDefault, &found);
  if (status == cudaSuccess && found == cudaDriverEntryPointSuccess && p != nullptr) {
    *fn = reinterpret_cast<Fn>(p);
    return;
  }
  (void)cudaGetLastError();
  if (!missing->empty()) return;
  *missing = status != cudaSuccess ? fmt::format("{} ({})", symbol, cuda_error_text(status))
             : found == cudaDriverEntryPointVersionNotSufficent
                 ? fmt::format("{} (not in the driver's CUDA {}.{} ABI)", symbol, kDriverAbi / 1000,
                               kDriverAbi % 1000 / 10)
                 : fmt::format("{} (not found)", symbol);
}

// The entry points, loaded once; null when one is missing (then `why` says which).
const Driver* loaded(std::string* why) {
  static const Driver d = [] {
    Driver d;
    load("cuDeviceGet", &d.device_get, &d.missing);
    load("cuDeviceGetAttribute", &d.attribute, &d.missing);
    load("cuMemGetAllocationGranularity", &d.granularity, &d.missing);
    load("cuMemAddressReserve", &d.reserve, &d.missing);
    load("cuMemAddressFree", &d.address_free, &d.missing);
    load("cuMemCreate", &d.create, &d.missing);
    load("cuMemRelease", &d.release, &d.missing);
    load("cuMemMap", &d.map, &d.missing);
    load("cuMemUnmap", &d.unmap, &d.missing);
    load("cuMemSetAccess", &d.set_access, &d.missing);
    load("cuGetErrorName", &d.error_name, &d.missing);
    return d;
  }();
  if (!d.missing.empty()) {
    if (why) *why = d.missing;
    return nullptr;
  }
  return &d;
}

const Driver& driver() {
  std::string why;
  const Driver* d = loaded(&why);
  if (d == nullptr) {
    throw UnsupportedError(
        fmt::format("memory.share on cuda maps device memory on use, and the CUDA driver does "
                    "not give {}",
                    why),
        "update the NVIDIA driver, or set memory.share=false");
  }
  return *d;
}

std::string driver_error_text(const Driver& d, CUresult status) {
  const char* name = nullptr;
  if (d.error_name(status, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  return fmt::format("{} ({})", name, static_cast<int>(status));
}

#define CU_CHECK(d, expr)                                                                          \
  do {                                                                                             \
    const CUresult ferry_cu_status_ = (expr);                                                      \
    if (ferry_cu_status_ != CUDA_SUCCESS) {                                                        \
      throw LibraryError("CUDA driver", #expr, driver_error_text((d), ferry_cu_status_), __FILE__, \
                         __LINE__);                                                                \
    }                                                                                              \
  } while (0)

CUmemAllocationProp device_memory(int ordinal) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  return prop;
}

}  // namespace

MappedRange::MappedRange(int ordinal, uint64_t bytes, uint64_t granule)
    : ordinal_(ordinal), granule_(granule) {
  use_device(ordinal_);
  const Driver& d = driver();
  CUdevice device = 0;
  CU_CHECK(d, d.device_get(&device, ordinal_));
  int supported = 0;
  CU_CHECK(
      d, d.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device));
  if (supported == 0) {
    throw UnsupportedError(
        fmt::format("memory.share on cuda maps device memory on use, and cuda:{} has no virtual "
                    "memory management",
                    ordinal_),
        "set memory.share=false and give each job its own device.memory");
  }
  const CUmemAllocationProp prop = device_memory(ordinal_);
  size_t minimum = 0;
  CU_CHECK(d, d.granularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (minimum == 0 || granule_ % minimum != 0) {
    throw UnsupportedError(
        fmt::format("cuda:{} maps device memory in pieces of {}, which do not divide the {} "
                    "granule memory.share on cuda maps in",
                    ordinal_, format_bytes(minimum), format_bytes(granule_)),
        "set memory.share=false and give each job its own device.memory");
  }
  reserved_ = (bytes + granule_ - 1) / granule_ * granule_;
  CUdeviceptr base = 0;
  CU_CHECK(d, d.reserve(&base, reserved_, granule_, 0, 0));
  base_ = base;
}

MappedRange::~MappedRange() {
  const Driver* d = loaded(nullptr);
  if (d == nullptr || base_ == 0) return;
  if (mapped_ != 0) {
    std::fprintf(stderr, "ferry: warning: cuda:%d frees its address range with %s still mapped\n",
                 ordinal_, format_bytes(mapped_).c_str());
  }
  CUDA_WARN(cudaSetDevice(ordinal_));
  const CUresult status = d->address_free(base_, reserved_);
  if (status != CUDA_SUCCESS) {
    std::fprintf(stderr, "ferry: warning: cuMemAddressFree on cuda:%d failed: %s\n", ordinal_,
                 driver_error_text(*d, status).c_str());
  }
}

void MappedRange::back(uint64_t offset, uint64_t bytes, const std::string& label, uint64_t asked) {
  FERRY_ASSERT(offset % granule_ == 0 && bytes % granule_ == 0 && offset + bytes <= reserved_,
               "a mapped piece is whole granules within the reservation");
  use_device(ordinal_);
  const Driver& d = driver();
  const CUmemAllocationProp prop = device_memory(ordinal_);
  const auto shortage = [&] {
    return gpu_shortage(
        ordinal_, label, asked, gpu_memory(ordinal_),
        fmt::format("mapping {} of it failed; lower device.memory so that the GPU holds every job "
                    "sharing it and whatever else runs there (memory.share divides device.memory "
                    "between ferry jobs only)",
                    format_bytes(bytes)));
  };
  CUmemGenericAllocationHandle handle = 0;
  const CUresult created = d.create(&handle, bytes, &prop, 0);
  if (created == CUDA_ERROR_OUT_OF_MEMORY) throw shortage();
  CU_CHECK(d, created);
  const CUdeviceptr at = base_ + offset;
  const CUresult mapped = d.map(at, bytes, 0, handle, 0);
  // The mapping keeps the memory from here on: cuMemUnmap frees it.
  const CUresult released = d.release(handle);
  if (mapped == CUDA_ERROR_OUT_OF_MEMORY) throw shortage();
  CU_CHECK(d, mapped);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult opened = released == CUDA_SUCCESS ? d.set_access(at, bytes, &access, 1) : released;
  if (opened != CUDA_SUCCESS) {
    (void)d.unmap(at, bytes);
    if (opened == CUDA_ERROR_OUT_OF_MEMORY) throw shortage();
    CU_CHECK(d, opened);
  }
  mapped_ += bytes;
}

void MappedRange::unback(uint64_t offset, uint64_t bytes) noexcept {
  const Driver* d = loaded(nullptr);
  if (d == nullptr) return;  // nothing was ever mapped
  // cuMemUnmap does not wait for work still using the piece (unlike cudaFree).
  CUDA_WARN(cudaSetDevice(ordinal_));
  CUDA_WARN(cudaDeviceSynchronize());
  const CUresult status = d->unmap(base_ + offset, bytes);
  if (status != CUDA_SUCCESS) {
    std::fprintf(stderr, "ferry: warning: cuMemUnmap of %s on cuda:%d failed: %s\n",
                 format_bytes(bytes).c_str(), ordinal_, driver_error_text(*d, status).c_str());
    return;
  }
  mapped_ -= bytes;
}

}  // namespace ferry::cuda
