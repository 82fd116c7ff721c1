// Weight loading accounts for every tensor both ways (Note [Every tensor accounted for] in
// trainer/checkpoint/model_checkpoint.cc) on a 1-layer GPT-2, without Python: missing, unused
// (and skipped on request), an untied or a tied head stored twice, GPT2Model's names, Hugging
// Face's mask buffers; and resume's shape check (Note [What resume checks]).
#include "trainer/checkpoint/model_checkpoint.h"

#include <cstring>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/temp_dir.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

// A 1-layer GPT-2 of width 16 on a CPU device, its parameters initialised from `seed`.
struct TinyGpt {
  explicit TinyGpt(uint64_t seed = 0) { store.initialize(graph, seed); }
  std::unique_ptr<Device> device = [] {
    DeviceOptions o;
    o.memory = 64 << 20;
    return create_device(o);
  }();
  Graph graph = build_token_model("gpt2", 2, 8, TransformerSizes{1, 2, 16, 32, 8, 0.0});
  ParameterStore store{*device, graph, 0};
};

// The store's parameters as a file's tensors under their names (names[i] replaces name i when
// given), plus `extra`.
class FileWriter {
 public:
  explicit FileWriter(const ParameterStore& store) {
    for (size_t i = 0; i < store.params().size(); ++i) {
      data_.push_back(store.read_param(i));
      const auto& e = store.params()[i];
      tensors_.push_back({e.name, e.desc.dtype, e.desc.shape, nullptr});
    }
  }
  void rename(const std::function<std::string(const std::string&)>& f) {
    for (auto& t : tensors_) t.name = f(t.name);
  }
  // A copy of tensor `from`'s bytes under `name`, with byte 0 flipped when `differ`.
  void copy(const std::string& from, const std::string& name, bool differ = false) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].name != from) continue;
      data_.push_back(data_[i]);
      if (differ) data_.back()[0] ^= std::byte{1};
      tensors_.push_back({name, tensors_[i].dtype, tensors_[i].shape, nullptr});
      return;
    }
    ADD_FAILURE() << "no tensor " << from;
  }
  void add(const std::string& name, Shape shape) {
    data_.emplace_back(static_cast<size_t>(shape.numel()) * 4, std::byte{0});
    tensors_.push_back({name, DType::kF32, shape, nullptr});
  }
  void remove(const std::string& name) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (tensors_[i].name != name) continue;
      tensors_.erase(tensors_.begin() + static_cast<std::ptrdiff_t>(i));
      data_.erase(data_.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
  std::string write(const std::string& path, const SafetensorsMetadata& metadata = {}) {
    for (size_t i = 0; i < tensors_.size(); ++i) tensors_[i].data = data_[i].data();
    write_safetensors(path, tensors_, metadata);
    return path;
  }

 private:
  std::vector<std::vector<std::byte>> data_;
  std::vector<SafetensorsTensor> tensors_;
};

