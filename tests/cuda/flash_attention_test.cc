// AttentionExt's prompt path (the flash kernel, backends/cuda/flash_attention.cu) against the CPU
// backend's Attention on fresh random inputs, outputs poisoned with NaN and cache rows past the
// chunk's last position poisoned too (the kernel must not let them into a result). Both products
// run in 3xTF32 on tensor cores: about float32's accuracy but not the CPU's order of operations,
// so results are held to 2e-5 relative L2 (a plain TF32 product would be ~1e-3 off).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_status.h"
#include "tests/cuda/cuda_test_util.h"

namespace strata::cuda {
namespace {

using test::Download;
using test::HaveGpu;
using test::Poisoned;
using test::RandomFloats;
using test::RelL2;
using test::Upload;

struct FlashCase {
  int group, n_head_kv, head_dim;
  int pos0, n_tok;
  int window;       // 0 = unlimited
  bool masked;      // every third earlier position masked
  bool sinks;
  bool latent;      // values: the key rows' first v_dim floats
  int v_dim;        // latent only
  float scale;      // 0: 1 / sqrt(head_dim)
  int block_tokens;
  bool split = false;     // the keys split into runs (a short prompt after a long context)
  bool no_split_ws = false;  // ... but called without the workspace: one unsplit pass
};

std::string Describe(const FlashCase &c) {
  return "group " + std::to_string(c.group) + " kv heads " + std::to_string(c.n_head_kv) + " head_dim " +
         std::to_string(c.head_dim) + " pos0 " + std::to_string(c.pos0) + " tokens " + std::to_string(c.n_tok) +
         " window " + std::to_string(c.window) + " masked " + std::to_string(c.masked) + " sinks " +
         std::to_string(c.sinks) + " latent " + std::to_string(c.latent) + " block " + std::to_string(c.block_tokens);
}

// Runs one case on both backends; returns the relative L2 error of the device result.
double RunCase(std::mt19937 &rng, cpu::CpuBackend &cpu, const FlashCase &c) {
  const int n_head = c.group * c.n_head_kv, head_dim = c.head_dim;
  const int v_dim = c.latent ? c.v_dim : head_dim;
  const int n_tok = c.n_tok, pos0 = c.pos0;
  // The cache covers whole blocks past the chunk; rows after its last position are NaN.
  const int last = pos0 + n_tok - 1;
  const int n_ctx = (last / c.block_tokens + 2) * c.block_tokens;
  const int k_width = c.n_head_kv * head_dim, v_width = c.latent ? 0 : k_width;
  std::vector<float> k = RandomFloats(rng, static_cast<size_t>(n_ctx) * k_width);
  std::vector<float> v = RandomFloats(rng, std::max<size_t>(1, static_cast<size_t>(n_ctx) * v_width));
  const std::vector<float> q = RandomFloats(rng, static_cast<size_t>(n_tok) * n_head * head_dim, -2.f, 2.f);
  const std::vector<float> sinks = RandomFloats(rng, n_head, -1.f, 3.f);
  std::vector<uint8_t> masked(n_ctx, 0);
  if (c.masked) {
    for (int p = 1; p < n_ctx; p += 3) masked[p] = 1;
  }
  model::AttentionParams p;
  p.scale = c.scale;
  p.latent = c.latent;
  p.v_dim = v_dim;
  if (c.sinks) p.sinks = sinks.data();
  std::vector<float> ref(static_cast<size_t>(n_tok) * n_head * v_dim);
  {
    model::ContiguousKv ckv(k.data(), v.data(), n_ctx, k_width, v_width);
    model::KvView view = ckv.view();
    view.masked = c.masked ? masked.data() : nullptr;
    cpu.Attention(q.data(), view, n_tok, pos0, n_head, c.n_head_kv, head_dim, c.window, ref.data(), p);
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::fill(k.begin() + static_cast<int64_t>(last + 1) * k_width, k.end(), nan);
  if (!c.latent) std::fill(v.begin() + static_cast<int64_t>(last + 1) * v_width, v.end(), nan);
  DeviceBuffer dk = Upload(k), dv = Upload(v), dq = Upload(q), ds = Upload(sinks), dm = Upload(masked);
  DeviceBuffer dout = Poisoned(ref.size());
  // The device blocks in reverse order of the memory, so a kernel that ignored the tables would
  // read the wrong rows.
  const int n_blocks = n_ctx / c.block_tokens;
  std::vector<const float *> kb(n_blocks), vb(n_blocks);
  std::vector<float> k_perm(k.size()), v_perm(v.size());
  for (int b = 0; b < n_blocks; ++b) {
    const int slot = n_blocks - 1 - b;
    const int64_t kr = static_cast<int64_t>(c.block_tokens) * k_width, vr = static_cast<int64_t>(c.block_tokens) * v_width;
    std::copy(k.begin() + b * kr, k.begin() + (b + 1) * kr, k_perm.begin() + slot * kr);
    if (!c.latent) std::copy(v.begin() + b * vr, v.begin() + (b + 1) * vr, v_perm.begin() + slot * vr);
    kb[b] = dk.as<float>() + slot * kr;
    vb[b] = c.latent ? nullptr : dv.as<float>() + slot * vr;
  }
  REQUIRE(cudaMemcpy(dk.data(), k_perm.data(), k_perm.size() * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
  if (!c.latent) {
    REQUIRE(cudaMemcpy(dv.data(), v_perm.data(), v_perm.size() * sizeof(float), cudaMemcpyHostToDevice) ==
            cudaSuccess);
  }
  DeviceBuffer dkt = Upload(kb), dvt = Upload(vb);
  AttentionExtArgs a;
  a.k_blocks = dkt.as<const float *>();
  a.v_blocks = dvt.as<const float *>();
  a.block_tokens = c.block_tokens;
  a.k_stride = k_width;
  a.v_stride = v_width;
  a.pos0 = pos0;
  a.n_head = n_head;
  a.n_head_kv = c.n_head_kv;
  a.head_dim = head_dim;
  a.v_dim = v_dim;
  a.window = c.window;
  a.latent = c.latent;
  a.scale = c.scale != 0.f ? c.scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  a.sinks = c.sinks ? ds.as<float>() : nullptr;
  a.masked = c.masked ? dm.as<uint8_t>() : nullptr;
  const bool flash = FlashAttentionApplies(a, n_tok);
  CHECK(flash == (n_tok >= 16 || (n_tok >= 2 && n_tok * c.group >= 32 && (head_dim == 64 || head_dim == 128))));
  if (c.split) CHECK(AttentionExtWorkspaceBytes(a, n_tok) > 0);  // the split's scratch
  const size_t ws_bytes = c.no_split_ws ? 0 : AttentionExtWorkspaceBytes(a, n_tok);
  DeviceBuffer dws = Poisoned(std::max<size_t>(ws_bytes / sizeof(float), 1));
  const absl::Status st = AttentionExt(dq.as<float>(), a, n_tok, dout.as<float>(), nullptr, Workspace{dws.data(), ws_bytes});
  INFO(st.ToString());
  REQUIRE(st.ok());
  return RelL2(Download<float>(dout, ref.size()), ref);
}

}  // namespace

TEST_CASE("Flash attention over block tables matches the CPU backend for GQA groups, head dims and prompt lengths",
          "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu(4);
  // Lengths around the kernel's dispatch (15 / 16 tokens; a group of 8 from 4, of 4 from 8), its
  // 64-row tiles and its key tiles, up to ~2,000;
  // chunks at position 0 and after earlier chunks.
  for (int group : {1, 4, 8}) {
    for (int head_dim : {64, 128}) {
      for (int n_tok : {1, 3, 4, 7, 8, 15, 16, 17, 63, 64, 65, 200, 777, 2000}) {
        for (int pos0 : {0, 300}) {
          if (n_tok == 2000 && pos0 > 0 && group == 1) continue;  // keeps the CPU side short
          const FlashCase c{group, 2, head_dim, pos0, n_tok, 0, false, false, false, 0, 0.f, 128};
          INFO(Describe(c));
          CHECK(RunCase(rng, cpu, c) <= 2e-5);
        }
      }
    }
  }
}

TEST_CASE("Flash attention with windows, masks, sinks, latent values, a set scale and odd block sizes matches the "
          "CPU backend",
          "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu(4);
  const FlashCase cases[] = {
      // windows (shorter than, across and longer than the chunk), gpt-oss's shape: 64, group 8, sinks
      {8, 1, 64, 0, 300, 128, false, true, false, 0, 0.f, 128},
      {8, 1, 64, 500, 129, 128, false, true, false, 0, 0.f, 128},
      {8, 2, 64, 37, 400, 33, false, false, false, 0, 0.f, 128},
      {4, 2, 128, 1000, 50, 4096, false, false, false, 0, 0.f, 128},
      // masked positions (blocked tokens), alone and with a window and sinks
      {4, 2, 128, 211, 90, 0, true, false, false, 0, 0.f, 128},
      {1, 3, 64, 70, 300, 45, true, true, false, 0, 0.37f, 128},
      // latent values (one KV head, values the first v_dim floats of the keys)
      {16, 1, 128, 0, 100, 0, false, false, true, 96, 0.21f, 128},
      {8, 1, 64, 129, 64, 0, true, true, true, 64, 0.f, 128},
      // groups that do not divide the 64-row tile, blocks that split key tiles
      {3, 2, 128, 5, 120, 0, false, true, false, 0, 0.f, 8},
      {6, 1, 64, 250, 77, 60, true, false, false, 0, 0.f, 48},
      {64, 1, 64, 0, 20, 0, false, false, false, 0, 0.f, 128},
      // large scores (a set scale of 1): the online softmax's rescaling must hold
      {4, 1, 128, 600, 300, 0, false, true, false, 0, 1.f, 128},
      // short prompts after long contexts: the keys split into runs (some empty for a window's
      // rows), combined with the sinks; and the same without the workspace, unsplit
      {8, 2, 128, 5000, 40, 0, true, true, false, 0, 0.f, 128, true},
      {4, 1, 64, 3000, 100, 500, true, true, false, 0, 0.f, 128, true},
      {1, 4, 128, 2000, 16, 0, false, false, false, 0, 0.f, 48, true},
      {16, 1, 128, 4000, 30, 0, false, true, true, 80, 0.f, 128, true},
      {8, 2, 128, 5000, 40, 0, true, true, false, 0, 0.f, 128, true, true},
  };
  for (const FlashCase &c : cases) {
    INFO(Describe(c));
    // Over thousands of keys, split into runs and combined, the float32 sums of the kernel and of
    // the CPU reference, in their different orders, part by more (a measured 3.6e-5 at 5,040 keys).
    CHECK(RunCase(rng, cpu, c) <= (c.pos0 >= 2000 ? 1e-4 : 2e-5));
  }
}

// A token's output bits do not depend on how its prompt is cut into calls (unsplit: no workspace),
// so a session rewound and fed again, or fed in other chunks, gets the same numbers.
TEST_CASE("Flash attention gives a token the same bits however the prompt is cut into calls", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  struct Cut { int group, n_head_kv, head_dim, window; bool masked, sinks; int n, cut; };
  for (const Cut &c : {Cut{4, 2, 128, 70, true, true, 300, 120}, Cut{8, 1, 64, 0, false, false, 333, 17},
                       Cut{1, 2, 64, 100, true, false, 260, 131}}) {
    INFO("group " << c.group << " head_dim " << c.head_dim << " window " << c.window << " cut at " << c.cut);
    const int n_head = c.group * c.n_head_kv, width = c.n_head_kv * c.head_dim, bt = 128;
    const int n_ctx = (c.n + bt - 1) / bt * bt;
    DeviceBuffer dk = Upload(RandomFloats(rng, static_cast<size_t>(n_ctx) * width));
    DeviceBuffer dv = Upload(RandomFloats(rng, static_cast<size_t>(n_ctx) * width));
    std::vector<uint8_t> masked(n_ctx, 0);
    if (c.masked) {
      for (int p = 2; p < n_ctx; p += 7) masked[p] = 1;
    }
    DeviceBuffer dm = Upload(masked), ds = Upload(RandomFloats(rng, n_head));
    std::vector<const float *> kb, vb;
    for (int p = 0; p < n_ctx; p += bt) {
      kb.push_back(dk.as<float>() + static_cast<int64_t>(p) * width);
      vb.push_back(dv.as<float>() + static_cast<int64_t>(p) * width);
    }
    DeviceBuffer dkt = Upload(kb), dvt = Upload(vb);
    const std::vector<float> q = RandomFloats(rng, static_cast<size_t>(c.n) * n_head * c.head_dim);
    AttentionExtArgs a;
    a.k_blocks = dkt.as<const float *>();
    a.v_blocks = dvt.as<const float *>();
    a.block_tokens = bt;
    a.k_stride = a.v_stride = width;
    a.n_head = n_head;
    a.n_head_kv = c.n_head_kv;
    a.head_dim = a.v_dim = c.head_dim;
    a.window = c.window;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    a.masked = c.masked ? dm.as<uint8_t>() : nullptr;
    a.sinks = c.sinks ? ds.as<float>() : nullptr;
    const int64_t row = static_cast<int64_t>(n_head) * c.head_dim;
    auto run = [&](int pos0, int n_tok) {
      a.pos0 = pos0;
      REQUIRE(FlashAttentionApplies(a, n_tok));
      const std::vector<float> qq(q.begin() + pos0 * row, q.begin() + (pos0 + n_tok) * row);
      DeviceBuffer dq = Upload(qq), dout = Poisoned(qq.size());
      REQUIRE(AttentionExt(dq.as<float>(), a, n_tok, dout.as<float>(), nullptr).ok());
      return Download<float>(dout, qq.size());
    };
    const std::vector<float> whole = run(0, c.n), first = run(0, c.cut), rest = run(c.cut, c.n - c.cut);
    CHECK(first == std::vector<float>(whole.begin(), whole.begin() + c.cut * row));
    CHECK(rest == std::vector<float>(whole.begin() + c.cut * row, whole.end()));
  }
}

TEST_CASE("FlashAttention refuses calls it cannot take", "[gpu]") {
  AttentionExtArgs a;
  a.block_tokens = 128;
  a.n_head = 8;
  a.n_head_kv = 2;
  a.head_dim = a.v_dim = 96;  // neither 64 nor 128
  a.k_stride = a.v_stride = 192;
  CHECK_FALSE(FlashAttentionApplies(a, 100));
  CHECK(StatusToMoe(FlashAttention(nullptr, a, 100, nullptr, nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  a.head_dim = a.v_dim = 128;
  a.k_stride = a.v_stride = 256;
  CHECK(FlashAttentionApplies(a, 16));
  CHECK(FlashAttentionApplies(a, 8));  // a group of 4: 32 rows
  CHECK_FALSE(FlashAttentionApplies(a, 7));
  CHECK_FALSE(FlashAttentionApplies(a, 1));
  a.n_head = 0;  // no heads: no tiles (and no division by a group of 0)
  CHECK_FALSE(FlashAttentionApplies(a, 100));
  a.n_head = 8;
  a.k_stride = 258;  // rows not in 16-byte pieces
  CHECK_FALSE(FlashAttentionApplies(a, 100));
  a.k_stride = 256;
  model::KvRowRef row;
  a.rows = &row;  // rows mode stays on the split path
  CHECK_FALSE(FlashAttentionApplies(a, 100));
  a.rows = nullptr;
  CHECK(StatusToMoe(FlashAttention(nullptr, a, 100, nullptr, nullptr)) == MOE_ERR_INVALID_ARGUMENT);  // no tables
}

}  // namespace strata::cuda

namespace strata::cuda {

// Decode over long KV (the split path): each block serves a run of a GQA group's heads from one
// read of each key and value. Against the CPU backend (same 1e-5 as the other attention tests:
// float32 dots in another order), for groups whose run covers the group, splits it, and leaves a
// partial run (6 heads in runs of 4), plus MLA's latent shape.
TEST_CASE("Split decode attention serving GQA groups matches the CPU backend", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu(4);
  const FlashCase cases[] = {
      {1, 4, 128, 3000, 1, 0, true, false, false, 0, 0.f, 128},
      {4, 4, 128, 2500, 2, 0, false, true, false, 0, 0.f, 128},
      {8, 4, 128, 4100, 1, 0, true, true, false, 0, 0.f, 128},
      {8, 1, 64, 1000, 3, 128, false, true, false, 0, 0.f, 128},
      {6, 2, 64, 700, 2, 0, true, false, false, 0, 0.f, 48},
      {16, 1, 576, 900, 1, 0, false, false, true, 512, 0.07f, 128},
  };
  for (const FlashCase &c : cases) {
    INFO(Describe(c));
    CHECK(RunCase(rng, cpu, c) <= 1e-5);
  }
}

// Rows mode (a decode step of several sessions) with a GQA group of 8 at head_dim 128: against the
// CPU row by row, and each row decoded alone gives the same bits as in the batch.
TEST_CASE("Split decode over per-row references gives each row the same bits alone and batched", "[gpu]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  cpu::CpuBackend cpu(4);
  const int n_head_kv = 2, group = 8, n_head = n_head_kv * group, head_dim = 128, bt = 128, n_ctx = 1024;
  const int k_width = n_head_kv * head_dim;
  const std::vector<float> k = RandomFloats(rng, static_cast<size_t>(n_ctx) * k_width);
  const std::vector<float> v = RandomFloats(rng, static_cast<size_t>(n_ctx) * k_width);
  std::vector<uint8_t> masked(n_ctx, 0);
  for (int p = 2; p < n_ctx; p += 5) masked[p] = 1;
  DeviceBuffer dk = Upload(k), dv = Upload(v), dm = Upload(masked);
  std::vector<float *> kb, vb;
  for (int p = 0; p < n_ctx; p += bt) {
    kb.push_back(dk.as<float>() + static_cast<int64_t>(p) * k_width);
    vb.push_back(dv.as<float>() + static_cast<int64_t>(p) * k_width);
  }
  DeviceBuffer dkt = Upload(kb), dvt = Upload(vb);
  struct Row { int pos, window; bool masked; };
  const Row rows[] = {{1000, 0, true}, {3, 0, false}, {640, 100, false}, {999, 0, false}, {64, 0, true}};
  const int64_t n = std::size(rows);
  std::vector<model::KvRowRef> refs;
  for (const Row &r : rows) {
    refs.push_back(model::KvRowRef{dkt.as<float *>(), dvt.as<float *>(), r.masked ? dm.as<uint8_t>() : nullptr, r.pos,
                                   r.window});
  }
  const std::vector<float> q = RandomFloats(rng, n * n_head * head_dim), sinks = RandomFloats(rng, n_head);
  const int64_t width = n_head * head_dim;
  for (bool with_sinks : {false, true}) {
    INFO("sinks " << with_sinks);
    model::AttentionParams p;
    if (with_sinks) p.sinks = sinks.data();
    std::vector<float> ref(n * width);
    for (int64_t t = 0; t < n; ++t) {
      model::ContiguousKv ckv(const_cast<float *>(k.data()), const_cast<float *>(v.data()), n_ctx, k_width, k_width);
      model::KvView view = ckv.view();
      view.masked = rows[t].masked ? masked.data() : nullptr;
      cpu.Attention(q.data() + t * width, view, 1, rows[t].pos, n_head, n_head_kv, head_dim, rows[t].window,
                    ref.data() + t * width, p);
    }
    DeviceBuffer ds = Upload(sinks);
    AttentionExtArgs a;
    a.block_tokens = bt;
    a.k_stride = a.v_stride = k_width;
    a.n_head = n_head;
    a.n_head_kv = n_head_kv;
    a.head_dim = a.v_dim = head_dim;
    a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    a.sinks = with_sinks ? ds.as<float>() : nullptr;
    a.max_keys = n_ctx;
    auto run = [&](const std::vector<model::KvRowRef> &rr, const std::vector<float> &qq) {
      DeviceBuffer drefs = Upload(rr), dq = Upload(qq), dout = Poisoned(qq.size());
      a.rows = drefs.as<model::KvRowRef>();
      const size_t ws_bytes = AttentionExtWorkspaceBytes(a, static_cast<int64_t>(rr.size()));
      DeviceBuffer dws = Poisoned(ws_bytes / sizeof(float));
      REQUIRE(AttentionExt(dq.as<float>(), a, static_cast<int64_t>(rr.size()), dout.as<float>(), nullptr,
                           Workspace{dws.data(), ws_bytes})
                  .ok());
      return Download<float>(dout, qq.size());
    };
    const std::vector<float> got = run(refs, q);
    CHECK(RelL2(got, ref) <= 1e-5);
    for (int64_t t = 0; t < n; ++t) {
      INFO("row " << t);
      const std::vector<float> qt(q.begin() + t * width, q.begin() + (t + 1) * width);
      const std::vector<float> alone = run({refs[t]}, qt);
      CHECK(alone == std::vector<float>(got.begin() + t * width, got.begin() + (t + 1) * width));
    }
  }
}

}  // namespace strata::cuda
