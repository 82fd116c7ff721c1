// Softmax cross-entropy: one row per work item in double precision, the batch total summed in
// row order afterwards, so the loss does not depend on threads. Rows with a negative label
// (padding) add exactly nothing.
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
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
