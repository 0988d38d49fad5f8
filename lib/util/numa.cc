// NUMA placement through libnuma (numa_run_on_node, numa_set_preferred, mbind, get_mempolicy).
#include "lib/util/numa.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <vector>

#ifdef STRATA_HAVE_NUMA
#include <numa.h>
#include <numaif.h>
#include <unistd.h>
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

bool PreferMemoryNode(void *p, size_t bytes, int node, bool even_one_node) {
#ifdef STRATA_HAVE_NUMA
  if (!Available() || p == nullptr || bytes == 0 || node < 0 || node >= NodeCount() ||
      (NodeCount() < 2 && !even_one_node)) {
    return false;
  }
  // One bit per node in an array of unsigned longs, as mbind reads it.
  constexpr size_t kBits = 8 * sizeof(unsigned long);
  std::vector<unsigned long> mask(static_cast<size_t>(node) / kBits + 1, 0);
  mask[static_cast<size_t>(node) / kBits] = 1ul << (static_cast<size_t>(node) % kBits);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t len = (bytes + page - 1) / page * page;
  return mbind(p, len, MPOL_PREFERRED, mask.data(), mask.size() * kBits + 1, 0) == 0;
#else
  (void)p;
  (void)bytes;
  (void)node;
  (void)even_one_node;
  return false;
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
