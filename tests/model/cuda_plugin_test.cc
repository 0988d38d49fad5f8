// The CUDA backend's plugin as the registry opens it (backends/plugin_loader.h, backends/registry.h
// OpenCudaPlugin): the search path, a plugin not found (every place tried named), a file that is no
// shared object, a shared object without the entry, plugins of another build (one that refuses this
// library, one that answers with another build's table: tests/capi/fake_cuda_plugin.c), and the
// real plugin when this build made one: its refusal of other versions, and the knobs it reads
// being the library's. The log sink's forwarding is checked on this image's own copy.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda_plugin.h"
#include "backends/plugin_loader.h"
#include "backends/registry.h"
#include "lib/util/log.h"
#include "lib/util/tunables.h"

namespace {

using namespace strata;
namespace fs = std::filesystem;

// A fresh directory that does not exist yet, under the temporary directory.
fs::path FreshDir() {
  std::mt19937_64 rng(std::random_device{}());
  return fs::temp_directory_path() / ("strata_plugin_" + std::to_string(::getpid()) + "_" + std::to_string(rng()));
}

std::string Message(const absl::Status &st) { return std::string(st.message()); }

}  // namespace

TEST_CASE("plugin: the search path is beside this image, beside the executable, then the loader's", "[plugin]") {
  const std::vector<std::string> places = backends::PluginSearchPath("libx.so");
  REQUIRE(places.size() >= 2);
  CHECK(places.back() == "libx.so");
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(n > 0);
  // strata_core is linked into this executable: this image and the executable are one place.
  CHECK(places.size() == 2);
  CHECK(places[0] == fs::path(std::string(exe, static_cast<size_t>(n))).parent_path().string() + "/libx.so");
}

TEST_CASE("plugin: not found names every place tried, and the hint", "[plugin]") {
  const fs::path dir = FreshDir();
  const std::string a = (dir / "a" / "libstrata-cuda.so").string(), b = (dir / "b" / "libstrata-cuda.so").string();
  const std::string bare = "libstrata-cuda-absent-" + std::to_string(::getpid()) + ".so";
  const absl::Status st = backends::OpenCudaPlugin({a, b, bare}, "; HINT").status();
  CHECK(StatusToMoe(st) == MOE_ERR_UNSUPPORTED_BACKEND);
  CHECK(Message(st) == "the CUDA backend's plugin was not found: tried " + a + ", " + b +
                           " and the dynamic loader's search for " + bare + " (" + bare +
                           ": cannot open shared object file: No such file or directory); HINT");
  // One place alone.
  CHECK(Message(backends::OpenCudaPlugin({a}, "").status()) == "the CUDA backend's plugin was not found: tried " + a);
}

TEST_CASE("plugin: a file found that does not load, or loads without the entry, is named with why", "[plugin]") {
  const fs::path dir = FreshDir();
  fs::create_directories(dir);
  const std::string junk = (dir / "libstrata-cuda.so").string();
  {
    std::mt19937 rng(std::random_device{}());
    std::ofstream f(junk, std::ios::binary);
    for (int i = 0; i < 4096; ++i) f.put(static_cast<char>(rng()));
  }
  // The search stops at the first file found, even with a loadable one after it.
  const absl::Status st = backends::OpenCudaPlugin({junk, STRATA_FAKE_PLUGIN_REFUSING}, "").status();
  INFO(Message(st));
  CHECK(StatusToMoe(st) == MOE_ERR_UNSUPPORTED_BACKEND);
  CHECK(Message(st).rfind("the CUDA backend's plugin " + junk + " cannot be loaded: " + junk, 0) == 0);
  fs::remove_all(dir);

  // A shared object that is not a plugin: the test executable's own libc.
  Dl_info info;
  REQUIRE(dladdr(reinterpret_cast<void *>(&::getpid), &info) != 0);
  const std::string libc = info.dli_fname;
  const absl::Status none = backends::OpenCudaPlugin({libc}, "").status();
  INFO(Message(none));
  CHECK(StatusToMoe(none) == MOE_ERR_UNSUPPORTED_BACKEND);
  CHECK(Message(none).rfind("the CUDA backend's plugin " + libc + " is not one: it exports no strata_cuda_plugin_open",
                            0) == 0);
}

TEST_CASE("plugin: plugins of another build are refused with why, before any call", "[plugin]") {
  const absl::Status refused = backends::OpenCudaPlugin({STRATA_FAKE_PLUGIN_REFUSING}, "").status();
  CHECK(StatusToMoe(refused) == MOE_ERR_UNSUPPORTED_BACKEND);
  CHECK(Message(refused) == std::string("the CUDA backend's plugin ") + STRATA_FAKE_PLUGIN_REFUSING +
                                " refused to load: the CUDA plugin is built for plugin ABI 9999, the library "
                                "loading it is ABI " +
                                std::to_string(backends::kCudaPluginAbi) + " (" + std::to_string(MOE_VERSION_NUMBER) +
                                ")");
  const absl::Status careless = backends::OpenCudaPlugin({STRATA_FAKE_PLUGIN_CARELESS}, "").status();
  CHECK(StatusToMoe(careless) == MOE_ERR_UNSUPPORTED_BACKEND);
  INFO(Message(careless));
  CHECK(Message(careless).rfind(std::string("the CUDA backend's plugin ") + STRATA_FAKE_PLUGIN_CARELESS +
                                    " is of another build: its table is plugin ABI 9999 of Strata version number 9999",
                                0) == 0);
}

