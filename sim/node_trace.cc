// The node simulator's Chrome trace: one process per GPU (compute, to-host and to-device copy
// threads) and one counter track per link. Invariant: the same result gives the same text.
#include <fmt/format.h>

#include "sim/node_sim.h"

namespace ferry {

std::string chrome_trace(const NodeSimInput& in, const NodeSimResult& res) {
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  const auto add = [&](const std::string& e) {
    out += first ? "" : ",\n";
    out += e;
    first = false;
  };
  const int link_pid = static_cast<int>(in.ranks.size());
  for (size_t r = 0; r < in.ranks.size(); ++r) {
    add(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":"{}"}}}})", r,
                    in.ranks[r].name));
    static constexpr const char* kThreads[] = {"compute", "to host", "to device"};
    for (int t = 0; t < 3; ++t)
      add(fmt::format(
          R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":"{}"}}}})", r, t,
          kThreads[t]));
  }
  add(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":"links"}}}})",
                  link_pid));
  for (const SimSpan& s : res.spans) {
    add(fmt::format(
        R"({{"ph":"X","pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},"name":"{}","cat":"{}"}})",
        s.track / 3, s.track % 3, s.begin * 1e6, (s.end - s.begin) * 1e6, s.name,
        s.stall ? "stall" : (s.track % 3 == 0 ? "compute" : "copy")));
  }
  std::vector<std::pair<double, double>> last(in.links.size(), {-1, -1});
  for (const SimLinkSample& s : res.samples) {
    auto& l = last[static_cast<size_t>(s.link)];
    if (l.first == s.to_host_gbps && l.second == s.to_device_gbps) continue;
    l = {s.to_host_gbps, s.to_device_gbps};
    add(fmt::format(
        R"({{"ph":"C","pid":{},"ts":{:.3f},"name":"{}","args":{{"to_host_gbps":{:.4f},"to_device_gbps":{:.4f}}}}})",
        link_pid, s.at * 1e6, in.links[static_cast<size_t>(s.link)].name, s.to_host_gbps,
        s.to_device_gbps));
  }
  out += "\n],\"displayTimeUnit\":\"ms\"}\n";
  return out;
}

}  // namespace ferry
