// The node simulator: one training step of every rank of a node on a virtual clock. Compute runs
// each rank's planned tape; copies queue on one stream per direction per rank and cross the
// links of the rank's path, which concurrent copies and all-reduce traffic share max-min fairly
// (fair_rates.h, the emulation's rule); under the topology scheduler copies and the all-reduce's
// hops go in chunks granted by the arbiter (arbiter_policy.h, the real scheduler's rule), each
// with its deadline. Pure and deterministic: the same inputs give the same result, bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "links/fair_rates.h"
#include "prefetch/cost_model.h"
#include "prefetch/tape.h"

namespace ferry {

// What a bucket's ring does: an all-reduce sends 2(R-1)/R of its bytes over every hop, a
// reduce-scatter or an all-gather (R-1)/R (Note [Model state on the node]).
enum class SimCollective : uint8_t { kAllReduce, kReduceScatter, kAllGather };

// One bucket of a collective: ready on every rank once compute has finished step `ready_after`
// (-1: at once) and each rank's SimRank::bucket_after_transfer copy has landed.
struct SimBucket {
  uint64_t bytes = 0;
  int ready_after = 0;
  SimCollective collective = SimCollective::kAllReduce;
  int needed_before = -1;  // the step that waits for it; -1: the update step
};

// Note [Model state on the node]
// memory.zero and memory.optimizer (trainer/plan/model_state.h) put the model state's traffic on
// the node's links. Zero 1 and 2 reduce-scatter the gradient buckets (zero 2 as backward
// produces them, zero 1 after backward) and all-gather the updated parameters: buckets of
// kReduceScatter, needed by the update, and of kAllGather, ready at once and needed by the first
// forward step. A one-step simulation is one period of the steady state: the all-gather of the
// previous update opens it, the update closes it. memory.optimizer host adds per rank its shard's
// gradients to host after each bucket's reduction (transfers issued by the bucket:
// SimRank::transfer_after_bucket), the update on the host (the update step's time), and the
// shard's parameters back to the device at the start, each all-gather bucket waiting for its
// piece (SimRank::bucket_after_transfer). Those copies queue with the activations' on the rank's
// streams and cross the same links under fifo and topology; buckets run one at a time, in order.

// A ring all-reduce hop from one rank to the next: `up` links carry it towards the host
// (kToHost), `down` links away from it (kToDevice). A hop that leaves the node (Note [Rings
// across nodes] in sim/node_links.h) goes on after `down` (the sender's GPU to a NIC, then the
// network link): `then_up` from the receiving node's NIC towards the host, `then_down` to the
// receiving GPU; on one node both are empty.
struct SimHop {
  std::vector<int> up;
  std::vector<int> down;
  std::vector<int> then_up;
  std::vector<int> then_down;
};

struct SimRank {
  std::string name;                     // "GPU0"
  std::vector<double> step_seconds;     // per step of the planned tape
  std::vector<std::string> step_names;  // for the trace (may be empty)
  std::vector<SimTransfer> transfers;   // issued in this order per direction
  std::vector<int> path;                // links a host<->device copy crosses
  std::vector<int> marks;               // steps whose end time is recorded (increasing)
  // Per transfer (or empty): the bucket whose collective issues it when it ends, -1 none (Note
  // [Model state on the node]); with one rank, no bucket runs and issue_after issues it.
  std::vector<int> transfer_after_bucket;
  // Per bucket (or empty): this rank's transfer that must land before the bucket starts, -1 none.
  std::vector<int> bucket_after_transfer;
  // Transfers from this index on are the model state's copies: the trace names them "gradients"
  // and "parameters" instead of "offload" and "prefetch".
  size_t model_state_transfers = SIZE_MAX;
};

// Note [All-reduce chunks on arbitrated links]
// Under fifo a bucket's ring hops are fluid flows that share every link max-min with the copies
// crossing it, as NCCL's traffic shares a PCIe switch with cudaMemcpyAsync. Under the topology
// scheduler the simulator models a scheduler that arbitrates them together. Each position of
// the ring (the hops from rank r to rank r+1, one per channel) claims chunks of `chunk_bytes`
// like a copy, split evenly over its channels, which move together as NCCL's channels do (one
// claim per hop serialised the channels and left the root complexes, which no chunk fills, part
// idle). A claim takes the tokens of the links of which a hop's chunk takes more than half, each
// in its own direction (arbitrated_flow in links/link_capacities.h: both GPUs' links, the NIC's
// link both ways across nodes, the switch uplinks between switches; not a root complex, nor a
// GPU's link behind a narrow inter-socket link), and the arbiter serves the least laxity first
// among copies and ring positions alike. The deadline is the update step, which waits for every
// bucket: the latest start leaves the position's bytes of this bucket and of every later bucket
// time to cross its narrowest arbitrated link alone. A claim needs several tokens at once, so it
// reserves them while it waits, and so do the copies' claims (Note [Claims that need several
// links at once] in links/arbiter_policy.h). Within a bucket the positions move independently
// and the bucket ends when the last one's last chunk lands, as under fifo. The real trainer does
// not gate NCCL's traffic: this is what such a scheduler would give.

struct NodeSimInput {
  std::vector<NamedLink> links;
  std::vector<SimRank> ranks;
  std::vector<SimBucket> buckets;  // in launch order; run when the job has several ranks
  // Hop c*n + r: rank r to rank r+1 (mod n) in channel c; empty: no traffic. Each of the
  // ring.size() / n channels carries an equal share of every bucket (NCCL's rings).
  std::vector<SimHop> ring;
  int job_ranks = 0;  // ranks of the whole job, every node's (the ring's length); 0: ranks.size()
  int update_step = -1;               // the step that waits for every bucket (-1: the last)
  bool topology_scheduler = false;    // chunked, arbitrated copies and hops; else fifo
  uint64_t chunk_bytes = 4ull << 20;  // topology.chunk_mb's default
  bool trace = false;                 // record spans for the Chrome trace
  // The ranks are jobs sharing one GPU's compute (Note [One GPU's compute shared by jobs]); else
  // each rank computes on a GPU of its own.
  bool shared_compute = false;
};

// Note [One GPU's compute shared by jobs]
// With shared_compute, the ranks' compute steps share one device: at any instant the ranks
// computing (not waiting for a copy, not finished) each run at 1 / their number of its speed, so a
// rank that waits for its copies hands its share to the others (processor sharing). A step's time
// in SimRank::step_seconds is its time with the device to itself. The trace shows each compute
// span from its start for that time, not stretched; the arbiter's slack assumes the full speed.

struct SimSpan {
  int track = 0;  // rank r: 3r compute, 3r+1 to-host copies, 3r+2 to-device copies
  double begin = 0, end = 0;
  std::string name;
  bool stall = false;
};

// Utilisation of each link over time: one sample per change, per direction (GB/s in use).
struct SimLinkSample {
  int link = 0;
  double at = 0;
  double to_host_gbps = 0, to_device_gbps = 0;
};

struct SimLinkStats {
  double to_host_bytes = 0, to_device_bytes = 0;
  double busy_seconds = 0;  // time some flow crosses it, either direction
};

struct SimRankStats {
  double step_seconds = 0;     // the rank's compute finishes its tape
  double compute_seconds = 0;  // sum of its step times
  double stall_seconds = 0;    // compute waiting for copies or the all-reduce
  double copy_bytes = 0;
  std::vector<double> mark_seconds;  // when each step of SimRank::marks ended
};

struct NodeSimResult {
  double step_seconds = 0;                                // the slowest rank, all-reduce included
  double stall_seconds = 0;                               // the mean over ranks
  double allreduce_bytes = 0;                             // per rank sent
  double reduce_scatter_bytes = 0, all_gather_bytes = 0;  // per rank sent
  std::vector<SimRankStats> ranks;
  std::vector<SimLinkStats> links;
  std::vector<SimSpan> spans;
  std::vector<SimLinkSample> samples;
};

// Runs one step. Throws std::invalid_argument on a path or hop naming no link, a model-state
// dependency naming no transfer or bucket, or a link with a non-positive capacity that some
// flow crosses.
NodeSimResult simulate_node(const NodeSimInput& input);
// The index checks simulate_node makes first (std::invalid_argument naming what is missing).
void check_indices(const NodeSimInput& input);

// A Chrome trace (JSON text): one process per GPU with compute and copy threads, one counter
// track per link with its GB/s per direction.
std::string chrome_trace(const NodeSimInput& input, const NodeSimResult& result);

}  // namespace ferry
