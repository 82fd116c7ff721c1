// The safetensors file format: an 8-byte little-endian header length N, N bytes of JSON
// ({name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, space-padded to a multiple
// of 8), then the tensor bytes. Invariant: files written here are byte-identical to what the
// reference library writes for the same tensors; files read here passed every reference check
// (BF16 and F16 tensors are widened to F32 on read, exactly: Note [Half precision on read]).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "device/dtype.h"
#include "device/shape.h"

namespace ferry {

// String metadata stored under "__metadata__" (written in key order).
using SafetensorsMetadata = std::map<std::string, std::string>;

// One tensor to write: `data` holds shape.numel() * dtype_size(dtype) bytes, row-major.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;  // [] is a scalar (1 element), [0] is empty
  const void* data = nullptr;
};

// Writes `tensors` to `path` atomically (Note [Atomic replace] in atomic_file.cc): a crash or an
// error never leaves a half-written file at `path`. Tensors are laid out as the reference
// library does: by dtype size descending (I64, F64, F32, I32, U8), then by name. DataError on
// an I/O failure, a duplicate or reserved name, or a negative dimension.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const SafetensorsMetadata& metadata = {});

// The encoded header (JSON with padding, without the 8-byte length) and the tensors in file
// order, as write_safetensors lays them out. Exposed for tests and for size estimates.
struct SafetensorsLayout {
  std::string header;
  std::vector<size_t> order;  // indices into `tensors`, in file order
  uint64_t data_bytes = 0;
};
SafetensorsLayout safetensors_layout(const std::vector<SafetensorsTensor>& tensors,
                                     const SafetensorsMetadata& metadata);

// One tensor read from a file. `bytes` points into the owning SafetensorsFile's buffer and is
// valid while it lives; it is not necessarily aligned for `dtype` (memcpy out of it).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  std::span<const uint8_t> bytes;
  // The dtype the file stores: dtype_name(dtype), or "BF16" / "F16" for a tensor widened to F32.
  std::string stored_dtype;
};

// A parsed file: the entries in file (offset) order, the metadata, the bytes. Move-only.
class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The file name used in error messages.
  const std::string& source() const { return source_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  // nullptr when absent.
  const SafetensorsEntry* find(std::string_view name) const;
  // DataError naming the file and the nearest existing name when absent.
  const SafetensorsEntry& at(std::string_view name) const;

 private:
  friend SafetensorsFile parse_safetensors(std::vector<uint8_t> bytes, std::string source);
  std::string source_;
  std::vector<uint8_t> buffer_;  // the whole file
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;
  SafetensorsMetadata metadata_;
  std::vector<std::vector<uint8_t>> widened_;  // F32 copies of BF16 / F16 tensors
};

// Reads and validates a file. DataError naming the file and the problem when it is missing,
// too short, its header length runs past the end, the JSON is malformed, a dtype is unknown
// (or not one of F32, F64, I32, I64, U8, and BF16 or F16, which are read as F32), or shapes and
// data_offsets disagree, overlap, leave gaps or run out of the buffer.
SafetensorsFile read_safetensors(const std::string& path);

// The same checks on an in-memory image of a file; `source` names it in errors.
SafetensorsFile parse_safetensors(std::vector<uint8_t> bytes, std::string source);

}  // namespace ferry
