// `trainer simulate --mix`: the jobs of a mix file sharing one GPU of a described server over
// time, under three rules (Note [Simulating jobs that share a GPU]). Invariant: the same mix and
// options give the same report, bit for bit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "jobs/share_controller.h"
#include "trainer/share/lease.h"
#include "trainer/simulate/job_mix.h"
#include "trainer/simulate/simulation.h"

namespace ferry {

// Note [Simulating jobs that share a GPU]
// Three rules: memory.share's division of the GPU's memory, a static equal split of it, and one
// job after another. Under sharing each phase's budgets are divide_memory's shares of the jobs
// present, from the ladders memory.share registers.
// Time advances in phases, from one arrival or completion to the next. Within a phase the jobs
// running and their budgets are fixed, each job's step takes the time the co-running model below
// gives, and each job makes 1 / step steps per second (a phase may end within a step).
//  - share (memory.share): at each arrival and completion the GPU's memory is divided again by
//    the controller (divide_memory, jobs/share_controller.h) among the jobs present, in arrival
//    order, from each job's ladder as a job sharing its device registers it (share_curve: its
//    lower bound, its peak at most its memory.budget, and the planner's predicted step between);
//    a job not admitted waits. A job runs the plan of its share from that instant: planning
//    ahead and the switch (one wait for the device, a new arena) are not simulated.
//  - static: every job's budget is the GPU's memory / the number of jobs in the mix (its peak
//    when that is less), from arrival to completion; a job whose plan does not fit its equal
//    share cannot run. When one cannot, a fourth arm runs memory.share over the jobs static can
//    run, so that the two are compared over the same jobs.
//  - sequential: one job at a time in arrival order, each alone with the whole GPU (its peak, at
//    most the GPU's memory); a job that arrives while another runs queues.
// Co-running: the jobs running share the GPU's compute as processor sharing (Note [One GPU's
// compute shared by jobs] in sim/node_sim.h): the k jobs computing at an instant each run at 1/k
// of its speed, and a job waiting for its copies hands its share to the others; their copies
// share the GPU's link max-min fairly, one stream per direction per job, as the node simulator
// shares any link (under the topology scheduler, chunks granted by least laxity). Each job's tape
// is repeated so that the job with the most work per step runs kLongestRepeats steps and the
// others about as long (at most kMaxRepeats steps), and a job's step is the mean of its repeats
// that ended before the first job ran out of them (so that no job's figure includes a tail where
// fewer jobs ran). A lone job's step is `trainer simulate` of its config at the same budget.
// Left out: kernels of several jobs side by side (MPS) and whatever a job's kernels leave idle;
// context switches; the first step's costs; the host memory of offloaded bytes; planning ahead
// and the switch between plans; the time a shrinking job takes to confirm before a growing one
// may use the memory.
// Every job runs on the first GPU of the server's topology.
struct MixOptions : ServerOptions {
  static constexpr int kLongestRepeats = 4;
  static constexpr int kMaxRepeats = 256;
};

struct MixJob {
  std::string name, config, model;
  int64_t batch = 0;
  double arrive_s = 0;
  int64_t steps = 0;
  ShareCurve curve;         // what the job registers under memory.share
  double alone_step_s = 0;  // simulated alone at its peak (at most the GPU's memory)
  uint64_t alone_budget = 0;
};

struct MixRun {
  size_t job = 0;
  uint64_t budget = 0;
  double step_s = 0;  // co-running
};

struct MixPhase {
  double begin_s = 0, end_s = 0;
  std::vector<MixRun> running;
  std::vector<size_t> waiting;  // present, not admitted (share) or queued (sequential)
};

struct MixOutcome {
  bool ran = false;
  std::string why;  // why it did not run
  double start_s = 0, finish_s = 0;
  double completion_s = 0;  // finish - arrival
};

struct MixArm {
  std::string name;              // share, static, sequential, share-static-jobs
  std::string rule;              // in words
  std::vector<MixOutcome> jobs;  // per job of the mix
  std::vector<MixPhase> phases;  // consecutive equal phases merged
  double makespan_s = 0;         // the first arrival to the last completion, of those that ran
  double samples_per_s = 0;      // their samples over the makespan
};

struct MixReport {
  std::string file, topology, hardware, scheduler;
  uint64_t memory = 0;
  ShareObjective objective = ShareObjective::kThroughput;
  std::vector<MixJob> jobs;
  std::vector<MixArm> arms;  // share, static, sequential[, share-static-jobs]
};

// Plans every job, divides and simulates. ConfigError (exit 2) for a job whose config does not
// load, that changes shape per step, or whose lower bound exceeds the GPU's memory.
MixReport simulate_mix(const MixSpec& mix, const MixOptions& options);

}  // namespace ferry
