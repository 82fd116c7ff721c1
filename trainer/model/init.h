// Parameter initialisation: the rules PyTorch layers and torchvision models use, resolved to a
// concrete distribution when a layer is added, and drawn from counter-based randomness so a
// seed gives the same weights on every machine and backend.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace ferry {

// How a layer's weight or bias is initialised, before the layer's fans are known.
enum class InitRule {
  kTorchDefault,         // U(-1/sqrt(fan_in), 1/sqrt(fan_in)): nn.Conv2d / nn.Linear defaults
  kKaimingNormalFanOut,  // N(0, 2/fan_out): torchvision's ResNet and VGG convolutions
  kNormal001,            // N(0, 0.01^2): torchvision's VGG classifier
  kZeros,
  kOnes,
};

struct ParamInit {
  enum class Kind { kConstant, kUniform, kNormal };
  Kind kind = Kind::kConstant;
  float value = 0.0f;  // the constant, the uniform bound, or the normal std

  static ParamInit resolve(InitRule rule, int64_t fan_in, int64_t fan_out);
};

// Fills `out` from `init`, deterministically for `seed`.
void fill_param(const ParamInit& init, uint64_t seed, std::span<float> out);

// A 64-bit seed for a named tensor under a run seed (FNV-1a of the name, mixed with the seed).
uint64_t tensor_seed(uint64_t run_seed, std::string_view name);

}  // namespace ferry
