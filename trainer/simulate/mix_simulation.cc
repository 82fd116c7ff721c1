// The job mix on one simulated GPU (Note [Simulating jobs that share a GPU] in
// mix_simulation.h): each job's plans and ladder, the co-running step model, and the phases of
// each arm.
#include "trainer/simulate/mix_simulation.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "trainer/config/enums.h"
#include "trainer/plan/planning.h"
#include "trainer/plan/shape_schedule.h"
#include "trainer/simulate/model_state_traffic.h"
#include "trainer/simulate/simulation.h"

namespace ferry {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One job's planner on the shared GPU: plans and simulated steps per budget, cached.
class JobModel {
 public:
  JobModel(const Config& config, const Server& server, const MixOptions& o)
      : config_(config), planner_(config) {
    cost_ = server.profile ? profile_cost(*server.profile, config.device.precision)
                           : cost_model(config);
    // As simulate_config plans rank 0: contention-aware under the topology scheduler with auto.
    std::optional<bool> aware = o.contention_aware;
    if (!aware && config.topology.scheduler == LinkSchedulerKind::kTopology &&
        config.memory.policy == MemoryPolicy::kAuto)
      aware = true;
    const AssumedLink a = assumed_link(config, server.links, 0, aware);
    CostModel c = cost_;
    c.link_gbps = a.gbps;
    planner_.set_cost(c);
    planner_.set_contention_aware(a.contention_aware);
    path_ = server.links.paths.at(0);
  }

  // The plan within `budget` (0: unlimited); ConfigError when it does not fit. A budget that
  // holds the unconstrained plan runs it (the planner's lower bound may exceed that plan's peak,
  // and then refuses a budget between the two).
  const MemoryPlan& plan(uint64_t budget) {
    if (budget > 0 && budget >= plan(0).peak_bytes()) budget = 0;
    auto it = plans_.find(budget);
    if (it == plans_.end())
      it = plans_
               .emplace(budget,
                        planner_.plan_at(config_.memory.policy, config_.data.batch_size, budget))
               .first;
    return it->second;
  }
  bool fits(uint64_t budget) {
    try {
      plan(budget);
      return true;
    } catch (const ConfigError&) {
      return false;
    }
  }
  // The GPU's step at `budget` for the node simulator.
  // Its update costed as simulate_config costs it (Note [The device update's cost]).
  SimRank rank(uint64_t budget) {
    std::vector<SimRank> one = {simulated_rank(plan(budget), cost_, path_, "job", false)};
    const ModelState& state = planner_.model_state();
    if (state.choice.optimizer == OptimizerPlacement::kDevice) {
      add_device_update(one, -1,
                        device_update_bytes(state, planner_.model_state_inputs().slots,
                                            config_.device.precision == Precision::kBf16),
                        cost_.memory_gbps);
    }
    return std::move(one.front());
  }
  const Config& config() const { return config_; }

