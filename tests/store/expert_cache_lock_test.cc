// The RAM expert tier's placement: its slab locked in pieces with a partial lock reported (the bytes
// locked, the reason, the context's warning) while the cache keeps serving the file's bytes, under an
// injected refusal and under a lowered RLIMIT_MEMLOCK; a NUMA node the host lacks binds nothing.
#include <catch2/catch.hpp>
#include <errno.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "lib/runtime/context.h"
#include "lib/store/expert_cache.h"
#include "lib/util/numa.h"
#include "tests/model/golden_util.h"
#include "tests/util/memory_lock_util.h"

namespace {

using strata::runtime::Context;
using strata::store::CacheOptions;
using strata::store::CacheStats;
using strata::store::ExpertCache;
using strata::store::ExpertTable;
using strata::testing::kGolden;

const char *kLockModels[] = {"qwen3moe_f32/model-f32.gguf", "mixtral_f32/model-q8_0.gguf", "qwen3moe_f32/hf"};

// The model's bound weights, its expert table, and a cache over them (no backend: no prediction).
struct Fixture {
  Context::Described d;
  std::unique_ptr<ExpertTable> table;
  std::unique_ptr<ExpertCache> cache;

  explicit Fixture(const std::string &model) {
    auto described = Context::Describe(kGolden + model);
    INFO(model << ": " << described.status().ToString());
    REQUIRE(described.ok());
    d = std::move(*described);
    table = std::make_unique<ExpertTable>(d.weights);
  }
  uint32_t n_keys() const { return static_cast<uint32_t>(table->n_layers() * table->n_experts()); }
  uint64_t slab_bytes() const { return uint64_t{n_keys()} * table->slot_bytes(); }
  void Create(CacheOptions co) {
    co.n_slots = n_keys();
    co.prefetch_distance = 0;
    auto c = ExpertCache::Create(*table, *d.file, d.weights, nullptr, co);
    INFO(c.status().ToString());
    REQUIRE(c.ok());
    cache = std::move(*c);
  }
  // Every routed expert through the cache: each part's bytes are the file's.
  void CheckServesTheFile() {
    for (int l = 0; l < table->n_layers(); ++l) {
      if (table->entry(l, 0).weights == nullptr) continue;  // a dense layer
      std::vector<int32_t> experts(table->n_experts());
      for (int e = 0; e < table->n_experts(); ++e) experts[e] = e;
      std::vector<const strata::model::ExpertWeights *> out;
      REQUIRE(cache->Acquire(l, experts, &out).ok());
      REQUIRE(out.size() == experts.size());
      for (int e = 0; e < table->n_experts(); ++e) {
        const strata::store::ExpertEntry &en = table->entry(l, e);
        const strata::model::Matrix *m[3] = {&out[e]->gate, &out[e]->up, &out[e]->down};
        for (int p = 0; p < 3; ++p) {
          std::vector<uint8_t> want(en.part[p].bytes);
          REQUIRE(d.file->file(en.part[p].file_index).ReadAt(en.part[p].file_offset, want.data(), want.size()).ok());
          INFO("layer " << l << " expert " << e << " part " << p);
          CHECK(std::memcmp(m[p]->data, want.data(), want.size()) == 0);
        }
      }
      cache->Release(l, experts);
    }
  }
};

int g_refuse = 0, g_calls = 0;  // the injected lock refuses call g_refuse (1-based)
int RefuseNth(const void *, size_t) {
  if (++g_calls == g_refuse) {
    errno = ENOMEM;
    return -1;
  }
  return 0;
}

void CheckPartial(const CacheStats &s, uint64_t slab, uint64_t piece, const std::string &reason) {
  CHECK_FALSE(s.memory_locked);
  CHECK(s.locked_bytes < slab);
  CHECK(s.locked_bytes % piece == 0);
  CHECK(s.lock_shortfall == reason);
  const std::string w = strata::store::LockWarning(s);
  INFO(w);
  CHECK(w.find("RAM expert tier: locked " + strata::FormatBytes(s.locked_bytes) + " of " +
               strata::FormatBytes(slab) + " (" + reason + ")") != std::string::npos);
  CHECK(w.find("paged out") != std::string::npos);
}

}  // namespace

TEST_CASE("expert cache: a lock refused part-way is reported and the cache serves the file", "[store][memlock]") {
  std::mt19937 rng(std::random_device{}());
  for (const char *model : kLockModels) {
    Fixture f(model);
    const uint64_t slab = f.slab_bytes();
    // Pieces of whole pages, at least three to the slab.
    const uint64_t piece = std::max<uint64_t>(4096, slab / (3 + rng() % 5) / 4096 * 4096);
    const int n_pieces = static_cast<int>((slab + piece - 1) / piece);
    REQUIRE(n_pieces >= 2);
    g_calls = 0;
    g_refuse = 1 + static_cast<int>(rng() % n_pieces);
    INFO(model << ": slab " << slab << ", piece " << piece << ", refusing piece " << g_refuse);
    CacheOptions co;
    co.lock_for_testing = RefuseNth;
    co.lock_piece_bytes = piece;
    f.Create(co);
    CacheStats s = f.cache->stats();
    CHECK(s.locked_bytes == uint64_t(g_refuse - 1) * piece);
    CheckPartial(s, slab, piece, std::string("mlock: ") + std::strerror(ENOMEM));
    f.CheckServesTheFile();
    f.cache->ResetStats();  // the counters go, the lock's outcome stays
    const CacheStats kept = f.cache->stats();
    CHECK(kept.locked_bytes == s.locked_bytes);
    CHECK(kept.lock_shortfall == s.lock_shortfall);
  }
}

