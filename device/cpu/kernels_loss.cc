// Softmax cross-entropy: one row per work item in double precision, the batch total summed in
// row order afterwards, so the loss does not depend on threads. Rows with a negative label
// (padding) add exactly nothing. In bf16 storage (logits, probs, dlogits) the same math reads
// and writes the bf16 values directly: the fp32 kernel's bits on the widened logits, rounded once.
#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "device/bf16.h"
#include "device/cpu/bf16_storage.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

// A negative label marks a row without one (kernels.h); a label >= k is an error.
void check_label(int32_t label, int64_t row, int64_t k, const char* what) {
  if (label >= k) {
    throw DataError(fmt::format("{}: label {} of row {} is outside [0, {})", what, label, row, k),
                    "check the dataset's labels against the model's class count");
  }
}

float widen(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// Note [Exponentials of bf16 logits]
// The fp32 loss spends most of its time in two double-precision std::exp calls per logit (the
// sum, then the probabilities): 2 x 103M calls for a GPT-2 LM head at 8 x 256 tokens. A bf16
// logit is one of at most 65536 bit patterns, and within one row every exponential is
// exp(double(z) - shift) for one shift (the row's max, then its log-sum-exp), so each is a
// function of z's bits: computed once per distinct pattern in the row (a few thousand in a
// 50257-wide row) and looked up for the rest. The same std::exp on the same arguments, in the
// same summation order: the bits of the fp32 kernel on the widened logits, not an approximation.
// The cache is per thread (1 MiB, reused by every call), stamped per (row, shift).
class Bf16ExpCache {
 public:
  Bf16ExpCache() : entries_(1 << 16) {}
  // Forgets every entry; later lookups use `shift`.
  void reset(double shift) {
    shift_ = shift;
    if (++stamp_ == 0) {  // wrapped: no entry may look current
      for (Entry& e : entries_) e.stamp = 0;
      stamp_ = 1;
    }
  }
  // std::exp(double(v) - shift) for the bf16 value v whose bits are `bits`.
  double operator()(uint16_t bits) {
    Entry& e = entries_[bits];
    if (e.stamp != stamp_) {
      e.value = std::exp(static_cast<double>(widen(bits)) - shift_);
      e.stamp = stamp_;
    }
    return e.value;
  }

 private:
  struct Entry {
    double value = 0.0;
    uint32_t stamp = 0;
  };
  std::vector<Entry> entries_;
  uint32_t stamp_ = 0;
  double shift_ = 0.0;
};

// One bf16 row of the forward: as the fp32 loop in run() below, on z's widened values.
void forward_row_bf16(const uint16_t* z, int64_t k, int32_t label, uint16_t* probs,
                      double* row_loss, uint8_t* row_correct) {
  thread_local Bf16ExpCache exp_of;
  int64_t argmax = 0;
  float best = widen(z[0]);
  for (int64_t j = 1; j < k; ++j) {
    const float v = widen(z[j]);
    if (v > best) {
      best = v;
      argmax = j;
    }
  }
  const double max = best;
  exp_of.reset(max);
  double sum = 0.0;
  for (int64_t j = 0; j < k; ++j) sum += exp_of(z[j]);
  const double lse = max + std::log(sum);
  if (probs != nullptr) {
    exp_of.reset(lse);
    for (int64_t j = 0; j < k; ++j) {
      probs[j] = float_to_bf16(static_cast<float>(exp_of(z[j]))).bits;
    }
  }
  *row_loss = label < 0 ? 0.0 : lse - static_cast<double>(widen(z[label]));
  *row_correct = label >= 0 && argmax == label ? 1 : 0;
}

// One bf16 row of the backward: the fp32 loop's float math on the widened probabilities.
FERRY_SIMD_CLONES void backward_row_bf16(const uint16_t* p, int64_t k, int32_t label, float factor,
                                         uint16_t* d) {
  for (int64_t j = 0; j < k; ++j) {
    const float v = (widen(p[j]) - (j == label ? 1.0f : 0.0f)) * factor;
    d[j] = float_to_bf16(v).bits;
  }
}

}  // namespace

void run(PlanCache&, const SoftmaxCrossEntropyForward& a) {
  check_softmax_cross_entropy(a.n, a.k, "softmax_cross_entropy_forward");
  const double divisor = loss_divisor(a.divisor, a.n, "softmax_cross_entropy_forward");
  std::vector<double> row_loss(a.n);
  std::vector<uint8_t> row_correct(a.n);
  std::vector<int64_t> bad_rows(a.n, -1);
  parallel_items(a.n, a.n * a.k * 8, [&](int64_t i) {
    const float* z = a.logits + i * a.k;
    const int32_t label = a.labels[i];
    if (label >= a.k) {
      bad_rows[i] = i;
      return;
    }
    if (a.dtype == DType::kBF16) {
      forward_row_bf16(bf16_bits(a.logits) + i * a.k, a.k, label,
                       a.probs ? bf16_bits(a.probs) + i * a.k : nullptr, &row_loss[i],
                       &row_correct[i]);
      return;
    }
    int64_t argmax = 0;
    for (int64_t j = 1; j < a.k; ++j) {
      if (z[j] > z[argmax]) argmax = j;
    }
    const double max = z[argmax];
    double sum = 0.0;
    for (int64_t j = 0; j < a.k; ++j) sum += std::exp(static_cast<double>(z[j]) - max);
    const double lse = max + std::log(sum);
    if (a.probs != nullptr) {
      float* p = a.probs + i * a.k;
      for (int64_t j = 0; j < a.k; ++j) p[j] = static_cast<float>(std::exp(z[j] - lse));
    }
    row_loss[i] = label < 0 ? 0.0 : lse - static_cast<double>(z[label]);
    row_correct[i] = label >= 0 && argmax == label ? 1 : 0;
  });
  for (int64_t i = 0; i < a.n; ++i) {
    if (bad_rows[i] >= 0) check_label(a.labels[i], i, a.k, "softmax_cross_entropy_forward");
  }
  double total = 0.0;
  int32_t correct = 0;
  for (int64_t i = 0; i < a.n; ++i) {
    total += row_loss[i];
    correct += row_correct[i];
  }
  a.loss[0] = static_cast<float>(total / divisor);
  if (a.correct != nullptr) a.correct[0] = correct;
}

void run(PlanCache&, const SoftmaxCrossEntropyBackward& a) {
  check_softmax_cross_entropy(a.n, a.k, "softmax_cross_entropy_backward");
  for (int64_t i = 0; i < a.n; ++i) {
    check_label(a.labels[i], i, a.k, "softmax_cross_entropy_backward");
  }
  const float factor =
      a.scale / static_cast<float>(loss_divisor(a.divisor, a.n, "softmax_cross_entropy_backward"));
  parallel_items(a.n, a.n * a.k, [&](int64_t i) {
    if (a.dtype == DType::kBF16) {
      uint16_t* d = bf16_bits(a.dlogits) + i * a.k;
      if (a.labels[i] < 0) {
        std::fill_n(d, a.k, uint16_t{0});
      } else {
        backward_row_bf16(bf16_bits(a.probs) + i * a.k, a.k, a.labels[i], factor, d);
      }
      return;
    }
    const float* p = a.probs + i * a.k;
    float* d = a.dlogits + i * a.k;
    if (a.labels[i] < 0) {
      for (int64_t j = 0; j < a.k; ++j) d[j] = 0.0f;
      return;
    }
    for (int64_t j = 0; j < a.k; ++j) d[j] = (p[j] - (j == a.labels[i] ? 1.0f : 0.0f)) * factor;
  });
}

}  // namespace ferry::cpu
