// A deterministic fuzz driver for the safetensors reader: thousands of mutated images of valid
// files (bit flips, truncation, boundary integers in the length field, nasty numbers in shapes
// and data_offsets) must each parse consistently or fail with a DataError, never crash, hang or
// allocate from a header's claim. Run under ASan and UBSan by the fuzz_asan test.
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/fuzz_mutator.h"
#include "tests/support/temp_dir.h"
#include "trainer/checkpoint/safetensors.h"

namespace ferry {
namespace {

using fuzz::Rng;
using fuzz::Tally;

std::vector<uint8_t> to_bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

// A file image: 8-byte little-endian header length, the header, then `data`.
std::string image(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  fuzz::put_integer(out, 0, 8, header.size(), false);
  return out + header + data;
}

// A valid file of `tensors` (their data filled with a byte pattern) and metadata.
std::string valid_file(std::vector<SafetensorsTensor> tensors, const SafetensorsMetadata& meta) {
  std::vector<std::vector<uint8_t>> storage;
  for (auto& t : tensors) {
    storage.emplace_back(static_cast<size_t>(t.shape.numel()) * dtype_size(t.dtype));
    for (size_t i = 0; i < storage.back().size(); ++i) storage.back()[i] = uint8_t(i * 37 + 11);
    t.data = storage.back().data();
  }
  const SafetensorsLayout layout = safetensors_layout(tensors, meta);
  std::string data;
  for (size_t i : layout.order) {
    data.append(reinterpret_cast<const char*>(storage[i].data()), storage[i].size());
  }
  return image(layout.header, data);
}

std::vector<std::string> seeds() {
  return {
      valid_file({{"w", DType::kF32, Shape{2, 3}, nullptr},
                  {"b", DType::kF32, Shape{3}, nullptr},
                  {"step", DType::kI64, Shape{}, nullptr},
                  {"mask", DType::kU8, Shape{5}, nullptr},
                  {"empty", DType::kF64, Shape{0, 4}, nullptr},
                  {"idx", DType::kI32, Shape{1, 1, 2}, nullptr}},
                 {{"format", "pt"}, {"ferry", "1"}}),
      valid_file({{"conv1.weight", DType::kF32, Shape{4, 1, 3, 3}, nullptr}}, {}),
      valid_file({}, {{"only", "metadata"}}),
  };
}

// Everything a consumer does with a parsed file.
void exercise(const SafetensorsFile& f, size_t file_size) {
  uint64_t covered = 0;
  for (const SafetensorsEntry& e : f.entries()) {
    EXPECT_EQ(&f.at(e.name), &e);
    const uint64_t bytes = static_cast<uint64_t>(e.shape.numel()) * dtype_size(e.dtype);
    ASSERT_EQ(e.bytes.size(), bytes) << e.name;
    std::vector<uint8_t> copy(e.bytes.begin(), e.bytes.end());
    (void)e.shape.str();
    covered += bytes;
  }
  EXPECT_LE(covered, file_size);
  for (const auto& [k, v] : f.metadata()) EXPECT_LE(k.size() + v.size(), file_size);
  EXPECT_EQ(f.find("\xff no such tensor"), nullptr);
}

void parse_and_exercise(const std::string& input) {
  const SafetensorsFile f = parse_safetensors(to_bytes(input), "fuzz.safetensors");
  exercise(f, input.size());
}

// The header JSON of a valid image, mutated as text; the length field is fixed up so the
// parse reaches the JSON and the checks after it.
std::string mutate_header(const std::string& file, Rng& rng) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(file[i])) << (8 * i);
  std::string header = file.substr(8, n);
  const std::string data = file.substr(8 + n);
  header = fuzz::mutate_text(header, rng, "{}[]\",:0123456789-.e ");
  if (rng.one_in(3)) header = fuzz::mutate_text(header, rng, "{}[]\",:0123456789-.e ");
  return image(header, rng.one_in(8) ? data.substr(0, rng.below(data.size() + 1)) : data);
}

TEST(SafetensorsFuzz, MutatedFiles) {
  Tally tally;
  uint64_t seed_value = 1;
  for (const std::string& seed : seeds()) {
    ASSERT_NO_THROW(parse_and_exercise(seed));
    Rng rng(seed_value++);
    const fuzz::IntegerFields length_field{{0}, 8, false};
    for (int i = 0; i < 1500; ++i) {
      std::string input =
          i % 2 ? fuzz::mutate_bytes(seed, rng, length_field) : mutate_header(seed, rng);
      if (rng.one_in(4)) input = fuzz::mutate_bytes(input, rng, length_field);
      fuzz::run_case<DataError>(fmt::format("safetensors-{}", seed_value), i, input, tally,
                                parse_and_exercise);
    }
  }
  fuzz::expect_tally(tally, "safetensors fuzz", "parsed", "a DataError",
                     {.cases = 4500, .rejected_above = 2000, .accepted_above = 50});
}

