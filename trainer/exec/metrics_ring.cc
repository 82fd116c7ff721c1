// Staging metrics into pinned chunks and draining them (Note [Metrics without a host wait]).
#include "trainer/exec/metrics_ring.h"

#include <algorithm>
#include <cmath>

namespace ferry {

MetricsRing::MetricsRing(Device& device, size_t steps) : device_(device) {
  const size_t chunks = (std::max<size_t>(steps, 1) + kChunk - 1) / kChunk;
  for (size_t i = 0; i < chunks; ++i) {
    chunks_.push_back(static_cast<Entry*>(device.pinned().allocate(kChunk * sizeof(Entry))));
  }
}

MetricsRing::~MetricsRing() {
  for (Entry* chunk : chunks_) device_.pinned().deallocate(chunk, kChunk * sizeof(Entry));
}

void MetricsRing::stage(uint64_t step, const float* loss, const int32_t* correct,
                        const float* grad_sq) {
  const size_t i = staged_steps_.size();
  if (i / kChunk == chunks_.size()) {
    chunks_.push_back(static_cast<Entry*>(device_.pinned().allocate(kChunk * sizeof(Entry))));
  }
  Entry* entry = chunks_[i / kChunk] + i % kChunk;
  Stream& compute = device_.stream(StreamKind::kCompute);
  device_.copy_async(&entry->metrics.loss, loss, sizeof(float), compute);
  device_.copy_async(&entry->metrics.correct, correct, sizeof(int32_t), compute);
  if (grad_sq) device_.copy_async(&entry->grad_sq, grad_sq, sizeof(float), compute);
  staged_steps_.push_back(step);
  staged_grad_sq_.push_back(grad_sq != nullptr);
}

std::vector<StagedMetrics> MetricsRing::drain() {
  device_.stream(StreamKind::kCompute).synchronize();
  std::vector<StagedMetrics> out;
  out.reserve(staged_steps_.size());
  for (size_t i = 0; i < staged_steps_.size(); ++i) {
    const Entry& e = chunks_[i / kChunk][i % kChunk];
    StagedMetrics m{staged_steps_[i], e.metrics.loss, e.metrics.correct, std::nullopt};
    if (staged_grad_sq_[i]) m.grad_norm = std::sqrt(e.grad_sq);
    out.push_back(m);
  }
  staged_steps_.clear();
  staged_grad_sq_.clear();
  return out;
}

}  // namespace ferry
