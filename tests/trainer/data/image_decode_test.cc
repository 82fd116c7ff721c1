// The JPEG and PNG decoders: every colour layout becomes the RGB8 PIL's convert("RGB") gives,
// and truncated, corrupt or absurd files are one DataError naming the file.
#include "trainer/data/image_decode.h"

#include <cmath>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/trainer/data/image_files.h"
#include "tests/trainer/data/test_files.h"

namespace ferry {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::error_of;
using testing::jpeg_claiming;
using testing::pattern;

double mean_abs_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  double sum = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) sum += std::abs(a[i] - b[i]);
  return sum / static_cast<double>(std::max<size_t>(a.size(), 1));
}

RgbImage decode(const std::vector<uint8_t>& bytes, const std::string& name = "test.img") {
  return decode_image(bytes.data(), bytes.size(), name);
}

TEST(ImageDecode, ColourJpegDecodesToItsPixels) {
  const auto rgb = pattern(61, 37, 3);
  const RgbImage im = decode(encode_jpeg(rgb, 61, 37, TJPF_RGB, 100, TJSAMP_444));
  EXPECT_EQ(im.width, 61);
  EXPECT_EQ(im.height, 37);
  EXPECT_LT(mean_abs_diff(im.pixels, rgb), 2.0);
  // Progressive coding reorders the same coefficients: the same pixels as baseline.
  const RgbImage p = decode(encode_jpeg(rgb, 61, 37, TJPF_RGB, 95, TJSAMP_420, true));
  const RgbImage b = decode(encode_jpeg(rgb, 61, 37, TJPF_RGB, 95, TJSAMP_420, false));
  EXPECT_EQ(p.width, 61);
  EXPECT_EQ(p.pixels, b.pixels);
  EXPECT_LT(mean_abs_diff(p.pixels, rgb), 40.0);
}

TEST(ImageDecode, GreyJpegIsReplicatedToRgb) {
  const auto grey = pattern(40, 30, 1);
  const RgbImage im = decode(encode_jpeg(grey, 40, 30, TJPF_GRAY, 100));
  ASSERT_EQ(im.pixels.size(), 40u * 30 * 3);
  std::vector<uint8_t> expected;
  for (uint8_t g : grey) expected.insert(expected.end(), {g, g, g});
  EXPECT_LT(mean_abs_diff(im.pixels, expected), 2.0);
  for (size_t i = 0; i < im.pixels.size(); i += 3) {
    ASSERT_EQ(im.pixels[i], im.pixels[i + 1]);
    ASSERT_EQ(im.pixels[i], im.pixels[i + 2]);
  }
}

TEST(ImageDecode, CmykJpegConvertsAsPilDoes) {
  // The stored (Adobe, inverted) values c', m', y', k'; PIL: R = k' * c' / 255 (rounded).
  const int w = 32, h = 24;
  auto cmyk = pattern(w, h, 4, 3);
  const RgbImage im = decode(encode_jpeg(cmyk, w, h, TJPF_CMYK, 100, TJSAMP_444));
  ASSERT_EQ(im.width, w);
  std::vector<uint8_t> expected;
  for (size_t i = 0; i < cmyk.size(); i += 4) {
    for (int c = 0; c < 3; ++c) {
      expected.push_back(static_cast<uint8_t>(std::lround(cmyk[i + c] * cmyk[i + 3] / 255.0)));
    }
  }
  EXPECT_LT(mean_abs_diff(im.pixels, expected), 3.0);
}

TEST(ImageDecode, PngLayoutsBecomeRgb8) {
  const int w = 13, h = 9;
  // RGB8: exact.
  const auto rgb = pattern(w, h, 3);
  EXPECT_EQ(decode(encode_png(rgb, w, h, 8, PNG_COLOR_TYPE_RGB)).pixels, rgb);
  // Interlaced RGB8: exact.
  EXPECT_EQ(decode(encode_png(rgb, w, h, 8, PNG_COLOR_TYPE_RGB, true)).pixels, rgb);
  // RGBA: the alpha is dropped, not composited.
  const auto rgba = pattern(w, h, 4, 1);
  std::vector<uint8_t> no_alpha;
  for (size_t i = 0; i < rgba.size(); i += 4)
    no_alpha.insert(no_alpha.end(), {rgba[i], rgba[i + 1], rgba[i + 2]});
  EXPECT_EQ(decode(encode_png(rgba, w, h, 8, PNG_COLOR_TYPE_RGBA)).pixels, no_alpha);
  // Grey and grey + alpha: replicated.
  const auto grey = pattern(w, h, 1, 2);
  std::vector<uint8_t> grey_rgb;
  for (uint8_t g : grey) grey_rgb.insert(grey_rgb.end(), {g, g, g});
  EXPECT_EQ(decode(encode_png(grey, w, h, 8, PNG_COLOR_TYPE_GRAY)).pixels, grey_rgb);
  std::vector<uint8_t> grey_alpha;
  for (uint8_t g : grey) grey_alpha.insert(grey_alpha.end(), {g, 77});
  EXPECT_EQ(decode(encode_png(grey_alpha, w, h, 8, PNG_COLOR_TYPE_GRAY_ALPHA)).pixels, grey_rgb);
  // 16-bit RGB and grey: the high byte.
  std::vector<uint8_t> rgb16;
  for (uint8_t v : rgb) rgb16.insert(rgb16.end(), {v, static_cast<uint8_t>(255 - v)});
  EXPECT_EQ(decode(encode_png(rgb16, w, h, 16, PNG_COLOR_TYPE_RGB)).pixels, rgb);
  std::vector<uint8_t> grey16;
  for (uint8_t g : grey) grey16.insert(grey16.end(), {g, 0x5a});
  EXPECT_EQ(decode(encode_png(grey16, w, h, 16, PNG_COLOR_TYPE_GRAY)).pixels, grey_rgb);
  // Palette: looked up.
  std::vector<png_color> palette;
  for (int i = 0; i < 16; ++i) {
    palette.push_back(png_color{static_cast<png_byte>(i * 16), static_cast<png_byte>(255 - i * 9),
                                static_cast<png_byte>(i * i)});
  }
  std::vector<uint8_t> indices, expected;
  for (int i = 0; i < w * h; ++i) {
    const int k = (i * 7) % 16;
    indices.push_back(static_cast<uint8_t>(k));
    expected.insert(expected.end(), {palette[k].red, palette[k].green, palette[k].blue});
  }
  EXPECT_EQ(decode(encode_png(indices, w, h, 8, PNG_COLOR_TYPE_PALETTE, false, palette)).pixels,
            expected);
  // 1-bit grey: 0 and 255.
  std::vector<uint8_t> bits(static_cast<size_t>((w + 7) / 8) * h, 0);
  std::vector<uint8_t> bits_rgb;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const bool on = (x + y) % 3 == 0;
      if (on) bits[y * ((w + 7) / 8) + x / 8] |= static_cast<uint8_t>(0x80 >> (x % 8));
      const uint8_t v = on ? 255 : 0;
      bits_rgb.insert(bits_rgb.end(), {v, v, v});
    }
  }
  EXPECT_EQ(decode(encode_png(bits, w, h, 1, PNG_COLOR_TYPE_GRAY)).pixels, bits_rgb);
}

