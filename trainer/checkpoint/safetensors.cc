// safetensors encoding and validation. The writer streams the tensors through an
// AtomicFileWriter; the reader loads the whole file once and hands out views into it.
#include "trainer/checkpoint/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/strings.h"
#include "trainer/checkpoint/atomic_file.h"

namespace ferry {

namespace {

constexpr const char* kMetadataKey = "__metadata__";
// The reference reader refuses headers above 100 MB; so do we (it also bounds the JSON parse).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A valid header nests 3 deep ({name: {shape: [...]}}). Deeper JSON is refused while parsing,
// before anything recursive (dump, comparison) can run out of stack on it.
constexpr int kMaxHeaderDepth = 8;

// The reference library's dtype enum order (BOOL < ... < U8 < ... < BF16 < I32 < F32 < F64 <
// I64 ...); it lays tensors out by this rank descending, which keeps every tensor naturally
// aligned.
int reference_rank(DType t) {
  switch (t) {
    case DType::kU8:
      return 0;
    case DType::kBF16:
      return 1;
    case DType::kI32:
      return 2;
    case DType::kF32:
      return 3;
    case DType::kF64:
      return 4;
    case DType::kI64:
      return 5;
  }
  return -1;
}

// The dtypes read as stored. BF16 is not among them: it is widened to F32 on read (Note [Half
// precision on read]); ferry can write it (kBF16), as the reference library lays it out.
bool dtype_from_name(std::string_view name, DType* out) {
  for (DType t : {DType::kF32, DType::kF64, DType::kI32, DType::kI64, DType::kU8}) {
    if (dtype_name(t) == name) {
      *out = t;
      return true;
    }
  }
  return false;
}

// Note [Half precision on read]
// Published weights often come as BF16 or F16 (a Hugging Face model saved in its training
// dtype). Both widen to F32 exactly (every BF16 and F16 value, subnormals, infinities and NaN
// included, is an F32 value), so the reader widens them once, on read, and every consumer sees
// F32 tensors; `stored_dtype` keeps what the file held. Files ferry writes stay F32.

// Bytes per element of a half-precision dtype the reader widens to F32; 0 for any other name.
size_t half_dtype_size(std::string_view name) { return name == "BF16" || name == "F16" ? 2 : 0; }

// An IEEE binary16 value as the F32 with the same value.
float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // infinity or NaN (payload kept)
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else if (mantissa == 0) {
    bits = sign;  // signed zero
  } else {
    // Subnormal: shift the leading one into the implicit bit; each shift lowers the exponent.
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// `count` little-endian BF16 or F16 values at `in` as F32 bytes.
std::vector<uint8_t> widen_to_f32(std::string_view dtype, const uint8_t* in, size_t count) {
  std::vector<uint8_t> out(count * sizeof(float));
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h = static_cast<uint16_t>(in[2 * i] | (in[2 * i + 1] << 8));
    float f;
    if (dtype == "BF16") {
      const uint32_t bits = static_cast<uint32_t>(h) << 16;  // BF16 is F32's upper half
      std::memcpy(&f, &bits, sizeof(f));
    } else {
      f = f16_to_f32(h);
    }
    std::memcpy(out.data() + i * sizeof(float), &f, sizeof(f));
  }
  return out;
}

// A JSON string literal; DataError when `s` is not valid UTF-8.
std::string json_string(const std::string& s, std::string_view what) {
  try {
    return nlohmann::json(s).dump();
  } catch (const nlohmann::json::exception&) {
    throw DataError(fmt::format("{} '{}' is not valid UTF-8", what, s),
                    "safetensors stores names and metadata as UTF-8 JSON strings");
  }
}

uint64_t tensor_bytes(const SafetensorsTensor& t) {
  uint64_t n = 1;
  for (int64_t d : t.shape.dims()) {
    if (d < 0) {
      throw DataError(fmt::format("cannot write tensor '{}': negative dimension in shape {}",
                                  t.name, t.shape.str()));
    }
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) {
      throw DataError(
          fmt::format("cannot write tensor '{}': shape {} overflows", t.name, t.shape.str()));
    }
  }
  return n * dtype_size(t.dtype);
}

}  // namespace

