// The backend registry as the library sees it: which backends may be asked for, which can run here,
// which one MOE_BACKEND_AUTO picks, and making one from a neutral BackendRequest. Defined in
// backends/registry.cc, the only source that knows the backends (and how this build reaches the
// CUDA backend: its plugin libstrata-cuda.so, opened on first use, or linked in), so nothing under
// lib/ includes a backend header.
#pragma once

#include <memory>

#include "include/strata/moe.h"
#include "lib/model/backend.h"
#include "lib/model/backend_request.h"
#include "lib/util/status.h"

namespace strata::backends {

// OK when a context may ask for `kind`: MOE_BACKEND_AUTO or a backend this build has (built into
// the library, or made as its plugin; whether the plugin loads is Available's question).
// Errors: MOE_ERR_UNSUPPORTED_BACKEND ("the CUDA backend is not available in this build"),
// MOE_ERR_INVALID_ARGUMENT for an unknown kind.
absl::Status CheckBuiltIn(int kind);

// OK when `kind` can run on this machine (MOE_BACKEND_AUTO always can: the CPU is its last resort).
// For CUDA the first call opens the plugin. Errors: as CheckBuiltIn, and MOE_ERR_UNSUPPORTED_BACKEND
// saying why a built-in one cannot run: its plugin not found (the places tried), not loaded
// (dlopen's error, or the plugin refusing a library of another build), or no device.
absl::Status Available(int kind);

// The backend a context runs: `requested` itself, or for MOE_BACKEND_AUTO the first backend, in
// the registry's order of preference, that is built in and can run here: CUDA when its plugin
// loads and a device is present (with experts streaming, its VRAM tier stacks over the RAM tier),
// else the CPU. `requested` has passed CheckBuiltIn.
moe_backend_kind Resolve(int requested, bool streaming);

// How messages name `kind` ("CPU", "CUDA"); "unknown" for anything else.
const char *Name(moe_backend_kind kind);

// The host NUMA node `kind`'s memory traffic is closest to (the GPU's), -1 when none matters.
int PreferredNumaNode(moe_backend_kind kind);

// Whether `kind` keeps experts in device memory of its own (the plan's VRAM fields describe it).
bool HasDeviceMemory(moe_backend_kind kind);

// Bytes of `kind`'s device memory free now; 0 for a backend without one, or when it cannot tell.
uint64_t DeviceFreeBytes(moe_backend_kind kind);

// Whether `kind` computes every routed expert of `w` where a RAM tier's slot holds it (a device
// backend reading host memory over its link), so the tiers of lib/store can serve it.
bool ReadsExpertsInPlace(moe_backend_kind kind, const model::ModelWeights &w);

// Makes a `kind` backend (Resolve's answer) for `req`. Errors: the backend's own, and
// MOE_ERR_UNSUPPORTED_BACKEND when `req` asks what it cannot do (the CUDA backend over streamed
// experts with STRATA_CUDA_STREAMING=0: "the CUDA backend needs every expert resident: ...").
absl::StatusOr<std::unique_ptr<model::Backend>> Create(moe_backend_kind kind, const model::BackendRequest &req);

}  // namespace strata::backends
