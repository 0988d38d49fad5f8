// Golden tests for the MoE families of issue 7 (OLMoE, Qwen2-MoE, ...): Strata's teacher-forced
// logits against transformers' on the tiny random checkpoints of tests/golden (HF and GGUF forms),
// every position, as one prefill, as prefill 12 + decode and as prefill 1 + decode; and the
// weight ledger: every tensor of the file is either a routed expert or a resident (non-routed) byte.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "lib/model/forward.h"
#include "lib/model/hparams.h"
#include "lib/model/model_file.h"
#include "lib/model/weights.h"
#include "tests/model/golden_util.h"

namespace {

using strata::testing::kGolden;
using strata::testing::NormalizedMaxError;
using strata::testing::ReadBinary;
using strata::testing::TeacherForced;

struct FamilyCase {
  const char *dir;
  const char *model;      // relative to the case dir
  const char *reference;  // logits file the engine must match
  double tolerance;
};

const FamilyCase kFamilies[] = {
    {"olmoe_f32", "hf", "logits.bin", 1e-4},
    {"olmoe_f32", "model-f32.gguf", "logits.bin", 1e-4},
    {"qwen2moe_f32", "hf", "logits.bin", 1e-4},
    {"qwen2moe_f32", "model-f32.gguf", "logits.bin", 1e-4},
    {"deepseek2_f32", "hf", "logits.bin", 1e-4},
    {"deepseek2_f32", "model-f32.gguf", "logits.bin", 1e-4},
    {"deepseek2lite_f32", "hf", "logits.bin", 1e-4},
    {"deepseek2lite_f32", "model-f32.gguf", "logits.bin", 1e-4},
    {"deepseek3_f32", "hf", "logits.bin", 1e-4},
    {"deepseek3_f32", "model-f32.gguf", "logits.bin", 1e-4},
    {"gptoss_f32", "hf", "logits.bin", 1e-4},
    {"gptoss_f32", "model-f32.gguf", "logits.bin", 1e-4},
    // MXFP4 experts: against transformers run on the file's dequantized weights
    {"gptoss_f32", "model-mxfp4.gguf", "logits-mxfp4.bin", 1e-4},
};

}  // namespace

TEST_CASE("family goldens: teacher-forced logits match transformers", "[golden][families]") {
  for (const FamilyCase &c : kFamilies) {
    const std::string dir = kGolden + c.dir + "/";
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    const auto ref = ReadBinary<float>(dir + c.reference);
    REQUIRE(tokens.size() == 20);
    for (size_t prefill : {tokens.size(), size_t{12}, size_t{1}}) {
      const auto got = TeacherForced(dir + c.model, tokens, prefill);
      const double err = NormalizedMaxError(got, ref);
      INFO(c.dir << "/" << c.model << " prefill " << prefill << ": error " << err << " vs " << c.reference);
      CHECK(err <= c.tolerance);
    }
  }
}

TEST_CASE("family goldens: every tensor is routed or resident", "[golden][families]") {
  using namespace strata::model;
  for (const FamilyCase &c : kFamilies) {
    const std::string path = kGolden + c.dir + "/" + c.model;
    INFO(path);
    auto mf = ModelFile::Open(path);
    REQUIRE(mf.ok());
    auto hp = ReadHParams(**mf);
    REQUIRE(hp.ok());
    auto w = BindWeights(**mf, *hp);
    REQUIRE(w.ok());
    uint64_t file_bytes = 0;
    for (const auto &t : (*mf)->tensors()) file_bytes += t.nbytes;
    CHECK(NonRoutedBytes(*w) + RoutedExpertBytes(*w) == file_bytes);
    uint64_t routed = 0;
    for (const auto &L : w->layers) {
      CHECK(L.experts.size() == (L.router.tensor != nullptr ? static_cast<size_t>(hp->n_expert) : 0u));
      for (const auto &e : L.experts) routed += e.nbytes();
    }
    CHECK(routed == RoutedExpertBytes(*w));
    if (hp->mla) {  // one latent row (kv_lora_rank + qk_rope_dim floats) per token and layer, no values
      CHECK(KvCache::BytesFor(*hp, 1) ==
            1ull * hp->n_layer * (hp->kv_lora_rank + hp->qk_rope_dim) * sizeof(float));
    } else {
      CHECK(KvCache::BytesFor(*hp, 1) == 2ull * hp->n_layer * hp->kv_dim() * sizeof(float));
    }
  }
}

