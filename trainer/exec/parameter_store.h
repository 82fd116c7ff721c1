// Persistent device memory by lifetime class (llm.c style): parameters, gradients, optimizer
// state, buffers each in a block cut by one size table (Note [Blocks of one layout]).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "device/device.h"
#include "device/pinned_floats.h"
#include "prefetch/plan.h"
#include "trainer/model/graph.h"

namespace ferry {

// Note [Blocks of one layout]
// Persistent device memory by lifetime class (llm.c style): parameters in one block, their
// gradients in a second block with the same layout, optimizer state in `slots` more blocks of
// that layout, and buffers (BN statistics) plus metrics in a last one. Each block is cut by a
// size table built from the graph's parameter list. Because the layouts match, an optimizer
// step or a gradient all-reduce is one launch over a contiguous range. Under gradient
// accumulation (optim.accumulate > 1) a second gradient block of the same layout holds the sum
// of the update's earlier micro-batches (Note [Accumulating micro-batches] in
// trainer/session/accumulation.h); it counts as gradients in PersistentBytes.

// Note [The bf16 working copy]
// Under device.precision bf16 the store holds, beside the fp32 master weights, one bf16 copy of
// the whole parameter block (apex O2's and Megatron's model weights): element i of the copy is
// element i of the parameter block rounded to nearest even (ConvertFloats), so parameter p's
// copy starts at half its byte offset, padding included (zeros). Convolutions and linear layers
// (the tied LM head too) read their weights from it (OpIo::working); every other op reads the
// fp32 weights. It is made by one launch, once per update: every write of the parameters (the
// optimizer's update, initialize, write_param, a broadcast) marks it stale
// (mark_weights_changed), and the executor refreshes it before the next step that reads it
// (refresh_working_weights), on the compute stream, so the step's kernels run after it.

// Note [Sharded master weights]
// Under device.precision bf16 with memory.zero 1 or 2 on several ranks (StoreLayout::
// shard_optimizer) a rank keeps the fp32 master weights of its shard only: the parameter block is
// S floats, elements [update_begin(), update_end()) of the (padded) layout. Every rank keeps the
// whole bf16 working copy, which the products read, and, whole, the "fp32 weights": every
// parameter some op reads as fp32 (embeddings, norms' gains and shifts, biases: all but the
// weights of bf16 convolutions and linear layers, Op::working_params), in a compact block of
// their own (graph order, each padded to 64 bytes as in the layout). After the shard's update
// publish_masters rounds the shard into its part of the working copy (ConvertFloats, round to
// nearest even) and copies the shard's fp32 weights into the compact block; the all-gather then
// moves the working copy in bf16 and the compact block in fp32 (ModelStateStep). Per rank:
// 2 bytes a parameter (working copy), 4/N (masters) and 4 per fp32 weight. The values every op
// reads are the bits zero 0 gives it: the working copy is the same rounding of the same masters,
// the fp32 weights are the masters. Checkpoints read whole masters from an image every rank's
// shard is broadcast into (Session::gather_optimizer_state); write_param writes the rank's shard,
// the compact block and the working copy (rounded on the host as ConvertFloats rounds).

// How a rank holds the model state (Note [Model state per rank] in trainer/plan/model_state.h):
// the parameter and gradient blocks padded to ranks * shard_floats, the optimizer state of the
// rank's shard only, on the device or in host memory.
struct StoreLayout {
  int ranks = 1;
  int rank = 0;
  int64_t shard_floats = 0;      // > 0: blocks padded to ranks * shard_floats (zero 1 and 2)
  bool shard_optimizer = false;  // the optimizer state holds the rank's shard only
  bool host_optimizer = false;   // the optimizer state (and the update's copies) in host memory
  // > 0: zero 2 without a whole gradient block. The gradient block holds the rank's shard only
  // (shard_floats) and backward writes into a staging area of these bytes (Note [Gradients
  // through a staging ring] in trainer/optim/gradient_staging.h).
  uint64_t staging_bytes = 0;
  uint64_t staging_slot_bytes = 0;  // one of its two bucket slots
};

class ParameterStore {
 public:
  struct Entry {
    std::string name;
    TensorDesc desc;
    uint64_t offset = 0;  // bytes from the start of its block, 64-byte aligned
  };

