// Fuzzing the image decoders with deterministic mutations of valid JPEGs and PNGs (truncations,
// bit flips, byte overwrites, spliced headers) and random bytes: every input must give a whole
// image within the limits or one DataError naming the file — never a crash, a hang or another
// exception. Run under ASan/UBSan by the sanitizer harness (target image_decode_fuzz_test).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>

#include <gtest/gtest.h>

#include "common/error.h"
#include "device/counter_rng.h"
#include "tests/trainer/data/image_files.h"
#include "trainer/data/image_decode.h"

// The largest single C++ allocation since the last reset: a corrupt header must not make the
// decoder allocate for the pixels it claims (libjpeg's and libpng's own mallocs are bounded by
// the same checks, which run before they are asked to decode).
static std::atomic<size_t> g_largest_new{0};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"  // malloc/free pair up here
void* operator new(size_t n) {
  size_t seen = g_largest_new.load(std::memory_order_relaxed);
  while (n > seen && !g_largest_new.compare_exchange_weak(seen, n)) {
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace ferry {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::pattern;

constexpr int64_t kMaxPixels = int64_t{1} << 22;

std::vector<std::vector<uint8_t>> seeds() {
  std::vector<std::vector<uint8_t>> s;
  const int w = 37, h = 29;
  s.push_back(encode_jpeg(pattern(w, h, 3), w, h, TJPF_RGB, 90, TJSAMP_420));
  s.push_back(encode_jpeg(pattern(w, h, 3, 1), w, h, TJPF_RGB, 75, TJSAMP_444, true));
  s.push_back(encode_jpeg(pattern(w, h, 1, 2), w, h, TJPF_GRAY, 80));
  s.push_back(encode_jpeg(pattern(w, h, 4, 3), w, h, TJPF_CMYK, 85, TJSAMP_444));
  s.push_back(encode_png(pattern(w, h, 3), w, h, 8, PNG_COLOR_TYPE_RGB));
  s.push_back(encode_png(pattern(w, h, 4, 1), w, h, 8, PNG_COLOR_TYPE_RGBA, true));
  std::vector<uint8_t> rgb16;
  for (uint8_t v : pattern(w, h, 3, 2)) rgb16.insert(rgb16.end(), {v, v});
  s.push_back(encode_png(rgb16, w, h, 16, PNG_COLOR_TYPE_RGB));
  std::vector<png_color> palette(8);
  for (int i = 0; i < 8; ++i) palette[i] = png_color{uint8_t(i * 30), uint8_t(200 - i), uint8_t(i)};
  std::vector<uint8_t> indices(static_cast<size_t>(w) * h);
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<uint8_t>(i % 8);
  s.push_back(encode_png(indices, w, h, 8, PNG_COLOR_TYPE_PALETTE, false, palette));
  return s;
}

// Decodes `bytes`; fails the test unless the result is an image within the limits or one
// DataError naming the file.
void check_one(const std::vector<uint8_t>& bytes, const std::string& what) {
  DecodeLimits limits;
  limits.max_pixels = kMaxPixels;
  const auto start = std::chrono::steady_clock::now();
  g_largest_new = 0;
  try {
    const RgbImage im = decode_image(bytes.data(), bytes.size(), "fuzz.bin", limits);
    ASSERT_GE(im.width, 1) << what;
    ASSERT_GE(im.height, 1) << what;
    ASSERT_LE(int64_t{im.width} * im.height, kMaxPixels) << what;
    ASSERT_EQ(im.pixels.size(), size_t(im.width) * size_t(im.height) * 3) << what;
  } catch (const DataError& e) {
    ASSERT_NE(std::string(e.what()).find("cannot decode image 'fuzz.bin'"), std::string::npos)
        << what << ": " << e.what();
  } catch (const std::exception& e) {
    FAIL() << what << ": not a DataError: " << e.what();
  }
  // The decoded pixels (CMYK: 4 bytes each) are the largest buffer; nothing beyond the limit.
  ASSERT_LE(g_largest_new.load(), size_t{kMaxPixels} * 4 + (size_t{1} << 20)) << what;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_LT(seconds, 5.0) << what << " took " << seconds << " s to decode";
}

TEST(ImageDecodeFuzz, TheAllocationProbeSeesADecode) {
  const auto jpeg = encode_jpeg(pattern(300, 200, 3), 300, 200, TJPF_RGB);
  g_largest_new = 0;
  decode_image(jpeg.data(), jpeg.size(), "probe.jpg");
  EXPECT_GE(g_largest_new.load(), size_t{300} * 200 * 3);
}

TEST(ImageDecodeFuzz, TruncationsAtEveryLength) {
  for (const auto& seed : seeds()) {
    for (size_t n = 0; n < seed.size(); n += (n < 64 ? 1 : 7)) {
      check_one({seed.begin(), seed.begin() + n}, "truncated to " + std::to_string(n));
    }
  }
}

TEST(ImageDecodeFuzz, BitFlipsAndByteOverwrites) {
  const auto all = seeds();
  for (size_t s = 0; s < all.size(); ++s) {
    for (uint64_t trial = 0; trial < 2000; ++trial) {
      std::vector<uint8_t> m = all[s];
      const uint64_t key = counter_hash(s * 1000003 + 17, trial);
      const int edits = 1 + static_cast<int>(counter_hash(key, 0) % 8);
      for (int e = 0; e < edits; ++e) {
        const uint64_t r = counter_hash(key, 1 + static_cast<uint64_t>(e));
        // Bias half the edits to the headers, where sizes and tables live.
        const size_t span = (r & 1) ? std::min<size_t>(m.size(), 200) : m.size();
        const size_t at = static_cast<size_t>((r >> 8) % span);
        if ((r >> 1) & 1) {
          m[at] ^= static_cast<uint8_t>(1u << ((r >> 2) & 7));
        } else {
          m[at] = static_cast<uint8_t>(r >> 40);
        }
      }
      if (counter_hash(key, 99) % 4 == 0) m.resize(m.size() * (counter_hash(key, 98) % 100) / 100);
      check_one(m, "seed " + std::to_string(s) + " trial " + std::to_string(trial));
    }
  }
}

TEST(ImageDecodeFuzz, RandomBytesBehindValidSignatures) {
  const std::vector<std::vector<uint8_t>> heads = {
      {0xFF, 0xD8, 0xFF}, {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'}, {}};
  for (size_t h = 0; h < heads.size(); ++h) {
    for (uint64_t trial = 0; trial < 200; ++trial) {
      const uint64_t key = counter_hash(4242 + h, trial);
      std::vector<uint8_t> m = heads[h];
      const size_t n = counter_hash(key, 0) % 2048;
      for (size_t i = 0; i < n; ++i) m.push_back(static_cast<uint8_t>(counter_hash(key, i + 1)));
      check_one(m, "random " + std::to_string(h) + "/" + std::to_string(trial));
    }
  }
}

TEST(ImageDecodeFuzz, HeadersSplicedOntoOtherBodies) {
  const auto all = seeds();
  for (size_t a = 0; a < all.size(); ++a) {
    for (size_t b = 0; b < all.size(); ++b) {
      for (size_t cut : {size_t{20}, size_t{100}, size_t{300}}) {
        if (cut >= all[a].size() || cut >= all[b].size()) continue;
        std::vector<uint8_t> m(all[a].begin(), all[a].begin() + cut);
        m.insert(m.end(), all[b].begin() + cut, all[b].end());
        check_one(m, "splice " + std::to_string(a) + "+" + std::to_string(b));
      }
    }
  }
}

// Every mutated file is followed, on the same thread, by the good seeds: each must still decode
// to its own pixels (Note [One decompressor per thread, discarded after any error]).
TEST(ImageDecodeFuzz, GoodFilesStillDecodeAfterBadOnesOnTheSameThread) {
  const auto all = seeds();
  std::vector<std::vector<uint8_t>> expected;
  for (const auto& s : all) expected.push_back(decode_image(s.data(), s.size(), "seed").pixels);
  for (size_t s = 0; s < all.size(); ++s) {
    for (uint64_t trial = 0; trial < 150; ++trial) {
      std::vector<uint8_t> m = all[s];
      const uint64_t key = counter_hash(s * 7919 + 5, trial);
      const uint64_t r = counter_hash(key, 1);
      const size_t at = static_cast<size_t>(r % std::min<size_t>(m.size(), 300));
      m[at] = static_cast<uint8_t>(r >> 40);
      if (trial % 3 == 0) m.resize(m.size() * (counter_hash(key, 2) % 100) / 100);
      try {
        decode_image(m.data(), m.size(), "bad.bin");
      } catch (const DataError&) {
      }
      for (size_t g = 0; g < all.size(); ++g) {
        const RgbImage im = decode_image(all[g].data(), all[g].size(), "good.bin");
        ASSERT_EQ(im.pixels, expected[g])
            << "seed " << g << " after seed " << s << " trial " << trial;
      }
    }
  }
}

}  // namespace
}  // namespace ferry
