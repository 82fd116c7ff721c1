// The synthetic image task: every sample is a pure function of (seed, index), generated on
// demand from counter-based random numbers, so any size and any resolution cost no memory.

// Note [Synthetic task]: class k of K is a sinusoidal grating with orientation pi*k/K (+- 0.3
// of the spacing between classes) and a period of 1/(2.5 + 1.25*(k mod 3)) of the
// image side (+-10%), under a wide Gaussian window at a jittered centre, on a random grey
// background, with a random phase, contrast and per-channel gain, plus triangular pixel noise.
// Neighbouring classes differ by a small rotation and a change of frequency, so a CNN has to
// learn oriented filters; colour and brightness carry no class information. Pixel statistics:
// mean 0.5, standard deviation 0.265 in every channel. Measured in torch (3x32x32, 10 classes,
// batch 32, SGD lr 0.01 momentum 0.9; tests/trainer/data/synthetic_learnable.py): a 3-conv CNN
// with BatchNorm averages 2.04 over steps 0-19, 1.18 over 20-39, 0.07 at step 200, 99.8%
// held-out accuracy. Without BatchNorm, un-normalised [0, 1] inputs give a plateau at 2.30
// for 60-100 steps (LeNet on 1x28x28 at lr 0.01 does not leave it in 200 steps); with
// mean 0.5 / std 0.25 normalisation the same LeNet falls below 0.2 by step 120.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/counter_rng.h"
#include "trainer/data/dataset.h"

namespace ferry {

namespace {

// Domain separation: the sample streams never coincide with other users of the same seed.
constexpr uint64_t kSampleDomain = 0x53796e7468657469ull;  // "Syntheti"
constexpr uint64_t kNoiseDomain = 0x4e6f697365536565ull;   // "NoiseSee"
constexpr float kNoiseStddev = 0.15f;

class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(const Shape& chw, int64_t classes, int64_t samples, uint64_t seed)
      : chw_(chw), classes_(classes), samples_(samples), seed_(seed) {}

  int64_t size() const override { return samples_; }
  Shape image_shape() const override { return chw_; }
  int64_t classes() const override { return classes_; }
  std::string describe() const override {
    return fmt::format("synthetic seed {} ({} x {}, {} classes)", seed_, samples_, chw_.str(),
                       classes_);
  }

  int32_t get(int64_t index, float* pixels) const override {
    return generate(index, chw_[1], chw_[2], pixels);
  }

  // Any side: the same sample (its class, orientation, position and contrast are relative to
  // the side) drawn at another resolution.
  int64_t max_side() const override { return kMaxScaleSide; }
  void read_at(int64_t index, int64_t epoch, int64_t side, float* pixels,
               int32_t* labels) const override {
    (void)epoch;
    labels[0] = generate(index, side, side, pixels);
  }

 private:
  int32_t generate(int64_t index, int64_t height, int64_t width, float* pixels) const {
    FERRY_ASSERT(index >= 0 && index < samples_, "synthetic sample index out of range");
    const int64_t channels = chw_[0];
    const uint64_t key = counter_hash(seed_ ^ kSampleDomain, static_cast<uint64_t>(index));
    const int64_t label = static_cast<int64_t>(counter_hash(key, 0) % uint64_t(classes_));
    auto u = [&](uint64_t j) { return static_cast<double>(counter_uniform(key, 1 + j)); };

    constexpr double kPi = std::numbers::pi;
    const double side = static_cast<double>(std::min(height, width));
    const double theta = kPi * label / classes_ + (u(0) - 0.5) * 0.6 * kPi / classes_;
    const double period = std::max(2.5, side / (2.5 + 1.25 * (label % 3)) * (0.9 + 0.2 * u(1)));
    const double phase = 2 * kPi * u(2);
    const double cx = (0.5 + 0.3 * (u(3) - 0.5)) * width;
    const double cy = (0.5 + 0.3 * (u(4) - 0.5)) * height;
    const double sigma = (0.6 + 0.1 * u(5)) * side;
    const double contrast = 0.7 + 0.3 * u(6);
    const double background = 0.5 + 0.3 * (u(7) - 0.5);
    const double kx = 2 * kPi / period * std::cos(theta);
    const double ky = 2 * kPi / period * std::sin(theta);

    // Separable window and wave: sin(kx*dx + ky*dy + phase) =
    // sin(kx*dx) cos(ky*dy + phase) + cos(kx*dx) sin(ky*dy + phase).
    std::vector<float> ex(width), sx(width), cxs(width), ey(height), sy(height), cy_(height);
    for (int64_t x = 0; x < width; ++x) {
      const double dx = x + 0.5 - cx;
      ex[x] = static_cast<float>(std::exp(-dx * dx / (2 * sigma * sigma)));
      sx[x] = static_cast<float>(std::sin(kx * dx));
      cxs[x] = static_cast<float>(std::cos(kx * dx));
    }
    for (int64_t y = 0; y < height; ++y) {
      const double dy = y + 0.5 - cy;
      ey[y] = static_cast<float>(std::exp(-dy * dy / (2 * sigma * sigma)));
      sy[y] = static_cast<float>(std::sin(ky * dy + phase));
      cy_[y] = static_cast<float>(std::cos(ky * dy + phase));
    }

    const uint64_t noise_key = key ^ kNoiseDomain;
    const float noise_scale = kNoiseStddev * std::sqrt(6.0f);  // n1 + n2 - 1 has variance 1/6
    for (int64_t c = 0; c < channels; ++c) {
      const float amplitude = static_cast<float>(0.5 * contrast * (0.7 + 0.3 * u(8 + c)));
      const float bg = static_cast<float>(background);
      float* plane = pixels + c * height * width;
      for (int64_t y = 0; y < height; ++y) {
        float* row = plane + y * width;
        const uint64_t base = static_cast<uint64_t>((c * height + y) * width);
        for (int64_t x = 0; x < width; ++x) {
          const float wave = sx[x] * cy_[y] + cxs[x] * sy[y];
          const uint64_t h = counter_hash(noise_key, base + x);
          const float n1 = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
          const float n2 = static_cast<float>((h >> 16) & 0xffffff) * (1.0f / 16777216.0f);
          const float v = bg + amplitude * ex[x] * ey[y] * wave + (n1 + n2 - 1.0f) * noise_scale;
          row[x] = std::clamp(v, 0.0f, 1.0f);
        }
      }
    }
    return static_cast<int32_t>(label);
  }

  Shape chw_;
  int64_t classes_;
  int64_t samples_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<Dataset> make_synthetic_dataset(const Shape& chw, int64_t classes, int64_t samples,
                                                uint64_t seed) {
  if (chw.rank() != 3 || chw[0] < 1 || chw[1] < 1 || chw[2] < 1) {
    throw ConfigError(fmt::format("synthetic data needs an input shape [C, H, W] of positive "
                                  "sizes, got {}",
                                  chw.str()),
                      "set model.input, e.g. [3, 32, 32]");
  }
  if (classes < 1 || classes > INT32_MAX) {
    throw ConfigError(fmt::format("synthetic data needs at least 1 class, got {}", classes),
                      "set model.classes, e.g. 10");
  }
  if (samples < 1) {
    throw ConfigError(fmt::format("synthetic data needs at least 1 sample, got {}", samples),
                      "set the number of synthetic samples, e.g. 50000");
  }
  return std::make_unique<SyntheticDataset>(chw, classes, samples, seed);
}

}  // namespace ferry
