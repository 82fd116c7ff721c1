// safetensors: round trips of every dtype, the reference layout, and every corruption the
// reader must name instead of crashing.
#include "trainer/checkpoint/safetensors.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/temp_dir.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }

  testing::TempDir dir_;
};

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// A file image with the given header JSON and `data_bytes` zero bytes after it.
std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

// The DataError message from parsing `bytes`, or "" when it parses.
std::string parse_error(std::vector<uint8_t> bytes) {
  try {
    parse_safetensors(std::move(bytes), "bad.safetensors");
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

template <typename T>
std::vector<T> values_of(const SafetensorsEntry& e) {
  std::vector<T> out(e.bytes.size() / sizeof(T));
  std::memcpy(out.data(), e.bytes.data(), e.bytes.size());
  return out;
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeWithMetadata) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 1e-30f, -0.0f, 7.0f};
  const std::vector<double> f64 = {3.141592653589793, -1e300};
  const std::vector<int32_t> i32 = {INT32_MIN, -1, 0, INT32_MAX};
  const std::vector<int64_t> i64 = {INT64_MIN, 42, INT64_MAX};
  const std::vector<uint8_t> u8 = {0, 1, 128, 255, 7};
  const std::vector<SafetensorsTensor> tensors = {
      {"layer.weight", DType::kF32, Shape{2, 3}, f32.data()},
      {"double", DType::kF64, Shape{2}, f64.data()},
      {"ints", DType::kI32, Shape{2, 1, 2}, i32.data()},
      {"step", DType::kI64, Shape{3}, i64.data()},
      {"bytes", DType::kU8, Shape{5}, u8.data()},
  };
  const SafetensorsMetadata meta = {{"format", "pt"}, {"step", "17"}, {"quote", "a \"b\"\n"}};
  write_safetensors(path("a.safetensors"), tensors, meta);

  const SafetensorsFile f = read_safetensors(path("a.safetensors"));
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.entries().size(), 5u);
  // File order: dtype size descending as the reference writer (I64, F64, F32, I32, U8).
  EXPECT_EQ(f.entries()[0].name, "step");
  EXPECT_EQ(f.entries()[1].name, "double");
  EXPECT_EQ(f.entries()[2].name, "layer.weight");
  EXPECT_EQ(f.entries()[3].name, "ints");
  EXPECT_EQ(f.entries()[4].name, "bytes");

  const SafetensorsEntry& w = f.at("layer.weight");
  EXPECT_EQ(w.dtype, DType::kF32);
  EXPECT_EQ(w.shape, (Shape{2, 3}));
  EXPECT_EQ(values_of<float>(w), f32);
  EXPECT_TRUE(std::signbit(values_of<float>(w)[4]));
  EXPECT_EQ(values_of<double>(f.at("double")), f64);
  EXPECT_EQ(f.at("ints").shape, (Shape{2, 1, 2}));
  EXPECT_EQ(values_of<int32_t>(f.at("ints")), i32);
  EXPECT_EQ(values_of<int64_t>(f.at("step")), i64);
  EXPECT_EQ(f.at("bytes").dtype, DType::kU8);
  EXPECT_EQ(values_of<uint8_t>(f.at("bytes")), u8);
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST_F(SafetensorsTest, ExactBytesOfTheReferenceLayout) {
  const std::vector<float> b = {1.0f};
  const std::vector<int64_t> a = {5};
  const std::vector<float> c = {2.0f, 3.0f};
  write_safetensors(path("x.safetensors"),
                    {{"b", DType::kF32, Shape{1}, b.data()},
                     {"a", DType::kI64, Shape{}, a.data()},
                     {"c", DType::kF32, Shape{2}, c.data()}},
                    {{"k", "v"}});
  const std::vector<uint8_t> bytes = file_bytes(path("x.safetensors"));
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
      R"("c":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})";
  const size_t padded = (header.size() + 7) / 8 * 8;
  ASSERT_EQ(bytes.size(), 8 + padded + 20);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  EXPECT_EQ(n, padded);
  EXPECT_EQ(std::string(bytes.begin() + 8, bytes.begin() + 8 + header.size()), header);
  EXPECT_EQ(std::string(bytes.begin() + 8 + header.size(), bytes.begin() + 8 + padded),
            std::string(padded - header.size(), ' '));
  int64_t a_back = 0;
  std::memcpy(&a_back, bytes.data() + 8 + padded, 8);
  EXPECT_EQ(a_back, 5);
  float c1 = 0;
  std::memcpy(&c1, bytes.data() + 8 + padded + 16, 4);
  EXPECT_EQ(c1, 3.0f);
}

