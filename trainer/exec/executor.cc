// Running the planned tape, one step at a time.

// Note [Executing a plan]
// For each planned step s, on the host, in this order (the four steps of an offload are
// OffloadTiming's, prefetch/plan.h):
//  1. release: for each tensor with release_at == s, compute waits for its copy to host; its
//     first stretch's space is then free for what step s writes (poison mode fills it with NaN);
//  2. fetch: for each tensor with fetch_at == s, the host-to-device stream waits for compute to
//     finish step s-1 and copies it back into its second stretch;
//  3. need: for each tensor with needed_at == s, compute waits for its fetch;
//  4. the step's kernels on the compute stream (a recompute step runs its forward step again
//     without touching persistent state);
//  5. offload: for each tensor with offload_after == s, an event after step s orders its copy
//     to host on the device-to-host stream;
//  6. poison mode: tensors whose stretch ends at s and that are not offloaded are NaN-filled.
// Nothing here blocks the host. Every ordering is a stream waiting on an event. Across steps
// the same holds: a tensor still prefetching from the last step is offloaded again with its
// copy ordered after that fetch on the device (ResidentTensor::offload), and every recycled
// event is re-recorded only after the waits that captured its previous record were enqueued.
#include "trainer/exec/executor.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "device/bf16.h"
#include "device/counter_rng.h"
#include "prefetch/arena.h"

