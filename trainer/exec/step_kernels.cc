// Recording a tape's launches.
#include "trainer/exec/step_kernels.h"

#include <cstdint>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/model/op.h"

namespace ferry {

namespace {

// A stream that never runs anything: ops only hand it to launch().
class NullStream : public Stream {
 public:
  StreamKind kind() const override { return StreamKind::kCompute; }
  void record(Event&) override {}
  void wait(Event&) override {}
  void synchronize() override {}
};

class RecordingKernels : public Kernels {
 public:
  explicit RecordingKernels(Kernels& real) : real_(real) {}
  bool supports(KernelKind kind, DType dtype) const override { return real_.supports(kind, dtype); }
  uint64_t workspace_bytes(const KernelArgs& args) override { return real_.workspace_bytes(args); }
  void launch(const KernelArgs& args, Stream&) override { launches_.push_back(args); }
  std::vector<KernelArgs> take() { return std::move(launches_); }

 private:
  Kernels& real_;
  std::vector<KernelArgs> launches_;
};

// A distinct non-null placeholder per bound slot, never dereferenced.
void* placeholder(int slot) {
  return reinterpret_cast<void*>((uintptr_t{1} << 44) + (static_cast<uintptr_t>(slot + 2) << 30));
}

void fill(const std::vector<int>& slots, std::vector<void*>& out) {
  out.clear();
  for (int slot : slots) out.push_back(slot == -1 ? nullptr : placeholder(slot));
}

}  // namespace

std::vector<std::vector<KernelArgs>> step_kernels(const Graph& graph, const Lowered& lowered,
                                                  Kernels& kernels,
                                                  const std::optional<KernelArgs>& update) {
  RecordingKernels rec(kernels);
  NullStream stream;
  std::vector<std::vector<KernelArgs>> out(lowered.tape.steps.size());
  for (size_t s = 0; s < lowered.tape.steps.size(); ++s) {
    const TapeStep& step = lowered.tape.steps[s];
    const StepBinding& b = lowered.bindings[s];
    switch (step.phase) {
      case StepPhase::kLoad:
        continue;
      case StepPhase::kUpdate:
        if (update) out[s].push_back(*update);
        continue;
      case StepPhase::kAccumulate: {
        const TapeTensor& into = lowered.tape.tensors[b.accumulate_into];
        const int64_t n = static_cast<int64_t>(into.bytes / dtype_size(into.dtype));
        out[s].push_back(Accumulate{n, static_cast<const float*>(placeholder(b.accumulate_from)),
                                    static_cast<float*>(placeholder(b.accumulate_into)),
                                    into.dtype});
        continue;
      }
      case StepPhase::kForward:
      case StepPhase::kBackward:
      case StepPhase::kRecompute:
        break;
    }
    const Node& node = graph.nodes()[step.node];
    OpIo io;
    fill(b.inputs, io.inputs);
    fill(b.outputs, io.outputs);
    fill(b.params, io.params);
    // A bf16 step's products read the weights' bf16 working copy: a placeholder of its own.
    if (b.dtype == DType::kBF16) {
      for (int slot : b.params) io.working.push_back(placeholder(slot - (1 << 12)));
    }
    io.dtype = b.dtype;
    fill(b.buffers, io.buffers);
    fill(b.aux, io.aux);
    io.training = lowered.training;
    if (b.workspace >= 0) {
      io.ws = {placeholder(b.workspace), lowered.tape.tensors[b.workspace].bytes};
    }
    if (step.phase == StepPhase::kBackward) {
      fill(b.grad_outputs, io.grad_outputs);
      fill(b.grad_inputs, io.grad_inputs);
      fill(b.grad_params, io.grad_params);
      node.op->backward(rec, stream, io);
    } else {
      node.op->forward(rec, stream, io);
    }
    out[s] = rec.take();
  }
  return out;
}

std::string missing_bf16_kernel(const Graph& graph, const Lowered& lowered, Kernels& kernels) {
  const std::vector<std::vector<KernelArgs>> launches =
      step_kernels(graph, lowered, kernels, std::nullopt);
  for (size_t s = 0; s < launches.size(); ++s) {
    if (lowered.bindings[s].dtype != DType::kBF16) continue;
    for (const KernelArgs& args : launches[s]) {
      if (std::holds_alternative<CopyDevice>(args)) continue;
      if (!kernels.supports(args.index(), DType::kBF16)) return std::string(kernel_name(args));
    }
  }
  return {};
}

void check_bf16_kernels(const Graph& graph, const Lowered& lowered, Kernels& kernels,
                        std::string_view model, Backend backend) {
  const std::string missing = missing_bf16_kernel(graph, lowered, kernels);
  if (missing.empty()) return;
  throw ConfigError(fmt::format("device.precision: bf16 needs a bf16 {} kernel for model '{}', "
                                "which the {} backend does not have yet",
                                missing, model, backend_name(backend)),
                    "set device.precision=fp32 for this model");
}

}  // namespace ferry
