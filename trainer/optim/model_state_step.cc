// Note [Reduce and update by shard] in model_state_step.h.
#include "trainer/optim/model_state_step.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "device/kernels.h"

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
      return store_.staged() ? reduce_staged(offset, count, after)
                             : reduce_range(block, offset, count, after);
    };
    buckets.overlap = buckets.overlap && options_.reduce_in_backward;
  }
  // Pieces in elements of the layout: comm.bucket_mb of fp32, or under sharded masters of the
  // bf16 working copy (an even count: two elements a float on the wire).
  const auto bucket = static_cast<int64_t>(options_.bucket_bytes);
  pieces_ = {shard_,
             store.split_masters()
                 ? std::max<int64_t>(2, bucket / 2) / 2 * 2
                 : std::max<int64_t>(1, bucket / static_cast<int64_t>(sizeof(float))),
             ranks};
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
  FERRY_ASSERT(!store.staged() || (options_.shard && buckets.overlap),
               "staged gradients need zero 2's reduce-scatter during backward");
  buckets_ = std::make_unique<GradientBuckets>(
      comm, device, store.staged() ? reinterpret_cast<float*>(store.staging()) : store.grad_block(),
      std::move(slices), std::move(buckets));
  if (store.staged()) {
    const auto& all = buckets_->buckets();
    for (size_t b = 0; b < all.size(); ++b) {
      copied_.push_back(device.create_event());
      for (size_t r = 0; r < all[b].ranges.size(); ++r) {
        range_at_[static_cast<int64_t>(all[b].ranges[r].offset / sizeof(float))] = {b, r};
      }
    }
    launched_.assign(all.size(), 0);
  }
}

// Note [Gradients through a staging ring] in gradient_staging.h.
const ModelStateStep::Staged& ModelStateStep::staged_for(const Program& program) {
  auto it = plans_.find(&program);
  if (it != plans_.end() && it->second.origin == program.plan.origin) return it->second;
  if (it != plans_.end()) plans_.erase(it);
  const GradientBuckets& b = *buckets_;
  std::vector<size_t> bucket_of(store_.params().size());
  std::vector<GradSlice> slices;
  for (size_t p = 0; p < bucket_of.size(); ++p) {
    bucket_of[p] = b.bucket_of(p);
    const auto& e = store_.params()[p];
    slices.push_back({e.offset, (e.desc.bytes() + 63) / 64 * 64});
  }
  StagingInputs in;
  in.buckets = b.buckets();
  in.bucket_of = bucket_of;
  in.slices = slices;
  in.touched = program.grads_touched;
  in.written = program.grads_written;
  in.overlap = b.options().overlap;
  in.capacity = store_.staging_bytes();
  in.slot_bytes = store_.staging_slot_bytes();
  Staged staged{plan_staging(in), store_.staging(), program.plan.origin};
  if (staged.plan.bytes > store_.staging_bytes()) {
    // The layout does not fit the planned area: an area of its own, past the plan.
    fmt::print(stderr,
               "memory.zero 2: this backward needs {} of gradient staging, more than the {} "
               "planned; the measured peak will exceed the plan (Note [Gradients through a staging "
               "ring])\n",
               format_bytes(staged.plan.bytes), format_bytes(store_.staging_bytes()));
    grown_.emplace_back(device_.memory(), staged.plan.bytes, "gradient staging (grown)");
    staged.base = grown_.back().as<std::byte>();
    std::vector<std::byte> zeros(staged.plan.bytes);
    Stream& compute = device_.stream(StreamKind::kCompute);
    device_.copy_async(staged.base, zeros.data(), zeros.size(), compute);
    compute.synchronize();
  }
  return plans_.emplace(&program, std::move(staged)).first->second;
}

void ModelStateStep::begin_backward(bool first, bool last) {
  first_micro_ = first;
  last_micro_ = last;
  if (first) reductions_ = 0;
  std::fill(launched_.begin(), launched_.end(), 0);
  plan_ = nullptr;
}

