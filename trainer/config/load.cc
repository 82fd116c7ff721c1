// Loading a config: YAML file -> overrides in order -> derived defaults -> cross-key checks.
// Invariant: every value reaches the Config through its schema entry, so no key escapes
// type and range checking, and every error names the key and where it was given.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/depthguard.h>

#include "common/strings.h"
#include "trainer/config/config.h"
#include "trainer/config/schema.h"
#include "trainer/config/values.h"

namespace ferry {

namespace ci = config_internal;

namespace {

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return std::string(text.substr(first, last - first + 1));
}

bool is_section(const std::string& name) {
  for (const auto& s : ci::sections())
    if (s == name) return true;
  return false;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> keys;
  for (const auto& k : ci::schema())
    if (k.name.compare(0, section.size() + 1, section + ".") == 0) keys.push_back(k.name);
  return keys;
}

// "optim.lr takes a number > 0 (default 0.1). Base learning rate (after warm-up)."
std::string key_hint(const ci::KeySpec& spec) {
  return fmt::format("{} takes {} (default {}). {}", spec.name, ci::accepted_text(spec),
                     ci::default_text(spec), spec.help);
}

// Collects values from the file and the overrides into a Config, remembering where each
// key was last given (for messages).
class Loader {
 public:
  explicit Loader(std::string source) : source_(std::move(source)) {}

  void load_document(const YAML::Node& root);
  void apply_override(const std::string& text);
  // Fills derived defaults and runs the cross-key checks.
  Config finish(const std::string& stem);

 private:
  void apply(const std::string& key, const YAML::Node& value, const std::string& where,
             bool from_file);
  [[noreturn]] void unknown_key(const std::string& key, const std::string& where) const;
  std::string at(const YAML::Mark& mark) const;
  // " (WHERE)" for a key given in the file or an override, "" for a default.
  std::string given_at(const std::string& key) const;
  void check_cross_keys(const Config& c) const;

