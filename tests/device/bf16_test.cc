// device/bf16.h: bf16 <-> fp32 conversion (Note [Rounding to bf16]): round to nearest even with
// ties, NaN, infinities, overflow and subnormals, against PyTorch's values and, on a CPU with
// avx512_bf16, bitwise against the VCVTNEPS2BF16 instruction and oneDNN's f32 -> bf16 reorder.
#include "device/bf16.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#include <immintrin.h>
#include <oneapi/dnnl/dnnl.hpp>

namespace ferry {
namespace {

uint16_t rne(uint32_t bits) { return float_to_bf16(bits_float(bits)).bits; }
uint16_t daz(uint32_t bits) { return float_to_bf16_daz(bits_float(bits)).bits; }

TEST(Bf16, WideningIsExact) {
  EXPECT_EQ(bf16_to_float(BF16{0x3F80}), 1.0f);
  EXPECT_EQ(bf16_to_float(BF16{0xC010}), -2.25f);
  EXPECT_EQ(bf16_to_float(BF16{0x0001}), std::ldexp(1.0f, -133));  // smallest bf16 subnormal
  EXPECT_EQ(bf16_to_float(BF16{0x7F80}), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(bf16_to_float(BF16{0x7FC0})));
  EXPECT_EQ(float_bits(bf16_to_float(BF16{0x8000})), 0x80000000u);  // -0 stays -0
  // Every bf16 survives a round trip, both variants (subnormals excepted for daz).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const BF16 b{static_cast<uint16_t>(h)};
    const float f = bf16_to_float(b);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(float_to_bf16(f).bits, h) << std::hex << h;
    if ((h & 0x7F80) != 0) {
      ASSERT_EQ(float_to_bf16_daz(f).bits, h) << std::hex << h;
    }
  }
}

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(rne(0x3F808000u), 0x3F80);  // 1 + 2^-8: a tie, kept bit even -> down
  EXPECT_EQ(rne(0x3F818000u), 0x3F82);  // a tie with the kept bit odd -> up
  EXPECT_EQ(rne(0x3F808001u), 0x3F81);  // just above the tie -> up
  EXPECT_EQ(rne(0x3F807FFFu), 0x3F80);  // just below -> down
  EXPECT_EQ(rne(0xBF818000u), 0xBF82);  // negative ties alike
  EXPECT_EQ(rne(0x3FFF8000u), 0x4000);  // the carry runs into the exponent
  EXPECT_EQ(round_to_bf16(1.00390625f), 1.0f);
}

TEST(Bf16, InfinityOverflowAndNaN) {
  EXPECT_EQ(rne(0x7F800000u), 0x7F80);
  EXPECT_EQ(rne(0xFF800000u), 0xFF80);
  EXPECT_EQ(rne(0x7F7FFFFFu), 0x7F80);  // FLT_MAX rounds past the largest bf16: infinity
  EXPECT_EQ(rne(0x7F7F7FFFu), 0x7F7F);  // below the tie: the largest bf16
  EXPECT_EQ(rne(0x7F7F8000u), 0x7F80);  // the tie with an odd kept bit: infinity
  // NaN stays NaN, even when the payload is only in the dropped bits; sign and top payload kept.
  EXPECT_EQ(rne(0x7F800001u), 0x7FC0);
  EXPECT_EQ(rne(0x7FA00001u), 0x7FE0);
  EXPECT_EQ(rne(0xFFC12345u), 0xFFC1);
  EXPECT_EQ(rne(0x7FFFFFFFu), 0x7FFF);
  EXPECT_EQ(daz(0x7F800001u), 0x7FC0);
}

TEST(Bf16, Subnormals) {
  // PyTorch (torch 1.13, tensor.to(torch.bfloat16)) rounds fp32 subnormals to nearest even.
  EXPECT_EQ(rne(0x00000001u), 0x0000);
  EXPECT_EQ(rne(0x80400000u), 0x8040);
  EXPECT_EQ(rne(0x007FFFFFu), 0x0080);  // rounds up to the smallest normal
  EXPECT_EQ(rne(0x807F8000u), 0x8080);
  EXPECT_EQ(rne(0x0001FFFFu), 0x0002);
  EXPECT_EQ(rne(0x00018000u), 0x0002);  // a subnormal tie, kept bit odd -> up
  // VCVTNEPS2BF16 and oneDNN treat them as zeros of their sign.
  EXPECT_EQ(daz(0x80400000u), 0x8000);
  EXPECT_EQ(daz(0x007FFFFFu), 0x0000);
  EXPECT_EQ(daz(0x0001FFFFu), 0x0000);
  EXPECT_EQ(daz(0x00800000u), 0x0080);  // the smallest normal is not flushed
}

// Bit patterns over every exponent, ties and their neighbours included.
std::vector<uint32_t> sample_bits() {
  std::vector<uint32_t> out;
  uint64_t state = 12345;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (uint32_t low : {0x0000u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
        for (uint32_t kept : {0x00u, 0x01u, 0x7Fu}) {
          out.push_back(sign | (exponent << 23) | (kept << 16) | low);
        }
      }
      for (int i = 0; i < 64; ++i) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        out.push_back(sign | (exponent << 23) | static_cast<uint32_t>((state >> 33) & 0x7FFFFF));
      }
    }
  }
  while (out.size() % 16 != 0) out.push_back(0);
  return out;
}

__attribute__((target("avx512f,avx512bf16"))) void hardware_convert(const float* in, uint16_t* out,
                                                                    size_t n) {
  for (size_t i = 0; i < n; i += 16) {
    const __m256bh r = _mm512_cvtneps_pbh(_mm512_loadu_ps(in + i));
    std::memcpy(out + i, &r, 32);
  }
}

TEST(Bf16, DazEqualsTheInstructionAndOneDnn) {
  const std::vector<uint32_t> bits = sample_bits();
  std::vector<float> in(bits.size());
  std::memcpy(in.data(), bits.data(), bits.size() * 4);
  std::vector<uint16_t> reordered(bits.size());
  using dnnl::memory;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::dims dims{static_cast<memory::dim>(in.size())};
  memory src({dims, memory::data_type::f32, memory::format_tag::a}, engine, in.data());
  memory dst({dims, memory::data_type::bf16, memory::format_tag::a}, engine, reordered.data());
  dnnl::reorder(src, dst).execute(stream, src, dst);
  stream.wait();
  const bool has_instruction = __builtin_cpu_supports("avx512bf16");
  std::vector<uint16_t> hardware(bits.size());
  if (has_instruction) hardware_convert(in.data(), hardware.data(), in.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    // oneDNN without avx512_bf16 converts in software with the same rule (its bfloat16_t).
    ASSERT_EQ(daz(bits[i]), reordered[i]) << std::hex << bits[i];
    if (has_instruction) {
      ASSERT_EQ(daz(bits[i]), hardware[i]) << std::hex << bits[i];
    }
    // The two variants differ only on subnormal inputs.
    if ((bits[i] & 0x7F800000u) != 0) {
      ASSERT_EQ(rne(bits[i]), daz(bits[i])) << std::hex << bits[i];
    }
  }
  if (!has_instruction) GTEST_SKIP() << "no avx512_bf16 on this CPU: checked against oneDNN only";
}

}  // namespace
}  // namespace ferry
