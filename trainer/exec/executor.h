// The executor: plans a model once per (batch size, mode), then runs steps by following the
// plan (Note [Executing a plan] in executor.cc): kernels on the compute stream, offloads on the
// device-to-host stream after their producer's event, device space reused only after the
// copy's event, prefetches on the host-to-device stream, compute waiting on the prefetch's
// event. The host never waits inside a step; it reads the staged losses when it asks.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/host_pool.h"
#include "device/residency.h"
#include "prefetch/plan.h"
#include "prefetch/transfer_engine.h"
#include "trainer/exec/lower.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/exec/trace.h"
#include "trainer/model/graph.h"

namespace ferry {

// One batch in pinned host memory.
struct HostBatch {
  const float* images = nullptr;    // (N, C, H, W)
  const int32_t* labels = nullptr;  // (N)
  int64_t n = 0;
};

// Told, as backward is enqueued, which parameters' gradients each step has written
// (indices into ParameterStore::params()), so gradient buckets can start reducing.
class GradientListener {
 public:
  virtual ~GradientListener() = default;
  virtual void on_gradients(std::span<const size_t> params) = 0;
};

// An offloaded tensor's runtime state: its residency machine and its pinned host copy.
struct OffloadSlot {
  std::unique_ptr<ResidentTensor> residency;
  void* host = nullptr;
};

// Everything planned for one input shape and mode.
struct Program {
  Graph graph;
  Lowered lowered;  // the input tape and the OpIo bindings of its steps
  MemoryPlan plan;  // its own tape: the input tape plus recompute steps
  std::vector<std::vector<size_t>> grads_written;  // per planned step
  // Per planned step: offloaded tensors to release, fetch, wait for, and offload.
  std::vector<std::vector<int>> release_at, fetch_at, needed_at, offload_after;
  // Per planned step: tensors whose stretch ends there and are not offloaded (poison mode).
  std::vector<std::vector<int>> dies_at;
  // Per planned step (and one past the last): its planned start, seconds from the step's start
  // (cost model), for the transfers' deadlines.
  std::vector<double> planned_start;
  std::map<int, OffloadSlot> offloads;  // by tape tensor
  // Addresses resolved once, by TensorId: parameters, buffers and metrics; gradients of params.
  std::vector<void*> persistent;
  std::vector<float*> grads;
};

struct StepMetrics {
  float loss = 0;
  int32_t correct = 0;
};

// One step's metrics as staged by Executor::stage_metrics: the step it was tagged with.
struct StagedMetrics {
  uint64_t step = 0;
  float loss = 0;
  int32_t correct = 0;
};

struct ExecutorOptions {
  PlanOptions plan;  // policy, budget, recompute, cost model
  // Decides when each offload or prefetch may start (topology.scheduler); nullptr = fifo.
  std::function<std::unique_ptr<LinkScheduler>()> scheduler;
  uint64_t host_limit = 0;  // pinned host pool cap (memory.host_limit)
  bool poison = false;      // memory.debug_poison: NaN-fill device space not resident
  uint64_t seed = 0;        // run.seed: per-step randomness
  // The most steps staged between two drains (run.log_every): the pinned ring of Note [Metrics
  // without a host wait] is allocated for them when the executor is built, never mid-run.
  size_t metrics_steps = 256;
};

class Executor {
 public:
  using GraphFactory = std::function<Graph(int64_t batch)>;

  Executor(Device& device, ParameterStore& store, GraphFactory factory, ExecutorOptions options);
  ~Executor();

  // The program for a batch size and mode, planned on first use (ConfigError when the plan
  // cannot meet the budget; OutOfMemoryError when the host pool cannot hold its offloads).
  const Program& program(int64_t batch, bool training);

  // Enqueues the upload, the forward pass and (training) the backward pass of one batch.
  // `step` seeds per-step randomness (dropout). Does not wait for the device.
  void enqueue(const HostBatch& batch, bool training, uint64_t step,
               GradientListener* listener = nullptr);

  // Waits for the last enqueued batch and returns its loss and correct count.
  StepMetrics read_metrics();

