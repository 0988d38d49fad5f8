// GPU acceptance: for every golden model (each family and codec the goldens cover), the CUDA
// backend's teacher-forced logits at every position, as one prefill and as a prefill followed by
// one-token decode steps, match the CPU backend's within 1e-3 normalized max error
// (max |gpu - cpu| / max |cpu|). Skips without a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cuda/memory.h"
#include "lib/model/synth.h"
#include "tests/format/format_test_util.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/model/golden_util.h"
#include "tests/util/tunables_test_util.h"

using strata::tunables::testing::SetKnob;
using strata::tunables::testing::UnsetKnob;

namespace {

using strata::testing::kGolden;
using strata::testing::NormalizedMaxError;
using strata::testing::ReadBinary;
using strata::testing::TeacherForced;

constexpr double kTolerance = 1e-3;

// GGUF goldens whose MoE layers route and group on the GPU (their tensors are 32-byte aligned, as
// the kernels' vector loads need of host bytes read in place, and their layers hold experts of one
// codec and kernel-ready shapes): their decode steps need no host round trip and are recorded as
// CUDA graphs. The others (a checkpoint's unaligned bytes, per-expert codecs, the tiny DeepSeek
// fixtures' 16-wide rows) take the host path.
const char *const kGraphModels[] = {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-q8_0.gguf",
                                    "olmoe_f32/model-f32.gguf", "qwen2moe_f32/model-f32.gguf"};

const char *const kModels[] = {
    "qwen3moe_f32/hf",           "qwen3moe_f32/model-f32.gguf",   "qwen3moe_f32/model-f16.gguf",
    "qwen3moe_f32/model-q8_0.gguf", "qwen3moe_bf16/hf",           "qwen3moe_bf16/model-bf16.gguf",
    "qwen3moe_mixed/model-mixed.gguf", "mixtral_f32/hf",          "mixtral_f32/model-f32.gguf",
    "mixtral_f32/model-q8_0.gguf", "olmoe_f32/hf",                "olmoe_f32/model-f32.gguf",
    "qwen2moe_f32/hf",           "qwen2moe_f32/model-f32.gguf",   "deepseek2_f32/hf",
    "deepseek2_f32/model-f32.gguf", "deepseek2lite_f32/hf",       "deepseek2lite_f32/model-f32.gguf",
    "deepseek3_f32/hf",          "deepseek3_f32/model-f32.gguf",  "gptoss_f32/hf",
    "gptoss_f32/model-f32.gguf", "gptoss_f32/model-mxfp4.gguf",
};

// A synthetic model with spread routing (8 layers of 16 experts), written into dir.
std::string TinySpread(strata::format::testing::TempDir &dir) {
  strata::model::SynthOptions o;
  o.shape = "tiny";
  o.layers = 8;
  o.routing = "spread";
  const std::string model = dir.File("tiny_spread.gguf");
  REQUIRE(strata::model::Synthesize(o, model).ok());
  return model;
}

// The tiny shape with concentrated routing (the synthetic default: a few experts a layer take most
// tokens), 8 layers.
std::string TinyConcentrated(strata::format::testing::TempDir &dir) {
  strata::model::SynthOptions o;
  o.shape = "tiny";
  o.layers = 8;
  const std::string model = dir.File("tiny_concentrated.gguf");
  REQUIRE(strata::model::Synthesize(o, model).ok());
  return model;
}

// Hotlists (the format `strata profile` writes) of an 8-layer model's selections of `tokens` (the
// first `prefill` a prompt), counted by the CPU backend, which sees every selection (the GPU routes
// on the device): `hot` as counted, `cold` ranked the other way round (the least used first).
void WriteHotlists(const std::string &model, const std::vector<int32_t> &tokens, size_t prefill,
                   const std::string &hot, const std::string &cold) {
  std::vector<uint64_t> counts;
  TeacherForced(model, tokens, prefill, MOE_BACKEND_CPU, 0, nullptr, nullptr, nullptr, MOE_CPU_EXPERTS_OFF, false,
                nullptr, &counts);
  REQUIRE(counts.size() % 8 == 0);
  const uint64_t top = *std::max_element(counts.begin(), counts.end());
  REQUIRE(top > 0);
  const size_t n_expert = counts.size() / 8;
  std::ofstream h(hot), c(cold);
  for (size_t i = 0; i < counts.size(); ++i) {
    h << i / n_expert << ' ' << i % n_expert << ' ' << counts[i] << '\n';
    c << i / n_expert << ' ' << i % n_expert << ' ' << top - counts[i] << '\n';
  }
}

// The smallest VRAM budget (in steps of 256 KiB) whose plan holds a third of the model's experts
// or more, with its slots and routed experts; the test fails when none up to 64 MiB does.
uint64_t ThirdInSlots(const std::string &model, uint32_t *slots, uint32_t *n_routed) {
  for (uint64_t b = uint64_t{256} << 10; b <= uint64_t{64} << 20; b += uint64_t{256} << 10) {
    moe_params p;
    moe_params_init(&p);
    p.model_path = model.c_str();
    p.backend = MOE_BACKEND_CUDA;
    p.vram_budget_bytes = b;
    moe_ctx *ctx = nullptr;
    if (moe_ctx_open(&p, &ctx) != MOE_OK) continue;  // too small for the resident weights
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_ctx_plan(ctx, &plan) == MOE_OK);
    moe_ctx_close(ctx);
    if (3 * plan.vram_expert_slots >= plan.n_routed_experts) {
      *slots = plan.vram_expert_slots;
      *n_routed = plan.n_routed_experts;
      return b;
    }
  }
  FAIL("no VRAM budget up to 64 MiB holds a third of " << model << "'s experts");
  return 0;
}

// n token ids drawn from [0, 512) with `seed`.
std::vector<int32_t> RandomTokens(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, 511);
  std::vector<int32_t> tokens(n);
  for (int32_t &t : tokens) t = id(rng);
  return tokens;
}

// Sets STRATA_CUDA_GRAPHS for the contexts opened in its lifetime (the backend reads it at creation).
class GraphsOff {
 public:
  GraphsOff() { SetKnob("STRATA_CUDA_GRAPHS", "0"); }
  ~GraphsOff() { UnsetKnob("STRATA_CUDA_GRAPHS"); }
};

}  // namespace

TEST_CASE("CUDA backend: every golden's logits match the CPU backend", "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : kModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (size_t prefill : {tokens.size(), size_t{12}, size_t{1}}) {
      const auto cpu = TeacherForced(model, tokens, prefill, MOE_BACKEND_CPU);
      const auto gpu = TeacherForced(model, tokens, prefill, MOE_BACKEND_CUDA);
      const double err = NormalizedMaxError(gpu, cpu);
      INFO(rel << " prefill " << prefill << ": normalized max error " << err);
      WARN("gpu-vs-cpu " << rel << " prefill " << prefill << " err " << err);
      CHECK(err <= kTolerance);
    }
  }
}

