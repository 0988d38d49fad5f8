// The backend registry (lib/model/backend_registry.h, backends/registry.cc): its table, the checks
// a context's backend kind passes, AUTO's rule, and making a backend from a neutral request.
#include <catch2/catch.hpp>

#include <random>
#include <set>
#include <string>

#include "backends/registry.h"

namespace {

using namespace strata;

// strata_core opens the CUDA backend as its plugin: "built in" is this build having made one.
#ifdef STRATA_CUDA_PLUGIN_PATH
constexpr bool kCudaBuiltIn = true;
#else
constexpr bool kCudaBuiltIn = false;
#endif

int RandomUnknownKind(std::mt19937 &rng) {
  return std::bernoulli_distribution(0.5)(rng) ? std::uniform_int_distribution<int>(MOE_BACKEND_CUDA + 1, 1 << 20)(rng)
                                               : std::uniform_int_distribution<int>(-(1 << 20), -1)(rng);
}

}  // namespace

TEST_CASE("registry: one entry per backend, the CPU always built in", "[registry]") {
  size_t n = 0;
  const backends::BackendEntry *e = backends::Entries(&n);
  REQUIRE(n == 2);
  std::set<int> kinds;
  for (size_t i = 0; i < n; ++i) {
    kinds.insert(e[i].kind);
    CHECK(backends::Find(e[i].kind) == &e[i]);
    CHECK(std::string(backends::Name(e[i].kind)) == e[i].name);
  }
  CHECK(kinds == std::set<int>{MOE_BACKEND_CPU, MOE_BACKEND_CUDA});
  CHECK(backends::Find(MOE_BACKEND_AUTO) == nullptr);
  CHECK(backends::Find(MOE_BACKEND_CPU)->built_in);
  CHECK(backends::Find(MOE_BACKEND_CUDA)->built_in == kCudaBuiltIn);
  CHECK(std::string(backends::Name(MOE_BACKEND_CUDA)) == "CUDA");
  CHECK(!backends::HasDeviceMemory(MOE_BACKEND_CPU));
  CHECK(backends::HasDeviceMemory(MOE_BACKEND_CUDA) == kCudaBuiltIn);
  CHECK(backends::PreferredNumaNode(MOE_BACKEND_CPU) == -1);
}

TEST_CASE("registry: kinds a context may ask for, and why not", "[registry]") {
  std::mt19937 rng(std::random_device{}());
  CHECK(backends::CheckBuiltIn(MOE_BACKEND_AUTO).ok());
  CHECK(backends::CheckBuiltIn(MOE_BACKEND_CPU).ok());
  CHECK(backends::Available(MOE_BACKEND_AUTO).ok());
  CHECK(backends::Available(MOE_BACKEND_CPU).ok());
  for (int i = 0; i < 8; ++i) {
    const int kind = RandomUnknownKind(rng);
    for (const absl::Status &st : {backends::CheckBuiltIn(kind), backends::Available(kind)}) {
      CHECK(StatusToMoe(st) == MOE_ERR_INVALID_ARGUMENT);
      CHECK(std::string(st.message()) == "unknown backend " + std::to_string(kind));
    }
  }
  const absl::Status cuda = backends::CheckBuiltIn(MOE_BACKEND_CUDA);
  CHECK(cuda.ok() == kCudaBuiltIn);
  if (!kCudaBuiltIn) {
    CHECK(StatusToMoe(cuda) == MOE_ERR_UNSUPPORTED_BACKEND);
    CHECK(std::string(cuda.message()) == "the CUDA backend is not available in this build");
    CHECK(backends::Available(MOE_BACKEND_CUDA).message() == cuda.message());
  } else if (!backends::Available(MOE_BACKEND_CUDA).ok()) {
    CHECK(StatusToMoe(backends::Available(MOE_BACKEND_CUDA)) == MOE_ERR_UNSUPPORTED_BACKEND);
  }
}

TEST_CASE("registry: AUTO picks CUDA with a device, experts resident or streaming", "[registry]") {
  for (bool streaming : {false, true}) {
    CHECK(backends::Resolve(MOE_BACKEND_CPU, streaming) == MOE_BACKEND_CPU);
    CHECK(backends::Resolve(MOE_BACKEND_CUDA, streaming) == MOE_BACKEND_CUDA);
  }
  const bool gpu = backends::Available(MOE_BACKEND_CUDA).ok();
  if (!kCudaBuiltIn) CHECK(!gpu);  // never available when not built in
  // With experts streaming, the VRAM tier stacks over the RAM tier: the GPU still helps.
  for (bool streaming : {false, true}) {
    CHECK(backends::Resolve(MOE_BACKEND_AUTO, streaming) == (gpu ? MOE_BACKEND_CUDA : MOE_BACKEND_CPU));
  }
  // Only a device backend reports free device memory.
  CHECK(backends::DeviceFreeBytes(MOE_BACKEND_CPU) == 0);
  if (!gpu) CHECK(backends::DeviceFreeBytes(MOE_BACKEND_CUDA) == 0);
}

TEST_CASE("registry: Create makes the kind asked for, and refuses AUTO and absent backends", "[registry]") {
  model::BackendRequest req;
  req.n_threads = 1;
  auto cpu = backends::Create(MOE_BACKEND_CPU, req);
  REQUIRE(cpu.ok());
  CHECK((*cpu)->name() == "cpu");
  CHECK((*cpu)->host_view_alignment() == 1);
  // A buffer from it is host memory: zero-filled, writable.
  auto buf = (*cpu)->Allocate(64);
  REQUIRE(buf.ok());
  CHECK(static_cast<const unsigned char *>((*buf)->data())[63] == 0);

  CHECK(StatusToMoe(backends::Create(MOE_BACKEND_AUTO, req).status()) == MOE_ERR_INTERNAL);
  if (!kCudaBuiltIn) {
    const absl::Status st = backends::Create(MOE_BACKEND_CUDA, req).status();
    CHECK(StatusToMoe(st) == MOE_ERR_UNSUPPORTED_BACKEND);
    CHECK(std::string(st.message()) == "the CUDA backend is not available in this build");
  }
}