SafetensorsLayout safetensors_layout(const std::vector<SafetensorsTensor>& tensors,
                                     const SafetensorsMetadata& metadata) {
  SafetensorsLayout layout;
  std::set<std::string_view> names;
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == kMetadataKey) {
      throw DataError("cannot write a tensor named '__metadata__': the name is reserved");
    }
    if (!names.insert(t.name).second) {
      throw DataError(fmt::format("cannot write two tensors named '{}'", t.name),
                      "tensor names in one safetensors file must be unique");
    }
  }
  layout.order.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) layout.order[i] = i;
  std::sort(layout.order.begin(), layout.order.end(), [&](size_t a, size_t b) {
    const int ra = reference_rank(tensors[a].dtype);
    const int rb = reference_rank(tensors[b].dtype);
    if (ra != rb) return ra > rb;
    return tensors[a].name < tensors[b].name;
  });

  std::string h(1, '{');
  bool first = true;
  if (!metadata.empty()) {
    h += fmt::format("\"{}\":{{", kMetadataKey);
    bool first_entry = true;
    for (const auto& [key, value] : metadata) {
      if (!first_entry) h += ',';
      first_entry = false;
      h += json_string(key, "metadata key");
      h += ':';
      h += json_string(value, "metadata value");
    }
    h += '}';
    first = false;
  }
  uint64_t offset = 0;
  for (size_t i : layout.order) {
    const SafetensorsTensor& t = tensors[i];
    const uint64_t bytes = tensor_bytes(t);
    if (bytes > 0 && t.data == nullptr) {
      throw DataError(fmt::format("cannot write tensor '{}': no data for {} bytes", t.name, bytes));
    }
    if (!first) h += ',';
    first = false;
    h += json_string(t.name, "tensor name");
    h += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                     dtype_name(t.dtype), fmt::join(t.shape.dims(), ","), offset, offset + bytes);
    offset += bytes;
  }
  h += '}';
  // The reference writer pads the header with spaces to a multiple of 8 bytes.
  h.append((8 - h.size() % 8) % 8, ' ');
  layout.header = std::move(h);
  layout.data_bytes = offset;
  return layout;
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const SafetensorsMetadata& metadata) {
  const SafetensorsLayout layout = safetensors_layout(tensors, metadata);
  AtomicFileWriter out(path);
  uint8_t length[8];
  const uint64_t n = layout.header.size();
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(length, sizeof(length));
  out.write(layout.header.data(), layout.header.size());
  for (size_t i : layout.order) {
    const SafetensorsTensor& t = tensors[i];
    out.write(t.data, t.shape.numel() * dtype_size(t.dtype));
  }
  out.commit();
}

// ---- reading ----

namespace {

[[noreturn]] void bad(const std::string& source, const std::string& problem) {
  throw DataError(fmt::format("safetensors file '{}': {}", source, problem),
                  "the file is truncated or not a safetensors file; rewrite it or pick another");
}

// A JSON value for a message, cut to a readable length.
std::string excerpt(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

std::vector<int64_t> parse_shape(const std::string& source, const std::string& name,
                                 const nlohmann::json& j) {
  if (!j.is_array()) bad(source, fmt::format("tensor '{}': 'shape' is not an array", name));
  std::vector<int64_t> dims;
  for (const auto& d : j) {
    if (!d.is_number_unsigned()) {
      bad(source, fmt::format("tensor '{}': shape {} has an entry that is not a non-negative "
                              "integer",
                              name, excerpt(j)));
    }
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) {
      bad(source, fmt::format("tensor '{}': shape {} is out of range", name, excerpt(j)));
    }
    dims.push_back(static_cast<int64_t>(v));
  }
  return dims;
}

}  // namespace