// The KV cache in f16 and q8_0 (keys and values alike, and mixed): the CUDA backend's rows are the
// CPU backend's bytes (kv_rows.cu encodes as EncodeKvRow), so its logits stay within the f32 test's
// tolerance of the CPU backend's with the same types, as one prefill and as one-token decode steps.
TEST_CASE("CUDA backend: every golden's logits with an f16 or q8_0 KV cache match the CPU backend",
          "[gpu][golden][kv]") {
  if (!strata::cuda::test::HaveGpu()) return;
  const std::pair<int32_t, int32_t> kTypes[] = {
      {MOE_KV_F16, MOE_KV_F16}, {MOE_KV_Q8_0, MOE_KV_Q8_0}, {MOE_KV_Q8_0, MOE_KV_F16}};
  for (const char *rel : kModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (const auto &[type_k, type_v] : kTypes) {
      for (size_t prefill : {tokens.size(), size_t{1}}) {
        const auto cpu = TeacherForced(model, tokens, prefill, MOE_BACKEND_CPU, 0, nullptr, nullptr, nullptr,
                                       MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, 0, {}, type_k, type_v);
        const auto gpu = TeacherForced(model, tokens, prefill, MOE_BACKEND_CUDA, 0, nullptr, nullptr, nullptr,
                                       MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, 0, {}, type_k, type_v);
        const double err = NormalizedMaxError(gpu, cpu);
        INFO(rel << " types " << type_k << "/" << type_v << " prefill " << prefill << ": normalized max error "
                 << err);
        CHECK(err <= kTolerance);
      }
    }
  }
}

// A VRAM budget too small for the routed experts: the tiers of lib/store serve them (VRAM's few
// slots over a RAM tier of every other expert, or a RAM tier of all of them where the budget leaves
// VRAM no slot), the GPU reading RAM's where they lie; the bytes are the same, so the logits must
// be bit-identical to the all-resident run, for every family, codec and file format.
TEST_CASE("CUDA backend: the VRAM expert tier is bit-identical to all-resident at any budget", "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : kModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (size_t prefill : {tokens.size(), size_t{1}}) {
      const auto all = TeacherForced(model, tokens, prefill, MOE_BACKEND_CUDA);
      for (uint64_t budget : {uint64_t{1}, uint64_t{1} << 20}) {
        uint32_t slots = 0, n_routed = 0;
        const auto tier = TeacherForced(model, tokens, prefill, MOE_BACKEND_CUDA, budget, &slots, &n_routed);
        INFO(rel << " prefill " << prefill << " VRAM budget " << budget << ": " << slots << " of " << n_routed
                 << " experts in slots");
        if (budget == 1) CHECK(slots < n_routed);
        CHECK(tier == all);
      }
    }
  }
}

// A RAM budget below the routed experts streams them from the file through the RAM cache; the GPU
// reads each where its cache slot holds it (page-locked, mapped), with the kernels of the resident
// run, so the logits are bit-identical to it. Every golden goes through: a checkpoint's unaligned
// tensors land aligned in their slots, and input-major experts (gpt-oss's) are read in place too.
TEST_CASE("CUDA backend: experts streamed through the RAM cache are read in place, bit-identical", "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  int streamed = 0;
  for (const char *rel : kModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    const auto all = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA);
    {
      moe_params p;
      moe_params_init(&p);
      p.model_path = model.c_str();
      p.backend = MOE_BACKEND_CUDA;
      p.ram_budget_bytes = 1;
      p.vram_budget_bytes = 1;  // below the device's fixed bytes: no VRAM tier, every read in place
      moe_ctx *ctx = nullptr;
      const moe_status st = moe_ctx_open(&p, &ctx);
      const bool graph_model = std::any_of(std::begin(kGraphModels), std::end(kGraphModels),
                                           [&](const char *g) { return std::string(rel) == g; });
      INFO(rel << ": " << moe_last_error());
      REQUIRE(st == MOE_OK);
      moe_cache_plan plan;
      moe_cache_plan_init(&plan);
      REQUIRE(moe_ctx_plan(ctx, &plan) == MOE_OK);
      moe_ctx_close(ctx);
      INFO(rel << ": " << plan.ram_expert_slots << " of " << plan.n_routed_experts << " experts in RAM");
      if (plan.ram_expert_slots >= plan.n_routed_experts) {  // one layer's experts are the whole model
        CHECK(!graph_model);
        continue;
      }
      CHECK(plan.vram_expert_slots == 0);
    }
    moe_stats stats;
    const auto got = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, /*vram_budget=*/1, nullptr, nullptr, &stats,
                                   MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, /*ram_budget=*/1);
    INFO(rel << ": " << stats.expert_misses << " misses, " << stats.bytes_read << " bytes read");
    CHECK(stats.vram_hits == 0);
    CHECK(stats.streaming == 1);
    CHECK(stats.expert_misses > 0);
    CHECK(got == all);
    ++streamed;
  }
  CHECK(streamed >= 8);
  // STRATA_CUDA_STREAMING=0: refused at open, as the backend once needed every expert resident.
  REQUIRE(SetKnob("STRATA_CUDA_STREAMING", "0") == 0);
  moe_params p;
  moe_params_init(&p);
  const std::string model = kGolden + kGraphModels[0];
  p.model_path = model.c_str();
  p.backend = MOE_BACKEND_CUDA;
  p.ram_budget_bytes = 1;
  moe_ctx *ctx = nullptr;
  CHECK(moe_ctx_open(&p, &ctx) == MOE_ERR_UNSUPPORTED_BACKEND);
  CHECK(std::string(moe_last_error()).find("needs every expert resident") != std::string::npos);
  UnsetKnob("STRATA_CUDA_STREAMING");
}

