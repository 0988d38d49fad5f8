// The C ABI's struct_size contract: every params and out struct is accepted at the sizes a released
// header gave it (the end of each appended group) and refused at any other size with
// MOE_ERR_INVALID_ARGUMENT naming the struct and the size, before a byte past the caller's struct
// is read or written.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"

namespace {

const std::string kModel = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/model-q8_0.gguf";

// The size a header ending just before `offset` had: its last field's end, rounded to the alignment.
constexpr uint32_t Upto(size_t offset, size_t align) { return static_cast<uint32_t>((offset + align - 1) / align * align); }

// Sizes no header ever had: inside a field, one past the end, absurd. Random ones too, so the
// check is not a list of the sizes tried here.
std::vector<uint32_t> BadSizes(uint32_t full, const std::vector<uint32_t> &good) {
  std::vector<uint32_t> bad = {1, 4, 12, full - 4, full + 8, full * 2, 1u << 20, 0xFFFFFFFFu};
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 8; ++i) bad.push_back(static_cast<uint32_t>(rng() % (2 * full)));
  std::vector<uint32_t> out;
  for (uint32_t s : bad) {
    bool is_good = s == 0;  // 0 is tested on its own
    for (uint32_t g : good) is_good = is_good || s == g;
    if (!is_good) out.push_back(s);
  }
  return out;
}

void ExpectNamed(moe_status st, const char *what, uint32_t size) {
  INFO(what << " size " << size << ": " << moe_last_error());
  CHECK(st == MOE_ERR_INVALID_ARGUMENT);
  const std::string msg = moe_last_error();
  CHECK(msg.find(what) != std::string::npos);
  CHECK(msg.find(std::to_string(size)) != std::string::npos);
}

}  // namespace

TEST_CASE("struct_size: moe_params at a size no header had is refused, older sizes open", "[capi][abi]") {
  const std::vector<uint32_t> good = {
      Upto(offsetof(moe_params, cache_policy), alignof(moe_params)),
      Upto(offsetof(moe_params, max_batch_tokens), alignof(moe_params)),
      Upto(offsetof(moe_params, kv_budget_bytes), alignof(moe_params)),
      Upto(offsetof(moe_params, cpu_experts), alignof(moe_params)),
      Upto(offsetof(moe_params, load_progress), alignof(moe_params)),
      Upto(offsetof(moe_params, cuda_graphs), alignof(moe_params)),
      Upto(offsetof(moe_params, load_continue), alignof(moe_params)),
      Upto(offsetof(moe_params, type_k), alignof(moe_params)),
      static_cast<uint32_t>(sizeof(moe_params))};
  for (uint32_t s : BadSizes(sizeof(moe_params), good)) {
    moe_params p;
    moe_params_init(&p);
    p.model_path = kModel.c_str();
    p.struct_size = s;
    moe_ctx *ctx = nullptr;
    ExpectNamed(moe_ctx_open(&p, &ctx), "moe_params", s);
    CHECK(ctx == nullptr);
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    ExpectNamed(moe_plan(&p, &plan), "moe_params", s);
    // fill_defaults writes nothing for a size it does not know.
    moe_params q;
    std::memset(&q, 0x5A, sizeof q);
    q.struct_size = s;
    moe_params_fill_defaults(&q);
    CHECK(q.backend == static_cast<int32_t>(0x5A5A5A5A));
  }
  // Every shipped size plans the model, defaults filling the fields it does not cover.
  for (uint32_t s : good) {
    moe_params p;
    std::memset(&p, 0, sizeof p);
    p.struct_size = s;
    moe_params_fill_defaults(&p);
    p.model_path = kModel.c_str();
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    INFO("size " << s << ": " << moe_last_error());
    CHECK(moe_plan(&p, &plan) == MOE_OK);
    CHECK(plan.n_layers > 0);
  }
}

