// Discovery through hwloc: the live machine or an hwloc XML file (2.x or 1.x format), with I/O
// objects kept, converted into the Topology model. Invariant: an HwlocTopology always holds a
// loaded hwloc topology; every failing hwloc call becomes a typed error (Note [hwloc's errors]).
#pragma once

#include <string>

#include "topology/model.h"

// Note [hwloc's errors]
// A failing hwloc call becomes LibraryError via HWLOC_CHECK; a file hwloc cannot read, DataError.
// hwloc types stay out of this header.

struct hwloc_topology;  // hwloc_topology_t is `struct hwloc_topology*`

namespace ferry {

class HwlocTopology {
 public:
  // This machine, as the process sees it.
  static HwlocTopology live();
  // An exported hwloc XML file. Throws DataError when the file is missing, unreadable, too
  // large, malformed, or of an XML version this hwloc cannot import (2.9 reads 1.x and 2.x).
  static HwlocTopology from_xml(const std::string& path);
  // The same from a buffer; `name` is used in messages.
  static HwlocTopology from_xml_buffer(const std::string& xml, const std::string& name);

  HwlocTopology(HwlocTopology&& other) noexcept;
  HwlocTopology& operator=(HwlocTopology&& other) noexcept;
  HwlocTopology(const HwlocTopology&) = delete;
  HwlocTopology& operator=(const HwlocTopology&) = delete;
  ~HwlocTopology();

  // True for the live machine: only then can bindings be applied (binding.h).
  bool is_live() const { return live_; }
  const std::string& source() const { return source_; }
  hwloc_topology* get() const { return topo_; }

  // The model of this topology.
  Topology model() const;
  // Writes it as hwloc 2.x XML. Throws LibraryError when hwloc cannot write the file.
  void export_xml(const std::string& path) const;

 private:
  HwlocTopology(hwloc_topology* topo, bool live, std::string source)
      : topo_(topo), live_(live), source_(std::move(source)) {}

  hwloc_topology* topo_ = nullptr;
  bool live_ = false;
  std::string source_;
};

// Shorthands.
Topology discover_live();
Topology load_xml(const std::string& path);

// The hwloc release this program was built with, "2.9.0".
std::string hwloc_version();

}  // namespace ferry
