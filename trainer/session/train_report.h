// What a training run reports besides its progress lines: the start-up banner, the all-reduce
// spans of a traced step and the emulated links' usage. Rank 0 prints; every rank calls.
#pragma once

#include <vector>

#include "trainer/data/dataset.h"
#include "trainer/exec/trace.h"
#include "trainer/plan/shape_plans.h"
#include "trainer/session/rank_log.h"
#include "trainer/session/session.h"
#include "trainer/session/train.h"

namespace ferry {

// What this rank runs: ranks, placement, device, model, data, memory and the step's plan
// (collective: every node's bindings table reaches rank 0).
void print_banner(RankLog& log, Session& session, const Config& config, const Dataset& data,
                  const MemoryPlan& plan);

// The end-of-run comparison of the planner's predicted step time with the measured one, on the
// console and in <run.dir>/summary.json; `intervals` holds (steps, seconds) between drains of
// the metrics (Note [No host wait inside a step] in train.cc).
void report_timing(RankLog& log, Session& session, const Config& config, const MemoryPlan& plan,
                   const std::vector<std::pair<int64_t, double>>& intervals,
                   const TrainResult& result, const ShapePlans& shapes);

// "batch 8 per rank (16 global)", or under optim.accumulate "batch 8 per rank x 4 micro-batches
// x 2 ranks = 64 per update".
std::string batch_text(const Config& config, int ranks);

// Adds the last step's all-reduces to the trace, on the comm track.
void trace_reductions(Session& session, StepTrace& trace);

// The ledger's measurements: <run.dir>/links.json (links.<hostname>.json per node of a job over
// several nodes) and the busiest link on the console.
void write_link_usage(const Config& config, const RankInfo& ranks,
                      const std::vector<LinkUsage>& usage, RankLog& log);

}  // namespace ferry