// A kBF16 tensor is written as BF16, laid out by the reference library's rank (after I32, before
// U8), and reads back widened to F32 (Note [Half precision on read]).
TEST_F(SafetensorsTest, WritesBf16InTheReferenceOrderAndReadsItWidened) {
  const std::vector<uint16_t> h = {0x3fc0, 0xc010, 0x7f80};
  const std::vector<uint8_t> u = {7};
  const std::vector<int32_t> i = {9};
  write_safetensors(path("h.safetensors"), {{"u", DType::kU8, Shape{1}, u.data()},
                                            {"h", DType::kBF16, Shape{3}, h.data()},
                                            {"i", DType::kI32, Shape{1}, i.data()}});
  const SafetensorsFile f = read_safetensors(path("h.safetensors"));
  EXPECT_EQ(f.at("i").stored_dtype, "I32");
  EXPECT_EQ(f.at("h").stored_dtype, "BF16");
  EXPECT_EQ(f.at("h").dtype, DType::kF32);
  EXPECT_EQ(values_of<float>(f.at("h")), (std::vector<float>{1.5f, -2.25f, INFINITY}));
  const std::vector<uint8_t> bytes = file_bytes(path("h.safetensors"));
  const std::string text(bytes.begin(), bytes.end());
  EXPECT_NE(text.find(R"("h":{"dtype":"BF16","shape":[3],"data_offsets":[4,10]})"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find(R"("u":{"dtype":"U8","shape":[1],"data_offsets":[10,11]})"),
            std::string::npos)
      << text;
}

TEST_F(SafetensorsTest, EmptyAndScalarTensors) {
  const double scalar = -4.5;
  write_safetensors(path("e.safetensors"), {{"empty", DType::kF32, Shape{0}, nullptr},
                                            {"empty2d", DType::kI32, Shape{3, 0}, nullptr},
                                            {"scalar", DType::kF64, Shape{}, &scalar}});
  const SafetensorsFile f = read_safetensors(path("e.safetensors"));
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.at("empty").shape, (Shape{0}));
  EXPECT_EQ(f.at("empty").bytes.size(), 0u);
  EXPECT_EQ(f.at("empty2d").shape, (Shape{3, 0}));
  EXPECT_EQ(f.at("scalar").shape.rank(), 0u);
  ASSERT_EQ(f.at("scalar").bytes.size(), 8u);
  EXPECT_EQ(values_of<double>(f.at("scalar"))[0], -4.5);
}

TEST_F(SafetensorsTest, NoTensorsAtAll) {
  write_safetensors(path("n.safetensors"), {});
  EXPECT_EQ(file_bytes(path("n.safetensors")).size(), 16u);  // 8 + "{}" padded to 8
  EXPECT_TRUE(read_safetensors(path("n.safetensors")).entries().empty());
}

TEST_F(SafetensorsTest, WriterRejectsDuplicateReservedAndNegative) {
  const float x = 1;
  EXPECT_THROW(write_safetensors(
                   path("d"), {{"a", DType::kF32, Shape{1}, &x}, {"a", DType::kF32, Shape{1}, &x}}),
               DataError);
  EXPECT_THROW(write_safetensors(path("d"), {{"__metadata__", DType::kF32, Shape{1}, &x}}),
               DataError);
  EXPECT_THROW(write_safetensors(path("d"), {{"a", DType::kF32, Shape{-1}, &x}}), DataError);
  EXPECT_THROW(write_safetensors(path("d"), {{"a", DType::kF32, Shape{4}, nullptr}}), DataError);
  EXPECT_FALSE(fs::exists(path("d")));
}