// Decode batches route and group on the GPU (no host wait per layer) for every family the grouped
// kernels cover. With a VRAM budget too small for the experts, the tiers of lib/store hold them
// (VRAM's few slots, the rest in a RAM tier of every expert, or the RAM tier alone where the budget
// leaves VRAM no slot) and the device's tables point at RAM's slots: the kernels read those experts
// over the link, or the copy engines move them into staging slots first, with the next layer's
// predicted experts copied ahead. None of it may change a bit of the logits.
TEST_CASE("CUDA backend: decode over the tiers' tables reads RAM's experts in place or copied, bit-identical",
          "[gpu][golden][tiers]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : kGraphModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    moe_stats all_st, tier_st;
    uint32_t slots = 0, n_routed = 0;
    const auto all = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, 0, nullptr, nullptr, &all_st);
    INFO(rel);
    CHECK(all_st.vram_device_layers > 0);
    CHECK(all_st.vram_expert_slots == 0);
    CHECK(all_st.streaming == 0);
    for (uint64_t budget : {uint64_t{1}, uint64_t{1} << 20}) {
      const auto tier = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, budget, &slots, &n_routed, &tier_st);
      INFO("VRAM budget " << budget << ": " << slots << " of " << n_routed << " experts in VRAM slots; RAM hits "
                          << tier_st.expert_hits << ", VRAM hits " << tier_st.vram_hits << ", replays "
                          << tier_st.gpu_graph_replays);
      REQUIRE(slots < n_routed);
      CHECK(tier_st.streaming == 1);
      CHECK(tier_st.expert_misses == 0);
      CHECK(tier_st.expert_hits > 0);
      CHECK(tier_st.vram_hits + tier_st.expert_hits == all_st.expert_hits);
      CHECK(tier_st.vram_device_layers == all_st.vram_device_layers);
      CHECK(tier_st.gpu_graph_replays > 0);
      CHECK(tier == all);
    }
    // The copy engines (1 and 16 slots a set), with the next layer's predicted experts copied ahead
    // (graphs on: predictions inside the recorded steps; off: every step eager, no copies); also one
    // copy a matrix instead of a request's copies in one batch.
    struct CopyRun { const char *n_slots, *graphs, *batch; };
    for (const CopyRun r : {CopyRun{"1", "1", "1"}, CopyRun{"1", "0", "1"}, CopyRun{"16", "1", "1"},
                            CopyRun{"16", "0", "1"}, CopyRun{"16", "1", "0"}}) {
      REQUIRE(SetKnob("STRATA_CUDA_COLD_COPIES", r.n_slots) == 0);
      REQUIRE(SetKnob("STRATA_CUDA_GRAPHS", r.graphs) == 0);
      REQUIRE(SetKnob("STRATA_COLD_COPIES_BATCH", r.batch) == 0);
      moe_stats st;
      const auto copied = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, uint64_t{1} << 20, nullptr, nullptr, &st);
      UnsetKnob("STRATA_CUDA_COLD_COPIES");
      UnsetKnob("STRATA_CUDA_GRAPHS");
      UnsetKnob("STRATA_COLD_COPIES_BATCH");
      INFO(r.n_slots << " slots a set by the copy engines, graphs " << r.graphs << ", batched " << r.batch
                     << "; predicted " << st.prefetch_issued << ", used " << st.prefetch_useful << ", replays "
                     << st.gpu_graph_replays);
      if (r.graphs[0] == '1') {
        CHECK(st.gpu_graph_replays > 0);
        CHECK(st.prefetch_issued > 0);
        CHECK(st.prefetch_useful > 0);
        CHECK(st.prefetch_useful <= st.prefetch_issued);
      } else {
        CHECK(st.gpu_graph_replays == 0);
        CHECK(st.prefetch_issued == 0);
      }
      CHECK(copied == all);
    }
    // One context of the process at a time has the copier: while another tiered context is open,
    // a second reads its RAM experts in place (no predictions), with the same bits.
    REQUIRE(SetKnob("STRATA_CUDA_COLD_COPIES", "16") == 0);
    moe_params hp;
    moe_params_init(&hp);
    hp.model_path = model.c_str();
    hp.backend = MOE_BACKEND_CUDA;
    hp.vram_budget_bytes = uint64_t{1} << 20;
    hp.cpu_experts = MOE_CPU_EXPERTS_OFF;
    hp.n_threads = 2;
    moe_ctx *holder = nullptr;
    REQUIRE(moe_ctx_open(&hp, &holder) == MOE_OK);
    moe_stats second;
    const auto beside = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, uint64_t{1} << 20, nullptr, nullptr, &second);
    moe_ctx_close(holder);
    moe_stats after;
    const auto alone = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, uint64_t{1} << 20, nullptr, nullptr, &after);
    UnsetKnob("STRATA_CUDA_COLD_COPIES");
    INFO("predicted beside another context " << second.prefetch_issued << ", after it closed " << after.prefetch_issued);
    CHECK(second.prefetch_issued == 0);
    CHECK(after.prefetch_issued > 0);
    CHECK(beside == all);
    CHECK(alone == all);
  }
}

// A prompt long enough for the host path (more selections than the device routes at once) over
// tiers that hold every expert in VRAM's few slots and RAM: the pass swaps hot experts into VRAM,
// the re-plan after it moves more while decode goes on, and a prompt's experts from RAM are staged
// for their products (by the copy engines' staging memory, or read over the link without it). The
// bytes are the same, so the logits stay bit-identical to all-resident.
TEST_CASE("CUDA backend: a long prompt over the tiers is bit-identical, staged or read in place", "[gpu][golden][tiers]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : kGraphModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto golden = ReadBinary<int32_t>(dir + "tokens.bin");
    // 300 prompt tokens (600 selections of two experts) and 12 decode steps, from the golden ids.
    std::vector<int32_t> tokens;
    for (size_t i = 0; tokens.size() < 312; ++i) tokens.push_back(golden[(i * 7) % golden.size()]);
    const auto all = TeacherForced(model, tokens, 300, MOE_BACKEND_CUDA);
    for (const char *n_copies : {"8", "0"}) {
      REQUIRE(SetKnob("STRATA_CUDA_COLD_COPIES", n_copies) == 0);
      moe_stats st;
      uint32_t slots = 0, n_routed = 0;
      const auto tier = TeacherForced(model, tokens, 300, MOE_BACKEND_CUDA, uint64_t{1} << 20, &slots, &n_routed, &st);
      UnsetKnob("STRATA_CUDA_COLD_COPIES");
      INFO(rel << ", copy engines' slots " << n_copies << ": " << slots << " of " << n_routed
               << " experts in VRAM slots; fills " << st.vram_fills << ", promotions " << st.vram_promotions);
      REQUIRE(slots < n_routed);
      CHECK(st.expert_misses == 0);
      if (n_copies[0] != '0') CHECK(st.vram_fills > st.vram_promotions);  // the prompt's staged copies
      CHECK(tier == all);
    }
  }
}

