// Size tables, allocation and host transfers of the persistent blocks.
#include "trainer/exec/parameter_store.h"

#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "device/bf16.h"
#include "trainer/exec/lower.h"
#include "trainer/model/init.h"

namespace ferry {

namespace {

constexpr uint64_t kTensorAlignment = 64;

uint64_t align(uint64_t n) {
  return (n + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
}

// `bytes` in whole heap granules, so the bytes planned are the bytes the heap reserves.
uint64_t granules(uint64_t bytes) {
  const uint64_t g = DeviceHeap::kAlignment;
  return (bytes + g - 1) / g * g;
}

// Cuts a block: entries in graph order, each aligned.
uint64_t cut(const Graph& graph, const std::vector<TensorId>& ids,
             std::vector<ParameterStore::Entry>& entries, std::map<std::string, size_t>& index) {
  uint64_t offset = 0;
  for (TensorId id : ids) {
    const TensorInfo& info = graph.tensor(id);
    index[info.name] = entries.size();
    entries.push_back({info.name, info.desc, offset});
    offset += align(info.desc.bytes());
  }
  return granules(std::max<uint64_t>(offset, 1));
}

// The layout alone: blocks sizes without allocating.
struct Layout {
  std::vector<ParameterStore::Entry> params, buffers;
  std::map<std::string, size_t> param_by_name, buffer_by_name;
  uint64_t param_bytes = 0, buffer_bytes = 0;
};

Layout block_layout(const Graph& graph) {
  Layout l;
  l.param_bytes = cut(graph, graph.params(), l.params, l.param_by_name);
  l.buffer_bytes = cut(graph, graph.buffers(), l.buffers, l.buffer_by_name);
  return l;
}

constexpr uint64_t kMetricsBytes = 256;

// The bf16 working copy of a parameter block of `param_bytes` (Note [The bf16 working copy]):
// one bf16 element per fp32 element, in whole heap granules.
uint64_t working_bytes(uint64_t param_bytes) { return granules(param_bytes / 2); }

// Note [Sharded master weights]: per graph parameter (graph.params() order), whether some op
// reads it as fp32 rather than through the bf16 working copy.
std::vector<bool> read_as_fp32(const Graph& graph) {
  std::map<TensorId, bool> fp32;
  for (int n = 0; n < static_cast<int>(graph.nodes().size()); ++n) {
    const Node& node = graph.nodes()[static_cast<size_t>(n)];
    const bool bf16 = node_dtype(graph, n) == DType::kBF16;
    const uint32_t working = node.op->working_params();
    for (size_t j = 0; j < node.params.size(); ++j) {
      if (!(bf16 && j < 32 && ((working >> j) & 1u))) fp32[node.params[j]] = true;
    }
  }
  std::vector<bool> out;
  for (TensorId id : graph.params()) out.push_back(fp32.count(id) > 0);
  return out;
}

}  // namespace

uint64_t ParameterStore::fp32_weight_bytes(const Graph& graph) {
  const std::vector<bool> fp32 = read_as_fp32(graph);
  uint64_t bytes = 0;
  for (size_t i = 0; i < fp32.size(); ++i) {
    if (fp32[i]) bytes += align(graph.tensor(graph.params()[i]).desc.bytes());
  }
  return bytes > 0 ? granules(bytes) : 0;
}

PersistentBytes ParameterStore::plan_bytes(const Graph& graph, int optimizer_slots,
                                           bool accumulation, Precision precision) {
  const Layout l = block_layout(graph);
  PersistentBytes b;
  b.weights = l.param_bytes;
  // One bf16 element per fp32 weight element (the layout's padding included).
  if (precision == Precision::kBf16) b.working_weights = working_bytes(l.param_bytes);
  b.gradients = l.param_bytes * (accumulation ? 2 : 1);
  b.optimizer = l.param_bytes * static_cast<uint64_t>(optimizer_slots);
  b.buffers = l.buffer_bytes + kMetricsBytes;
  return b;
}

ParameterStore::ParameterStore(Device& device, const Graph& graph, int optimizer_slots,
                               const StoreLayout& store_layout, bool accumulation,
                               Precision precision)
    : device_(device), layout_(store_layout) {
  Layout l = block_layout(graph);
  params_ = std::move(l.params);
  buffers_ = std::move(l.buffers);
  param_by_name_ = std::move(l.param_by_name);
  buffer_by_name_ = std::move(l.buffer_by_name);
  param_block_bytes_ = l.param_bytes;
  buffer_block_bytes_ = l.buffer_bytes;
  // Note [Model state per rank]: under sharding both blocks have ranks equal parts.
  if (layout_.shard_floats > 0) {
    param_block_bytes_ =
        std::max<uint64_t>(param_block_bytes_, static_cast<uint64_t>(layout_.shard_floats) *
                                                   layout_.ranks * sizeof(float));
  }
  const int64_t floats = param_floats();
  update_begin_ = 0;
  update_end_ = floats;
  if (layout_.shard_optimizer && layout_.shard_floats > 0) {
    update_begin_ = std::min<int64_t>(layout_.shard_floats * layout_.rank, floats);
    update_end_ = std::min<int64_t>(update_begin_ + layout_.shard_floats, floats);
  }
  const auto unit = static_cast<uint64_t>(update_end_ - update_begin_) * sizeof(float);
  DeviceHeap& heap = device.memory();
  split_masters_ = precision == Precision::kBf16 &&
                   ((layout_.shard_optimizer && layout_.shard_floats > 0 && layout_.ranks > 1) ||
                    layout_.host_optimizer);
  if (split_masters_) {
    // Note [Sharded master weights]: the shard's masters (on the host with the host optimizer:
    // host_params), the compact fp32 weights.
    if (!layout_.host_optimizer) params_block_ = DeviceBuffer(heap, unit, "fp32 master shard");
    const std::vector<bool> fp32 = read_as_fp32(graph);
    uint64_t at = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      const Entry& e = params_[i];
      if (!fp32[i]) {
        fp32_offset_.push_back(kNotFp32);
        continue;
      }
      fp32_offset_.push_back(at);
      const auto begin = static_cast<int64_t>(e.offset / sizeof(float));
      const auto end = static_cast<int64_t>((e.offset + align(e.desc.bytes())) / sizeof(float));
      const auto to = static_cast<int64_t>(at / sizeof(float));
      if (!fp32_runs_.empty() && fp32_runs_.back().end == begin) {
        fp32_runs_.back().end = end;
      } else {
        fp32_runs_.push_back({begin, end, to});
      }
      at += align(e.desc.bytes());
    }
    if (at > 0) fp32_block_ = DeviceBuffer(heap, granules(at), "fp32 weights (read whole)");
  } else {
    params_block_ = DeviceBuffer(heap, param_block_bytes_, "parameters");
  }
  if (precision == Precision::kBf16) {
    working_block_ = DeviceBuffer(heap, working_bytes(param_block_bytes_), "bf16 working weights");
  }
  if (layout_.staging_bytes > 0) {
    FERRY_ASSERT(layout_.shard_optimizer && layout_.shard_floats > 0 && !accumulation,
                 "staged gradients are zero 2's: sharded, accumulating in the shard");
    grads_block_ = DeviceBuffer(heap, unit, "gradient shard");
    staging_ = DeviceBuffer(heap, layout_.staging_bytes, "gradient staging");
  } else {
    grads_block_ = DeviceBuffer(heap, param_block_bytes_, "gradients");
  }
  if (accumulation) {
    accumulation_block_ = DeviceBuffer(heap, param_block_bytes_, "accumulated gradients");
  }
  for (int s = 0; s < optimizer_slots; ++s) {
    if (layout_.host_optimizer) {
      host_state_.emplace_back(device.pinned(), update_end_ - update_begin_);
    } else {
      optimizer_blocks_.emplace_back(heap, unit, fmt::format("optimizer state {}", s));
    }
  }
  if (layout_.host_optimizer) {
    host_params_ = PinnedFloats(device.pinned(), update_end_ - update_begin_);
    host_grads_ = PinnedFloats(device.pinned(), update_end_ - update_begin_);
    // Host masters: the bf16 rounding of host_params the upload carries (two elements a float).
    if (split_masters_) host_working_ = PinnedFloats(device.pinned(), (unit / 4 + 1) / 2);
  }
  buffers_block_ = DeviceBuffer(heap, buffer_block_bytes_, "buffers");
  metrics_ = DeviceBuffer(heap, kMetricsBytes, "metrics");
}

uint64_t ParameterStore::host_bytes() const {
  uint64_t b = host_params_.bytes() + host_grads_.bytes() + host_working_.bytes();
  for (const auto& s : host_state_) b += s.bytes();
  return b;
}

void* ParameterStore::address(const Graph& graph, TensorId id) const {
  const TensorInfo& info = graph.tensor(id);
  switch (info.role) {
    case TensorRole::kParam: {
      const size_t i = param_index(graph, id);
      if (split_masters_) {
        // Note [Sharded master weights]: a weight only products read has no fp32 copy here.
        return reads_fp32(i) ? static_cast<std::byte*>(fp32_block_.data()) + fp32_offset_[i]
                             : nullptr;
      }
      return static_cast<std::byte*>(params_block_.data()) + params_[i].offset;
    }
    case TensorRole::kBuffer: {
      auto it = buffer_by_name_.find(info.name);
      FERRY_ASSERT(it != buffer_by_name_.end(), "unknown buffer " + info.name);
      return static_cast<std::byte*>(buffers_block_.data()) + buffers_[it->second].offset;
    }
    case TensorRole::kMetric:
      return id == graph.loss() ? static_cast<void*>(loss_address())
                                : static_cast<void*>(correct_address());
    default:
      FERRY_ASSERT(false, "not a persistent tensor: " + info.name);
  }
  return nullptr;
}

size_t ParameterStore::param_index(const Graph& graph, TensorId param) const {
  auto it = param_by_name_.find(graph.tensor(param).name);
  FERRY_ASSERT(it != param_by_name_.end(), "unknown parameter " + graph.tensor(param).name);
  return it->second;
}

void* ParameterStore::working_address(const Graph& graph, TensorId param) const {
  if (!has_working_copy()) return nullptr;
  return static_cast<std::byte*>(working_block_.data()) +
         params_[param_index(graph, param)].offset / 2;
}

void ParameterStore::refresh_working_weights(Stream& stream) {
  // Sharded masters: publish_masters and write_param keep the copy current.
  if (!has_working_copy() || !working_stale_ || split_masters_) return;
  device_.kernels().launch(ConvertFloats{param_floats(), DType::kF32, DType::kBF16,
                                         params_block_.data(), working_block_.data()},
                           stream);
  working_stale_ = false;
  ++working_refreshes_;
}

std::pair<int64_t, int64_t> ParameterStore::fp32_part(int r) const {
  const int64_t s = layout_.shard_floats, lo = r * s, hi = lo + s;
  int64_t first = -1, last = -1;
  for (const Fp32Run& run : fp32_runs_) {
    const int64_t b = std::max(run.begin, lo), e = std::min(run.end, hi);
    if (b >= e) continue;
    if (first < 0) first = run.to + (b - run.begin);
    last = run.to + (e - run.begin);
  }
  if (first < 0) {
    // No fp32 weight in the shard: an empty range where the next rank's starts.
    int64_t at = 0;
    for (const Fp32Run& run : fp32_runs_) {
      if (run.end <= lo) at = run.to + (run.end - run.begin);
    }
    return {at, at};
  }
  return {first, last};
}

std::vector<float> ParameterStore::read_masters() const {
  std::vector<float> out(static_cast<size_t>(update_end_ - update_begin_));
  if (layout_.host_optimizer) {
    std::copy_n(host_params_.data(), out.size(), out.data());
    return out;
  }
  const std::vector<std::byte> bytes = read(masters(), out.size() * sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

std::vector<ParameterStore::Fp32Copy> ParameterStore::fp32_copies(int64_t begin,
                                                                  int64_t end) const {
  std::vector<Fp32Copy> out;
  for (const Fp32Run& run : fp32_runs_) {
    const int64_t b = std::max(run.begin, begin), e = std::min(run.end, end);
    if (b < e) out.push_back({b, e, fp32_block_.as<float>() + run.to + (b - run.begin)});
  }
  return out;
}

float* ParameterStore::masters() const {
  if (!split_masters_) return params_block_.as<float>() + update_begin_;
  return layout_.host_optimizer ? host_params_.data() : params_block_.as<float>();
}

void ParameterStore::publish_masters(Stream& stream) {
  FERRY_ASSERT(split_masters_ && !layout_.host_optimizer,
               "publish_masters without the masters on the device");
  const int64_t n = update_end_ - update_begin_;
  if (n <= 0) return;
  device_.kernels().launch(
      ConvertFloats{n, DType::kF32, DType::kBF16, params_block_.data(), working_at(update_begin_)},
      stream);
  for (const Fp32Copy& c : fp32_copies(update_begin_, update_end_)) {
    device_.copy_async(c.to, params_block_.as<float>() + (c.begin - update_begin_),
                       static_cast<uint64_t>(c.end - c.begin) * sizeof(float), stream);
  }
}

float* ParameterStore::grad_address(const Graph& graph, TensorId param) const {
  if (staged()) return nullptr;
  return reinterpret_cast<float*>(static_cast<std::byte*>(grads_block_.data()) +
                                  params_[param_index(graph, param)].offset);
}

PersistentBytes ParameterStore::bytes() const {
  PersistentBytes b;
  b.weights = params_block_.bytes() + fp32_block_.bytes();
  b.working_weights = working_block_.bytes();
  b.gradients = grads_block_.bytes() + staging_.bytes() + accumulation_block_.bytes();
  for (const auto& o : optimizer_blocks_) b.optimizer += o.bytes();  // 0 on the host
  b.buffers = buffers_block_.bytes() + metrics_.bytes();
  return b;
}

std::vector<std::byte> ParameterStore::read(const void* src, uint64_t bytes) const {
  std::vector<std::byte> out(bytes);
  Stream& s = device_.stream(StreamKind::kCompute);
  device_.copy_async(out.data(), src, bytes, s);
  s.synchronize();
  return out;
}

void ParameterStore::write(void* dst, const void* src, uint64_t bytes) {
  Stream& s = device_.stream(StreamKind::kCompute);
  device_.copy_async(dst, src, bytes, s);
  s.synchronize();
}

void ParameterStore::initialize(const Graph& graph, uint64_t seed) {
  std::vector<std::byte> host(param_block_bytes_);
  for (TensorId id : graph.params()) {
    const Entry& e = params_[param_index(graph, id)];
    float* data = reinterpret_cast<float*>(host.data() + e.offset);
    fill_param(graph.init(id), tensor_seed(seed, e.name),
               std::span<float>(data, static_cast<size_t>(e.desc.shape.numel())));
  }
  if (split_masters_) {
    write_sharded(reinterpret_cast<const float*>(host.data()), 0, param_floats());
  } else {
    write(params_block_.data(), host.data(), host.size());
  }
  mark_weights_changed();
  std::vector<std::byte> buffers(buffer_block_bytes_);
  for (TensorId id : graph.buffers()) {
    const Entry& e = buffers_[buffer_by_name_.at(graph.tensor(id).name)];
    if (e.desc.dtype != DType::kF32) continue;  // counters start at zero
    float* data = reinterpret_cast<float*>(buffers.data() + e.offset);
    fill_param(graph.init(id), 0,
               std::span<float>(data, static_cast<size_t>(e.desc.shape.numel())));
  }
  write(buffers_block_.data(), buffers.data(), buffers.size());
  const std::vector<std::byte> zeros(param_block_bytes_);
  write(grads_block_.data(), zeros.data(), grads_block_.bytes());
  if (staging_.bytes() > 0) {
    const std::vector<std::byte> staging_zeros(staging_.bytes());
    write(staging_.data(), staging_zeros.data(), staging_zeros.size());
  }
  if (accumulation_block_.bytes() > 0) {
    write(accumulation_block_.data(), zeros.data(), zeros.size());
  }
  for (auto& o : optimizer_blocks_) write(o.data(), zeros.data(), o.bytes());
}

std::vector<std::byte> ParameterStore::read_entry(const DeviceBuffer& block, const Entry& e) const {
  return read(static_cast<std::byte*>(block.data()) + e.offset, e.desc.bytes());
}
void ParameterStore::write_entry(const DeviceBuffer& block, const Entry& e, const void* data) {
  write(static_cast<std::byte*>(block.data()) + e.offset, data, e.desc.bytes());
}

std::vector<std::byte> ParameterStore::read_param(size_t i) const {
  if (!split_masters_) return read_entry(params_block_, params_[i]);
  FERRY_ASSERT(!weights_image_.empty(), "read_param of sharded masters without the weights image");
  const Entry& e = params_[i];
  std::vector<std::byte> out(e.desc.bytes());
  std::memcpy(out.data(), weights_image_.data() + e.offset / sizeof(float), out.size());
  return out;
}

// Note [Sharded master weights]: the floats [begin, end) of the layout, `data` pointing at
// element `begin`, into this rank's masters, the compact fp32 weights and the working copy.
void ParameterStore::write_sharded(const float* data, int64_t begin, int64_t end) {
  const int64_t b = std::max(begin, update_begin_), e = std::min(end, update_end_);
  if (b < e) {
    const auto bytes = static_cast<uint64_t>(e - b) * sizeof(float);
    if (layout_.host_optimizer) {
      std::memcpy(host_params_.data() + (b - update_begin_), data + (b - begin), bytes);
    } else {
      write(params_block_.as<float>() + (b - update_begin_), data + (b - begin), bytes);
    }
  }
  for (const Fp32Copy& c : fp32_copies(begin, end)) {
    write(c.to, data + (c.begin - begin), static_cast<uint64_t>(c.end - c.begin) * sizeof(float));
  }
  std::vector<uint16_t> narrow(static_cast<size_t>(end - begin));
  for (size_t k = 0; k < narrow.size(); ++k) narrow[k] = float_to_bf16(data[k]).bits;
  write(working_at(begin), narrow.data(), narrow.size() * 2);
}

void ParameterStore::round_host_masters(int64_t begin, int64_t end) {
  auto* out = reinterpret_cast<uint16_t*>(host_working_.data());
  const float* in = host_params_.data();
  for (int64_t k = begin - update_begin_; k < end - update_begin_; ++k)
    out[k] = float_to_bf16(in[k]).bits;
}

std::vector<std::byte> ParameterStore::read_grad(size_t i) const {
  FERRY_ASSERT(!staged(), "read_grad: gradients are staged (zero 2), no whole block");
  return read_entry(grads_block_, params_[i]);
}
std::vector<std::byte> ParameterStore::read_buffer(size_t i) const {
  return read_entry(buffers_block_, buffers_[i]);
}
std::vector<std::byte> ParameterStore::read_optimizer(int slot, size_t i) const {
  if (whole_optimizer_on_device()) return read_entry(optimizer_blocks_[slot], params_[i]);
  FERRY_ASSERT(!image_.empty(), "read_optimizer of a sharded or host state without its image");
  const Entry& e = params_[i];
  std::vector<std::byte> out(e.desc.bytes());
  std::memcpy(out.data(), image_[slot].data() + e.offset / sizeof(float), out.size());
  return out;
}
void ParameterStore::write_param(size_t i, const void* data) {
  if (split_masters_) {
    const Entry& e = params_[i];
    const auto begin = static_cast<int64_t>(e.offset / sizeof(float));
    return write_sharded(static_cast<const float*>(data), begin, begin + e.desc.shape.numel());
  }
  write_entry(params_block_, params_[i], data);
  mark_weights_changed();
}
void ParameterStore::write_buffer(size_t i, const void* data) {
  write_entry(buffers_block_, buffers_[i], data);
}
void ParameterStore::write_optimizer(int slot, size_t i, const void* data) {
  if (whole_optimizer_on_device()) return write_entry(optimizer_blocks_[slot], params_[i], data);
  const int slots = optimizer_slots();
  if (image_.empty()) image_.assign(slots, std::vector<float>(static_cast<size_t>(param_floats())));
  const Entry& e = params_[i];
  std::memcpy(image_[slot].data() + e.offset / sizeof(float), data, e.desc.bytes());
}

std::vector<float> ParameterStore::read_local_optimizer(int slot) const {
  const auto n = static_cast<size_t>(update_end_ - update_begin_);
  std::vector<float> out(n);
  if (layout_.host_optimizer) {
    std::memcpy(out.data(), host_state_[slot].data(), n * sizeof(float));
    return out;
  }
  const std::vector<std::byte> bytes = read(optimizer_blocks_[slot].data(), n * sizeof(float));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

void ParameterStore::write_local_optimizer(int slot, const float* data) {
  const auto n = static_cast<size_t>(update_end_ - update_begin_);
  if (layout_.host_optimizer) {
    std::memcpy(host_state_[slot].data(), data, n * sizeof(float));
  } else {
    write(optimizer_blocks_[slot].data(), data, n * sizeof(float));
  }
}
void ParameterStore::zero_grads() {
  const std::vector<std::byte> zeros(grads_block_.bytes());
  write(grads_block_.data(), zeros.data(), zeros.size());
}

}  // namespace ferry
