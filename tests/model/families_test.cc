// Golden tests for the MoE families of issue 7 (OLMoE, Qwen2-MoE, ...): Strata's teacher-forced
// logits against transformers' on the tiny random checkpoints of tests/golden (HF and GGUF forms),
// every position, as one prefill, as prefill 12 + decode and as prefill 1 + decode; and the
// weight ledger: every tensor of the file is either a routed expert or a resident (non-routed) byte.
#include <catch2/catch.hpp>

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
    CHECK(KvCache::BytesFor(*hp, 1) == 2ull * hp->n_layer * hp->kv_dim() * sizeof(float));
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