SafetensorsFile parse_safetensors(std::vector<uint8_t> bytes, std::string source) {
  const uint64_t size = bytes.size();
  if (size < 8) {
    bad(source, fmt::format("{} bytes is too short for the 8-byte header length", size));
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  if (n > size - 8) {
    bad(source, fmt::format("header length {} runs past the end of the file ({} bytes)", n, size));
  }
  if (n > kMaxHeaderBytes) {
    bad(source, fmt::format("header length {} is above the 100 MB limit", n));
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  nlohmann::json header;
  const auto limit_depth = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxHeaderDepth) {
      bad(source, fmt::format("header JSON nests deeper than {} levels", kMaxHeaderDepth));
    }
    return true;
  };
  try {
    header = nlohmann::json::parse(header_begin, header_begin + n, limit_depth);
  } catch (const nlohmann::json::exception& e) {
    bad(source, fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) bad(source, "header is not a JSON object");

  SafetensorsFile file;
  file.source_ = source;
  const uint64_t data_begin = 8 + n;
  const uint64_t data_size = size - data_begin;

  struct Span {
    uint64_t begin, end;
    size_t entry;
  };
  std::vector<Span> spans;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == kMetadataKey) {
      if (!v.is_object()) bad(source, "'__metadata__' is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) {
          bad(source, fmt::format("metadata '{}' is not a string", m.key()));
        }
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!v.is_object()) bad(source, fmt::format("tensor '{}' is not an object", name));
    if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      bad(source, fmt::format("tensor '{}' lacks one of 'dtype', 'shape', 'data_offsets'", name));
    }
    SafetensorsEntry e;
    e.name = name;
    if (!v["dtype"].is_string())
      bad(source, fmt::format("tensor '{}': 'dtype' is not a string", name));
    const std::string dtype = v["dtype"].get<std::string>();
    const size_t half = half_dtype_size(dtype);
    if (half > 0) {
      e.dtype = DType::kF32;  // widened below (Note [Half precision on read])
    } else if (!dtype_from_name(dtype, &e.dtype)) {
      // A valid file in a dtype ferry does not read: the hint is a conversion, not "truncated".
      throw DataError(
          fmt::format("safetensors file '{}': tensor '{}' has dtype '{}', which ferry does not "
                      "read (it reads F32, F64, I32, I64, U8, and BF16 and F16 as F32)",
                      source, name, dtype),
          "convert the file's tensors to F32, e.g. safetensors.torch.save_file({k: v.float() "
          "for k, v in load_file(path).items()}, out)");
    }
    e.stored_dtype = dtype;
    e.shape = Shape(parse_shape(source, name, v["shape"]));
    const nlohmann::json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
        !off[1].is_number_unsigned()) {
      bad(source, fmt::format("tensor '{}': 'data_offsets' is not [begin, end] of non-negative "
                              "integers: {}",
                              name, excerpt(off)));
    }
    const uint64_t begin = off[0].get<uint64_t>();
    const uint64_t end = off[1].get<uint64_t>();
    if (end < begin) {
      bad(source, fmt::format("tensor '{}': data_offsets [{}, {}] end before they begin", name,
                              begin, end));
    }
    if (end > data_size) {
      bad(source, fmt::format("tensor '{}': data_offsets [{}, {}] run past the {}-byte buffer",
                              name, begin, end, data_size));
    }
    // Every partial product must fit int64_t too: Shape::numel() multiplies in that type.
    uint64_t expected = half > 0 ? half : dtype_size(e.dtype);
    for (int64_t d : e.shape.dims()) {
      if (__builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected) ||
          expected > static_cast<uint64_t>(INT64_MAX)) {
        bad(source, fmt::format("tensor '{}': shape {} overflows", name, e.shape.str()));
      }
    }
    if (end - begin != expected) {
      bad(source, fmt::format("tensor '{}': shape {} of {} needs {} bytes but data_offsets [{}, "
                              "{}] hold {}",
                              name, e.shape.str(), dtype, expected, begin, end, end - begin));
    }
    spans.push_back({begin, end, file.entries_.size()});
    file.entries_.push_back(std::move(e));
  }

  // The tensors must tile the buffer exactly: no overlap, no gap, nothing after the last.
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const std::string* previous = nullptr;
  for (const Span& s : spans) {
    const std::string& name = file.entries_[s.entry].name;
    if (s.begin < cursor) {
      bad(source, fmt::format("tensor '{}' (data_offsets [{}, {}]) overlaps tensor '{}'", name,
                              s.begin, s.end, previous ? *previous : std::string()));
    }
    if (s.begin > cursor) {
      bad(source, fmt::format("gap of {} bytes before tensor '{}' (data_offsets [{}, {}])",
                              s.begin - cursor, name, s.begin, s.end));
    }
    cursor = s.end;
    previous = &name;
  }
  if (cursor != data_size) {
    bad(source, fmt::format("the tensors cover {} bytes but the buffer after the header has {}",
                            cursor, data_size));
  }

  // Entries in file order; views into the buffer (a moved vector keeps its storage).
  file.buffer_ = std::move(bytes);
  std::vector<SafetensorsEntry> ordered;
  ordered.reserve(spans.size());
  for (const Span& s : spans) {
    SafetensorsEntry e = std::move(file.entries_[s.entry]);
    e.bytes = std::span<const uint8_t>(file.buffer_.data() + data_begin + s.begin, s.end - s.begin);
    if (half_dtype_size(e.stored_dtype) > 0) {
      // A moved vector keeps its storage, so the span stays valid as widened_ grows.
      file.widened_.push_back(widen_to_f32(e.stored_dtype, e.bytes.data(), e.bytes.size() / 2));
      e.bytes = std::span<const uint8_t>(file.widened_.back());
    }
    ordered.push_back(std::move(e));
  }
  file.entries_ = std::move(ordered);
  for (size_t i = 0; i < file.entries_.size(); ++i) file.index_[file.entries_[i].name] = i;
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  // Only a regular file: a directory opens as a stream whose size reads as 2^63 - 1.
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec)) {
    throw DataError(fmt::format("safetensors file '{}' is not a regular file (a directory?)", path),
                    "check the path (checkpoint.resume, model.init_from)");
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    throw DataError(fmt::format("cannot open safetensors file '{}'", path),
                    "check the path (checkpoint.resume, model.init_from)");
  }
  const std::streamoff size = in.tellg();
  if (size < 0) throw DataError(fmt::format("cannot read the size of '{}'", path));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(reinterpret_cast<char*>(bytes.data()), size)) {
    throw DataError(fmt::format("cannot read safetensors file '{}' ({} bytes)", path, size));
  }
  return parse_safetensors(std::move(bytes), path);
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const SafetensorsEntry& SafetensorsFile::at(std::string_view name) const {
  if (const SafetensorsEntry* e = find(name)) return *e;
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& e : entries_) names.push_back(e.name);
  const std::string near = nearest(name, names);
  throw DataError(fmt::format("safetensors file '{}' has no tensor '{}'{}", source_, name,
                              near.empty() ? "" : fmt::format(" (nearest: '{}')", near)),
                  "the checkpoint was written for another model or version");
}

}  // namespace ferry
