// NUMA placement: which node a PCI device (a GPU) hangs off, and binding a thread's CPUs and memory
// to a node for a scope, so the weights a GPU reads over PCIe and its pinned buffers are first
// touched in that node's memory. Everything degrades to "one node, nothing to do" on hosts without
// NUMA (or without libnuma at build time).
#pragma once

#include <cstddef>
#include <string>

namespace strata::numa {

// Memory nodes of the host (1 without NUMA support).
int NodeCount();

// The NUMA node of the PCI device `bus_id` ("0000:65:00.0", any case), from
// <sysfs_root>/bus/pci/devices/<bus_id>/numa_node; -1 when the host does not say.
int PciDeviceNode(const std::string &bus_id, const std::string &sysfs_root = "/sys");

// The node holding the page at p (touched memory), or -1 when the host cannot say.
int MemoryNode(const void *p);

// Asks that the pages of [p, p + bytes) (page-aligned p) come from `node`'s memory when first
// touched, whichever thread touches them (preferred, as below). False, and nothing asked, for
// node < 0, a node the host lacks, or a host of one node unless `even_one_node`.
bool PreferMemoryNode(void *p, size_t bytes, int node, bool even_one_node = false);

// For its lifetime, the calling thread runs on `node`'s CPUs and its new pages come from `node`'s
// memory (preferred, so a full node falls back to the others instead of failing); undone at the
// end. Binds nothing (bound() false) for node < 0, a node the host lacks, or a host of one node
// unless `even_one_node`.
class ScopedNodeBinding {
 public:
  explicit ScopedNodeBinding(int node, bool even_one_node = false);
  ~ScopedNodeBinding();
  ScopedNodeBinding(const ScopedNodeBinding &) = delete;
  ScopedNodeBinding &operator=(const ScopedNodeBinding &) = delete;
  bool bound() const { return bound_; }
  int node() const { return node_; }

 private:
  int node_ = -1;
  bool bound_ = false;
};

}  // namespace strata::numa
