// torchvision's ImageNet-recipe image transforms on RGB8 images (Note [ImageNet transforms]).
// Invariant: resampling is PIL's antialiased bilinear, so outputs match torchvision's PIL path
// (Note [PIL resampling] in image_transform.cc).
#pragma once

#include <cstdint>
#include <utility>

#include "trainer/data/image_decode.h"

// Note [ImageNet transforms]
// Training: RandomResizedCrop and a horizontal flip; evaluation: Resize(short side) + CenterCrop;
// then HWC uint8 -> CHW float in [0, 1]. PIL's antialiased bilinear is a triangle filter whose
// support grows with the downscale factor, with 22-bit fixed-point weights, a horizontal then a
// vertical pass through an 8-bit intermediate.

namespace ferry {

// A rectangle of an image, in pixels.
struct CropBox {
  int x = 0, y = 0, width = 0, height = 0;
  bool operator==(const CropBox&) const = default;
};

struct RandomResizedCropOptions {
  double scale_min = 0.08, scale_max = 1.0;             // of the image's area
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // width / height
};

// torchvision's RandomResizedCrop.get_params: up to 10 tries of a random area and log-uniform
// aspect ratio, then the central crop clamped to the ratio range. The random numbers are the
// counter-based stream of `key`, so the box is a pure function of (width, height, key).
CropBox random_resized_crop_box(int width, int height, uint64_t key,
                                const RandomResizedCropOptions& options = {});

// Whether the training flip (p = 0.5) mirrors the sample of `key`.
bool random_flip(uint64_t key);

// torchvision Resize(short_side)'s output (width, height): the shorter side becomes short_side,
// the longer int(short_side * long / short). DataError when a side would exceed
// kMaxResizedSide (a 1 x 10,000,000 image resized to 256: PIL could not allocate it either).
constexpr int64_t kMaxResizedSide = int64_t{1} << 20;
std::pair<int, int> resized_size(int width, int height, int short_side);

// Resamples `box` of `src` to out_width x out_height and writes the rectangle `window` of that
// result to `out` (window.height, window.width, 3). The window must lie inside the output.
void resample(const RgbImage& src, CropBox box, int out_width, int out_height, CropBox window,
              uint8_t* out);

// Training: RandomResizedCrop((crop_height, crop_width)) of the sample of `key` into `out`
// (crop_height, crop_width, 3); returns whether the flip draw says to mirror it.
bool train_transform(const RgbImage& src, int crop_height, int crop_width, uint64_t key,
                     uint8_t* out);

// Evaluation: Resize(resize) then CenterCrop((crop_height, crop_width)), zero-padded like
// torchvision when the resized image is smaller than the crop. out: (crop_height, crop_width, 3).
void eval_transform(const RgbImage& src, int resize, int crop_height, int crop_width, uint8_t* out);

// (H, W, 3) uint8 -> (3, H, W) float / 255, mirrored left-right when `flip`.
void hwc_to_chw(const uint8_t* hwc, int width, int height, bool flip, float* chw);

}  // namespace ferry
