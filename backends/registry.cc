// The backend registry: the CPU, always built in, and CUDA, built in when the toolkit was found
// (STRATA_HAVE_CUDA, defined for this file alone). Each backend's policy at creation (its NUMA
// node, its share of the cores, whether it takes streamed experts) lives in its entry.
#include "backends/registry.h"

#include <algorithm>
#include <thread>

#include "backends/cpu/cpu_backend.h"
#include "lib/util/tunables.h"
#ifdef STRATA_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#endif

namespace strata::backends {
namespace {

int NoNumaNode() { return -1; }

// ---- CPU ----

absl::Status CpuAvailable() { return absl::OkStatus(); }

absl::StatusOr<std::unique_ptr<model::Backend>> CreateCpu(const model::BackendRequest &req) {
  auto be = std::make_unique<cpu::CpuBackend>(
      req.n_threads, req.cpu_q8_activations ? cpu::MatMulMode::kQ8Activations : cpu::MatMulMode::kExact);
  STRATA_RETURN_IF_ERROR(Annotate(be->pool().status(), "the CPU backend"));
  return std::unique_ptr<model::Backend>(std::move(be));
}

// ---- CUDA ----

#ifdef STRATA_HAVE_CUDA
constexpr bool kCudaBuiltIn = true;

absl::Status CudaAvailable() {
  if (cuda::DeviceCount() > 0) return absl::OkStatus();
  return Errorf(MOE_ERR_UNSUPPORTED_BACKEND,
                "the CUDA backend is built in but finds no CUDA device (no driver, no device, or the driver failed)");
}

// On a host of several NUMA nodes, the weights (which the GPU copies and reads in place over PCIe)
// and the backend's pinned buffers are first touched on the GPU's node.
int CudaNumaNode() { return cuda::DeviceNumaNode(); }

uint64_t CudaFreeBytes() { return cuda::DeviceFreeBytes(); }

bool CudaReadsInPlace(const model::ModelWeights &w) { return cuda::CudaBackend::ReadsExpertsInPlace(w); }

absl::StatusOr<std::unique_ptr<model::Backend>> CreateCuda(const model::BackendRequest &req) {
  // With streaming, the backend reads each expert where the RAM cache's slot holds it
  // (MapHostMemory), and a VRAM tier of its device slots stacks over the RAM tier (the context
  // makes it). STRATA_CUDA_STREAMING=0 refuses a CUDA backend over a streaming context.
  const bool cuda_streaming = req.streaming() && req.device_streaming.value_or(tunables::Get().cuda_streaming);
  if (req.streaming() && !cuda_streaming) {
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND,
                  "the CUDA backend needs every expert resident: %d of %d fit the RAM budget", req.ram_expert_slots,
                  req.n_routed_experts);
  }
  cuda::CpuExpertOptions cpu_experts;
  cpu_experts.mode = req.cpu_experts == MOE_CPU_EXPERTS_OFF      ? cuda::CpuExpertMode::kOff
                     : req.cpu_experts == MOE_CPU_EXPERTS_ALWAYS ? cuda::CpuExpertMode::kAlways
                                                                 : cuda::CpuExpertMode::kAuto;
  // Two cores stay with the threads that drive the GPU (the step loop, the copier).
  const int cores = req.n_threads > 0 ? req.n_threads : static_cast<int>(std::thread::hardware_concurrency());
  cpu_experts.n_threads = std::max(1, cores - 2);
  cpu_experts.q8_activations = req.cpu_q8_activations;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaBackend> be,
                          cuda::CudaBackend::Create(*req.weights, req.arena, req.arena_bytes, req.expert_vram_bytes,
                                                    req.n_min_slots, cpu_experts, req.gpu_q8_activations, req.hot,
                                                    req.hot_max, cuda::BackendChoices{req.graphs, req.cold_copies}));
  return std::unique_ptr<model::Backend>(std::move(be));
}
#else
constexpr bool kCudaBuiltIn = false;

absl::Status CudaAvailable() {
  return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "the CUDA backend is not available in this build");
}

int CudaNumaNode() { return -1; }

uint64_t CudaFreeBytes() { return 0; }

bool CudaReadsInPlace(const model::ModelWeights &) { return false; }

absl::StatusOr<std::unique_ptr<model::Backend>> CreateCuda(const model::BackendRequest &) { return CudaAvailable(); }
#endif

// AUTO's order of preference: the GPU first, the CPU as the last resort.
const BackendEntry kEntries[] = {
    {MOE_BACKEND_CUDA, "CUDA", kCudaBuiltIn, /*auto_when_streaming=*/true, /*device_memory=*/true, CudaAvailable,
     CudaNumaNode, CreateCuda, CudaFreeBytes, CudaReadsInPlace},
    {MOE_BACKEND_CPU, "CPU", true, /*auto_when_streaming=*/true, /*device_memory=*/false, CpuAvailable, NoNumaNode,
     CreateCpu, nullptr, nullptr},
};

}  // namespace

const BackendEntry *Entries(size_t *n) {
  *n = sizeof kEntries / sizeof kEntries[0];
  return kEntries;
}

const BackendEntry *Find(int kind) {
  for (const BackendEntry &e : kEntries) {
    if (e.kind == kind) return &e;
  }
  return nullptr;
}

absl::Status CheckBuiltIn(int kind) {
  if (kind == MOE_BACKEND_AUTO) return absl::OkStatus();
  const BackendEntry *e = Find(kind);
  if (e == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "unknown backend %d", kind);
  if (!e->built_in) return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "the %s backend is not available in this build", e->name);
  return absl::OkStatus();
}

absl::Status Available(int kind) {
  STRATA_RETURN_IF_ERROR(CheckBuiltIn(kind));
  if (kind == MOE_BACKEND_AUTO) return absl::OkStatus();
  return Find(kind)->available();
}

moe_backend_kind Resolve(int requested, bool streaming) {
  if (requested != MOE_BACKEND_AUTO) return static_cast<moe_backend_kind>(requested);
  for (const BackendEntry &e : kEntries) {
    if (e.built_in && e.available().ok() && (!streaming || e.auto_when_streaming)) return e.kind;
  }
  return MOE_BACKEND_CPU;
}

const char *Name(moe_backend_kind kind) {
  const BackendEntry *e = Find(kind);
  return e != nullptr ? e->name : "unknown";
}

int PreferredNumaNode(moe_backend_kind kind) {
  const BackendEntry *e = Find(kind);
  return e != nullptr && e->built_in ? e->numa_node() : -1;
}

uint64_t DeviceFreeBytes(moe_backend_kind kind) {
  const BackendEntry *e = Find(kind);
  return e != nullptr && e->built_in && e->free_bytes != nullptr ? e->free_bytes() : 0;
}

bool HasDeviceMemory(moe_backend_kind kind) {
  const BackendEntry *e = Find(kind);
  return e != nullptr && e->built_in && e->device_memory;
}

bool ReadsExpertsInPlace(moe_backend_kind kind, const model::ModelWeights &w) {
  const BackendEntry *e = Find(kind);
  return e != nullptr && e->built_in && (e->reads_in_place == nullptr || e->reads_in_place(w));
}

absl::StatusOr<std::unique_ptr<model::Backend>> Create(moe_backend_kind kind, const model::BackendRequest &req) {
  STRATA_RETURN_IF_ERROR(CheckBuiltIn(kind));
  if (kind == MOE_BACKEND_AUTO) return Errorf(MOE_ERR_INTERNAL, "Create needs a backend Resolve chose, not AUTO");
  return Find(kind)->create(req);
}

}  // namespace strata::backends
