// libFuzzer target for a Hugging Face config.json: the bounded JSON reader, then the
// hyper-parameters it declares (every supported model_type). Any bytes must give hyper-parameters
// or a format / unsupported status with a message, never a crash or an escaping exception; what is
// accepted must hold the ranges the forward pass trusts.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lib/format/json.h"
#include "lib/model/hparams.h"
#include "tests/fuzz/fuzz_util.h"

using strata::fuzz::Require;
using strata::fuzz::RequireRefusal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const std::string_view text(reinterpret_cast<const char *>(data), size);
  absl::StatusOr<nlohmann::json> j = strata::format::ParseJson(text, MOE_ERR_FORMAT_CONFIG, "config.json");
  if (!j.ok()) {
    RequireRefusal(j.status(), {MOE_ERR_FORMAT});
    return 0;
  }
  absl::StatusOr<strata::model::HParams> r = absl::InternalError("not run");
  try {
    r = strata::model::HParamsFromConfig(*j);
  } catch (...) {
    Require(false);  // a JSON field of an unexpected type must be a status, not an exception
  }
  if (!r.ok()) {
    RequireRefusal(r.status(), {MOE_ERR_FORMAT, MOE_ERR_UNSUPPORTED});
    return 0;
  }
  const strata::model::HParams &hp = *r;
  Require(hp.n_layer >= 1 && hp.n_embd >= 1 && hp.n_head >= 1 && hp.n_vocab >= 1);
  Require(hp.n_head_kv >= 1 && hp.n_head % hp.n_head_kv == 0);
  Require(hp.head_dim >= 2 && hp.head_dim % 2 == 0);
  Require(hp.n_expert >= 1 && hp.n_expert_used >= 1 && hp.n_expert_used <= hp.n_expert);
  Require(hp.n_ff_expert >= 1 && hp.n_ctx_train >= 1 && hp.sliding_window >= 0);
  Require(hp.dense_layer.empty() || static_cast<int>(hp.dense_layer.size()) == hp.n_layer);
  Require(hp.layer_window.empty() || static_cast<int>(hp.layer_window.size()) == hp.n_layer);
  for (float f : {hp.rope_theta, hp.rms_eps, hp.routed_scale, hp.yarn_factor, hp.yarn_attn_factor, hp.attn_scale}) {
    Require(std::isfinite(f));
  }
  Require(hp.rope_theta > 0 && hp.rms_eps > 0);
  Require(hp.n_group >= 1 && hp.topk_group >= 1 && hp.topk_group <= hp.n_group && hp.n_expert % hp.n_group == 0);
  return 0;
}