  std::string source_;
  Config config_;
  std::map<std::string, std::string> where_;       // key -> where it was last given
  std::map<std::string, std::string> file_where_;  // key -> where the file gave it
};

std::string Loader::at(const YAML::Mark& mark) const {
  if (mark.is_null()) return source_;
  return fmt::format("{}:{}", source_, mark.line + 1);
}

std::string Loader::given_at(const std::string& key) const {
  const auto it = where_.find(key);
  return it == where_.end() ? "" : " (" + it->second + ")";
}

void Loader::unknown_key(const std::string& key, const std::string& where) const {
  // A name without a dot is a section ("optimizer" -> "optim"), else perhaps a key written
  // without its section ("lr" -> "optim.lr").
  std::vector<std::string> keys;
  for (const auto& k : ci::schema()) keys.push_back(k.name);
  std::string near = key.find('.') == std::string::npos ? nearest(key, ci::sections()) : "";
  if (near.empty()) near = nearest(key, keys);
  std::string message = fmt::format("unknown key '{}' ({})", key, where);
  if (!near.empty()) message += fmt::format("; did you mean '{}'?", near);
  const std::string section = key.substr(0, key.find('.'));
  const std::string hint =
      key.find('.') != std::string::npos && is_section(section)
          ? fmt::format("keys of section '{}': {}", section, join(keys_of(section), ", "))
          : fmt::format("sections: {}", join(ci::sections(), ", "));
  throw ConfigError(message, hint);
}

void Loader::apply(const std::string& key, const YAML::Node& value, const std::string& where,
                   bool from_file) {
  const ci::KeySpec* spec = ci::find_key(key);
  if (spec == nullptr) {
    if (is_section(key))
      throw ConfigError(fmt::format("{}: is a section, not a key ({})", key, where),
                        fmt::format("set one of its keys: {}", join(keys_of(key), ", ")));
    unknown_key(key, where);
  }
  if (from_file) {
    const auto [it, inserted] = file_where_.emplace(key, where);
    if (!inserted)
      throw ConfigError(
          fmt::format("duplicate key '{}' ({}); first given at {}", key, where, it->second),
          "give each key once in a file");
  }
  try {
    spec->assign(config_, value);
  } catch (const ci::ValueError& e) {
    std::string message = fmt::format("{}{}: {} ({})", key, e.element, e.message, where);
    if (!e.suggestion.empty()) message += fmt::format("; did you mean '{}'?", e.suggestion);
    throw ConfigError(message, key_hint(*spec));
  }
  where_[key] = where;
}

void Loader::load_document(const YAML::Node& root) {
  if (!root.IsDefined() || root.IsNull()) return;  // an empty file: every default
  if (!root.IsMap())
    throw ConfigError(fmt::format("{}: expected a map of sections at the top level, got {}",
                                  source_, ci::describe(root)),
                      fmt::format("a config is a map of sections ({}), each a map of keys",
                                  join(ci::sections(), ", ")));
  for (const auto& entry : root) {
    const YAML::Node& name_node = entry.first;
    const YAML::Node& value = entry.second;
    if (!name_node.IsScalar())
      throw ConfigError(fmt::format("expected a key name, got {} ({})", ci::describe(name_node),
                                    at(name_node.Mark())),
                        "keys are plain names such as 'optim' or 'optim.lr'");
    const std::string name = name_node.Scalar();
    const std::string where = at(name_node.Mark());
    if (name.find('.') != std::string::npos) {  // a dotted key at the top level: optim.lr: 0.1
      apply(name, value, where, true);
      continue;
    }
    if (!is_section(name)) unknown_key(name, where);
    const auto [first, inserted] = file_where_.emplace(name, where);
    if (!inserted)
      throw ConfigError(
          fmt::format("duplicate key '{}' ({}); first given at {}", name, where, first->second),
          "give each section once and put all of its keys under it");
    if (value.IsNull()) continue;  // a section with every key commented out
    if (!value.IsMap())
      throw ConfigError(
          fmt::format("{}: expected a map of keys, got {} ({})", name, ci::describe(value), where),
          fmt::format("write the keys of '{}' indented under it, one per line; its keys: {}", name,
                      join(keys_of(name), ", ")));
    for (const auto& item : value) {
      const YAML::Node& key_node = item.first;
      if (!key_node.IsScalar())
        throw ConfigError(fmt::format("expected a key name, got {} ({})", ci::describe(key_node),
                                      at(key_node.Mark())),
                          "keys are plain names such as 'lr'");
      apply(name + "." + key_node.Scalar(), item.second, at(key_node.Mark()), true);
    }
  }
}

void Loader::apply_override(const std::string& text) {
  const auto eq = text.find('=');
  const std::string key = eq == std::string::npos ? "" : trim(std::string_view(text).substr(0, eq));
  if (key.empty())
    throw ConfigError(fmt::format("malformed override '{}': expected the form key=value, e.g. "
                                  "optim.lr=0.1",
                                  text),
                      "overrides are key=value with a dotted key, e.g. data.batch_size=64");
  const std::string raw = trim(std::string_view(text).substr(eq + 1));
  const std::string where = fmt::format("override '{}'", text);
  const ci::KeySpec* spec = ci::find_key(key);
  YAML::Node value;
  if (spec != nullptr && spec->type == ci::ValueType::kString) {
    // Strings (paths) are taken verbatim, less one pair of surrounding quotes.
    std::string s = raw;
    if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front())
      s = s.substr(1, s.size() - 2);
    value = YAML::Node(s);
  } else if (spec != nullptr) {
    try {
      value = YAML::Load(raw);
    } catch (const YAML::Exception& e) {
      throw ConfigError(fmt::format("malformed value in override '{}': {}", text, e.msg),
                        key_hint(*spec));
    }
  }
  apply(key, value, where, false);
}

Config Loader::finish(const std::string& stem) {
  Config c = config_;
  if (c.run.dir.empty()) c.run.dir = "runs/" + stem;
  if (c.checkpoint.dir.empty())
    c.checkpoint.dir = (std::filesystem::path(c.run.dir) / "checkpoints").string();
  if (c.memory.budget == 0) c.memory.budget = c.device.memory;
  check_cross_keys(c);
  return c;
}

