// The CUDA backend's plugin entry (backends/cuda_plugin.h): the one symbol libstrata-cuda.so
// exports, and the backend's policy at creation (its share of the cores, whether it takes streamed
// experts), which the registry reaches through the table. The same object is linked into
// strata_core_cuda, where the registry calls the entry directly (and nothing is forwarded).
#include <algorithm>
#include <cstdio>
#include <thread>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#include "backends/cuda_plugin.h"
#include "lib/util/tunables.h"

namespace strata::cuda {
namespace {

absl::Status Available() {
  if (DeviceCount() > 0) return absl::OkStatus();
  return Errorf(MOE_ERR_UNSUPPORTED_BACKEND,
                "the CUDA backend finds no CUDA device (no driver, no device, or the driver failed)");
}

// On a host of several NUMA nodes, the weights (which the GPU copies and reads in place over PCIe)
// and the backend's pinned buffers are first touched on the GPU's node.
int NumaNode() { return DeviceNumaNode(); }

uint64_t FreeBytes() { return DeviceFreeBytes(); }

bool ReadsInPlace(const model::ModelWeights &w) { return CudaBackend::ReadsExpertsInPlace(w); }

absl::StatusOr<std::unique_ptr<model::Backend>> Create(const model::BackendRequest &req) {
  // With streaming, the backend reads each expert where the RAM cache's slot holds it
  // (MapHostMemory), and a VRAM tier of its device slots stacks over the RAM tier (the context
  // makes it). STRATA_CUDA_STREAMING=0 refuses a CUDA backend over a streaming context.
  const bool cuda_streaming = req.streaming() && req.device_streaming.value_or(tunables::Get().cuda_streaming);
  if (req.streaming() && !cuda_streaming) {
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND,
                  "the CUDA backend needs every expert resident: %d of %d fit the RAM budget", req.ram_expert_slots,
                  req.n_routed_experts);
  }
  CpuExpertOptions cpu_experts;
  cpu_experts.mode = req.cpu_experts == MOE_CPU_EXPERTS_OFF      ? CpuExpertMode::kOff
                     : req.cpu_experts == MOE_CPU_EXPERTS_ALWAYS ? CpuExpertMode::kAlways
                                                                 : CpuExpertMode::kAuto;
  // Two cores stay with the threads that drive the GPU (the step loop, the copier).
  const int cores = req.n_threads > 0 ? req.n_threads : static_cast<int>(std::thread::hardware_concurrency());
  cpu_experts.n_threads = std::max(1, cores - 2);
  cpu_experts.q8_activations = req.cpu_q8_activations;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> be,
                          CudaBackend::Create(*req.weights, req.arena, req.arena_bytes, cpu_experts,
                                              req.gpu_q8_activations, BackendChoices{req.graphs, req.cold_copies}));
  return std::unique_ptr<model::Backend>(std::move(be));
}

const backends::CudaPluginTable kTable = {
    sizeof(backends::CudaPluginTable), backends::kCudaPluginAbi, MOE_VERSION_NUMBER, Available, NumaNode, FreeBytes,
    ReadsInPlace, Create,
};

std::string VersionText(uint32_t number) {
  return std::to_string(number / 10000) + "." + std::to_string(number / 100 % 100) + "." +
         std::to_string(number % 100);
}

// Why `host` is not a library this plugin can serve; empty when it is.
std::string Mismatch(uint32_t abi_version, uint32_t library_version, const backends::CudaPluginHost *host) {
  if (abi_version != backends::kCudaPluginAbi || library_version != MOE_VERSION_NUMBER) {
    return "the CUDA plugin is built for Strata " + VersionText(MOE_VERSION_NUMBER) + " (plugin ABI " +
           std::to_string(backends::kCudaPluginAbi) + "), the library loading it is Strata " +
           VersionText(library_version) + " (plugin ABI " + std::to_string(abi_version) +
           "): install the plugin of the same build as the library";
  }
  if (host == nullptr) return "the library passed no host table";
  const backends::CudaPluginHost mine;
  if (host->struct_size != mine.struct_size || host->sizeof_request != mine.sizeof_request ||
      host->sizeof_weights != mine.sizeof_weights || host->sizeof_layer != mine.sizeof_layer ||
      host->sizeof_tunables != mine.sizeof_tunables) {
    return "the CUDA plugin and the library were compiled from different headers (the sizes of the structures "
           "they share differ): install the plugin of the same build as the library";
  }
  return "";
}

}  // namespace
}  // namespace strata::cuda

extern "C" int32_t strata_cuda_plugin_open(uint32_t abi_version, uint32_t library_version, const void *host,
                                           const void **table, char *why, size_t why_size) {
  using strata::backends::CudaPluginHost;
  // Only C types cross until the versions are known to agree: no exception leaves, nothing of the
  // host's is read before the check.
  try {
    const auto *h = static_cast<const CudaPluginHost *>(host);
    const std::string bad = strata::cuda::Mismatch(abi_version, library_version, h);
    if (!bad.empty() || table == nullptr) {
      if (why != nullptr && why_size > 0) {
        std::snprintf(why, why_size, "%s", bad.empty() ? "the library passed no table pointer" : bad.c_str());
      }
      return 1;
    }
    // The process's one log sink and one set of knobs are the library's.
    if (h->log_line != nullptr) strata::SetLogForward(h->log_line, h->log_to_host);
    if (h->tunables != nullptr) strata::tunables::ReadFrom(h->tunables);
    *table = &strata::cuda::kTable;
    return 0;
  } catch (...) {
    if (why != nullptr && why_size > 0) std::snprintf(why, why_size, "out of memory opening the CUDA plugin");
    return 1;
  }
}
