// Crop geometry (torchvision's rules, Python's round-half-even included) and PIL-style
// resampling (Note [PIL resampling]). Invariant: outputs match torchvision's PIL path.
#include "trainer/data/image_transform.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/counter_rng.h"

// Note [PIL resampling]
// Output pixel i of a pass covers input [center - support, center + support) with
// center = (i + 0.5) * scale, scale = in / out and support = max(scale, 1); tap x weighs
// triangle((x - center + 0.5) / max(scale, 1)), the weights are normalised, then rounded to
// 22-bit integers; sums start at 2^21 and are shifted down and clamped.

namespace ferry {

namespace {

constexpr int kPrecision = 22;
constexpr int kFlipDraw = 1000;  // draw index of the flip; crop tries use 0..39

// Uniform in [0, 1) with 53 bits.
double draw(uint64_t key, uint64_t index) {
  return static_cast<double>(counter_hash(key, index) >> 11) * (1.0 / 9007199254740992.0);
}

// Python's round(): halves to even.
int round_even(double v) { return static_cast<int>(std::nearbyint(v)); }

// Fixed-point taps of one pass over an input of `in_size` pixels to `out_size` pixels, for the
// outputs [first, first + count). Taps of output i: first_tap[i], taps[i] weights.
struct Taps {
  int ksize = 0;
  std::vector<int> first_tap, count;
  std::vector<int32_t> weights;  // count outputs x ksize
};

Taps make_taps(int in_size, int out_size, int first, int count) {
  Taps t;
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle's support (1) times the filter scale
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first_tap.resize(count);
  t.count.resize(count);
  t.weights.assign(static_cast<size_t>(count) * t.ksize, 0);
  std::vector<double> w(t.ksize);
  for (int i = 0; i < count; ++i) {
    const double center = (first + i + 0.5) * scale;
    int lo = static_cast<int>(center - support + 0.5);
    if (lo < 0) lo = 0;
    int hi = static_cast<int>(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    const int n = hi - lo;
    double total = 0;
    for (int x = 0; x < n; ++x) {
      const double d = std::abs((x + lo - center + 0.5) / filter_scale);
      w[x] = d < 1.0 ? 1.0 - d : 0.0;
      total += w[x];
    }
    int32_t* k = &t.weights[static_cast<size_t>(i) * t.ksize];
    for (int x = 0; x < n; ++x) {
      const double v = (total != 0.0 ? w[x] / total : w[x]) * (1 << kPrecision);
      k[x] = static_cast<int32_t>(v < 0 ? v - 0.5 : v + 0.5);
    }
    t.first_tap[i] = lo;
    t.count[i] = n;
  }
  return t;
}

inline uint8_t clip8(int32_t v) {
  v >>= kPrecision;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

}  // namespace

CropBox random_resized_crop_box(int width, int height, uint64_t key,
                                const RandomResizedCropOptions& o) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(o.ratio_min), log_hi = std::log(o.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const uint64_t base = static_cast<uint64_t>(attempt) * 4;
    const double target = area * (o.scale_min + (o.scale_max - o.scale_min) * draw(key, base));
    const double ratio = std::exp(log_lo + (log_hi - log_lo) * draw(key, base + 1));
    const int w = round_even(std::sqrt(target * ratio));
    const int h = round_even(std::sqrt(target / ratio));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      const int y = static_cast<int>(draw(key, base + 2) * (height - h + 1));
      const int x = static_cast<int>(draw(key, base + 3) * (width - w + 1));
      return CropBox{x, y, w, h};
    }
  }
  // Fallback: the central crop, clamped to the ratio range.
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < std::min(o.ratio_min, o.ratio_max)) {
    h = round_even(w / std::min(o.ratio_min, o.ratio_max));
  } else if (in_ratio > std::max(o.ratio_min, o.ratio_max)) {
    w = round_even(h * std::max(o.ratio_min, o.ratio_max));
  }
  return CropBox{(width - w) / 2, (height - h) / 2, w, h};
}