void Loader::check_cross_keys(const Config& c) const {
  if (c.data.path.empty() && c.data.source != DataSource::kSynthetic) {
    const char* hint =
        c.data.source == DataSource::kIdx ? "set data.path to the MNIST IDX images file, e.g. "
                                            "data.path=data/mnist/train-images-idx3-ubyte"
        : c.data.source == DataSource::kCifar10
            ? "set data.path to a CIFAR-10 binary batch file (data_batch_1.bin) or the folder "
              "holding them"
        : c.data.source == DataSource::kTokens
            ? "set data.path to a token file, e.g. one scripts/prepare_tokens.py wrote"
            : "set data.path to a folder with one subfolder of .jpg/.png images per class";
    throw ConfigError(
        fmt::format("data.path: required when data.source is {}", to_string(c.data.source)), hint);
  }
  if (c.data.crop != 0 && (c.data.crop != c.model.input[1] || c.data.crop != c.model.input[2]))
    throw ConfigError(
        fmt::format("data.crop: must equal model.input's height and width ({} x {}) or be 0, "
                    "got {}{}",
                    c.model.input[1], c.model.input[2], c.data.crop, given_at("data.crop")),
        fmt::format("set model.input=[{}, {}, {}] too, or leave data.crop at 0", c.model.input[0],
                    c.data.crop, c.data.crop));
  if (!c.data.scales.empty() && c.data.source != DataSource::kSynthetic &&
      c.data.source != DataSource::kImageFolder)
    throw ConfigError(fmt::format("data.scales: data.source {} cannot make its images at another "
                                  "side{}",
                                  to_string(c.data.source), given_at("data.scales")),
                      "data.scales works with synthetic and imagefolder data; set data.scales=[]");
  if (c.data.documents && c.data.source != DataSource::kTokens)
    throw ConfigError(fmt::format("data.documents: needs data.source tokens, got {}{}",
                                  to_string(c.data.source), given_at("data.documents")),
                      "documents are split out of a token file: set data.source=tokens and "
                      "data.path, or data.documents=false");
  if (c.data.pack && !c.data.documents)
    throw ConfigError(fmt::format("data.pack: needs data.documents true{}", given_at("data.pack")),
                      "data.pack packs documents into rows: set data.documents=true too, or "
                      "data.pack=false");
  if (c.data.source == DataSource::kTokens) {
    for (const auto& [key, values] :
         {std::pair<const char*, const std::vector<double>*>{"data.mean", &c.data.mean},
          std::pair<const char*, const std::vector<double>*>{"data.std", &c.data.std}}) {
      if (!values->empty())
        throw ConfigError(
            fmt::format("{}: must be [] when data.source is tokens, got {} value{}{}", key,
                        values->size(), values->size() == 1 ? "" : "s", given_at(key)),
            fmt::format("remove {}: tokens are not normalised", key));
    }
  }
  const int64_t channels = c.model.input[0];
  for (const auto& [key, values] :
       {std::pair<const char*, const std::vector<double>*>{"data.mean", &c.data.mean},
        std::pair<const char*, const std::vector<double>*>{"data.std", &c.data.std}}) {
    if (!values->empty() && static_cast<int64_t>(values->size()) != channels)
      throw ConfigError(fmt::format("{}: needs one value per channel of model.input ({}), got {}{}",
                                    key, channels, values->size(), given_at(key)),
                        fmt::format("model.input is [{}]: give {} values, or [] for none",
                                    fmt::join(c.model.input, ", "), channels));
  }
  if (c.memory.budget > c.device.memory)
    throw ConfigError(fmt::format("memory.budget: must be <= device.memory ({}), got {}{}",
                                  ci::size_text(c.device.memory), ci::size_text(c.memory.budget),
                                  given_at("memory.budget")),
                      "lower memory.budget or raise device.memory");
  if (c.optim.name == OptimizerKind::kSgd && c.optim.nesterov && c.optim.momentum <= 0)
    throw ConfigError(
        fmt::format("optim.nesterov: requires optim.momentum > 0 with optim.name sgd, got {}{}",
                    ci::real_text(c.optim.momentum), given_at("optim.nesterov")),
        "set optim.momentum (e.g. 0.9) or optim.nesterov=false");
  if (c.optim.schedule == ScheduleKind::kCosine && c.optim.min_lr > c.optim.lr)
    throw ConfigError(
        fmt::format("optim.min_lr: must be <= optim.lr ({}) with the cosine schedule, got {}{}",
                    ci::real_text(c.optim.lr), ci::real_text(c.optim.min_lr),
                    given_at("optim.min_lr")),
        "lower optim.min_lr (the rate the cosine schedule ends at)");
  if (c.run.trace_steps[0] > c.run.trace_steps[1])
    throw ConfigError(
        fmt::format("run.trace_steps: first step must be <= last step, got [{}, {}]{}",
                    c.run.trace_steps[0], c.run.trace_steps[1], given_at("run.trace_steps")),
        "write run.trace_steps as [first, last], e.g. [2, 3]");
  if (c.run.trace && c.run.trace_steps[0] > c.run.steps)
    throw ConfigError(
        fmt::format("run.trace_steps: starts at step {}, after the last step (run.steps={}), so "
                    "nothing would be traced{}",
                    c.run.trace_steps[0], c.run.steps, given_at("run.trace_steps")),
        "set run.trace_steps within [1, run.steps], or run.trace=false");
  if (c.comm.dtype == Precision::kBf16 && c.device.precision != Precision::kBf16)
    throw ConfigError(fmt::format("comm.dtype: bf16 needs device.precision bf16, got fp32{}",
                                  given_at("comm.dtype")),
                      "an fp32 run all-reduces fp32 gradients: set device.precision=bf16 too, or "
                      "comm.dtype=fp32");
  if (c.comm.timeout_s > 0 && c.comm.timeout_s < 1)
    throw ConfigError(fmt::format("comm.timeout_s: must be 0 (off) or in [1, 86400] seconds, got "
                                  "{}{}",
                                  ci::real_text(c.comm.timeout_s), given_at("comm.timeout_s")),
                      "a collective of a healthy job can take longer than a second; use e.g. "
                      "300 (the default), or 0 to turn the watchdog off");
}

