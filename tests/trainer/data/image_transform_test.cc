// Crop geometry against torchvision's rules and the resampler's invariants (identity, constant
// images, a window of the output equals the same part of the whole output).
#include "trainer/data/image_transform.h"

#include <cmath>

#include <gtest/gtest.h>

#include "tests/trainer/data/image_files.h"

namespace ferry {
namespace {

RgbImage make_image(int w, int h, int seed = 0) {
  RgbImage im;
  im.width = w;
  im.height = h;
  im.pixels = testing::pattern(w, h, 3, seed);
  return im;
}

TEST(ImageTransform, ResizedSizeFollowsTorchvision) {
  EXPECT_EQ(resized_size(500, 375, 256), std::make_pair(341, 256));
  EXPECT_EQ(resized_size(375, 500, 256), std::make_pair(256, 341));
  EXPECT_EQ(resized_size(300, 300, 256), std::make_pair(256, 256));
  EXPECT_EQ(resized_size(64, 300, 256), std::make_pair(256, 1200));
}

TEST(ImageTransform, RandomResizedCropStaysInRangeAndIsAFunctionOfTheKey) {
  int distinct = 0;
  CropBox last;
  for (uint64_t key = 0; key < 500; ++key) {
    const CropBox b = random_resized_crop_box(500, 375, key);
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.y, 0);
    ASSERT_LE(b.x + b.width, 500);
    ASSERT_LE(b.y + b.height, 375);
    const double area = static_cast<double>(b.width) * b.height / (500.0 * 375.0);
    EXPECT_GE(area, 0.08 * 0.9);
    EXPECT_LE(area, 1.0);
    const double ratio = static_cast<double>(b.width) / b.height;
    EXPECT_GE(ratio, 0.75 * 0.9);
    EXPECT_LE(ratio, 4.0 / 3.0 * 1.1);
    EXPECT_EQ(b, random_resized_crop_box(500, 375, key));
    distinct += !(b == last);
    last = b;
  }
  EXPECT_GT(distinct, 450);
  // A very wide image: no try fits, the fallback is the central crop of ratio 4/3.
  const CropBox f = random_resized_crop_box(1000, 6, 7);
  EXPECT_EQ(f, (CropBox{(1000 - 8) / 2, 0, 8, 6}));
}

TEST(ImageTransform, FlipDrawsAreBalanced) {
  int flips = 0;
  for (uint64_t key = 0; key < 2000; ++key) flips += random_flip(key);
  EXPECT_GT(flips, 900);
  EXPECT_LT(flips, 1100);
}

TEST(ImageTransform, ResampleKeepsIdentityAndConstants) {
  const RgbImage im = make_image(40, 30);
  std::vector<uint8_t> out(20 * 10 * 3);
  resample(im, CropBox{5, 7, 20, 10}, 20, 10, CropBox{0, 0, 20, 10}, out.data());
  for (int y = 0; y < 10; ++y) {
    for (int x = 0; x < 60; ++x) ASSERT_EQ(out[y * 60 + x], im.pixels[(y + 7) * 120 + 15 + x]);
  }
  RgbImage flat;
  flat.width = 37;
  flat.height = 23;
  flat.pixels.assign(37 * 23 * 3, 173);
  for (auto [ow, oh] : {std::pair{11, 7}, std::pair{80, 50}, std::pair{37, 5}}) {
    std::vector<uint8_t> o(static_cast<size_t>(ow) * oh * 3);
    resample(flat, CropBox{0, 0, 37, 23}, ow, oh, CropBox{0, 0, ow, oh}, o.data());
    for (uint8_t v : o) ASSERT_EQ(v, 173);
  }
}

TEST(ImageTransform, AWindowIsThatPartOfTheWholeOutput) {
  const RgbImage im = make_image(97, 61, 4);
  for (auto [ow, oh] : {std::pair{40, 30}, std::pair{150, 90}}) {
    std::vector<uint8_t> whole(static_cast<size_t>(ow) * oh * 3);
    resample(im, CropBox{3, 2, 90, 55}, ow, oh, CropBox{0, 0, ow, oh}, whole.data());
    const CropBox win{7, 5, ow / 2, oh / 3};
    std::vector<uint8_t> part(static_cast<size_t>(win.width) * win.height * 3);
    resample(im, CropBox{3, 2, 90, 55}, ow, oh, win, part.data());
    for (int y = 0; y < win.height; ++y) {
      for (int x = 0; x < win.width * 3; ++x) {
        ASSERT_EQ(part[y * win.width * 3 + x], whole[(y + win.y) * ow * 3 + win.x * 3 + x]);
      }
    }
  }
}

TEST(ImageTransform, EvalCropsTheCentreAndPadsSmallImagesWithZeros) {
  const RgbImage im = make_image(50, 40, 2);
  // Resize 40 (no change), crop 20x30: top round((40-20)/2) = 10, left round((50-30)/2) = 10.
  std::vector<uint8_t> out(20 * 30 * 3);
  eval_transform(im, 40, 20, 30, out.data());
  for (int y = 0; y < 20; ++y) {
    for (int x = 0; x < 90; ++x) ASSERT_EQ(out[y * 90 + x], im.pixels[(y + 10) * 150 + 30 + x]);
  }
  // Resize to 40 then crop 44x46: padded (44-40)//2 = 2 rows on top, (46-50<0: cropped) ...
  std::vector<uint8_t> pad(44 * 46 * 3);
  eval_transform(im, 40, 44, 46, pad.data());
  for (int x = 0; x < 46 * 3; ++x) EXPECT_EQ(pad[x], 0) << x;                // row 0
  for (int x = 0; x < 46 * 3; ++x) EXPECT_EQ(pad[43 * 46 * 3 + x], 0) << x;  // last row
  // Row 2 is image row 0, columns from round((50-46)/2) = 2.
  for (int x = 0; x < 46 * 3; ++x) ASSERT_EQ(pad[2 * 46 * 3 + x], im.pixels[6 + x]);
}

TEST(ImageTransform, ChwConversionScalesAndFlips) {
  const std::vector<uint8_t> hwc = {0, 255, 51, 102, 153, 204};  // 2x1
  std::vector<float> chw(6);
  hwc_to_chw(hwc.data(), 2, 1, false, chw.data());
  EXPECT_EQ(chw, (std::vector<float>{0.0f, 102 / 255.0f, 1.0f, 153 / 255.0f, 0.2f, 0.8f}));
  hwc_to_chw(hwc.data(), 2, 1, true, chw.data());
  EXPECT_EQ(chw, (std::vector<float>{102 / 255.0f, 0.0f, 153 / 255.0f, 1.0f, 0.8f, 0.2f}));
}

}  // namespace
}  // namespace ferry