// A hotlist (the format `strata profile` writes) seeds the VRAM tier at open: its experts take
// VRAM's slots first, the rest of the tiers' share after. Concentrated routing (the synthetic
// default: a few experts a layer take most tokens), a third of the experts in VRAM (the rest in a
// RAM tier of every expert), a 1-token prompt and 40 decode steps: with the run's own counts as
// the hotlist, RAM serves fewer uses than with the same list ranked the other way round (the least
// used first); the logits are the same bits either way.
TEST_CASE("CUDA backend: a hotlist seeds the VRAM tier at open", "[gpu][golden][tiers]") {
  if (!strata::cuda::test::HaveGpu()) return;
  strata::format::testing::TempDir dir;
  const std::string model = TinyConcentrated(dir);
  uint32_t slots = 0, n_routed = 0;
  const uint64_t budget = ThirdInSlots(model, &slots, &n_routed);
  INFO("budget " << budget << ": " << slots << " of " << n_routed << " experts in slots");
  const unsigned seed = std::random_device{}();
  INFO("seed " << seed);
  const std::vector<int32_t> tokens = RandomTokens(41, seed);
  const std::string hot = dir.File("hot.txt"), cold = dir.File("cold.txt");
  WriteHotlists(model, tokens, 1, hot, cold);
  const auto all = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA);
  moe_stats hot_st, cold_st;
  const auto by_hot = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, budget, nullptr, nullptr, &hot_st,
                                    MOE_CPU_EXPERTS_OFF, false, hot.c_str());
  const auto by_cold = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, budget, nullptr, nullptr, &cold_st,
                                     MOE_CPU_EXPERTS_OFF, false, cold.c_str());
  INFO("uses served from RAM: hotlist " << hot_st.expert_hits << ", reversed " << cold_st.expert_hits);
  CHECK(by_hot == all);
  CHECK(by_cold == all);
  CHECK(hot_st.expert_misses == 0);
  CHECK(cold_st.expert_hits > 0);
  CHECK(hot_st.expert_hits < cold_st.expert_hits);
}

// Hybrid placement: with the cold experts of every decode layer computed by the CPU from host RAM
// (MOE_CPU_EXPERTS_ALWAYS) while the GPU runs the rest, decode steps are still recorded and replayed
// as CUDA graphs (the calls to the CPU inside), and the logits match the CPU backend's within
// the tolerance of the GPU backend.
TEST_CASE("CUDA backend: cold experts computed by the CPU match the CPU backend", "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : kGraphModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    const auto cpu = TeacherForced(model, tokens, 1, MOE_BACKEND_CPU);
    for (int32_t mode : {MOE_CPU_EXPERTS_ALWAYS, MOE_CPU_EXPERTS_AUTO}) {
      moe_stats st;
      uint32_t slots = 0, n_routed = 0;
      const auto gpu =
          TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, uint64_t{1} << 20, &slots, &n_routed, &st, mode);
      const double err = NormalizedMaxError(gpu, cpu);
      INFO(rel << " mode " << mode << ": " << slots << " of " << n_routed << " experts in slots; CPU uses "
               << st.vram_cpu_experts << " in " << st.vram_cpu_layers << " layers, zero-copy " << st.vram_zero_copy
               << ", replays " << st.gpu_graph_replays << "; normalized max error " << err);
      WARN("hybrid " << rel << " mode " << mode << ": CPU uses " << st.vram_cpu_experts << ", zero-copy "
                     << st.vram_zero_copy << ", predicted " << st.prefetch_issued << " (" << st.prefetch_useful
                     << " used), replays " << st.gpu_graph_replays << ", err " << err);
      REQUIRE(slots < n_routed);
      CHECK(err <= kTolerance);
      if (mode == MOE_CPU_EXPERTS_ALWAYS) {
        CHECK(st.vram_cpu_layers == st.vram_device_layers);
        CHECK(st.vram_cpu_experts > 0);
        CHECK(st.gpu_graph_replays + 3 >= tokens.size());
      }
    }
    // Paths that change and come back: three steps with every layer's cold experts by the copy
    // engines, three with the CPU's share, and so on. Each set is recorded once and replays when
    // the paths return to it. (The CPU's share of a layer follows the fitted rates, so the bits are
    // held to the tolerance; the copy engines' alone to all-resident in the test above.)
    REQUIRE(SetKnob("STRATA_CUDA_COLD_COPIES", "16") == 0);
    REQUIRE(SetKnob("STRATA_CUDA_PATHS_ALTERNATE", "3") == 0);
    moe_stats st;
    const auto graphed = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, uint64_t{1} << 20, nullptr, nullptr, &st,
                                       MOE_CPU_EXPERTS_ALWAYS);
    UnsetKnob("STRATA_CUDA_COLD_COPIES");
    UnsetKnob("STRATA_CUDA_PATHS_ALTERNATE");
    const double err = NormalizedMaxError(graphed, cpu);
    INFO(rel << " paths alternating: captures " << st.gpu_graph_captures << ", replays " << st.gpu_graph_replays
             << ", CPU uses " << st.vram_cpu_experts << ", predicted " << st.prefetch_issued << "; error " << err);
    REQUIRE(tokens.size() > 12);  // the paths come back twice or more
    CHECK(st.gpu_graph_captures == 2);
    CHECK(st.gpu_graph_replays == tokens.size() - 4);
    CHECK(st.vram_cpu_experts > 0);
    CHECK(st.prefetch_issued > 0);
    CHECK(err <= kTolerance);
  }
}

