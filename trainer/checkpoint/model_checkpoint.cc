// Mapping the parameter store to and from safetensors files.
#include "trainer/checkpoint/model_checkpoint.h"

#include <charconv>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/checkpoint/hf_folder.h"
#include "trainer/checkpoint/safetensors.h"

namespace ferry {

namespace {

constexpr const char* kFormat = "ferry-checkpoint-1";

// Steps, epochs and batches beyond this are not a run's (2^53: exact in every JSON reader).
constexpr int64_t kMaxCount = int64_t{1} << 53;

// The text of metadata `key`; DataError when it is missing.
const std::string& metadata_text(const SafetensorsFile& file, const std::string& key) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end()) {
    throw DataError(
        fmt::format("{}: not a ferry checkpoint (no '{}' in its metadata)", file.source(), key),
        "checkpoint.resume needs a file written by ferry; use model.init_from to "
        "start from weights alone");
  }
  return it->second;
}

// Metadata `key` as a T; DataError unless all of its text is a T.
template <class T>
T metadata_number(const SafetensorsFile& file, const std::string& key) {
  T value = 0;
  const std::string& text = metadata_text(file, key);
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || err != std::errc() || end != text.data() + text.size()) {
    throw DataError(
        fmt::format("{}: metadata '{}' is not an integer: '{}'", file.source(), key, text),
        "the checkpoint is corrupt; resume from an earlier one");
  }
  return value;
}

// A count (step, epoch, batch): in [0, 2^53].
int64_t metadata_count(const SafetensorsFile& file, const std::string& key) {
  const int64_t value = metadata_number<int64_t>(file, key);
  if (value < 0 || value > kMaxCount) {
    throw DataError(
        fmt::format("{}: metadata '{}' is {}, outside [0, 2^53]", file.source(), key, value),
        "the checkpoint is corrupt; resume from an earlier one");
  }
  return value;
}

// A file this version can resume: its "format" is ours.
void check_format(const SafetensorsFile& file) {
  auto it = file.metadata().find("format");
  const std::string format = it == file.metadata().end() ? "" : it->second;
  if (format == kFormat) return;
  throw DataError(
      format.empty()
          ? fmt::format("{}: not a ferry checkpoint (no 'format' in its metadata)", file.source())
          : fmt::format("{}: checkpoint format '{}' is not the '{}' this version reads",
                        file.source(), format, kFormat),
      "checkpoint.resume needs a file written by this version of ferry; use model.init_from to "
      "start from weights alone");
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
  for (const auto& [key, value] : state.shape) metadata[key] = value;
  write_safetensors(path, tensors, metadata);
}

// Note [Every tensor accounted for]
// A weights file and the model agree both ways, or nothing loads: every parameter and F32
// buffer of the model is read from the file (a missing one is an error naming it), and every
// tensor of the file is read by the model (an unused one is an error naming it and counting the
// rest, unless model.init_ignore_unused), so a 2-layer file never loads silently into a 1-layer
// model. A file tensor is read without a parameter of its own when it is
// - a tied parameter's second name (Hugging Face's lm_head.weight): it must equal the
//   parameter, else the file's head is untied and a tied model would silently drop it;
// - a counter ferry recomputes (num_batches_tracked, from the step);
// - a causal-mask buffer that older Hugging Face GPT-2 files store (attn.bias,
//   attn.masked_bias), which attention computes;
// - a ferry checkpoint's optimizer state (optimizer.*), which only resume reads.
// Hugging Face's GPT2Model stores the blocks without GPT2LMHeadModel's "transformer." prefix;
// a file with no "transformer." name at all is read under the model's names without it.

namespace {

constexpr std::string_view kTransformerPrefix = "transformer.";

// Whether `file` names the model's "transformer.*" tensors without that prefix: it has no
// "transformer." name and holds one of the model's under its stripped name.
template <typename File>
bool strips_prefix(const File& file, const ParameterStore& store) {
  for (const auto& e : file.entries()) {
    if (e.name.starts_with(kTransformerPrefix)) return false;
  }
  for (const auto& e : store.params()) {
    if (e.name.starts_with(kTransformerPrefix) &&
        file.find(std::string_view(e.name).substr(kTransformerPrefix.size()))) {
      return true;
    }
  }
  return false;
}

std::string name_in_file(const std::string& name, bool strip) {
  return strip && name.starts_with(kTransformerPrefix) ? name.substr(kTransformerPrefix.size())
                                                       : name;
}

// A file tensor no parameter reads that is still not "unused" (Note [Every tensor accounted
// for]): a Hugging Face mask buffer, or a ferry checkpoint's optimizer state.
bool known_extra(const std::string& name, bool ferry_file) {
  return (ferry_file && name.starts_with("optimizer.")) || name.ends_with(".attn.bias") ||
         name.ends_with(".attn.masked_bias") || name == "attn.bias" || name == "attn.masked_bias";
}

bool same_tensor(const SafetensorsEntry& a, const SafetensorsEntry& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.bytes.size() == b.bytes.size() &&
         std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()) == 0;
}

// A model folder's shards as one file (hf_folder.h): names looked up across the shards, errors
// naming the folder.
class FolderTensors {
 public:
  FolderTensors(std::vector<SafetensorsFile> files, std::string dir)
      : files_(std::move(files)), source_(std::move(dir)) {
    for (const SafetensorsFile& f : files_) {
      for (const SafetensorsEntry& e : f.entries()) entries_.push_back(e);
    }
  }
  const std::string& source() const { return source_; }
  const SafetensorsMetadata& metadata() const { return files_.front().metadata(); }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(std::string_view name) const {
    for (const SafetensorsFile& f : files_) {
      if (const SafetensorsEntry* e = f.find(name)) return e;
    }
    return nullptr;
  }
  const SafetensorsEntry& at(std::string_view name) const {
    if (const SafetensorsEntry* e = find(name)) return *e;
    throw DataError(fmt::format("model folder '{}' has no tensor '{}'", source_, name),
                    "the folder holds another model than its config.json describes");
  }

