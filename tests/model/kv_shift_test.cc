// KvCache::Shift against fresh passes, every golden family: a cache fed a prefix, a run of tokens
// and a tail, then shifted by the run's length, holds at layer 0 what a cache fed the prefix and the
// tail alone holds (a layer-0 row depends only on its token and position): values and latents bit
// for bit, keys within the rounding of their rotation; in f16 and q8_0 within the types' own
// rounding. The kept prefix does not change, blocks past the end are freed, the mask follows the
// rows, and bad ranges are refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "lib/model/forward.h"
#include "lib/util/status.h"
#include "tests/model/bound_model.h"
#include "tests/model/golden_util.h"

namespace {

using namespace strata::model;
using strata::cpu::CpuBackend;
using strata::testing::kGolden;

struct Loaded : strata::testing::BoundModel {
  WeightStore store;
};

void Load(const std::string &path, Loaded *m) {
  strata::testing::BindModel(path, m);
  REQUIRE(m->store.Load(*m->mf, m->w).ok());
}

const char *const kFamilies[] = {"qwen3moe_f32", "mixtral_f32",   "olmoe_f32",         "qwen2moe_f32",
                                 "gptoss_f32",   "deepseek2_f32", "deepseek2lite_f32", "deepseek3_f32"};

// Feeds tokens into kv from position pos0 in chunks of random sizes (the rows do not depend on them).
void Feed(const Loaded &m, CpuBackend &be, KvCache &kv, const std::vector<int32_t> &toks, int pos0, std::mt19937 &rng) {
  std::vector<float> logits;
  for (size_t done = 0; done < toks.size();) {
    const size_t n = std::min<size_t>(toks.size() - done, 1 + rng() % 90);
    const absl::Status st = Forward(m.hp, m.w, be, kv, toks.data() + done, static_cast<int64_t>(n),
                                    pos0 + static_cast<int>(done), false, nullptr, &logits);
    INFO(st.ToString());
    REQUIRE(st.ok());
    done += n;
  }
}

std::vector<float> Rows(const KvCache &kv, int l, bool values, int n) {
  const int width = values ? kv.widths().v : kv.widths().k;
  std::vector<float> out(static_cast<size_t>(n) * width, std::nanf(""));
  REQUIRE(kv.ReadRows(l, values, n, out.data()).ok());
  return out;
}

}  // namespace