// 8-bit activations on both backends: the GPU's integer-dot products (Q8_0 and Q4_K matrices)
// quantize activations as the CPU's q8 mode does, so the logits agree as closely as the float modes.
TEST_CASE("CUDA backend: 8-bit activations match the CPU backend's q8 mode", "[gpu][golden][q8]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-q8_0.gguf",
                          "qwen3moe_mixed/model-mixed.gguf"}) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (size_t prefill : {size_t{12}, size_t{1}}) {
      const auto cpu = TeacherForced(model, tokens, prefill, MOE_BACKEND_CPU, 0, nullptr, nullptr, nullptr,
                                     MOE_CPU_EXPERTS_OFF, true);
      const auto gpu = TeacherForced(model, tokens, prefill, MOE_BACKEND_CUDA, 0, nullptr, nullptr, nullptr,
                                     MOE_CPU_EXPERTS_OFF, true);
      const auto cpu_f = TeacherForced(model, tokens, prefill, MOE_BACKEND_CPU);
      const size_t n_vocab = cpu.size() / tokens.size();
      // Position by position, normalized by the whole run's largest logit. The two backends add
      // block products in different orders, so an activation that lands within a few ulps of a
      // rounding boundary can take the neighbouring code on one of them; that moves the position
      // where it happens by a fraction of q8's own distance from float, and (when it is late in the
      // network) no other. Measured (H200): one such position in 20 on the mixed model with the Q4_K
      // products on the tensor cores (4.5e-3 against q8-vs-float 1.5e-2; every other position
      // <= 3e-7). A wrong row, scale or expert moves every later position by q8-vs-float's size.
      // dist: max |a - b| over a position (b null: max |a|).
      const auto dist = [&](const std::vector<float> &a, const std::vector<float> *b, size_t pos) {
        double m = 0;
        for (size_t i = pos * n_vocab; i < (pos + 1) * n_vocab; ++i) {
          m = std::max(m, std::fabs(static_cast<double>(a[i]) - (b != nullptr ? (*b)[i] : 0.f)));
        }
        return m;
      };
      double den = 0, worst = 0;
      for (size_t pos = 0; pos < tokens.size(); ++pos) den = std::max(den, dist(cpu, nullptr, pos));
      int flipped = 0;
      for (size_t pos = 0; pos < tokens.size(); ++pos) {
        const double err = dist(gpu, &cpu, pos);
        worst = std::max(worst, err / den);
        if (err / den <= kTolerance) continue;
        ++flipped;
        CHECK(err <= 0.5 * dist(cpu_f, &cpu, pos));
      }
      WARN("q8 gpu-vs-cpu " << rel << " prefill " << prefill << " err " << worst << ", " << flipped
                            << " positions past " << kTolerance);
      CHECK(flipped <= 1);
    }
    // A 300-token prompt (600 selections: past what the device routes, so the host path: a layer's
    // experts in a few launches on the tensor cores, PromptMmaQ8) and 8 decode steps, with every
    // expert in VRAM and with the VRAM tier (1 MiB: fewer slots than a layer's experts on some of
    // the models, so the chunks and their fills); and the same in float.
    std::vector<int32_t> prompt;
    for (size_t i = 0; prompt.size() < 308; ++i) prompt.push_back(tokens[(i * 7) % tokens.size()]);
    const auto cpu = TeacherForced(model, prompt, 300, MOE_BACKEND_CPU, 0, nullptr, nullptr, nullptr,
                                   MOE_CPU_EXPERTS_OFF, true);
    const auto gpu = TeacherForced(model, prompt, 300, MOE_BACKEND_CUDA, 0, nullptr, nullptr, nullptr,
                                   MOE_CPU_EXPERTS_OFF, true);
    const auto gpu_tier = TeacherForced(model, prompt, 300, MOE_BACKEND_CUDA, uint64_t{1} << 20, nullptr, nullptr,
                                        nullptr, MOE_CPU_EXPERTS_OFF, true);
    // The same with staging memory (the copier's sets): the prompt's cold experts staged beside
    // the tier, in chunks of half the ring.
    REQUIRE(SetKnob("STRATA_CUDA_COLD_COPIES", "2") == 0);
    const auto gpu_staged = TeacherForced(model, prompt, 300, MOE_BACKEND_CUDA, uint64_t{1} << 20, nullptr, nullptr,
                                          nullptr, MOE_CPU_EXPERTS_OFF, true);
    UnsetKnob("STRATA_CUDA_COLD_COPIES");
    const auto cpu_f = TeacherForced(model, prompt, 300, MOE_BACKEND_CPU);
    const auto gpu_f = TeacherForced(model, prompt, 300, MOE_BACKEND_CUDA);
    const double err = NormalizedMaxError(gpu, cpu), err_f = NormalizedMaxError(gpu_f, cpu_f);
    const double q8_vs_f = NormalizedMaxError(cpu, cpu_f);
    WARN("q8 gpu-vs-cpu " << rel << " 300-token prompt " << err << " (cpu q8 vs float " << q8_vs_f
                          << "); float gpu-vs-cpu " << err_f);
    // The tier changes no bit in q8 mode either.
    CHECK(gpu_tier == gpu);
    CHECK(gpu_staged == gpu);
    CHECK(err_f <= kTolerance);
    // A prompt's products add their block sums in another order than the CPU's: a value that lands
    // next to a rounding boundary takes the other code, so q8 mode's discontinuity shows. Measured
    // (H200, products on the tensor cores): 0.0104, 0.0033, 0.00095 against q8's own distance from
    // float of 0.118, 0.017, 0.090; a wrong expert or row moves it by that distance.
    CHECK(err <= 0.3 * q8_vs_f);
  }
}

// Sessions decoding together: each token's products, norms, routing and attention are the same
// kernels per row at any batch up to the GEMV path's 16 tokens, so a session's decode logits are the
// same bits alone and stepped with three others (float and 8-bit activations; prompts run alone).
TEST_CASE("CUDA backend: a session decodes the same bits alone and batched with others", "[gpu][golden][sessions]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-q8_0.gguf", "olmoe_f32/model-f32.gguf"}) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (bool q8 : {false, true}) {
      INFO(rel << (q8 ? " q8" : " float"));
      auto decode_of_first = [&](int n_sessions) {
        moe_params p;
        moe_params_init(&p);
        p.model_path = model.c_str();
        p.backend = MOE_BACKEND_CUDA;
        p.cpu_q8_activations = q8 ? 1 : 0;
        p.gpu_q8_activations = q8 ? 1 : 0;
        p.n_threads = 2;
        p.n_ctx = 64;
        p.max_sessions = 4;
        moe_ctx *ctx = nullptr;
        INFO(moe_last_error());
        REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
        moe_session_params sp;
        moe_session_params_init(&sp);
        sp.logits_all = 1;
        std::vector<moe_session *> ss(n_sessions);
        for (int i = 0; i < n_sessions; ++i) {  // each prompt alone: 5 + i tokens from its own offset
          REQUIRE(moe_session_open(ctx, &sp, &ss[i]) == MOE_OK);
          std::vector<int32_t> prompt;
          for (int j = 0; j < 5 + i; ++j) prompt.push_back(tokens[(3 * i + j) % tokens.size()]);
          REQUIRE(moe_session_feed(ss[i], prompt.data(), prompt.size()) == MOE_OK);
          REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
        }
        std::vector<float> out;
        for (int step = 0; step < 8; ++step) {  // every session one token a step, stepped together
          for (int i = 0; i < n_sessions; ++i) {
            const int32_t t = tokens[(7 * step + 5 * i + 1) % tokens.size()];
            REQUIRE(moe_session_feed(ss[i], &t, 1) == MOE_OK);
          }
          uint32_t pending = 99;
          REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
          REQUIRE(pending == 0);
          const float *rows;
          int32_t nt, nv;
          REQUIRE(moe_session_logits_all(ss[0], &rows, &nt, &nv) == MOE_OK);
          REQUIRE(nt == 1);
          out.insert(out.end(), rows, rows + nv);
        }
        for (moe_session *s : ss) moe_session_close(s);
        moe_ctx_close(ctx);
        return out;
      };
      const auto alone = decode_of_first(1), batched = decode_of_first(4);
      REQUIRE(alone.size() == batched.size());
      for (float v : alone) REQUIRE(std::isfinite(v));
      CHECK(alone == batched);
    }
  }
}

