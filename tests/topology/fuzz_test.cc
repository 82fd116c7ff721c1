// A deterministic fuzz driver for the topology inputs: hundreds of truncated and mutated hwloc
// XML and YAML files (wrong types, huge numbers, deleted and repeated lines) must each load or
// fail with a ferry::Error; nothing may crash or throw anything else. Run it under
// AddressSanitizer too (-DFERRY_SANITIZE=address).
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/topology/fixtures.h"
#include "topology/hwloc_topology.h"
#include "topology/links.h"
#include "topology/paths.h"
#include "topology/placement.h"
#include "topology/report.h"
#include "topology/synthetic.h"

namespace ferry {
namespace {

// A small deterministic generator (64-bit LCG), so every run tries the same cases.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    s_ = s_ * 6364136223846793005ull + 1442695040888963407ull;
    return s_ >> 33;
  }
  size_t below(size_t n) { return n == 0 ? 0 : next() % n; }

 private:
  uint64_t s_;
};

const char* const kNastyValues[] = {"99999999999999999999999999",
                                    "-1",
                                    "-2147483649",
                                    "1e999",
                                    "nan",
                                    "inf",
                                    "0x",
                                    "",
                                    "4294967296",
                                    "18446744073709551616",
                                    "3.5",
                                    "[1, 2]",
                                    "{a: 1}",
                                    "~",
                                    "\"text\"",
                                    "0xffffffffffffffffff",
                                    "1e-400",
                                    "-0",
                                    "00000000000000000000001"};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// One mutation of `text`, chosen by the generator.
