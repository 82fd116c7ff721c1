// Planning per shape and running the tape.
#include "trainer/exec/executor.h"

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "device/counter_rng.h"

namespace ferry {

Executor::Executor(Device& device, ParameterStore& store, GraphFactory factory, PlanOptions plan,
                   uint64_t seed)
    : device_(device),
      store_(store),
      factory_(std::move(factory)),
      plan_options_(plan),
      seed_(seed),
      upload_done_(device.create_event()) {}

Executor::~Executor() {
  try {
    device_.synchronize();
  } catch (...) {
    // The failure was already reported by whoever enqueued the work.
  }
}

const Program& Executor::program(int64_t batch, bool training) {
  const Key key{batch, training};
  auto it = programs_.find(key);
  if (it != programs_.end()) return *it->second;
  auto p = std::make_unique<Program>();
  p->graph = factory_(batch);
  p->lowered = lower_graph(p->graph, device_.kernels(), training);
  if (!keep_alive_.empty()) {
    // The last step reads every kept tensor, so liveness keeps it to the end.
    for (const std::string& name : keep_alive_) {
      bool found = false;
      for (size_t t = 0; t < p->lowered.tape.tensors.size(); ++t) {
        if (p->lowered.tape.tensors[t].name == name) {
          p->lowered.tape.steps.back().reads.push_back(static_cast<int>(t));
          found = true;
        }
      }
      if (!found) throw ConfigError("keep_alive: no tensor named '" + name + "'");
    }
  }
  p->liveness = analyse_liveness(p->lowered.tape);
  PlanOptions options = plan_options_;
  options.persistent = store_.bytes();
  if (!training) options.policy = MemoryPolicy::kNone;  // nothing is saved for a backward
  p->plan = plan_memory(p->lowered.tape, p->liveness, options);
  p->grads_written.resize(p->lowered.tape.steps.size());
  for (size_t s = 0; s < p->lowered.bindings.size(); ++s) {
    for (int slot : p->lowered.bindings[s].grad_params) {
      p->grads_written[s].push_back(store_.param_index(p->graph, persistent_id(slot)));
    }
  }
  return *programs_.emplace(key, std::move(p)).first->second;
}

void Executor::ensure_arena(uint64_t bytes) {
  if (arena_ && arena_.bytes() >= bytes) return;
  device_.synchronize();  // nothing may still use the old arena
  arena_.reset();
  arena_ = DeviceBuffer(device_.memory(), std::max<uint64_t>(bytes, kArenaAlignment),
                        "activation arena");
}

void* Executor::tensor_address(const Program& p, int t, int step) const {
  const TensorPlan& tp = p.plan.tensors[static_cast<size_t>(t)];
  for (const Residency& r : tp.residency) {
    if (r.begin <= step && step <= r.end) return static_cast<std::byte*>(arena_.data()) + r.offset;
  }
  FERRY_ASSERT(false, fmt::format("tensor {} is not resident at step {}",
                                  p.lowered.tape.tensors[static_cast<size_t>(t)].name, step));
  return nullptr;
}

void* Executor::slot_address(const Program& p, int slot, int step) const {
  if (slot == -1) return nullptr;
  if (is_persistent_slot(slot)) {
    const TensorId id = persistent_id(slot);
    return persistent_[static_cast<size_t>(id)];
  }
  return tensor_address(p, slot, step);
}

void Executor::enqueue(const HostBatch& batch, bool training, uint64_t step,
                       GradientListener* listener) {
  const Program& p = program(batch.n, training);
  ensure_arena(p.plan.arena_bytes);
  persistent_.assign(p.graph.tensors().size(), nullptr);
  for (size_t id = 0; id < p.graph.tensors().size(); ++id) {
    if (is_persistent(p.graph.tensors()[id].role)) {
      persistent_[id] = store_.address(p.graph, static_cast<TensorId>(id));
    }
  }
  last_ = &p;
  const uint64_t step_seed = counter_hash(seed_, step);
  for (int s = 0; s < static_cast<int>(p.lowered.tape.steps.size()); ++s) {
    run_step(p, s, batch, step_seed);
    if (listener && !p.grads_written[static_cast<size_t>(s)].empty()) {
      listener->on_gradients(p.grads_written[static_cast<size_t>(s)]);
    }
  }
}

void Executor::run_step(const Program& p, int s, const HostBatch& batch, uint64_t step_seed) {
  const TapeStep& step = p.lowered.tape.steps[static_cast<size_t>(s)];
  const StepBinding& b = p.lowered.bindings[static_cast<size_t>(s)];
  Stream& compute = device_.stream(StreamKind::kCompute);
  Kernels& k = device_.kernels();
  switch (step.phase) {
    case StepPhase::kLoad: {
      Stream& h2d = device_.stream(StreamKind::kHostToDevice);
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
          p.lowered.tape.tensors[static_cast<size_t>(b.accumulate_into)].bytes / sizeof(float));
      k.launch(Accumulate{n, static_cast<const float*>(tensor_address(p, b.accumulate_from, s)),
                          static_cast<float*>(tensor_address(p, b.accumulate_into, s))},
               compute);
      return;
    }
    case StepPhase::kUpdate: return;  // the optimizer runs after gradients are reduced
    case StepPhase::kForward:
    case StepPhase::kBackward: break;
  }
  const Node& node = p.graph.nodes()[static_cast<size_t>(step.node)];
  OpIo io;
  const auto fill = [&](const std::vector<int>& slots, std::vector<void*>& out) {
    out.clear();
    for (int slot : slots) out.push_back(slot_address(p, slot, s));
  };
  fill(b.inputs, io.inputs);
  fill(b.outputs, io.outputs);
  fill(b.params, io.params);
  fill(b.buffers, io.buffers);
  fill(b.aux, io.aux);
  io.training = p.lowered.training;
  io.seed = counter_hash(step_seed, static_cast<uint64_t>(step.node));
  if (b.workspace >= 0) {
    io.ws = {tensor_address(p, b.workspace, s),
             p.lowered.tape.tensors[static_cast<size_t>(b.workspace)].bytes};
  }
  if (step.phase == StepPhase::kForward) {
    node.op->forward(k, compute, io);
    return;
  }
  fill(b.grad_outputs, io.grad_outputs);
  fill(b.grad_inputs, io.grad_inputs);
  io.grad_params.clear();
  for (int slot : b.grad_params) io.grad_params.push_back(store_.grad_address(p.graph, persistent_id(slot)));
  node.op->backward(k, compute, io);
}

std::vector<std::byte> Executor::read_activation(const std::string& name) {
  FERRY_ASSERT(last_ != nullptr, "read_activation before any step");
  const Tape& tape = last_->lowered.tape;
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
  return host_metrics_;
}

}  // namespace ferry
