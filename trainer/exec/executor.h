// The executor: plans a model once per (batch size, mode), then runs steps by following the
// plan — kernels on the compute stream, the batch upload on the host-to-device stream, the
// compute stream waiting on the upload's event. The host never waits inside a step; it reads
// the loss after the step has been enqueued.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "device/device.h"
#include "prefetch/liveness.h"
#include "prefetch/plan.h"
#include "trainer/exec/lower.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/graph.h"

namespace ferry {

// One batch in pinned host memory.
struct HostBatch {
  const float* images = nullptr;   // (N, C, H, W)
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

// Everything planned for one input shape and mode.
struct Program {
  Graph graph;
  Lowered lowered;
  Liveness liveness;
  MemoryPlan plan;
  std::vector<std::vector<size_t>> grads_written;  // per tape step
};

struct StepMetrics {
  float loss = 0;
  int32_t correct = 0;
};

class Executor {
 public:
  using GraphFactory = std::function<Graph(int64_t batch)>;

  Executor(Device& device, ParameterStore& store, GraphFactory factory, PlanOptions plan,
           uint64_t seed);
  ~Executor();

  // The program for a batch size and mode, planned on first use.
  const Program& program(int64_t batch, bool training);

  // Enqueues the upload, the forward pass and (training) the backward pass of one batch.
  // `step` seeds per-step randomness (dropout). Does not wait for the device.
  void enqueue(const HostBatch& batch, bool training, uint64_t step,
               GradientListener* listener = nullptr);

  // Waits for the last enqueued batch and returns its loss and correct count.
  StepMetrics read_metrics();

  // Keeps the named activations alive to the end of each step, so read_activation() can
  // fetch them (tests, debugging). Call before the first program is planned.
  void keep_alive(std::vector<std::string> names) { keep_alive_ = std::move(names); }
  // Host copy of a kept activation of the last enqueued batch. Synchronizes.
  std::vector<std::byte> read_activation(const std::string& name);

  // Bytes of the activation arena currently allocated.
  uint64_t arena_bytes() const { return arena_.bytes(); }

 private:
  struct Key {
    int64_t batch;
    bool training;
    auto operator<=>(const Key&) const = default;
  };
  void ensure_arena(uint64_t bytes);
  void* tensor_address(const Program& p, int tape_tensor, int step) const;
  void* slot_address(const Program& p, int slot, int step) const;
  void run_step(const Program& p, int s, const HostBatch& batch, uint64_t step_seed);

  Device& device_;
  ParameterStore& store_;
  GraphFactory factory_;
  PlanOptions plan_options_;
  uint64_t seed_;
  std::map<Key, std::unique_ptr<Program>> programs_;
  DeviceBuffer arena_;
  std::unique_ptr<Event> upload_done_;
  std::vector<void*> persistent_;  // of the program being run: TensorId -> address
  StepMetrics host_metrics_;
  std::vector<std::string> keep_alive_;
  const Program* last_ = nullptr;
};

}  // namespace ferry
