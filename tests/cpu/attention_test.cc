// The CPU backend's tiled attention against a plain per-query reference (two-pass softmax in
// double over the same stored rows, decoded), on fresh random inputs with long prompts starting
// past position 0, for every KV type and every family's variant (GQA, windows, masks, sinks, MLA's
// latent values); its numbers bit-identical across thread counts and however a prompt is split
// into calls; and the AVX2 + F16C kernels' numbers bit-identical to the baseline kernels'.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/attention.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels/kernels.h"
#include "lib/model/backend.h"
#include "lib/util/thread_pool.h"

namespace {

using strata::ThreadPool;
using strata::cpu::CpuBackend;
using strata::cpu::kernels::Isa;
using strata::model::AttentionParams;
using strata::model::ContiguousKv;
using strata::model::KvRowBytes;
using strata::model::KvType;
using strata::model::KvView;

struct Shape {
  const char *name;
  int n_head, n_head_kv, head_dim;
  int window;
  bool sinks, latent, masked;
  int v_dim;  // latent only
};

// Random rows of `width` floats for n positions, stored in type t.
std::vector<uint8_t> RandomRows(std::mt19937 &rng, int n, int width, KvType t) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> out(static_cast<size_t>(n) * KvRowBytes(t, width));
  std::vector<float> row(width);
  for (int p = 0; p < n; ++p) {
    for (float &x : row) x = nd(rng);
    strata::model::EncodeKvRow(t, row.data(), width, out.data() + p * KvRowBytes(t, width));
  }
  return out;
}

// Random rows whose magnitudes spread over many binades (each row scaled by 10^u, u in [-6, 1)): f16
// subnormals, q8_0 blocks with tiny scales, and scores far enough apart that a tile's new maximum
// rescales what came before.
std::vector<uint8_t> SpreadRows(std::mt19937 &rng, int n, int width, KvType t) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> u(-6.f, 1.f);
  std::vector<uint8_t> out(static_cast<size_t>(n) * KvRowBytes(t, width));
  std::vector<float> row(width);
  for (int p = 0; p < n; ++p) {
    const float scale = std::pow(10.f, u(rng));
    for (float &x : row) x = nd(rng) * scale;
    strata::model::EncodeKvRow(t, row.data(), width, out.data() + p * KvRowBytes(t, width));
  }
  return out;
}

