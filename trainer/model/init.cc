// Drawing initial parameters.
#include "trainer/model/init.h"

#include <cmath>

#include "device/counter_rng.h"

namespace ferry {

ParamInit ParamInit::resolve(InitRule rule, int64_t fan_in, int64_t fan_out) {
  switch (rule) {
    case InitRule::kTorchDefault:
      return {Kind::kUniform, 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(fan_in, 1)))};
    case InitRule::kKaimingNormalFanOut:
      return {Kind::kNormal, std::sqrt(2.0f / static_cast<float>(std::max<int64_t>(fan_out, 1)))};
    case InitRule::kNormal001:
      return {Kind::kNormal, 0.01f};
    case InitRule::kZeros:
      return {Kind::kConstant, 0.0f};
    case InitRule::kOnes:
      return {Kind::kConstant, 1.0f};
  }
  return {};
}

void fill_param(const ParamInit& init, uint64_t seed, std::span<float> out) {
  switch (init.kind) {
    case ParamInit::Kind::kConstant:
      for (float& v : out) v = init.value;
      return;
    case ParamInit::Kind::kUniform:
      for (size_t i = 0; i < out.size(); ++i) {
        out[i] = (2.0f * counter_uniform(seed, i) - 1.0f) * init.value;
      }
      return;
    case ParamInit::Kind::kNormal:
      // Box-Muller on two uniforms per element; u1 is kept away from 0.
      for (size_t i = 0; i < out.size(); ++i) {
        const double u1 = (counter_uniform(seed, 2 * i) + 0.5 / 16777216.0);
        const double u2 = counter_uniform(seed, 2 * i + 1);
        const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
        out[i] = static_cast<float>(z * init.value);
      }
      return;
  }
}

uint64_t tensor_seed(uint64_t run_seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return counter_hash(run_seed, h);
}

}  // namespace ferry
