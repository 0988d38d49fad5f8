// NUMA placement helpers: the PCI device's node from sysfs (a fake tree), a binding that puts a
// thread's new pages on a node and a range preferred on a node (checked where the pages landed), both
// refusing nodes the host lacks.
#include "lib/util/numa.h"

#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

namespace {

std::string FakeSysfs(const std::string &bus_id, const std::string &content) {
  char tmpl[] = "/tmp/strata-sysfs-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string root = tmpl;
  const std::string dir = root + "/bus/pci/devices/" + bus_id;
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/numa_node") << content;
  return root;
}

}  // namespace

TEST_CASE("numa: a PCI device's node comes from sysfs, unknown is -1", "[numa]") {
  using strata::numa::PciDeviceNode;
  const std::string root = FakeSysfs("0000:65:00.0", "1\n");
  CHECK(PciDeviceNode("0000:65:00.0", root) == 1);
  CHECK(PciDeviceNode("0000:65:00.0", root + "/nowhere") == -1);
  CHECK(PciDeviceNode("0000:66:00.0", root) == -1);  // no such device
  CHECK(PciDeviceNode("", root) == -1);
  CHECK(PciDeviceNode("../../etc", root) == -1);      // a path, not a bus id
  // CUDA reports bus ids in capitals; sysfs names them in lower case.
  const std::string upper = FakeSysfs("0000:ab:00.0", "0");
  CHECK(PciDeviceNode("0000:AB:00.0", upper) == 0);
  for (const char *bad : {"-1", "abc", "1x", ""}) {
    const std::string r = FakeSysfs("0000:01:00.0", bad);
    INFO("numa_node holds '" << bad << "'");
    CHECK(PciDeviceNode("0000:01:00.0", r) == -1);
    std::filesystem::remove_all(r);
  }
  std::filesystem::remove_all(root);
  std::filesystem::remove_all(upper);
}

TEST_CASE("numa: a bound thread's new pages come from its node, absent nodes bind nothing", "[numa]") {
  using strata::numa::MemoryNode;
  using strata::numa::NodeCount;
  using strata::numa::ScopedNodeBinding;
  const int n = NodeCount();
  REQUIRE(n >= 1);
  {
    ScopedNodeBinding none(-1, true);
    CHECK_FALSE(none.bound());
    ScopedNodeBinding absent(n, true);  // nodes are 0 .. n - 1
    CHECK_FALSE(absent.bound());
  }
  if (n == 1) {
    ScopedNodeBinding one(0);  // a host of one node: nothing to place
    CHECK_FALSE(one.bound());
  }
  // The last node, even on a host of one: pages first touched while bound land there.
  const int node = n - 1;
  ScopedNodeBinding bind(node, true);
  if (!bind.bound()) {
    WARN("no NUMA support: the binding is a no-op");
    return;
  }
  const size_t bytes = size_t{8} << 20;
  std::unique_ptr<char[]> p(new char[bytes]);
  for (size_t i = 0; i < bytes; i += 4096) p[i] = static_cast<char>(i);
  CHECK(MemoryNode(p.get()) == node);
  CHECK(MemoryNode(p.get() + bytes - 4096) == node);
}

TEST_CASE("numa: a range preferred on a node gets its pages there, whoever touches them", "[numa]") {
  using strata::numa::MemoryNode;
  using strata::numa::NodeCount;
  using strata::numa::PreferMemoryNode;
  const int n = NodeCount();
  const size_t bytes = size_t{4} << 20;
  void *raw = std::aligned_alloc(4096, bytes);
  REQUIRE(raw != nullptr);
  std::unique_ptr<char, decltype(&std::free)> p(static_cast<char *>(raw), &std::free);
  CHECK_FALSE(PreferMemoryNode(p.get(), bytes, -1, true));
  CHECK_FALSE(PreferMemoryNode(p.get(), bytes, n, true));  // nodes are 0 .. n - 1
  CHECK_FALSE(PreferMemoryNode(p.get(), bytes, 63, true));
  if (n == 1) CHECK_FALSE(PreferMemoryNode(p.get(), bytes, 0));  // one node: nothing to place
  const int node = n - 1;
  if (!PreferMemoryNode(p.get(), bytes, node, true)) {
    WARN("no NUMA support: preferring a node is a no-op");
    return;
  }
  std::thread([&] {  // touched by another thread, unbound
    for (size_t i = 0; i < bytes; i += 4096) p.get()[i] = static_cast<char>(i);
  }).join();
  CHECK(MemoryNode(p.get()) == node);
  CHECK(MemoryNode(p.get() + bytes - 4096) == node);
}
