// AdamW's per-step scalars (adamw_scalars.h), in double then rounded, as torch.optim computes
// them. Built with -ffp-contract=off (device/CMakeLists.txt) so no FMA changes a rounding.
#include "device/adamw_scalars.h"

#include <cmath>

#include "device/kernels.h"

namespace ferry {

AdamScalars adamw_scalars(const AdamWUpdate& a) {
  const double lr = a.lr, b1 = a.beta1, b2 = a.beta2;
  const double bias1 = 1.0 - std::pow(b1, static_cast<double>(a.step));
  const double bias2 = 1.0 - std::pow(b2, static_cast<double>(a.step));
  AdamScalars s;
  s.decay = static_cast<float>(1.0 - lr * static_cast<double>(a.weight_decay));
  s.beta1 = a.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - b1);
  s.beta2 = a.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - b2);
  s.bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  s.eps = a.eps;
  s.neg_step_size = static_cast<float>(-(lr / bias1));
  return s;
}

}  // namespace ferry
