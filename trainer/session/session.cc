// Building a run from its config.
#include "trainer/session/session.h"

#include "trainer/checkpoint/model_checkpoint.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/session/planning.h"

#include <algorithm>
#include <numeric>
#include <thread>

namespace ferry {

PlanOptions plan_options(const Config& config) {
  PlanOptions p;
  p.policy = config.memory.policy;
  p.budget = config.memory.budget;
  p.recompute = config.memory.recompute;
  p.cost = cost_model(config);
  return p;
}

DeviceOptions device_options(const Config& config) {
  DeviceOptions d;
  d.backend = config.device.backend;
  d.memory = config.device.memory;
  d.threads = static_cast<int>(config.device.threads);
  d.copy_gbps = config.device.copy_gbps;
  d.conv_tf32 = config.device.tf32;
  d.matmul_tf32 = config.device.tf32_matmul;
  d.deterministic = config.device.deterministic;
  const uint64_t budget = config.memory.budget > 0 ? config.memory.budget : config.device.memory;
  d.workspace_limit = std::min(config.memory.workspace_limit, budget / 8);
  return d;
}

OptimizerOptions optimizer_options(const Config& config) {
  OptimizerOptions o;
  o.kind = config.optim.name;
  o.momentum = static_cast<float>(config.optim.momentum);
  o.nesterov = config.optim.nesterov;
  o.weight_decay = static_cast<float>(config.optim.weight_decay);
  o.beta1 = static_cast<float>(config.optim.beta1);
  o.beta2 = static_cast<float>(config.optim.beta2);
  o.eps = static_cast<float>(config.optim.eps);
  return o;
}

LrSchedule lr_schedule(const Config& config) {
  LrSchedule s;
  s.kind = config.optim.schedule;
  s.base_lr = static_cast<float>(config.optim.lr);
  s.warmup_steps = config.optim.warmup_steps;
  s.step_size = config.optim.step_size;
  s.gamma = static_cast<float>(config.optim.gamma);
  s.min_lr = static_cast<float>(config.optim.min_lr);
  s.total_steps = config.run.steps;
  return s;
}

Shape Session::input_shape(int64_t n) const {
  const auto& in = config_.model.input;
  return Shape{n, in[0], in[1], in[2]};
}

namespace {

// Tells the gradient buckets what backward has written.
class BucketListener : public GradientListener {
 public:
  explicit BucketListener(GradientBuckets* buckets) : buckets_(buckets) {}
  void on_gradients(std::span<const size_t> params) override { buckets_->mark_ready(params); }

 private:
  GradientBuckets* buckets_;
};

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

}  // namespace

Session::Session(const Config& config, const RankInfo& ranks, bool training)
    : config_(config), ranks_(ranks) {
  graph_ =
      build_model(config.model.name, input_shape(config.data.batch_size), config.model.classes);
  placement_ = place_this_rank(config, ranks);
  DeviceOptions d = device_options(config);
  d.ordinal = placement_.binding.gpu.value_or(ranks.local_rank);
  d.place_host_memory = host_memory_placement(placement_);
  if (d.threads == 0 && d.backend == Backend::kCpu) {
    // Ranks of one machine share its cores: each takes its binding's CPUs, or its share.
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    d.threads = placement_.bound ? static_cast<int>(placement_.binding.cpus.size())
                                 : std::max(1, cores / std::max(1, ranks.local_size));
  }
  const bool emulate_link = d.backend == Backend::kCpu && d.copy_gbps == 0 &&
                            !config.topology.file.empty() && placement_.link_gbps > 0;
  if (emulate_link) d.copy_gbps = placement_.link_gbps;
  device_ = create_device(d);
  const OptimizerOptions opt = optimizer_options(config);
  store_ = std::make_unique<ParameterStore>(*device_, graph_, training ? optimizer_slots(opt) : 0);
  store_->initialize(graph_, config.run.seed);
  if (!config.model.init_from.empty()) load_weights(config.model.init_from, *store_);
  optimizer_ = std::make_unique<Optimizer>(opt);
  ExecutorOptions exec;
  exec.plan = plan_options(config);
  if (emulate_link && config.memory.link_gbps == 0) exec.plan.cost.link_gbps = d.copy_gbps;
  exec.host_limit = config.memory.host_limit;
  exec.poison = config.memory.debug_poison;
  exec.seed = config.run.seed;
  const std::string name = config.model.name;
  const int64_t classes = config.model.classes;
  executor_ = std::make_unique<Executor>(
      *device_, *store_,
      [this, name, classes](int64_t batch) {
        return build_model(name, input_shape(batch), classes);
      },
      exec);
  comm_ = create_communicator(comm_choice(config.comm.backend), *device_, ranks);
  // Every rank starts from rank 0's parameters and BN statistics.
  Stream& compute = device_->stream(StreamKind::kCompute);
  const PersistentBytes bytes = store_->bytes();
  comm_->broadcast(store_->param_block(), bytes.weights, 0, compute).order_before(compute);
  if (!store_->buffers().empty()) {
    comm_->broadcast(store_->buffer_block(), store_->buffer_block_bytes(), 0, compute)
        .order_before(compute);
  }
}

Session::~Session() = default;

GradientBuckets& Session::buckets(int64_t batch) {
  if (buckets_) return *buckets_;
  // Buckets follow the order backward writes gradients in, the same on every rank.
  const Program& program = executor_->program(batch, true);
  BucketOptions options;
  options.bucket_bytes = static_cast<uint64_t>(config_.comm.bucket_mb * 1048576.0);
  options.overlap = config_.comm.overlap;
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
  buckets_ = std::make_unique<GradientBuckets>(*comm_, *device_, store_->grad_block(),
                                               std::move(slices), options);
  listener_ = std::make_unique<BucketListener>(buckets_.get());
  return *buckets_;
}

void Session::forward_backward(const HostBatch& batch, uint64_t step) {
  GradientBuckets& b = buckets(batch.n);
  b.reset();
  executor_->enqueue(batch, /*training=*/true, step, listener_.get());
}

void Session::reduce_gradients() { buckets_->finish(device_->stream(StreamKind::kCompute)); }

void Session::update(float lr) {
  optimizer_->step(device_->kernels(), device_->stream(StreamKind::kCompute), *store_, lr);
}

std::vector<BucketSpan> Session::reduce_spans() const {
  return buckets_ ? buckets_->spans() : std::vector<BucketSpan>{};
}

std::vector<std::string> Session::optimizer_slot_names() const {
  return ferry::optimizer_slot_names(store_->optimizer_slots(),
                                     config_.optim.name == OptimizerKind::kAdamW);
}

}  // namespace ferry