namespace ferry {

Executor::Executor(Device& device, ParameterStore& store, GraphFactory factory,
                   ExecutorOptions options, ShapedGraphFactory shaped)
    : device_(device),
      store_(store),
      options_(options),
      host_pool_(device.pinned(), options.host_limit ? options.host_limit : UINT64_MAX),
      programs_(device, store, host_pool_, std::move(factory), options.plan, std::move(shaped)),
      upload_done_(device.create_event()),
      metrics_(device, options.metrics_steps),
      transfers_(device,
                 options.scheduler ? options.scheduler() : std::make_unique<FifoLinkScheduler>()),
      tracer_(device) {
  programs_.set_shape_options(options.shapes);
}

Executor::~Executor() {
  try {
    device_.synchronize();
  } catch (...) {
    // The failure was already reported by whoever enqueued the work.
  }
}

const Program& Executor::program(int64_t batch, bool training) {
  return programs_.get(batch, training);
}

const Program& Executor::program(const Shape& input, bool training) {
  return programs_.get(input, training);
}

void Executor::set_budget(uint64_t budget) {
  if (budget == programs_.budget()) return;
  device_.synchronize();  // nothing may still use the arena
  arena_.reset();
  programs_.set_budget(budget);
}

void Executor::ensure_arena(uint64_t bytes) {
  if (arena_ && arena_.bytes() >= bytes) return;
  if (arena_) device_.synchronize();  // nothing may still use the old arena
  const uint64_t size = arena_aligned(std::max<uint64_t>(bytes, kArenaAlignment));
  // What the device will hold with the old arena released and the new one allocated.
  if (arena_listener_) arena_listener_(device_.memory().held_after(size, arena_.data()));
  arena_.reset();
  arena_ = DeviceBuffer(device_.memory(), size, "activation arena");
  // Under bf16 each 16-bit half holds a bf16 NaN, so the words are fp32 NaNs too.
  if (options_.poison)
    poison_bytes(arena_.data(), arena_.bytes(),
                 store_.has_working_copy() ? DType::kBF16 : DType::kF32);
}

void Executor::poison_bytes(void* ptr, uint64_t bytes, DType dtype) {
  const bool bf16 = dtype == DType::kBF16;  // anything else (a workspace's bytes) as fp32
  const auto n = static_cast<int64_t>(bytes / (bf16 ? dtype_size(dtype) : sizeof(float)));
  if (n == 0) return;
  Fill fill{n, NAN, static_cast<float*>(ptr)};
  fill.dtype = bf16 ? DType::kBF16 : DType::kF32;
  device_.kernels().launch(fill, device_.stream(StreamKind::kCompute));
}

const void* Executor::input_bytes(const HostBatch& batch, const TensorDesc& desc) {
  if (desc.dtype != DType::kBF16) return batch.input;
  // The previous upload read staged_input_: it has long finished by the next step's load.
  upload_done_->synchronize();
  const auto n = static_cast<size_t>(desc.shape.numel());
  staged_input_.resize(n);
  const auto* x = static_cast<const float*>(batch.input);
  for (size_t i = 0; i < n; ++i) staged_input_[i] = float_to_bf16(x[i]).bits;
  return staged_input_.data();
}

void* Executor::tensor_address(const Program& p, int t, int step) const {
  const TensorPlan& tp = p.plan.tensors[t];
  for (const Residency& r : tp.residency) {
    if (r.begin <= step && step <= r.end) {
      p.arena_touched = std::max(p.arena_touched, r.offset + p.plan.tape.tensors[t].bytes);
      return static_cast<std::byte*>(arena_.data()) + r.offset;
    }
  }
  FERRY_ASSERT(false, fmt::format("tensor {} is not resident at step {}",
                                  p.plan.tape.tensors[t].name, step));
  return nullptr;
}

void* Executor::slot_address(const Program& p, int slot, int step) const {
  if (slot == -1) return nullptr;
  if (is_persistent_slot(slot)) return p.persistent[persistent_id(slot)];
  return tensor_address(p, slot, step);
}

Event& Executor::step_event() {
  if (next_event_ == events_.size()) events_.push_back(device_.create_event());
  return *events_[next_event_++];
}

void Executor::enqueue(const HostBatch& batch, bool training, uint64_t step,
                       GradientListener* listener) {
  Program& p = batch.shape.rank() > 0 ? programs_.get(batch.shape, training)
                                      : programs_.get(batch.n, training);
  FERRY_ASSERT(batch.shape.rank() == 0 || batch.shape[0] == batch.n,
               "HostBatch: shape and row count disagree");
  // One arena serves every plan: it grows to the largest plan used so far at the current budget
  // (the old one freed first), never to a sum, and a budget change (set_budget) starts it afresh;
  // persistent state lives in its own blocks and never moves.
  ensure_arena(p.plan.arena_bytes);
  ++p.steps_run;
  // The previous step may still run: its fetches end in prefetching, and this step's offloads
  // are ordered after them on the device (Note [Executing a plan]). poll() never blocks.
  for (auto& [t, slot] : p.offloads) slot.residency->poll();
  last_ = &p;
  next_event_ = 0;
  // Note [The bf16 working copy]: made once per update, before the first step that reads it.
  store_.refresh_working_weights(device_.stream(StreamKind::kCompute));
  const uint64_t step_seed = counter_hash(options_.seed, step);
  std::vector<uint64_t> occupancy;
  if (tracer_.active()) {
    occupancy = arena_occupancy(p.plan);
    tracer_.begin_step();
  }
  for (int s = 0; s < static_cast<int>(p.plan.tape.steps.size()); ++s) {
    if (listener) listener->before_step(p, s);
    before_step(p, s);
    if (tracer_.active() && (!p.release_at[s].empty() || !p.needed_at[s].empty())) {
      // The time compute spends waiting for copies shows as its own span.
      tracer_.mark("wait for copies", p.plan.persistent.total() + occupancy[s]);
    }
    run_step(p, s, batch, step_seed, listener);
    after_step(p, s);
    if (tracer_.active()) {
      const TapeStep& st = p.plan.tape.steps[s];
      static constexpr const char* kPhase[] = {"load", "fwd", "bwd", "acc", "update", "recompute"};
      tracer_.mark(fmt::format("{} {}", kPhase[static_cast<int>(st.phase)], st.name),
                   p.plan.persistent.total() + occupancy[s]);
    }
    if (listener && !p.grads_written[s].empty()) {
      listener->on_gradients(p.grads_written[s]);
    }
  }
}

void Executor::poison(const Program& p, int t, const Residency& r) {
  const TapeTensor& tensor = p.plan.tape.tensors[t];
  poison_bytes(static_cast<std::byte*>(arena_.data()) + r.offset, tensor.bytes, tensor.dtype);
}

double Executor::deadline_s(const Program& p, int issued_before, int deadline_step) {
  const auto at = [&](int s) {
    return p.planned_start[std::clamp(s, 0, static_cast<int>(p.planned_start.size()) - 1)];
  };
  return deadline_step < 0 ? 0.0 : std::max(0.0, at(deadline_step) - at(issued_before));
}

// Steps 1-3 of Note [Executing a plan]; steps 6-8 of Note [Life of an offloaded activation]
// (executor.h).
void Executor::before_step(Program& p, int s) {
  Stream& compute = device_.stream(StreamKind::kCompute);
  for (int t : p.release_at[s]) {
    p.offloads.at(t).residency->order_after_offload(compute);
    if (options_.poison) poison(p, t, p.plan.tensors[t].residency[0]);
  }
  if (!p.fetch_at[s].empty()) {
    Event& space_free = step_event();  // compute has finished step s-1
    compute.record(space_free);
    for (int t : p.fetch_at[s]) {
      OffloadSlot& slot = p.offloads.at(t);
      const int needed = p.plan.tensors[t].needed_at;
      transfers_.prefetch(*slot.residency, tensor_address(p, t, s), space_free, needed,
                          deadline_s(p, s, needed));
    }
  }
  for (int t : p.needed_at[s]) {
    p.offloads.at(t).residency->order_after_prefetch(compute);
  }
}

// Steps 5-6 of Note [Executing a plan]; step 3 of Note [Life of an offloaded activation]
// (executor.h).
void Executor::after_step(Program& p, int s) {
  Stream& compute = device_.stream(StreamKind::kCompute);
  if (!p.offload_after[s].empty()) {
    Event& produced = step_event();
    compute.record(produced);
    for (int t : p.offload_after[s]) {
      OffloadSlot& slot = p.offloads.at(t);
      const int release = p.plan.tensors[t].release_at;
      transfers_.offload(*slot.residency, tensor_address(p, t, s), slot.host, produced, release,
                         deadline_s(p, s + 1, release));
    }
  }
  if (options_.poison) {
    for (int t : p.dies_at[s]) {
      for (const Residency& r : p.plan.tensors[t].residency) {
        if (r.end == s && !r.handed_on) poison(p, t, r);
      }
    }
  }
}

void Executor::run_step(const Program& p, int s, const HostBatch& batch, uint64_t step_seed,
                        GradientListener* listener) {
  const TapeStep& step = p.plan.tape.steps[s];
  const StepBinding& b = p.lowered.bindings[p.plan.origin[static_cast<size_t>(s)]];
  Stream& compute = device_.stream(StreamKind::kCompute);
  Kernels& k = device_.kernels();
  switch (step.phase) {
    case StepPhase::kLoad: {
      // The upload writes arena space that compute's earlier work (the previous batch, or a
      // poison fill) may still be using. Under the host optimizer it goes on compute itself, not
      // behind the weight pieces queued on the host-to-device stream, which the forward waits
      // for one by one (Note [Host copies on the links] in trainer/optim/model_state_step.h).
      Stream& load = options_.load_on_compute ? compute : device_.stream(StreamKind::kHostToDevice);
      if (&load != &compute) {
        Event& arena_free = step_event();
        compute.record(arena_free);
        load.wait(arena_free);
      }
      const Graph& g = p.graph;
      const TensorDesc& input = g.tensor(g.input()).desc;
      device_.copy_async(tensor_address(p, p.lowered.tape_of[g.input()], s),
                         input_bytes(batch, input), input.bytes(), load);
      device_.copy_async(tensor_address(p, p.lowered.tape_of[g.labels()], s), batch.labels,
                         g.tensor(g.labels()).desc.bytes(), load);
      if (g.segments() != kNoTensor) {
        FERRY_ASSERT(batch.segments != nullptr, "a packed graph needs the batch's segment starts");
        device_.copy_async(tensor_address(p, p.lowered.tape_of[g.segments()], s), batch.segments,
                           g.tensor(g.segments()).desc.bytes(), load);
      }
      load.record(*upload_done_);
      if (&load != &compute) compute.wait(*upload_done_);
      return;
    }
    case StepPhase::kAccumulate: {
      const TapeTensor& into = p.plan.tape.tensors[b.accumulate_into];
      const int64_t n = static_cast<int64_t>(into.bytes / dtype_size(into.dtype));
      k.launch(Accumulate{n, static_cast<const float*>(tensor_address(p, b.accumulate_from, s)),
                          static_cast<float*>(tensor_address(p, b.accumulate_into, s)), into.dtype},
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
  const Node& node = p.graph.nodes()[step.node];
  const bool recompute = step.phase == StepPhase::kRecompute;
  OpIo io;
  const auto fill = [&](const std::vector<int>& slots, std::vector<void*>& out) {
    out.clear();
    for (int slot : slots) out.push_back(slot_address(p, slot, s));
  };
  fill(b.inputs, io.inputs);
  io.outputs.clear();
  for (int out : b.outputs) {
    // A recompute writes only what its chain rebuilds; other outputs get no memory (op.h).
    const bool rebuilt =
        !recompute || std::find(step.writes.begin(), step.writes.end(), out) != step.writes.end();
    io.outputs.push_back(rebuilt ? slot_address(p, out, s) : nullptr);
  }
  fill(b.params, io.params);
  io.working.clear();
  if (!p.working.empty()) {
    for (int slot : b.params)
      io.working.push_back(is_persistent_slot(slot) ? p.working[persistent_id(slot)] : nullptr);
  }
  io.dtype = b.dtype;
  fill(b.buffers, io.buffers);
  if (!recompute) fill(b.aux, io.aux);  // a recompute writes scratch, not saved state
  io.training = p.lowered.training;
  io.update_buffers = !recompute;
  io.seed = counter_hash(step_seed, static_cast<uint64_t>(step.node));
  io.loss_divisor = batch.loss_divisor;
  if (b.workspace >= 0) {
    io.ws = {tensor_address(p, b.workspace, s), p.plan.tape.tensors[b.workspace].bytes};
  }
  if (step.phase != StepPhase::kBackward) {
    node.op->forward(k, compute, io);
    return;
  }
  // A fetched activation is read here from its second stretch (Note [Life of an offloaded
  // activation] in executor.h, step 8).
  fill(b.grad_outputs, io.grad_outputs);
  fill(b.grad_inputs, io.grad_inputs);
  io.grad_params.clear();
  for (int slot : b.grad_params) {
    const TensorId id = persistent_id(slot);
    float* staged =
        listener ? listener->gradient_address(p, static_cast<size_t>(p.param_index[id])) : nullptr;
    io.grad_params.push_back(staged ? staged : p.grads[id]);
    FERRY_ASSERT(io.grad_params.back() != nullptr, "a staged gradient without its listener");
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
  if (tracer_.pending()) tracer_.resolve(transfers_.take_traced());
  return host_metrics_;
}

void Executor::stage_metrics(uint64_t step, const float* grad_sq) {
  FERRY_ASSERT(last_ != nullptr, "stage_metrics before any step");
  metrics_.stage(step, store_.loss_address(), store_.correct_address(), grad_sq);
}

std::vector<StagedMetrics> Executor::drain_metrics() {
  std::vector<StagedMetrics> out = metrics_.drain();
  if (tracer_.pending()) tracer_.resolve(transfers_.take_traced());
  return out;
}

void Executor::set_trace(StepTrace* trace) {
  tracer_.set(trace);
  transfers_.set_tracing(trace != nullptr);
  if (!trace) transfers_.take_traced();
}

}  // namespace ferry
