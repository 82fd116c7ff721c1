// The host loops of comm.dtype bf16 (Note [A bf16 all-reduce] in bf16_wire.h): narrowing, the
// pairwise bf16 sum and the widened mean. Invariant: elementwise, the same bits on every rank.
#include "comm/bf16_wire.h"

#include "device/bf16.h"

namespace ferry {

void narrow_to_bf16(const float* x, uint16_t* w, int64_t n) {
  for (int64_t i = 0; i < n; ++i) w[i] = float_to_bf16(x[i]).bits;
}

void sum_bf16(const uint16_t* in, uint16_t* inout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    inout[i] = float_to_bf16(bf16_to_float(BF16{in[i]}) + bf16_to_float(BF16{inout[i]})).bits;
  }
}

void widen_mean(const uint16_t* w, float* x, int64_t n, int ranks) {
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(BF16{w[i]});
  divide_by_ranks(x, n, ranks);
}

void divide_by_ranks(float* x, int64_t n, int ranks) {
  if ((ranks & (ranks - 1)) == 0) {
    const float inverse = 1.0f / static_cast<float>(ranks);
    for (int64_t i = 0; i < n; ++i) x[i] *= inverse;
  } else {
    const auto r = static_cast<float>(ranks);
    for (int64_t i = 0; i < n; ++i) x[i] /= r;
  }
}

}  // namespace ferry
