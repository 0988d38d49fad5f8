// KV cache types (f16, q8_0): the bytes written equal the gguf Python package's quantization of the
// same rows (tests/quant/fixtures/kv_rows.bin, scripts/quant/make_kv_fixture.py); logits of every
// golden family stay within the bounds of transformers' float32 logits; the plan's bytes per
// token follow the types; a q8_0 session evicted to disk, forked or saved and loaded continues bit
// for bit; bad types are refused by name.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "include/strata/moe.h"
#include "lib/model/forward.h"
#include "tests/model/golden_util.h"

namespace {

using strata::model::KvRowBytes;
using strata::model::KvType;
using strata::testing::kGolden;
using strata::testing::NormalizedMaxError;
using strata::testing::ReadBinary;
using strata::testing::TeacherForced;

struct KvFixture {
  int n_rows = 0, width = 0;
  std::vector<float> rows;
  std::vector<uint8_t> f16, q8_0;
};

KvFixture ReadFixture() {
  std::ifstream f(std::string(STRATA_SOURCE_DIR) + "/tests/quant/fixtures/kv_rows.bin", std::ios::binary);
  REQUIRE(f.good());
  std::vector<char> b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(b.size() >= 16);
  REQUIRE(std::memcmp(b.data(), "SKVF", 4) == 0);
  uint32_t h[3];
  std::memcpy(h, b.data() + 4, sizeof h);
  REQUIRE(h[0] == 1);
  KvFixture fx;
  fx.n_rows = static_cast<int>(h[1]);
  fx.width = static_cast<int>(h[2]);
  const size_t n = static_cast<size_t>(fx.n_rows) * fx.width;
  REQUIRE(b.size() == 16 + n * 4 + n * 2 + n / 32 * 34);
  fx.rows.resize(n);
  std::memcpy(fx.rows.data(), b.data() + 16, n * 4);
  fx.f16.assign(b.begin() + 16 + n * 4, b.begin() + 16 + n * 6);
  fx.q8_0.assign(b.begin() + 16 + n * 6, b.end());
  return fx;
}

// A cache shape of one width: kv_dim = 2 x 64.
strata::model::HParams CacheShape() {
  strata::model::HParams hp;
  hp.n_layer = 2;
  hp.n_head = 4;
  hp.n_head_kv = 2;
  hp.head_dim = 64;
  return hp;
}

// The golden models of every family (their f32 GGUFs) and transformers' float32 logits.
const char *const kFamilies[] = {"qwen3moe_f32", "mixtral_f32",    "olmoe_f32",      "qwen2moe_f32",
                                 "gptoss_f32",   "deepseek2_f32",  "deepseek2lite_f32", "deepseek3_f32"};

}  // namespace

TEST_CASE("KV types: bytes written equal gguf's quantization of the same rows", "[kv][types]") {
  const KvFixture fx = ReadFixture();
  REQUIRE(fx.width == 128);
  strata::cpu::CpuBackend be(2);
  for (KvType t : {KvType::kF16, KvType::kQ8_0}) {
    INFO(strata::model::KvTypeName(t));
    const std::vector<uint8_t> &want = t == KvType::kF16 ? fx.f16 : fx.q8_0;
    const size_t rb = KvRowBytes(t, fx.width);
    REQUIRE(want.size() == rb * fx.n_rows);
    // The row encoder, and the backend's write (the forward pass's path), 0xAA-poisoned.
    std::vector<uint8_t> enc(want.size(), 0xAA), wrote(want.size(), 0xAA);
    for (int r = 0; r < fx.n_rows; ++r) {
      strata::model::EncodeKvRow(t, fx.rows.data() + r * fx.width, fx.width, enc.data() + r * rb);
    }
    be.WriteKvBytes(wrote.data(), static_cast<int64_t>(rb), fx.rows.data(), fx.width, fx.n_rows, fx.width, t);
    CHECK(enc == want);
    CHECK(wrote == want);
    // A cache of that type: its block rows hold those bytes, across a block boundary; the floats
    // ReadRows gives back (a snapshot's) write the same bytes again.
    strata::model::KvCache kv;
    REQUIRE(kv.Init(CacheShape(), 256, nullptr, nullptr, t, t).ok());
    REQUIRE(kv.Reserve(fx.n_rows).ok());
    CHECK(kv.block_bytes() == 2ull * 128 * 2 * rb);
    kv.WriteRows(1, true, fx.n_rows, fx.rows.data());
    kv.WriteRows(1, false, fx.n_rows, fx.rows.data());
    const strata::model::KvView view = kv.layer(1);
    for (int p = 0; p < fx.n_rows; ++p) {
      REQUIRE(std::memcmp(view.v_row(p), want.data() + p * rb, rb) == 0);
      REQUIRE(std::memcmp(view.k_row(p), want.data() + p * rb, rb) == 0);
    }
    std::vector<float> back(fx.rows.size(), std::nanf(""));
    REQUIRE(kv.ReadRows(1, true, fx.n_rows, back.data()).ok());
    strata::model::KvCache again;
    REQUIRE(again.Init(CacheShape(), 256, nullptr, nullptr, t, t).ok());
    REQUIRE(again.Reserve(fx.n_rows).ok());
    again.WriteRows(0, true, fx.n_rows, back.data());
    for (int p = 0; p < fx.n_rows; ++p) REQUIRE(std::memcmp(again.layer(0).v_row(p), want.data() + p * rb, rb) == 0);
  }
}

