// Reading a Hugging Face config.json into model.* keys (model_folder.h). Every field ferry needs
// is required (Hugging Face's defaults differ between versions); fields that would change the
// model into one ferry does not build are refused rather than ignored.
#include "trainer/config/model_folder.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace ferry {

namespace fs = std::filesystem;

bool is_model_folder(const std::string& path) {
  std::error_code ec;
  return !path.empty() && fs::is_directory(path, ec);
}

namespace {

class FolderReader {
 public:
  FolderReader(Config& c, const std::string& dir,
               const std::function<std::string(const std::string&)>& given_at)
      : c_(c), given_at_(given_at), file_((fs::path(dir) / "config.json").string()) {
    std::ifstream in(file_);
    if (!in) {
      throw ConfigError(fmt::format("model.init_from: '{}' is a folder without config.json", dir),
                        "point model.init_from at a Hugging Face model folder (config.json and "
                        "model.safetensors), or at a .safetensors file");
    }
    try {
      j_ = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(fmt::format("model.init_from: {} is not valid JSON: {}", file_, e.what()));
    }
    if (!j_.is_object())
      throw ConfigError(fmt::format("model.init_from: {} is not a JSON object", file_));
  }

  std::string architecture() {
    const auto it = j_.find("architectures");
    if (it == j_.end() || !it->is_array() || it->empty() || !(*it)[0].is_string()) {
      throw ConfigError(
          fmt::format("model.init_from: {} has no \"architectures\" field", file_),
          fmt::format("ferry trains {} and {} folders", kLlamaArchitecture, kGpt2Architecture));
    }
    return (*it)[0].get<std::string>();
  }

  const nlohmann::json* find(const char* field) const {
    const auto it = j_.find(field);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }

  // config.json's `field`, required, as a positive integer for `key`.
  int64_t integer(const char* field, const char* key) const {
    const nlohmann::json* v = find(field);
    if (v == nullptr) {
      throw ConfigError(
          fmt::format("model.init_from: {} has no \"{}\" (ferry's {})", file_, field, key),
          "add the field to config.json");
    }
    if (!v->is_number_integer() || v->get<int64_t>() < 1) {
      throw ConfigError(fmt::format("model.init_from: {}: \"{}\" is {}, not a positive integer",
                                    file_, field, v->dump()));
    }
    return v->get<int64_t>();
  }

  double real(const char* field, const char* key) const {
    const nlohmann::json* v = find(field);
    if (v == nullptr || !v->is_number()) {
      throw ConfigError(
          fmt::format("model.init_from: {} has no numeric \"{}\" (ferry's {})", file_, field, key),
          "add the field to config.json");
    }
    return v->get<double>();
  }

  // Sets `into` (model key `key`) to `value`: a given, different value is the one error.
  void set(const char* key, int64_t& into, int64_t value, const char* field) {
    if (into != 0 && into != value) contradiction(key, std::to_string(into), field, value);
    into = value;
  }
  void set(const char* key, double& into, double value, const char* field) {
    if (into != 0 && std::fabs(into - value) > 1e-12 * std::fabs(value)) {
      contradiction(key, fmt::format("{}", into), field, value);
    }
    into = value;
  }
  template <typename T>
  [[noreturn]] void contradiction(const char* key, const std::string& ours, const char* field,
                                  const T& theirs) {
    throw ConfigError(fmt::format("{} is {}{} but the folder's {} has \"{}\": {}", key, ours,
                                  given_at_(key), file_, field, theirs),
                      fmt::format("remove {} (the folder sets it), or use another folder", key));
  }

  void refuse_if(bool bad, const std::string& what) const {
    if (bad) {
      throw ConfigError(
          fmt::format("model.init_from: {}: {}, which ferry's model does not have", file_, what),
          "use a folder of a plain Llama or GPT-2 model");
    }
  }

  void name(const std::string& family) {
    if (!given_at_("model.name").empty() && c_.model.name != family) {
      throw ConfigError(
          fmt::format("model.name is '{}'{} but the folder's {} is a {} ({})", c_.model.name,
                      given_at_("model.name"), file_, architecture(), family),
          "remove model.name (the folder sets it)");
    }
    c_.model.name = family;
  }

