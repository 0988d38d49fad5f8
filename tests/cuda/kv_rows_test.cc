// KV rows in f16 and q8_0 on the device (backends/cuda/kv_rows.cu, the attention kernels' typed
// loads): fresh random rows encoded on the device are byte-identical to EncodeKvRow's, decode as
// DecodeKvCols, and attention over typed rows matches the CPU backend's over the same bytes.
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

// n bytes of device memory set to 0xa5, so a byte the kernel does not write differs from the host's.
DeviceBuffer PoisonedBytes(size_t n) {
  auto b = DeviceBuffer::Allocate(std::max<size_t>(n, 1));
  REQUIRE(b.ok());
  REQUIRE(cudaMemset(b->data(), 0xa5, std::max<size_t>(n, 1)) == cudaSuccess);
  return std::move(b).value();
}

// Block tables of 128 rows over a buffer of n_ctx rows of `row_bytes`, in device memory.
DeviceBuffer BlockTable(const DeviceBuffer &buf, size_t row_bytes, int n_ctx) {
  std::vector<const float *> tab;
  for (int b = 0; b < n_ctx / 128; ++b) {
    tab.push_back(reinterpret_cast<const float *>(buf.as<uint8_t>() + static_cast<size_t>(b) * 128 * row_bytes));
  }
  return Upload(tab);
}

// The attention call's shape over blocks of 128 rows (tables and types left to the caller).
AttentionExtArgs ShapeArgs(int n_head, int n_head_kv, int head_dim, int v_dim, int k_width, int v_width, int pos0,
                           bool latent) {
  AttentionExtArgs a;
  a.block_tokens = 128;
  a.k_stride = k_width;
  a.v_stride = v_width;
  a.pos0 = pos0;
  a.n_head = n_head;
  a.n_head_kv = n_head_kv;
  a.head_dim = head_dim;
  a.v_dim = v_dim;
  a.latent = latent;
  a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return a;
}

}  // namespace

TEST_CASE("KV rows: device-encoded f16 and q8_0 rows are EncodeKvRow's bytes", "[gpu][kv]") {
  if (!HaveGpu()) return;
  std::mt19937 rng = test::Rng();
  for (int width : {128, 576, 80, 16}) {  // 80 and 16: a zero-padded last q8_0 block
    const int rows = 37;
    std::vector<float> src = RandomFloats(rng, static_cast<size_t>(rows) * width, -3.f, 3.f);
    src[5] = 0.f;
    std::fill(src.begin() + width, src.begin() + std::min(2 * width, 32 + width), 0.f);  // an all-zero block
    const DeviceBuffer dsrc = Upload(src);
    for (KvType t : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
      INFO(model::KvTypeName(t) << " width " << width);
      const size_t rb = KvRowBytes(t, width);
      std::vector<uint8_t> want(rows * rb);
      for (int r = 0; r < rows; ++r) model::EncodeKvRow(t, src.data() + r * width, width, want.data() + r * rb);
      // Rows of one run (Backend::WriteKvBytes).
      const DeviceBuffer dst = PoisonedBytes(want.size());
      REQUIRE(EncodeKvRows(dst.as<uint8_t>(), static_cast<int64_t>(rb), dsrc.as<float>(), width, rows, width, t,
                           nullptr)
                  .ok());
      CHECK(Download<uint8_t>(dst, want.size()) == want);
      // Back to floats: DecodeKvCols' values exactly.
      std::vector<float> dec(static_cast<size_t>(rows) * width);
      for (int r = 0; r < rows; ++r) model::DecodeKvCols(t, want.data() + r * rb, 0, width, dec.data() + r * width);
      const DeviceBuffer dout = test::Poisoned(dec.size());
      REQUIRE(DecodeKvRows(dout.as<float>(), width, dst.as<uint8_t>(), static_cast<int64_t>(rb), rows, width, t,
                           nullptr)
                  .ok());
      const std::vector<float> got = Download<float>(dout, dec.size());
      CHECK(std::memcmp(got.data(), dec.data(), dec.size() * sizeof(float)) == 0);
      // A decode step's rows (WriteKvRows): row r at position 3 r + 1 of a two-block table.
      const int block = 64, n_ctx = 2 * block * 2;
      const DeviceBuffer cache = PoisonedBytes(static_cast<size_t>(n_ctx) * rb);
      std::vector<float *> tab;
      for (int b = 0; b < n_ctx / block; ++b) {
        tab.push_back(reinterpret_cast<float *>(cache.as<uint8_t>() + static_cast<size_t>(b) * block * rb));
      }
      const DeviceBuffer dtab = Upload(tab);
      std::vector<model::KvRowRef> refs(rows);
      for (int r = 0; r < rows; ++r) {
        refs[r].k_blocks = dtab.as<float *const>();
        refs[r].pos = 3 * r + 1;
        refs[r].k_type = t;
      }
      const DeviceBuffer drefs = Upload(refs);
      REQUIRE(WriteKvRows(drefs.as<model::KvRowRef>(), rows, dsrc.as<float>(), nullptr, width, 0, block, nullptr).ok());
      const std::vector<uint8_t> all = Download<uint8_t>(cache, static_cast<size_t>(n_ctx) * rb);
      for (int r = 0; r < rows; ++r) {
        INFO("row " << r);
        CHECK(std::memcmp(all.data() + static_cast<size_t>(3 * r + 1) * rb, want.data() + r * rb, rb) == 0);
      }
    }
  }
}