 private:
  Config config_;
  OfflinePlanner planner_;
  CostModel cost_;  // the step times (the profile's, or the config's)
  std::vector<int> path_;
  std::map<uint64_t, MemoryPlan> plans_;
};

// `rank`'s tape `times` over, each copy issued and waited for at its own repeat's steps.
SimRank repeated(const SimRank& rank, int times) {
  SimRank out;
  out.name = rank.name;
  out.path = rank.path;
  const int n = static_cast<int>(rank.step_seconds.size());
  for (int t = 0; t < times; ++t) {
    out.step_seconds.insert(out.step_seconds.end(), rank.step_seconds.begin(),
                            rank.step_seconds.end());
    for (SimTransfer x : rank.transfers) {
      x.issue_after += t * n;  // -1 (at the start) becomes the previous repeat's last step
      if (x.wait_before >= 0) x.wait_before += t * n;
      out.transfers.push_back(x);
    }
  }
  return out;
}

using Running = std::vector<std::pair<size_t, uint64_t>>;  // (job, budget), in arrival order

class MixSimulator {
 public:
  MixSimulator(const MixSpec& mix, const MixOptions& o) {
    std::vector<Config> configs;
    for (size_t i = 0; i < mix.jobs.size(); ++i) {
      const MixJobSpec& spec = mix.jobs[i];
      const auto where = [&](const std::string& what) {
        return fmt::format("--mix {}: jobs[{}] ({}): {}", mix.file, i, spec.name, what);
      };
      try {
        Config c = load_config(spec.config, spec.overrides);
        if (shape_schedule(c).shapes.size() > 1)
          throw ConfigError("data.scales: a mix simulates one input shape per job",
                            "set data.scales=[] for this job");
        configs.push_back(std::move(c));
      } catch (const ConfigError& e) {
        throw ConfigError(where(e.what()), e.hint());
      }
    }
    const Config& first = configs.front();
    // One GPU: every job on the first GPU of the topology, one scheduler for its link.
    const std::string scheduler =
        o.scheduler.empty() ? std::string(to_string(first.topology.scheduler)) : o.scheduler;
    const auto kind = from_string<LinkSchedulerKind>(scheduler);
    if (!kind)
      throw ConfigError(fmt::format("--scheduler: unknown scheduler '{}'", scheduler),
                        "use fifo or topology");
    for (Config& c : configs) c.topology.scheduler = *kind;
    server_ = std::make_unique<Server>(load_server(first, o.topology_file, 1, o.hardware));
    capacity_ = mix.memory > 0 ? mix.memory : first.device.memory;
    report_.file = mix.file;
    report_.topology = server_->topology.name();
    report_.hardware = server_->profile ? server_->profile->name : "each config's cost model";
    report_.scheduler = scheduler;
    report_.memory = capacity_;
    report_.objective = mix.objective.value_or(first.memory.share_objective);
    topology_scheduler_ = scheduler == "topology";
    chunk_bytes_ = o.chunk_bytes > 0 ? o.chunk_bytes
                                     : static_cast<uint64_t>(first.topology.chunk_mb * 1048576.0);
    for (size_t i = 0; i < configs.size(); ++i) {
      const MixJobSpec& spec = mix.jobs[i];
      const auto where = [&](const std::string& what) {
        return fmt::format("--mix {}: jobs[{}] ({}): {}", mix.file, i, spec.name, what);
      };
      models_.push_back(std::make_unique<JobModel>(configs[i], *server_, o));
      JobModel& m = *models_.back();
      MixJob job;
      job.name = spec.name;
      job.config = spec.config;
      job.model = configs[i].model.name;
      job.batch = configs[i].data.batch_size;
      job.arrive_s = spec.arrive_s;
      job.steps = spec.steps > 0 ? spec.steps : configs[i].run.steps;
      try {
        job.curve = share_curve([&](uint64_t b) { return m.plan(b); }, configs[i].memory.budget);
      } catch (const ConfigError& e) {
        throw ConfigError(where(e.what()), e.hint());
      }
      if (job.curve.lower > capacity_)
        throw ConfigError(
            where(fmt::format("needs at least {} and the GPU holds {}",
                              format_bytes(job.curve.lower), format_bytes(capacity_))),
            "lower the job's data.batch_size, or raise the mix's memory");
      job.alone_budget = std::min(job.curve.peak, capacity_);
      report_.jobs.push_back(std::move(job));
    }
    for (size_t j = 0; j < report_.jobs.size(); ++j) {
      MixJob& job = report_.jobs[j];
      job.alone_step_s = steps({{j, job.alone_budget}}).at(0);
    }
  }

  MixReport run() {
    const size_t n = report_.jobs.size();
    std::vector<size_t> all(n);
    for (size_t j = 0; j < n; ++j) all[j] = j;
    report_.arms.push_back(arm(Rule::kShare, all));
    MixArm fixed = arm(Rule::kStatic, all);
    std::vector<size_t> runnable;
    for (size_t j = 0; j < n; ++j)
      if (fixed.jobs[j].ran) runnable.push_back(j);
    report_.arms.push_back(std::move(fixed));
    report_.arms.push_back(arm(Rule::kSequential, all));
    if (runnable.size() < n && !runnable.empty())
      report_.arms.push_back(arm(Rule::kShare, runnable));
    return std::move(report_);
  }

 private:
  enum class Rule { kShare, kStatic, kSequential };