bool random_flip(uint64_t key) { return draw(key, kFlipDraw) < 0.5; }

std::pair<int, int> resized_size(int width, int height, int short_side) {
  const bool tall = width <= height;
  const int64_t lo = tall ? width : height, hi = tall ? height : width;
  const double longer = static_cast<double>(int64_t{short_side} * hi) / static_cast<double>(lo);
  if (short_side > kMaxResizedSide || !(longer <= static_cast<double>(kMaxResizedSide))) {
    throw DataError(fmt::format("resizing its {}x{} pixels to a short side of {} would make a "
                                "side of {:.0f} pixels, more than {}",
                                width, height, short_side, std::max<double>(longer, short_side),
                                kMaxResizedSide),
                    "lower data.resize, or set data.skip_bad=true to skip such images");
  }
  const int l = static_cast<int>(longer);
  return tall ? std::make_pair(short_side, l) : std::make_pair(l, short_side);
}

void resample(const RgbImage& src, CropBox box, int out_width, int out_height, CropBox window,
              uint8_t* out) {
  FERRY_ASSERT(box.x >= 0 && box.y >= 0 && box.width > 0 && box.height > 0 &&
                   box.x + box.width <= src.width && box.y + box.height <= src.height,
               "resample: box outside the image");
  FERRY_ASSERT(window.x >= 0 && window.y >= 0 && window.x + window.width <= out_width &&
                   window.y + window.height <= out_height,
               "resample: window outside the output");
  const size_t src_stride = static_cast<size_t>(src.width) * 3;
  const uint8_t* origin = src.pixels.data() + box.y * src_stride + static_cast<size_t>(box.x) * 3;
  const size_t out_stride = static_cast<size_t>(window.width) * 3;
  const bool horizontal = out_width != box.width;
  const bool vertical = out_height != box.height;

  // Input rows the vertical pass reads.
  Taps vt;
  int row_lo = window.y, row_hi = window.y + window.height;
  if (vertical) {
    vt = make_taps(box.height, out_height, window.y, window.height);
    row_lo = vt.first_tap.front();
    row_hi = vt.first_tap.back() + vt.count.back();
    for (int i = 0; i < window.height; ++i) {
      row_lo = std::min(row_lo, vt.first_tap[i]);
      row_hi = std::max(row_hi, vt.first_tap[i] + vt.count[i]);
    }
  }

  // Horizontal pass over those rows into an 8-bit intermediate (window.width wide).
  std::vector<uint8_t> tmp;
  const uint8_t* mid = nullptr;  // row r of the intermediate = input row row_lo + r
  size_t mid_stride = 0;
  if (horizontal) {
    const Taps ht = make_taps(box.width, out_width, window.x, window.width);
    tmp.resize(static_cast<size_t>(row_hi - row_lo) * out_stride);
    for (int r = row_lo; r < row_hi; ++r) {
      const uint8_t* in = origin + r * src_stride;
      uint8_t* o = tmp.data() + static_cast<size_t>(r - row_lo) * out_stride;
      for (int i = 0; i < window.width; ++i) {
        const int32_t* k = &ht.weights[static_cast<size_t>(i) * ht.ksize];
        const uint8_t* p = in + static_cast<size_t>(ht.first_tap[i]) * 3;
        int32_t s0 = 1 << (kPrecision - 1), s1 = s0, s2 = s0;
        for (int x = 0, n = ht.count[i]; x < n; ++x) {
          s0 += p[3 * x] * k[x];
          s1 += p[3 * x + 1] * k[x];
          s2 += p[3 * x + 2] * k[x];
        }
        o[3 * i] = clip8(s0);
        o[3 * i + 1] = clip8(s1);
        o[3 * i + 2] = clip8(s2);
      }
    }
    mid = tmp.data();
    mid_stride = out_stride;
  } else {
    mid = origin + static_cast<size_t>(row_lo) * src_stride + static_cast<size_t>(window.x) * 3;
    mid_stride = src_stride;
  }

  if (!vertical) {
    for (int y = 0; y < window.height; ++y) {
      std::copy_n(mid + static_cast<size_t>(y + window.y - row_lo) * mid_stride, out_stride,
                  out + y * out_stride);
    }
    return;
  }
  // Row by row: each tap adds a whole input row, which vectorises.
  std::vector<int32_t> acc(out_stride);
  for (int y = 0; y < window.height; ++y) {
    const int32_t* k = &vt.weights[static_cast<size_t>(y) * vt.ksize];
    const uint8_t* base = mid + static_cast<size_t>(vt.first_tap[y] - row_lo) * mid_stride;
    std::fill(acc.begin(), acc.end(), int32_t{1} << (kPrecision - 1));
    for (int t = 0, n = vt.count[y]; t < n; ++t) {
      const uint8_t* row = base + t * mid_stride;
      const int32_t w = k[t];
      int32_t* a = acc.data();
      for (size_t c = 0; c < out_stride; ++c) a[c] += row[c] * w;
    }
    uint8_t* o = out + y * out_stride;
    for (size_t c = 0; c < out_stride; ++c) o[c] = clip8(acc[c]);
  }
}

