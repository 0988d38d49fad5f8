// The forward pass's family kernels (backends/cuda/forward_ops.cu) against the CPU reference
// (CpuBackend, lib/model/routing) on fresh random inputs, outputs poisoned with NaN first.
// Tolerances: adds, gathers and in-order weighted sums use the CPU's IEEE float operations and are
// bit-identical; ops with a transcendental (sigmoid, SwiGLU, RoPE's cos / sin) evaluate it in double
// and round once, which may differ from glibc's float function by an ulp: 1e-6 relative L2;
// attention dots differ from the CPU's 8-lane sums only in order: 1e-5 relative L2; routing picks
// the same experts (random logits have no near-ties) with weights within 1e-6.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_status.h"
#include "lib/model/routing.h"
#include "tests/cuda/cuda_test_util.h"

namespace strata::cuda {
namespace {

using test::Download;
using test::HaveGpu;
using test::Poisoned;
using test::RandomFloats;
using test::RelL2;
using test::Upload;

DeviceBuffer UploadInts(const std::vector<int32_t> &v) { return Upload(v); }

// A routing variant of the tests below, and its device arguments (bias: the device copy of the
// expert selection bias, used when the case has one).
struct RouteCase {
  model::Gating gating;
  int n_expert, k, n_group, topk_group;
  bool norm;
  float scale;
  bool bias;
};
RouteArgs DeviceRouteArgs(const RouteCase &c, const DeviceBuffer &bias) {
  RouteArgs a;
  a.gating = static_cast<int>(c.gating);
  a.n_expert = c.n_expert;
  a.k = c.k;
  a.n_group = c.n_group;
  a.topk_group = c.topk_group;
  a.norm_topk_prob = c.norm;
  a.routed_scale = c.scale;
  a.select_bias = c.bias ? bias.as<float>() : nullptr;
  return a;
}

}  // namespace

TEST_CASE("Element-wise glue is bit-identical to the CPU backend", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu(1);
  const int64_t n_rows = 7, n = 96, k = 3;
  std::vector<float> x = RandomFloats(rng, n_rows * n), y = RandomFloats(rng, n_rows * n), b = RandomFloats(rng, n);
  std::vector<float> g = RandomFloats(rng, n_rows, -6.f, 6.f);
  {  // Add, AddBias, SigmoidScaleRows in sequence on one buffer
    std::vector<float> ref = x;
    cpu.Add(ref.data(), y.data(), n_rows * n);
    cpu.AddBias(ref.data(), n_rows, n, b.data());
    DeviceBuffer dx = Upload(x), dy = Upload(y), db = Upload(b), dg = Upload(g);
    REQUIRE(Add(dx.as<float>(), dy.as<float>(), n_rows * n, nullptr).ok());
    REQUIRE(AddBias(dx.as<float>(), n_rows, n, db.as<float>(), nullptr).ok());
    CHECK(Download<float>(dx, n_rows * n) == ref);
    cpu.SigmoidScaleRows(ref.data(), g.data(), n_rows, n);
    REQUIRE(SigmoidScaleRows(dx.as<float>(), dg.as<float>(), n_rows, n, nullptr).ok());
    CHECK(RelL2(Download<float>(dx, n_rows * n), ref) <= 1e-6);
  }
  {  // GatherRows, WeightedRowSum
    std::vector<int32_t> gather(n_rows * k), slot(n_rows * k);
    std::uniform_int_distribution<int> pick(0, n_rows - 1), any(0, n_rows * k - 1);
    for (auto &i : gather) i = pick(rng);
    for (auto &i : slot) i = any(rng);
    std::vector<float> wts = RandomFloats(rng, n_rows * k, 0.f, 1.f);
    std::vector<float> ref_g(n_rows * k * n), ref_s(n_rows * n);
    cpu.GatherRows(x.data(), n, gather.data(), n_rows * k, ref_g.data());
    cpu.WeightedRowSum(ref_g.data(), slot.data(), wts.data(), n_rows, static_cast<int>(k), n, ref_s.data());
    DeviceBuffer dx = Upload(x), di = UploadInts(gather), ds = UploadInts(slot), dw = Upload(wts);
    DeviceBuffer dg = Poisoned(n_rows * k * n), dout = Poisoned(n_rows * n);
    REQUIRE(GatherRows(dx.as<float>(), n, di.as<int32_t>(), n_rows * k, dg.as<float>(), nullptr).ok());
    REQUIRE(WeightedRowSum(dg.as<float>(), ds.as<int32_t>(), dw.as<float>(), n_rows, static_cast<int>(k), n,
                           dout.as<float>(), nullptr)
                .ok());
    CHECK(Download<float>(dg, n_rows * k * n) == ref_g);
    CHECK(Download<float>(dout, n_rows * n) == ref_s);
    // With the selections sent back in the same launch: the same sum, and the selections' copy.
    DeviceBuffer dout2 = Poisoned(n_rows * n), back = Poisoned(n_rows * k);
    REQUIRE(WeightedRowSum(dg.as<float>(), ds.as<int32_t>(), dw.as<float>(), n_rows, static_cast<int>(k), n,
                           dout2.as<float>(), nullptr, di.as<int32_t>(), back.as<int32_t>())
                .ok());
    CHECK(Download<float>(dout2, n_rows * n) == ref_s);
    CHECK(Download<int32_t>(back, n_rows * k) == gather);
    CHECK(StatusToMoe(WeightedRowSum(dg.as<float>(), ds.as<int32_t>(), dw.as<float>(), n_rows, static_cast<int>(k), n,
                                     dout2.as<float>(), nullptr, nullptr, back.as<int32_t>())) ==
          MOE_ERR_INVALID_ARGUMENT);
  }
}

TEST_CASE("Gated activations and input-major products match the CPU backend's expert FFN", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu(1);
  const int64_t n_tok = 5, n_embd = 64, n_ff = 32;
  for (float limit : {0.f, 7.f}) {
    INFO("swiglu limit " << limit);
    // An input-major expert: gate_up (n_embd, 2 n_ff) interleaved, its bias, down (n_ff, n_embd).
    std::vector<float> gu = RandomFloats(rng, n_embd * 2 * n_ff, -0.5f, 0.5f), down = RandomFloats(rng, n_ff * n_embd);
    std::vector<float> gb = RandomFloats(rng, 2 * n_ff), x = RandomFloats(rng, n_tok * n_embd, -3.f, 3.f);
    std::vector<uint8_t> gu_bytes(gu.size() * 4), down_bytes(down.size() * 4);
    std::memcpy(gu_bytes.data(), gu.data(), gu_bytes.size());
    std::memcpy(down_bytes.data(), down.data(), down_bytes.size());
    model::TensorRef ref_tensor;
    model::ExpertWeights e;
    e.input_major = true;
    e.swiglu_limit = limit;
    e.gate.tensor = &ref_tensor;
    e.gate.codec = quant::FindCodec(quant::TypeId::kF32);
    e.gate.rows = n_embd;
    e.gate.cols = 2 * n_ff;
    e.gate.row_bytes = 2 * n_ff * 4;
    e.gate.data = gu_bytes.data();
    e.down = e.gate;
    e.down.rows = n_ff;
    e.down.cols = n_embd;
    e.down.row_bytes = n_embd * 4;
    e.down.data = down_bytes.data();
    e.gate_bias.tensor = &ref_tensor;
    e.gate_bias.values = gb;
    std::vector<float> ref(n_tok * n_embd);
    cpu.ExpertFfn(e, x.data(), n_tok, ref.data());
    DeviceBuffer dgu = Upload(gu), ddown = Upload(down), dgb = Upload(gb), dx = Upload(x);
    DeviceBuffer dt = Poisoned(n_tok * 2 * n_ff), dh = Poisoned(n_tok * n_ff), dy = Poisoned(n_tok * n_embd);
    REQUIRE(MatMulInputMajorF32(dgu.as<float>(), n_embd, 2 * n_ff, dx.as<float>(), n_tok, dt.as<float>(), nullptr).ok());
    REQUIRE(AddBias(dt.as<float>(), n_tok, 2 * n_ff, dgb.as<float>(), nullptr).ok());
    REQUIRE(GatedAct(dt.as<float>(), dt.as<float>() + 1, 2 * n_ff, 2, n_tok, n_ff, limit, dh.as<float>(), nullptr).ok());
    REQUIRE(MatMulInputMajorF32(ddown.as<float>(), n_ff, n_embd, dh.as<float>(), n_tok, dy.as<float>(), nullptr).ok());
    CHECK(RelL2(Download<float>(dy, n_tok * n_embd), ref) <= 1e-6);
  }
}

// The fused q/k norm + RoPE (Qwen3's attention input) against the separate launches it replaces:
// bit-identical, for query and key heads of different counts, both styles, at scattered positions.
TEST_CASE("Fused q/k norm and RoPE is bit-identical to RmsNorm then RoPE", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int64_t n_tok = 5;
  const int n_head = 6, n_head_kv = 2;
  for (int head_dim : {64, 128}) {
    for (auto style : {model::RopeStyle::kNormal, model::RopeStyle::kNeox}) {
      INFO("head_dim " << head_dim << " style " << static_cast<int>(style));
      const std::vector<float> q = RandomFloats(rng, n_tok * n_head * head_dim, -3.f, 3.f),
                               k = RandomFloats(rng, n_tok * n_head_kv * head_dim, -3.f, 3.f),
                               qw = RandomFloats(rng, head_dim, 0.5f, 1.5f), kw = RandomFloats(rng, head_dim, 0.5f, 1.5f),
                               inv = RandomFloats(rng, head_dim / 2, 0.001f, 1.f);
      std::vector<int32_t> pos(n_tok);
      for (int64_t t = 0; t < n_tok; ++t) pos[t] = static_cast<int32_t>(rng() % 5000);
      DeviceBuffer dq = Upload(q), dk = Upload(k), dqw = Upload(qw), dkw = Upload(kw), dp = UploadInts(pos);
      REQUIRE(RmsNorm(dq.as<float>(), dqw.as<float>(), n_tok * n_head, head_dim, 1e-6f, dq.as<float>(), nullptr).ok());
      REQUIRE(RmsNorm(dk.as<float>(), dkw.as<float>(), n_tok * n_head_kv, head_dim, 1e-6f, dk.as<float>(), nullptr).ok());
      REQUIRE(RopeWithTable(dq.as<float>(), n_tok, n_head, head_dim, dp.as<int32_t>(), inv.data(), 1.f, style, nullptr)
                  .ok());
      REQUIRE(RopeWithTable(dk.as<float>(), n_tok, n_head_kv, head_dim, dp.as<int32_t>(), inv.data(), 1.f, style,
                            nullptr)
                  .ok());
      DeviceBuffer fq = Upload(q), fk = Upload(k);
      REQUIRE(NormRope(fq.as<float>(), fk.as<float>(), n_tok, n_head, n_head_kv, head_dim, dqw.as<float>(),
                       dkw.as<float>(), 1e-6f, dp.as<int32_t>(), inv.data(), 1.f, style, nullptr)
                  .ok());
      const auto sq = Download<float>(dq, q.size()), sk = Download<float>(dk, k.size());
      CHECK(Download<float>(fq, q.size()) == sq);
      CHECK(Download<float>(fk, k.size()) == sk);
      CHECK(sq != q);  // the rows did change
    }
  }
}

TEST_CASE("RoPE with a frequency table and YaRN scale matches the CPU backend", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu(1);
  const int64_t n_tok = 9;
  const int n_heads = 3, head_dim = 64;
  for (auto style : {model::RopeStyle::kNormal, model::RopeStyle::kNeox}) {
    std::vector<float> inv = RandomFloats(rng, head_dim / 2, 0.001f, 1.f), x = RandomFloats(rng, n_tok * n_heads * head_dim);
    std::vector<int32_t> pos(n_tok);
    for (int64_t t = 0; t < n_tok; ++t) pos[t] = static_cast<int32_t>(100 + 37 * t);
    model::RopeParams p;
    p.inv_freq = inv.data();
    p.mscale = 1.2f;
    std::vector<float> ref = x;
    cpu.Rope(ref.data(), n_tok, n_heads, head_dim, pos.data(), 10000.f, style, p);
    DeviceBuffer dx = Upload(x), dp = UploadInts(pos);
    REQUIRE(RopeWithTable(dx.as<float>(), n_tok, n_heads, head_dim, dp.as<int32_t>(), inv.data(), p.mscale, style,
                          nullptr)
                .ok());
    CHECK(RelL2(Download<float>(dx, ref.size()), ref) <= 1e-6);
  }
}

TEST_CASE("Attention over block tables with masks, sinks, windows, latent values and a set scale matches the CPU backend",
          "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu(1);
  // pos0, n_tok, n_ctx: a short prefill chunk (one pass), and decode over long contexts, whose keys
  // are split over blocks in chunks of kAttnChunk and combined (with masks, windows, sinks, latent).
  struct Case { bool latent, sinks; int window; float scale; int pos0, n_tok, n_ctx; };
  for (Case c : {Case{false, true, 0, 0.f, 11, 6, 32}, Case{false, true, 5, 0.f, 11, 6, 32},
                 Case{false, false, 0, 0.37f, 11, 6, 32}, Case{true, false, 0, 0.21f, 11, 6, 32},
                 Case{false, true, 0, 0.f, 300, 1, 320}, Case{false, false, 100, 0.f, 300, 2, 320},
                 Case{true, true, 0, 0.21f, 250, 1, 256}, Case{false, false, 0, 0.f, 127, 1, 128}}) {
    INFO("latent " << c.latent << " sinks " << c.sinks << " window " << c.window << " scale " << c.scale << " pos0 "
                   << c.pos0 << " tokens " << c.n_tok);
    const int n_head = 4, n_head_kv = c.latent ? 1 : 2, head_dim = c.latent ? 40 : 24, v_dim = c.latent ? 32 : head_dim;
    const int pos0 = c.pos0, n_ctx = c.n_ctx;
    const int64_t n_tok = c.n_tok;
    const int k_width = n_head_kv * head_dim, v_width = c.latent ? 0 : k_width;
    std::vector<float> k = RandomFloats(rng, n_ctx * k_width), v = RandomFloats(rng, std::max(1, n_ctx * v_width));
    std::vector<float> q = RandomFloats(rng, n_tok * n_head * head_dim), sinks = RandomFloats(rng, n_head);
    model::AttentionParams p;
    p.scale = c.scale;
    p.latent = c.latent;
    p.v_dim = v_dim;
    if (c.sinks) p.sinks = sinks.data();
    std::vector<float> ref(n_tok * n_head * v_dim);
    // Blocks of 8 positions, every third position before pos0 masked (blocked tokens).
    std::vector<uint8_t> masked(n_ctx, 0);
    for (int p0 = 1; p0 < pos0; p0 += 3) masked[p0] = 1;
    const int bt = 8;
    // The CPU reads the same rows through kKvBlockTokens blocks of contiguous memory.
    model::ContiguousKv ckv(k.data(), v.data(), n_ctx, k_width, v_width);
    model::KvView view = ckv.view();
    view.masked = masked.data();
    cpu.Attention(q.data(), view, n_tok, pos0, n_head, n_head_kv, head_dim, c.window, ref.data(), p);
    DeviceBuffer dk = Upload(k), dv = Upload(v), dq = Upload(q), ds = Upload(sinks), dout = Poisoned(ref.size());
    DeviceBuffer dm = Upload(masked);
    std::vector<const float *> dkb, dvb;
    for (int p0 = 0; p0 < n_ctx; p0 += bt) {
      dkb.push_back(dk.as<float>() + static_cast<int64_t>(p0) * k_width);
      dvb.push_back(dv.as<float>() + static_cast<int64_t>(p0) * v_width);
    }
    DeviceBuffer dkt = Upload(dkb), dvt = Upload(dvb);
    AttentionExtArgs a;
    a.k_blocks = dkt.as<const float *>();
    a.v_blocks = dvt.as<const float *>();
    a.block_tokens = bt;
    a.masked = dm.as<uint8_t>();
    a.k_stride = k_width;
    a.v_stride = v_width;
    a.pos0 = pos0;
    a.n_head = n_head;
    a.n_head_kv = n_head_kv;
    a.head_dim = head_dim;
    a.v_dim = v_dim;
    a.window = c.window;
    a.latent = c.latent;
    a.scale = c.scale != 0.f ? c.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
    a.sinks = c.sinks ? ds.as<float>() : nullptr;
    const size_t ws_bytes = AttentionExtWorkspaceBytes(a, n_tok);
    CHECK((ws_bytes > 0) == (pos0 + n_tok > kAttnChunk));  // the long cases take the split path
    DeviceBuffer dws = Poisoned(std::max<size_t>(ws_bytes / sizeof(float), 1));
    REQUIRE(AttentionExt(dq.as<float>(), a, n_tok, dout.as<float>(), nullptr, Workspace{dws.data(), ws_bytes}).ok());
    CHECK(RelL2(Download<float>(dout, ref.size()), ref) <= 1e-5);
  }
}

// Rows mode (a decode step of several sessions): each row its own position, tables, window and
// mask; K/V rows written through the tables first. Against the CPU's attention on each row alone.
TEST_CASE("Attention and K/V writes over per-row references match the CPU backend row by row", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu(1);
  const int n_head = 4, n_head_kv = 2, head_dim = 32, bt = 8, n_ctx = 320;
  const int k_width = n_head_kv * head_dim;
  // Two caches (sessions); rows: (cache, position, window, masked).
  struct Row { int cache, pos, window; bool masked; };
  const Row rows[] = {{0, 0, 0, false}, {1, 300, 0, true}, {0, 77, 16, true}, {1, 130, 0, false}, {0, 5, 3, false}};
  const int64_t n = std::size(rows);
  std::vector<float> k[2], v[2];
  DeviceBuffer dk[2], dv[2], dkt[2], dvt[2];
  std::vector<uint8_t> masked(n_ctx, 0);
  for (int p0 = 1; p0 < n_ctx; p0 += 3) masked[p0] = 1;
  DeviceBuffer dm = Upload(masked);
  for (int c = 0; c < 2; ++c) {
    k[c] = RandomFloats(rng, n_ctx * k_width);
    v[c] = RandomFloats(rng, n_ctx * k_width);
    dk[c] = Upload(k[c]);
    dv[c] = Upload(v[c]);
    std::vector<float *> kb, vb;
    for (int p0 = 0; p0 < n_ctx; p0 += bt) {
      kb.push_back(dk[c].as<float>() + static_cast<int64_t>(p0) * k_width);
      vb.push_back(dv[c].as<float>() + static_cast<int64_t>(p0) * k_width);
    }
    dkt[c] = Upload(kb);
    dvt[c] = Upload(vb);
  }
  // The rows' own K/V (fresh), written by WriteKvRows on the device and by hand on the host.
  const std::vector<float> nk = RandomFloats(rng, n * k_width), nv = RandomFloats(rng, n * k_width);
  std::vector<model::KvRowRef> refs;
  for (int64_t t = 0; t < n; ++t) {
    const Row &r = rows[t];
    refs.push_back(model::KvRowRef{dkt[r.cache].as<float *>(), dvt[r.cache].as<float *>(),
                                   r.masked ? dm.as<uint8_t>() : nullptr, r.pos, r.window});
    std::copy(nk.begin() + t * k_width, nk.begin() + (t + 1) * k_width, k[r.cache].begin() + r.pos * k_width);
    std::copy(nv.begin() + t * k_width, nv.begin() + (t + 1) * k_width, v[r.cache].begin() + r.pos * k_width);
  }
  DeviceBuffer drefs = Upload(refs), dnk = Upload(nk), dnv = Upload(nv);
  REQUIRE(WriteKvRows(drefs.as<model::KvRowRef>(), n, dnk.as<float>(), dnv.as<float>(), k_width, k_width, bt, nullptr)
              .ok());
  for (int c = 0; c < 2; ++c) {
    CHECK(Download<float>(dk[c], k[c].size()) == k[c]);
    CHECK(Download<float>(dv[c], v[c].size()) == v[c]);
  }
  const std::vector<float> q = RandomFloats(rng, n * n_head * head_dim), sinks = RandomFloats(rng, n_head);
  for (bool with_sinks : {false, true}) {
    INFO("sinks " << with_sinks);
    model::AttentionParams p;
    if (with_sinks) p.sinks = sinks.data();
    std::vector<float> ref(n * n_head * head_dim);
    for (int64_t t = 0; t < n; ++t) {
      const Row &r = rows[t];
      model::ContiguousKv ckv(k[r.cache].data(), v[r.cache].data(), n_ctx, k_width, k_width);
      model::KvView view = ckv.view();
      view.masked = r.masked ? masked.data() : nullptr;
      cpu.Attention(q.data() + t * n_head * head_dim, view, 1, r.pos, n_head, n_head_kv, head_dim, r.window,
                    ref.data() + t * n_head * head_dim, p);
    }
    DeviceBuffer dq = Upload(q), ds = Upload(sinks), dout = Poisoned(ref.size());
    AttentionExtArgs a;
    a.block_tokens = bt;
    a.k_stride = a.v_stride = k_width;
    a.n_head = n_head;
    a.n_head_kv = n_head_kv;
    a.head_dim = a.v_dim = head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    a.sinks = with_sinks ? ds.as<float>() : nullptr;
    a.rows = drefs.as<model::KvRowRef>();
    a.max_keys = 512;
    const size_t ws_bytes = AttentionExtWorkspaceBytes(a, n);
    CHECK(ws_bytes == static_cast<size_t>(n) * n_head * (512 / kAttnChunk) * (head_dim + 2) * sizeof(float));
    CHECK_FALSE(AttentionExt(dq.as<float>(), a, n, dout.as<float>(), nullptr, Workspace{}).ok());  // needs ws
    DeviceBuffer dws = Poisoned(ws_bytes / sizeof(float));
    REQUIRE(AttentionExt(dq.as<float>(), a, n, dout.as<float>(), nullptr, Workspace{dws.data(), ws_bytes}).ok());
    const std::vector<float> got = Download<float>(dout, ref.size());
    CHECK(RelL2(got, ref) <= 1e-5);

    // Rows that see at most 64 keys under max_keys 64: one chunk, written directly without a sink
    // (combined with one): the same bits as the 8-chunk run above, whose other chunks are empty.
    const int64_t few[] = {0, 2, 4};
    std::vector<model::KvRowRef> refs64;
    std::vector<float> q64;
    for (int64_t t : few) {
      refs64.push_back(refs[t]);
      q64.insert(q64.end(), q.begin() + t * n_head * head_dim, q.begin() + (t + 1) * n_head * head_dim);
    }
    DeviceBuffer drefs64 = Upload(refs64), dq64 = Upload(q64), dout64 = Poisoned(q64.size());
    a.rows = drefs64.as<model::KvRowRef>();
    a.max_keys = 64;
    const size_t ws64 = AttentionExtWorkspaceBytes(a, std::size(few));
    DeviceBuffer dws64 = Poisoned(ws64 / sizeof(float));
    REQUIRE(AttentionExt(dq64.as<float>(), a, std::size(few), dout64.as<float>(), nullptr, Workspace{dws64.data(), ws64})
                .ok());
    const std::vector<float> got64 = Download<float>(dout64, q64.size());
    for (size_t i = 0; i < std::size(few); ++i) {
      INFO("row " << few[i]);
      const auto row = got.begin() + few[i] * n_head * head_dim;
      const std::vector<float> want(row, row + n_head * head_dim);
      const std::vector<float> have(got64.begin() + i * n_head * head_dim, got64.begin() + (i + 1) * n_head * head_dim);
      CHECK(have == want);
    }
  }
}

TEST_CASE("Every routing variant matches the host routing", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  for (RouteCase c : {RouteCase{model::Gating::kSoftmax, 64, 8, 1, 1, true, 1.f, false},
                      RouteCase{model::Gating::kSoftmax, 16, 4, 4, 2, false, 1.5f, false},
                      RouteCase{model::Gating::kSoftmaxSelected, 32, 4, 1, 1, false, 1.f, false},
                      RouteCase{model::Gating::kSigmoid, 64, 6, 8, 3, true, 2.5f, true},
                      RouteCase{model::Gating::kSigmoid, 256, 8, 8, 4, true, 2.5f, true}}) {
    INFO("gating " << static_cast<int>(c.gating) << " experts " << c.n_expert << " groups " << c.n_group);
    const int64_t n_tok = 11;
    std::vector<float> logits = RandomFloats(rng, n_tok * c.n_expert, -4.f, 4.f), bias = RandomFloats(rng, c.n_expert);
    model::RouteParams p;
    p.gating = c.gating;
    p.n_expert = c.n_expert;
    p.k = c.k;
    p.n_group = c.n_group;
    p.topk_group = c.topk_group;
    p.norm_topk_prob = c.norm;
    p.routed_scale = c.scale;
    p.select_bias = c.bias ? bias.data() : nullptr;
    std::vector<int32_t> ref_sel(n_tok * c.k);
    std::vector<float> ref_w(n_tok * c.k);
    for (int64_t t = 0; t < n_tok; ++t) {
      model::RouteToken(p, logits.data() + t * c.n_expert, ref_sel.data() + t * c.k, ref_w.data() + t * c.k);
    }
    DeviceBuffer dl = Upload(logits), db = Upload(bias), dw = Poisoned(n_tok * c.k);
    auto ds = DeviceBuffer::Allocate(n_tok * c.k * sizeof(int32_t));
    REQUIRE(ds.ok());
    const RouteArgs a = DeviceRouteArgs(c, db);
    REQUIRE(Route(a, dl.as<float>(), n_tok, ds->as<int32_t>(), dw.as<float>(), nullptr).ok());
    CHECK(Download<int32_t>(*ds, n_tok * c.k) == ref_sel);
    CHECK(RelL2(Download<float>(dw, n_tok * c.k), ref_w) <= 1e-6);
  }
}

TEST_CASE("Routing, grouping and quantizing in one launch gives the bits of the three launches", "[gpu][grouped]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  for (RouteCase c : {RouteCase{model::Gating::kSoftmax, 128, 8, 1, 1, true, 1.f, false},
                      RouteCase{model::Gating::kSoftmaxSelected, 32, 4, 1, 1, false, 1.f, false},
                      RouteCase{model::Gating::kSigmoid, 256, 8, 8, 4, true, 2.5f, true}}) {
    for (int64_t n_tok : {1, 5, 8, 13, 16}) {
      for (Q8Act f : {Q8Act::kBlock256, Q8Act::kBlock32, Q8Act::kNone}) {
        INFO("gating " << static_cast<int>(c.gating) << " experts " << c.n_expert << " tokens " << n_tok
                       << " block " << (f == Q8Act::kBlock32 ? 32 : f == Q8Act::kNone ? 0 : 256));
        const int64_t cols = 768, n = n_tok * c.k, n_max = GroupMaxGroups(n_tok, c.k, c.n_expert);
        const bool quantize = f != Q8Act::kNone;  // kNone: routing and grouping alone
        const int64_t xq_bytes = quantize ? n_tok * Q8ActRowBytes(f, cols) : 0;
        DeviceBuffer dl = Upload(RandomFloats(rng, n_tok * c.n_expert, -4.f, 4.f)),
                     db = Upload(RandomFloats(rng, c.n_expert)), dh = Upload(RandomFloats(rng, n_tok * cols, -3.f, 3.f));
        const RouteArgs a = DeviceRouteArgs(c, db);
        struct Out {
          DeviceBuffer sel, wts, idx, plan, xq;
        };
        auto fresh = [&] {
          return Out{Poisoned(n), Poisoned(n), Poisoned(2 * n), Poisoned(GroupPlanInts(n_tok, c.k, c.n_expert)),
                     Poisoned((xq_bytes + 3) / 4)};
        };
        Out three = fresh(), one = fresh();
        REQUIRE(Route(a, dl.as<float>(), n_tok, three.sel.as<int32_t>(), three.wts.as<float>(), nullptr).ok());
        REQUIRE(GroupByExpert(three.sel.as<int32_t>(), n_tok, c.k, c.n_expert, three.idx.as<int32_t>(),
                              three.plan.as<int32_t>(), nullptr).ok());
        if (quantize) REQUIRE(QuantizeActivationsQ8(f, dh.as<float>(), n_tok, cols, three.xq.data(), nullptr).ok());
        REQUIRE(RouteGroupQuantize(a, dl.as<float>(), n_tok, one.sel.as<int32_t>(), one.wts.as<float>(),
                                   one.idx.as<int32_t>(), one.plan.as<int32_t>(), f, quantize ? dh.as<float>() : nullptr,
                                   cols, quantize ? one.xq.data() : nullptr, nullptr).ok());
        CHECK(Download<int32_t>(one.sel, n) == Download<int32_t>(three.sel, n));
        const std::vector<float> w1 = Download<float>(one.wts, n), w3 = Download<float>(three.wts, n);
        CHECK(std::memcmp(w1.data(), w3.data(), n * sizeof(float)) == 0);
        CHECK(Download<int32_t>(one.idx, 2 * n) == Download<int32_t>(three.idx, 2 * n));
        // The plan's specified entries: the count, the groups' experts and their first rows.
        const std::vector<int32_t> p1 = Download<int32_t>(one.plan, 2 + 2 * n_max),
                                   p3 = Download<int32_t>(three.plan, 2 + 2 * n_max);
        REQUIRE(p1[0] == p3[0]);
        REQUIRE(p1[0] >= 1);
        for (int g = 0; g < p1[0]; ++g) CHECK(p1[1 + g] == p3[1 + g]);
        for (int g = 0; g <= p1[0]; ++g) CHECK(p1[1 + n_max + g] == p3[1 + n_max + g]);
        CHECK(Download<uint8_t>(one.xq, xq_bytes) == Download<uint8_t>(three.xq, xq_bytes));
      }
    }
  }
  // Refused: more tokens than one block routes, columns off the block, a missing output, a plan of
  // copies for other experts than the routing's or without a mailbox.
  RouteArgs a;
  a.n_expert = 8;
  a.k = 2;
  auto buf = DeviceBuffer::Allocate(1 << 16);
  REQUIRE(buf.ok());
  auto *f32 = buf->as<float>();
  auto *i32 = buf->as<int32_t>();
  CHECK(StatusToMoe(RouteGroupQuantize(a, f32, kRouteGroupMaxTokens + 1, i32, f32, i32, i32, Q8Act::kBlock256, f32,
                                       256, buf->data(), nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  ColdPlan other;
  other.n_expert = a.n_expert + 1;
  other.mb.ring = reinterpret_cast<ColdRequest *>(buf->data());
  CHECK(StatusToMoe(RouteGroupQuantize(a, f32, 1, i32, f32, i32, i32, Q8Act::kNone, nullptr, 0, nullptr, nullptr,
                                       &other)) == MOE_ERR_INVALID_ARGUMENT);
  const ColdPlan no_mailbox;
  CHECK(StatusToMoe(RouteGroupQuantize(a, f32, 1, i32, f32, i32, i32, Q8Act::kNone, nullptr, 0, nullptr, nullptr,
                                       &no_mailbox)) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(RouteGroupQuantize(a, f32, 1, i32, f32, i32, i32, Q8Act::kBlock256, f32, 96, buf->data(),
                                       nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(StatusToMoe(RouteGroupQuantize(a, f32, 1, i32, f32, i32, i32, Q8Act::kBlock256, f32, 256, nullptr,
                                       nullptr)) == MOE_ERR_INVALID_ARGUMENT);
}

}  // namespace strata::cuda