TEST_CASE("kv shift: layer-0 rows equal a fresh pass over the kept tokens, every family and KV type",
          "[kv][shift]") {
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  CpuBackend be(2);
  for (const char *family : kFamilies) {
    INFO(family);
    Loaded m;
    Load(kGolden + family + "/model-f32.gguf", &m);
    const HParams &hp = m.hp;
    for (KvType type : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
      INFO(KvTypeName(type));
      // A prefix of 0..40 tokens, a dropped run crossing block boundaries, a tail of 1..200.
      const int keep = static_cast<int>(rng() % 41), discard = 1 + static_cast<int>(rng() % 170);
      const int tail = 1 + static_cast<int>(rng() % 200), n = keep + discard + tail;
      std::uniform_int_distribution<int32_t> tok(0, hp.n_vocab - 1);
      std::vector<int32_t> prefix(keep), dropped(discard), rest(tail);
      for (auto *v : {&prefix, &dropped, &rest}) {
        for (int32_t &t : *v) t = tok(rng);
      }
      INFO("keep " << keep << " discard " << discard << " tail " << tail);
      KvCache a, b;
      REQUIRE(a.Init(hp, 512, nullptr, &be, type, type).ok());
      REQUIRE(b.Init(hp, 512, nullptr, &be, type, type).ok());
      Feed(m, be, a, prefix, 0, rng);
      Feed(m, be, a, dropped, keep, rng);
      Feed(m, be, a, rest, keep + discard, rng);
      Feed(m, be, b, prefix, 0, rng);
      Feed(m, be, b, rest, keep, rng);
      std::vector<std::vector<float>> before_k(hp.n_layer), before_v(hp.n_layer);
      for (int l = 0; l < hp.n_layer; ++l) {
        before_k[l] = Rows(a, l, false, n);
        if (a.widths().v > 0) before_v[l] = Rows(a, l, true, n);
      }
      const absl::Status st = a.Shift(be, hp, n, keep, discard);
      INFO(st.ToString());
      REQUIRE(st.ok());
      const int kept = n - discard;
      CHECK(a.n_blocks() == (kept + kKvBlockTokens - 1) / kKvBlockTokens);

      // The prefix is untouched in every layer; at every layer the moved values are the old ones.
      const KvCache::Widths w = a.widths();
      for (int l = 0; l < hp.n_layer; ++l) {
        const std::vector<float> k = Rows(a, l, false, kept);
        CHECK(std::memcmp(k.data(), before_k[l].data(), static_cast<size_t>(keep) * w.k * sizeof(float)) == 0);
        if (w.v > 0) {
          const std::vector<float> v = Rows(a, l, true, kept);
          CHECK(std::memcmp(v.data(), before_v[l].data(), static_cast<size_t>(keep) * w.v * sizeof(float)) == 0);
          CHECK(std::memcmp(v.data() + static_cast<size_t>(keep) * w.v,
                            before_v[l].data() + static_cast<size_t>(keep + discard) * w.v,
                            static_cast<size_t>(tail) * w.v * sizeof(float)) == 0);
        }
      }

      // Layer 0 against the fresh cache. The not-rotated part of a key row (an MLA latent) and the
      // values are exact. Rotated parts: the fresh key is R(p - d) k, the shifted one R(-d) R(p) k;
      // their angles are rounded to float (2^-24 relative of at most 512 rad: < 3.1e-5 rad each)
      // and each rotation rounds its products, so f32 rows agree within 1e-4 of the row's largest
      // value. Typed rows are rounded once more after the rotation: f16 at most 2^-11 of a value
      // on each side (2e-3 of the row's largest covers three roundings); q8_0 at most half a step,
      // block max / 254, on each side, a rotated pair's largest value up to sqrt(2) the row's
      // (2e-2 covers three). A key left unrotated differs by the size of the row itself.
      const double tol = type == KvType::kF32 ? 1e-4 : type == KvType::kF16 ? 2e-3 : 2e-2;
      const std::vector<float> ka = Rows(a, 0, false, kept), kb = Rows(b, 0, false, kept);
      const int rope_off = hp.mla ? hp.kv_lora_rank : 0;
      double worst = 0;
      for (int p = keep; p < kept; ++p) {
        const float *ra = ka.data() + static_cast<size_t>(p) * w.k, *rb = kb.data() + static_cast<size_t>(p) * w.k;
        double row_max = 0;
        for (int c = 0; c < w.k; ++c) row_max = std::max(row_max, std::fabs(static_cast<double>(rb[c])));
        REQUIRE(row_max > 0);
        for (int c = 0; c < w.k; ++c) {
          REQUIRE(std::isfinite(ra[c]));
          if (c < rope_off && type != KvType::kQ8_0) {
            // The latent moves as it is (a q8_0 block it shares with the rotated part is re-quantized).
            CHECK(ra[c] == rb[c]);
          } else {
            worst = std::max(worst, std::fabs(static_cast<double>(ra[c]) - rb[c]) / row_max);
          }
        }
      }
      INFO("worst key error " << worst << " of the row's largest value");
      CHECK(worst < tol);
      if (w.v > 0) {
        const std::vector<float> va = Rows(a, 0, true, kept), vb = Rows(b, 0, true, kept);
        CHECK(std::memcmp(va.data() + static_cast<size_t>(keep) * w.v, vb.data() + static_cast<size_t>(keep) * w.v,
                          static_cast<size_t>(tail) * w.v * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("kv shift: the mask follows the rows; blocks shared with a fork are copied first", "[kv][shift]") {
  std::random_device rd;
  const unsigned seed = rd();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  CpuBackend be(2);
  Loaded m;
  Load(kGolden + "qwen3moe_f32/model-f32.gguf", &m);
  const HParams &hp = m.hp;
  KvBudget budget(uint64_t{1} << 30);
  KvCache a, fork;
  REQUIRE(a.Init(hp, 512, &budget, &be).ok());
  REQUIRE(fork.Init(hp, 512, &budget, &be).ok());
  const int32_t blocked = 7;
  a.SetMask(0, {blocked});
  fork.SetMask(0, {blocked});
  std::vector<int32_t> toks(300);
  for (int32_t &t : toks) t = rng() % 4 == 0 ? blocked : static_cast<int32_t>(8 + rng() % 200);
  Feed(m, be, a, toks, 0, rng);
  REQUIRE(fork.ShareFrom(a).ok());
  REQUIRE(a.shared_blocks() == 3);
  const std::vector<float> shared_k = Rows(fork, 1, false, 300);
  const uint64_t used = budget.used();
  const int keep = 20, discard = 150;
  REQUIRE(a.Shift(be, hp, 300, keep, discard).ok());
  // The rows it wrote were its own copies: the fork still reads the rows it shared.
  CHECK(Rows(fork, 1, false, 300) == shared_k);
  CHECK(a.shared_blocks() == 0);
  CHECK(budget.used() == used + 2 * a.block_bytes());  // its blocks 0 and 1 are its own now (2 is freed)
  const KvView v = a.layer(0);
  for (int p = 0; p < 300 - discard; ++p) {
    const int32_t t = p < keep ? toks[p] : toks[p + discard];
    INFO("position " << p);
    CHECK(v.is_masked(p) == (t == blocked));
  }
  // Ranges outside the positions held are refused, and change nothing.
  const std::vector<float> k0 = Rows(a, 0, false, 150);
  for (auto [n, keep2, discard2] : std::vector<std::tuple<int, int, int>>{
           {150, -1, 2}, {150, 0, -1}, {150, 100, 51}, {600, 0, 10}, {-1, 0, 0}}) {
    const absl::Status st = a.Shift(be, hp, n, keep2, discard2);
    CHECK(strata::StatusToMoe(st) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(st.message().find("cannot drop") != std::string::npos);
  }
  CHECK(Rows(a, 0, false, 150) == k0);
  CHECK(a.Shift(be, hp, 150, 150, 0).ok());  // nothing to drop
  CHECK(Rows(a, 0, false, 150) == k0);
}
