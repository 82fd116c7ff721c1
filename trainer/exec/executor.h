// The executor: runs steps by following a program's plan (Note [Executing a plan] in
// executor.cc). Invariant: the host never waits inside a step; every ordering is a stream waiting
// on an event (Note [What the executor runs]).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/host_pool.h"
#include "prefetch/plan.h"
#include "prefetch/transfer_engine.h"
#include "trainer/exec/metrics_ring.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/exec/program.h"
#include "trainer/exec/trace.h"
#include "trainer/model/graph.h"

namespace ferry {

// Note [What the executor runs]
// The executor: runs steps by following a program's plan (Note [Executing a plan] in
// executor.cc): kernels on the compute stream, offloads on the device-to-host stream after their
// producer's event, device space reused only after the copy's event, prefetches on the
// host-to-device stream, compute waiting on the prefetch's event. Programs are planned once per
// (input shape, mode, budget) (program.h), ahead of the step that needs them when asked to
// (prepare()); one arena, as large as the largest plan used at the current budget, serves them
// all. The host never waits inside a step; it reads the staged losses when it asks
// (metrics_ring.h).

// Note [Life of an offloaded activation]
// One saved activation, say the output of a convolution that its backward reads, from the config
// to the backward kernel. Each place on the way cites this note with its step number.
//  1. Config: memory.policy, memory.budget and memory.recompute (MemoryConfig, config.h) become
//     PlanOptions (plan_options, trainer/configured/options.h); topology.scheduler picks the
//     LinkScheduler in ExecutorOptions (fifo, or topology) and the rank's link arbiter on its
//     device.
//  2. Plan: run() (train.cc) asks the executor for its program before the first step (and, with
//     data.scales, for the next batches' shapes in the background: Note [Planning ahead] in
//     program.cc); the
//     ProgramCache (program.h) lowers the graph to a tape (Note [Three ids of a tensor],
//     lower.h) and plan_memory (prefetch/planner.cc) decides kOffload for the tensor and its
//     OffloadTiming (prefetch/plan.h): offload_after, release_at, fetch_at, needed_at. The
//     tensor gets two residency stretches at arena offsets: [written, release_at - 1] and
//     [fetch_at, last use].
//  3. Executor: ProgramCache::index_plan turns the four steps into per-step lists and gives
//     the tensor a ResidentTensor (device/residency.h) and a pinned host copy. Each step,
//     after_step(offload_after) records the producer's event and asks the transfer engine to
//     offload, with release_at as the deadline step and its planned seconds away
//     (Program::planned_start).
//  4. Transfer engine: TransferEngine::offload (prefetch/transfer_engine.h) makes the
//     TransferRequest (direction, bytes, deadline), calls the LinkScheduler around the copy and
//     asks it for the CopyDeadline (device/copy_deadline.h) the copy will carry.
//  5. Deadline: under `topology`, DeadlineLinkScheduler (prefetch/link_scheduler.h) makes it
//     scheduled, with the request's planned seconds; under `fifo` it is unscheduled, and the
//     copy streams alone order copies. The deadline goes with the copy as an argument from
//     here on (ResidentTensor::offload, Device::copy_async, the arbiter's enqueue).
//  6. Device copy: ResidentTensor::offload (device/residency.h) makes the device-to-host stream
//     wait for the producer's event and enqueues Device::copy_async with the deadline
//     (on_device -> offloading). The device's copy hook (CopyPacer on the CPU, CopyGate on
//     CUDA), which the rank's link arbiter implements (the CPU LinkEmulator or the CUDA
//     LinkGatekeeper), receives the copy with its deadline and moves a scheduled one in chunks
//     that cross the node's links least deadline slack first (links/arbiter_policy.h). The
//     copy's event fires; before_step(release_at) has made compute wait for it, and from
//     release_at on the first stretch's space holds other tensors (offloading -> on_host once
//     observed).
//  7. Prefetch: before_step(fetch_at) makes the host-to-device stream wait for compute to end
//     step fetch_at - 1 (the second stretch is free) and asks the transfer engine to prefetch
//     with needed_at as the deadline step; steps 4-6 again in the other direction
//     (on_host -> prefetching -> on_device).
//  8. Backward kernel: before_step(needed_at) makes compute wait for the prefetch's event;
//     run_step binds the second stretch's address into the op's OpIo and calls its backward.
//     The next training step offloads the tensor again; its copy is ordered after this fetch
//     on the device, without a host wait.
// memory.optimizer host's gradient and weight copies take steps 4-6 as well, through the same
// engine and scheduler (Note [Host copies on the links] in trainer/optim/model_state_step.h).

// One batch in pinned host memory, uploaded byte for byte into the graph's input and labels
// tensors (their sizes come from the graph; Note [Sample layout] in trainer/data/dataset.h).
struct HostBatch {
  const void* input = nullptr;      // float (N, C, H, W) images, or int32 (N, T) tokens
  const int32_t* labels = nullptr;  // (N) classes, or (N, T) next tokens
  int64_t n = 0;
  // The input's full shape, (n, C, H, W) or (n, T): selects the program (data.scales, and
  // data.documents' lengths). Empty: the configured input shape with n rows.
  Shape shape;
  // Packed documents: (n, T) segment starts, uploaded into the graph's segments tensor (Note
  // [Segments of a packed row] in device/kernels.h); null for any other graph.
  const int32_t* segments = nullptr;
  // What the loss's sum is divided by (Note [The mean over real tokens] in
  // trainer/data/documents.h); 0: the loss's rows (every label counts).
  float loss_divisor = 0.0f;
};

// Told, as backward is enqueued, which parameters' gradients each step has written
// (indices into ParameterStore::params()), so gradient buckets can start reducing.
class GradientListener {
 public:
  virtual ~GradientListener() = default;
  virtual void on_gradients(std::span<const size_t> params) = 0;
  // Before step `step` of `program` is enqueued: work the step must come after may be ordered
  // here (memory.zero 2's staging reuse, Note [Gradients through a staging ring]).
  virtual void before_step(const Program& /*program*/, int /*step*/) {}
  // Where backward writes parameter `param`'s gradient in `program`; null: the store's block.
  virtual float* gradient_address(const Program& /*program*/, size_t /*param*/) { return nullptr; }
};

struct ExecutorOptions {
  PlanOptions plan;  // policy, budget, recompute, cost model
  // Input shapes that change per step: one static plan (memory.per_shape false), named errors.
  ProgramCache::ShapeOptions shapes;
  // Decides when each offload or prefetch may start (topology.scheduler); nullptr = fifo.
  std::function<std::unique_ptr<LinkScheduler>()> scheduler;
  uint64_t host_limit = 0;  // pinned host pool cap (memory.host_limit)
  bool poison = false;      // memory.debug_poison: NaN-fill device space not resident
  uint64_t seed = 0;        // run.seed: per-step randomness
  // memory.optimizer host: the batch goes up on compute, not behind the weight pieces on the
  // host-to-device stream (Note [Host copies on the links] in trainer/optim/model_state_step.h).
  bool load_on_compute = false;
  // The most steps staged between two drains (run.log_every): the pinned ring of Note [Metrics
  // without a host wait] (metrics_ring.h) is allocated for them when the executor is built,
  // never mid-run.
  size_t metrics_steps = 256;
};

class Executor {
 public:
  using GraphFactory = ferry::GraphFactory;