// Note [Parameters gathered for the next forward] in gather_order.h.
const ModelStateStep::Gathers& ModelStateStep::gathers_for(const Program& program) {
  auto it = gather_plans_.find(&program);
  if (it != gather_plans_.end() && it->second.origin == program.plan.origin) return it->second;
  if (it != gather_plans_.end()) gather_plans_.erase(it);
  const auto& steps = program.plan.tape.steps;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> reads(steps.size());
  std::vector<char> reads_fp32(steps.size(), 0);  // Note [Sharded master weights]
  for (size_t s = 0; s < steps.size(); ++s) {
    if (steps[s].phase != StepPhase::kForward && steps[s].phase != StepPhase::kRecompute) continue;
    for (int slot : program.lowered.bindings[program.plan.origin[s]].params) {
      const int32_t p = program.param_index[persistent_id(slot)];
      if (p < 0) continue;
      const auto& e = store_.params()[static_cast<size_t>(p)];
      const auto begin = static_cast<int64_t>(e.offset / sizeof(float));
      reads[s].emplace_back(begin, begin + e.desc.shape.numel());
      if (store_.split_masters() && store_.reads_fp32(static_cast<size_t>(p))) reads_fp32[s] = 1;
    }
  }
  Gathers g;
  g.read = pieces_read(pieces_, reads);
  g.order = ferry::gather_order(pieces_.count(), g.read);
  // Note [Host copies on the links]: unsharded, compute waits for the weight pieces themselves.
  if (options_.host && !options_.shard) {
    up_pieces();
    g.uploads = pieces_read(up_bounds_, reads);
  }
  // Note [Sharded master weights]: a step reading an fp32 weight waits for the fp32 gather
  // (index pieces_.count(), issued first).
  for (size_t s = 0; s < steps.size(); ++s)
    if (reads_fp32[s]) g.read[s].push_back(pieces_.count());
  g.origin = program.plan.origin;
  return gather_plans_.emplace(&program, std::move(g)).first->second;
}

void ModelStateStep::settle(Stream& compute) {
  for (size_t k = 0; k < waiting_.size(); ++k) {
    if (waiting_[k]) gathering_[k].order_before(compute);
    waiting_[k] = 0;
  }
  for (size_t k = 0; k < uploading_.size(); ++k) wait_upload(k, compute, -1);
}

void ModelStateStep::before_step(const Program& program, int step) {
  last_program_ = &program;
  if (std::find(waiting_.begin(), waiting_.end(), 1) != waiting_.end() ||
      std::find(uploading_.begin(), uploading_.end(), 1) != uploading_.end()) {
    Stream& compute = device_.stream(StreamKind::kCompute);
    const StepPhase phase = program.plan.tape.steps[static_cast<size_t>(step)].phase;
    if (phase == StepPhase::kForward || phase == StepPhase::kRecompute) {
      const Gathers& g = gathers_for(program);
      for (size_t k : g.read[static_cast<size_t>(step)]) {
        if (k >= waiting_.size()) break;  // no gather (unsharded)
        if (waiting_[k]) gathering_[k].order_before(compute);
        waiting_[k] = 0;
      }
      if (!g.uploads.empty())
        for (size_t k : g.uploads[static_cast<size_t>(step)]) wait_upload(k, compute, step);
    } else if (phase != StepPhase::kLoad) {
      settle(compute);
    }
  }
  if (!store_.staged()) return;
  if (plan_ == nullptr) plan_ = &staged_for(program);
  Stream& compute = device_.stream(StreamKind::kCompute);
  for (size_t b : plan_->plan.waits[static_cast<size_t>(step)]) compute.wait(*copied_[b]);
}

float* ModelStateStep::gradient_address(const Program& program, size_t param) {
  if (!store_.staged()) return nullptr;
  if (plan_ == nullptr) plan_ = &staged_for(program);
  return reinterpret_cast<float*>(plan_->base + plan_->plan.param_offset[param]);
}

CommWork ModelStateStep::reduce_staged(int64_t offset, int64_t count, Stream& after) {
  FERRY_ASSERT(plan_ != nullptr, "a staged reduction before its backward");
  const auto [bucket, range] = range_at_.at(offset);
  float* data = reinterpret_cast<float*>(plan_->base + plan_->plan.bucket_offset[bucket] +
                                         plan_->plan.range_offsets[bucket][range]);
  const int ranks = comm_.ranks().size, rank = comm_.ranks().rank;
  std::vector<Communicator::Part> parts(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const int64_t b = std::clamp(r * shard_, offset, offset + count);
    const int64_t e = std::clamp((r + 1) * shard_, offset, offset + count);
    parts[static_cast<size_t>(r)] = {b - offset, e - b};
  }
  ++reductions_;
  CommWork work = comm_.reduce_scatter_mean(data, parts, after);
  // This rank's part into its shard, on the comm stream behind the collective.
  Stream& comm = device_.stream(StreamKind::kComm);
  const Communicator::Part mine = parts[static_cast<size_t>(rank)];
  if (mine.count > 0) {
    float* shard = store_.update_grads() + (offset + mine.offset - rank * shard_);
    const float* part = data + mine.offset;
    if (first_micro_) {
      device_.copy_async(shard, part, static_cast<uint64_t>(mine.count) * sizeof(float), comm);
    } else {
      device_.kernels().launch(Accumulate{mine.count, part, shard}, comm);
    }
  }
  comm.record(*copied_[bucket]);
  launched_[bucket] = 1;
  return work;
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
  if (!store_.staged()) {
    reductions_ = 0;
    buckets_->finish(compute);
    if (!options_.shard) reductions_ = static_cast<int64_t>(buckets_->launched());
    if (options_.host) send_rest(compute);
    return;
  }
  FERRY_ASSERT(plan_ != nullptr, "a staged reduction before its backward");
  for (size_t b : plan_->plan.waits.back()) compute.wait(*copied_[b]);
  Kernels& k = device_.kernels();
  for (size_t p : plan_->plan.unwritten) {
    const auto& e = store_.params()[p];
    const auto n = static_cast<int64_t>((e.desc.bytes() + 63) / 64 * 64 / sizeof(float));
    k.launch(Fill{n, 0.0f, reinterpret_cast<float*>(plan_->base + plan_->plan.param_offset[p])},
             compute);
  }
  buckets_->finish(compute);
  // The optimizer reads the shard: compute after every copy into it.
  for (size_t b = 0; b < launched_.size(); ++b) {
    if (launched_[b]) compute.wait(*copied_[b]);
  }
  if (options_.host && last_micro_) send_rest(compute);
}

