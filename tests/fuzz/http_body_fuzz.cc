// libFuzzer target for the HTTP server's request bodies (/v1/completions, /v1/chat/completions): the
// first byte picks the route, the rest is the body, read as `strata serve` reads it and checked by
// ParseRequest against the bundled demo model (opened once, with its chat template). Any body must
// give a job or an OpenAI error object with a message, never a crash, an exception or a stack
// overflow; a job's prompts hold token ids of the model, and its error JSON always serialises.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "examples/server/openai_api.h"
#include "include/strata/moe.h"
#include "tests/fuzz/fuzz_util.h"

using strata::fuzz::Require;

namespace {

const strata::server::ModelInfo &Demo() {
  static const strata::server::ModelInfo *info = [] {
    const std::string path = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe-q4_k.gguf";
    moe_params p;
    moe_params_init(&p);
    p.model_path = path.c_str();
    p.n_threads = 1;
    moe_ctx *ctx = nullptr;
    Require(moe_ctx_open(&p, &ctx) == MOE_OK);
    auto *m = new strata::server::ModelInfo();
    m->id = "austen-moe-q4_k";
    m->ctx = ctx;
    m->n_vocab = moe_ctx_vocab_size(ctx);
    m->n_ctx = 2048;
    m->parallel = 4;
    const char *name = nullptr;
    if (moe_ctx_chat_template_name(ctx, &name) == MOE_OK) m->chat_template = name;
    m->end_of_turn_text = "<|im_end|>";
    return m;
  }();
  return *info;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const bool chat = (data[0] & 1) != 0;
  const std::string_view text(reinterpret_cast<const char *>(data + 1), size - 1);
  const strata::server::ModelInfo &m = Demo();
  nlohmann::json body;
  if (auto bad = strata::server::ParseBody(text, &body)) {
    Require(!bad->message.empty() && bad->status == 400);
    return 0;
  }
  strata::server::Request req;
  std::optional<strata::server::ApiError> e;
  try {
    e = strata::server::ParseRequest(body, chat, m, &req);
  } catch (...) {
    Require(false);  // a field of an unexpected JSON type must be an ApiError, not an exception
  }
  if (e.has_value()) {
    Require(!e->message.empty() && e->status >= 400 && e->status < 600);
    Require(!strata::server::Dump(strata::server::ErrorJson(*e)).empty());
    return 0;
  }
  Require(req.job != nullptr && !req.job->prompts.empty());
  for (const auto &prompt : req.job->prompts) {
    for (int32_t id : prompt) Require(id >= 0 && id < m.n_vocab);
  }
  return 0;
}