// Steady-state decode allocates nothing on the device or in pinned memory: the workspace, KV caches,
// scratch buffers and expert slots are sized before, and reused by every step, eager or replayed
// from a CUDA graph.
TEST_CASE("CUDA backend: decode steps after warm-up make no allocation", "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : {"qwen3moe_mixed/model-mixed.gguf", "deepseek3_f32/hf", "gptoss_f32/model-mxfp4.gguf",
                          "qwen3moe_f32/model-q8_0.gguf"}) {
    for (auto [budget, cpu_experts, q8] :
         {std::tuple<uint64_t, int32_t, bool>{0, MOE_CPU_EXPERTS_OFF, false}, {1, MOE_CPU_EXPERTS_OFF, false},
          {1, MOE_CPU_EXPERTS_ALWAYS, false}, {0, MOE_CPU_EXPERTS_OFF, true}}) {
      INFO(rel << " VRAM budget " << budget << " cpu_experts " << cpu_experts << " q8 " << q8);
      const std::string model = kGolden + rel;
      const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
      const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
      moe_params p;
      moe_params_init(&p);
      p.model_path = model.c_str();
      p.backend = MOE_BACKEND_CUDA;
      p.vram_budget_bytes = budget;
      p.cpu_experts = cpu_experts;
      p.gpu_q8_activations = q8 ? 1 : 0;
      moe_ctx *ctx = nullptr;
      REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
      moe_session_params sp;
      moe_session_params_init(&sp);
      moe_session *s = nullptr;
      REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
      auto step = [&](const int32_t *t, size_t n) {
        REQUIRE(moe_session_feed(s, t, n) == MOE_OK);
        uint32_t pending = 99;
        REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
        REQUIRE(pending == 0);
      };
      step(tokens.data(), 8);
      for (size_t i = 8; i < 11; ++i) step(tokens.data() + i, 1);  // warm-up
      const uint64_t before = strata::cuda::AllocationCount();
      for (size_t i = 11; i < tokens.size(); ++i) step(tokens.data() + i, 1);
      CHECK(strata::cuda::AllocationCount() == before);
      moe_stats st;
      moe_stats_init(&st);
      REQUIRE(moe_ctx_stats(ctx, &st) == MOE_OK);
      // A family routed on the GPU runs these steps from a CUDA graph (the others run them eagerly).
      if (std::string(rel) == "qwen3moe_f32/model-q8_0.gguf") CHECK(st.gpu_graph_replays >= tokens.size() - 11);
      moe_session_close(s);
      moe_ctx_close(ctx);
    }
  }
}

namespace {

// Three sessions with their own masks, teacher-forced together: prompts of 1, 3 and 5 tokens, then
// every session one token per moe_ctx_step (batches of three rows at different positions). Returns
// each session's logits of every decode step, concatenated, and the context's stats.
std::vector<float> ThreeSessions(const std::string &model, const std::vector<int32_t> &tokens, moe_stats *st) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.backend = MOE_BACKEND_CUDA;
  p.n_threads = 2;
  moe_ctx *ctx = nullptr;
  INFO(model << ": " << moe_last_error());
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  const int32_t blocked[] = {tokens[2], tokens[7]};
  moe_session *s[3] = {};
  const size_t prompt[3] = {1, 3, 5};
  for (int i = 0; i < 3; ++i) {
    moe_session_params sp;
    moe_session_params_init(&sp);
    if (i == 1) sp.attn_window = 4;
    if (i == 2) {
      sp.blocked_tokens = blocked;
      sp.n_blocked_tokens = 2;
    }
    REQUIRE(moe_session_open(ctx, &sp, &s[i]) == MOE_OK);
    REQUIRE(moe_session_feed(s[i], tokens.data() + i, prompt[i]) == MOE_OK);
  }
  uint32_t pending = 0;
  REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
  REQUIRE(pending == 0);
  const int32_t n_vocab = moe_ctx_vocab_size(ctx);
  std::vector<float> out;
  for (size_t step = 0; step + 6 + 2 < tokens.size(); ++step) {
    for (int i = 0; i < 3; ++i) REQUIRE(moe_session_feed(s[i], &tokens[i + prompt[i] + step], 1) == MOE_OK);
    REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
    REQUIRE(pending == 0);
    for (int i = 0; i < 3; ++i) {
      const float *row = nullptr;
      int32_t nv = 0;
      REQUIRE(moe_session_logits(s[i], &row, &nv) == MOE_OK);
      REQUIRE(nv == n_vocab);
      out.insert(out.end(), row, row + n_vocab);
    }
  }
  moe_stats_init(st);
  REQUIRE(moe_ctx_stats(ctx, st) == MOE_OK);
  for (moe_session *x : s) moe_session_close(x);
  moe_ctx_close(ctx);
  return out;
}

}  // namespace

// The decode step as a CUDA graph: recorded once a step of its shape has run without a host round
// trip, then replayed; every logit is bit-identical to eager steps (STRATA_CUDA_GRAPHS=0), with every
// expert in VRAM and over the tiers (RAM's experts read over the link), and the replays allocate
// nothing.
TEST_CASE("CUDA backend: decode steps replay from a CUDA graph, bit-identical to eager steps", "[gpu][golden]") {
  if (!strata::cuda::test::HaveGpu()) return;
  for (const char *rel : kGraphModels) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (uint64_t budget : {uint64_t{0}, uint64_t{1} << 20}) {
      INFO(rel << " VRAM budget " << budget);
      moe_stats eager_st, graph_st;
      std::vector<float> eager;
      {
        GraphsOff off;
        eager = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, budget, nullptr, nullptr, &eager_st);
      }
      const auto graphed = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, budget, nullptr, nullptr, &graph_st);
      INFO("captures " << graph_st.gpu_graph_captures << ", replays " << graph_st.gpu_graph_replays
                       << ", zero-copy " << graph_st.vram_zero_copy << ", promotions " << graph_st.vram_promotions);
      CHECK(eager_st.gpu_graph_captures == 0);
      CHECK(eager_st.gpu_graph_replays == 0);
      // Step 1 runs watched and grows the scratch buffers (clean: growing is no round trip the next
      // step of its shape repeats), step 2 is recorded, every later one replays.
      CHECK(graph_st.gpu_graph_captures == 1);
      CHECK(graph_st.gpu_graph_replays == tokens.size() - 2);
      if (budget != 0) CHECK(graph_st.expert_hits > 0);  // uses served from RAM, over the link
      CHECK(graphed == eager);
    }
    moe_stats eager_st, graph_st;
    std::vector<float> eager;
    {
      GraphsOff off;
      eager = ThreeSessions(model, tokens, &eager_st);
    }
    const auto graphed = ThreeSessions(model, tokens, &graph_st);
    INFO(rel << " three sessions: captures " << graph_st.gpu_graph_captures << ", replays "
             << graph_st.gpu_graph_replays);
    const uint64_t steps = tokens.size() - 8;  // batches of three decode rows
    // Step 1 runs watched and is clean (the prompt step already grew every buffer it uses), step 2
    // is recorded, every later one replays.
    CHECK(graph_st.gpu_graph_captures == 1);
    CHECK(graph_st.gpu_graph_replays == steps - 2);
    CHECK(graphed == eager);
  }
}