  // The persistent bytes a store for `graph` would hold, without allocating. `accumulation`:
  // with the gradient accumulation block.
  static PersistentBytes plan_bytes(const Graph& graph, int optimizer_slots,
                                    bool accumulation = false,
                                    Precision precision = Precision::kFp32);

  // Allocates every block on `device` (throws OutOfMemoryError naming the block); the host
  // optimizer's blocks in host memory. `accumulation`: with the gradient accumulation block.
  // `precision` bf16: with the bf16 working copy (Note [The bf16 working copy]).
  ParameterStore(Device& device, const Graph& graph, int optimizer_slots,
                 const StoreLayout& layout = {}, bool accumulation = false,
                 Precision precision = Precision::kFp32);

  const std::vector<Entry>& params() const { return params_; }
  const std::vector<Entry>& buffers() const { return buffers_; }
  // Floats in the parameter block, padding included (padding stays zero).
  int64_t param_floats() const { return static_cast<int64_t>(param_block_bytes_ / sizeof(float)); }
  // The fp32 parameter block: the whole layout, or (Note [Sharded master weights]) the rank's
  // shard of masters only.
  float* param_block() const { return params_block_.as<float>(); }
  // The fp32 masters of the floats this rank updates, [update_begin(), update_end()).
  // With the host optimizer under bf16 (Note [Sharded master weights]) they are host_params.
  float* masters() const;
  // Note [Sharded master weights]: whether this rank keeps only its shard of the fp32 weights.
  bool split_masters() const { return split_masters_; }
  // Sharded masters: whether parameter i is read as fp32 (kept whole in the compact block).
  bool reads_fp32(size_t i) const { return fp32_offset_[i] != kNotFp32; }
  // Sharded masters: after an update of the masters (on `stream`), the shard rounded into the
  // working copy and its fp32 weights copied into the compact block, on `stream`.
  void publish_masters(Stream& stream);
  // Sharded masters: the bf16 working copy as floats (two elements a float) and the compact
  // block of fp32 weights, and the range [first, second) of compact floats rank `r`'s shard
  // holds (the ranks' ranges tile the block in rank order).
  float* working_floats() const { return working_block_.as<float>(); }
  float* fp32_weights() const { return fp32_block_.as<float>(); }
  uint64_t fp32_weights_bytes() const { return fp32_block_.bytes(); }
  // This rank's masters as host floats. Synchronous.
  std::vector<float> read_masters() const;
  std::pair<int64_t, int64_t> fp32_part(int r) const;
  // Split masters: the working copy's bytes from element `at` of the layout; the places in the
  // compact block of the fp32 weights among the elements [begin, end) of the layout.
  void* working_at(int64_t at) const { return working_block_.as<std::byte>() + at * 2; }
  struct Fp32Copy {
    int64_t begin, end;  // elements of the layout
    float* to;           // where element `begin` lives in the compact block
  };
  std::vector<Fp32Copy> fp32_copies(int64_t begin, int64_t end) const;
  // Host masters (bf16 with memory.optimizer host): host_params rounded to bf16 (round to
  // nearest even, as ConvertFloats) for the elements [begin, end) of the layout, into
  // host_working(), whose element k is element update_begin() + k.
  bool host_masters() const { return split_masters_ && layout_.host_optimizer; }
  void round_host_masters(int64_t begin, int64_t end);
  void* host_working() { return host_working_.data(); }
  // Bytes of the compact fp32-weights block `graph` would get (0 in fp32).
  static uint64_t fp32_weight_bytes(const Graph& graph);
  // Sharded masters: the whole fp32 weights as host floats, every rank's shard broadcast into
  // it by the session before a checkpoint (read_param then reads it); dropped with the
  // optimizer image.
  void set_weights_image(std::vector<float> image) { weights_image_ = std::move(image); }
  // The whole gradient block (null when gradients are staged: StoreLayout::staging_bytes).
  float* grad_block() const { return staged() ? nullptr : grads_block_.as<float>(); }
  bool staged() const { return layout_.staging_bytes > 0; }
  // The gradients of the floats this rank updates, [update_begin(), update_end()): in the
  // gradient block, or the whole (shard-sized) block when gradients are staged.
  float* update_grads() const {
    return staged() ? grads_block_.as<float>() : grads_block_.as<float>() + update_begin_;
  }
  // The staging area backward writes gradients into under zero 2 (null otherwise).
  std::byte* staging() const { return staging_.as<std::byte>(); }
  uint64_t staging_bytes() const { return staging_.bytes(); }
  uint64_t staging_slot_bytes() const { return layout_.staging_slot_bytes; }
  // The gradient accumulation block (same layout as grad_block), or null without one.
  float* accumulation_block() const { return accumulation_block_.as<float>(); }
  // The optimizer state of the floats this rank updates, [update_begin(), update_end()) of the
  // block: on the device, or in host memory under StoreLayout::host_optimizer.
  float* optimizer_block(int slot) const {
    return layout_.host_optimizer ? host_state_[slot].data() : optimizer_blocks_[slot].as<float>();
  }
  const StoreLayout& layout() const { return layout_; }
  int64_t update_begin() const { return update_begin_; }
  int64_t update_end() const { return update_end_; }
  // Whether the optimizer state is the whole block's, on the device (read_optimizer and
  // write_optimizer reach it directly); else through the optimizer image.
  bool whole_optimizer_on_device() const {
    return !layout_.shard_optimizer && !layout_.host_optimizer;
  }
  // memory.optimizer host: the host copies of this rank's weights and gradients the update works
  // on (update_end() - update_begin() floats each). They and the host state are pinned blocks of
  // the device's PinnedAllocator, bound to the rank's NUMA node where the session places host
  // memory (DeviceOptions::place_host_memory), so the optimizer's copies cross only the GPU's own
  // link.
  float* host_params() { return host_params_.data(); }
  float* host_grads() { return host_grads_.data(); }
  // Host bytes of the model state (memory.optimizer host): state, weights and gradients.
  uint64_t host_bytes() const;
  void* buffer_block() const { return buffers_block_.data(); }
  uint64_t buffer_block_bytes() const { return buffer_block_bytes_; }
  int optimizer_slots() const {
    return static_cast<int>(layout_.host_optimizer ? host_state_.size() : optimizer_blocks_.size());
  }

