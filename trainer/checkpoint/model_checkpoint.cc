// Mapping the parameter store to and from safetensors files.
#include "trainer/checkpoint/model_checkpoint.h"

#include <cstring>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/checkpoint/safetensors.h"

namespace ferry {

namespace {

constexpr const char* kFormat = "ferry-checkpoint-1";

int64_t metadata_int(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end()) {
    throw DataError(
        fmt::format("{}: not a ferry checkpoint (no '{}' in its metadata)", file.source(), key),
        "checkpoint.resume needs a file written by ferry; use model.init_from to "
        "start from weights alone");
  }
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    throw DataError(
        fmt::format("{}: metadata '{}' is not an integer: '{}'", file.source(), key, it->second));
  }
}

void copy_into(const SafetensorsEntry& entry, const ParameterStore::Entry& target,
               const std::string& source, std::vector<std::byte>& host) {
  if (entry.dtype != target.desc.dtype || entry.shape != target.desc.shape) {
    throw DataError(fmt::format("{}: '{}' is {} {} but the model expects {} {}", source, entry.name,
                                dtype_name(entry.dtype), entry.shape.str(),
                                dtype_name(target.desc.dtype), target.desc.shape.str()),
                    "the checkpoint was written for another model, model.classes or "
                    "model.input");
  }
  host.resize(entry.bytes.size());
  std::memcpy(host.data(), entry.bytes.data(), entry.bytes.size());
}

}  // namespace

std::vector<std::string> optimizer_slot_names(int slots, bool adamw) {
  if (adamw) return {"exp_avg", "exp_avg_sq"};
  return slots > 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
}

void save_checkpoint(const std::string& path, const ParameterStore& store,
                     const std::vector<std::string>& slot_names, const TrainingState& state) {
  std::vector<std::vector<std::byte>> data;
  std::vector<SafetensorsTensor> tensors;
  const size_t count = store.params().size() * (1 + slot_names.size()) + store.buffers().size();
  data.reserve(count);
  tensors.reserve(count);
  for (size_t i = 0; i < store.params().size(); ++i) {
    const auto& e = store.params()[i];
    data.push_back(store.read_param(i));
    tensors.push_back({e.name, e.desc.dtype, e.desc.shape, data.back().data()});
  }
  for (size_t i = 0; i < store.buffers().size(); ++i) {
    const auto& e = store.buffers()[i];
    data.push_back(store.read_buffer(i));
    if (e.desc.dtype == DType::kI64) {  // num_batches_tracked: one per training step
      const int64_t steps = state.step;
      std::memcpy(data.back().data(), &steps, sizeof(steps));
    }
    tensors.push_back({e.name, e.desc.dtype, e.desc.shape, data.back().data()});
  }
  for (size_t s = 0; s < slot_names.size(); ++s) {
    for (size_t i = 0; i < store.params().size(); ++i) {
      const auto& e = store.params()[i];
      data.push_back(store.read_optimizer(static_cast<int>(s), i));
      tensors.push_back({fmt::format("optimizer.{}.{}", slot_names[s], e.name), e.desc.dtype,
                         e.desc.shape, data.back().data()});
    }
  }
  SafetensorsMetadata metadata{{"format", kFormat},
                               {"model", state.model},
                               {"step", std::to_string(state.step)},
                               {"epoch", std::to_string(state.epoch)},
                               {"batch_in_epoch", std::to_string(state.batch_in_epoch)},
                               {"seed", std::to_string(state.seed)}};
  write_safetensors(path, tensors, metadata);
}

namespace {

void load_model_tensors(const SafetensorsFile& file, ParameterStore& store) {
  std::vector<std::byte> host;
  for (size_t i = 0; i < store.params().size(); ++i) {
    const auto& e = store.params()[i];
    copy_into(file.at(e.name), e, file.source(), host);
    store.write_param(i, host.data());
  }
  for (size_t i = 0; i < store.buffers().size(); ++i) {
    const auto& e = store.buffers()[i];
    if (e.desc.dtype != DType::kF32) continue;  // counters are recomputed from the step
    const SafetensorsEntry* entry = file.find(e.name);
    if (!entry) {
      throw DataError(fmt::format("{}: has no '{}' (BN running statistics are required)",
                                  file.source(), e.name));
    }
    copy_into(*entry, e, file.source(), host);
    store.write_buffer(i, host.data());
  }
}

}  // namespace

void load_weights(const std::string& path, ParameterStore& store) {
  load_model_tensors(read_safetensors(path), store);
}

TrainingState load_checkpoint(const std::string& path, ParameterStore& store,
                              const std::vector<std::string>& slot_names) {
  const SafetensorsFile file = read_safetensors(path);
  TrainingState state;
  state.step = metadata_int(file, "step");
  state.epoch = metadata_int(file, "epoch");
  state.batch_in_epoch = metadata_int(file, "batch_in_epoch");
  state.seed = static_cast<uint64_t>(metadata_int(file, "seed"));
  if (auto it = file.metadata().find("model"); it != file.metadata().end())
    state.model = it->second;
  load_model_tensors(file, store);
  std::vector<std::byte> host;
  for (size_t s = 0; s < slot_names.size(); ++s) {
    for (size_t i = 0; i < store.params().size(); ++i) {
      const auto& e = store.params()[i];
      const std::string name = fmt::format("optimizer.{}.{}", slot_names[s], e.name);
      const SafetensorsEntry* entry = file.find(name);
      if (!entry) {
        throw DataError(fmt::format("{}: has no optimizer state '{}'", file.source(), name),
                        "resume with the optimizer (optim.name, optim.momentum) the checkpoint "
                        "was written with");
      }
      copy_into(*entry, e, file.source(), host);
      store.write_optimizer(static_cast<int>(s), i, host.data());
    }
  }
  return state;
}

}  // namespace ferry
