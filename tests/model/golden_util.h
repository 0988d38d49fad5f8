// Helpers shared by the tests that compare Strata's logits with the golden fixtures
// (tests/golden): reading the binary files, the normalized max error, and teacher forcing through
// the C ABI (a prefill batch, then one token per step) with poisoned output rows.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <functional>
#include <string>
#include <vector>

#include "include/strata/moe.h"

namespace strata::testing {

// The fixtures: $STRATA_GOLDEN_DIR when set (test binaries run away from the source tree, e.g. on the
// GPU machine), else the source tree's tests/golden.
inline std::string GoldenDir() {
  const char *env = std::getenv("STRATA_GOLDEN_DIR");
  if (env != nullptr && *env != '\0') return std::string(env) + "/";
  return std::string(STRATA_SOURCE_DIR) + "/tests/golden/";
}
inline const std::string kGolden = GoldenDir();

template <typename T>
inline std::vector<T> ReadBinary(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() % sizeof(T) == 0);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// max |a - b| / max |b| over all elements.
inline double NormalizedMaxError(const std::vector<float> &a, const std::vector<float> &b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(a[i]));
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

// Runs `tokens` through a fresh session: the first `prefill` as one batch, then one at a time.
// Returns the logits of every position, (n_tokens, n_vocab).
// With a vram_budget, *vram_slots (when given) receives the plan's VRAM expert slots; cold experts
// run on the GPU unless cpu_experts says otherwise; q8_activations: both backends' 8-bit modes;
// hotlist: the context's hotlist file; expert_counts: the run's selections per (layer, expert);
// ram_budget: the context's RAM budget (1: the smallest, experts streamed through the RAM cache);
// type_k / type_v: the KV cache's types (moe_kv_type).
inline std::vector<float> TeacherForced(const std::string &model, const std::vector<int32_t> &tokens, size_t prefill,
                                        int32_t backend = MOE_BACKEND_CPU, uint64_t vram_budget = 0,
                                        uint32_t *vram_slots = nullptr, uint32_t *n_routed = nullptr,
                                        moe_stats *stats = nullptr,
                                        int32_t cpu_experts = MOE_CPU_EXPERTS_OFF, bool q8_activations = false,
                                        const char *hotlist = nullptr, std::vector<uint64_t> *expert_counts = nullptr,
                                        uint64_t ram_budget = 0, const std::function<void()> &after_step = {},
                                        int32_t type_k = MOE_KV_F32, int32_t type_v = MOE_KV_F32) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.hotlist_path = hotlist;
  p.backend = backend;
  p.vram_budget_bytes = vram_budget;
  p.ram_budget_bytes = ram_budget;
  p.cpu_experts = cpu_experts;
  p.cpu_q8_activations = q8_activations ? 1 : 0;
  p.gpu_q8_activations = q8_activations ? 1 : 0;
  p.n_threads = 2;
  p.type_k = type_k;
  p.type_v = type_v;
  moe_ctx *ctx = nullptr;
  const moe_status opened = moe_ctx_open(&p, &ctx);
  INFO(model << ": " << moe_last_error());
  REQUIRE(opened == MOE_OK);
  if (vram_slots != nullptr || n_routed != nullptr) {
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    REQUIRE(moe_ctx_plan(ctx, &plan) == MOE_OK);
    if (vram_slots != nullptr) *vram_slots = plan.vram_expert_slots;
    if (n_routed != nullptr) *n_routed = plan.n_routed_experts;
  }
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.logits_all = 1;
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
  const int32_t n_vocab = moe_ctx_vocab_size(ctx);
  // Poison: every row must come from the engine.
  std::vector<float> out(tokens.size() * n_vocab, std::nanf(""));
  size_t done = 0;
  auto run = [&](size_t n) {
    REQUIRE(moe_session_feed(s, tokens.data() + done, n) == MOE_OK);
    uint32_t pending = 99;
    REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
    REQUIRE(pending == 0);
    const float *rows;
    int32_t nt, nv;
    REQUIRE(moe_session_logits_all(s, &rows, &nt, &nv) == MOE_OK);
    REQUIRE(nt == static_cast<int32_t>(n));
    REQUIRE(nv == n_vocab);
    std::copy(rows, rows + n * n_vocab, out.begin() + done * n_vocab);
    done += n;
    REQUIRE(moe_session_n_past(s) == static_cast<int32_t>(done));
    if (after_step) after_step();
  };
  if (prefill > 0) run(prefill);
  while (done < tokens.size()) run(1);
  if (stats != nullptr) {
    moe_stats_init(stats);
    REQUIRE(moe_ctx_stats(ctx, stats) == MOE_OK);
  }
  if (expert_counts != nullptr) {
    size_t n = 0;
    REQUIRE(moe_ctx_expert_counts(ctx, nullptr, 0, &n) == MOE_ERR_LIMIT);
    expert_counts->assign(n, 0);
    REQUIRE(moe_ctx_expert_counts(ctx, expert_counts->data(), n, &n) == MOE_OK);
  }
  moe_session_close(s);
  moe_ctx_close(ctx);
  return out;
}

}  // namespace strata::testing