// A header that claims far more data than the file holds is refused from the sizes alone.
TEST(SafetensorsFuzz, HugeClaimsAreRefusedWithoutAllocating) {
  const std::vector<std::string> headers = {
      R"({"x":{"dtype":"F32","shape":[1000000000000000],"data_offsets":[0,4000000000000000]}})",
      R"({"x":{"dtype":"F32","shape":[1000000,1000000,1000],"data_offsets":[0,4]}})",
      R"({"x":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,18446744073709551615]}})",
      R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[18446744073709551612,18446744073709551615]}})",
      R"({"x":{"dtype":"I64","shape":[4611686018427387904,4],"data_offsets":[0,0]}})",
      R"({"x":{"dtype":"U8","shape":[4611686018427387904,2,0],"data_offsets":[0,0]}})",
      R"({"x":{"dtype":"U8","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})",
      R"({"x":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})",
      R"({"x":{"dtype":"U8","shape":[1e15],"data_offsets":[0,1e15]}})",
      R"({"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"y":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
  };
  for (const std::string& h : headers) {
    EXPECT_THROW(parse_and_exercise(image(h, std::string(4, '\0'))), DataError) << h;
  }
  // Header lengths at the 64-bit edges, with and without a body.
  for (uint64_t n : fuzz::boundary_integers()) {
    std::string file(8, '\0');
    fuzz::put_integer(file, 0, 8, n, false);
    EXPECT_THROW(parse_and_exercise(file), DataError) << n;
    if (n > 2) {
      EXPECT_THROW(parse_and_exercise(file + "{}"), DataError) << n;
    }
  }
}

TEST(SafetensorsFuzz, DeeplyNestedJsonIsADataError) {
  for (const char* where : {"shape", "data_offsets", "dtype"}) {
    const std::string deep = std::string(200000, '[') + std::string(200000, ']');
    std::string h = R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})";
    const std::string key = fmt::format("\"{}\":", where);
    const size_t at = h.find(key) + key.size();
    const size_t end = h.find_first_of(",}", h[at] == '[' ? h.find(']', at) : at);
    h.replace(at, end - at, deep);
    EXPECT_THROW(parse_and_exercise(image(h, "")), DataError) << where;
  }
  const std::string meta =
      R"({"__metadata__":)" + std::string(200000, '{') + std::string(200000, '}') + "}";
  EXPECT_THROW(parse_and_exercise(image(meta, "")), DataError);
  // Unbalanced nesting: the JSON parser must stop at the end, not run past it.
  EXPECT_THROW(parse_and_exercise(image(std::string(100000, '['), "")), DataError);
}

TEST(SafetensorsFuzz, NastyNamesAndValues) {
  const std::vector<std::string> headers = {
      "{\"\xff\xfe\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",  // not UTF-8
      R"({"x":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"dtype":"F32"}})",  // duplicate
      R"({"__metadata__":{"a":1}})",
      R"({"__metadata__":[]})",
      R"({"x":null})",
      R"({"x":{"dtype":null,"shape":null,"data_offsets":null}})",
      R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[0]}})",
      R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[1,0]}})",
      R"({"x":{"dtype":"BF16","shape":[0],"data_offsets":[0,0]}})",
      R"([])",
      R"("")",
      "",
      "{}\x00\x00",
  };
  for (const std::string& h : headers) {
    fuzz::Tally tally;
    fuzz::run_case<DataError>("nasty", 0, image(h, ""), tally, parse_and_exercise);
    EXPECT_EQ(tally.rejected + tally.accepted, 1) << h;
  }
  // A name with every byte value that JSON allows escaped, and an empty name, are kept.
  std::string name;
  for (int c = 1; c < 128; ++c) name += static_cast<char>(c);
  const std::string file = valid_file({{name, DType::kU8, Shape{1}, nullptr},
                                       {"", DType::kU8, Shape{0}, nullptr},
                                       {"\u00e9\u4e2d\U0001F600", DType::kU8, Shape{2}, nullptr}},
                                      {{"", ""}});
  const SafetensorsFile f = parse_safetensors(to_bytes(file), "names");
  EXPECT_EQ(f.at(name).bytes.size(), 1u);
  EXPECT_EQ(f.at("").bytes.size(), 0u);
  EXPECT_EQ(f.at("\u00e9\u4e2d\U0001F600").bytes.size(), 2u);
}

TEST(SafetensorsFuzz, NotARegularFileIsADataError) {
  const testing::TempDir dir;
  EXPECT_THROW(read_safetensors(dir.str()), DataError);
  EXPECT_THROW(read_safetensors("/nonexistent/x.safetensors"), DataError);
}

}  // namespace
}  // namespace ferry