 private:
  std::vector<SafetensorsFile> files_;
  std::vector<SafetensorsEntry> entries_;
  std::string source_;
};

template <typename File>
size_t load_model_tensors(const File& file, ParameterStore& store, const WeightsMapping& mapping) {
  const bool strip = strips_prefix(file, store);
  const auto format = file.metadata().find("format");
  const bool ferry_file = format != file.metadata().end() && format->second == kFormat;
  std::set<std::string> read;
  std::vector<std::byte> host;
  for (size_t i = 0; i < store.params().size(); ++i) {
    const auto& e = store.params()[i];
    const std::string name = name_in_file(e.name, strip);
    copy_into(file.at(name), e, file.source(), host);
    store.write_param(i, host.data());
    read.insert(name);
  }
  for (size_t i = 0; i < store.buffers().size(); ++i) {
    const auto& e = store.buffers()[i];
    const std::string name = name_in_file(e.name, strip);
    read.insert(name);
    if (e.desc.dtype != DType::kF32) continue;  // counters are recomputed from the step
    const SafetensorsEntry* entry = file.find(name);
    if (!entry) {
      throw DataError(
          fmt::format("{}: has no '{}' (BN running statistics are required)", file.source(), name));
    }
    copy_into(*entry, e, file.source(), host);
    store.write_buffer(i, host.data());
  }
  for (const auto& [alias, param] : mapping.tied) {
    const std::string name = name_in_file(alias, strip);
    const SafetensorsEntry* entry = file.find(name);
    if (!entry) continue;  // stored once, under the parameter's name
    const SafetensorsEntry* own = file.find(name_in_file(param, strip));
    if (!own || !same_tensor(*entry, *own)) {
      throw DataError(fmt::format("{}: '{}' differs from '{}' (an untied head: Hugging Face's "
                                  "tie_word_embeddings=False), but this model ties '{}' to '{}'",
                                  file.source(), name, name_in_file(param, strip), alias, param),
                      "ferry's model ties them; load weights saved with tied embeddings");
    }
    read.insert(name);
  }
  std::vector<std::string> unused;
  for (const auto& e : file.entries()) {
    if (!read.count(e.name) && !known_extra(e.name, ferry_file)) unused.push_back(e.name);
  }
  if (!unused.empty() && !mapping.ignore_unused) {
    throw DataError(
        fmt::format("{}: tensor '{}'{} is read by no parameter of the model", file.source(),
                    unused.front(),
                    unused.size() > 1 ? fmt::format(" (and {} others)", unused.size() - 1) : ""),
        "the file was written for another or a larger model (model.name, model.layers); set "
        "model.init_ignore_unused=true to load the rest anyway");
  }
  return unused.size();
}

}  // namespace

std::map<std::string, std::string> tied_weight_names(const Graph& graph) {
  std::map<std::string, std::string> tied;
  std::vector<bool> owned(graph.tensors().size(), false);
  for (const Node& node : graph.nodes()) {
    for (TensorId p : node.params) {
      const size_t id = static_cast<size_t>(p);
      if (owned[id]) tied[node.name + ".weight"] = graph.tensor(p).name;
      owned[id] = true;
    }
  }
  return tied;
}

size_t load_weights(const std::string& path, ParameterStore& store, const WeightsMapping& mapping) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return load_model_tensors(FolderTensors(read_folder_weights(path), path), store, mapping);
  }
  return load_model_tensors(read_safetensors(path), store, mapping);
}

// Note [What resume checks]
// A resumed run must be the run that wrote the checkpoint: the same model (name and shape keys)
// reading data of the same shape. Keys that change no parameter's shape (model.heads,
// data.seq_len) would otherwise load and train on silently, so the checkpoint's metadata records
// them (config key -> value text) and resume compares them before anything loads. A checkpoint
// written before a key was recorded still resumes; the keys it lacks are reported unchecked.

namespace {

// ConfigError on the first key of `shape` whose recorded value differs; the keys not recorded.
std::vector<std::string> check_shape(const SafetensorsFile& file,
                                     const std::map<std::string, std::string>& shape) {
  std::vector<std::string> unchecked;
  for (const auto& [key, value] : shape) {
    auto it = file.metadata().find(key);
    if (it == file.metadata().end() && key == "model.name") it = file.metadata().find("model");
    if (it == file.metadata().end()) {
      unchecked.push_back(key);
      continue;
    }
    if (it->second != value) {
      throw ConfigError(fmt::format("checkpoint.resume: {} is {} but '{}' was written with {}={}",
                                    key, value, file.source(), key, it->second),
                        fmt::format("set {}={} to resume that run, or start a fresh one "
                                    "(checkpoint.resume=\"\", another checkpoint.dir)",
                                    key, it->second));
    }
  }
  return unchecked;
}

}  // namespace

TrainingState load_checkpoint(const std::string& path, ParameterStore& store,
                              const std::vector<std::string>& slot_names,
                              const std::map<std::string, std::string>& shape) {
  const SafetensorsFile file = read_safetensors(path);
  check_format(file);
  TrainingState state;
  state.unchecked = check_shape(file, shape);
  state.shape = shape;
  state.step = metadata_count(file, "step");
  state.epoch = metadata_count(file, "epoch");
  state.batch_in_epoch = metadata_count(file, "batch_in_epoch");
  state.seed = metadata_number<uint64_t>(file, "seed");
  if (auto it = file.metadata().find("model"); it != file.metadata().end())
    state.model = it->second;
  load_model_tensors(file, store, {});
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