// Three tiers at once: with experts streaming through a small RAM tier, a VRAM budget stacks a
// tier of distinct experts above it (moved up from RAM, victims moved down). At every (RAM, VRAM)
// pair the logits are bit-identical to the unbounded run with the GPU computing every expert, and
// each expert use is served by one tier or read from the file.
TEST_CASE("CUDA backend: VRAM over RAM over the file is bit-identical at every budget pair", "[gpu][golden][tiers]") {
  if (!strata::cuda::test::HaveGpu()) return;
  std::mt19937 rng(std::random_device{}());
  for (const char *rel : {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-q8_0.gguf", "olmoe_f32/model-f32.gguf",
                          "qwen2moe_f32/model-f32.gguf"}) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    moe_stats all_st;
    const auto all = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, 0, nullptr, nullptr, &all_st);
    moe_params p;
    moe_params_init(&p);
    p.model_path = model.c_str();
    p.backend = MOE_BACKEND_CUDA;
    p.ram_budget_bytes = 1;
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_plan(&p, &plan) == MOE_OK);
    const uint32_t routed = plan.n_routed_experts, ram_min = plan.ram_expert_slots;
    REQUIRE(ram_min < routed);
    const uint32_t pairs[][2] = {{ram_min, 1 + static_cast<uint32_t>(rng() % 3)},
                                 {ram_min, routed - ram_min - 1},
                                 {ram_min + 2, routed / 2},
                                 {routed - routed / 3 + 1, routed / 3},
                                 {ram_min, routed}};
    for (const auto &pair : pairs) {
      const uint64_t ram = plan.ram_fixed_bytes + uint64_t{pair[0]} * plan.expert_slot_bytes;
      const uint64_t vram = plan.vram_fixed_bytes + uint64_t{pair[1]} * plan.expert_slot_bytes;
      uint32_t slots = 0;
      moe_stats st;
      INFO(rel << ": RAM " << pair[0] << " VRAM " << pair[1] << " of " << routed);
      const auto got = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, vram, &slots, nullptr, &st,
                                     MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, ram);
      CHECK(slots == std::min(pair[1], routed));
      CHECK(st.streaming == 1);
      CHECK(st.vram_hits > 0);
      CHECK(st.vram_hits + st.expert_hits + st.expert_misses == all_st.expert_hits);
      CHECK(got == all);
      // Tiers holding every expert with one to spare route on the device's tables: every MoE layer
      // without a host wait, decode steps replayed from graphs.
      if (uint64_t{pair[0]} + slots >= uint64_t{routed} + 1) {
        CHECK(st.vram_device_layers > 0);
        CHECK(st.gpu_graph_replays > 0);
        CHECK(st.expert_misses == 0);
      } else {
        CHECK(st.vram_device_layers == 0);
      }
    }
    // No VRAM budget while experts stream: the tier takes most of the device's free memory.
    moe_stats auto_st;
    uint32_t auto_slots = 0;
    const uint64_t ram_min_bytes = plan.ram_fixed_bytes + uint64_t{ram_min} * plan.expert_slot_bytes;
    const auto got = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, 0, &auto_slots, nullptr, &auto_st,
                                   MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, ram_min_bytes);
    CHECK(auto_slots == routed);  // a golden's experts all fit
    CHECK(auto_st.vram_hits > 0);
    CHECK(auto_st.gpu_graph_replays > 0);
    CHECK(got == all);
  }
}

// gpt-oss's experts carry bias vectors: streamed, their views hold copies of them, which the
// device resolves by the tensor rows they copy. At (RAM, VRAM) pairs from the smallest RAM tier to
// complete tiers, each in both codecs of the golden, the logits are bit-identical to all-resident
// and the VRAM tier serves uses.
TEST_CASE("CUDA backend: gpt-oss's biased experts stream through the tiers, bit-identical", "[gpu][golden][tiers]") {
  if (!strata::cuda::test::HaveGpu()) return;
  std::mt19937 rng(std::random_device{}());
  for (const char *rel : {"gptoss_f32/model-mxfp4.gguf", "gptoss_f32/model-f32.gguf"}) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    moe_stats all_st;
    const auto all = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, 0, nullptr, nullptr, &all_st);
    moe_params p;
    moe_params_init(&p);
    p.model_path = model.c_str();
    p.backend = MOE_BACKEND_CUDA;
    p.ram_budget_bytes = 1;
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_plan(&p, &plan) == MOE_OK);
    const uint32_t routed = plan.n_routed_experts, ram_min = plan.ram_expert_slots;
    REQUIRE(ram_min + 2 < routed);
    // Two VRAM slots at least: with one, the complete pair's RAM tier would hold every expert.
    const uint32_t vram_n = 2 + static_cast<uint32_t>(rng() % (routed / 3));
    const uint32_t pairs[][2] = {{ram_min, vram_n}, {routed - vram_n + 1, vram_n}};
    for (const auto &pair : pairs) {
      const uint64_t ram = plan.ram_fixed_bytes + uint64_t{pair[0]} * plan.expert_slot_bytes;
      const uint64_t vram = plan.vram_fixed_bytes + uint64_t{pair[1]} * plan.expert_slot_bytes;
      moe_stats st;
      uint32_t slots = 0;
      INFO(rel << ": RAM " << pair[0] << " VRAM " << pair[1] << " of " << routed << ": " << moe_last_error());
      const auto got = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, vram, &slots, nullptr, &st,
                                     MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, ram);
      CHECK(slots == pair[1]);
      CHECK(st.streaming == 1);
      CHECK(st.vram_hits > 0);
      CHECK(st.vram_hits + st.expert_hits + st.expert_misses == all_st.expert_hits);
      CHECK(got == all);
    }
  }
}

// A VRAM budget short of the experts over a RAM budget that holds them all runs the tiers of
// lib/store (complete: VRAM's share, RAM the rest with one to spare); the logits are the all-resident run's bits and every use is a hit of one
// tier or the other.
TEST_CASE("CUDA backend: the tiers of lib/store serve a context whose experts all fit RAM", "[gpu][golden][tiers]") {
  if (!strata::cuda::test::HaveGpu()) return;
  std::mt19937 rng(std::random_device{}());
  for (const char *rel : {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-q8_0.gguf", "olmoe_f32/model-f32.gguf",
                          "qwen2moe_f32/model-f32.gguf", "gptoss_f32/model-mxfp4.gguf"}) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    moe_stats all_st;
    const auto all = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, 0, nullptr, nullptr, &all_st);
    moe_params p;
    moe_params_init(&p);
    p.model_path = model.c_str();
    p.backend = MOE_BACKEND_CUDA;
    p.vram_budget_bytes = 1;
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_plan(&p, &plan) == MOE_OK);
    const uint32_t routed = plan.n_routed_experts;
    // VRAM's share leaves RAM more than one layer's experts, so RAM need not hold them all.
    REQUIRE(routed >= 16);
    const uint32_t vram_n = 2 + static_cast<uint32_t>(rng() % (routed / 2 - 1));
    const uint64_t vram = plan.vram_fixed_bytes + uint64_t{vram_n} * plan.expert_slot_bytes;
    moe_stats st;
    uint32_t slots = 0;
    const auto got = TeacherForced(model, tokens, 12, MOE_BACKEND_CUDA, vram, &slots, nullptr, &st);
    INFO(rel << ": VRAM " << vram_n << " of " << routed << ", RAM slots " << st.cache_slots);
    CHECK(slots == vram_n);
    CHECK(st.streaming == 1);
    CHECK(st.cache_slots >= routed - vram_n + 1);  // complete: one to spare
    CHECK(st.cache_slots < routed);                  // distinct experts: RAM need not hold VRAM's
    CHECK(st.expert_misses == 0);
    CHECK(st.vram_hits + st.expert_hits == all_st.expert_hits);
    CHECK(got == all);
  }
}