// The reference: each (row, head) on its own, scores and softmax in double.
std::vector<float> Reference(const float *q, const KvView &kv, int n_tok, int pos0, const Shape &s, float scale,
                             const float *sinks) {
  const int group = s.n_head / s.n_head_kv, v_dim = s.latent ? s.v_dim : s.head_dim;
  std::vector<float> out(static_cast<size_t>(n_tok) * s.n_head * v_dim);
  std::vector<float> kr(s.head_dim), vr(v_dim);
  std::vector<double> sc, acc(v_dim);
  for (int t = 0; t < n_tok; ++t) {
    const int pos = pos0 + t, first = s.window > 0 ? std::max(0, pos - s.window + 1) : 0;
    for (int h = 0; h < s.n_head; ++h) {
      const int kvh = h / group;
      const float *qh = q + (static_cast<size_t>(t) * s.n_head + h) * s.head_dim;
      sc.assign(pos + 1 - first, -INFINITY);
      double mx = sinks != nullptr ? sinks[h] : -INFINITY;
      for (int j = first; j <= pos; ++j) {
        if (j != pos && kv.is_masked(j)) continue;
        strata::model::DecodeKvCols(kv.k_type, kv.k_row(j), s.latent ? 0 : kvh * s.head_dim, s.head_dim, kr.data());
        double d = 0;
        for (int i = 0; i < s.head_dim; ++i) d += static_cast<double>(qh[i]) * kr[i];
        sc[j - first] = d * scale;
        mx = std::max(mx, sc[j - first]);
      }
      double sum = sinks != nullptr ? std::exp(sinks[h] - mx) : 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = first; j <= pos; ++j) {
        if (j != pos && kv.is_masked(j)) continue;
        const double e = std::exp(sc[j - first] - mx);
        sum += e;
        if (s.latent) {
          strata::model::DecodeKvCols(kv.k_type, kv.k_row(j), 0, v_dim, vr.data());
        } else {
          strata::model::DecodeKvCols(kv.v_type, kv.v_row(j), kvh * s.head_dim, v_dim, vr.data());
        }
        for (int d = 0; d < v_dim; ++d) acc[d] += e * vr[d];
      }
      float *o = out.data() + (static_cast<size_t>(t) * s.n_head + h) * v_dim;
      for (int d = 0; d < v_dim; ++d) o[d] = static_cast<float>(acc[d] / sum);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("tiled CPU attention matches the per-query reference and is bit-identical however it runs",
          "[cpu][attention]") {
  const Shape shapes[] = {
      {"gqa", 4, 2, 32, 0, false, false, false, 0},
      {"gqa masked, window, sinks (gpt-oss), head_dim 16", 4, 2, 16, 300, true, false, true, 0},
      {"latent (MLA), 40-wide rows", 4, 1, 40, 0, false, true, true, 32},
  };
  const std::pair<KvType, KvType> types[] = {
      {KvType::kF32, KvType::kF32}, {KvType::kF16, KvType::kF16}, {KvType::kQ8_0, KvType::kQ8_0},
      {KvType::kQ8_0, KvType::kF16}};
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  CpuBackend one(1), three(3);
  for (const Shape &s : shapes) {
    for (const auto &[kt, vt] : types) {
      INFO(s.name << ", K " << strata::model::KvTypeName(kt) << ", V " << strata::model::KvTypeName(vt));
      const int pos0 = 37 + static_cast<int>(rng() % 200), n_tok = 1500, n_ctx = pos0 + n_tok;
      const int k_width = s.n_head_kv * s.head_dim, v_width = s.latent ? 0 : k_width;
      std::vector<uint8_t> k = RandomRows(rng, n_ctx, k_width, kt);
      std::vector<uint8_t> v = s.latent ? std::vector<uint8_t>{} : RandomRows(rng, n_ctx, v_width, vt);
      ContiguousKv ckv(k.data(), s.latent ? nullptr : v.data(), n_ctx, k_width, v_width, kt, vt);
      KvView kv = ckv.view();
      std::vector<uint8_t> mask(n_ctx, 0);
      if (s.masked) {
        for (auto &m : mask) m = rng() % 7 == 0 ? 1 : 0;
        kv.masked = mask.data();
      }
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> q(static_cast<size_t>(n_tok) * s.n_head * s.head_dim), sinks(s.n_head);
      for (float &x : q) x = nd(rng);
      for (float &x : sinks) x = nd(rng);
      AttentionParams p;
      p.scale = 0.7f / std::sqrt(static_cast<float>(s.head_dim));
      if (s.sinks) p.sinks = sinks.data();
      p.latent = s.latent;
      p.v_dim = s.v_dim;
      const int v_dim = s.latent ? s.v_dim : s.head_dim;
      const size_t out_row = static_cast<size_t>(s.n_head) * v_dim;
      const size_t out_n = static_cast<size_t>(n_tok) * out_row;
      // Poisoned outputs: every element must be written.
      std::vector<float> all(out_n, std::nanf("")), split(out_n, std::nanf(""));
      three.Attention(q.data(), kv, n_tok, pos0, s.n_head, s.n_head_kv, s.head_dim, s.window, all.data(), p);
      const std::vector<float> ref = Reference(q.data(), kv, n_tok, pos0, s, p.scale, p.sinks);
      double err = 0;
      for (size_t i = 0; i < out_n; ++i) {
        REQUIRE(std::isfinite(all[i]));
        err = std::max(err, std::fabs(static_cast<double>(all[i]) - ref[i]));
      }
      CHECK(err < 2e-5);
      // The same prompt in calls of uneven sizes on one thread (single rows among them, as decode
      // steps run): every byte equal.
      for (int t = 0; t < n_tok;) {
        const int n = std::min(n_tok - t, static_cast<int>(rng() % 3 == 0 ? 1 : 1 + rng() % 300));
        one.Attention(q.data() + static_cast<size_t>(t) * s.n_head * s.head_dim, kv, n, pos0 + t, s.n_head,
                      s.n_head_kv, s.head_dim, s.window, split.data() + t * out_row, p);
        t += n;
      }
      CHECK(std::memcmp(all.data(), split.data(), out_n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("AVX2 attention kernels give the baseline kernels' bits", "[cpu][attention][avx2]") {
  if (strata::cpu::kernels::BestIsa() == Isa::kScalar) {
    WARN("this CPU lacks AVX2 + F16C: only the baseline kernels run here");
    return;
  }
  const Shape shapes[] = {
      {"MHA, head_dim 128 (OLMoE)", 4, 4, 128, 0, false, false, false, 0},
      {"GQA 4, head_dim 64, masked, window 100, sinks", 8, 2, 64, 100, true, false, true, 0},
      {"GQA 8, head_dim 80, masked", 8, 1, 80, 0, false, false, true, 0},
      {"GQA 2, head_dim 96, window 300", 4, 2, 96, 300, false, false, false, 0},
      // Heads 20 columns apart: q8_0 blocks straddled, widths that are not a multiple of 8.
      {"GQA 3, head_dim 20, masked, sinks", 9, 3, 20, 0, true, false, true, 0},
      {"latent (MLA), 72-wide rows, v_dim 64, masked", 8, 1, 72, 0, false, true, true, 64},
      {"latent, 44-wide rows, v_dim 36, window 50, sinks", 4, 1, 44, 50, true, true, false, 36},
  };
  const KvType kv_types[] = {KvType::kF32, KvType::kF16, KvType::kQ8_0};
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  ThreadPool one(1), three(3);
  for (const Shape &s : shapes) {
    for (KvType kt : kv_types) {
      for (KvType vt : kv_types) {
        if (s.latent && vt != KvType::kF32) continue;  // latent values are the k rows
        INFO(s.name << ", K " << strata::model::KvTypeName(kt) << ", V " << strata::model::KvTypeName(vt));
        const int pos0 = static_cast<int>(rng() % 150), n_tok = 150 + static_cast<int>(rng() % 200);
        const int n_ctx = pos0 + n_tok;
        const int k_width = s.n_head_kv * s.head_dim, v_width = s.latent ? 0 : k_width;
        std::vector<uint8_t> k = SpreadRows(rng, n_ctx, k_width, kt);
        std::vector<uint8_t> v = s.latent ? std::vector<uint8_t>{} : SpreadRows(rng, n_ctx, v_width, vt);
        ContiguousKv ckv(k.data(), s.latent ? nullptr : v.data(), n_ctx, k_width, v_width, kt, vt);
        KvView kv = ckv.view();
        std::vector<uint8_t> mask(n_ctx, 0);
        if (s.masked) {
          for (auto &m : mask) m = rng() % 5 == 0 ? 1 : 0;
          kv.masked = mask.data();
        }
        std::normal_distribution<float> nd(0.f, 1.f);
        std::vector<float> q(static_cast<size_t>(n_tok) * s.n_head * s.head_dim), sinks(s.n_head);
        for (float &x : q) x = nd(rng) * 3.f;
        for (float &x : sinks) x = nd(rng);
        AttentionParams p;  // scale 0: 1 / sqrt(head_dim), half the cases a given scale
        if (rng() % 2 == 0) p.scale = 0.7f / std::sqrt(static_cast<float>(s.head_dim));
        if (s.sinks) p.sinks = sinks.data();
        p.latent = s.latent;
        p.v_dim = s.v_dim;
        const int v_dim = s.latent ? s.v_dim : s.head_dim;
        const size_t out_row = static_cast<size_t>(s.n_head) * v_dim, out_n = static_cast<size_t>(n_tok) * out_row;
        const size_t q_row = static_cast<size_t>(s.n_head) * s.head_dim;
        // The prompt in one call or in calls of uneven sizes (single rows among them), into a poisoned
        // output.
        auto run = [&](ThreadPool &pool, Isa isa, bool split) {
          std::vector<float> out(out_n, std::nanf(""));
          std::mt19937 cuts(seed ^ n_tok);
          for (int t = 0; t < n_tok;) {
            const int n = split ? std::min(n_tok - t, static_cast<int>(cuts() % 3 == 0 ? 1 : 1 + cuts() % 40)) : n_tok;
            strata::cpu::TiledAttention(pool, q.data() + t * q_row, kv, n, pos0 + t, s.n_head, s.n_head_kv,
                                        s.head_dim, s.window, out.data() + t * out_row, p, isa);
            t += n;
          }
          return out;
        };
        const std::vector<float> base = run(one, Isa::kScalar, false);
        REQUIRE(std::all_of(base.begin(), base.end(), [](float x) { return std::isfinite(x); }));
        for (ThreadPool *pool : {&one, &three}) {
          for (bool split : {false, true}) {
            INFO((pool == &one ? "1 thread" : "3 threads") << (split ? ", split into calls" : ", one call"));
            CHECK(std::memcmp(run(*pool, Isa::kAvx2, split).data(), base.data(), out_n * sizeof(float)) == 0);
          }
        }
        // Decode steps: one row alone, past the prompt's start.
        for (int i = 0; i < 4; ++i) {
          const int t = static_cast<int>(rng() % n_tok);
          std::vector<float> a(out_row, std::nanf("")), b(out_row, std::nanf(""));
          strata::cpu::TiledAttention(three, q.data() + t * q_row, kv, 1, pos0 + t, s.n_head, s.n_head_kv,
                                      s.head_dim, s.window, a.data(), p, Isa::kScalar);
          strata::cpu::TiledAttention(three, q.data() + t * q_row, kv, 1, pos0 + t, s.n_head, s.n_head_kv,
                                      s.head_dim, s.window, b.data(), p, Isa::kAvx2);
          CHECK(std::memcmp(a.data(), b.data(), out_row * sizeof(float)) == 0);
          CHECK(std::memcmp(a.data(), base.data() + t * out_row, out_row * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("KV type names and row bytes", "[cpu][attention][kv]") {
  KvType t = KvType::kF32;
  CHECK(strata::model::ParseKvType("q8_0", &t));
  CHECK(t == KvType::kQ8_0);
  CHECK(strata::model::ParseKvType("F16", &t));
  CHECK(t == KvType::kF16);
  CHECK(strata::model::ParseKvType("f32", &t));
  CHECK(t == KvType::kF32);
  for (const char *bad : {"q3", "q4_0", "", "f8", "q8"}) CHECK_FALSE(strata::model::ParseKvType(bad, &t));
  // ggml's block_q8_0: 32 values in 34 bytes; f16 two bytes a value.
  CHECK(KvRowBytes(KvType::kQ8_0, 128) == 136);
  CHECK(KvRowBytes(KvType::kQ8_0, 576) == 612);
  CHECK(KvRowBytes(KvType::kQ8_0, 40) == 68);  // a partial last block is a whole block
  CHECK(KvRowBytes(KvType::kF16, 128) == 256);
  CHECK(KvRowBytes(KvType::kF32, 128) == 512);
}