std::string load_error(const std::string& path, ParameterStore& store,
                       const WeightsMapping& mapping) {
  try {
    load_weights(path, store, mapping);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool same_parameters(const ParameterStore& a, const ParameterStore& b) {
  for (size_t i = 0; i < a.params().size(); ++i) {
    if (a.read_param(i) != b.read_param(i)) return false;
  }
  return true;
}

TEST(ModelCheckpoint, TheLmHeadIsATiedNameOfTheTokenEmbedding) {
  TinyGpt net;
  const auto tied = tied_weight_names(net.graph);
  ASSERT_EQ(tied.size(), 1u);
  EXPECT_EQ(tied.at("lm_head.weight"), "transformer.wte.weight");
}

TEST(ModelCheckpoint, EveryTensorIsAccountedForBothWays) {
  testing::TempDir dir;
  TinyGpt source(1);
  const WeightsMapping mapping{tied_weight_names(source.graph), false};
  {  // Exactly the model's tensors: loaded.
    TinyGpt net;
    load_weights(FileWriter(source.store).write(dir.file("same.safetensors")), net.store, mapping);
    EXPECT_TRUE(same_parameters(net.store, source.store));
  }
  {  // A layer more: refused naming the first unused tensor and counting the rest.
    FileWriter f(source.store);
    f.add("transformer.h.1.ln_1.weight", Shape{16});
    f.add("transformer.h.1.ln_1.bias", Shape{16});
    f.add("transformer.h.1.mlp.c_fc.bias", Shape{64});
    const std::string path = f.write(dir.file("extra.safetensors"));
    TinyGpt net;
    const std::string e = load_error(path, net.store, mapping);
    EXPECT_NE(e.find("tensor 'transformer.h.1.ln_1.bias' (and 2 others) is read by no "
                     "parameter"),
              std::string::npos)
        << e;
    EXPECT_EQ(load_weights(path, net.store, {mapping.tied, /*ignore_unused=*/true}), 3u);
    EXPECT_TRUE(same_parameters(net.store, source.store));
  }
  {  // A parameter missing: refused naming it.
    FileWriter f(source.store);
    f.remove("transformer.h.0.mlp.c_proj.weight");
    TinyGpt net;
    const std::string e = load_error(f.write(dir.file("missing.safetensors")), net.store, mapping);
    EXPECT_NE(e.find("no tensor 'transformer.h.0.mlp.c_proj.weight'"), std::string::npos) << e;
  }
  {  // Mask buffers of older Hugging Face files are not unused.
    FileWriter f(source.store);
    f.add("transformer.h.0.attn.bias", Shape{1, 1, 8, 8});
    f.add("transformer.h.0.attn.masked_bias", Shape{});
    TinyGpt net;
    EXPECT_EQ(load_weights(f.write(dir.file("masks.safetensors")), net.store, mapping), 0u);
  }
}

TEST(ModelCheckpoint, AnUntiedHeadIsRefusedAndATiedOneStoredTwiceLoads) {
  testing::TempDir dir;
  TinyGpt source(1);
  const WeightsMapping mapping{tied_weight_names(source.graph), false};
  FileWriter tied(source.store);
  tied.copy("transformer.wte.weight", "lm_head.weight");
  TinyGpt net;
  EXPECT_EQ(load_weights(tied.write(dir.file("tied.safetensors")), net.store, mapping), 0u);
  EXPECT_TRUE(same_parameters(net.store, source.store));
  FileWriter untied(source.store);
  untied.copy("transformer.wte.weight", "lm_head.weight", /*differ=*/true);
  const std::string path = untied.write(dir.file("untied.safetensors"));
  const std::string e = load_error(path, net.store, mapping);
  EXPECT_NE(e.find("'lm_head.weight' differs from 'transformer.wte.weight' (an untied head"),
            std::string::npos)
      << e;
  // Skipping unused tensors does not skip an untied head: it is read, and wrong.
  EXPECT_NE(load_error(path, net.store, {mapping.tied, true}).find("untied"), std::string::npos);
}

TEST(ModelCheckpoint, Gpt2ModelNamesWithoutTheTransformerPrefixLoad) {
  testing::TempDir dir;
  TinyGpt source(1);
  FileWriter f(source.store);
  f.rename([](const std::string& name) {
    return name.starts_with("transformer.") ? name.substr(12) : name;
  });
  const std::string path = f.write(dir.file("base.safetensors"));
  TinyGpt net;
  load_weights(path, net.store, {tied_weight_names(net.graph), false});
  EXPECT_TRUE(same_parameters(net.store, source.store));
}

TEST(ModelCheckpoint, ResumeRefusesAChangedShapeAndReportsWhatAnOlderFileLacks) {
  testing::TempDir dir;
  TinyGpt source(1);
  TrainingState state{5, 0, 5, 0, "gpt2", {{"model.heads", "2"}, {"data.seq_len", "8"}}, {}};
  const std::string path = dir.file("step_5.safetensors");
  save_checkpoint(path, source.store, {}, state);
  TinyGpt net;
  const TrainingState back = load_checkpoint(path, net.store, {}, state.shape);
  EXPECT_EQ(back.step, 5);
  EXPECT_TRUE(back.unchecked.empty());
  try {
    load_checkpoint(path, net.store, {}, {{"model.heads", "4"}, {"data.seq_len", "8"}});
    ADD_FAILURE() << "a changed model.heads resumed";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "checkpoint.resume: model.heads is 4 but '" + path +
                                         "' was written with model.heads=2");
  }
  // A checkpoint without the shape (written before it was recorded): resumed, keys reported.
  state.shape.clear();
  save_checkpoint(path, source.store, {}, state);
  const TrainingState older =
      load_checkpoint(path, net.store, {}, {{"model.heads", "4"}, {"model.name", "gpt2"}});
  EXPECT_EQ(older.unchecked, (std::vector<std::string>{"model.heads"}));  // name: 'model'
}

}  // namespace
}  // namespace ferry
