// PCI addresses, the PCIe bandwidth table (Note [PCIe bandwidth table]) and index lists.
// Parsers here accept only well-formed, in-range text and never throw.
#include "topology/pci.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

namespace ferry {

namespace {

// Parses hex digits of at most `max_digits` into *out.
bool parse_hex(std::string_view text, size_t max_digits, uint32_t* out) {
  if (text.empty() || text.size() > max_digits) return false;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), *out, 16);
  return ec == std::errc() && ptr == text.data() + text.size();
}

}  // namespace

std::string PciAddress::str() const {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domain, bus, dev, fn);
}

std::optional<PciAddress> PciAddress::parse(std::string_view text) {
  // [domain:]bus:dev.fn
  const size_t dot = text.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::string_view fn_text = text.substr(dot + 1);
  std::string_view head = text.substr(0, dot);
  const size_t c2 = head.rfind(':');
  if (c2 == std::string_view::npos) return std::nullopt;
  const std::string_view dev_text = head.substr(c2 + 1);
  head = head.substr(0, c2);
  std::string_view domain_text;
  std::string_view bus_text = head;
  const size_t c1 = head.rfind(':');
  if (c1 != std::string_view::npos) {
    domain_text = head.substr(0, c1);
    bus_text = head.substr(c1 + 1);
  }
  uint32_t domain = 0, bus = 0, dev = 0, fn = 0;
  if (!domain_text.empty() || c1 != std::string_view::npos) {
    if (!parse_hex(domain_text, 8, &domain)) return std::nullopt;
  }
  if (!parse_hex(bus_text, 2, &bus) || !parse_hex(dev_text, 2, &dev) ||
      !parse_hex(fn_text, 1, &fn)) {
    return std::nullopt;
  }
  if (dev > 31 || fn > 7) return std::nullopt;
  return PciAddress{domain, static_cast<uint8_t>(bus), static_cast<uint8_t>(dev),
                    static_cast<uint8_t>(fn)};
}

std::optional<double> pcie_lane_gbps(int gen) {
  // See Note [PCIe bandwidth table].
  switch (gen) {
    case 1:
      return 2.5 * 8.0 / 10.0 / 8.0;
    case 2:
      return 5.0 * 8.0 / 10.0 / 8.0;
    case 3:
      return 8.0 * 128.0 / 130.0 / 8.0;
    case 4:
      return 16.0 * 128.0 / 130.0 / 8.0;
    case 5:
      return 32.0 * 128.0 / 130.0 / 8.0;
    case 6:
      return 64.0 * 242.0 / 256.0 / 8.0;
    default:
      return std::nullopt;
  }
}

std::optional<double> pcie_link_gbps(int gen, int width) {
  static constexpr int kWidths[] = {1, 2, 4, 8, 12, 16, 32};
  const auto lane = pcie_lane_gbps(gen);
  if (!lane || std::find(std::begin(kWidths), std::end(kWidths), width) == std::end(kWidths)) {
    return std::nullopt;
  }
  return *lane * width;
}

std::string LinkSpeed::str() const {
  if (!gbps) return "unknown";
  if (gen && width) return fmt::format("{:.2f} GB/s (gen{} x{})", *gbps, *gen, *width);
  return fmt::format("{:.2f} GB/s", *gbps);
}

std::string format_index_list(const std::vector<int>& sorted) {
  std::string out;
  size_t i = 0;
  while (i < sorted.size()) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", sorted[i]) : fmt::format("{}-{}", sorted[i], sorted[j]);
    i = j + 1;
  }
  return out;
}

std::optional<std::vector<int>> parse_index_list(std::string_view text, int max_value,
                                                 size_t max_count) {
  std::vector<int> out;
  auto parse_int = [&](std::string_view s, int* v) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    if (s.empty()) return false;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, 10);
    return ec == std::errc() && ptr == s.data() + s.size() && *v >= 0 && *v <= max_value;
  };
  if (text.find_first_not_of(' ') == std::string_view::npos) return out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view item = text.substr(start, comma - start);
    const size_t dash = item.find('-');
    int lo = 0, hi = 0;
    if (dash == std::string_view::npos) {
      if (!parse_int(item, &lo)) return std::nullopt;
      hi = lo;
    } else if (!parse_int(item.substr(0, dash), &lo) || !parse_int(item.substr(dash + 1), &hi) ||
               hi < lo) {
      return std::nullopt;
    }
    if (out.size() + static_cast<size_t>(hi - lo) + 1 > max_count) return std::nullopt;
    for (int v = lo; v <= hi; ++v) out.push_back(v);
    start = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace ferry
