// The decode step's rows path (KvRowRefs: every session's K/V writes and attention in one call each,
// tables and masks read from the caches' copies in backend memory) against the per-sequence path
// the forward pass takes without a workspace: bit-identical logits, step after step, for sessions
// at different positions, with sliding windows, blocked tokens, a session trimmed back (rewound)
// and one spilled to disk and read back, across KV block boundaries.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "lib/model/forward.h"
#include "lib/model/hparams.h"
#include "lib/model/model_file.h"
#include "lib/model/weights.h"
#include "lib/util/status.h"
#include "tests/model/bound_model.h"
#include "tests/model/golden_util.h"

namespace {

using namespace strata::model;
using strata::testing::kGolden;

struct Loaded : strata::testing::BoundModel {
  WeightStore store;
};

void Load(const std::string &path, Loaded *m) {
  strata::testing::BindModel(path, m);
  REQUIRE(m->store.Load(*m->mf, m->w).ok());
}

// Sessions driven identically through both paths: `rows` passes a workspace (a decode step then
// takes the rows path), the other does not (per-sequence calls).
struct Run {
  std::vector<std::unique_ptr<KvCache>> kv;
  std::vector<int> pos;
  std::unique_ptr<Buffer> ws;
  bool rows = false;
};

void Open(const Loaded &m, strata::cpu::CpuBackend &be, int n, bool rows, Run *r) {
  r->rows = rows;
  for (int i = 0; i < n; ++i) {
    r->kv.push_back(std::make_unique<KvCache>());
    REQUIRE(r->kv.back()->Init(m.hp, 512, nullptr, &be).ok());
    r->pos.push_back(0);
  }
  REQUIRE(r->kv[0]->has_device_table());
}

// One forward pass over the sessions `which`, each fed `tok[i]` (n tokens), returning the logits.
std::vector<std::vector<float>> Step(const Loaded &m, strata::cpu::CpuBackend &be, Run *r, const std::vector<int> &which,
                                     const std::vector<std::vector<int32_t>> &tok) {
  ForwardArgs a;
  for (size_t i = 0; i < which.size(); ++i) {
    const int s = which[i];
    a.seqs.push_back(SequenceArgs{r->kv[s].get(), tok[i].data(), static_cast<int64_t>(tok[i].size()), r->pos[s], false});
  }
  a.workspace = r->rows ? &r->ws : nullptr;
  std::vector<std::vector<float>> out;
  const absl::Status st = Forward(m.hp, m.w, be, a, &out);
  INFO(st.ToString());
  REQUIRE(st.ok());
  for (size_t i = 0; i < which.size(); ++i) r->pos[which[i]] += static_cast<int>(tok[i].size());
  return out;
}

}  // namespace