TEST_CASE("KV rows: attention over f16 and q8_0 rows matches the CPU backend over the same bytes", "[gpu][kv]") {
  if (!HaveGpu()) return;
  std::mt19937 rng = test::Rng();
  cpu::CpuBackend cpu(2);
  struct Case {
    int group, n_head_kv, head_dim, pos0, n_tok;
    bool latent;
    int v_dim;
    bool flash;  // whether the call takes the flash kernel
  };
  // Decode (one token: split path), a short prompt (one pass: head_dim 96 has no flash kernel), a
  // latent (MLA) cache whose rows' width is not a multiple of 32, and prompts the flash kernel
  // takes: head_dim 128 and 64, a 300-token prompt over three cache blocks, a latent one, and a
  // short prompt after a long context (its key tiles split into runs).
  for (const Case c : {Case{4, 2, 64, 300, 1, false, 0, false}, Case{2, 2, 96, 40, 24, false, 0, false},
                       Case{8, 1, 80, 150, 1, true, 48, false}, Case{4, 1, 80, 20, 5, true, 48, false},
                       Case{2, 2, 128, 40, 24, false, 0, true}, Case{4, 2, 128, 0, 300, false, 0, true},
                       Case{8, 1, 64, 70, 100, false, 0, true}, Case{8, 1, 128, 10, 64, true, 96, true},
                       Case{4, 2, 128, 2000, 16, false, 0, true}}) {
    for (KvType kt : {KvType::kF16, KvType::kQ8_0}) {
      for (KvType vt : {KvType::kF16, KvType::kQ8_0}) {
        INFO("keys " << model::KvTypeName(kt) << " values " << model::KvTypeName(vt) << " head_dim " << c.head_dim
                     << " pos0 " << c.pos0 << " tokens " << c.n_tok << " latent " << c.latent);
        const int n_head = c.group * c.n_head_kv, n_ctx = (c.pos0 + c.n_tok + 127) / 128 * 128;
        const int k_width = c.n_head_kv * c.head_dim, v_width = c.latent ? 0 : k_width;
        const int v_dim = c.latent ? c.v_dim : c.head_dim;
        const size_t kb = KvRowBytes(kt, k_width), vb = KvRowBytes(vt, v_width);
        std::vector<uint8_t> k(n_ctx * kb), v(std::max<size_t>(1, n_ctx * vb));
        const std::vector<float> kf = RandomFloats(rng, static_cast<size_t>(n_ctx) * k_width);
        const std::vector<float> vf = RandomFloats(rng, static_cast<size_t>(n_ctx) * std::max(v_width, 1));
        for (int p = 0; p < n_ctx; ++p) {
          model::EncodeKvRow(kt, kf.data() + static_cast<size_t>(p) * k_width, k_width, k.data() + p * kb);
          if (v_width > 0) model::EncodeKvRow(vt, vf.data() + static_cast<size_t>(p) * v_width, v_width, v.data() + p * vb);
        }
        const std::vector<float> q = RandomFloats(rng, static_cast<size_t>(c.n_tok) * n_head * c.head_dim, -2.f, 2.f);
        model::AttentionParams p;
        p.latent = c.latent;
        p.v_dim = v_dim;
        std::vector<float> ref(static_cast<size_t>(c.n_tok) * n_head * v_dim);
        {
          model::ContiguousKv ckv(k.data(), v_width > 0 ? v.data() : nullptr, n_ctx, k_width, v_width, kt, vt);
          cpu.Attention(q.data(), ckv.view(), c.n_tok, c.pos0, n_head, c.n_head_kv, c.head_dim, 0, ref.data(), p);
        }
        const DeviceBuffer dk = Upload(k), dv = Upload(v), dq = Upload(q);
        const DeviceBuffer dkt = BlockTable(dk, kb, n_ctx), dvt = BlockTable(dv, vb, n_ctx);
        AttentionExtArgs a = ShapeArgs(n_head, c.n_head_kv, c.head_dim, v_dim, k_width, v_width, c.pos0, c.latent);
        a.k_blocks = dkt.as<const float *>();
        a.v_blocks = dvt.as<const float *>();
        a.k_type = kt;
        a.v_type = c.latent ? KvType::kF32 : vt;
        REQUIRE(FlashAttentionApplies(a, c.n_tok) == c.flash);
        const size_t ws_bytes = AttentionExtWorkspaceBytes(a, c.n_tok);
        const DeviceBuffer dws = test::Poisoned(std::max<size_t>(ws_bytes / sizeof(float), 1));
        const DeviceBuffer dout = test::Poisoned(ref.size());
        const absl::Status st =
            AttentionExt(dq.as<float>(), a, c.n_tok, dout.as<float>(), nullptr, Workspace{dws.data(), ws_bytes});
        INFO(st.ToString());
        REQUIRE(st.ok());
        const double err = RelL2(Download<float>(dout, ref.size()), ref);
        INFO("relative L2 " << err);
        // Prompts over f16 keys and values run on f16 tensor cores, the weights rounded to f16.
        const bool f16_cores = c.flash && !c.latent && kt == KvType::kF16 && vt == KvType::kF16;
        CHECK(err < (f16_cores ? 5e-4 : 2e-5));
      }
    }
  }
}

}  // namespace strata::cuda

