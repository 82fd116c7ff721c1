// A deterministic fuzz driver for the topology inputs: hundreds of truncated and mutated hwloc
// XML and YAML files (wrong types, huge numbers, deleted and repeated lines; the shared mutator
// tests/support/fuzz_mutator.h plus topology's own values and kinds) must each load or fail with
// a ferry::Error; nothing may crash or throw anything else. fuzz_asan runs it under ASan too.
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/fuzz_mutator.h"
#include "tests/topology/fixtures.h"
#include "topology/hwloc_topology.h"
#include "topology/links.h"
#include "topology/paths.h"
#include "topology/placement.h"
#include "topology/report.h"
#include "topology/synthetic.h"

namespace ferry {
namespace {

// Values a topology file may hold where a number belongs, beyond fuzz::nasty_numbers(): YAML's
// other nulls, flows and number forms, and integers past the widths the readers convert to.
const std::vector<std::string> kTopologyValues = {"~",
                                                  "[1, 2]",
                                                  "{a: 1}",
                                                  "inf",
                                                  "0x",
                                                  "0xffffffffffffffffff",
                                                  "00000000000000000000001",
                                                  "-2147483649",
                                                  "3.5",
                                                  "\"text\""};

// Characters that end or open an XML element or attribute, or a YAML mapping, list or scalar.
constexpr const char* kXmlStructural = "<>\"=/ \t\n0123456789xZ";
constexpr const char* kYamlStructural = ":-[]{},#&* \t\n0123456789xZ";

// An object type or a key swapped for another the reader knows: a file that stays well-formed
// but describes a different machine (a GPU becomes a bridge, a socket list a switch list).
std::string swap_kind(const std::string& text, fuzz::Rng& rng, bool xml) {
  static const char* const kXml[][2] = {{"type=\"PCIDev\"", "type=\"Bridge\""},
                                        {"type=\"Bridge\"", "type=\"PCIDev\""},
                                        {"type=\"Package\"", "type=\"Group\""},
                                        {"type=\"NUMANode\"", "type=\"Core\""},
                                        {"bridge_type=\"0-1\"", "bridge_type=\"1-1\""},
                                        {"bridge_type=\"1-1\"", "bridge_type=\"0-1\""},
                                        {"pci_type=\"0302", "pci_type=\"0200"}};
  static const char* const kYaml[][2] = {
      {"gpus:", "nics:"},        {"switches:", "gpus:"},  {"count:", "cores:"}, {"gen:", "width:"},
      {"sockets:", "switches:"}, {"parent:", "package:"}, {"kind:", "name:"}};
  std::string s = text;
  const auto& pair = xml ? kXml[rng.below(std::size(kXml))] : kYaml[rng.below(std::size(kYaml))];
  const size_t at = s.find(pair[0], rng.below(s.size()));
  const size_t where = at != std::string::npos ? at : s.find(pair[0]);
  if (where != std::string::npos) s.replace(where, std::strlen(pair[0]), pair[1]);
  return s;
}

// One mutation of `text`: the shared text mutations (a nasty number, structural characters,
// deleted, repeated and swapped lines), a topology value, a byte-level mutation (truncation,
// flipped bits, inserted garbage) or a swapped object type or key.
std::string mutate(const std::string& text, fuzz::Rng& rng, bool xml) {
  switch (rng.below(8)) {
    case 0:
      return swap_kind(text, rng, xml);
    case 1:
      return fuzz::replace_number(text, rng, kTopologyValues);
    case 2:
      return fuzz::mutate_bytes(text, rng);
    default:
      return fuzz::mutate_text(text, rng, xml ? kXmlStructural : kYamlStructural);
  }
}

// Everything a consumer does with a loaded topology.
void exercise(const Topology& t) {
  const LinkMap links(t);
  (void)class_matrix(t);
  (void)to_json(t, links).dump();
  (void)format_matrix(t);
  (void)format_tree(t, links);
  for (const auto& g : t.gpus()) {
    for (const auto& m : t.numa_nodes()) (void)links.gpu_path(g.index, m.os_index);
  }
  const int ranks = t.gpus().empty() ? 3 : static_cast<int>(t.gpus().size());
  (void)format_bindings(place_ranks(t, ranks));
  (void)parse_yaml(dump_model_yaml(t), "dump");
}

// `cases` mutations of `seed` (one time in three, two), each loaded and exercised.
template <typename Load>
void fuzz_topology(const std::string& seed, bool xml, uint64_t seed_value, int cases, Load load,
                   fuzz::Tally& tally) {
  fuzz::Rng rng(seed_value);
  const std::string label = fmt::format("topology-{}-{}", xml ? "xml" : "yaml", seed_value);
  for (int i = 0; i < cases; ++i) {
    std::string input = mutate(seed, rng, xml);
    if (rng.one_in(3)) input = mutate(input, rng, xml);
    fuzz::run_case<Error>(label, i, input, tally, [&](const std::string& x) { exercise(load(x)); });
  }
}

TEST(Fuzz, MutatedHwlocXml) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  setenv("HWLOC_HIDE_ERRORS", "2", 1);  // hwloc's own warnings about broken inputs
  fuzz::Tally tally;
  uint64_t seed = 1;
  for (const char* file : {"nvidiaDGX2.xml", "power8gpudistances.xml", "24em64t-2n6c2t-pci.xml",
                           "coral-butte-hwloc1.xml"}) {
    const std::string text = testing::read_text(testing::real_dir() + "/" + file);
    fuzz_topology(
        text, true, seed++, 80,
        [](const std::string& x) { return HwlocTopology::from_xml_buffer(x, "fuzz").model(); },
        tally);
  }
  fuzz::expect_tally(tally, "xml fuzz", "loaded", "a typed error",
                     {.cases = 320, .rejected_above = 0, .accepted_above = 0});
}

TEST(Fuzz, MutatedYaml) {
  fuzz::Tally tally;
  uint64_t seed = 100;
  std::vector<std::string> seeds;
  for (const char* name :
       {"dgx1-like.yaml", "workstation-4gpu.yaml", "dgx2-like.yaml", "h100-snc4.yaml"}) {
    seeds.push_back(testing::read_text(testing::config_path(name)));
  }
  seeds.push_back(dump_model_yaml(testing::synthetic("dgx1-like.yaml")));
  for (const auto& text : seeds) {
    fuzz_topology(
        text, false, seed++, 70, [](const std::string& y) { return parse_yaml(y, "fuzz"); }, tally);
  }
  fuzz::expect_tally(tally, "yaml fuzz", "loaded", "a typed error",
                     {.cases = 350, .rejected_above = 0, .accepted_above = 0});
}

}  // namespace
}  // namespace ferry
