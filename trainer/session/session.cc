// Building a run from its config.
#include "trainer/session/session.h"
#include "trainer/configured/model.h"

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/shm_names.h"
#include "device/backend_traits.h"
#include "links/link_capacities.h"
#include "trainer/checkpoint/model_checkpoint.h"
#include "trainer/configured/options.h"
#include "trainer/exec/step_kernels.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/plan/assumed_link.h"
#include "trainer/plan/planning.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <numeric>
#include <thread>

namespace ferry {

namespace {

// Tells the gradient buckets what backward has written; with a ModelStateStep, also when a step
// must wait for the parameters' all-gather and, under zero 2's staged gradients, where backward
// writes them and when it may reuse staging bytes.
class BucketListener : public GradientListener {
 public:
  BucketListener(GradientBuckets* buckets, ModelStateStep* staged)
      : buckets_(buckets), staged_(staged) {}
  void on_gradients(std::span<const size_t> params) override { buckets_->mark_ready(params); }
  void before_step(const Program& program, int step) override {
    if (staged_) staged_->before_step(program, step);
  }
  float* gradient_address(const Program& program, size_t param) override {
    return staged_ ? staged_->gradient_address(program, param) : nullptr;
  }

 private:
  GradientBuckets* buckets_;
  ModelStateStep* staged_;
};

// Note [Host copies on the links] (trainer/optim/model_state_step.h): per parameter, the planned
// seconds from its gradient's last write to the tape's end, and from the tape's start to the
// first forward step that reads it.
void host_copy_deadlines(const Program& p, const ParameterStore& store, ModelStateStepOptions& o) {
  const size_t n = store.params().size(), steps = p.plan.tape.steps.size();
  const double total = p.planned_start[steps];
  o.gradient_deadline_s.assign(n, 0.0);
  o.weight_deadline_s.assign(n, total);
  std::vector<bool> read(n, false);
  for (size_t s = 0; s < steps; ++s) {
    for (size_t i : p.grads_written[s]) o.gradient_deadline_s[i] = total - p.planned_start[s + 1];
    if (p.plan.tape.steps[s].phase != StepPhase::kForward) continue;
    for (int slot : p.lowered.bindings[static_cast<size_t>(p.plan.origin[s])].params) {
      if (!is_persistent_slot(slot)) continue;
      const size_t i = store.param_index(p.graph, persistent_id(slot));
      if (!read[i]) o.weight_deadline_s[i] = p.planned_start[s];
      read[i] = true;
    }
  }
}

CommBackendChoice comm_choice(CommBackend b) {
  switch (b) {
    case CommBackend::kMpi:
      return CommBackendChoice::kMpi;
    case CommBackend::kNccl:
      return CommBackendChoice::kNccl;
    case CommBackend::kAuto:
      break;
  }
  return CommBackendChoice::kAuto;
}

// The rank's copy path through the node's ledger: its GPU's links, the ones a chunk takes
// tokens on (the same both ways), and the chunk size; no path when the topology shows none.
LinkPathOptions link_path(const Config& config, const RankInfo& ranks,
                          const RankPlacement& placement) {
  LinkPathOptions o;
  o.rank = ranks.rank;
  o.chunk_bytes = static_cast<uint64_t>(config.topology.chunk_mb * 1048576.0);
  if (!placement.links || placement.link_ids.empty()) return o;
  o.path = placement.link_ids;
  o.arbitrated =
      arbitrated_links(link_capacities(*placement.links), o.path, TransferDirection::kToHost);
  return o;
}

}  // namespace

// Note [Model state per rank] (trainer/plan/model_state.h): the stage and placement, auto
// resolved by the planner for this job's rank count with what this build allocates.
StoreLayout Session::resolve_model_state(const Config& config, const RankInfo& ranks) {
  model_state_ = {config.memory.zero, config.memory.optimizer};
  const bool automatic = config.memory.zero == ZeroStage::kAuto ||
                         config.memory.optimizer == OptimizerPlacement::kAuto;
  OfflinePlanner planner(config);
  // Without comm.overlap no bucket is reduced before backward ends: zero 2 then keeps the block.
  planner.set_whole_gradients(!config.comm.overlap);
  planner.set_ranks(ranks.size);
  if (automatic) {
    model_state_ = planner.resolve_model_state(config.memory.policy, config.data.batch_size)
                       .choice()
                       .state.choice;
  }
  state_ = ferry::model_state(planner.model_state_inputs(), model_state_);
  const ModelState& state = state_;
  StoreLayout layout;
  layout.ranks = ranks.size;
  layout.rank = ranks.rank;
  const bool sharded = model_state_.zero != ZeroStage::k0 && ranks.size > 1;
  if (sharded) {
    layout.shard_floats = static_cast<int64_t>(state.shard_floats);
    layout.shard_optimizer = true;
    if (state.staged_gradients) {
      layout.staging_bytes = state.staging_bytes;
      layout.staging_slot_bytes = state.staging_slot;
    }
  }
  layout.host_optimizer = model_state_.optimizer == OptimizerPlacement::kHost;
  if (model_state_ != ModelStateChoice{} || automatic) {
    model_state_line_ = fmt::format(
        "state    {}{} on {} rank{}: per rank weights {}, gradients {}, optimizer {} on the "
        "device, "
        "{} on the host{}",
        describe(model_state_), automatic ? " (auto)" : "", ranks.size, ranks.size == 1 ? "" : "s",
        format_bytes(state.weights), format_bytes(state.gradients), format_bytes(state.optimizer),
        format_bytes(state.host_bytes()),
        model_state_.zero != ZeroStage::k0 && ranks.size == 1
            ? "; memory.zero on one rank changes nothing (every shard is the whole block)"
        : model_state_.zero == ZeroStage::k2 && !state.staged_gradients
            ? "; zero 2 keeps the whole gradient block here (comm.overlap is off, or staging "
              "two buckets would not be smaller)"
        : state.staged_gradients ? fmt::format("; gradients: the shard and {} of staging",
                                               format_bytes(state.staging_bytes))
                                 : std::string());
  }
  return layout;
}

Session::Session(const Config& config, const RankInfo& ranks, bool training,
                 std::optional<RankPlacement> placed)
    : config_(config), ranks_(ranks) {
  graph_ = build_configured_model(config, config.data.batch_size);
  placement_ = placed ? std::move(*placed) : place_this_rank(config, ranks);
  DeviceOptions d = device_options(config);
  // Note [A rank's GPU by PCI bus id] in rank_placement.cc.
  d.ordinal = placement_.cuda_ordinal.value_or(placement_.binding.gpu.value_or(ranks.local_rank));
  d.place_host_memory = host_memory_placement(placement_);
  d.cuda.algorithm_file = conv_algorithm_file(config, ranks.rank);
  if (d.cpu.threads == 0) {
    // Ranks of one machine share its cores: each takes its binding's CPUs, or its share.
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    d.cpu.threads = placement_.bound ? static_cast<int>(placement_.binding.cpus.size())
                                     : std::max(1, cores / std::max(1, ranks.local_size));
  }
  const bool emulate_link = emulates_server_links(config) && placement_.link_gbps > 0;
  const bool arbitrate = config.topology.scheduler == LinkSchedulerKind::kTopology;
  // The rank's copies cross its GPU's path, shared with the node's other ranks through the
  // ledger (attached once the communicator exists): emulated by a CPU rank's copies (stretched
  // by the emulation's scale), or the real path of a GPU's copies (Note [One hook, two
  // protocols] in device/copy_arbiter.h).
  if (emulate_link) d.cpu.link_gbps = placement_.link_gbps / config.topology.emulation_scale;
  LinkArbiterOptions a;
  if (emulate_link || arbitrate)
    static_cast<LinkPathOptions&>(a) = link_path(config, ranks, placement_);
  a.link_gbps = emulate_link ? d.cpu.link_gbps : placement_.link_gbps;
  a.emulate = emulate_link;
  a.arbitrate = arbitrate;
  a.topology_source = placement_.source;
  arbiter_ = make_link_arbiter(backend_traits(d.backend).arbitration, a);
  if (arbitrate && !arbiter_) {
    throw ConfigError(
        "topology.scheduler: topology arbitrates the links of GPU ranks (device.backend=cuda) or "
        "the shared-link emulation of CPU ranks, which this run does not have (it needs a "
        "topology.file with GPUs, and device.copy_gbps 0)",
        "use topology.scheduler=fifo, or unset device.copy_gbps");
  }
  d.arbiter = arbiter_;
  device_ = create_device(d);
  if (config.device.precision == Precision::kBf16) {
    // The device accepted bf16 (create_device checked the CPU or GPU); each of the model's bf16
    // steps must find its kernels in bf16 storage too, or the run stops here, before step 1.
    const Lowered lowered = lower_graph(graph_, device_->kernels(), training);
    check_bf16_kernels(graph_, lowered, device_->kernels(), config.model.name, d.backend);
  }
  const OptimizerOptions opt = optimizer_options(config);
  // Note [Accumulating micro-batches]: the sum of an update's micro-batches in its own block.
  const StoreLayout layout = training ? resolve_model_state(config, ranks) : StoreLayout{};
  // Staged gradients (zero 2) accumulate in the shard, the rest in an accumulation block.
  store_ = std::make_unique<ParameterStore>(
      *device_, graph_, training ? optimizer_slots(opt) : 0, layout,
      training && config.optim.accumulate > 1 && layout.staging_bytes == 0,
      config.device.precision);
  store_->initialize(graph_, config.run.seed);
  if (!config.model.init_from.empty()) {
    load_weights(config.model.init_from, *store_,
                 {tied_weight_names(graph_), config.model.init_ignore_unused});
  }
  optimizer_ = std::make_unique<Optimizer>(opt);
  ExecutorOptions exec;
  exec.plan = plan_options(config);
  // train() drains the staged metrics at least every run.log_every steps (updates), each one
  // staged per micro-batch.
  exec.metrics_steps = static_cast<size_t>(std::max<int64_t>(config.run.log_every, 1) *
                                           std::max<int64_t>(config.optim.accumulate, 1));
  if (emulate_link && config.memory.link_gbps == 0) exec.plan.cost.link_gbps = d.cpu.link_gbps;
  if (config.memory.measure && training) {
    // Plan with this device's own times (Note [Measured step times]), cached in run.dir.
    ProfileOptions po;
    po.cache_path = (std::filesystem::path(config.run.dir) / "cost_profile.json").string();
    po.device_key = profile_device_key(*device_, d.cpu.link_gbps);
    po.write_cache = ranks.is_root();
    // memory.optimizer host: the host update too, as `trainer plan --measure` does (Note [A timed
    // host update] in trainer/plan/host_update_timing.h).
    if (model_state_.optimizer == OptimizerPlacement::kHost) po.host_update = opt;
    const Lowered lowered = lower_graph(graph_, device_->kernels(), /*training=*/true);
    profile_ = measure_device(*device_, graph_, lowered,
                              update_kernel(config, store_->param_floats()), po);
    apply_profile(*profile_, lowered.tape, exec.plan.cost, config.memory.link_gbps > 0);
  }
  exec.shapes.name_shapes = !config.data.scales.empty() || config.data.documents;
  if (!config.memory.per_shape && config.memory.policy == MemoryPolicy::kAuto) {
    exec.shapes.static_input = largest_input(config);  // Note [One plan for every shape]
  }
  exec.host_limit = config.memory.host_limit;
  exec.poison = config.memory.debug_poison;
  // Contention-aware auto (the topology scheduler on a described server): plan against this
  // rank's share of its links, at the emulation's time scale, keeping resident what it cannot
  // hide.
  if (config.memory.link_gbps == 0) {
    if (const auto a = training_link(config, ranks.local_size, ranks.local_rank)) {
      const double scale = emulate_link ? d.cpu.link_gbps / placement_.link_gbps : 1.0;
      // A measured rate per direction is this rank's link alone: it gets the same share.
      const double share = a->gbps * scale / exec.plan.cost.link_gbps;
      if (exec.plan.cost.link_gbps_to_host > 0) exec.plan.cost.link_gbps_to_host *= share;
      if (exec.plan.cost.link_gbps_to_device > 0) exec.plan.cost.link_gbps_to_device *= share;
      exec.plan.cost.link_gbps = a->gbps * scale;
      exec.plan.keep_unhidden = true;
    }
  }
  exec.seed = config.run.seed;
  // memory.optimizer host: the update's copies and host work per update, at the cost model's
  // rates (measured ones under memory.measure), as auto weighs them (model_state_seconds).
  if (training && model_state_.optimizer == OptimizerPlacement::kHost) {
    const CostModel& c = exec.plan.cost;
    model_state_seconds_ = ferry::model_state_seconds(state_, optimizer_slots(opt), c.link_gbps,
                                                      c.link_gbps, c.host_update_gbps);
  }
  exec.load_on_compute = model_state_.optimizer == OptimizerPlacement::kHost;
  if (arbitrate) exec.scheduler = [] { return std::make_unique<DeadlineLinkScheduler>(); };
  executor_ = std::make_unique<Executor>(
      *device_, *store_, [this](int64_t batch) { return build_configured_model(config_, batch); },
      exec, [this](const Shape& input) { return build_configured_model(config_, input); });
  comm_ =
      create_communicator(comm_choice(config.comm.backend), *device_, ranks, config.comm.timeout_s);
  if (arbiter_) attach_link_ledger();
  // Every rank starts from rank 0's parameters and BN statistics.
  Stream& compute = device_->stream(StreamKind::kCompute);
  const PersistentBytes bytes = store_->bytes();
  if (store_->split_masters()) {
    // Note [Sharded master weights]: what every rank keeps whole (each drew its own shard of the
    // masters from the same seeds).
    comm_->broadcast(store_->working_floats(), bytes.working_weights, 0, compute)
        .order_before(compute);
    if (store_->fp32_weights()) {
      comm_->broadcast(store_->fp32_weights(), store_->fp32_weights_bytes(), 0, compute)
          .order_before(compute);
    }
  } else {
    comm_->broadcast(store_->param_block(), bytes.weights, 0, compute).order_before(compute);
  }
  if (!store_->buffers().empty()) {
    comm_->broadcast(store_->buffer_block(), store_->buffer_block_bytes(), 0, compute)
        .order_before(compute);
  }
}

Session::~Session() = default;

// Note [Link ledger lifetime]
// The ledger is the node's (Note [One link ledger per node] in links/link_ledger.h): every rank
// of every ferry job of this user that names the same topology attaches the same well-known
// block, creating it when it is the first, and registers as a user with its job's token (rank
// 0's pid, clock and a random word, broadcast to every rank), its rank and run directory. The
// block is never removed; a job alone on the node finds it empty and starts it afresh, and the
// copies, claims and tokens of a job that crashed are reaped by the others. A barrier after the
// attachment: every local rank's copies are shared from the first.
void Session::attach_link_ledger() {
  std::array<char, 128> name{};
  if (ranks_.rank == 0) {
    const std::string n = shm_names::job_token();
    std::copy_n(n.begin(), std::min(n.size(), name.size() - 1), name.begin());
  }
  comm_->broadcast_host(name.data(), name.size(), 0);
  name.back() = '\0';
  // Emulated links are stretched by the emulation's scale; a GPU's are its own.
  const std::vector<NamedLink> links =
      node_ledger_links(config_, placement_, arbiter_->emulates_links());
  LedgerUser user;
  user.job = name.data();
  user.rank = ranks_.rank;
  user.run_dir = config_.run.dir;
  std::shared_ptr<LinkLedger> ledger =
      LinkLedger::attach(LinkLedger::node_name(links), links, user);
  comm_->barrier();
  arbiter_->attach(std::move(ledger));
}

std::vector<LinkUsage> Session::link_usage() const {
  std::shared_ptr<LinkLedger> ledger = arbiter_ ? arbiter_->ledger() : nullptr;
  if (!ledger) return {};
  return ledger->usage();
}

GradientBuckets& Session::buckets(const HostBatch& batch) {
  if (active_buckets_) return *active_buckets_;
  // Buckets follow the order backward writes gradients in, the same on every rank (and for
  // every input shape: the graph's order does not depend on it).
  const Program& program = batch.shape.rank() > 0 ? executor_->program(batch.shape, true)
                                                  : executor_->program(batch.n, true);
  BucketOptions options;
  options.bucket_bytes = static_cast<uint64_t>(config_.comm.bucket_mb * 1048576.0);
  options.overlap = config_.comm.overlap;
  options.wire_dtype = narrow_dtype(config_.comm.dtype);
  const size_t n = store_->params().size();
  std::vector<int> last_write(n, -1), writes(n, 0);
  for (size_t s = 0; s < program.grads_written.size(); ++s) {
    for (size_t p : program.grads_written[s]) {
      last_write[p] = static_cast<int>(s);
      ++writes[p];
    }
  }
  options.order.resize(n);
  std::iota(options.order.begin(), options.order.end(), size_t{0});
  std::stable_sort(options.order.begin(), options.order.end(),
                   [&](size_t a, size_t b) { return last_write[a] < last_write[b]; });
  for (size_t p = 0; p < n; ++p) writes[p] = std::max(writes[p], 1);
  options.writes_per_param = writes;
  std::vector<GradSlice> slices;
  for (const auto& e : store_->params())
    slices.push_back({e.offset, (e.desc.bytes() + 63) / 64 * 64});
  const bool sharded = model_state_.zero != ZeroStage::k0 && ranks_.size > 1;
  if (sharded && options.wire_dtype != DType::kF32) {
    throw ConfigError(fmt::format("comm.dtype: bf16 all-reduces in bf16, but memory.zero {} "
                                  "reduce-scatters the gradients, which runs in fp32 only",
                                  static_cast<int>(model_state_.zero)),
                      "set comm.dtype=fp32, or memory.zero=0");
  }
  if (sharded || model_state_.optimizer == OptimizerPlacement::kHost) {
    ModelStateStepOptions o;
    o.shard = sharded;
    o.reduce_in_backward = model_state_.zero == ZeroStage::k2;
    o.host = model_state_.optimizer == OptimizerPlacement::kHost;
    o.bucket_bytes = options.bucket_bytes;
    if (o.host) {
      o.transfers = &executor_->transfers();
      host_copy_deadlines(program, *store_, o);
    }
    state_step_ = std::make_unique<ModelStateStep>(*comm_, *device_, *store_, *optimizer_,
                                                   std::move(slices), options, o);
    active_buckets_ = &state_step_->buckets();
  } else {
    buckets_ = std::make_unique<GradientBuckets>(*comm_, *device_, store_->grad_block(),
                                                 std::move(slices), options);
    active_buckets_ = buckets_.get();
  }
  listener_ = std::make_unique<BucketListener>(active_buckets_, state_step_.get());
  if (store_->accumulation_block()) {
    accumulation_ = std::make_unique<GradientAccumulation>(*device_, *store_, *listener_);
  }
  return *active_buckets_;
}

void Session::forward_backward(const HostBatch& batch, uint64_t step, const MicroBatch& micro) {
  GradientBuckets& b = buckets(batch);
  micro_ = micro;
  const bool staged = state_step_ && state_step_->staged();
  if (micro.count == 1 || staged) {
    b.reset();
    if (staged) state_step_->begin_backward(micro.index == 0, micro.last());
    executor_->enqueue(batch, /*training=*/true, step, listener_.get());
    // Staged gradients: each micro-batch's buckets are reduce-scattered into the shard
    // (Note [Reduce and update by shard]); the last one's finish is reduce_gradients'.
    if (!micro.last()) state_step_->reduce(device_->stream(StreamKind::kCompute));
    return;
  }
  // Note [Accumulating micro-batches]: the buckets hear only the last micro-batch.
  FERRY_ASSERT(accumulation_ != nullptr, "micro-batches without the accumulation block");
  if (micro.last()) b.reset();
  executor_->enqueue(batch, /*training=*/true, step, accumulation_->begin(micro));
}

void Session::reduce_gradients() {
  FERRY_ASSERT(micro_.last(), "reduce_gradients before the update's last micro-batch");
  if (micro_.count > 1 && accumulation_) accumulation_->fold_rest();
  if (state_step_) return state_step_->reduce(device_->stream(StreamKind::kCompute));
  buckets_->finish(device_->stream(StreamKind::kCompute));
}

// After reduce_gradients, on the stream it ordered (Note [Clipping after the all-reduce] in
// trainer/optim/optimizer.cc).
void Session::update(float lr) {
  // Note [The bf16 working copy]: the next step narrows the updated weights once.
  store_->mark_weights_changed();
  if (state_step_) return state_step_->update(lr);
  optimizer_->step(device_->kernels(), device_->stream(StreamKind::kCompute), *store_, lr);
}

const float* Session::grad_norm_sq() const {
  return optimizer_->measures_grad_norm() ? store_->grad_sq_address() : nullptr;
}

std::vector<BucketSpan> Session::reduce_spans() const {
  return active_buckets_ ? active_buckets_->spans() : std::vector<BucketSpan>{};
}

// Note [One file for every shard]
// A checkpoint holds the whole optimizer state under today's names, whatever memory.zero and
// memory.optimizer were: before a save, every rank broadcasts its shard (host broadcasts, so the
// state never needs a whole-block buffer on a device) and each assembles the image, of which rank
// 0 writes the file; on load every rank reads the whole file into the image and keeps its own
// shard. So a run resumes under another rank count, stage or placement.
void Session::gather_optimizer_state() {
  // The checkpoint reads the parameters: after every piece of their all-gather.
  if (state_step_) state_step_->settle(device_->stream(StreamKind::kCompute));
  // Note [Sharded master weights] in trainer/exec/parameter_store.h: the whole fp32 weights.
  if (store_->split_masters()) store_->set_weights_image(gather_shards(store_->read_masters()));
  if (store_->whole_optimizer_on_device()) return;
  ParameterStore::OptimizerImage image;
  for (int s = 0; s < store_->optimizer_slots(); ++s)
    image.push_back(gather_shards(store_->read_local_optimizer(s)));
  store_->set_optimizer_image(std::move(image));
}

std::vector<float> Session::gather_shards(const std::vector<float>& mine) {
  const int64_t floats = store_->param_floats();
  const int owners = store_->layout().shard_optimizer ? ranks_.size : 1;
  const int64_t shard = owners > 1 ? store_->layout().shard_floats : floats;
  std::vector<float> image(static_cast<size_t>(floats));
  for (int r = 0; r < owners; ++r) {
    const int64_t begin = std::min(r * shard, floats), end = std::min(begin + shard, floats);
    float* at = image.data() + begin;
    if (r == ranks_.rank || owners == 1) std::copy(mine.begin(), mine.end(), at);
    if (owners > 1 && end > begin)
      comm_->broadcast_host(at, static_cast<uint64_t>(end - begin) * sizeof(float), r);
  }
  return image;
}

void Session::scatter_optimizer_state() {
  if (store_->whole_optimizer_on_device() || !store_->has_optimizer_image()) return;
  const ParameterStore::OptimizerImage image = store_->take_optimizer_image();
  for (int s = 0; s < store_->optimizer_slots(); ++s)
    store_->write_local_optimizer(s, image[static_cast<size_t>(s)].data() + store_->update_begin());
  if (state_step_) state_step_->weights_changed();
}

std::vector<std::string> Session::optimizer_slot_names() const {
  return ferry::optimizer_slot_names(store_->optimizer_slots(),
                                     config_.optim.name == OptimizerKind::kAdamW);
}

}  // namespace ferry