TEST_CASE("expert cache: a lowered RLIMIT_MEMLOCK locks what fits and names the limit", "[store][memlock]") {
  std::mt19937 rng(std::random_device{}());
  Fixture f(kLockModels[rng() % 2]);
  const uint64_t slab = f.slab_bytes();
  const uint64_t piece = std::max<uint64_t>(4096, slab / 6 / 4096 * 4096);
  const uint64_t fit = 1 + rng() % 3;  // pieces under the limit
  INFO("slab " << slab << ", piece " << piece << ", pieces that fit " << fit);
  REQUIRE(slab > (fit + 1) * piece);
  std::string reason;
  {
    strata::testing::MemlockLimit lowered(fit * piece + piece / 2);
    if (!lowered.active()) {
      WARN("cannot lower RLIMIT_MEMLOCK (or drop CAP_IPC_LOCK) here: not tested");
      return;
    }
    reason = "RLIMIT_MEMLOCK " + strata::FormatBytes(lowered.limit());
    CacheOptions co;
    co.lock_piece_bytes = piece;
    f.Create(co);
  }
  const CacheStats s = f.cache->stats();
  CHECK(s.locked_bytes == fit * piece);
  CheckPartial(s, slab, piece, reason);
  CHECK(strata::testing::LockedBytesNow() >= s.locked_bytes);
  f.CheckServesTheFile();
  f.cache.reset();  // unlocks what it locked
}

TEST_CASE("expert cache: a slab locked whole says nothing, and nothing is locked unless asked", "[store][memlock]") {
  Fixture f(kLockModels[0]);
  CacheOptions co;
  f.Create(co);
  CacheStats s = f.cache->stats();
  // Whole, unless this host's limit is below the slab; then the shortfall says so.
  CHECK(s.memory_locked == (s.locked_bytes == f.slab_bytes()));
  CHECK(s.memory_locked == s.lock_shortfall.empty());
  CHECK(strata::store::LockWarning(s).empty() == s.memory_locked);
  co.lock_memory = false;
  f.Create(co);
  s = f.cache->stats();
  CHECK_FALSE(s.memory_locked);
  CHECK(s.locked_bytes == 0);
  CHECK(strata::store::LockWarning(s).empty());
  f.CheckServesTheFile();
}

TEST_CASE("expert cache: a NUMA node the host lacks binds nothing, the host's own binds on several nodes",
          "[store][numa]") {
  Fixture f(kLockModels[0]);
  CacheOptions co;
  co.numa_node = 63;
  f.Create(co);
  CHECK(f.cache->stats().numa_node_bound == -1);
  f.CheckServesTheFile();
  const int nodes = strata::numa::NodeCount();
  co.numa_node = nodes - 1;
  f.Create(co);
  if (nodes < 2) {
    CHECK(f.cache->stats().numa_node_bound == -1);  // one node: nothing to place
  } else {
    CHECK(f.cache->stats().numa_node_bound == nodes - 1);
    f.CheckServesTheFile();
    CHECK(strata::numa::MemoryNode(f.cache->slab()) == nodes - 1);
  }
}

TEST_CASE("context: a RAM tier the limit keeps from locking is a plan warning and in moe_stats", "[store][memlock]") {
  const std::string model = kGolden + kLockModels[0];
  strata::testing::MemlockLimit lowered(0);  // nothing more may be locked while the contexts open
  if (!lowered.active()) {
    WARN("cannot lower RLIMIT_MEMLOCK (or drop CAP_IPC_LOCK) here: not tested");
    return;
  }
  strata::runtime::ContextOptions o;
  o.model_path = model;
  o.ram_budget_bytes = 1;  // raised to the minimum: the experts stream through the RAM tier
  o.n_threads = 2;
  auto ctx = Context::Open(o);
  INFO(ctx.status().ToString());
  REQUIRE(ctx.ok());
  const CacheStats s = (*ctx)->Stats().cache;
  REQUIRE((*ctx)->Stats().streaming);
  CHECK(s.locked_bytes == 0);
  CHECK_FALSE(s.memory_locked);
  const auto &warnings = (*ctx)->plan().warnings;
  const bool warned = std::any_of(warnings.begin(), warnings.end(), [&](const std::string &w) {
    return w.find("RAM expert tier: locked 0 B of ") != std::string::npos &&
           w.find("RLIMIT_MEMLOCK " + strata::FormatBytes(lowered.limit())) != std::string::npos;
  });
  CHECK(warned);

  // Through the C ABI, decoding still works and the bytes locked are in moe_stats.
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.ram_budget_bytes = 1;
  p.n_threads = 2;
  moe_ctx *c = nullptr;
  REQUIRE(moe_ctx_open(&p, &c) == MOE_OK);
  const std::vector<int32_t> tokens = strata::testing::ReadBinary<int32_t>(kGolden + "qwen3moe_f32/tokens.bin");
  moe_session_params sp;
  moe_session_params_init(&sp);
  moe_session *sess = nullptr;
  REQUIRE(moe_session_open(c, &sp, &sess) == MOE_OK);
  REQUIRE(moe_session_feed(sess, tokens.data(), std::min<size_t>(tokens.size(), 4)) == MOE_OK);
  CHECK(moe_ctx_step(c, nullptr) == MOE_OK);
  moe_stats st;
  moe_stats_init(&st);
  REQUIRE(moe_ctx_stats(c, &st) == MOE_OK);
  CHECK(st.streaming == 1);
  CHECK(st.memory_locked == 0);
  CHECK(st.locked_bytes == 0);
  CHECK(st.expert_misses + st.expert_hits > 0);
  moe_session_close(sess);
  moe_ctx_close(c);
}