  // `shaped` builds the graph for input shapes other than the configured one (data.scales);
  // nullptr: only the configured shape.
  Executor(Device& device, ParameterStore& store, GraphFactory factory, ExecutorOptions options,
           ShapedGraphFactory shaped = nullptr);
  ~Executor();

  // The program for a batch size and mode, planned on first use (ConfigError when the plan
  // cannot meet the budget; OutOfMemoryError when the host pool cannot hold its offloads).
  const Program& program(int64_t batch, bool training);
  // The program for a full input shape (Note [Planning ahead] in program.cc).
  const Program& program(const Shape& input, bool training);
  // Plans `input` on a background thread unless planned already; never waits.
  void prepare(const Shape& input, bool training) { programs_.prepare(input, training); }
  bool ready(const Shape& input, bool training) const { return programs_.ready(input, training); }
  // The same within `budget` instead of the current budget (a shared device's next grant).
  void prepare(const Shape& input, bool training, uint64_t budget) {
    programs_.prepare(input, training, budget);
  }
  bool ready(const Shape& input, bool training, uint64_t budget) const {
    return programs_.ready(input, training, budget);
  }
  // Between steps: from now on programs are planned and found within `budget` device bytes.
  // When it changes, waits for the device (no work may still use the arena) and frees the
  // arena; the next step allocates its program's. Persistent state stays where it is (Note
  // [Following a shared budget] in trainer/share/budget.h).
  void set_budget(uint64_t budget);
  uint64_t budget() const { return programs_.budget(); }
  // `program`'s tape planned within `budget`, as a program of that budget would be, without
  // making one (ProgramCache::plan_within).
  MemoryPlan plan_within(const Program& program, uint64_t budget) const {
    return programs_.plan_within(program, budget);
  }
  // Called before the arena is allocated, with the device bytes this executor's device will
  // hold once it is (MemoryStats::held with the old arena released and the new one allocated:
  // DeviceHeap::held_after); it may throw to refuse. A job sharing its device tells its ledger
  // there, before the memory is taken.
  void on_arena_growth(std::function<void(uint64_t device_bytes)> listener) {
    arena_listener_ = std::move(listener);
  }
  // Programs that were not planned when first asked for (planned then, or waited for).
  int64_t plan_waits() const { return programs_.waits(); }
  // Every program used so far, in order of first use.
  std::vector<const Program*> programs() const { return programs_.programs(); }