// A prompt over complete tiers (a third of the experts in VRAM, the rest in a streamed RAM tier
// that holds them all): its experts from RAM are copied up into the staging ring for their
// products (each layer's chunks on the tensor cores with 8-bit activations, one at a time with float
// ones) instead of read over the link once per tile. Fresh random tokens, a 300-token prompt and a
// decode step; bit-identical to all-resident, staged or not, and the staged run copied experts up
// beyond its promotions.
TEST_CASE("CUDA backend: complete tiers stage a prompt's experts from RAM", "[gpu][golden][tiers]") {
  if (!strata::cuda::test::HaveGpu()) return;
  strata::format::testing::TempDir dir;
  const std::string model = TinySpread(dir);
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.backend = MOE_BACKEND_CUDA;
  p.ram_budget_bytes = 1;
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  REQUIRE(moe_plan(&p, &plan) == MOE_OK);
  const uint32_t routed = plan.n_routed_experts;
  const uint32_t vram_n = routed / 3, ram_n = routed - vram_n + 1;
  REQUIRE(ram_n < routed);
  const uint64_t ram = plan.ram_fixed_bytes + uint64_t{ram_n} * plan.expert_slot_bytes;
  const uint64_t vram = plan.vram_fixed_bytes + uint64_t{vram_n} * plan.expert_slot_bytes;
  const unsigned seed = std::random_device{}();
  INFO("seed " << seed << "; RAM " << ram_n << " VRAM " << vram_n << " of " << routed);
  const std::vector<int32_t> tokens = RandomTokens(301, seed);
  for (bool q8 : {false, true}) {
    INFO("8-bit activations " << q8);
    const auto all = TeacherForced(model, tokens, 300, MOE_BACKEND_CUDA, 0, nullptr, nullptr, nullptr,
                                   MOE_CPU_EXPERTS_OFF, q8);
    moe_stats st, ust;
    const auto staged = TeacherForced(model, tokens, 300, MOE_BACKEND_CUDA, vram, nullptr, nullptr, &st,
                                      MOE_CPU_EXPERTS_OFF, q8, nullptr, nullptr, ram);
    REQUIRE(SetKnob("STRATA_CUDA_PROMPT_STAGE", "0") == 0);
    const auto unstaged = TeacherForced(model, tokens, 300, MOE_BACKEND_CUDA, vram, nullptr, nullptr, &ust,
                                        MOE_CPU_EXPERTS_OFF, q8, nullptr, nullptr, ram);
    UnsetKnob("STRATA_CUDA_PROMPT_STAGE");
    INFO("staged: fills " << st.vram_fills << " promotions " << st.vram_promotions << "; unstaged: fills "
                          << ust.vram_fills << " promotions " << ust.vram_promotions);
    CHECK(st.streaming == 1);
    CHECK(st.expert_misses == 0);
    CHECK(staged == all);
    CHECK(unstaged == all);
    CHECK(st.vram_fills > st.vram_promotions);
    CHECK(ust.vram_fills == ust.vram_promotions);
  }
}

// The tiers' tables with the CPU's share: experts RAM serves are computed by the CPU from their RAM
// slots (wherever the tier put them) while the device computes the rest, so the logits are the CPU
// backend's to the hybrid path's tolerance, and the counters say the CPU took part.
TEST_CASE("CUDA backend: complete tiers give the CPU a share of RAM's experts", "[gpu][golden][tiers]") {
  if (!strata::cuda::test::HaveGpu()) return;
  std::mt19937 rng(std::random_device{}());
  for (const char *rel : {"qwen3moe_f32/model-q8_0.gguf", "mixtral_f32/model-q8_0.gguf", "olmoe_f32/model-f32.gguf",
                          "qwen2moe_f32/model-f32.gguf"}) {
    const std::string model = kGolden + rel;
    const std::string dir = model.substr(0, model.find('/', kGolden.size()) + 1);
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    const auto cpu = TeacherForced(model, tokens, 1, MOE_BACKEND_CPU);
    moe_params p;
    moe_params_init(&p);
    p.model_path = model.c_str();
    p.backend = MOE_BACKEND_CUDA;
    p.ram_budget_bytes = 1;
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_plan(&p, &plan) == MOE_OK);
    const uint32_t routed = plan.n_routed_experts;
    // A complete pair with most experts in RAM (but not all: they stream), VRAM's share drawn afresh.
    REQUIRE(routed >= 8);
    const uint32_t vram_n = 2 + static_cast<uint32_t>(rng() % (routed / 4));
    const uint32_t ram_n = routed - vram_n + 1;
    REQUIRE(ram_n < routed);
    const uint64_t ram = plan.ram_fixed_bytes + uint64_t{ram_n} * plan.expert_slot_bytes;
    const uint64_t vram = plan.vram_fixed_bytes + uint64_t{vram_n} * plan.expert_slot_bytes;
    for (int32_t mode : {MOE_CPU_EXPERTS_ALWAYS, MOE_CPU_EXPERTS_AUTO}) {
      moe_stats st;
      uint32_t slots = 0;
      const auto got = TeacherForced(model, tokens, 1, MOE_BACKEND_CUDA, vram, &slots, nullptr, &st, mode, false,
                                     nullptr, nullptr, ram);
      const double err = NormalizedMaxError(got, cpu);
      INFO(rel << " mode " << mode << ": RAM " << ram_n << " VRAM " << vram_n << " of " << routed << "; CPU uses "
               << st.vram_cpu_experts << " in " << st.vram_cpu_layers << " layers, device layers "
               << st.vram_device_layers << ", replays " << st.gpu_graph_replays << "; error " << err);
      CHECK(slots == vram_n);
      CHECK(st.streaming == 1);
      CHECK(st.expert_misses == 0);
      CHECK(st.vram_device_layers > 0);
      CHECK(err <= kTolerance);
      if (mode == MOE_CPU_EXPERTS_ALWAYS) {
        CHECK(st.vram_cpu_experts > 0);
        CHECK(st.vram_cpu_layers > 0);
        CHECK(st.gpu_graph_replays > 0);
      }
    }
  }
}
