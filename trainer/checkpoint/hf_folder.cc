// Reading a model folder's weights and writing one from a checkpoint (hf_folder.h). The config
// ferry writes names only the fields transformers needs to build the same model; everything it
// leaves out takes transformers' default, which is what ferry's model computes.
#include "trainer/checkpoint/hf_folder.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "trainer/checkpoint/atomic_file.h"

namespace ferry {

namespace fs = std::filesystem;

std::vector<SafetensorsFile> read_folder_weights(const std::string& dir) {
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  std::vector<SafetensorsFile> files;
  if (fs::exists(single, ec)) {
    files.push_back(read_safetensors(single.string()));
    return files;
  }
  std::ifstream in(index);
  if (!in) {
    throw DataError(fmt::format("model folder '{}' has neither model.safetensors nor "
                                "model.safetensors.index.json",
                                dir),
                    "save the model with save_pretrained(..., safe_serialization=True)");
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON: {}", index.string(), e.what()));
  }
  const auto map = j.find("weight_map");
  if (map == j.end() || !map->is_object() || map->empty()) {
    throw DataError(fmt::format("{}: no \"weight_map\" of tensor names to shards", index.string()));
  }
  std::vector<std::string> shards;
  std::set<std::string> seen;
  for (const auto& [tensor, shard] : map->items()) {
    if (!shard.is_string()) {
      throw DataError(fmt::format("{}: tensor '{}' maps to {}, not a file name", index.string(),
                                  tensor, shard.dump()));
    }
    if (seen.insert(shard.get<std::string>()).second) shards.push_back(shard.get<std::string>());
  }
  for (const std::string& shard : shards) {
    const fs::path path = fs::path(dir) / shard;
    if (!fs::exists(path, ec)) {
      throw DataError(fmt::format("model folder '{}': shard '{}' named by "
                                  "model.safetensors.index.json is missing",
                                  dir, shard),
                      "copy every shard of the model into the folder");
    }
    files.push_back(read_safetensors(path.string()));
  }
  for (const auto& [tensor, shard] : map->items()) {
    const size_t at = static_cast<size_t>(
        std::find(shards.begin(), shards.end(), shard.get<std::string>()) - shards.begin());
    if (files[at].find(tensor) == nullptr) {
      throw DataError(
          fmt::format("model folder '{}': shard '{}' has no tensor '{}', which "
                      "model.safetensors.index.json places there",
                      dir, shard.get<std::string>(), tensor));
    }
  }
  return files;
}

namespace {

const std::string& recorded(const SafetensorsFile& file, const std::string& key) {
  const auto it = file.metadata().find(key);
  if (it == file.metadata().end()) {
    throw ConfigError(fmt::format("trainer export: '{}' does not record {}", file.source(), key),
                      "export a checkpoint written by this version of ferry (a token model's)");
  }
  return it->second;
}

int64_t recorded_int(const SafetensorsFile& file, const std::string& key) {
  return std::stoll(recorded(file, key));
}

double recorded_real(const SafetensorsFile& file, const std::string& key) {
  return std::stod(recorded(file, key));
}

nlohmann::json hf_config(const SafetensorsFile& file) {
  const std::string& name = recorded(file, "model.name");
  nlohmann::json c;
  if (file.metadata().count("model.kv_heads")) {  // a Llama (run_shape records its keys)
    c["architectures"] = {"LlamaForCausalLM"};
    c["model_type"] = "llama";
    c["num_hidden_layers"] = recorded_int(file, "model.layers");
    c["num_attention_heads"] = recorded_int(file, "model.heads");
    c["num_key_value_heads"] = recorded_int(file, "model.kv_heads");
    c["hidden_size"] = recorded_int(file, "model.width");
    c["intermediate_size"] = recorded_int(file, "model.ffn");
    c["vocab_size"] = recorded_int(file, "model.vocab");
    c["max_position_embeddings"] = recorded_int(file, "model.context");
    c["rope_theta"] = recorded_real(file, "model.rope_theta");
    c["rms_norm_eps"] = recorded_real(file, "model.norm_eps");
    c["tie_word_embeddings"] = recorded(file, "model.tie_embeddings") == "true";
    c["hidden_act"] = "silu";
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
    c["rope_scaling"] = nullptr;
  } else if (file.metadata().count("model.layers")) {
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
    c["n_layer"] = recorded_int(file, "model.layers");
    c["n_head"] = recorded_int(file, "model.heads");
    c["n_embd"] = recorded_int(file, "model.width");
    c["vocab_size"] = recorded_int(file, "model.vocab");
    c["n_positions"] = recorded_int(file, "model.context");
    c["n_ctx"] = recorded_int(file, "model.context");
    c["activation_function"] = "gelu_new";
    c["layer_norm_epsilon"] = 1e-5;
    c["tie_word_embeddings"] = true;
  } else {
    throw ConfigError(fmt::format("trainer export: '{}' is a checkpoint of '{}', not of a token "
                                  "model (llama, gpt2)",
                                  file.source(), name),
                      "Hugging Face folders hold LlamaForCausalLM and GPT2LMHeadModel models");
  }
  c["torch_dtype"] = "float32";
  c["exported_by"] = "ferry";
  return c;
}

}  // namespace

std::vector<std::string> export_model_folder(const std::string& checkpoint,
                                             const std::string& out_dir,
                                             const std::string& tokenizer_dir) {
  const SafetensorsFile file = read_safetensors(checkpoint);
  const nlohmann::json config = hf_config(file);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) {
    throw DataError(fmt::format("trainer export: cannot create '{}': {}", out_dir, ec.message()));
  }
  std::vector<std::string> written;
  const std::string config_path = (fs::path(out_dir) / "config.json").string();
  const std::string text = config.dump(2) + "\n";
  AtomicFileWriter writer(config_path);
  writer.write(text.data(), text.size());
  writer.commit();
  written.push_back(config_path);
  std::vector<SafetensorsTensor> tensors;
  for (const SafetensorsEntry& e : file.entries()) {
    if (e.name.starts_with("optimizer.")) continue;
    tensors.push_back({e.name, e.dtype, e.shape, e.bytes.data()});
  }
  const std::string weights = (fs::path(out_dir) / "model.safetensors").string();
  write_safetensors(weights, tensors, {{"format", "pt"}});
  written.push_back(weights);
  if (!tokenizer_dir.empty()) {
    bool any = false;
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                             "vocab.json", "merges.txt", "tokenizer.model"}) {
      const fs::path from = fs::path(tokenizer_dir) / name;
      if (!fs::exists(from, ec)) continue;
      const fs::path to = fs::path(out_dir) / name;
      fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
      if (ec) {
        throw DataError(
            fmt::format("trainer export: cannot copy '{}': {}", from.string(), ec.message()));
      }
      written.push_back(to.string());
      any = true;
    }
    if (!any) {
      throw ConfigError(fmt::format("trainer export: '{}' holds no tokenizer files "
                                    "(tokenizer.json, vocab.json, ...)",
                                    tokenizer_dir),
                        "point --tokenizer at the folder the tokens were prepared with");
    }
  }
  return written;
}

}  // namespace ferry
