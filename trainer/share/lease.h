// A job that shares its device (memory.share): its lease on the node's job ledger, held from
// admission to the job's end. Invariant: while a lease is held, the job holds at most the
// ledger's grant to it, and the ledger keeps the grants within the device's capacity.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/ranks.h"
#include "jobs/job_ledger.h"
#include "prefetch/plan.h"
#include "topology/pci.h"
#include "trainer/config/config.h"

namespace ferry {

// Note [Life of a memory share]
// One job's `memory.share: true`, from the config to the bytes its device heap backs. Each place
// on the way cites this note with its step number.
//  1. Curve: train() (trainer/session/train.cc) plans the config's model offline at budgets from
//     the unconstrained peak down to the smallest the policy meets: share_curve() below, over
//     plan_memory (trainer/plan/planning.*). The ShareCurve (jobs/share_controller.h) is the
//     lower bound, the peak and a ladder of (budget, predicted step time) points.
//  2. Lease: MemoryShareLease raises the curve by the backend's granule (held_curve(); Note [A
//     shared budget in held bytes]) and joins the ledger of the rank's device, keyed by
//     share_device_key() (a GPU by its PCI bus id, so jobs that number GPUs differently meet).
//     The ledger is a POSIX shared-memory block (jobs/job_ledger.*, opened through
//     common/shm_block.h) that every job of the node maps.
//  3. Division: on every join, poll, confirm and reap, the ledger hands the live jobs' curves to
//     divide_memory() (jobs/share_controller.*), a pure function that gives each admitted job at
//     least its lower bound and divides the rest by memory.share_objective (Note [What the
//     controller optimises]); the device's capacity follows the jobs (Note [A capacity that
//     follows the jobs] in jobs/job_ledger.h). Each job's answer is a JobGrant.
//  4. Admission: the lease waits until its grant reaches its lower bound (memory.share_wait at
//     most, saying once which jobs hold the device); the grant less the granule becomes the
//     run's memory.budget, and the Session is built with it.
//  5. Following: each step, before_step() (SharedBudget, trainer/share/budget.h) polls the grant;
//     a new one is planned in the background and switched to between steps (Note [Following a
//     shared budget]); a job whose grant shrank confirms what it holds before a growing job's
//     grant rises (Note [Handing memory over between jobs] in jobs/job_ledger.h).
//  6. Heap: the executor's plan places its arena within the budget; the device heap backs only
//     as far as the arena reaches (Note [Backing a heap on use] in device/heap.h), and reports
//     what it will hold to the ledger before it allocates (Executor::on_arena_growth), which
//     refuses more than the grant (Note [The ledger's record of held memory]).
//  7. End: the lease's destructor leaves the ledger, and the job's grant goes back to the
//     others; a job killed without leaving is reaped by the next poll of any job.

// Plans the config's model at its batch under memory.policy: unconstrained (the peak, at most
// memory.budget), at the smallest budget the policy meets (to within a 256th of the span), and
// at budgets between. Throws ConfigError when the policy cannot fit memory.budget at all.
ShareCurve share_curve(const Config& config, int points = 8);
// The same from any planner of the job's step: `plan_at(budget)` plans within `budget` bytes (0:
// unlimited), throwing ConfigError when it cannot; `cap` (memory.budget; 0: none) caps the peak.
// A running job plans its curve again with its executor's measured cost model.
ShareCurve share_curve(const std::function<MemoryPlan(uint64_t budget)>& plan_at, uint64_t cap,
                       int points = 8);

// Note [A shared budget in held bytes]
// The ledger's grants and its held record count what a job holds on its device
// (MemoryStats::held); a plan's budget counts its heap's in_use. On the CPU backend they are the
// same. A CUDA device sharing its GPU maps whole granules (Note [Backing a heap on use] in
// device/heap.h), so it holds up to a granule more than its heap's in_use in the trainer's layout
// (persistent blocks from offset 0, then the arena: one run of live allocations). So a job
// registers its curve raised by that granule (share_reserve(), lower bound, peak and every
// ladder budget) and plans within its grant less the granule: held <= in_use + granule - 256
// <= grant - 256. Its reports are then what the process holds in mapped memory, exactly
// (DeviceHeap::held_after before the arena is taken), never above its grant; a layout that
// held more would be refused by the ledger, not hidden.

// The bytes a job sharing its device plans below its grant: the backend's shared granule, 0 on
// the CPU backend or without memory.share (Note [A shared budget in held bytes]).
uint64_t share_reserve(const Config& config);

// `curve` (of heap bytes) with its lower bound, peak and every ladder budget raised by `reserve`:
// what the job registers, in held bytes.
ShareCurve held_curve(ShareCurve curve, uint64_t reserve);

// The device a rank shares on this node: a CUDA rank's GPU by its PCI bus id when placement
// found it ("cuda:0000:3b:00.0": jobs that number the GPUs differently, e.g. under
// CUDA_VISIBLE_DEVICES, still meet on it), else "<backend>:<local rank>" (the emulated device
// of a CPU rank; a CUDA rank's ordinal standing for its GPU).
std::string share_device_key(const Config& config, const RankInfo& ranks,
                             const std::optional<PciAddress>& gpu = std::nullopt);

// The admission message when the job waits: who holds the device and how much.
std::string share_wait_message(const LedgerGpu& gpu, uint64_t id, uint64_t lower);

class MemoryShareLease {
 public:
  // Joins the node's job ledger for this rank's device with held_curve(curve, share_reserve())
  // (`curve` is the planner's, in heap bytes) and waits until admitted,
  // printing once through `say` which jobs hold the device; throws ConfigError (exit 2) when
  // memory.share_wait passes first, or when the lower bound exceeds the device's capacity.
  // `gpu`: the PCI bus id of a CUDA rank's GPU, for the device key (share_device_key).
  MemoryShareLease(const Config& config, const RankInfo& ranks, const ShareCurve& curve,
                   const std::function<void(const std::string&)>& say,
                   const std::optional<PciAddress>& gpu = std::nullopt);
  // Leaves the ledger: the grant goes back to the others.
  ~MemoryShareLease();
  MemoryShareLease(const MemoryShareLease&) = delete;
  MemoryShareLease& operator=(const MemoryShareLease&) = delete;

  // The budget the job starts with: its grant at admission, less reserve().
  uint64_t budget() const { return budget_; }
  // The grant at admission.
  const JobGrant& grant() const { return grant_; }
  // The curve the job registered at start (held_curve() of the planner's), and the memory.budget
  // that caps the planner's peak.
  const ShareCurve& curve() const { return curve_; }
  uint64_t cap() const { return cap_; }
  // share_reserve(): a budget is its grant less this (Note [A shared budget in held bytes]).
  uint64_t reserve() const { return reserve_; }
  JobLedger& ledger() { return *ledger_; }

 private:
  std::shared_ptr<JobLedger> ledger_;
  JobGrant grant_;
  ShareCurve curve_;
  uint64_t cap_ = 0;
  uint64_t reserve_ = 0;
  uint64_t budget_ = 0;
};

}  // namespace ferry