TEST_CASE("KV types: every golden family within bounds of transformers' float32 logits", "[kv][types][golden]") {
  struct Bound {
    int32_t k, v;
    double bound;
  };
  // The acceptance bounds: q8_0 within 3e-2 of float32's logits, f16 within 1e-2.
  const Bound bounds[] = {
      {MOE_KV_Q8_0, MOE_KV_Q8_0, 3e-2}, {MOE_KV_F16, MOE_KV_F16, 1e-2}, {MOE_KV_Q8_0, MOE_KV_F16, 3e-2}};
  for (const char *family : kFamilies) {
    const std::string dir = kGolden + family + "/";
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    const auto ref = ReadBinary<float>(dir + "logits.bin");
    const auto f32 = TeacherForced(dir + "model-f32.gguf", tokens, tokens.size());
    for (const Bound &b : bounds) {
      for (size_t prefill : {tokens.size(), size_t{12}}) {
        const auto got = TeacherForced(dir + "model-f32.gguf", tokens, prefill, MOE_BACKEND_CPU, 0, nullptr, nullptr,
                                       nullptr, MOE_CPU_EXPERTS_OFF, false, nullptr, nullptr, 0, {}, b.k, b.v);
        const double err = NormalizedMaxError(got, ref);
        INFO(family << " K " << b.k << " V " << b.v << " prefill " << prefill << ": error " << err);
        CHECK(err <= b.bound);
        // The type took effect: the logits moved from the float32 cache's.
        CHECK(NormalizedMaxError(got, f32) > 0);
      }
    }
  }
}

