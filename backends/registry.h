// The backend registry's table: one entry per backend Strata knows, built in or not, in AUTO's order
// of preference. The library calls it through lib/model/backend_registry.h; the entries (and
// backends/registry.cc, the only source built with STRATA_HAVE_CUDA) are the one place that names
// the backends' own types.
#pragma once

#include <cstddef>
#include <memory>

#include "lib/model/backend_registry.h"

namespace strata::backends {

// One backend as the registry knows it. The functions are never null; they are called only for a
// built-in entry, except `available`, which says why a backend that is not built in cannot run.
struct BackendEntry {
  moe_backend_kind kind;
  const char *name;  // as messages name it ("CPU", "CUDA")
  bool built_in;     // compiled into this library
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

}  // namespace strata::backends
