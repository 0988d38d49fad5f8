// The decode attention kernel (backends/cuda/flash_decode.cu): one token over a long KV cache of
// f32, f16 and q8_0 rows, GQA groups of 2 to 8 heads of 128, windows and masked positions, against
// the CPU backend over the same bytes; and a row's bits in a batch of rows (rows mode) are its bits
// alone, whatever the other rows' lengths.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "lib/util/tunables.h"
#include "tests/cuda/cuda_test_util.h"

namespace strata::cuda {
namespace {

using model::KvRowBytes;
using model::KvType;
using test::Download;
using test::HaveGpu;
using test::RandomFloats;
using test::RelL2;
using test::Upload;

constexpr int kD = 128;

// A cache of n_ctx positions of n_head_kv heads of 128 in types kt / vt, random rows, on the host
// and the device, with block tables of 128 positions.
struct Cache {
  int n_ctx, n_head_kv;
  KvType kt, vt;
  std::vector<uint8_t> k, v, mask;
  DeviceBuffer dk, dv, dkt, dvt, dmask;
  Cache(std::mt19937 &rng, int n_ctx_, int n_head_kv_, KvType kt_, KvType vt_)
      : n_ctx(n_ctx_), n_head_kv(n_head_kv_), kt(kt_), vt(vt_) {
    const int w = n_head_kv * kD;
    const size_t kb = KvRowBytes(kt, w), vb = KvRowBytes(vt, w);
    k.resize(n_ctx * kb);
    v.resize(n_ctx * vb);
    const std::vector<float> kf = RandomFloats(rng, static_cast<size_t>(n_ctx) * w, -2.f, 2.f);
    const std::vector<float> vf = RandomFloats(rng, static_cast<size_t>(n_ctx) * w, -2.f, 2.f);
    for (int p = 0; p < n_ctx; ++p) {
      model::EncodeKvRow(kt, kf.data() + static_cast<size_t>(p) * w, w, k.data() + p * kb);
      model::EncodeKvRow(vt, vf.data() + static_cast<size_t>(p) * w, w, v.data() + p * vb);
    }
    mask.assign(n_ctx, 0);
    for (int p = 3; p < n_ctx; p += 97) mask[p] = 1;  // a scattering of blocked positions
    dk = Upload(k);
    dv = Upload(v);
    dmask = Upload(mask);
    std::vector<const float *> ktab, vtab;
    for (int b = 0; b < n_ctx / 128; ++b) {
      ktab.push_back(reinterpret_cast<const float *>(dk.as<uint8_t>() + static_cast<size_t>(b) * 128 * kb));
      vtab.push_back(reinterpret_cast<const float *>(dv.as<uint8_t>() + static_cast<size_t>(b) * 128 * vb));
    }
    dkt = Upload(ktab);
    dvt = Upload(vtab);
  }
  AttentionExtArgs Args(int group) const {
    AttentionExtArgs a;
    a.k_blocks = dkt.as<const float *>();
    a.v_blocks = dvt.as<const float *>();
    a.block_tokens = 128;
    a.k_stride = a.v_stride = n_head_kv * kD;
    a.n_head = group * n_head_kv;
    a.n_head_kv = n_head_kv;
    a.head_dim = a.v_dim = kD;
    a.scale = 1.0f / std::sqrt(static_cast<float>(kD));
    a.masked = dmask.as<uint8_t>();
    a.k_type = kt;
    a.v_type = vt;
    return a;
  }
};

std::vector<float> Run(const AttentionExtArgs &a, int64_t n_tok, const DeviceBuffer &dq, size_t n_out) {
  const size_t ws_bytes = AttentionExtWorkspaceBytes(a, n_tok);
  const DeviceBuffer dws = test::Poisoned(std::max<size_t>(ws_bytes / sizeof(float), 1));
  const DeviceBuffer dout = test::Poisoned(n_out);
  const absl::Status st = AttentionExt(dq.as<float>(), a, n_tok, dout.as<float>(), nullptr, Workspace{dws.data(), ws_bytes});
  INFO(st.ToString());
  REQUIRE(st.ok());
  return Download<float>(dout, n_out);
}

}  // namespace

TEST_CASE("flash decode: one token over f32, f16 and q8_0 rows matches the CPU backend", "[gpu][kv]") {
  if (!HaveGpu()) return;
  std::mt19937 rng = test::Rng();
  cpu::CpuBackend cpu(2);
  struct Case {
    int group, n_head_kv, pos, window;
  };
  // One split and several, a ragged last tile, the largest split count, a window.
  for (const Case c : {Case{8, 4, 0, 0}, Case{8, 4, 100, 0}, Case{4, 2, 127, 0}, Case{2, 2, 1000, 0},
                       Case{8, 1, 9000, 0}, Case{4, 1, 20000, 0}, Case{8, 2, 5000, 700}}) {
    const std::pair<KvType, KvType> types[] = {{KvType::kF32, KvType::kF32},
                                               {KvType::kF16, KvType::kF16},
                                               {KvType::kQ8_0, KvType::kQ8_0},
                                               {KvType::kF16, KvType::kQ8_0}};
    for (auto [kt, vt] : types) {
      INFO("group " << c.group << " KV heads " << c.n_head_kv << " pos " << c.pos << " window " << c.window
                    << " keys " << model::KvTypeName(kt) << " values " << model::KvTypeName(vt));
      const int n_ctx = (c.pos + 1 + 127) / 128 * 128;
      const Cache cache(rng, n_ctx, c.n_head_kv, kt, vt);
      AttentionExtArgs a = cache.Args(c.group);
      a.pos0 = c.pos;
      a.window = c.window;
      REQUIRE(FlashDecodeApplies(a, 1));
      const std::vector<float> q = RandomFloats(rng, static_cast<size_t>(a.n_head) * kD, -2.f, 2.f);
      const DeviceBuffer dq = Upload(q);
      std::vector<float> ref(static_cast<size_t>(a.n_head) * kD);
      {
        std::vector<uint8_t> k = cache.k, v = cache.v;
        model::ContiguousKv ckv(k.data(), v.data(), n_ctx, a.k_stride, a.v_stride, kt, vt);
        model::KvView view = ckv.view();
        view.masked = cache.mask.data();
        model::AttentionParams p;
        cpu.Attention(q.data(), view, 1, c.pos, a.n_head, a.n_head_kv, kD, c.window, ref.data(), p);
      }
      const std::vector<float> got = Run(a, 1, dq, ref.size());
      CHECK(std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); }));
      // Float32 sums over the keys in another order: rounding grows with the square root of their count.
      const int keys = c.window > 0 ? std::min(c.window, c.pos + 1) : c.pos + 1;
      const double tol = std::max(2e-6, 1e-6 * std::sqrt(keys / 128.0));
      const double err = RelL2(got, ref);
      INFO("relative L2 " << err << ", tolerance " << tol);
      CHECK(err < tol);
      // The split kernel it replaces agrees to float32 rounding.
      tunables::Values knobs = tunables::Get();
      knobs.cuda_flash_decode = false;
      tunables::ScopedValues off(knobs);
      REQUIRE_FALSE(FlashDecodeApplies(a, 1));
      CHECK(RelL2(Run(a, 1, dq, ref.size()), got) < tol);
    }
  }
}

