// The CUDA backend as a plugin (libstrata-cuda.so): its one exported entry, and the two tables that
// cross between the library and it. The entry's C signature never changes, so a library can ask
// any plugin which build it belongs to before it reads anything else: the plugin serves only the
// Strata build it was made with (same plugin ABI, same library version, same layouts), because the
// library and the plugin talk through C++ interfaces (model::Backend, store::DeviceSlots,
// model::BackendRequest) compiled into both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "include/strata/moe.h"
#include "lib/model/backend.h"
#include "lib/model/backend_request.h"
#include "lib/util/log.h"
#include "lib/util/status.h"
#include "lib/util/tunables.h"

namespace strata::backends {

// Bumped whenever what crosses changes shape or meaning: the two structs below, model::Backend,
// store::DeviceSlots, model::BackendRequest, the weights' structs. The library version is compared
// too, so a plugin of another release is refused even when this number did not move.
inline constexpr uint32_t kCudaPluginAbi = 1;

// The plugin's file, beside the library in the lib directory, and its one exported symbol.
inline constexpr char kCudaPluginFile[] = "libstrata-cuda.so";
inline constexpr char kCudaPluginEntry[] = "strata_cuda_plugin_open";

// What the library hands the plugin: the process-wide state that must stay one (the log sink that
// moe_log_set chooses, the tuning knobs as the library read them), and the sizes of what crosses,
// as a check that both were compiled from the same headers. A null function means the plugin's
// code is linked into the library's own image: there is nothing to forward.
struct CudaPluginHost {
  uint32_t struct_size = sizeof(CudaPluginHost);
  uint32_t sizeof_request = sizeof(model::BackendRequest);
  uint32_t sizeof_weights = sizeof(model::ModelWeights);
  uint32_t sizeof_layer = sizeof(model::LayerWeights);
  uint32_t sizeof_tunables = sizeof(tunables::Values);
  void (*log_line)(LogLevel level, const std::string &line) = nullptr;
  bool (*log_to_host)() = nullptr;
  const tunables::Values &(*tunables)() = nullptr;
};

// What the plugin hands back: the CUDA backend's entry points, as the registry's table calls them
// (backends/registry.h). The first three fields are read before anything else.
struct CudaPluginTable {
  uint32_t struct_size;
  uint32_t abi_version;      // kCudaPluginAbi as the plugin was built
  uint32_t library_version;  // MOE_VERSION_NUMBER as the plugin was built
  // OK when a device is present, else MOE_ERR_UNSUPPORTED_BACKEND saying why.
  absl::Status (*available)();
  // The host NUMA node the device hangs off, -1 when unknown.
  int (*numa_node)();
  // Bytes of the device's memory free now; 0 when it cannot tell.
  uint64_t (*free_bytes)();
  // Whether the backend computes every routed expert of the weights where a RAM slot holds it.
  bool (*reads_in_place)(const model::ModelWeights &w);
  absl::StatusOr<std::unique_ptr<model::Backend>> (*create)(const model::BackendRequest &req);
};

}  // namespace strata::backends

extern "C" {
// The plugin's entry (kCudaPluginEntry). The library passes its kCudaPluginAbi, its
// MOE_VERSION_NUMBER and a CudaPluginHost; on a mismatch of any of them the plugin writes why into
// `why` (NUL-terminated, at most why_size bytes) and returns nonzero, else it sets *table to its
// CudaPluginTable (static storage) and returns 0. Called once per process, before any other call.
typedef int32_t (*strata_cuda_plugin_open_fn)(uint32_t abi_version, uint32_t library_version, const void *host,
                                              const void **table, char *why, size_t why_size);
// Defined in backends/cuda/plugin_entry.cc: the plugin's export, and what a registry linked with
// the backend in the same image (STRATA_CUDA_LINKED) calls directly.
__attribute__((visibility("default"))) int32_t strata_cuda_plugin_open(uint32_t abi_version,
                                                                      uint32_t library_version, const void *host,
                                                                      const void **table, char *why,
                                                                      size_t why_size);
}