  // The device address of a parameter, buffer or metric of any graph of this model.
  void* address(const Graph& graph, TensorId id) const;
  // The bf16 working copy of a parameter (Note [The bf16 working copy]), or null in fp32.
  void* working_address(const Graph& graph, TensorId param) const;
  bool has_working_copy() const { return working_block_.bytes() > 0; }
  // The parameters changed: the working copy is stale until the next refresh.
  void mark_weights_changed() { working_stale_ = true; }
  // Narrows the parameter block into the working copy on `stream` if it is stale (no-op in
  // fp32, and when nothing changed since the last refresh).
  void refresh_working_weights(Stream& stream);
  // How many times refresh_working_weights narrowed the weights (once per update).
  uint64_t working_refreshes() const { return working_refreshes_; }
  // The device address of a parameter's gradient (null when gradients are staged).
  float* grad_address(const Graph& graph, TensorId param) const;
  // Index into params() of a graph's parameter.
  size_t param_index(const Graph& graph, TensorId param) const;
  float* loss_address() const { return static_cast<float*>(metrics_.data()); }
  int32_t* correct_address() const {
    return reinterpret_cast<int32_t*>(static_cast<std::byte*>(metrics_.data()) + 64);
  }
  // The gradients' sum of squares of the last step that clipped them (optim.clip_norm).
  float* grad_sq_address() const {
    return reinterpret_cast<float*>(static_cast<std::byte*>(metrics_.data()) + 128);
  }

  PersistentBytes bytes() const;