namespace strata::cuda {

// The flash kernel over typed rows decodes each tile into the floats the f32 kernel copies: over the
// same cache decoded to f32 on the host its outputs are the f32 flash kernel's bits, and they agree
// with the typed per-(token, head) kernels (STRATA_CUDA_FLASH_ATTENTION=0) to float32 rounding.
// f16 keys with f16 values take the f16 tensor-core kernel instead: within its rounding of both.
TEST_CASE("KV rows: flash attention over f16 and q8_0 rows is the f32 kernel's over their values", "[gpu][kv]") {
  if (!HaveGpu()) return;
  std::mt19937 rng = test::Rng();
  struct Case {
    int group, n_head_kv, head_dim, pos0, n_tok;
    bool latent;
    int v_dim;
  };
  // Whole query tiles, a ragged last tile after a context, a latent cache, and a short prompt after
  // a long context (split into runs of key tiles, combined).
  for (const Case c : {Case{4, 2, 128, 0, 256, false, 0}, Case{8, 1, 64, 130, 77, false, 0},
                       Case{16, 1, 128, 5, 40, true, 64}, Case{4, 2, 128, 1500, 16, false, 0}}) {
    for (KvType kt : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
      for (KvType vt : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
        if (kt == KvType::kF32 && (vt == KvType::kF32 || c.latent)) continue;
        if (c.latent && vt != KvType::kF32) continue;
        INFO("keys " << model::KvTypeName(kt) << " values " << model::KvTypeName(vt) << " head_dim " << c.head_dim
                     << " pos0 " << c.pos0 << " tokens " << c.n_tok << " latent " << c.latent);
        const int n_head = c.group * c.n_head_kv, n_ctx = (c.pos0 + c.n_tok + 127) / 128 * 128;
        const int k_width = c.n_head_kv * c.head_dim, v_width = c.latent ? 0 : k_width;
        const int v_dim = c.latent ? c.v_dim : c.head_dim;
        const size_t kb = KvRowBytes(kt, k_width), vb = KvRowBytes(vt, v_width);
        // Typed rows and their values as f32 rows.
        std::vector<uint8_t> k(n_ctx * kb), v(std::max<size_t>(1, n_ctx * vb));
        std::vector<float> kd(static_cast<size_t>(n_ctx) * k_width), vd(static_cast<size_t>(n_ctx) * std::max(v_width, 1));
        const std::vector<float> kf = RandomFloats(rng, kd.size(), -2.f, 2.f);
        const std::vector<float> vf = RandomFloats(rng, vd.size(), -2.f, 2.f);
        for (int p = 0; p < n_ctx; ++p) {
          model::EncodeKvRow(kt, kf.data() + static_cast<size_t>(p) * k_width, k_width, k.data() + p * kb);
          model::DecodeKvCols(kt, k.data() + p * kb, 0, k_width, kd.data() + static_cast<size_t>(p) * k_width);
          if (v_width > 0) {
            model::EncodeKvRow(vt, vf.data() + static_cast<size_t>(p) * v_width, v_width, v.data() + p * vb);
            model::DecodeKvCols(vt, v.data() + p * vb, 0, v_width, vd.data() + static_cast<size_t>(p) * v_width);
          }
        }
        const std::vector<float> q = RandomFloats(rng, static_cast<size_t>(c.n_tok) * n_head * c.head_dim, -2.f, 2.f);
        const DeviceBuffer dk = Upload(k), dv = Upload(v), dkd = Upload(kd), dvd = Upload(vd), dq = Upload(q);
        const DeviceBuffer dkt = BlockTable(dk, kb, n_ctx), dvt = BlockTable(dv, vb, n_ctx);
        const DeviceBuffer dkdt = BlockTable(dkd, KvRowBytes(KvType::kF32, k_width), n_ctx);
        const DeviceBuffer dvdt = BlockTable(dvd, KvRowBytes(KvType::kF32, v_width), n_ctx);
        const AttentionExtArgs a =
            ShapeArgs(n_head, c.n_head_kv, c.head_dim, v_dim, k_width, v_width, c.pos0, c.latent);
        AttentionExtArgs typed = a, plain = a;
        typed.k_blocks = dkt.as<const float *>();
        typed.v_blocks = dvt.as<const float *>();
        typed.k_type = kt;
        typed.v_type = vt;
        plain.k_blocks = dkdt.as<const float *>();
        plain.v_blocks = dvdt.as<const float *>();
        const size_t n_out = static_cast<size_t>(c.n_tok) * n_head * v_dim;
        auto run = [&](const AttentionExtArgs &args) {
          const size_t ws_bytes = AttentionExtWorkspaceBytes(args, c.n_tok);
          const DeviceBuffer dws = test::Poisoned(std::max<size_t>(ws_bytes / sizeof(float), 1));
          const DeviceBuffer dout = test::Poisoned(n_out);
          const absl::Status st =
              AttentionExt(dq.as<float>(), args, c.n_tok, dout.as<float>(), nullptr, Workspace{dws.data(), ws_bytes});
          INFO(st.ToString());
          REQUIRE(st.ok());
          return Download<float>(dout, n_out);
        };
        REQUIRE(FlashAttentionApplies(typed, c.n_tok));
        REQUIRE(FlashAttentionApplies(plain, c.n_tok));
        REQUIRE(AttentionExtWorkspaceBytes(typed, c.n_tok) == AttentionExtWorkspaceBytes(plain, c.n_tok));
        const std::vector<float> flash_typed = run(typed), flash_plain = run(plain);
        CHECK(std::all_of(flash_typed.begin(), flash_typed.end(), [](float x) { return std::isfinite(x); }));
        // f16 keys and values take the f16 tensor-core kernel (weights rounded to f16): within its
        // rounding of the f32 kernel's bits; every other pair decodes into the f32 kernel's tiles.
        if (!c.latent && kt == KvType::kF16 && vt == KvType::kF16) {
          CHECK(RelL2(flash_typed, flash_plain) < 5e-4);
        } else {
          CHECK(std::memcmp(flash_typed.data(), flash_plain.data(), n_out * sizeof(float)) == 0);
        }
        // The per-(token, head) kernels over the same typed rows.
        tunables::Values knobs = tunables::Get();
        knobs.cuda_flash_attention = false;
        std::vector<float> other;
        {
          tunables::ScopedValues scoped(knobs);
          REQUIRE_FALSE(FlashAttentionApplies(typed, c.n_tok));
          other = run(typed);
        }
        const double err = RelL2(flash_typed, other);
        INFO("relative L2, flash vs per-(token, head) " << err);
        CHECK(err < (!c.latent && kt == KvType::kF16 && vt == KvType::kF16 ? 5e-4 : 1e-5));
      }
    }
  }
}

}  // namespace strata::cuda