TEST_F(SafetensorsTest, AtNamesTheNearestTensor) {
  const float x = 1;
  write_safetensors(path("m"), {{"conv1.weight", DType::kF32, Shape{1}, &x}});
  const SafetensorsFile f = read_safetensors(path("m"));
  try {
    f.at("conv1.weigth");
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("nearest: 'conv1.weight'"), std::string::npos) << e.what();
  }
}

TEST_F(SafetensorsTest, MissingFileIsDataError) {
  EXPECT_THROW(read_safetensors(path("nope.safetensors")), DataError);
}

TEST(SafetensorsCorrupt, TooShort) {
  EXPECT_NE(parse_error({}).find("too short"), std::string::npos);
  EXPECT_NE(parse_error({1, 2, 3}).find("too short"), std::string::npos);
}

TEST(SafetensorsCorrupt, HeaderLengthBeyondFile) {
  std::vector<uint8_t> b = image("{}", 0);
  b[0] = 200;  // claims 200 header bytes, file has 2
  EXPECT_NE(parse_error(b).find("runs past the end"), std::string::npos);
  std::vector<uint8_t> huge(16, 0);
  huge[7] = 0xff;  // 2^63-ish: must not allocate or wrap around
  EXPECT_NE(parse_error(huge).find("runs past the end"), std::string::npos);
}

TEST(SafetensorsCorrupt, MalformedJson) {
  EXPECT_NE(parse_error(image("{\"a\": {", 0)).find("not valid JSON"), std::string::npos);
  EXPECT_NE(parse_error(image("[1, 2]  ", 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(parse_error(image(R"({"a": 3})", 0)).find("not an object"), std::string::npos);
  EXPECT_NE(parse_error(image(R"({"a": {"dtype": "F32"}})", 0)).find("lacks"), std::string::npos);
  EXPECT_NE(parse_error(image(R"({"__metadata__": {"k": 1}})", 0)).find("not a string"),
            std::string::npos);
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  const std::string e =
      parse_error(image(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2));
  EXPECT_NE(e.find("dtype 'F8_E4M3'"), std::string::npos) << e;
  try {
    parse_safetensors(image(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2),
                      "f8.safetensors");
    ADD_FAILURE() << "F8_E4M3 parsed";
  } catch (const DataError& error) {
    // A valid file in another dtype: the hint converts it, it does not call it truncated.
    EXPECT_EQ(std::string(error.hint()).find("truncated"), std::string::npos) << error.hint();
    EXPECT_NE(std::string(error.hint()).find("F32"), std::string::npos) << error.hint();
  }
  EXPECT_NE(e.find("bad.safetensors"), std::string::npos) << e;
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,1]}})", 1))
                .find("dtype 'Q9'"),
            std::string::npos);
}

// A file image with `header` and `data` after it.
std::vector<uint8_t> image_with(const std::string& header, const std::vector<uint16_t>& data) {
  std::vector<uint8_t> out = image(header, 2 * data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    out[8 + header.size() + 2 * i] = static_cast<uint8_t>(data[i]);
    out[8 + header.size() + 2 * i + 1] = static_cast<uint8_t>(data[i] >> 8);
  }
  return out;
}

