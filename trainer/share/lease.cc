// A job sharing its device: its ladder from the offline planner, its admission and its lease on
// the node's job ledger (jobs/job_ledger.h). Following the grant while training is
// budget.h's; until the first step the job reports its whole grant as held.
#include "trainer/share/lease.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include <fmt/format.h>

#include "common/bytes.h"
#include "device/backend_traits.h"
#include "trainer/plan/planning.h"

namespace ferry {

ShareCurve share_curve(const Config& config, int points) {
  OfflinePlanner planner(config);
  return share_curve(
      [&](uint64_t budget) {
        return planner.plan_at(config.memory.policy, config.data.batch_size, budget);
      },
      config.memory.budget, points);
}

ShareCurve share_curve(const std::function<MemoryPlan(uint64_t budget)>& plan_at, uint64_t cap,
                       int points) {
  // The predicted step time within `budget`, 0 when the policy cannot meet it.
  const auto step_at = [&](uint64_t budget) {
    try {
      return std::max(1e-9, plan_at(budget).prediction.step_seconds);
    } catch (const ConfigError&) {
      return 0.0;
    }
  };
  const MemoryPlan alone = plan_at(0);
  ShareCurve c;
  double peak_step = std::max(1e-9, alone.prediction.step_seconds);
  c.peak = alone.peak_bytes();
  if (cap > 0 && c.peak > cap) {
    c.peak = cap;
    peak_step = std::max(1e-9, plan_at(cap).prediction.step_seconds);  // or no fit
  }
  // The smallest budget the policy meets: the working-set bound, or found between it and the
  // peak (to within a 256th of the span).
  const uint64_t floor = std::min(alone.lower_bound, c.peak);
  if (step_at(floor) > 0) {
    c.lower = floor;
  } else {
    uint64_t bad = floor, good = c.peak;
    const uint64_t tolerance = std::max<uint64_t>(1, (good - bad) / 256);
    while (good - bad > tolerance) {
      const uint64_t mid = bad + (good - bad) / 2;
      (step_at(mid) > 0 ? good : bad) = mid;
    }
    c.lower = good;
  }
  const int n = std::max(points, 2);
  for (int k = 0; k < n; ++k) {
    const uint64_t budget =
        c.lower + (c.peak - c.lower) * static_cast<uint64_t>(k) / static_cast<uint64_t>(n - 1);
    if (!c.ladder.empty() && budget <= c.ladder.back().budget) continue;
    const double step = budget == c.peak ? peak_step : step_at(budget);
    if (step > 0) c.ladder.push_back({budget, step});
  }
  return c;
}

uint64_t share_reserve(const Config& config) {
  return config.memory.share ? backend_traits(config.device.backend).shared_granule : 0;
}

ShareCurve held_curve(ShareCurve curve, uint64_t reserve) {
  curve.lower += reserve;
  curve.peak += reserve;
  for (SharePoint& p : curve.ladder) p.budget += reserve;
  return curve;
}

std::string share_device_key(const Config& config, const RankInfo& ranks,
                             const std::optional<PciAddress>& gpu) {
  // A real GPU is keyed by its PCI bus id, an emulated device by the rank's local index.
  if (backend_traits(config.device.backend).real_gpus && gpu) {
    return fmt::format("{}:{}", to_string(config.device.backend), gpu->str());
  }
  return fmt::format("{}:{}", to_string(config.device.backend), ranks.local_rank);
}

std::string share_wait_message(const LedgerGpu& gpu, uint64_t id, uint64_t lower) {
  std::string text = fmt::format(
      "memory.share: waiting until {} (capacity {}) can hold this job's lower bound {}; it is "
      "held by",
      gpu.device, format_bytes(gpu.capacity), format_bytes(lower));
  int others = 0;
  for (const LedgerJob& j : gpu.jobs) {
    if (j.id == id) continue;
    text += fmt::format("{} job {} (pid {}, {}): share {}, granted {}, held {}",
                        others++ ? ";" : "", j.id, j.pid, j.config, format_bytes(j.share),
                        format_bytes(j.granted), format_bytes(j.held));
  }
  if (others == 0) text += " no other job";
  return text;
}

MemoryShareLease::MemoryShareLease(const Config& config, const RankInfo& ranks,
                                   const ShareCurve& curve,
                                   const std::function<void(const std::string&)>& say,
                                   const std::optional<PciAddress>& gpu_bus_id)
    : curve_(held_curve(curve, share_reserve(config))),
      cap_(config.memory.budget),
      reserve_(share_reserve(config)) {
  ledger_ = JobLedger::attach();
  JobRequest r;
  r.device = share_device_key(config, ranks, gpu_bus_id);
  r.capacity = config.device.memory;
  r.config = (std::filesystem::path(config.run.dir) / "config.yaml").string();
  r.run_dir = config.run.dir;
  r.rank = ranks.rank;
  r.curve = curve_;
  r.objective = config.memory.share_objective;
  grant_ = ledger_->join(r);  // Note [Life of a memory share], step 2
  const auto give_up = [&](const ConfigError& error) {
    ledger_->leave(grant_.id);
    throw error;
  };
  std::optional<LedgerGpu> gpu;
  for (LedgerGpu& g : ledger_->snapshot())
    if (g.device == r.device) gpu = std::move(g);
  if (grant_.capacity != config.device.memory) {
    say(fmt::format("memory.share: {} holds {} (the device.memory of its first job), not {}",
                    r.device, format_bytes(grant_.capacity), format_bytes(config.device.memory)));
  }
  if (gpu && gpu->objective != config.memory.share_objective) {
    say(
        fmt::format("memory.share: {} is divided for {} (the memory.share_objective of its first "
                    "job), not {}",
                    r.device, share_objective_name(gpu->objective),
                    share_objective_name(config.memory.share_objective)));
  }
  if (curve_.lower > grant_.capacity) {
    give_up(ConfigError(
        fmt::format("memory.share: this job needs at least {} and {} holds {}",
                    format_bytes(curve_.lower), r.device, format_bytes(grant_.capacity)),
        "lower data.batch_size, or use memory.policy auto"));
  }
  if (grant_.waiting) {  // Note [Life of a memory share], step 4
    if (gpu) say(share_wait_message(*gpu, grant_.id, curve_.lower));
    grant_ = ledger_->wait_admitted(grant_.id, config.memory.share_wait);
    if (grant_.waiting || grant_.gone) {
      give_up(ConfigError(
          fmt::format("memory.share_wait: waited {} s and {} still cannot hold this job's lower "
                      "bound {}",
                      config.memory.share_wait, r.device, format_bytes(curve_.lower)),
          "raise memory.share_wait, or start the job when those listed by 'trainer jobs' end"));
    }
  }
  // Until the first step the job reports its whole grant as held.
  ledger_->report(grant_.id, grant_.granted);
  budget_ = grant_.granted - reserve_;
  say(fmt::format("memory.share: budget {} on {} (share {} of {}; lower bound {}, peak {}, {}{})",
                  format_bytes(budget_), r.device, format_bytes(grant_.share),
                  format_bytes(grant_.capacity), format_bytes(curve_.lower),
                  format_bytes(curve_.peak), share_objective_name(config.memory.share_objective),
                  reserve_ > 0 ? fmt::format("; {} below the grant: the device maps whole {} "
                                             "granules",
                                             format_bytes(reserve_), format_bytes(reserve_))
                               : ""));
}

MemoryShareLease::~MemoryShareLease() { ledger_->leave(grant_.id); }

}  // namespace ferry