TEST_CASE("plugin: a plugin's log lines go to the library's sink", "[plugin][log]") {
  // This image's copy of lib/util/log.cc stands for a plugin's: forwarded, its lines and its
  // LogToHost are the forward's.
  static std::vector<std::string> lines;
  static bool to_host = false;
  lines.clear();
  auto line = [](LogLevel level, const std::string &text) { lines.push_back(std::to_string(int(level)) + text); };
  auto host = []() { return to_host; };
  std::mt19937 rng(std::random_device{}());
  const std::string text = "line " + std::to_string(rng());
  SetLogForward(line, host);
  LogWarn("%s", text.c_str());
  to_host = true;
  const bool forwarded_host = LogToHost();
  SetLogForward(nullptr, nullptr);
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == std::to_string(MOE_LOG_WARN) + text);
  CHECK(forwarded_host);
  CHECK(!LogToHost());
}

#ifdef STRATA_CUDA_PLUGIN_PATH
TEST_CASE("plugin: the real plugin refuses other versions and reads the library's knobs", "[plugin]") {
  absl::StatusOr<const backends::CudaPluginTable *> t = backends::OpenCudaPlugin({STRATA_CUDA_PLUGIN_PATH}, "");
  INFO((t.ok() ? std::string("opened") : Message(t.status())));
  REQUIRE(t.ok());
  CHECK((*t)->abi_version == backends::kCudaPluginAbi);
  CHECK((*t)->library_version == MOE_VERSION_NUMBER);
  // Here a device or the reason there is none.
  const absl::Status available = (*t)->available();
  if (!available.ok()) {
    CHECK(StatusToMoe(available) == MOE_ERR_UNSUPPORTED_BACKEND);
    CHECK(Message(available).find("no CUDA device") != std::string::npos);
  }

  // The entry itself, asked by a library of another version or ABI, or with other layouts.
  void *h = dlopen(STRATA_CUDA_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(h != nullptr);
  auto entry = reinterpret_cast<strata_cuda_plugin_open_fn>(dlsym(h, backends::kCudaPluginEntry));
  REQUIRE(entry != nullptr);
  backends::CudaPluginHost host;
  char why[512];
  const void *table = nullptr;
  const std::string same = "Strata " + std::to_string(MOE_VERSION_MAJOR) + "." + std::to_string(MOE_VERSION_MINOR) +
                           "." + std::to_string(MOE_VERSION_PATCH);
  std::memset(why, 'x', sizeof why);
  CHECK(entry(backends::kCudaPluginAbi, MOE_VERSION_NUMBER + 1, &host, &table, why, sizeof why) == 1);
  CHECK(table == nullptr);
  CHECK(std::string(why).find("the CUDA plugin is built for " + same + " (plugin ABI " +
                              std::to_string(backends::kCudaPluginAbi) + "), the library loading it is Strata") == 0);
  CHECK(entry(backends::kCudaPluginAbi + 1, MOE_VERSION_NUMBER, nullptr, &table, why, sizeof why) == 1);
  CHECK(std::string(why).find("(plugin ABI " + std::to_string(backends::kCudaPluginAbi + 1) + ")") !=
        std::string::npos);
  host.sizeof_request += 8;
  CHECK(entry(backends::kCudaPluginAbi, MOE_VERSION_NUMBER, &host, &table, why, sizeof why) == 1);
  CHECK(std::string(why).find("compiled from different headers") != std::string::npos);
  CHECK(table == nullptr);
  char tiny[8];
  CHECK(entry(backends::kCudaPluginAbi + 1, MOE_VERSION_NUMBER, &host, &table, tiny, sizeof tiny) == 1);
  CHECK(std::string(tiny) == "the CUD");  // cut to the room given, NUL-terminated

  // The knobs the plugin reads are the library's (here, this test's ScopedValues): with CUDA over a
  // streaming context turned off, a request of streamed experts is refused by the plugin before it
  // touches a device.
  tunables::Values v = tunables::Get();
  v.cuda_streaming = false;
  tunables::ScopedValues scoped(v);
  model::BackendRequest req;
  req.ram_expert_slots = 3;
  req.n_routed_experts = 8;
  const absl::Status refused = (*t)->create(req).status();
  CHECK(StatusToMoe(refused) == MOE_ERR_UNSUPPORTED_BACKEND);
  CHECK(Message(refused) == "the CUDA backend needs every expert resident: 3 of 8 fit the RAM budget");
}
#endif