// BF16 and F16 (Hugging Face files saved in their training dtype) are read as the F32 values
// they hold, exactly: normal, subnormal, signed zero, infinity and NaN.
TEST(SafetensorsHalf, Bf16AndF16WidenToF32Exactly) {
  const std::vector<uint16_t> bf16 = {0x3fc0, 0xc010, 0x0001, 0x8000, 0x7f80, 0x7fc0};
  const std::vector<uint16_t> f16 = {0x3e00, 0xc080, 0x0001, 0x0200, 0x8000, 0x7c00, 0x7bff};
  const std::string header = R"({"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},)"
                             R"("h":{"dtype":"F16","shape":[7],"data_offsets":[12,26]}})";
  std::vector<uint16_t> data = bf16;
  data.insert(data.end(), f16.begin(), f16.end());
  const SafetensorsFile file = parse_safetensors(image_with(header, data), "half.safetensors");
  const SafetensorsEntry& b = file.at("b");
  EXPECT_EQ(b.dtype, DType::kF32);
  EXPECT_EQ(b.stored_dtype, "BF16");
  EXPECT_EQ(b.shape, (Shape{2, 3}));
  const std::vector<float> bv = values_of<float>(b);
  ASSERT_EQ(bv.size(), 6u);
  EXPECT_EQ(bv[0], 1.5f);
  EXPECT_EQ(bv[1], -2.25f);
  EXPECT_EQ(bv[2], std::ldexp(1.0f, -133));  // the smallest BF16 subnormal
  EXPECT_TRUE(bv[3] == 0.0f && std::signbit(bv[3]));
  EXPECT_EQ(bv[4], INFINITY);
  EXPECT_TRUE(std::isnan(bv[5]));
  const SafetensorsEntry& h = file.at("h");
  EXPECT_EQ(h.dtype, DType::kF32);
  EXPECT_EQ(h.stored_dtype, "F16");
  const std::vector<float> hv = values_of<float>(h);
  ASSERT_EQ(hv.size(), 7u);
  EXPECT_EQ(hv[0], 1.5f);
  EXPECT_EQ(hv[1], -2.25f);
  EXPECT_EQ(hv[2], std::ldexp(1.0f, -24));  // the smallest F16 subnormal
  EXPECT_EQ(hv[3], std::ldexp(1.0f, -15));  // a larger subnormal
  EXPECT_TRUE(hv[4] == 0.0f && std::signbit(hv[4]));
  EXPECT_EQ(hv[5], INFINITY);
  EXPECT_EQ(hv[6], 65504.0f);  // the largest F16
  // The stored size is still checked: 3 BF16 values need 6 bytes, not 12.
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,12]}})", 12))
                .find("needs 6 bytes"),
            std::string::npos);
}

TEST(SafetensorsCorrupt, ShapeAndOffsetsInconsistent) {
  // 3 floats need 12 bytes, offsets hold 8.
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8))
                .find("needs 12 bytes"),
            std::string::npos);
  // Negative and fractional dimensions.
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4))
                .find("non-negative"),
            std::string::npos);
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4))
                .find("non-negative"),
            std::string::npos);
  // A shape whose element count overflows 64 bits.
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],)"
                              R"("data_offsets":[0,4]}})",
                              4))
                .find("overflows"),
            std::string::npos);
  // end < begin, and malformed data_offsets.
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4))
                .find("end before"),
            std::string::npos);
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 1))
                .find("data_offsets"),
            std::string::npos);
}

// Regression (fuzzing): a shape whose element count fits 64 unsigned bits only because of a
// trailing 0 overflowed Shape::numel()'s int64_t multiply in every consumer.
TEST(SafetensorsCorrupt, ShapeWhosePartialProductOverflowsInt64) {
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"U8","shape":[4611686018427387904,2,0],)"
                              R"("data_offsets":[0,0]}})",
                              0))
                .find("overflows"),
            std::string::npos);
  // A zero first keeps every partial product at 0: that empty tensor is valid.
  EXPECT_EQ(parse_error(image(R"({"a":{"dtype":"U8","shape":[0,4611686018427387904,2],)"
                              R"("data_offsets":[0,0]}})",
                              0)),
            "");
}

// Regression (fuzzing): printing a deeply nested shape in the error message recursed once per
// level and overflowed the stack; nesting is now refused while parsing.
TEST(SafetensorsCorrupt, DeeplyNestedHeader) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NE(
      parse_error(image(R"({"a":{"dtype":"U8","shape":)" + deep + R"(,"data_offsets":[0,0]}})", 0))
          .find("nests deeper than 8 levels"),
      std::string::npos);
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":)" + deep + "}}", 0))
                .find("nests deeper"),
            std::string::npos);
}

