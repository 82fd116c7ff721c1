// Reading a mix file (Note [A mix file] in job_mix.h): strict keys, every error naming the file,
// line and key.
#include "trainer/simulate/job_mix.h"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "common/error.h"
#include "jobs/job_ledger.h"
#include "topology/yaml_reader.h"

namespace ferry {

namespace {

constexpr double kMaxArrivalS = 1e9;  // about 30 years of simulated time
constexpr int64_t kMaxSteps = int64_t{1} << 40;

std::string read_text(const std::string& file) {
  if (!std::filesystem::is_regular_file(file))
    throw ConfigError(fmt::format("--mix: cannot read mix file '{}'", file),
                      "give a YAML mix file (see configs/simulate/mix-h100.yaml)");
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

MixSpec load_mix(const std::string& file) {
  const yaml::Reader rd(file);
  const YAML::Node root = yaml::parse(read_text(file), file);
  rd.check_keys(root, {"memory", "objective", "jobs"}, "mix");
  MixSpec mix;
  mix.file = file;
  if (root["memory"]) {
    mix.memory = rd.bytes(root["memory"], "memory");
    if (mix.memory == 0)
      throw rd.error(root["memory"], "memory must be above 0",
                     "write the GPU's memory, e.g. 80GiB");
  }
  if (const YAML::Node o = root["objective"]) {
    const std::string word = rd.string(o, "objective");
    try {
      mix.objective = parse_share_objective(word);
    } catch (const ConfigError&) {
      throw rd.error(o, fmt::format("objective must be throughput or fair, got '{}'", word),
                     "as memory.share_objective");
    }
  }
  const YAML::Node jobs = root["jobs"];
  if (!jobs || !jobs.IsSequence() || jobs.size() == 0)
    throw rd.error(jobs ? jobs : root, "jobs: required, a list of at least one job",
                   "list each job as `- config: FILE` with arrive_s and steps");
  if (jobs.size() > static_cast<size_t>(JobLedger::kMaxJobs))
    throw rd.error(jobs, fmt::format("jobs: at most {}, got {}", JobLedger::kMaxJobs, jobs.size()),
                   "as many jobs as the node's job ledger holds");
  std::set<std::string> names;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const YAML::Node j = jobs[i];
    const std::string where = fmt::format("jobs[{}]", i);
    rd.check_keys(j, {"config", "set", "name", "arrive_s", "steps"}, where);
    MixJobSpec spec;
    if (!j["config"]) throw rd.error(j, where + ".config: required", "give the job's config file");
    spec.config = rd.string(j["config"], where + ".config", 4096);
    if (const YAML::Node set = j["set"]) {
      if (!set.IsSequence())
        throw rd.error(set, where + ".set must be a list of key=value",
                       "write e.g. set: [data.batch_size=256]");
      for (size_t k = 0; k < set.size(); ++k)
        spec.overrides.push_back(rd.string(set[k], fmt::format("{}.set[{}]", where, k), 4096));
    }
    if (const YAML::Node a = j["arrive_s"])
      spec.arrive_s = rd.number_in(a, where + ".arrive_s", 0, kMaxArrivalS, "s");
    if (const YAML::Node s = j["steps"]) spec.steps = rd.integer(s, where + ".steps", 1, kMaxSteps);
    spec.name = j["name"] ? rd.string(j["name"], where + ".name", 64)
                          : std::filesystem::path(spec.config).stem().string();
    if (spec.name.empty())
      throw rd.error(j["name"], where + ".name must not be empty", "name the job");
    if (names.count(spec.name)) {
      if (j["name"])
        throw rd.error(j["name"],
                       fmt::format("{}.name: '{}' names an earlier job", where, spec.name),
                       "give each job its own name");
      std::string unique = spec.name;
      for (int k = 2; names.count(unique); ++k) unique = fmt::format("{}-{}", spec.name, k);
      spec.name = unique;
    }
    names.insert(spec.name);
    mix.jobs.push_back(std::move(spec));
  }
  return mix;
}

}  // namespace ferry