std::string mutate(const std::string& text, Rng& rng, bool xml) {
  std::string s = text;
  switch (rng.below(7)) {
    case 0:  // truncate
      return s.substr(0, rng.below(s.size()));
    case 1: {  // overwrite a few bytes with structural characters
      static const char kChars[] = "<>\"=/:-[]{},#&* \t\n0123456789xZ";
      for (int i = 0, n = 1 + static_cast<int>(rng.below(4)); i < n && !s.empty(); ++i) {
        s[rng.below(s.size())] = kChars[rng.below(sizeof kChars - 1)];
      }
      return s;
    }
    case 2: {  // replace a number with a nasty value
      // Numbers right after `="` (XML attributes) or `: ` (YAML values).
      std::vector<std::pair<size_t, size_t>> spans;
      const std::string lead = xml ? "=\"" : ": ";
      for (size_t at = s.find(lead); at != std::string::npos; at = s.find(lead, at + 1)) {
        size_t b = at + lead.size(), e = b;
        if (e < s.size() && s[e] == '-') ++e;
        if (e >= s.size() || !std::isdigit(static_cast<unsigned char>(s[e]))) continue;
        while (e < s.size() && (std::isxdigit(static_cast<unsigned char>(s[e])) || s[e] == '.' ||
                                s[e] == 'x' || (xml && s[e] == ','))) {
          ++e;
        }
        spans.emplace_back(b, e - b);
      }
      if (spans.empty()) return s;
      const auto [pos, len] = spans[rng.below(spans.size())];
      s.replace(pos, len, kNastyValues[rng.below(std::size(kNastyValues))]);
      return s;
    }
    case 3: {  // delete a line
      auto lines = lines_of(s);
      if (!lines.empty()) lines.erase(lines.begin() + rng.below(lines.size()));
      return join_lines(lines);
    }
    case 4: {  // repeat a line
      auto lines = lines_of(s);
      if (!lines.empty()) {
        const size_t i = rng.below(lines.size());
        lines.insert(lines.begin() + i, lines[i]);
      }
      return join_lines(lines);
    }
    case 5: {  // swap two lines (reparents objects, breaks nesting)
      auto lines = lines_of(s);
      if (lines.size() > 1)
        std::swap(lines[rng.below(lines.size())], lines[rng.below(lines.size())]);
      return join_lines(lines);
    }
    default: {  // change an object type or a key
      static const char* const kXml[][2] = {{"type=\"PCIDev\"", "type=\"Bridge\""},
                                            {"type=\"Bridge\"", "type=\"PCIDev\""},
                                            {"type=\"Package\"", "type=\"Group\""},
                                            {"type=\"NUMANode\"", "type=\"Core\""},
                                            {"bridge_type=\"0-1\"", "bridge_type=\"1-1\""},
                                            {"bridge_type=\"1-1\"", "bridge_type=\"0-1\""},
                                            {"pci_type=\"0302", "pci_type=\"0200"}};
      static const char* const kYaml[][2] = {{"gpus:", "nics:"},        {"switches:", "gpus:"},
                                             {"count:", "cores:"},      {"gen:", "width:"},
                                             {"sockets:", "switches:"}, {"parent:", "package:"},
                                             {"kind:", "name:"}};
      const auto& pair =
          xml ? kXml[rng.below(std::size(kXml))] : kYaml[rng.below(std::size(kYaml))];
      const size_t at = s.find(pair[0], rng.below(s.size()));
      const size_t where = at != std::string::npos ? at : s.find(pair[0]);
      if (where != std::string::npos) s.replace(where, std::strlen(pair[0]), pair[1]);
      return s;
    }
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

struct Tally {
  int loaded = 0, rejected = 0;
};

template <typename Load>
void fuzz(const std::string& seed, bool xml, uint64_t seed_value, int cases, Load load,
          Tally& tally) {
  Rng rng(seed_value);
  for (int i = 0; i < cases; ++i) {
    std::string input = mutate(seed, rng, xml);
    if (rng.below(3) == 0) input = mutate(input, rng, xml);      // sometimes two mutations
    if (const char* dir = std::getenv("FERRY_FUZZ_DUMP_DIR")) {  // to replay cases elsewhere
      std::ofstream(fmt::format("{}/case-{}-{}.{}", dir, seed_value, i, xml ? "xml" : "yaml"))
          << input;
    }
    try {
      exercise(load(input));
      ++tally.loaded;
    } catch (const Error& e) {
      ++tally.rejected;
      EXPECT_NE(std::string(e.what()), "") << "case " << i;
      if (std::getenv("FERRY_FUZZ_VERBOSE")) std::printf("case %d: %s\n", i, e.what());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "case " << i << " threw a non-ferry exception: " << e.what();
    }
  }
}

TEST(Fuzz, MutatedHwlocXml) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  setenv("HWLOC_HIDE_ERRORS", "2", 1);  // hwloc's own warnings about broken inputs
  Tally tally;
  uint64_t seed = 1;
  for (const char* file : {"nvidiaDGX2.xml", "power8gpudistances.xml", "24em64t-2n6c2t-pci.xml",
                           "coral-butte-hwloc1.xml"}) {
    const std::string text = testing::read_text(testing::real_dir() + "/" + file);
    fuzz(
        text, true, seed++, 80,
        [](const std::string& x) { return HwlocTopology::from_xml_buffer(x, "fuzz").model(); },
        tally);
  }
  std::printf("xml fuzz: %d loaded, %d rejected with a typed error\n", tally.loaded,
              tally.rejected);
  EXPECT_EQ(tally.loaded + tally.rejected, 320);
  EXPECT_GT(tally.rejected, 0);
  EXPECT_GT(tally.loaded, 0);
}

TEST(Fuzz, MutatedYaml) {
  Tally tally;
  uint64_t seed = 100;
  std::vector<std::string> seeds;
  for (const char* name :
       {"dgx1-like.yaml", "workstation-4gpu.yaml", "dgx2-like.yaml", "h100-snc4.yaml"}) {
    seeds.push_back(testing::read_text(testing::config_path(name)));
  }
  seeds.push_back(dump_model_yaml(testing::synthetic("dgx1-like.yaml")));
  for (const auto& text : seeds) {
    fuzz(
        text, false, seed++, 70, [](const std::string& y) { return parse_yaml(y, "fuzz"); }, tally);
  }
  std::printf("yaml fuzz: %d loaded, %d rejected with a typed error\n", tally.loaded,
              tally.rejected);
  EXPECT_EQ(tally.loaded + tally.rejected, 350);
  EXPECT_GT(tally.rejected, 0);
  EXPECT_GT(tally.loaded, 0);
}

}  // namespace
}  // namespace ferry