  // Each running job's step under the co-running model (Note [Simulating jobs that share a GPU]):
  // the jobs' tapes repeated on one GPU's shared compute, each job's step the mean of its repeats
  // that ended before the first job ran out of repeats.
  const std::vector<double>& steps(const Running& running) {
    auto it = co_run_.find(running);
    if (it != co_run_.end()) return it->second;
    const size_t k = running.size();
    NodeSimInput in;
    in.links = server_->links.links;
    in.topology_scheduler = topology_scheduler_;
    in.chunk_bytes = chunk_bytes_;
    in.shared_compute = k > 1;
    std::vector<SimRank> ranks;
    std::vector<double> work;
    for (const auto& [job, budget] : running) {
      ranks.push_back(models_[job]->rank(budget));
      ranks.back().name = report_.jobs[job].name;
      double total = 0;
      for (double s : ranks.back().step_seconds) total += s;
      work.push_back(total);
    }
    const double longest = *std::max_element(work.begin(), work.end());
    std::vector<int> repeats;
    for (size_t r = 0; r < k; ++r) {
      const int times = k == 1 || !(work[r] > 0)
                            ? 1
                            : static_cast<int>(std::clamp(
                                  std::round(MixOptions::kLongestRepeats * longest / work[r]), 1.0,
                                  static_cast<double>(MixOptions::kMaxRepeats)));
      repeats.push_back(times);
      SimRank rank = times > 1 ? repeated(ranks[r], times) : std::move(ranks[r]);
      const int n = static_cast<int>(rank.step_seconds.size()) / times;
      for (int t = 1; t <= times && k > 1; ++t) rank.marks.push_back(t * n - 1);
      in.ranks.push_back(std::move(rank));
    }
    const NodeSimResult res = simulate_node(in);
    double first_done = kInf;
    for (const SimRankStats& r : res.ranks) first_done = std::min(first_done, r.step_seconds);
    std::vector<double> out;
    for (size_t r = 0; r < k; ++r) {
      const std::vector<double>& ends = res.ranks[r].mark_seconds;
      size_t whole = 0;
      while (whole < ends.size() && ends[whole] <= first_done) ++whole;
      out.push_back(whole > 0 ? ends[whole - 1] / static_cast<double>(whole)
                              : res.ranks[r].step_seconds / static_cast<double>(repeats[r]));
    }
    return co_run_.emplace(running, std::move(out)).first->second;
  }

  // Which present jobs run at which budget, and which wait.
  void decide(Rule rule, const std::vector<size_t>& present, uint64_t equal, Running& running,
              std::vector<size_t>& waiting) {
    if (rule == Rule::kSequential) {
      running.push_back({present.front(), report_.jobs[present.front()].alone_budget});
      waiting.assign(present.begin() + 1, present.end());
      return;
    }
    if (rule == Rule::kStatic) {
      for (size_t j : present) running.push_back({j, std::min(equal, report_.jobs[j].curve.peak)});
      return;
    }
    std::vector<ShareJob> share_jobs;
    for (size_t p = 0; p < present.size(); ++p) {
      const ShareCurve& c = report_.jobs[present[p]].curve;
      ShareJob s;
      s.curve = c;
      s.order = p;
      share_jobs.push_back(std::move(s));
    }
    const ShareDivision d = divide_memory(capacity_, share_jobs, report_.objective);
    for (size_t p = 0; p < present.size(); ++p) {
      if (d.jobs[p].waiting)
        waiting.push_back(present[p]);
      else
        running.push_back({present[p], d.jobs[p].share});
    }
  }

