// Printing a config: the resolved YAML (saved as <run.dir>/config.yaml), JSON, and the key
// reference. Invariant: every schema key is printed, in schema order, in a form the loader
// reads back to the same value.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "trainer/config/config.h"
#include "trainer/config/schema.h"

namespace ferry {

namespace ci = config_internal;

namespace {

std::string leaf(const std::string& key) { return key.substr(key.find('.') + 1); }
std::string section_of(const std::string& key) { return key.substr(0, key.find('.')); }

void emit_value(YAML::Emitter& out, const ci::KeySpec& spec, const ci::Value& value) {
  switch (spec.type) {
    case ci::ValueType::kString:
      // Quoted, so that a path such as "null" or "123" reads back as the same string.
      out << YAML::DoubleQuoted << std::get<std::string>(value);
      return;
    case ci::ValueType::kIntTuple:
    case ci::ValueType::kIntList:
      out << YAML::Flow << YAML::BeginSeq;
      for (int64_t v : std::get<std::vector<int64_t>>(value)) out << v;
      out << YAML::EndSeq;
      return;
    case ci::ValueType::kFloatList:
      out << YAML::Flow << YAML::BeginSeq;
      for (double v : std::get<std::vector<double>>(value)) out << ci::real_text(v);
      out << YAML::EndSeq;
      return;
    default:
      out << ci::value_text(spec, value);
  }
}

nlohmann::json json_value(const ci::KeySpec& spec, const ci::Value& value) {
  switch (spec.type) {
    case ci::ValueType::kBool:
      return std::get<bool>(value);
    case ci::ValueType::kInt:
      return std::get<int64_t>(value);
    case ci::ValueType::kUint:
    case ci::ValueType::kSize:
      return std::get<uint64_t>(value);
    case ci::ValueType::kFloat:
      return std::get<double>(value);
    case ci::ValueType::kString:
    case ci::ValueType::kChoice:
      return std::get<std::string>(value);
    case ci::ValueType::kIntTuple:
    case ci::ValueType::kIntList:
      return std::get<std::vector<int64_t>>(value);
    case ci::ValueType::kFloatList:
      return std::get<std::vector<double>>(value);
  }
  return nullptr;
}

// Markdown table cells: a '|' would end the cell.
std::string cell(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

}  // namespace

std::string to_yaml(const Config& config) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::string open_section;
  for (const auto& spec : ci::schema()) {
    const std::string section = section_of(spec.name);
    if (section != open_section) {
      if (!open_section.empty()) out << YAML::EndMap;
      out << YAML::Key << section << YAML::Value << YAML::BeginMap;
      open_section = section;
    }
    out << YAML::Key << leaf(spec.name) << YAML::Value;
    emit_value(out, spec, spec.read(config));
  }
  if (!open_section.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
  return "# ferry config, resolved: every key with the value this run uses.\n" +
         std::string(out.c_str()) + "\n";
}

nlohmann::json to_json(const Config& config) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& spec : ci::schema())
    j[section_of(spec.name)][leaf(spec.name)] = json_value(spec, spec.read(config));
  return j;
}

std::vector<KeyInfo> config_reference() {
  std::vector<KeyInfo> rows;
  for (const auto& spec : ci::schema())
    rows.push_back({spec.name, spec.type_doc, ci::default_text(spec), spec.allowed_doc, spec.help});
  return rows;
}

std::string config_reference_markdown() {
  std::string md =
      "| Key | Type | Default | Allowed | Description |\n"
      "|---|---|---|---|---|\n";
  for (const auto& row : config_reference())
    md += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", row.key, cell(row.type),
                      cell(row.default_value), cell(row.allowed), cell(row.help));
  return md;
}

}  // namespace ferry