  // Note [Metrics without a host wait] (executor.cc): stage_metrics enqueues, on the compute
  // stream, a copy of the last enqueued batch's loss and correct count into pinned host memory,
  // tagged `step`; it never blocks. drain_metrics waits for the compute stream once and returns
  // every step staged since the last drain, in order (and resolves a traced step's trace).
  void stage_metrics(uint64_t step);
  std::vector<StagedMetrics> drain_metrics();
  size_t staged_metrics() const { return staged_steps_.size(); }
  // Steps the pinned ring holds without growing (at least ExecutorOptions::metrics_steps).
  size_t metrics_capacity() const { return metric_chunks_.size() * kMetricsChunk; }

  // Keeps the named activations alive to the end of each step, so read_activation() can
  // fetch them (tests, debugging). Call before the first program is planned.
  void keep_alive(std::vector<std::string> names) { keep_alive_ = std::move(names); }
  // Host copy of a kept activation of the last enqueued batch. Synchronizes.
  std::vector<std::byte> read_activation(const std::string& name);

  // While set, every enqueued step's kernels, copies and device-memory curve are added to
  // `trace` (when its metrics are read). nullptr stops tracing.
  void set_trace(StepTrace* trace);
  const TransferStats& transfer_stats() const { return transfers_.stats(); }
  // A host steady_clock time (ns) on the trace's time axis (us), once a traced step has been
  // resolved: for spans measured on the host, such as all-reduces.
  double trace_time_us(int64_t steady_ns) const {
    return static_cast<double>(steady_ns - trace_host_origin_ns_) / 1000.0;
  }

  uint64_t arena_bytes() const { return arena_.bytes(); }
  HostPool& host_pool() { return host_pool_; }

 private:
  struct Key {
    int64_t batch;
    bool training;
    auto operator<=>(const Key&) const = default;
  };
  Program& planned(int64_t batch, bool training);
  void index_plan(Program& p);
  void ensure_arena(uint64_t bytes);
  void* tensor_address(const Program& p, int tape_tensor, int step) const;
  void* slot_address(const Program& p, int slot, int step) const;
  void before_step(Program& p, int s);
  // Planned seconds from the start of step `issued_before` to the start of `deadline_step`.
  static double deadline_s(const Program& p, int issued_before, int deadline_step);
  void run_step(const Program& p, int s, const HostBatch& batch, uint64_t step_seed);
  void after_step(Program& p, int s);
  void poison(const Program& p, int tensor, const Residency& r);
  Event& step_event();

  Device& device_;
  ParameterStore& store_;
  GraphFactory factory_;
  ExecutorOptions options_;
  HostPool host_pool_;
  std::map<Key, std::unique_ptr<Program>> programs_;
  DeviceBuffer arena_;
  std::unique_ptr<Event> upload_done_;
  std::vector<std::unique_ptr<Event>> events_;  // recycled per-step events
  size_t next_event_ = 0;
  StepMetrics host_metrics_;
  static constexpr size_t kMetricsChunk = 256;
  // Pinned chunks of kMetricsChunk StepMetrics each, filled in staging order; never moved, so
  // a copy in flight keeps its target. Allocated for options.metrics_steps at construction;
  // grown by a chunk (never by a wait) only when a caller stages more between drains.
  std::vector<StepMetrics*> metric_chunks_;
  std::vector<uint64_t> staged_steps_;
  std::vector<std::string> keep_alive_;
  const Program* last_ = nullptr;
  TransferEngine transfers_;
  // Tracing: the first traced step's origin, and the current step's marks until resolved.
  StepTrace* trace_ = nullptr;
  std::unique_ptr<Event> trace_origin_;
  int64_t trace_host_origin_ns_ = 0;  // steady_clock time of trace_origin_
  struct StepMark {
    std::string name;
    std::unique_ptr<Event> end;
    uint64_t device_bytes;
  };
  std::unique_ptr<Event> step_origin_;
  std::vector<StepMark> marks_;
  void resolve_trace();
};

}  // namespace ferry