TEST_CASE("family hyper-parameters", "[golden][families]") {
  using namespace strata::model;
  auto read = [](const std::string &rel) {
    auto mf = ModelFile::Open(kGolden + rel);
    REQUIRE(mf.ok());
    auto hp = ReadHParams(**mf);
    INFO(rel << ": " << hp.status().message());
    REQUIRE(hp.ok());
    return *hp;
  };
  for (const char *m : {"olmoe_f32/hf", "olmoe_f32/model-f32.gguf"}) {
    const HParams hp = read(m);
    CHECK(hp.arch == Arch::kOlmoe);
    CHECK(hp.qk_norm_full);
    CHECK_FALSE(hp.norm_topk_prob);
    CHECK(hp.n_ff_shared == 0);
  }
  for (const char *m : {"qwen2moe_f32/hf", "qwen2moe_f32/model-f32.gguf"}) {
    const HParams hp = read(m);
    CHECK(hp.arch == Arch::kQwen2Moe);
    CHECK(hp.attn_bias);
    CHECK(hp.n_ff_shared == 48);
    CHECK(hp.shared_expert_gate);
    CHECK(hp.n_ff_dense == 48);
    CHECK(hp.is_dense(1));
    CHECK_FALSE(hp.is_dense(0));
    CHECK_FALSE(hp.is_dense(2));
    CHECK_FALSE(hp.norm_topk_prob);
  }
}

TEST_CASE("DeepSeek and gpt-oss hyper-parameters", "[golden][families]") {
  using namespace strata::model;
  auto read = [](const std::string &rel) {
    auto mf = ModelFile::Open(kGolden + rel);
    REQUIRE(mf.ok());
    auto hp = ReadHParams(**mf);
    INFO(rel << ": " << hp.status().message());
    REQUIRE(hp.ok());
    return *hp;
  };
  for (const char *m : {"deepseek2_f32/hf", "deepseek2_f32/model-f32.gguf"}) {
    INFO(m);
    const HParams hp = read(m);
    CHECK(hp.arch == Arch::kDeepseek2);
    CHECK(hp.mla);
    CHECK(hp.q_lora_rank == 32);
    CHECK(hp.kv_lora_rank == 32);
    CHECK(hp.qk_nope_dim == 16);
    CHECK(hp.qk_rope_dim == 8);
    CHECK(hp.v_head_dim == 16);
    CHECK(hp.head_dim == 24);
    CHECK(hp.rope_style == RopeStyle::kNormal);
    CHECK(hp.gating == Gating::kSoftmax);
    CHECK(hp.n_group == 4);
    CHECK(hp.topk_group == 1);
    CHECK(hp.routed_scale == 1.5f);
    CHECK_FALSE(hp.norm_topk_prob);
    CHECK(hp.is_dense(0));
    CHECK_FALSE(hp.is_dense(1));
    CHECK(hp.n_ff_dense == 48);
    CHECK(hp.n_ff_shared == 16);
    CHECK_FALSE(hp.yarn);
    CHECK(hp.attn_scale == Approx(1.0 / std::sqrt(24.0)));
  }
  for (const char *m : {"deepseek2lite_f32/hf", "deepseek2lite_f32/model-f32.gguf"}) {
    INFO(m);
    const HParams hp = read(m);
    CHECK(hp.mla);
    CHECK(hp.q_lora_rank == 0);
    CHECK(hp.n_group == 1);
    CHECK(hp.n_shared_experts == 2);
    CHECK(hp.n_ff_shared == 32);
  }
  for (const char *m : {"deepseek3_f32/hf", "deepseek3_f32/model-f32.gguf"}) {
    INFO(m);
    const HParams hp = read(m);
    CHECK(hp.mla);
    CHECK(hp.gating == Gating::kSigmoid);
    CHECK(hp.expert_select_bias);
    CHECK(hp.n_group == 4);
    CHECK(hp.topk_group == 2);
    CHECK(hp.norm_topk_prob);
    CHECK(hp.routed_scale == 2.5f);
    CHECK(hp.yarn);
    CHECK(hp.yarn_factor == 4.f);
    CHECK(hp.yarn_orig_ctx == 128);
    CHECK(hp.yarn_attn_factor == Approx(1.0));
    const double m2 = (0.1 * std::log(4.0) + 1.0) * (0.1 * std::log(4.0) + 1.0);
    CHECK(hp.attn_scale == Approx(m2 / std::sqrt(24.0)));
  }
  for (const char *m : {"gptoss_f32/hf", "gptoss_f32/model-f32.gguf", "gptoss_f32/model-mxfp4.gguf"}) {
    INFO(m);
    const HParams hp = read(m);
    CHECK(hp.arch == Arch::kGptOss);
    CHECK(hp.attn_sinks);
    CHECK(hp.attn_bias);
    CHECK(hp.attn_out_bias);
    CHECK(hp.expert_bias);
    CHECK(hp.gating == Gating::kSoftmaxSelected);
    CHECK(hp.swiglu_limit == 7.f);
    CHECK(hp.window(0) == 4);
    CHECK(hp.window(1) == 0);
    CHECK(hp.yarn);
    CHECK(hp.yarn_factor == 8.f);
    CHECK_FALSE(hp.yarn_truncate);
    CHECK(hp.yarn_attn_factor == Approx(0.1 * std::log(8.0) + 1.0));
  }
}

