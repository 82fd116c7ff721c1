// topo-probe: prints the GPU/NIC matrix, the PCIe tree with link bandwidths, or JSON, for this
// machine, an hwloc XML file or a synthetic YAML description. Exit 0 on success, 2 with one
// line on stderr for any user error (missing or malformed file, bad flag).
#include <cstdio>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "common/error.h"
#include "common/file_write.h"
#include "topology/hwloc_topology.h"
#include "topology/links.h"
#include "topology/placement.h"
#include "topology/report.h"
#include "topology/synthetic.h"

namespace {

struct Args {
  std::string xml, synthetic, export_path, dump_model;
  bool json = false;
  int ranks = 0;
  ferry::LinkOptions links;
  std::optional<double> root_complex_gbps;
};

int run(const Args& a) {
  using namespace ferry;
  std::optional<HwlocTopology> hw;
  std::optional<Topology> topo;
  if (!a.synthetic.empty()) {
    topo.emplace(load_yaml(a.synthetic));
  } else {
    hw.emplace(a.xml.empty() ? HwlocTopology::live() : HwlocTopology::from_xml(a.xml));
    topo.emplace(hw->model());
  }
  if (!a.export_path.empty()) {
    if (!hw) {
      throw ConfigError("--export writes hwloc XML, which a synthetic description has no form of",
                        "use --dump-model FILE.yaml to save a synthetic topology");
    }
    hw->export_xml(a.export_path);
    std::fprintf(stderr, "topo-probe: wrote hwloc XML of %s to %s\n", hw->source().c_str(),
                 a.export_path.c_str());
  }
  if (!a.dump_model.empty()) {
    write_file(a.dump_model, dump_model_yaml(*topo),
               "--dump-model: give a path on a filesystem with space, in a writable directory");
    std::fprintf(stderr, "topo-probe: wrote the model of %s to %s\n", topo->source().c_str(),
                 a.dump_model.c_str());
  }
  LinkOptions options = a.links;
  options.root_complex_gbps = a.root_complex_gbps;
  const LinkMap links(*topo, options);
  std::vector<RankBinding> bindings;
  if (a.ranks > 0) bindings = place_ranks(*topo, a.ranks);
  if (a.json) {
    nlohmann::json j = to_json(*topo, links);
    if (a.ranks > 0) {
      for (const auto& b : bindings) {
        j["bindings"].push_back({{"rank", b.local_rank},
                                 {"gpu", b.gpu ? nlohmann::json(*b.gpu) : nlohmann::json(nullptr)},
                                 {"numa", b.numa},
                                 {"cpus", format_index_list(b.cpus)}});
      }
    }
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << format_matrix(*topo) << "\n" << format_tree(*topo, links);
    if (a.ranks > 0)
      std::cout << "\nBindings for " << a.ranks << " local ranks:\n" << format_bindings(bindings);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"topo-probe: PCIe/NUMA topology of GPUs and NICs (nvidia-smi topo -m style)"};
  auto* xml = app.add_option("--xml", a.xml, "Load an hwloc XML export (hwloc 1.x or 2.x format)");
  auto* syn = app.add_option("--synthetic", a.synthetic,
                             "Load a YAML description (configs/topologies/) or a model dump");
  xml->excludes(syn);
  app.add_flag("--json", a.json, "Print JSON instead of text");
  app.add_option("--export", a.export_path, "Write the loaded hwloc topology as XML to FILE");
  app.add_option("--dump-model", a.dump_model, "Write the topology model as YAML to FILE");
  app.add_option("--ranks", a.ranks, "Also place N local ranks and print the bindings")
      ->check(CLI::Range(1, 4096));
  app.add_option("--default-link-gbps", a.links.default_pcie_gbps,
                 "Bandwidth assumed for a PCIe link of unknown speed (GB/s)")
      ->check(CLI::Range(0.001, 1024.0));
  app.add_option("--inter-socket-gbps", a.links.inter_socket_gbps,
                 "Bandwidth assumed for an inter-socket link not declared (GB/s)")
      ->check(CLI::Range(0.001, 1024.0));
  app.add_option("--root-complex-gbps", a.root_complex_gbps,
                 "Bandwidth assumed for a root complex not declared (GB/s; default: the sum of "
                 "its links)")
      ->check(CLI::Range(0.001, 1024.0));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "topo-probe: error: %s; run topo-probe --help\n", e.what());
    return 2;
  }
  try {
    return run(a);
  } catch (const ferry::Error& e) {
    if (e.hint().empty()) {
      std::fprintf(stderr, "topo-probe: error: %s\n", e.what());
    } else {
      std::fprintf(stderr, "topo-probe: error: %s; hint: %s\n", e.what(), e.hint().c_str());
    }
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "topo-probe: internal error: %s\n", e.what());
    return 1;
  }
}