bool train_transform(const RgbImage& src, int crop_height, int crop_width, uint64_t key,
                     uint8_t* out) {
  const CropBox box = random_resized_crop_box(src.width, src.height, key);
  resample(src, box, crop_width, crop_height, CropBox{0, 0, crop_width, crop_height}, out);
  return random_flip(key);
}

void eval_transform(const RgbImage& src, int resize, int crop_height, int crop_width,
                    uint8_t* out) {
  const auto [rw, rh] = resized_size(src.width, src.height, resize);
  // Where the crop starts in the resized image; negative = zero padding (torchvision pads
  // (crop - size) // 2 before and the rest after, then crops the middle).
  const int top =
      rh >= crop_height ? round_even((rh - crop_height) / 2.0) : -((crop_height - rh) / 2);
  const int left =
      rw >= crop_width ? round_even((rw - crop_width) / 2.0) : -((crop_width - rw) / 2);
  const CropBox full{0, 0, src.width, src.height};
  if (top >= 0 && left >= 0) {
    resample(src, full, rw, rh, CropBox{left, top, crop_width, crop_height}, out);
    return;
  }
  std::fill_n(out, static_cast<size_t>(crop_height) * crop_width * 3, uint8_t{0});
  const CropBox window{std::max(left, 0), std::max(top, 0),
                       std::min(left + crop_width, rw) - std::max(left, 0),
                       std::min(top + crop_height, rh) - std::max(top, 0)};
  std::vector<uint8_t> part(static_cast<size_t>(window.width) * window.height * 3);
  resample(src, full, rw, rh, window, part.data());
  for (int y = 0; y < window.height; ++y) {
    std::copy_n(
        part.data() + static_cast<size_t>(y) * window.width * 3,
        static_cast<size_t>(window.width) * 3,
        out + (static_cast<size_t>(window.y - top + y) * crop_width + (window.x - left)) * 3);
  }
}

void hwc_to_chw(const uint8_t* hwc, int width, int height, bool flip, float* chw) {
  const size_t plane = static_cast<size_t>(width) * height;
  // v / 255.0f exactly, as torchvision's ToTensor divides.
  static const auto kLut = [] {
    std::array<float, 256> lut{};
    for (int v = 0; v < 256; ++v) lut[v] = static_cast<float>(v) / 255.0f;
    return lut;
  }();
  for (int y = 0; y < height; ++y) {
    const uint8_t* row = hwc + static_cast<size_t>(y) * width * 3;
    float* r = chw + static_cast<size_t>(y) * width;
    float* g = r + plane;
    float* b = g + plane;
    for (int x = 0; x < width; ++x) {
      const int sx = flip ? width - 1 - x : x;
      r[x] = kLut[row[3 * sx]];
      g[x] = kLut[row[3 * sx + 1]];
      b[x] = kLut[row[3 * sx + 2]];
    }
  }
}

}  // namespace ferry