  // Draws the initial parameters and buffers from the graph's initialisers (seeded per name)
  // and zeroes gradients and optimizer state. Synchronous.
  void initialize(const Graph& graph, uint64_t seed);
  // Host copies of a block's tensor, and writes of one. Synchronous (on the compute stream).
  std::vector<std::byte> read_param(size_t i) const;
  std::vector<std::byte> read_grad(size_t i) const;
  std::vector<std::byte> read_buffer(size_t i) const;
  // The optimizer state of parameter i, whole: from the device block, or (sharded or host state)
  // from the optimizer image, which must then be set.
  std::vector<std::byte> read_optimizer(int slot, size_t i) const;
  void write_param(size_t i, const void* data);
  void write_buffer(size_t i, const void* data);
  // Writes parameter i's whole optimizer state: into the device block, or (sharded or host
  // state) into the optimizer image, created zeroed on first use; take_optimizer_image() then
  // gives it to the caller, which keeps this rank's shard of it (set_local_optimizer).
  void write_optimizer(int slot, size_t i, const void* data);
  // Note [One file for every shard]: the whole optimizer state as host floats, one vector of
  // param_floats() per slot, assembled from every rank's shard by the session.
  using OptimizerImage = std::vector<std::vector<float>>;
  void set_optimizer_image(OptimizerImage image) { image_ = std::move(image); }
  OptimizerImage take_optimizer_image() {
    weights_image_.clear();
    return std::move(image_);
  }
  bool has_optimizer_image() const { return !image_.empty(); }
  // This rank's shard of the optimizer state as host floats (update_end() - update_begin() per
  // slot), read or written. Synchronous.
  std::vector<float> read_local_optimizer(int slot) const;
  void write_local_optimizer(int slot, const float* data);
  void zero_grads();

 private:
  std::vector<std::byte> read(const void* src, uint64_t bytes) const;
  void write(void* dst, const void* src, uint64_t bytes);
  // One tensor of a block (the entry's offset and size).
  std::vector<std::byte> read_entry(const DeviceBuffer& block, const Entry& e) const;
  void write_entry(const DeviceBuffer& block, const Entry& e, const void* data);
  void write_sharded(const float* data, int64_t begin, int64_t end);

  static constexpr uint64_t kNotFp32 = ~uint64_t{0};
  // Sharded masters: the compact fp32 block's runs, each [begin, end) elements of the layout
  // (whole padded parameters in a row) at compact float `to`.
  struct Fp32Run {
    int64_t begin, end, to;
  };

  Device& device_;
  std::vector<Entry> params_;
  std::vector<Entry> buffers_;
  std::map<std::string, size_t> param_by_name_;
  std::map<std::string, size_t> buffer_by_name_;
  uint64_t param_block_bytes_ = 0;
  uint64_t buffer_block_bytes_ = 0;
  DeviceBuffer params_block_;
  DeviceBuffer working_block_;  // device.precision bf16 only
  // Note [Sharded master weights]: the compact fp32 weights, per parameter its byte offset there
  // (kNotFp32: read only through the working copy), its runs, the checkpoint's weights image.
  bool split_masters_ = false;
  DeviceBuffer fp32_block_;
  std::vector<uint64_t> fp32_offset_;
  std::vector<Fp32Run> fp32_runs_;
  std::vector<float> weights_image_;
  bool working_stale_ = true;
  uint64_t working_refreshes_ = 0;
  DeviceBuffer grads_block_;
  DeviceBuffer accumulation_block_;  // optim.accumulate > 1 only
  DeviceBuffer staging_;             // zero 2's staged gradients only
  std::vector<DeviceBuffer> optimizer_blocks_;
  StoreLayout layout_;
  int64_t update_begin_ = 0, update_end_ = 0;
  std::vector<PinnedFloats> host_state_;  // memory.optimizer host
  PinnedFloats host_params_, host_grads_;
  PinnedFloats host_working_;  // host masters: bf16 pairs
  OptimizerImage image_;
  DeviceBuffer buffers_block_;
  DeviceBuffer metrics_;
};

}  // namespace ferry