TEST_CASE("MLA: split and fused latent projections bind", "[golden][families]") {
  using namespace strata::model;
  // The lite GGUF carries attn_k_b / attn_v_b (current converter), the V2 GGUF the fused attn_kv_b.
  for (const auto &[rel, split] : {std::pair<const char *, bool>{"deepseek2lite_f32/model-f32.gguf", true},
                                   {"deepseek2_f32/model-f32.gguf", false},
                                   {"deepseek2_f32/hf", false}}) {
    INFO(rel);
    auto mf = ModelFile::Open(kGolden + rel);
    REQUIRE(mf.ok());
    auto hp = ReadHParams(**mf);
    REQUIRE(hp.ok());
    auto w = BindWeights(**mf, *hp);
    REQUIRE(w.ok());
    for (const auto &L : w->layers) {
      CHECK((L.wk_b.tensor != nullptr) == split);
      CHECK((L.wv_b.tensor != nullptr) == split);
      CHECK((L.wkv_b.tensor != nullptr) == !split);
      CHECK(L.wkv_a.rows == hp->kv_lora_rank + hp->qk_rope_dim);
    }
  }
}


TEST_CASE("DeepSeek and gpt-oss greedy continuations reproduce transformers' tokens", "[golden][families]") {
  for (const char *rel : {"deepseek2_f32/hf", "deepseek3_f32/model-f32.gguf", "gptoss_f32/hf", "gptoss_f32/model-f32.gguf"}) {
    const std::string rs(rel);
    const std::string dir = kGolden + rs.substr(0, rs.find('/')) + "/";
    const auto tokens = ReadBinary<int32_t>(dir + "tokens.bin");
    const std::string path = kGolden + rs;
    moe_params p;
    moe_params_init(&p);
    p.model_path = path.c_str();
    moe_ctx *ctx = nullptr;
    INFO(path << ": " << moe_last_error());
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);  // defaults: greedy
    REQUIRE(moe_session_feed(s, tokens.data(), 12) == MOE_OK);
    for (size_t i = 12; i < tokens.size(); ++i) {
      REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
      int32_t tok = -1;
      REQUIRE(moe_session_sample(s, &tok) == MOE_OK);
      INFO("position " << i);
      CHECK(tok == tokens[i]);
      REQUIRE(moe_session_feed(s, &tok, 1) == MOE_OK);
    }
    moe_session_close(s);
    moe_ctx_close(ctx);
  }
}