  MixArm arm(Rule rule, const std::vector<size_t>& members) {
    const size_t n = report_.jobs.size();
    MixArm out;
    const uint64_t equal = capacity_ / n;
    switch (rule) {
      case Rule::kShare:
        out.name = members.size() == n ? "share" : "share-static-jobs";
        out.rule = fmt::format(
            "memory.share: the GPU's {} divided by the controller ({}) at "
            "every arrival and completion{}",
            format_bytes(capacity_), share_objective_name(report_.objective),
            members.size() == n ? "" : ", over the jobs static can run");
        break;
      case Rule::kStatic:
        out.name = "static";
        out.rule = fmt::format(
            "a static equal split: memory.budget {} (the GPU's memory / {}) "
            "for every job",
            format_bytes(equal), n);
        break;
      case Rule::kSequential:
        out.name = "sequential";
        out.rule = "one job after another in arrival order, each alone with the whole GPU";
        break;
    }
    out.jobs.resize(n);
    std::vector<size_t> order = members;
    if (rule == Rule::kStatic) {
      order.clear();
      for (size_t j : members) {
        const MixJob& job = report_.jobs[j];
        if (models_[j]->fits(std::min(equal, job.curve.peak))) {
          order.push_back(j);
        } else {
          out.jobs[j].why = fmt::format("its lower bound {} exceeds its equal share {}",
                                        format_bytes(job.curve.lower), format_bytes(equal));
        }
      }
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return report_.jobs[a].arrive_s < report_.jobs[b].arrive_s;
    });
    if (order.empty()) return out;
    std::vector<double> left(n, 0);
    std::vector<bool> started(n, false), done(n, false);
    for (size_t j : order) left[j] = static_cast<double>(report_.jobs[j].steps);
    double now = report_.jobs[order.front()].arrive_s;
    const double first = now;
    for (size_t finished = 0; finished < order.size();) {
      std::vector<size_t> present;
      double next_arrival = kInf;
      for (size_t j : order) {
        if (done[j]) continue;
        if (report_.jobs[j].arrive_s <= now)
          present.push_back(j);
        else
          next_arrival = std::min(next_arrival, report_.jobs[j].arrive_s);
      }
      if (present.empty()) {
        now = next_arrival;
        continue;
      }
      Running running;
      std::vector<size_t> waiting;
      decide(rule, present, equal, running, waiting);
      // Every job's lower bound fits the GPU, so the first present job always runs.
      FERRY_ASSERT(!running.empty(), "a mix phase with no job running");
      const std::vector<double> step = steps(running);
      double until = next_arrival - now;
      size_t ends = running.size();
      for (size_t r = 0; r < running.size(); ++r) {
        const double t = left[running[r].first] * step[r];
        if (t < until) {
          until = t;
          ends = r;
        }
      }
      MixPhase phase;
      phase.begin_s = now;
      phase.end_s = now + until;
      phase.waiting = waiting;
      for (size_t r = 0; r < running.size(); ++r) {
        const size_t j = running[r].first;
        phase.running.push_back({j, running[r].second, step[r]});
        if (!started[j]) {
          started[j] = true;
          out.jobs[j].start_s = now;
        }
        left[j] = r == ends ? 0 : left[j] - until / step[r];
      }
      now += until;
      for (const MixRun& r : phase.running) {
        if (done[r.job] || left[r.job] > 1e-9) continue;
        done[r.job] = true;
        ++finished;
        MixOutcome& o = out.jobs[r.job];
        o.ran = true;
        o.finish_s = now;
        o.completion_s = now - report_.jobs[r.job].arrive_s;
      }
      merge(out.phases, std::move(phase));
    }
    double samples = 0;
    for (size_t j : order) {
      out.makespan_s = std::max(out.makespan_s, out.jobs[j].finish_s - first);
      samples += static_cast<double>(report_.jobs[j].batch * report_.jobs[j].steps);
    }
    out.samples_per_s = out.makespan_s > 0 ? samples / out.makespan_s : 0;
    return out;
  }

  // Appends `phase`, or extends the last phase when it ran the same jobs at the same budgets.
  static void merge(std::vector<MixPhase>& phases, MixPhase phase) {
    if (!phases.empty()) {
      MixPhase& last = phases.back();
      bool same = last.end_s == phase.begin_s && last.waiting == phase.waiting &&
                  last.running.size() == phase.running.size();
      for (size_t r = 0; same && r < phase.running.size(); ++r)
        same = last.running[r].job == phase.running[r].job &&
               last.running[r].budget == phase.running[r].budget;
      if (same) {
        last.end_s = phase.end_s;
        return;
      }
    }
    phases.push_back(std::move(phase));
  }

  std::unique_ptr<Server> server_;
  uint64_t capacity_ = 0;
  bool topology_scheduler_ = false;
  uint64_t chunk_bytes_ = 0;
  std::vector<std::unique_ptr<JobModel>> models_;
  std::map<Running, std::vector<double>> co_run_;
  MixReport report_;
};

}  // namespace

MixReport simulate_mix(const MixSpec& mix, const MixOptions& options) {
  return MixSimulator(mix, options).run();
}

}  // namespace ferry