TEST_CASE("KV types: the plan's bytes per token follow the types", "[kv][types][plan]") {
  const std::string model = kGolden + "qwen3moe_f32/model-f32.gguf";
  auto per_token = [&](int32_t k, int32_t v) {
    moe_params p;
    moe_params_init(&p);
    p.model_path = model.c_str();
    p.type_k = k;
    p.type_v = v;
    moe_cache_plan plan;
    moe_cache_plan_init(&plan);
    INFO(moe_last_error());
    REQUIRE(moe_plan(&p, &plan) == MOE_OK);
    CHECK(plan.kv_bytes == plan.kv_bytes_per_token * plan.n_ctx * plan.max_sessions);
    return std::make_pair(plan.kv_bytes_per_token, plan.n_layers);
  };
  // qwen3moe golden: 2 KV heads of 16 -> 32 floats a row, a K and a V row a layer.
  const auto [f32, n_layers] = per_token(MOE_KV_F32, MOE_KV_F32);
  CHECK(f32 == n_layers * 2ull * 32 * 4);
  CHECK(per_token(MOE_KV_F16, MOE_KV_F16).first == n_layers * 2ull * 32 * 2);
  CHECK(per_token(MOE_KV_Q8_0, MOE_KV_Q8_0).first == n_layers * 2ull * 34);
  CHECK(per_token(MOE_KV_Q8_0, MOE_KV_F32).first == n_layers * (34ull + 128));
  CHECK(per_token(MOE_KV_Q8_0, MOE_KV_Q8_0).first * 100 <= f32 * 30);
  // Real shapes: Qwen3-30B-A3B (48 layers, 4 KV heads of 128) and DeepSeek-V3's latent rows (61
  // layers, 512 + 64 floats, no value rows): q8_0 is 34/128 of f32, within the 30%.
  strata::model::HParams qwen;
  qwen.n_layer = 48;
  qwen.n_head_kv = 4;
  qwen.head_dim = 128;
  strata::model::HParams ds;
  ds.n_layer = 61;
  ds.mla = true;
  ds.kv_lora_rank = 512;
  ds.qk_rope_dim = 64;
  for (const auto &[hp, f32_bytes] :
       {std::make_pair(qwen, 48ull * 2 * 512 * 4), std::make_pair(ds, 61ull * 576 * 4)}) {
    CHECK(strata::model::KvCache::BytesFor(hp, 1) == f32_bytes);
    const uint64_t q8 = strata::model::KvCache::BytesFor(hp, 1, KvType::kQ8_0, KvType::kQ8_0);
    CHECK(q8 * 128 == f32_bytes * 34);
    CHECK(q8 * 100 <= f32_bytes * 30);
  }
  // A type moe_kv_type does not list is refused, naming the field.
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.type_v = 3;
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  CHECK(moe_plan(&p, &plan) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("type_v") != std::string::npos);
  moe_ctx *ctx = nullptr;
  p.type_v = MOE_KV_F32;
  p.type_k = 2;  // GGML_TYPE_Q4_0: not a KV type Strata has
  CHECK(moe_ctx_open(&p, &ctx) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(std::string(moe_last_error()).find("type_k") != std::string::npos);
  CHECK(ctx == nullptr);
}

TEST_CASE("KV types: a q8_0 session evicted, forked or saved and loaded continues bit for bit", "[kv][types]") {
  char tmpl[] = "/tmp/strata-kvtypes-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string spill = tmpl;
  for (const char *family : {"qwen3moe_f32", "deepseek2_f32", "gptoss_f32"}) {
    INFO(family);
    const std::string dir = kGolden + family + "/";
    const std::string model = dir + "model-f32.gguf";
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    moe_params p;
    moe_params_init(&p);
    p.model_path = model.c_str();
    p.n_threads = 2;
    p.type_k = MOE_KV_Q8_0;
    p.type_v = MOE_KV_Q8_0;
    p.kv_spill_dir = spill.c_str();
    p.max_sessions = 4;
    moe_ctx *ctx = nullptr;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    moe_session_params sp;
    moe_session_params_init(&sp);
    sp.logits_all = 1;
    const int32_t n_vocab = moe_ctx_vocab_size(ctx);
    auto step = [&](moe_session *s, size_t from, size_t n) {
      REQUIRE(moe_session_feed(s, tokens.data() + from, n) == MOE_OK);
      uint32_t pending = 99;
      REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
      const float *rows;
      int32_t nt, nv;
      REQUIRE(moe_session_logits_all(s, &rows, &nt, &nv) == MOE_OK);
      return std::vector<float>(rows, rows + static_cast<size_t>(nt) * nv);
    };
    // The continuation of a session that only ran: decode steps after a 12-token prefill.
    auto tail = [&](moe_session *s) {
      std::vector<float> out;
      for (size_t t = 12; t < tokens.size(); ++t) {
        const auto r = step(s, t, 1);
        out.insert(out.end(), r.begin(), r.end());
      }
      return out;
    };
    moe_session *plain = nullptr, *evicted = nullptr;
    REQUIRE(moe_session_open(ctx, &sp, &plain) == MOE_OK);
    REQUIRE(moe_session_open(ctx, &sp, &evicted) == MOE_OK);
    step(plain, 0, 12);
    step(evicted, 0, 12);
    // Save and fork before the plain session moves on; evict the other.
    std::vector<uint8_t> snap(1 << 22);
    size_t n_snap = 0;
    REQUIRE(moe_session_save_buffer(plain, snap.data(), snap.size(), &n_snap) == MOE_OK);
    moe_session *fork = nullptr;
    REQUIRE(moe_session_fork(plain, &fork) == MOE_OK);
    const uint64_t held = moe_session_kv_bytes(evicted);
    CHECK(held > 0);
    REQUIRE(moe_session_evict(evicted) == MOE_OK);
    CHECK(moe_session_kv_bytes(evicted) == 0);
    const auto want = tail(plain);
    REQUIRE(want.size() == (tokens.size() - 12) * n_vocab);
    CHECK(tail(evicted) == want);
    CHECK(tail(fork) == want);
    moe_session *loaded = nullptr;
    REQUIRE(moe_session_load_buffer(ctx, snap.data(), n_snap, nullptr, &loaded) == MOE_OK);
    CHECK(tail(loaded) == want);
    for (moe_session *s : {plain, evicted, fork, loaded}) moe_session_close(s);
    moe_ctx_close(ctx);
  }
  rmdir(tmpl);
}