  // Enqueues the upload, the forward pass and (training) the backward pass of one batch.
  // `step` seeds per-step randomness (dropout). Does not wait for the device.
  void enqueue(const HostBatch& batch, bool training, uint64_t step,
               GradientListener* listener = nullptr);

  // Waits for the last enqueued batch and returns its loss and correct count.
  StepMetrics read_metrics();

  // Note [Metrics without a host wait] (metrics_ring.h): stage_metrics enqueues, on the compute
  // stream, a copy of the last enqueued batch's loss and correct count into pinned host memory,
  // tagged `step`; it never blocks. drain_metrics waits for the compute stream once and returns
  // every step staged since the last drain, in order (and resolves a traced step's trace).
  // `grad_sq`, when not null, is a device scalar staged with them (the optimizer's gradient sum
  // of squares, StagedMetrics::grad_norm).
  void stage_metrics(uint64_t step, const float* grad_sq = nullptr);
  std::vector<StagedMetrics> drain_metrics();
  size_t staged_metrics() const { return metrics_.staged(); }
  // Steps the pinned ring holds without growing (at least ExecutorOptions::metrics_steps).
  size_t metrics_capacity() const { return metrics_.capacity(); }

  // Keeps the named activations alive to the end of each step, so read_activation() can
  // fetch them (tests, debugging). Call before the first program is planned.
  void keep_alive(std::vector<std::string> names) { programs_.keep_alive(std::move(names)); }
  // Host copy of a kept activation of the last enqueued batch. Synchronizes.
  std::vector<std::byte> read_activation(const std::string& name);

  // While set, every enqueued step's kernels, copies and device-memory curve are added to
  // `trace` (when its metrics are read). nullptr stops tracing.
  void set_trace(StepTrace* trace);
  const TransferStats& transfer_stats() const { return transfers_.stats(); }
  // The transfer engine, which the host optimizer's copies share with the offloads (Note [Host
  // copies on the links] in trainer/optim/model_state_step.h).
  TransferEngine& transfers() { return transfers_; }
  // A host steady_clock time (ns) on the trace's time axis (us), once a traced step has been
  // resolved: for spans measured on the host, such as all-reduces.
  double trace_time_us(int64_t steady_ns) const { return tracer_.time_us(steady_ns); }

  uint64_t arena_bytes() const { return arena_.bytes(); }
  HostPool& host_pool() { return host_pool_; }

 private:
  void ensure_arena(uint64_t bytes);
  void* tensor_address(const Program& p, int tape_tensor, int step) const;
  void* slot_address(const Program& p, int slot, int step) const;
  void before_step(Program& p, int s);
  // Planned seconds from the start of step `issued_before` to the start of `deadline_step`.
  static double deadline_s(const Program& p, int issued_before, int deadline_step);
  void run_step(const Program& p, int s, const HostBatch& batch, uint64_t step_seed,
                GradientListener* listener);
  void after_step(Program& p, int s);
  void poison(const Program& p, int tensor, const Residency& r);
  // NaN-fills `bytes` at `ptr` as `dtype` elements (bf16 NaN in each half of a bf16 tensor).
  void poison_bytes(void* ptr, uint64_t bytes, DType dtype);
  // The batch's input as the graph's input tensor holds it: as given, or narrowed to bf16 into
  // staged_input_ (Note [Which tensors are bf16] in trainer/model/precision.h).
  const void* input_bytes(const HostBatch& batch, const TensorDesc& desc);
  Event& step_event();

  // Destroyed in reverse order, after ~Executor has synchronized the device: the programs
  // give their host copies back before the host pool goes.
  Device& device_;
  ParameterStore& store_;
  ExecutorOptions options_;
  HostPool host_pool_;
  ProgramCache programs_;
  DeviceBuffer arena_;
  std::function<void(uint64_t)> arena_listener_;
  std::unique_ptr<Event> upload_done_;
  std::vector<uint16_t> staged_input_;          // a bf16 input's host bits, until upload_done_
  std::vector<std::unique_ptr<Event>> events_;  // recycled per-step events
  size_t next_event_ = 0;
  StepMetrics host_metrics_;
  MetricsRing metrics_;
  const Program* last_ = nullptr;
  TransferEngine transfers_;
  StepTracer tracer_;
};

}  // namespace ferry
