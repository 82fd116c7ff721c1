// Staging metrics into pinned chunks and draining them (Note [Metrics without a host wait]).
#include "trainer/exec/metrics_ring.h"

#include <algorithm>

namespace ferry {

MetricsRing::MetricsRing(Device& device, size_t steps) : device_(device) {
  const size_t chunks = (std::max<size_t>(steps, 1) + kChunk - 1) / kChunk;
  for (size_t i = 0; i < chunks; ++i) {
    chunks_.push_back(
        static_cast<StepMetrics*>(device.pinned().allocate(kChunk * sizeof(StepMetrics))));
  }
}

MetricsRing::~MetricsRing() {
  for (StepMetrics* chunk : chunks_)
    device_.pinned().deallocate(chunk, kChunk * sizeof(StepMetrics));
}

void MetricsRing::stage(uint64_t step, const float* loss, const int32_t* correct) {
  const size_t i = staged_steps_.size();
  if (i / kChunk == chunks_.size()) {
    chunks_.push_back(
        static_cast<StepMetrics*>(device_.pinned().allocate(kChunk * sizeof(StepMetrics))));
  }
  StepMetrics* entry = chunks_[i / kChunk] + i % kChunk;
  Stream& compute = device_.stream(StreamKind::kCompute);
  device_.copy_async(&entry->loss, loss, sizeof(float), compute);
  device_.copy_async(&entry->correct, correct, sizeof(int32_t), compute);
  staged_steps_.push_back(step);
}

std::vector<StagedMetrics> MetricsRing::drain() {
  device_.stream(StreamKind::kCompute).synchronize();
  std::vector<StagedMetrics> out;
  out.reserve(staged_steps_.size());
  for (size_t i = 0; i < staged_steps_.size(); ++i) {
    const StepMetrics& m = chunks_[i / kChunk][i % kChunk];
    out.push_back({staged_steps_[i], m.loss, m.correct});
  }
  staged_steps_.clear();
  return out;
}

}  // namespace ferry
