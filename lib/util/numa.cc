// NUMA placement through libnuma (numa_run_on_node, numa_set_preferred, get_mempolicy).
#include "lib/util/numa.h"

#include <cctype>
#include <cstdlib>
#include <fstream>

#ifdef STRATA_HAVE_NUMA
#include <numa.h>
#include <numaif.h>
#endif

namespace strata::numa {

namespace {

bool Available() {
#ifdef STRATA_HAVE_NUMA
  static const bool ok = numa_available() >= 0;
  return ok;
#else
  return false;
#endif
}

}  // namespace

int NodeCount() {
#ifdef STRATA_HAVE_NUMA
  if (Available()) return numa_num_configured_nodes() > 0 ? numa_num_configured_nodes() : 1;
#endif
  return 1;
}

int PciDeviceNode(const std::string &bus_id, const std::string &sysfs_root) {
  std::string id;
  for (char c : bus_id) id.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (id.empty() || id.find('/') != std::string::npos) return -1;
  std::ifstream f(sysfs_root + "/bus/pci/devices/" + id + "/numa_node");
  std::string text;
  if (!(f >> text)) return -1;
  char *end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v < 0 || v > 4096) return -1;
  return static_cast<int>(v);
}

int MemoryNode(const void *p) {
#ifdef STRATA_HAVE_NUMA
  if (!Available() || p == nullptr) return -1;
  int node = -1;
  if (get_mempolicy(&node, nullptr, 0, const_cast<void *>(p), MPOL_F_NODE | MPOL_F_ADDR) != 0) return -1;
  return node;
#else
  (void)p;
  return -1;
#endif
}

ScopedNodeBinding::ScopedNodeBinding(int node, bool even_one_node) : node_(node) {
#ifdef STRATA_HAVE_NUMA
  if (!Available() || node < 0 || node >= NodeCount() || (NodeCount() < 2 && !even_one_node)) return;
  if (numa_run_on_node(node) != 0) return;
  numa_set_preferred(node);
  bound_ = true;
#endif
}

ScopedNodeBinding::~ScopedNodeBinding() {
#ifdef STRATA_HAVE_NUMA
  if (!bound_) return;
  numa_run_on_node(-1);  // every node's CPUs again
  numa_set_localalloc();
#endif
}

}  // namespace strata::numa
