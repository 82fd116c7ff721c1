// The subcommands behind `trainer`. Each returns the process exit code; errors a user can fix
// are thrown as typed errors and reported by report_error().
#pragma once

#include <string>
#include <vector>

#include "comm/ranks.h"
#include "common/error.h"

namespace ferry {

struct TrainArgs {
  std::string config;
  std::vector<std::string> overrides;
};

struct PlanArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string policy;    // "" = memory.policy, "all" = every policy
  std::string hardware;  // a hardware profile's cost model instead of the config's
  int gpus = 0;          // ranks sharing the topology's links (0, not given: one per GPU)
  int ranks = 1;         // data-parallel ranks the model state is planned for (memory.zero)
  bool max_batch = false;
  bool json = false;
  bool explain = false;  // list what fills the arena at each plan's fullest step
  // Time the model on this machine's device (the default when the backend is cuda and a GPU
  // is present) / never (keep the FLOP model).
  bool measure = false;
  bool no_measure = false;
};

struct SimulateArgs {
  std::string config;
  std::vector<std::string> overrides;
  std::string topology;   // "" = topology.file
  int gpus = 0;           // 0 (not given) = every GPU of the topology
  int nodes = 1;          // identical nodes of the job, all-reduced over their NICs
  std::string hardware;   // "" = the config's cost model
  std::string scheduler;  // "" = topology.scheduler
  double chunk_mb = 0;    // 0: topology.chunk_mb (given: [0.0625, 1024], checked by the CLI)
  std::string planning;   // "", "aware" or "oblivious"
  bool json = false;
  std::string trace;     // Chrome trace file, "" = none
  std::string emulated;  // a traced run directory of the CPU emulation, "" = none
  std::string shapes;    // "SIZE[:WEIGHT],..." input shapes to average over, "" = the config's
  std::string mix;       // a mix file of jobs sharing one GPU (instead of CONFIG), "" = none
};

struct InfoArgs {
  std::string model;
  int64_t classes = 0;  // 0 (not given) = the model's
  std::string input;    // "C,H,W"
  bool json = false;
};

struct ExportArgs {
  std::string checkpoint;
  std::string out_dir;
  std::string tokenizer;  // a folder of tokenizer files to copy, "" = none
};

struct JobsArgs {
  bool json = false;
};

int run_train(const TrainArgs& args, const RankInfo& ranks);
int run_eval(const TrainArgs& args);
int run_plan(const PlanArgs& args);
int run_simulate(const SimulateArgs& args);
// `trainer simulate --mix FILE` (run_simulate calls it when args.mix is given).
int run_simulate_mix(const SimulateArgs& args);
int run_info(const InfoArgs& args);
// `trainer export CHECKPOINT OUT_DIR` (export.cc).
int run_export(const ExportArgs& args);
// Prints the node's job ledger: the GPUs ferry jobs share (memory.share) and their jobs.
int run_jobs(const JobsArgs& args);
int run_config(const TrainArgs& args, bool reference);

// Prints "error: WHAT" and, when the error has one, "hint: HINT" to stderr; returns `code`.
int report_error(const Error& e, int code);

}  // namespace ferry
