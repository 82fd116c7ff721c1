// Planning per shape and running the planned tape.
//
// Note [Executing a plan]
// For each planned step s, on the host, in this order:
//  1. release: for each tensor offloaded with release_at == s, compute waits for its copy to
//     host; its first stretch's space is then free for what step s writes (poison mode fills
//     it with NaN);
//  2. fetch: for each tensor with fetch_at == s, the host-to-device stream waits for compute to
//     finish step s-1 (its second stretch's space is free from s on) and copies it back;
//  3. need: for each tensor with needed_at == s, compute waits for its fetch;
//  4. the step's kernels on the compute stream (a recompute step runs its forward step again
//     without touching persistent state);
//  5. offload: for each tensor produced at s and offloaded, an event after step s orders its
//     copy to host on the device-to-host stream;
//  6. poison mode: tensors whose stretch ends at s and that are not offloaded are NaN-filled.
// Nothing here blocks the host. Every ordering is a stream waiting on an event. Across steps
// the same holds: a tensor still prefetching from the last step is offloaded again with its
// copy ordered after that fetch on the device (ResidentTensor::offload), and every recycled
// event is re-recorded only after the waits that captured its previous record were enqueued.
//
// Note [Metrics without a host wait]
// The loss kernel writes each step's loss and correct count into the persistent metrics slot,
// which the next step overwrites. stage_metrics copies them, on the compute stream, into the
// next entry of a pinned ring (chunks that are never moved or freed while the executor lives),
// so the host may run steps ahead; drain_metrics synchronizes the compute stream once and
// reads every staged entry. The trainer drains on logging steps only, and the ring is allocated
// up front for that many steps (ExecutorOptions::metrics_steps): pinning memory mid-run
// (cudaHostAlloc) may synchronise the device, the stall this note exists to avoid.
#include "trainer/exec/executor.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/host_memory.h"
#include "device/counter_rng.h"