TEST_CASE("flash decode: a row's bits in a batch of rows are its bits alone", "[gpu][kv]") {
  if (!HaveGpu()) return;
  std::mt19937 rng = test::Rng();
  const int group = 8, n_head_kv = 2, n_ctx = 12800;
  for (KvType t : {KvType::kF32, KvType::kQ8_0}) {
    INFO(model::KvTypeName(t));
    const Cache cache(rng, n_ctx, n_head_kv, t, t);
    const AttentionExtArgs base = cache.Args(group);
    // Rows at positions of one split and of many, ragged tiles, one with a window.
    const std::vector<int> pos = {12799, 5, 130, 4000, 777, 12000};
    const int rows = static_cast<int>(pos.size());
    std::vector<model::KvRowRef> refs(rows);
    for (int r = 0; r < rows; ++r) {
      refs[r].k_blocks = const_cast<float *const *>(base.k_blocks);
      refs[r].v_blocks = const_cast<float *const *>(base.v_blocks);
      refs[r].masked = base.masked;
      refs[r].pos = pos[r];
      refs[r].window = r == 4 ? 300 : 0;
      refs[r].k_type = refs[r].v_type = t;
    }
    const DeviceBuffer drefs = Upload(refs);
    const size_t per_row = static_cast<size_t>(base.n_head) * kD;
    const std::vector<float> q = RandomFloats(rng, rows * per_row, -2.f, 2.f);
    const DeviceBuffer dq = Upload(q);
    AttentionExtArgs batch = base;
    batch.rows = drefs.as<model::KvRowRef>();
    batch.max_keys = n_ctx;
    REQUIRE(FlashDecodeApplies(batch, rows));
    const std::vector<float> all = Run(batch, rows, dq, rows * per_row);
    for (int r = 0; r < rows; ++r) {
      INFO("row " << r << " at " << pos[r]);
      // Alone, over the cache's tables at its position.
      AttentionExtArgs one = base;
      one.pos0 = pos[r];
      one.window = refs[r].window;
      const std::vector<float> qr(q.begin() + r * per_row, q.begin() + (r + 1) * per_row);
      const DeviceBuffer dqr = Upload(qr);
      const std::vector<float> alone = Run(one, 1, dqr, per_row);
      CHECK(std::memcmp(alone.data(), all.data() + r * per_row, per_row * sizeof(float)) == 0);
      // Alone in rows mode with a smaller bound on the keys.
      AttentionExtArgs single = base;
      const DeviceBuffer dref = Upload(std::vector<model::KvRowRef>{refs[r]});
      single.rows = dref.as<model::KvRowRef>();
      single.max_keys = pos[r] + 1;
      const std::vector<float> rowed = Run(single, 1, dqr, per_row);
      CHECK(std::memcmp(rowed.data(), alone.data(), per_row * sizeof(float)) == 0);
    }
  }
}

}  // namespace strata::cuda