// Note [Clipping after the all-reduce] in optimizer.cc, by shard: every rank's sum of squares of
// its part, all-reduced (mean, times the rank count: the sum), then each part scaled.
void ModelStateStep::clip(Stream& compute, bool on_device) {
  const OptimizerOptions& o = optimizer_.options();
  if (o.clip_norm <= 0) return;
  Kernels& k = device_.kernels();
  const int64_t begin = store_.update_begin(), n = store_.update_end() - begin;
  float* grad = store_.update_grads();
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
  settle(compute);  // the last update's pieces (already waited for by the backward in between)
  const int64_t begin = store_.update_begin(), end = store_.update_end();
  float* param = store_.masters();
  const int slots = store_.optimizer_slots();
  if (options_.host) {
    host_update(compute, lr);  // model_state_host.cc
  } else {
    clip(compute);
    Optimizer::Range r{begin, end, param, store_.update_grads()};
    for (int s = 0; s < slots && s < 2; ++s) r.state[s] = store_.optimizer_block(s);
    optimizer_.step_range(device_.kernels(), compute, store_, r, lr);
  }
  gathers_ = 0;
  gathered_bytes_ = 0;
  if (!options_.shard) return settle_for_working_copy(compute);
  // Note [Sharded master weights]: the shard into the working copy and the fp32 weights.
  if (store_.split_masters() && !store_.host_masters()) store_.publish_masters(compute);
  // Every rank's updated shard to every rank, in pieces of comm.bucket_mb per shard, the next
  // forward's first pieces first; compute waits per piece (before_step) or for all (settle).
  const int ranks = comm_.ranks().size;
  const size_t pieces = pieces_.count();
  std::vector<size_t> order(pieces);
  for (size_t k = 0; k < pieces; ++k) order[k] = k;
  if (last_program_) order = gathers_for(*last_program_).order;
  const bool bf16 = store_.split_masters();
  gathering_.assign(pieces + (bf16 ? 1 : 0), CommWork{});
  waiting_.assign(gathering_.size(), 0);
  const auto gather = [&](size_t k, float* block, const std::vector<Communicator::Part>& parts) {
    gathering_[k] = comm_.all_gather(block, parts, compute);
    waiting_[k] = 1;
    ++gathers_;
    for (const auto& part : parts) gathered_bytes_ += part.count * sizeof(float);
  };
  if (bf16 && store_.fp32_weights() != nullptr) {
    // The fp32 weights first: the embeddings are the first forward step's.
    std::vector<Communicator::Part> parts;
    for (int r = 0; r < ranks; ++r) {
      const auto [b, e] = store_.fp32_part(r);
      parts.push_back({b, e - b});
    }
    gather(pieces, store_.fp32_weights(), parts);
  }
  Stream& comm = device_.stream(StreamKind::kComm);
  for (size_t k : order) {
    const auto at = static_cast<int64_t>(k) * pieces_.piece;
    const int64_t count = std::min(pieces_.piece, shard_ - at);
    std::vector<Communicator::Part> parts;
    // Sharded masters: elements of the bf16 working copy, two a float.
    for (int r = 0; r < ranks; ++r) {
      parts.push_back(bf16 ? Communicator::Part{(r * shard_ + at) / 2, count / 2}
                           : Communicator::Part{r * shard_ + at, count});
    }
    // memory.optimizer host: after this rank's part of the piece has gone up, not every part
    // (Note [Host copies on the links]); the comm stream runs the collectives in order.
    if (options_.host) {
      const int64_t mine = store_.update_begin() + at;
      for (const auto& reads : pieces_read(up_bounds_, {{{mine, mine + count}}}))
        for (size_t u : reads) comm.wait(*up_events_[u]);
    }
    gather(k, bf16 ? store_.working_floats() : store_.param_block(), parts);
  }
  gather_order_ = std::move(order);
  settle_for_working_copy(compute);
}

// Note [The bf16 working copy]: the executor narrows the whole block before the next forward's
// first step, so under bf16 compute waits for every piece here (no wait per layer).
void ModelStateStep::settle_for_working_copy(Stream& compute) {
  if (store_.has_working_copy()) settle(compute);
}

}  // namespace ferry
