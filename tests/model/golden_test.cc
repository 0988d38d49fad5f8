// Golden tests: Strata's teacher-forced logits against transformers' for every committed tiny
// checkpoint (tests/golden, made by scripts/golden/make_goldens.py), through the C ABI, for every
// position, both as one prefill batch and as a prefill followed by one-token decode steps.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <fstream>
#include <string>
#include <vector>

#include "include/strata/moe.h"

namespace {

const std::string kGolden = std::string(STRATA_SOURCE_DIR) + "/tests/golden/";

template <typename T>
std::vector<T> ReadBinary(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() % sizeof(T) == 0);
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// max |a - b| / max |b| over all elements.
double NormalizedMaxError(const std::vector<float> &a, const std::vector<float> &b) {
  REQUIRE(a.size() == b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(a[i]));
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

// Runs `tokens` through a fresh session: the first `prefill` as one batch, then one at a time.
// Returns the logits of every position, (n_tokens, n_vocab).
std::vector<float> TeacherForced(const std::string &model, const std::vector<int32_t> &tokens, size_t prefill) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.backend = MOE_BACKEND_CPU;
  p.n_threads = 2;
  moe_ctx *ctx = nullptr;
  INFO(model << ": " << moe_last_error());
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.logits_all = 1;
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
  const int32_t n_vocab = moe_ctx_vocab_size(ctx);
  // Poison: every row must come from the engine.
  std::vector<float> out(tokens.size() * n_vocab, std::nanf(""));
  size_t done = 0;
  auto run = [&](size_t n) {
    REQUIRE(moe_session_feed(s, tokens.data() + done, n) == MOE_OK);
    uint32_t pending = 99;
    REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
    REQUIRE(pending == 0);
    const float *rows;
    int32_t nt, nv;
    REQUIRE(moe_session_logits_all(s, &rows, &nt, &nv) == MOE_OK);
    REQUIRE(nt == static_cast<int32_t>(n));
    REQUIRE(nv == n_vocab);
    std::copy(rows, rows + n * n_vocab, out.begin() + done * n_vocab);
    done += n;
    REQUIRE(moe_session_n_past(s) == static_cast<int32_t>(done));
  };
  if (prefill > 0) run(prefill);
  while (done < tokens.size()) run(1);
  moe_session_close(s);
  moe_ctx_close(ctx);
  return out;
}

struct Case {
  const char *dir;
  const char *model;      // relative to the case dir
  const char *reference;  // logits file the engine must match within 1e-4
  double tolerance;
  double bound_vs_f32;    // against the f32 transformers logits (rounding of the stored weights)
};

// Bounds vs the float32 reference: the error the weights' rounding explains, measured by the golden
// script with transformers itself (meta.json rel_err_vs_logits_bin: f16 8.7e-4 / 6.1e-4, q8_0 2.3e-2 /
// 1.2e-2) with headroom; the sharp check is the first one, against transformers run on the
// dequantized weights.
const Case kCases[] = {
    {"qwen3moe_f32", "hf", "logits.bin", 1e-4, 1e-4},
    {"qwen3moe_f32", "model-f32.gguf", "logits.bin", 1e-4, 1e-4},
    {"qwen3moe_f32", "model-f16.gguf", "logits-f16.bin", 1e-4, 2e-3},
    {"qwen3moe_f32", "model-q8_0.gguf", "logits-q8_0.bin", 1e-4, 3e-2},
    {"qwen3moe_bf16", "hf", "logits.bin", 1e-4, 1e-4},
    {"qwen3moe_bf16", "model-bf16.gguf", "logits-bf16.bin", 1e-4, 1e-4},
    {"mixtral_f32", "hf", "logits.bin", 1e-4, 1e-4},
    {"mixtral_f32", "model-f32.gguf", "logits.bin", 1e-4, 1e-4},
    {"mixtral_f32", "model-f16.gguf", "logits-f16.bin", 1e-4, 2e-3},
    {"mixtral_f32", "model-q8_0.gguf", "logits-q8_0.bin", 1e-4, 3e-2},
};

}  // namespace

TEST_CASE("teacher-forced logits match transformers on every golden", "[golden]") {
  for (const Case &c : kCases) {
    const std::string dir = kGolden + c.dir + "/";
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    const auto ref = ReadBinary<float>(dir + c.reference);
    const auto ref_f32 = ReadBinary<float>(dir + "logits.bin");
    REQUIRE(tokens.size() == 20);
    for (size_t prefill : {tokens.size(), size_t{12}, size_t{1}}) {
      const auto got = TeacherForced(dir + c.model, tokens, prefill);
      const double err = NormalizedMaxError(got, ref);
      const double err_f32 = NormalizedMaxError(got, ref_f32);
      INFO(c.dir << "/" << c.model << " prefill " << prefill << ": error " << err << " vs " << c.reference << ", "
                 << err_f32 << " vs logits.bin");
      CHECK(err <= c.tolerance);
      CHECK(err_f32 <= c.bound_vs_f32);
    }
  }
}

TEST_CASE("greedy continuation reproduces transformers' tokens", "[golden]") {
  for (const char *name : {"qwen3moe_f32", "mixtral_f32"}) {
    const std::string dir = kGolden + name + "/";
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    for (const char *model : {"hf", "model-f32.gguf"}) {
      const std::string path = dir + model;
      moe_params p;
      moe_params_init(&p);
      p.model_path = path.c_str();
      moe_ctx *ctx = nullptr;
      REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
      moe_session *s = nullptr;
      REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);  // defaults: greedy
      REQUIRE(moe_session_feed(s, tokens.data(), 12) == MOE_OK);
      for (size_t i = 12; i < tokens.size(); ++i) {
        REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
        int32_t tok = -1;
        REQUIRE(moe_session_sample(s, &tok) == MOE_OK);
        INFO(path << " position " << i);
        CHECK(tok == tokens[i]);
        REQUIRE(moe_session_feed(s, &tok, 1) == MOE_OK);
      }
      moe_session_close(s);
      moe_ctx_close(ctx);
    }
  }
}
