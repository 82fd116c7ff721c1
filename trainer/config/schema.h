// Internal: the table of config keys. Each key is declared once (schema.cc) with its name,
// type, range, help and the struct field it binds; parsing, printing and the reference all
// read this table. Invariant: key names are unique and of the form "section.key".
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "trainer/config/config.h"

namespace ferry::config_internal {

enum class ValueType {
  kBool,
  kInt,
  kUint,
  kFloat,
  kString,
  kSize,
  kChoice,
  kIntTuple,
  kFloatList,
  kIntList
};

// A value as the schema reads it out of a Config, for printing.
using Value = std::variant<bool, int64_t, uint64_t, double, std::string, std::vector<int64_t>,
                           std::vector<double>>;

// Thrown by KeySpec::assign for a value that does not fit the key. The loader adds the key,
// the location and the hint. `element` is "[i]" for a list element, else "".
struct ValueError {
  std::string message;
  std::string element;
  std::string suggestion;  // a close valid choice, for "; did you mean 'x'?"
};

struct KeySpec {
  std::string name;  // "optim.lr"
  ValueType type;
  std::string type_doc;     // "float", "list[3] of int"
  std::string allowed_doc;  // "> 0", "sgd | adamw", ""
  std::string default_doc;  // for derived defaults ("<run.dir>/checkpoints"); "" = printed
  std::string help;
  // Parses `node` and stores it in the bound field; throws ValueError.
  std::function<void(Config&, const YAML::Node&)> assign;
  // Reads the bound field.
  std::function<Value(const Config&)> read;
};

// Every key, sections in Config order.
const std::vector<KeySpec>& schema();
// The key named `name`, or nullptr.
const KeySpec* find_key(const std::string& name);
// Section names in order: "run", "model", ...
const std::vector<std::string>& sections();

// The YAML text of a value of `spec`: "0.1", "4GiB", "[3, 32, 32]", "cpu", "" for "".
std::string value_text(const KeySpec& spec, const Value& value);
// The default of `spec` as the reference prints it: its default_doc, else the value of a
// default-constructed Config ("0.1", "4GiB", "\"\"").
std::string default_text(const KeySpec& spec);
// What `spec` accepts, for hints: "a number > 0", "one of sgd | adamw", "true or false".
std::string accepted_text(const KeySpec& spec);
// Sizes as users write them: "4GiB" when exact, else the byte count.
std::string size_text(uint64_t bytes);
// Shortest text that reads back as the same double: "0.1", "1e-08", "25".
std::string real_text(double value);

}  // namespace ferry::config_internal