bool has_yaml_extension(const std::string& name) {
  const std::string ext = std::filesystem::path(name).extension().string();
  return ext == ".yaml" || ext == ".yml";
}

Config parse(const std::string& yaml_text, const std::vector<std::string>& overrides,
             const std::string& source, const std::string& stem) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(yaml_text);
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's message here is "bad file"; the real cause is its nesting limit.
    throw ConfigError(fmt::format("malformed YAML: nested more than {} levels deep ({}:{})",
                                  e.depth() - 1, source, e.mark.line + 1),
                      "a config nests a few levels (section: key: value); check for unclosed "
                      "brackets");
  } catch (const YAML::Exception& e) {
    const std::string where =
        e.mark.is_null() ? source : fmt::format("{}:{}", source, e.mark.line + 1);
    throw ConfigError(fmt::format("malformed YAML: {} ({})", e.msg, where),
                      "fix the YAML syntax there (indentation, a missing ':' or an unclosed "
                      "bracket or quote)");
  }
  if (documents.size() > 1)
    throw ConfigError(
        fmt::format("{}: expected one YAML document, found {}", source, documents.size()),
        "remove the extra '---' document separators");
  Loader loader(source);
  if (!documents.empty()) loader.load_document(documents.front());
  for (const auto& o : overrides) loader.apply_override(o);
  return loader.finish(stem);
}

}  // namespace

Config load_config(const std::string& file, const std::vector<std::string>& overrides) {
  constexpr const char* kHint =
      "check the path; the example configs are in configs/, e.g. configs/quickstart.yaml";
  const std::string& path = file;
  const std::string shown = printable(file);  // messages stay one line whatever the name
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw ConfigError(fmt::format("cannot read config file '{}': it is a directory", shown), kHint);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigError(fmt::format("cannot read config file '{}': {}", shown, std::strerror(errno)),
                      kHint);
  // Configs are a few KiB: read at most the cap and one byte more, so that /dev/zero or a
  // 200 MB file is one error instead of gigabytes of YAML nodes.
  constexpr size_t kMaxConfigBytes = size_t{1} << 20;
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad())
    throw ConfigError(fmt::format("cannot read config file '{}': read error", shown), kHint);
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxConfigBytes)
    throw ConfigError(
        fmt::format("config file '{}' is larger than 1 MiB: not an experiment config", shown),
        kHint);
  std::string stem = std::filesystem::path(path).stem().string();
  if (stem.empty()) stem = "default";
  return parse(text, overrides, shown, stem);
}

Config parse_config_text(const std::string& yaml_text, const std::vector<std::string>& overrides,
                         const std::string& source_name) {
  const std::string stem = has_yaml_extension(source_name)
                               ? std::filesystem::path(source_name).stem().string()
                               : std::string("default");
  return parse(yaml_text, overrides, source_name, stem);
}

Config default_config() { return parse_config_text("", {}, "<defaults>"); }

int64_t check_seq_len(int64_t seq_len, int64_t context, const std::string& where) {
  if (seq_len == 0) return context;
  if (seq_len > context) {
    throw ConfigError(fmt::format("data.seq_len: must be <= model.context ({}), got {}{}", context,
                                  seq_len, where),
                      fmt::format("lower data.seq_len to {} or less (0 = model.context), or raise "
                                  "model.context",
                                  context));
  }
  return seq_len;
}

}  // namespace ferry