// Regression (fuzzing): a directory opens as a stream whose size reads as 2^63 - 1, and the
// reader tried to allocate that.
TEST_F(SafetensorsTest, DirectoryIsDataError) {
  const std::string e = [&] {
    try {
      read_safetensors(dir_.str());
    } catch (const DataError& e) {
      return std::string(e.what());
    }
    return std::string("<no DataError>");
  }();
  EXPECT_NE(e.find("is not a regular file"), std::string::npos) << e;
}

TEST(SafetensorsCorrupt, OffsetsOutOfRange) {
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12))
                .find("run past the 12-byte buffer"),
            std::string::npos);
}

TEST(SafetensorsCorrupt, OverlapGapAndTrailingBytes) {
  const std::string overlap =
      parse_error(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        12));
  EXPECT_NE(overlap.find("overlaps tensor 'a'"), std::string::npos) << overlap;
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8))
                .find("gap of 4 bytes"),
            std::string::npos);
  EXPECT_NE(parse_error(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9))
                .find("cover 4 bytes but the buffer after the header has 9"),
            std::string::npos);
}

TEST(SafetensorsCorrupt, TruncatedWrittenFile) {
  // A real file cut short at every length: an error, never a crash or a wrong success.
  const std::vector<float> v(10, 1.0f);
  const std::vector<SafetensorsTensor> t = {{"v", DType::kF32, Shape{10}, v.data()}};
  const SafetensorsLayout layout = safetensors_layout(t, {});
  std::vector<uint8_t> full = image(layout.header, 40);
  EXPECT_EQ(parse_error(full), "");
  for (size_t cut = 0; cut < full.size(); ++cut) {
    std::vector<uint8_t> part(full.begin(), full.begin() + cut);
    EXPECT_NE(parse_error(part), "") << "cut at " << cut;
  }
}

TEST(SafetensorsCorrupt, RandomByteChangesAreDataErrorsOrValid) {
  // Every corruption of a valid image either still parses consistently or is a DataError:
  // never another exception type, a crash or a read out of bounds (run under ASan in CI).
  const std::vector<float> a = {1, 2, 3, 4};
  const std::vector<int64_t> b = {7, 8};
  const std::vector<SafetensorsTensor> t = {{"a", DType::kF32, Shape{2, 2}, a.data()},
                                            {"b", DType::kI64, Shape{2}, b.data()}};
  const SafetensorsLayout layout = safetensors_layout(t, {{"k", "v"}});
  std::vector<uint8_t> good = image(layout.header, 32);
  std::memcpy(good.data() + 8 + layout.header.size(), b.data(), 16);
  std::memcpy(good.data() + 8 + layout.header.size() + 16, a.data(), 16);
  ASSERT_EQ(parse_error(good), "");
  uint64_t state = 12345;
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  const char kJsonish[] = "{}[]\",:0123456789-.e ";
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> bad = good;
    const int changes = 1 + static_cast<int>(next() % 3);
    for (int c = 0; c < changes; ++c) {
      const size_t at = next() % bad.size();
      bad[at] = next() % 2 ? static_cast<uint8_t>(next())
                           : static_cast<uint8_t>(kJsonish[next() % (sizeof(kJsonish) - 1)]);
    }
    if (next() % 4 == 0) bad.resize(next() % bad.size());
    try {
      const SafetensorsFile f = parse_safetensors(bad, "fuzz");
      uint64_t covered = 0;
      for (const auto& e : f.entries()) {
        EXPECT_EQ(e.bytes.size(), static_cast<size_t>(e.shape.numel()) * dtype_size(e.dtype));
        covered += e.bytes.size();
      }
      EXPECT_LE(covered, bad.size());
    } catch (const DataError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1000);
}

}  // namespace
}  // namespace ferry
