// `trainer simulate` and contention-aware planning: one config planned per GPU of a described
// server as training plans it, run on the node simulator's virtual clock at a hardware profile's
// compute and link rates. Invariant: the same config and options give the same report, bit for bit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "prefetch/plan.h"
#include "sim/node_sim.h"
#include "trainer/config/config.h"
#include "trainer/plan/assumed_link.h"
#include "trainer/plan/planning.h"
#include "trainer/plan/server.h"
#include "trainer/plan/shape_schedule.h"
#include "trainer/simulate/model_state_traffic.h"

namespace ferry {

// What every simulated scenario takes (one config, or a mix of jobs): the server, its rates and
// how its links are scheduled.
struct ServerOptions {
  std::string topology_file;  // "" = topology.file (a mix: the first job's)
  std::string hardware;       // "" = the config's own cost model
  std::string scheduler;      // "" = topology.scheduler (a mix: the first job's, for every job)
  // Plan contention-aware (true) or oblivious (false) whatever the scheduler; unset: auto under
  // the topology scheduler plans contention-aware, everything else oblivious.
  std::optional<bool> contention_aware;
  uint64_t chunk_bytes = 0;  // 0 = topology.chunk_mb (a mix: the first job's)
};

// One config on a server (`trainer simulate CONFIG`).
struct SimulateOptions : ServerOptions {
  int gpus = 0;   // 0 = every GPU of the topology
  int nodes = 1;  // identical nodes of the job (Note [Rings across nodes])
  bool trace = false;
  // The CPU emulation of this config as `trainer train` ran it in this run directory (with
  // run.trace): each rank's step times from its trace_rank<r>.json (mean over the traced steps),
  // the links as the emulation's ledger has them (raw rate / topology.emulation_scale,
  // topology.duplex_factor on every link), the all-reduce off the links (MPI through host
  // memory; its time is inside the traced update step), and each step's input batch uploaded
  // over the rank's path as the executor does; gpus 0 = the ranks that traced. "" = a described
  // server.
  std::string emulated_run;
  // The input shapes to average the step over, `SIZE[:WEIGHT],...` (image sides or tokens per
  // row: parse_shape_schedule); "" = what the config's loader draws (shape_schedule).
  std::string shapes;
};

// One shape of the schedule, planned (rank 0's plan) and simulated.
struct ShapeSimulation {
  ScheduledShape shape;
  uint64_t peak_bytes = 0, offload_bytes = 0;
  double recompute_flops = 0;
  Prediction planned;  // the planner's own prediction of rank 0's step
  NodeSimResult result;
  double samples_per_s = 0;
};

// Note [Simulating a shape schedule]
// Each shape of the schedule is planned exactly (per rank, as training plans it: a plan per
// shape, or under memory.per_shape false the largest shape's decisions for all) and its step
// simulated alone; the report's step, stall, copies and link bytes are the means over the
// schedule, each shape weighted by how often it is drawn, and its peak the largest.
struct SimulationReport {
  std::string topology, hardware, scheduler;
  std::string precision, comm_dtype;  // device.precision, comm.dtype
  DTypeBytes tensor_bytes;            // rank 0's tape of the largest shape, by dtype
  MemoryPolicy policy = MemoryPolicy::kNone;
  int64_t batch = 0;                 // per GPU
  int nodes = 1;                     // samples_per_s counts every node's GPUs
  std::vector<AssumedLink> assumed;  // per rank
  std::vector<std::string> link_kinds;
  uint64_t peak_bytes = 0;     // rank 0's plans: the largest peak
  uint64_t offload_bytes = 0;  // rank 0's plans: mean over the schedule
  double recompute_flops = 0;  // rank 0's plans: mean over the schedule
  Prediction planned;        // rank 0's plans as the planner's own cost model predicts them (mean)
  NodeSimInput input;        // the largest shape's (what --trace shows)
  NodeSimResult result;      // means over the schedule; spans and samples of the largest shape
  double samples_per_s = 0;  // rows per second at the mean step
  std::string schedule;      // where the shapes come from, in words
  bool per_shape = true;     // memory.per_shape
  std::vector<ShapeSimulation> shapes;  // in schedule order
  // memory.zero and memory.optimizer for the job's ranks (auto resolved as training resolves it)
  // and what they move per rank and step (Note [Model state on the node] in sim/node_sim.h).
  ModelStateTraffic model_state;
  // The device optimizer's update per rank and step (Note [The device update's cost] in
  // model_state_traffic.h): bytes streamed and the seconds added to its launch cost at
  // memory_gbps; 0 under the host optimizer and for an emulation (its update was measured).
  uint64_t device_update_bytes = 0;
  double device_update_seconds = 0;
  double memory_gbps = 0;
};

// One GPU's step of `plan` for the node simulator: each tape step's time under `cost`, the plan's
// copies, and `path`, the links those copies cross; with `names`, each step's name for a trace.
SimRank simulated_rank(const MemoryPlan& plan, const CostModel& cost, const std::vector<int>& path,
                       const std::string& name, bool names);

// Plans each rank's step for every shape of the schedule and simulates one step of the node
// per shape. ConfigError when a plan does not fit memory.budget (as training would).
SimulationReport simulate_config(const Config& config, const SimulateOptions& options);

}  // namespace ferry
