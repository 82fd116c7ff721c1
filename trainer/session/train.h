// The training and evaluation loops. train() reads like the pseudocode of a step: next batch,
// forward and backward, reduce gradients, update, then diagnostics and checkpoints.
#pragma once

#include <cstdint>
#include <string>

#include "comm/ranks.h"
#include "trainer/config/config.h"

namespace ferry {

struct TrainResult {
  int64_t steps = 0;
  double first_loss = 0;
  double last_loss = 0;
  uint64_t device_peak_bytes = 0;
  // Host waits on device work made by steps that neither log, checkpoint nor trace: 0
  // (Note [No host wait inside a step] in train.cc).
  uint64_t unlogged_step_host_waits = 0;
  // Input shapes the run saw (data.scales: one per side; a kept partial batch adds one), and
  // the steps that waited for their shape's plan (Note [Planning ahead] in program.cc).
  int64_t shapes = 0;
  int64_t plan_waited_steps = 0;
  // Batches dropped because no plan of their shape fits memory.budget (memory.oversize skip).
  int64_t oversize_skipped = 0;
  // Gradient reductions run (one per update, optim.accumulate or not) and the all-reduce
  // collectives they launched (Note [Accumulating micro-batches] in accumulation.h).
  int64_t gradient_reductions = 0;
  int64_t allreduce_calls = 0;
};

// Trains as `config` says on this rank of the job, writing (rank 0) <run.dir>/config.yaml,
// metrics.jsonl and checkpoints, and (every rank) rank<R>.log. Under MPI a failure on any rank
// ends the whole job (comm/fault.h) and does not return.
TrainResult train(const Config& config, const RankInfo& ranks);

// Note [Saying when the prediction is off]
// The end of a run compares the planner's predicted step with the measured one. Off by more
// than 2x either way, the run says so in one line with the likely cause (issue 27 item 8):
// timings cached from a cold or busy first measurement, a FLOP model's device rate that does
// not fit this device, or a machine busy while training. Empty within 2x (or nothing measured).
std::string timing_mismatch(double predicted_s, double measured_s, bool measured_cost_model,
                            const std::string& cache_path);

struct EvalResult {
  double loss = 0;
  double accuracy = 0;       // top-1
  double top5_accuracy = 0;  // the label among the 5 largest logits (image models)
  int64_t samples = 0;       // images, or token windows
  int64_t tokens = 0;        // token models: the predictions scored (windows x T)
  double perplexity = 0;     // token models: exp(loss)
};

// Loss, top-1 and top-5 accuracy over one pass of the configured dataset (an image folder:
// data.val_path, else data.path, with the evaluation transform), with the weights of
// model.init_from (or the newest checkpoint in checkpoint.dir); written to
// <run.dir>/eval.json. One process.
EvalResult evaluate(const Config& config);

}  // namespace ferry