  void llama() {
    name("llama");
    ModelConfig& m = c_.model;
    const int64_t heads = integer("num_attention_heads", "model.heads");
    const int64_t width = integer("hidden_size", "model.width");
    set("model.layers", m.layers, integer("num_hidden_layers", "model.layers"),
        "num_hidden_layers");
    set("model.heads", m.heads, heads, "num_attention_heads");
    set("model.width", m.width, width, "hidden_size");
    set("model.kv_heads", m.kv_heads,
        find("num_key_value_heads") ? integer("num_key_value_heads", "model.kv_heads") : heads,
        "num_key_value_heads");
    set("model.ffn", m.ffn, integer("intermediate_size", "model.ffn"), "intermediate_size");
    set("model.vocab", m.vocab, integer("vocab_size", "model.vocab"), "vocab_size");
    set("model.context", m.context, integer("max_position_embeddings", "model.context"),
        "max_position_embeddings");
    set("model.rope_theta", m.rope_theta, real("rope_theta", "model.rope_theta"), "rope_theta");
    set("model.norm_eps", m.norm_eps, real("rms_norm_eps", "model.norm_eps"), "rms_norm_eps");
    const nlohmann::json* tie = find("tie_word_embeddings");
    const bool tied = tie != nullptr && tie->is_boolean() && tie->get<bool>();
    const TieEmbeddings folder = tied ? TieEmbeddings::kTrue : TieEmbeddings::kFalse;
    if (m.tie_embeddings != TieEmbeddings::kAuto && m.tie_embeddings != folder) {
      contradiction("model.tie_embeddings", tied ? "false" : "true", "tie_word_embeddings", tied);
    }
    m.tie_embeddings = folder;
    const auto flag = [&](const char* f) {
      const nlohmann::json* v = find(f);
      return v != nullptr && v->is_boolean() && v->get<bool>();
    };
    refuse_if(flag("attention_bias"), "\"attention_bias\": true (projection biases)");
    refuse_if(flag("mlp_bias"), "\"mlp_bias\": true (MLP biases)");
    refuse_if(find("rope_scaling") != nullptr,
              fmt::format("\"rope_scaling\": {} (scaled rotary embeddings)",
                          find("rope_scaling") ? find("rope_scaling")->dump() : ""));
    const nlohmann::json* act = find("hidden_act");
    refuse_if(act != nullptr && *act != "silu",
              fmt::format("\"hidden_act\": {}", act ? act->dump() : ""));
    const nlohmann::json* hd = find("head_dim");
    refuse_if(hd != nullptr && hd->is_number_integer() && hd->get<int64_t>() * heads != width,
              fmt::format("\"head_dim\": {} other than hidden_size / num_attention_heads",
                          hd ? hd->dump() : ""));
  }

  void gpt2() {
    name("gpt2");
    ModelConfig& m = c_.model;
    set("model.layers", m.layers, integer("n_layer", "model.layers"), "n_layer");
    set("model.heads", m.heads, integer("n_head", "model.heads"), "n_head");
    set("model.width", m.width, integer("n_embd", "model.width"), "n_embd");
    set("model.vocab", m.vocab, integer("vocab_size", "model.vocab"), "vocab_size");
    set("model.context", m.context, integer("n_positions", "model.context"), "n_positions");
    const nlohmann::json* act = find("activation_function");
    refuse_if(act != nullptr && *act != "gelu_new",
              fmt::format("\"activation_function\": {}", act ? act->dump() : ""));
    const nlohmann::json* inner = find("n_inner");
    refuse_if(
        inner != nullptr && inner->is_number_integer() && inner->get<int64_t>() != 4 * m.width,
        fmt::format("\"n_inner\": {} other than 4 * n_embd", inner ? inner->dump() : ""));
  }

 private:
  Config& c_;
  const std::function<std::string(const std::string&)>& given_at_;
  std::string file_;
  nlohmann::json j_;
};

}  // namespace

void apply_model_folder(Config& c, const std::string& dir,
                        const std::function<std::string(const std::string&)>& given_at) {
  FolderReader reader(c, dir, given_at);
  const std::string arch = reader.architecture();
  if (arch == kLlamaArchitecture) {
    reader.llama();
  } else if (arch == kGpt2Architecture) {
    reader.gpt2();
  } else {
    throw ConfigError(fmt::format("model.init_from: '{}' holds a {}, which ferry does not train "
                                  "(supported: {}, {})",
                                  dir, arch, kLlamaArchitecture, kGpt2Architecture),
                      "convert the model to one of those, or pick another folder");
  }
}

}  // namespace ferry