namespace ferry {

Executor::Executor(Device& device, ParameterStore& store, GraphFactory factory,
                   ExecutorOptions options)
    : device_(device),
      store_(store),
      factory_(std::move(factory)),
      options_(options),
      host_pool_(device.pinned(), options.host_limit ? options.host_limit : UINT64_MAX),
      upload_done_(device.create_event()),
      transfers_(device,
                 options.scheduler ? options.scheduler() : std::make_unique<FifoLinkScheduler>()) {
  const size_t chunks =
      (std::max<size_t>(options.metrics_steps, 1) + kMetricsChunk - 1) / kMetricsChunk;
  for (size_t i = 0; i < chunks; ++i) {
    metric_chunks_.push_back(
        static_cast<StepMetrics*>(device.pinned().allocate(kMetricsChunk * sizeof(StepMetrics))));
  }
}

Executor::~Executor() {
  try {
    device_.synchronize();
  } catch (...) {
    // The failure was already reported by whoever enqueued the work.
  }
  for (auto& [key, p] : programs_) {
    for (auto& [t, slot] : p->offloads) host_pool_.release(slot.host);
  }
  for (StepMetrics* chunk : metric_chunks_) {
    device_.pinned().deallocate(chunk, kMetricsChunk * sizeof(StepMetrics));
  }
}

const Program& Executor::program(int64_t batch, bool training) { return planned(batch, training); }

Program& Executor::planned(int64_t batch, bool training) {
  const Key key{batch, training};
  auto it = programs_.find(key);
  if (it != programs_.end()) return *it->second;
  auto p = std::make_unique<Program>();
  p->graph = factory_(batch);
  p->lowered = lower_graph(p->graph, device_.kernels(), training);
  // The last step reads every kept tensor, so liveness keeps it to the end.
  for (const std::string& name : keep_alive_) {
    bool found = false;
    for (size_t t = 0; t < p->lowered.tape.tensors.size(); ++t) {
      if (p->lowered.tape.tensors[t].name != name) continue;
      p->lowered.tape.steps.back().reads.push_back(static_cast<int>(t));
      found = true;
    }
    if (!found) throw ConfigError("keep_alive: no tensor named '" + name + "'");
  }
  PlanOptions options = options_.plan;
  options.persistent = store_.bytes();
  if (!training) options.policy = MemoryPolicy::kNone;  // nothing is saved for a backward
  p->plan = plan_memory(p->lowered.tape, options);
  index_plan(*p);
  return *programs_.emplace(key, std::move(p)).first->second;
}

void Executor::index_plan(Program& p) {
  p.persistent.assign(p.graph.tensors().size(), nullptr);
  for (size_t id = 0; id < p.graph.tensors().size(); ++id) {
    if (is_persistent(p.graph.tensors()[id].role)) {
      p.persistent[id] = store_.address(p.graph, static_cast<TensorId>(id));
    }
  }
  p.grads.assign(p.graph.tensors().size(), nullptr);
  for (TensorId param : p.graph.params()) {
    p.grads[static_cast<size_t>(param)] = store_.grad_address(p.graph, param);
  }
  // The host bytes the offloads need are known now: check them before any step runs.
  const HostPoolStats pool = host_pool_.stats();
  if (pool.reserved + p.plan.host_bytes > host_pool_.limit()) {
    throw OutOfMemoryError(
        OutOfMemoryError::Where::kHostPool,
        fmt::format("offloads of a batch of {}", p.graph.batch()), p.plan.host_bytes, pool.reserved,
        host_pool_.limit(), {},
        fmt::format("raise memory.host_limit to at least {}, or offload less (memory.policy, "
                    "memory.budget)",
                    format_bytes(pool.reserved + p.plan.host_bytes)));
  }
  if (const auto available = available_host_memory(); available && p.plan.host_bytes > *available) {
    throw OutOfMemoryError(OutOfMemoryError::Where::kHostPool, "offloads (machine memory)",
                           p.plan.host_bytes, 0, *available, {},
                           "the machine's free memory cannot hold the offloaded activations: "
                           "lower data.batch_size or give auto a larger memory.budget");
  }
  const size_t steps = p.plan.tape.steps.size();
  p.planned_start.assign(steps + 1, 0.0);
  for (size_t s = 0; s < steps; ++s) {
    p.planned_start[s + 1] =
        p.planned_start[s] + options_.plan.cost.step_seconds(p.plan.tape.steps[s], p.plan.tape);
  }
  p.grads_written.resize(steps);
  p.release_at.resize(steps);
  p.fetch_at.resize(steps);
  p.needed_at.resize(steps);
  p.offload_after.resize(steps);
  p.dies_at.resize(steps);
  for (size_t s = 0; s < steps; ++s) {
    if (p.plan.tape.steps[s].phase != StepPhase::kBackward) continue;
    const StepBinding& b = p.lowered.bindings[static_cast<size_t>(p.plan.origin[s])];
    for (int slot : b.grad_params) {
      p.grads_written[s].push_back(store_.param_index(p.graph, persistent_id(slot)));
    }
  }
  for (size_t t = 0; t < p.plan.tensors.size(); ++t) {
    const TensorPlan& tp = p.plan.tensors[t];
    const int tensor = static_cast<int>(t);
    if (tp.decision == Decision::kOffload) {
      p.release_at[static_cast<size_t>(tp.release_at)].push_back(tensor);
      p.fetch_at[static_cast<size_t>(tp.fetch_at)].push_back(tensor);
      p.needed_at[static_cast<size_t>(tp.needed_at)].push_back(tensor);
      p.offload_after[static_cast<size_t>(tp.offload_after)].push_back(tensor);
      const TapeTensor& info = p.plan.tape.tensors[t];
      OffloadSlot slot;
      slot.residency = std::make_unique<ResidentTensor>(device_, info.name, info.bytes);
      slot.host = host_pool_.acquire(info.bytes, "offload of " + info.name);
      p.offloads.emplace(tensor, std::move(slot));
    }
    for (size_t r = 0; r < tp.residency.size(); ++r) {
      // Freed by an offload's release, or handed on to a tensor computed in place: not dead.
      const bool released_by_offload = tp.decision == Decision::kOffload && r == 0;
      if (!released_by_offload && !tp.residency[r].handed_on) {
        p.dies_at[static_cast<size_t>(tp.residency[r].end)].push_back(tensor);
      }
    }
  }
}

void Executor::ensure_arena(uint64_t bytes) {
  if (arena_ && arena_.bytes() >= bytes) return;
  if (arena_) device_.synchronize();  // nothing may still use the old arena
  arena_.reset();
  arena_ = DeviceBuffer(device_.memory(), std::max<uint64_t>(bytes, kArenaAlignment),
                        "activation arena");
  if (options_.poison) {
    device_.kernels().launch(
        Fill{static_cast<int64_t>(arena_.bytes() / sizeof(float)), NAN, arena_.as<float>()},
        device_.stream(StreamKind::kCompute));
  }
}

void* Executor::tensor_address(const Program& p, int t, int step) const {
  const TensorPlan& tp = p.plan.tensors[static_cast<size_t>(t)];
  for (const Residency& r : tp.residency) {
    if (r.begin <= step && step <= r.end) return static_cast<std::byte*>(arena_.data()) + r.offset;
  }
  FERRY_ASSERT(false, fmt::format("tensor {} is not resident at step {}",
                                  p.plan.tape.tensors[static_cast<size_t>(t)].name, step));
  return nullptr;
}

void* Executor::slot_address(const Program& p, int slot, int step) const {
  if (slot == -1) return nullptr;
  if (is_persistent_slot(slot)) return p.persistent[static_cast<size_t>(persistent_id(slot))];
  return tensor_address(p, slot, step);
}

Event& Executor::step_event() {
  if (next_event_ == events_.size()) events_.push_back(device_.create_event());
  return *events_[next_event_++];
}

void Executor::enqueue(const HostBatch& batch, bool training, uint64_t step,
                       GradientListener* listener) {
  Program& p = planned(batch.n, training);
  ensure_arena(p.plan.arena_bytes);
  // The previous step may still run: its fetches end in prefetching, and this step's offloads
  // are ordered after them on the device (Note [Executing a plan]). poll() never blocks.
  for (auto& [t, slot] : p.offloads) slot.residency->poll();
  last_ = &p;
  next_event_ = 0;
  const uint64_t step_seed = counter_hash(options_.seed, step);
  std::vector<uint64_t> occupancy;
  if (trace_) {
    occupancy = arena_occupancy(p.plan);
    step_origin_ = device_.create_timing_event();
    device_.stream(StreamKind::kCompute).record(*step_origin_);
    if (!trace_origin_) {
      trace_origin_ = device_.create_timing_event();
      device_.stream(StreamKind::kCompute).record(*trace_origin_);
    }
    marks_.clear();
  }
  for (int s = 0; s < static_cast<int>(p.plan.tape.steps.size()); ++s) {
    before_step(p, s);
    if (trace_ && (!p.release_at[static_cast<size_t>(s)].empty() ||
                   !p.needed_at[static_cast<size_t>(s)].empty())) {
      // The time compute spends waiting for copies shows as its own span.
      StepMark wait{"wait for copies", device_.create_timing_event(),
                    p.plan.persistent.total() + occupancy[static_cast<size_t>(s)]};
      device_.stream(StreamKind::kCompute).record(*wait.end);
      marks_.push_back(std::move(wait));
    }
    run_step(p, s, batch, step_seed);
    after_step(p, s);
    if (trace_) {
      const TapeStep& st = p.plan.tape.steps[static_cast<size_t>(s)];
      static constexpr const char* kPhase[] = {"load", "fwd", "bwd", "acc", "update", "recompute"};
      StepMark mark{fmt::format("{} {}", kPhase[static_cast<int>(st.phase)], st.name),
                    device_.create_timing_event(),
                    p.plan.persistent.total() + occupancy[static_cast<size_t>(s)]};
      device_.stream(StreamKind::kCompute).record(*mark.end);
      marks_.push_back(std::move(mark));
    }
    if (listener && !p.grads_written[static_cast<size_t>(s)].empty()) {
      listener->on_gradients(p.grads_written[static_cast<size_t>(s)]);
    }
  }
}

void Executor::poison(const Program& p, int t, const Residency& r) {
  const int64_t n =
      static_cast<int64_t>(p.plan.tape.tensors[static_cast<size_t>(t)].bytes / sizeof(float));
  if (n == 0) return;
  device_.kernels().launch(
      Fill{n, NAN, reinterpret_cast<float*>(static_cast<std::byte*>(arena_.data()) + r.offset)},
      device_.stream(StreamKind::kCompute));
}

double Executor::deadline_s(const Program& p, int issued_before, int deadline_step) {
  const auto at = [&](int s) {
    return p.planned_start[static_cast<size_t>(
        std::clamp(s, 0, static_cast<int>(p.planned_start.size()) - 1))];
  };
  return deadline_step < 0 ? 0.0 : std::max(0.0, at(deadline_step) - at(issued_before));
}

void Executor::before_step(Program& p, int s) {
  Stream& compute = device_.stream(StreamKind::kCompute);
  for (int t : p.release_at[static_cast<size_t>(s)]) {
    p.offloads.at(t).residency->order_after_offload(compute);
    if (options_.poison) poison(p, t, p.plan.tensors[static_cast<size_t>(t)].residency[0]);
  }
  if (!p.fetch_at[static_cast<size_t>(s)].empty()) {
    Event& space_free = step_event();  // compute has finished step s-1
    compute.record(space_free);
    for (int t : p.fetch_at[static_cast<size_t>(s)]) {
      OffloadSlot& slot = p.offloads.at(t);
      const int needed = p.plan.tensors[static_cast<size_t>(t)].needed_at;
      transfers_.prefetch(*slot.residency, tensor_address(p, t, s), space_free, needed,
                          deadline_s(p, s, needed));
    }
  }
  for (int t : p.needed_at[static_cast<size_t>(s)]) {
    p.offloads.at(t).residency->order_after_prefetch(compute);
  }
}

void Executor::after_step(Program& p, int s) {
  Stream& compute = device_.stream(StreamKind::kCompute);
  if (!p.offload_after[static_cast<size_t>(s)].empty()) {
    Event& produced = step_event();
    compute.record(produced);
    for (int t : p.offload_after[static_cast<size_t>(s)]) {
      OffloadSlot& slot = p.offloads.at(t);
      const int release = p.plan.tensors[static_cast<size_t>(t)].release_at;
      transfers_.offload(*slot.residency, tensor_address(p, t, s), slot.host, produced, release,
                         deadline_s(p, s + 1, release));
    }
  }
  if (options_.poison) {
    for (int t : p.dies_at[static_cast<size_t>(s)]) {
      for (const Residency& r : p.plan.tensors[static_cast<size_t>(t)].residency) {
        if (r.end == s && !r.handed_on) poison(p, t, r);
      }
    }
  }
}

void Executor::run_step(const Program& p, int s, const HostBatch& batch, uint64_t step_seed) {
  const TapeStep& step = p.plan.tape.steps[static_cast<size_t>(s)];
  const StepBinding& b =
      p.lowered.bindings[static_cast<size_t>(p.plan.origin[static_cast<size_t>(s)])];
  Stream& compute = device_.stream(StreamKind::kCompute);
  Kernels& k = device_.kernels();
  switch (step.phase) {
    case StepPhase::kLoad: {
      // The upload writes arena space that compute's earlier work (the previous batch, or a
      // poison fill) may still be using.
      Stream& h2d = device_.stream(StreamKind::kHostToDevice);
      Event& arena_free = step_event();
      compute.record(arena_free);
      h2d.wait(arena_free);
      const Graph& g = p.graph;
      device_.copy_async(tensor_address(p, p.lowered.tape_of[static_cast<size_t>(g.input())], s),
                         batch.images, g.tensor(g.input()).desc.bytes(), h2d);
      device_.copy_async(tensor_address(p, p.lowered.tape_of[static_cast<size_t>(g.labels())], s),
                         batch.labels, g.tensor(g.labels()).desc.bytes(), h2d);
      h2d.record(*upload_done_);
      compute.wait(*upload_done_);
      return;
    }
    case StepPhase::kAccumulate: {
      const int64_t n = static_cast<int64_t>(
          p.plan.tape.tensors[static_cast<size_t>(b.accumulate_into)].bytes / sizeof(float));
      k.launch(Accumulate{n, static_cast<const float*>(tensor_address(p, b.accumulate_from, s)),
                          static_cast<float*>(tensor_address(p, b.accumulate_into, s))},
               compute);
      return;
    }
    case StepPhase::kUpdate:
      return;  // the optimizer runs after gradients are reduced
    case StepPhase::kForward:
    case StepPhase::kBackward:
    case StepPhase::kRecompute:
      break;
  }
  const Node& node = p.graph.nodes()[static_cast<size_t>(step.node)];
  const bool recompute = step.phase == StepPhase::kRecompute;
  OpIo io;
  const auto fill = [&](const std::vector<int>& slots, std::vector<void*>& out) {
    out.clear();
    for (int slot : slots) out.push_back(slot_address(p, slot, s));
  };
  fill(b.inputs, io.inputs);
  fill(b.outputs, io.outputs);
  fill(b.params, io.params);
  fill(b.buffers, io.buffers);
  if (!recompute) fill(b.aux, io.aux);  // a recompute writes scratch, not saved state
  io.training = p.lowered.training;
  io.update_buffers = !recompute;
  io.seed = counter_hash(step_seed, static_cast<uint64_t>(step.node));
  if (b.workspace >= 0) {
    io.ws = {tensor_address(p, b.workspace, s),
             p.plan.tape.tensors[static_cast<size_t>(b.workspace)].bytes};
  }
  if (step.phase != StepPhase::kBackward) {
    node.op->forward(k, compute, io);
    return;
  }
  fill(b.grad_outputs, io.grad_outputs);
  fill(b.grad_inputs, io.grad_inputs);
  io.grad_params.clear();
  for (int slot : b.grad_params) {
    io.grad_params.push_back(p.grads[static_cast<size_t>(persistent_id(slot))]);
  }
  node.op->backward(k, compute, io);
}

std::vector<std::byte> Executor::read_activation(const std::string& name) {
  FERRY_ASSERT(last_ != nullptr, "read_activation before any step");
  const Tape& tape = last_->plan.tape;
  for (size_t t = 0; t < tape.tensors.size(); ++t) {
    if (tape.tensors[t].name != name) continue;
    const int last_step = static_cast<int>(tape.steps.size()) - 1;
    std::vector<std::byte> out(tape.tensors[t].bytes);
    Stream& compute = device_.stream(StreamKind::kCompute);
    device_.copy_async(out.data(), tensor_address(*last_, static_cast<int>(t), last_step),
                       out.size(), compute);
    compute.synchronize();
    return out;
  }
  throw ConfigError("read_activation: no tensor named '" + name + "'");
}

StepMetrics Executor::read_metrics() {
  Stream& compute = device_.stream(StreamKind::kCompute);
  device_.copy_async(&host_metrics_.loss, store_.loss_address(), sizeof(float), compute);
  device_.copy_async(&host_metrics_.correct, store_.correct_address(), sizeof(int32_t), compute);
  compute.synchronize();
  if (trace_ && step_origin_) resolve_trace();
  return host_metrics_;
}

void Executor::stage_metrics(uint64_t step) {
  FERRY_ASSERT(last_ != nullptr, "stage_metrics before any step");
  const size_t i = staged_steps_.size();
  if (i / kMetricsChunk == metric_chunks_.size()) {
    metric_chunks_.push_back(
        static_cast<StepMetrics*>(device_.pinned().allocate(kMetricsChunk * sizeof(StepMetrics))));
  }
  StepMetrics* entry = metric_chunks_[i / kMetricsChunk] + i % kMetricsChunk;
  Stream& compute = device_.stream(StreamKind::kCompute);
  device_.copy_async(&entry->loss, store_.loss_address(), sizeof(float), compute);
  device_.copy_async(&entry->correct, store_.correct_address(), sizeof(int32_t), compute);
  staged_steps_.push_back(step);
}

std::vector<StagedMetrics> Executor::drain_metrics() {
  device_.stream(StreamKind::kCompute).synchronize();
  std::vector<StagedMetrics> out;
  out.reserve(staged_steps_.size());
  for (size_t i = 0; i < staged_steps_.size(); ++i) {
    const StepMetrics& m = metric_chunks_[i / kMetricsChunk][i % kMetricsChunk];
    out.push_back({staged_steps_[i], m.loss, m.correct});
  }
  staged_steps_.clear();
  if (trace_ && step_origin_) resolve_trace();
  return out;
}

void Executor::set_trace(StepTrace* trace) {
  trace_ = trace;
  transfers_.set_tracing(trace != nullptr);
  if (!trace) {
    trace_origin_.reset();
    step_origin_.reset();
    marks_.clear();
    transfers_.take_traced();
  }
}

void Executor::resolve_trace() {
  device_.synchronize();  // every copy of the step has finished
  const auto at = [&](Event& e) { return device_.elapsed_ms(*trace_origin_, e) * 1000.0; };
  {
    // Place the origin on the host clock: an event recorded on the idle compute stream
    // completes at once, so its elapsed time from the origin is "now".
    auto now = device_.create_timing_event();
    device_.stream(StreamKind::kCompute).record(*now);
    now->synchronize();
    const int64_t host_now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count();
    trace_host_origin_ns_ = host_now - static_cast<int64_t>(at(*now) * 1000.0);
  }
  double start = at(*step_origin_);
  for (StepMark& m : marks_) {
    const double end = at(*m.end);
    trace_->counter(start, m.device_bytes);
    trace_->add({TraceTrack::kCompute, m.name, start, end - start, {}});
    start = end;
  }
  for (TracedTransfer& t : transfers_.take_traced()) {
    const bool to_host = t.request.direction == TransferDirection::kToHost;
    const double begin = at(*t.start);
    trace_->add({to_host ? TraceTrack::kDeviceToHost : TraceTrack::kHostToDevice,
                 (to_host ? "offload " : "prefetch ") + t.request.tensor,
                 begin,
                 at(*t.end) - begin,
                 {{"bytes", t.request.bytes}, {"deadline_step", t.request.deadline_step}}});
  }
  step_origin_.reset();
  marks_.clear();
}

}  // namespace ferry