TEST(ImageDecode, TruncatedFilesAreOneErrorNamingTheFile) {
  const auto jpeg = encode_jpeg(pattern(64, 48, 3), 64, 48, TJPF_RGB);
  for (size_t keep : {jpeg.size() - 2, jpeg.size() / 2, size_t{300}, size_t{20}, size_t{3}}) {
    const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + keep);
    const std::string e = error_of<DataError>([&] { decode(cut, "cut.jpg"); });
    EXPECT_NE(e.find("cannot decode image 'cut.jpg'"), std::string::npos) << keep << ": " << e;
  }
  const std::string e = error_of<DataError>([&] {
    decode({jpeg.begin(), jpeg.begin() + jpeg.size() / 2}, "cut.jpg");
  });
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  const auto png = encode_png(pattern(64, 48, 3), 64, 48, 8, PNG_COLOR_TYPE_RGB);
  for (size_t keep : {png.size() - 4, png.size() / 2, size_t{40}, size_t{9}}) {
    const std::vector<uint8_t> cut(png.begin(), png.begin() + keep);
    const std::string pe = error_of<DataError>([&] { decode(cut, "cut.png"); });
    EXPECT_NE(pe.find("cannot decode image 'cut.png'"), std::string::npos) << keep << ": " << pe;
  }
}

TEST(ImageDecode, UnknownAndEmptyFilesAreRejected) {
  EXPECT_NE(error_of<DataError>([] { decode({}, "e.jpg"); }).find("'e.jpg': the file is empty"),
            std::string::npos);
  EXPECT_NE(error_of<DataError>([] {
              decode({'G', 'I', 'F', '8', '9', 'a', 0, 0}, "x.png");
            }).find("neither a JPEG nor a PNG"),
            std::string::npos);
}

// Note [One decompressor per thread, discarded after any error]: a bad JPEG must not make the
// thread's next good one fail ("two SOI markers" after a 65535-pixel-wide header, "truncated"
// after a file cut after its headers).
TEST(ImageDecode, ABadJpegDoesNotPoisonTheNextGoodOneOnItsThread) {
  const auto good = encode_jpeg(pattern(48, 40, 3), 48, 40, TJPF_RGB);
  const RgbImage expected = decode(good);
  const auto wide = jpeg_claiming(1, 65535);
  size_t sos = 0;
  for (size_t i = 2; i + 1 < good.size() && sos == 0; ++i) {
    if (good[i] == 0xFF && good[i + 1] == 0xDA) sos = i;
  }
  ASSERT_GT(sos, 0u);
  const std::vector<uint8_t> headers_only(good.begin(), good.begin() + sos + 20);
  for (const auto* bad : {&wide, &headers_only}) {
    EXPECT_FALSE(error_of<DataError>([&] { decode(*bad, "bad.jpg"); }).empty());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(decode(good, "good.jpg").pixels, expected.pixels) << i;
  }
}

TEST(ImageDecode, AbsurdDimensionsAreRefusedBeforeAllocating) {
  // A JPEG whose frame header claims 65000 x 65000 pixels in a few hundred bytes.
  auto jpeg = encode_jpeg(pattern(16, 16, 3), 16, 16, TJPF_RGB);
  bool patched = false;
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 5] = 0xFD, jpeg[i + 6] = 0xE8, jpeg[i + 7] = 0xFD, jpeg[i + 8] = 0xE8;
      patched = true;
      break;
    }
  }
  ASSERT_TRUE(patched);
  EXPECT_NE(error_of<DataError>([&] { decode(jpeg, "big.jpg"); }).find("65000x65000"),
            std::string::npos);
  // The hard pixel limit.
  const auto png = encode_png(pattern(64, 48, 3), 64, 48, 8, PNG_COLOR_TYPE_RGB);
  DecodeLimits limits;
  limits.max_pixels = 1000;
  EXPECT_NE(error_of<DataError>([&] {
              decode_image(png.data(), png.size(), "p.png", limits);
            }).find("more than the limit of 1000 pixels"),
            std::string::npos);
}

}  // namespace
}  // namespace ferry
