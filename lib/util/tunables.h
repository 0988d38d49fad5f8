// The typed table of Strata's tuning knobs: one row per knob (its environment spelling, type,
// default, doc). The environment is read once, on first use, into an immutable snapshot; a value
// that does not parse as the knob's type is reported once on stderr and the default is used.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace strata::tunables {

// X(type, field, "ENV_NAME", default, "doc"): the one list of knobs. The Values struct, the table
// and the parser are generated from it, so they cannot disagree. Behaviour a user chooses is a
// moe_params field and a CLI flag as well (graphs, cold copies, huge pages, streaming); there the
// knob is the default an explicit field overrides. The rest are measuring and debugging knobs.
#define STRATA_TUNABLES(X)                                                                                          \
  /* Host memory and threads. */                                                                                    \
  X(bool, huge_pages, "STRATA_HUGEPAGES", true,                                                                     \
    "large host buffers (weights, expert cache) advised into transparent huge pages (moe_params.huge_pages)")      \
  X(int64_t, pool_chunks, "STRATA_POOL_CHUNKS", 0,                                                                  \
    "chunks a thread-pool call takes per thread, at most 64; 0 = the built-in count")                               \
  X(std::string, cpu_isa, "STRATA_CPU_ISA", "",                                                                     \
    "caps the CPU kernels' instruction set: scalar or avx2; empty = the best the CPU has")                          \
  /* CUDA backend: where its plugin is. */                                                                           \
  X(std::string, cuda_plugin, "STRATA_CUDA_PLUGIN", "",                                                             \
    "the CUDA backend's plugin (libstrata-cuda.so) as a file path, then the only place looked at; empty = beside "  \
    "the library, beside the executable, then the dynamic loader's search")                                         \
  /* CUDA backend: choices a user makes (moe_params fields and CLI flags override these). */                        \
  X(bool, cuda_graphs, "STRATA_CUDA_GRAPHS", true,                                                                  \
    "decode steps recorded as CUDA graphs and replayed (moe_params.cuda_graphs)")                                   \
  X(int64_t, cuda_cold_copies, "STRATA_CUDA_COLD_COPIES", -1,                                                       \
    "slots a set for cold experts the copy engines move into VRAM; 0 = off, -1 = sized from the budget "            \
    "(moe_params.cuda_cold_copies)")                                                                                \
  X(bool, cuda_streaming, "STRATA_CUDA_STREAMING", true,                                                            \
    "the CUDA backend runs over a streaming context (moe_params.cuda_streaming)")                                   \
  X(int64_t, vram_replan_moves, "STRATA_VRAM_REPLAN_MOVES", 64,                                                    \
    "experts the VRAM tier starts moving when a prompt ends and at each decode step until its re-plan is done")     \
  X(int64_t, vram_pass_moves, "STRATA_VRAM_PASS_MOVES", 32,                                                        \
    "experts a prompt's layer-major pass moves into VRAM per layer, in place of staging them")                     \
  X(int64_t, vram_max_moves, "STRATA_VRAM_MAX_MOVES", 256,                                                         \
    "the VRAM tier's moves in flight at once (their copies overlap the steps)")                                     \
  X(int64_t, vram_spare_ram_slots, "STRATA_VRAM_SPARE_RAM_SLOTS", 256,                                             \
    "RAM slots beyond the experts VRAM does not hold, where the RAM budget has them: the VRAM tier's victims' "      \
    "landing places while moves are in flight")                                                                     \
  /* CUDA backend: the decode step's paths. */                                                                      \
  X(bool, cuda_pdl, "STRATA_CUDA_PDL", true, "programmatic dependent launch on devices of compute capability 9+")   \
  X(bool, cuda_prompt_stage, "STRATA_CUDA_PROMPT_STAGE", true,                                                      \
    "a prompt's experts from RAM copied into VRAM staging slots rather than read over the link")                    \
  X(bool, cold_copies_batch, "STRATA_COLD_COPIES_BATCH", true, "a request's copies issued as one batch")            \
  X(bool, cold_copies_coalesce, "STRATA_COLD_COPIES_COALESCE", true, "adjacent experts' copies merged into one")    \
  X(std::string, cold_copies_number, "STRATA_COLD_COPIES_NUMBER", "write",                                          \
    "how a request's completion number reaches the device: write (by the stream) or copy")                          \
  X(int64_t, cuda_cold_wait_ms, "STRATA_CUDA_COLD_WAIT_MS", 0,                                                      \
    "how long the device waits for the copy engines before it gives up; 0 = the built-in limit")                    \
  X(double, cuda_copies_min_cold, "STRATA_CUDA_COPIES_MIN_COLD", 1.0,                                               \
    "cold experts a call from which a layer takes the copy engines")                                                \
  X(bool, cuda_copies_beside_cpu, "STRATA_CUDA_COPIES_BESIDE_CPU", true,                                            \
    "the copy engines take the cold experts the CPU's share leaves")                                                \
  X(int64_t, cuda_predict_hybrid, "STRATA_CUDA_PREDICT_HYBRID", 2,                                                  \
    "predicted experts copied ahead for a layer on the hybrid path")                                                \
  X(bool, cuda_predict_beside, "STRATA_CUDA_PREDICT_BESIDE", true, "the next layer's prediction on its own stream") \
  X(bool, cuda_regime_probe, "STRATA_CUDA_REGIME_PROBE", true,                                                      \
    "auto CPU experts time the CPU's share against the copy engines; off = the cost model alone")                   \
  X(bool, cuda_share_held, "STRATA_CUDA_SHARE_HELD", true,                                                          \
    "entering the CPU's share waits until its saving pays for a recording")                                         \
  X(int64_t, cuda_paths_alternate, "STRATA_CUDA_PATHS_ALTERNATE", 0,                                                \
    "alternate the decode paths every N steps (for measuring); 0 = off")                                            \
  X(int64_t, cpu_experts_wait_ms, "STRATA_CPU_EXPERTS_WAIT_MS", 0,                                                  \
    "how long the device waits for the CPU's experts before it gives up; 0 = the built-in limit")                   \
  X(double, cpu_experts_link_us, "STRATA_CPU_EXPERTS_LINK_US", -1.0,                                                \
    "the link's fixed cost a layer in microseconds, in the CPU-share cost model; < 0 = measured at open")           \
  /* CUDA backend: kernels. */                                                                                      \
  X(int64_t, cuda_fused_route, "STRATA_CUDA_FUSED_ROUTE", 8,                                                        \
    "tokens up to which routing, grouping and quantizing run in one launch; 0 = never")                             \
  X(bool, cuda_group_grid, "STRATA_CUDA_GROUP_GRID", true,                                                          \
    "grouped kernels' grid sized by the expected groups; off = the largest possible grid")                          \
  X(int64_t, cuda_group_chunk, "STRATA_CUDA_GROUP_CHUNK", 8, "grouped kernels' largest token chunk: 1, 2, 4 or 8")  \
  X(int64_t, cuda_gemv_split, "STRATA_CUDA_GEMV_SPLIT", 0, "most warps a GEMV row is split over; 0 = built-in")     \
  X(int64_t, cuda_q8_tensor, "STRATA_CUDA_Q8_TENSOR", -1,                                                           \
    "8-bit-activation products: 1 = tensor cores, 0 = GEMVs, -1 = by codec (Q4_K tensor cores, Q8_0 GEMVs)")        \
  X(bool, cuda_flash_attention, "STRATA_CUDA_FLASH_ATTENTION", true,                                                \
    "prompts' attention in the flash kernel (head_dim 64 / 128); off = the per-(token, head) kernels")              \
  X(bool, cuda_flash_decode, "STRATA_CUDA_FLASH_DECODE", true,                                                      \
    "decode attention of GQA heads of 128 in the staged kernel; off = the split kernel")                            \
  X(bool, cuda_flash_f16, "STRATA_CUDA_FLASH_F16", true,                                                            \
    "prompts over f16 K and V on f16 tensor cores; off = the 3xTF32 flash kernel over their values")                \
  /* Tracing and profiling. */                                                                                      \
  X(bool, cuda_profile, "STRATA_CUDA_PROFILE", false, "the CUDA backend's per-operation timings on stderr")         \
  X(bool, cuda_stamps, "STRATA_CUDA_STAMPS", false, "device timestamps at the decode step's marks")                 \
  X(bool, cuda_host_trace, "STRATA_CUDA_HOST_TRACE", false, "the host's time between decode steps on stderr")       \
  X(bool, cuda_graph_trace, "STRATA_CUDA_GRAPH_TRACE", false, "graph recordings and replays on stderr")             \
  X(bool, cuda_prompt_trace, "STRATA_CUDA_PROMPT_TRACE", false, "where a prompt's layers spend their time")         \
  X(int64_t, cuda_profiler_step, "STRATA_CUDA_PROFILER_STEP", -1,                                                   \
    "the decode step the CUDA profiler's capture starts at; -1 = none")                                             \
  X(bool, cold_copies_trace, "STRATA_COLD_COPIES_TRACE", false, "the copy engines' requests and timings on stderr") \
  X(bool, cpu_experts_trace, "STRATA_CPU_EXPERTS_TRACE", false, "the CPU experts' calls and timings on stderr")     \
  /* The CLI. */                                                                                                    \
  X(std::string, demo_model, "STRATA_DEMO_MODEL", "", "the model `strata run` opens without --model; empty = built-in")

