// The backend registry: the CPU, always built in, and CUDA, whose code is a plugin
// (libstrata-cuda.so, backends/cuda_plugin.h) loaded the first time the CUDA backend is asked for
// or its availability queried (STRATA_CUDA_PLUGIN, defined for this file alone in a build that
// makes the plugin), or linked into the same image (STRATA_CUDA_LINKED: strata_core_cuda, for the
// tests that reach the backend's internals). Either way the CUDA entry calls the plugin's table.
// Each backend's policy at creation (its NUMA node, its share of the cores, whether it takes
// streamed experts) lives in its entry: the CPU's here, CUDA's in its plugin entry.
#include "backends/registry.h"

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda_plugin.h"
#include "backends/plugin_loader.h"
#include "lib/util/tunables.h"

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

#if defined(STRATA_CUDA_PLUGIN) || defined(STRATA_CUDA_LINKED)
constexpr bool kCudaBuiltIn = true;
#else
constexpr bool kCudaBuiltIn = false;
#endif

// The CUDA plugin's table once opened, else why it is not there.
struct CudaPlugin {
  const CudaPluginTable *table = nullptr;
  absl::Status why;
};

constexpr char kCudaWhat[] = "the CUDA backend's plugin";

// Asks the entry for its table, handing it the library's log sink and knobs (unless `linked`: the
// same image has nothing to forward), and checks what comes back.
absl::Status OpenTable(strata_cuda_plugin_open_fn entry, const std::string &path, bool linked,
                       const CudaPluginTable **out) {
  CudaPluginHost host;
  if (!linked) {
    host.log_line = &LogLine;
    host.log_to_host = &LogToHost;
    host.tunables = &tunables::Get;
  }
  char why[512] = "";
  const void *table = nullptr;
  if (entry(kCudaPluginAbi, MOE_VERSION_NUMBER, &host, &table, why, sizeof why) != 0 || table == nullptr) {
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s %s refused to load: %s", kCudaWhat, path,
                  why[0] != '\0' ? why : "it gave no reason");
  }
  // A plugin that did not check the versions itself is held to them here, before any call.
  const auto *t = static_cast<const CudaPluginTable *>(table);
  if (t->struct_size != sizeof(CudaPluginTable) || t->abi_version != kCudaPluginAbi ||
      t->library_version != MOE_VERSION_NUMBER) {
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND,
                  "%s %s is of another build: its table is plugin ABI %u of Strata version number %u (%u bytes), "
                  "this library needs ABI %u of %u (%u bytes)",
                  kCudaWhat, path, t->abi_version, t->library_version, t->struct_size, kCudaPluginAbi,
                  MOE_VERSION_NUMBER, sizeof(CudaPluginTable));
  }
  *out = t;
  return absl::OkStatus();
}

CudaPlugin OpenCuda() {
  CudaPlugin p;
#if defined(STRATA_CUDA_LINKED)
  p.why = OpenTable(&strata_cuda_plugin_open, "linked in", /*linked=*/true, &p.table);
#elif defined(STRATA_CUDA_PLUGIN)
  // An explicit path is the only place looked at: a host that names its plugin gets that one or
  // the reason it did not load, never another found elsewhere.
  const std::string &chosen = tunables::Get().cuda_plugin;
  absl::StatusOr<const CudaPluginTable *> t =
      chosen.empty() ? OpenCudaPlugin(PluginSearchPath(kCudaPluginFile), "; STRATA_CUDA_PLUGIN may name its path")
                     : OpenCudaPlugin({chosen}, " (the path STRATA_CUDA_PLUGIN names)");
  p.why = t.status();
  if (t.ok()) p.table = *t;
#else
  p.why = Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "the CUDA backend is not available in this build");
#endif
  if (!p.why.ok()) p.table = nullptr;
  return p;
}

// Opened once, on first use; never closed (a backend from it may live until the process ends).
const CudaPlugin &Cuda() {
  static const CudaPlugin *p = new CudaPlugin(OpenCuda());
  return *p;
}

absl::Status CudaAvailable() {
  const CudaPlugin &c = Cuda();
  return c.table != nullptr ? c.table->available() : c.why;
}

int CudaNumaNode() { return Cuda().table != nullptr ? Cuda().table->numa_node() : -1; }

uint64_t CudaFreeBytes() { return Cuda().table != nullptr ? Cuda().table->free_bytes() : 0; }

bool CudaReadsInPlace(const model::ModelWeights &w) {
  return Cuda().table != nullptr && Cuda().table->reads_in_place(w);
}

absl::StatusOr<std::unique_ptr<model::Backend>> CreateCuda(const model::BackendRequest &req) {
  const CudaPlugin &c = Cuda();
  if (c.table == nullptr) return c.why;
  return c.table->create(req);
}

// AUTO's order of preference: the GPU first, the CPU as the last resort.
const BackendEntry kEntries[] = {
    {MOE_BACKEND_CUDA, "CUDA", kCudaBuiltIn, /*auto_when_streaming=*/true, /*device_memory=*/true, CudaAvailable,
     CudaNumaNode, CreateCuda, CudaFreeBytes, CudaReadsInPlace},
    {MOE_BACKEND_CPU, "CPU", true, /*auto_when_streaming=*/true, /*device_memory=*/false, CpuAvailable, NoNumaNode,
     CreateCpu, nullptr, nullptr},
};

}  // namespace

absl::StatusOr<const CudaPluginTable *> OpenCudaPlugin(const std::vector<std::string> &places,
                                                       const std::string &hint) {
  STRATA_ASSIGN_OR_RETURN(OpenedPlugin opened, OpenPlugin(places, kCudaWhat, hint));
  STRATA_ASSIGN_OR_RETURN(void *entry, PluginSymbol(opened, kCudaPluginEntry, kCudaWhat));
  const CudaPluginTable *t = nullptr;
  STRATA_RETURN_IF_ERROR(
      OpenTable(reinterpret_cast<strata_cuda_plugin_open_fn>(entry), opened.path, /*linked=*/false, &t));
  return t;
}

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
