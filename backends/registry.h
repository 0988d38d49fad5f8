// The backend registry's table: one entry per backend Strata knows, built in or not, in AUTO's order
// of preference. The library calls it through lib/model/backend_registry.h; the entries (and
// backends/registry.cc, the only source that knows how this build reaches the CUDA backend: its
// plugin, or linked in) are the one place that names the backends.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "lib/model/backend_registry.h"

namespace strata::backends {

struct CudaPluginTable;  // backends/cuda_plugin.h

// One backend as the registry knows it. The functions are never null; they are called only for a
// built-in entry, except `available`, which says why a backend that is not built in cannot run.
struct BackendEntry {
  moe_backend_kind kind;
  const char *name;  // as messages name it ("CPU", "CUDA")
  // This build has it: compiled into the library (the CPU), or made as its plugin, which the entry's
  // functions open on first use (CUDA: libstrata-cuda.so; until it is open and finds a device,
  // `available` says why not and the others answer as for a backend that is absent: -1, 0, false).
  bool built_in;
  // MOE_BACKEND_AUTO may pick it while routed experts stream from the file through the RAM cache.
  bool auto_when_streaming;
  // It keeps experts in device memory of its own, so the plan's VRAM fields describe what it made.
  bool device_memory;
  // OK when it can run on this machine, else MOE_ERR_UNSUPPORTED_BACKEND saying why.
  absl::Status (*available)();
  // The host NUMA node its memory traffic is closest to, -1 when none matters.
  int (*numa_node)();
  absl::StatusOr<std::unique_ptr<model::Backend>> (*create)(const model::BackendRequest &req);
  // Bytes of its device memory free now (null: it has none).
  uint64_t (*free_bytes)();
  // Whether it computes every routed expert of the weights where a RAM slot holds it (null: yes).
  bool (*reads_in_place)(const model::ModelWeights &w);
};

// The table: *n entries.
const BackendEntry *Entries(size_t *n);

// The entry of `kind`; nullptr for MOE_BACKEND_AUTO and unknown kinds.
const BackendEntry *Find(int kind);

// Opens a CUDA plugin from the first of `places` that exists (backends/plugin_loader.h: `hint` ends
// the message when none does), hands it this library's log sink and knobs, and checks that it is of
// this build. The CUDA entry does this once per process, from PluginSearchPath's places or the one
// STRATA_CUDA_PLUGIN names; tests call it with places of their own. Errors,
// MOE_ERR_UNSUPPORTED_BACKEND: OpenPlugin's and PluginSymbol's, "<plugin> <path> refused to load:
// <its reason>", "<plugin> <path> is of another build: ...".
absl::StatusOr<const CudaPluginTable *> OpenCudaPlugin(const std::vector<std::string> &places,
                                                       const std::string &hint);

}  // namespace strata::backends