enum class Type { kBool, kInt, kDouble, kString };
const char *TypeName(Type t);

// Every knob's value. Read through Get(): a plain struct, no look-up on any path.
struct Values {
#define STRATA_TUNABLE_FIELD(type, field, name, def, doc) type field = def;
  STRATA_TUNABLES(STRATA_TUNABLE_FIELD)
#undef STRATA_TUNABLE_FIELD
};

// One row of the table. `format` prints the knob's value in a Values.
struct Row {
  const char *name;
  Type type;
  const char *doc;
  std::string (*format)(const Values &);
};

// The table, in the order of STRATA_TUNABLES.
const std::vector<Row> &Table();

// Values from `lookup` (nullptr or "" = unset: the default). A value that does not parse as its
// knob's type keeps the default and adds a line naming the knob and the value to `complaints`.
using Lookup = std::function<const char *(const char *name)>;
Values Read(const Lookup &lookup, std::vector<std::string> *complaints);

// The process's values: the environment, read once on the first call (thread-safe); complaints go
// to stderr then. While a ScopedValues lives, its values instead.
const Values &Get();

// In a plugin (a backend's shared object, backends/cuda_plugin.h), which holds its own copy of this
// file: Get() answers what the library's Get answers, so the plugin sees the knobs as the library
// read them (and a test's ScopedValues). Set once, when the plugin is opened.
void ReadFrom(const Values &(*library_get)());

// For tests: Get() answers `v` until this is destroyed (the one before comes back). Set it while
// nothing else reads the knobs; objects read most knobs once, when they are created.
class ScopedValues {
 public:
  explicit ScopedValues(const Values &v);
  ~ScopedValues();
  ScopedValues(const ScopedValues &) = delete;
  ScopedValues &operator=(const ScopedValues &) = delete;

 private:
  Values values_;
  const Values *before_;
};

}  // namespace strata::tunables
