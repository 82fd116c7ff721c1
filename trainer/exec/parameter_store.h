// Persistent device memory by lifetime class (llm.c style): parameters, gradients, optimizer
// state, buffers each in a block cut by one size table (Note [Blocks of one layout]).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "device/device.h"
#include "prefetch/plan.h"
#include "trainer/model/graph.h"

namespace ferry {

// Note [Blocks of one layout]
// Persistent device memory by lifetime class (llm.c style): parameters in one block, their
// gradients in a second block with the same layout, optimizer state in `slots` more blocks of
// that layout, and buffers (BN statistics) plus metrics in a last one. Each block is cut by a
// size table built from the graph's parameter list. Because the layouts match, an optimizer
// step or a gradient all-reduce is one launch over a contiguous range.

class ParameterStore {
 public:
  struct Entry {
    std::string name;
    TensorDesc desc;
    uint64_t offset = 0;  // bytes from the start of its block, 64-byte aligned
  };

  // The persistent bytes a store for `graph` would hold, without allocating.
  static PersistentBytes plan_bytes(const Graph& graph, int optimizer_slots,
                                    Precision precision = Precision::kFp32);

  // Allocates every block on `device` (throws OutOfMemoryError naming the block).
  ParameterStore(Device& device, const Graph& graph, int optimizer_slots);

  const std::vector<Entry>& params() const { return params_; }
  const std::vector<Entry>& buffers() const { return buffers_; }
  // Floats in the parameter block, padding included (padding stays zero).
  int64_t param_floats() const { return static_cast<int64_t>(param_block_bytes_ / sizeof(float)); }
  float* param_block() const { return params_block_.as<float>(); }
  float* grad_block() const { return grads_block_.as<float>(); }
  float* optimizer_block(int slot) const { return optimizer_blocks_[slot].as<float>(); }
  void* buffer_block() const { return buffers_block_.data(); }
  uint64_t buffer_block_bytes() const { return buffer_block_bytes_; }
  int optimizer_slots() const { return static_cast<int>(optimizer_blocks_.size()); }

  // The device address of a parameter, buffer or metric of any graph of this model.
  void* address(const Graph& graph, TensorId id) const;
  // The device address of a parameter's gradient.
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
  std::vector<std::byte> read_optimizer(int slot, size_t i) const;
  void write_param(size_t i, const void* data);
  void write_buffer(size_t i, const void* data);
  void write_optimizer(int slot, size_t i, const void* data);
  void zero_grads();

 private:
  std::vector<std::byte> read(const void* src, uint64_t bytes) const;
  void write(void* dst, const void* src, uint64_t bytes);
  // One tensor of a block (the entry's offset and size).
  std::vector<std::byte> read_entry(const DeviceBuffer& block, const Entry& e) const;
  void write_entry(const DeviceBuffer& block, const Entry& e, const void* data);

  Device& device_;
  std::vector<Entry> params_;
  std::vector<Entry> buffers_;
  std::map<std::string, size_t> param_by_name_;
  std::map<std::string, size_t> buffer_by_name_;
  uint64_t param_block_bytes_ = 0;
  uint64_t buffer_block_bytes_ = 0;
  DeviceBuffer params_block_;
  DeviceBuffer grads_block_;
  std::vector<DeviceBuffer> optimizer_blocks_;
  DeviceBuffer buffers_block_;
  DeviceBuffer metrics_;
};

}  // namespace ferry