TEST_CASE("decode rows path: bit-identical to per-sequence attention, with masks, rewinds and spills",
          "[forward][sessions]") {
  for (const char *rel : {"qwen3moe_f32/model-f32.gguf", "gptoss_f32/model-f32.gguf"}) {
    INFO(rel);
    Loaded m;
    Load(kGolden + rel, &m);
    strata::cpu::CpuBackend be(2);
    Run rows, plain;
    constexpr int kSessions = 4;
    Open(m, be, kSessions, true, &rows);
    Open(m, be, kSessions, false, &plain);
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int32_t> tok(0, m.hp.n_vocab - 1);
    // Masks: session 1 a sliding window, session 2 blocked ids (drawn again each run), 3 both.
    const std::vector<int32_t> blocked = {tok(rng), tok(rng), tok(rng)};
    for (Run *r : {&rows, &plain}) {
      r->kv[1]->SetMask(5, {});
      r->kv[2]->SetMask(0, blocked);
      r->kv[3]->SetMask(9, blocked);
    }
    // Prompts of different lengths (per-sequence prefill in both runs).
    std::vector<int> all(kSessions);
    std::vector<std::vector<int32_t>> prompt(kSessions);
    for (int s = 0; s < kSessions; ++s) {
      all[s] = s;
      prompt[s].resize(1 + 7 * s);
      for (auto &t : prompt[s]) t = rng() % 4 == 0 ? blocked[rng() % 3] : tok(rng);
    }
    CHECK(Step(m, be, &rows, all, prompt) == Step(m, be, &plain, all, prompt));
    // Decode steps past the first KV block boundary (128 positions), with a random subset of the
    // sessions each step; at step 60 session 0 is rewound (trimmed) and at step 90 session 2 is
    // spilled to disk and read back.
    int rows_steps = 0;
    for (int step = 0; step < 180; ++step) {
      if (step == 60) {
        for (Run *r : {&rows, &plain}) {
          r->pos[0] = 20;
          r->kv[0]->Trim(20);
        }
      }
      if (step == 90) {
        for (Run *r : {&rows, &plain}) {
          REQUIRE(r->kv[2]->Spill("/tmp", r->pos[2]).ok());
          REQUIRE(r->kv[2]->Unspill().ok());
        }
      }
      std::vector<int> which;
      for (int s = 0; s < kSessions; ++s) {
        if (rng() % 4 != 0) which.push_back(s);
      }
      if (which.empty()) which.push_back(static_cast<int>(rng() % kSessions));
      std::vector<std::vector<int32_t>> t(which.size());
      for (auto &v : t) v = {rng() % 5 == 0 ? blocked[rng() % 3] : tok(rng)};
      const auto a = Step(m, be, &rows, which, t);
      const auto b = Step(m, be, &plain, which, t);
      INFO("step " << step << ", " << which.size() << " sessions");
      REQUIRE(a == b);
      ++rows_steps;
    }
    CHECK(*std::max_element(rows.pos.begin(), rows.pos.end()) > 128);  // a block boundary was crossed
    CHECK(rows_steps == 180);
    // The rows path ran: the caches' tables in backend memory (host memory here) were brought up
    // to date by it, and never by the per-sequence path.
    for (int s = 0; s < kSessions; ++s) {
      for (int l = 0; l < m.hp.n_layer; ++l) {
        CHECK(static_cast<void *>(rows.kv[s]->device_k_table(l)[0]) == rows.kv[s]->layer(l).k_blocks[0]);
        CHECK(static_cast<void *>(rows.kv[s]->device_v_table(l)[0]) == rows.kv[s]->layer(l).v_blocks[0]);
        CHECK(plain.kv[s]->device_k_table(l)[0] == nullptr);
      }
    }
  }
}

TEST_CASE("forward writes each sequence's logits to its own destination or into the result", "[forward][sessions]") {
  Loaded m;
  Load(kGolden + "qwen3moe_f32/model-f32.gguf", &m);
  strata::cpu::CpuBackend be(2);
  Run into, own;
  Open(m, be, 3, true, &into);
  Open(m, be, 3, true, &own);
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int32_t> id(0, m.hp.n_vocab - 1);
  const std::vector<std::vector<int32_t>> tok = {{id(rng), id(rng), id(rng)}, {id(rng)}, {id(rng), id(rng)}};
  const std::vector<std::vector<float>> want = Step(m, be, &into, {0, 1, 2}, tok);
  // Sequences 0 and 2 into poisoned buffers of their own (2 with every token's rows), 1 into the result.
  const size_t nv = static_cast<size_t>(m.hp.n_vocab);
  std::vector<float> d0(nv, std::nanf("")), d2(2 * nv, std::nanf(""));
  ForwardArgs a;
  for (int s = 0; s < 3; ++s) {
    a.seqs.push_back(SequenceArgs{own.kv[s].get(), tok[s].data(), static_cast<int64_t>(tok[s].size()), 0, s == 2});
  }
  a.seqs[0].logits_dst = d0.data();
  a.seqs[2].logits_dst = d2.data();
  a.workspace = &own.ws;
  // Nowhere to put sequence 1's rows: refused before anything runs.
  CHECK(strata::StatusToMoe(Forward(m.hp, m.w, be, a, nullptr)) == MOE_ERR_INVALID_ARGUMENT);
  std::vector<std::vector<float>> out;
  REQUIRE(Forward(m.hp, m.w, be, a, &out).ok());
  REQUIRE(out.size() == 3);
  CHECK(out[0].empty());
  CHECK(out[2].empty());
  CHECK(std::memcmp(d0.data(), want[0].data(), nv * sizeof(float)) == 0);
  CHECK(out[1] == want[1]);
  // Sequence 2's last row is what the result-vector run gave (it asked for the last row only).
  CHECK(std::memcmp(d2.data() + nv, want[2].data(), nv * sizeof(float)) == 0);
  CHECK(!std::isnan(d2[0]));
}
