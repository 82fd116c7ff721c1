// Note [Reduce and update by shard] in model_state_step.h.
#include "trainer/optim/model_state_step.h"

#include <algorithm>

#include "common/error.h"

namespace ferry {

ModelStateStep::ModelStateStep(Communicator& comm, Device& device, ParameterStore& store,
                               Optimizer& optimizer, std::vector<GradSlice> slices,
                               BucketOptions buckets, const ModelStateStepOptions& options)
    : comm_(comm), device_(device), store_(store), optimizer_(optimizer), options_(options) {
  const int ranks = comm.ranks().size;
  shard_ = options_.shard ? store.layout().shard_floats : store.param_floats();
  if (options_.shard) {
    FERRY_ASSERT(shard_ > 0 && shard_ * ranks == store.param_floats(),
                 "a sharded store has ranks equal shards");
    buckets.reduce = [this](float* block, int64_t offset, int64_t count, Stream& after) {
      return reduce_range(block, offset, count, after);
    };
    buckets.overlap = buckets.overlap && options_.reduce_in_backward;
  }
  if (options_.host) {
    // Note [Host copies on the links]: each bucket's gradients go down as its reduction ends.
    FERRY_ASSERT(options_.transfers != nullptr, "the host optimizer's copies need an engine");
    buckets.reduce = [this, reduce = std::move(buckets.reduce)](float* block, int64_t offset,
                                                                int64_t count, Stream& after) {
      CommWork w = reduce ? reduce(block, offset, count, after)
                          : comm_.all_reduce_mean(block + offset, count, after);
      send_gradients(offset, count, w, after);
      return w;
    };
  }
  buckets_ = std::make_unique<GradientBuckets>(comm, device, store.grad_block(), std::move(slices),
                                               std::move(buckets));
}

CommWork ModelStateStep::reduce_range(float* block, int64_t offset, int64_t count, Stream& after) {
  const int ranks = comm_.ranks().size;
  std::vector<Communicator::Part> parts(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const int64_t b = std::clamp(r * shard_, offset, offset + count);
    const int64_t e = std::clamp((r + 1) * shard_, offset, offset + count);
    parts[static_cast<size_t>(r)] = {b, e - b};
  }
  ++reductions_;
  return comm_.reduce_scatter_mean(block, parts, after);
}

void ModelStateStep::reduce(Stream& compute) {
  reductions_ = 0;
  buckets_->finish(compute);
  if (!options_.shard) reductions_ = static_cast<int64_t>(buckets_->launched());
  if (options_.host) send_rest(compute);
}

// Note [Clipping after the all-reduce] in optimizer.cc, by shard: every rank's sum of squares of
// its part, all-reduced (mean, times the rank count: the sum), then each part scaled.
void ModelStateStep::clip(Stream& compute, bool on_device) {
  const OptimizerOptions& o = optimizer_.options();
  if (o.clip_norm <= 0) return;
  Kernels& k = device_.kernels();
  const int64_t begin = store_.update_begin(), n = store_.update_end() - begin;
  float* grad = store_.grad_block() + begin;
  k.launch(SumOfSquares{n, grad, store_.grad_sq_address()}, compute);
  const int ranks = comm_.ranks().size;
  if (options_.shard && ranks > 1) {
    comm_.all_reduce_mean(store_.grad_sq_address(), 1, compute).order_before(compute);
    k.launch(Scale{1, static_cast<float>(ranks), store_.grad_sq_address()}, compute);
  }
  if (on_device) k.launch(ClipByNorm{n, o.clip_norm, store_.grad_sq_address(), grad}, compute);
}

void ModelStateStep::update(float lr) {
  Stream& compute = device_.stream(StreamKind::kCompute);
  const int64_t begin = store_.update_begin(), end = store_.update_end();
  float* param = store_.param_block() + begin;
  const int slots = store_.optimizer_slots();
  if (options_.host) {
    host_update(compute, lr);  // model_state_host.cc
  } else {
    clip(compute);
    Optimizer::Range r{begin, end, param, store_.grad_block() + begin};
    for (int s = 0; s < slots && s < 2; ++s) r.state[s] = store_.optimizer_block(s);
    optimizer_.step_range(device_.kernels(), compute, store_, r, lr);
  }
  gathers_ = 0;
  if (!options_.shard) return;
  // Every rank's updated shard to every rank, in pieces of comm.bucket_mb per shard.
  const int ranks = comm_.ranks().size;
  const int64_t piece =
      std::max<int64_t>(1, static_cast<int64_t>(options_.bucket_bytes / sizeof(float)));
  std::vector<CommWork> works;
  for (int64_t at = 0; at < shard_; at += piece) {
    const int64_t count = std::min(piece, shard_ - at);
    std::vector<Communicator::Part> parts;
    for (int r = 0; r < ranks; ++r) parts.push_back({r * shard_ + at, count});
    works.push_back(comm_.all_gather(store_.param_block(), parts, compute));
    ++gathers_;
  }
  for (const CommWork& w : works) w.order_before(compute);
}

}  // namespace ferry