TEST_CASE("struct_size: out structs and session params are checked against their shipped sizes", "[capi][abi]") {
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);

  const std::vector<uint32_t> plan_good = {
      Upto(offsetof(moe_cache_plan, kv_bytes_per_token), alignof(moe_cache_plan)),
      Upto(offsetof(moe_cache_plan, ram_fixed_bytes), alignof(moe_cache_plan)),
      static_cast<uint32_t>(sizeof(moe_cache_plan))};
  for (uint32_t s : BadSizes(sizeof(moe_cache_plan), plan_good)) {
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    plan.struct_size = s;
    ExpectNamed(moe_ctx_plan(ctx, &plan), "moe_cache_plan", s);
    ExpectNamed(moe_plan(&p, &plan), "moe_cache_plan", s);
    CHECK(plan.n_layers == 0);  // nothing written
  }
  for (uint32_t s : plan_good) {
    // An older host's struct, with a canary past its end that must survive.
    std::vector<unsigned char> buf(sizeof(moe_cache_plan) + 16, 0xC3);
    std::memcpy(buf.data(), &s, sizeof s);
    CHECK(moe_ctx_plan(ctx, reinterpret_cast<moe_cache_plan *>(buf.data())) == MOE_OK);
    for (size_t i = s; i < buf.size(); ++i) CHECK(buf[i] == 0xC3);
  }

  const std::vector<uint32_t> stats_good = {
      Upto(offsetof(moe_stats, prefetch_skipped), alignof(moe_stats)),
      Upto(offsetof(moe_stats, vram_expert_slots), alignof(moe_stats)),
      Upto(offsetof(moe_stats, gpu_graph_captures), alignof(moe_stats)),
      Upto(offsetof(moe_stats, numa_node), alignof(moe_stats)),
      Upto(offsetof(moe_stats, vram_cpu_layers), alignof(moe_stats)),
      Upto(offsetof(moe_stats, vram_hits), alignof(moe_stats)),
      Upto(offsetof(moe_stats, locked_bytes), alignof(moe_stats)),
      static_cast<uint32_t>(sizeof(moe_stats))};
  for (uint32_t s : BadSizes(sizeof(moe_stats), stats_good)) {
    moe_stats st;
    moe_stats_init(&st);
    st.struct_size = s;
    ExpectNamed(moe_ctx_stats(ctx, &st), "moe_stats", s);
  }
  for (uint32_t s : stats_good) {
    std::vector<unsigned char> buf(sizeof(moe_stats) + 16, 0xC3);
    std::memcpy(buf.data(), &s, sizeof s);
    CHECK(moe_ctx_stats(ctx, reinterpret_cast<moe_stats *>(buf.data())) == MOE_OK);
    for (size_t i = s; i < buf.size(); ++i) CHECK(buf[i] == 0xC3);
  }

  const uint32_t info_good = sizeof(moe_expert_info);
  for (uint32_t s : BadSizes(sizeof(moe_expert_info), {info_good})) {
    moe_expert_info info;
    moe_expert_info_init(&info);
    info.struct_size = s;
    ExpectNamed(moe_expert_table_get(moe_ctx_experts(ctx), 0, 0, &info), "moe_expert_info", s);
  }

  const std::vector<uint32_t> sp_good = {
      Upto(offsetof(moe_session_params, min_p), alignof(moe_session_params)),
      Upto(offsetof(moe_session_params, attn_window), alignof(moe_session_params)),
      Upto(offsetof(moe_session_params, frequency_penalty), alignof(moe_session_params)),
      Upto(offsetof(moe_session_params, ctx_shift), alignof(moe_session_params)),
      static_cast<uint32_t>(sizeof(moe_session_params))};
  for (uint32_t s : BadSizes(sizeof(moe_session_params), sp_good)) {
    moe_session_params sp;
    moe_session_params_init(&sp);
    sp.struct_size = s;
    moe_session *sess = nullptr;
    ExpectNamed(moe_session_open(ctx, &sp, &sess), "moe_session_params", s);
    CHECK(sess == nullptr);
  }
  for (uint32_t s : sp_good) {
    moe_session_params sp;
    std::memset(&sp, 0, sizeof sp);
    sp.struct_size = s;
    moe_session_params_fill_defaults(&sp);
    moe_session *sess = nullptr;
    CHECK(moe_session_open(ctx, &sp, &sess) == MOE_OK);
    moe_session_close(sess);
  }
  moe_ctx_close(ctx);
}
