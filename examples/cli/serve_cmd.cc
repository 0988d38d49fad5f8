// `strata serve`: opens the model as `strata run` does (the same memory, backend and sampling flags;
// the demo model when --model is absent), sizes the KV budget for --parallel sessions, and hands the
// context to the OpenAI-compatible server in examples/server/.
#include <algorithm>
#include <cstdio>
#include <string>

#include "examples/cli/cli.h"
#include "examples/server/server.h"

namespace strata::cli {

namespace {

// The name clients use: the file's name without .gguf, or the checkpoint directory's name.
std::string ModelId(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0) name.resize(name.size() - 5);
  return name.empty() ? "model" : name;
}

}  // namespace

int CmdServe(const Args &a) {
  if (a.host.empty()) Die("--host needs an address");
  server::BlockStopSignals();  // before the context starts its threads
  const std::string model = a.model.empty() ? DemoModelPath() : a.model;
  Args with_sessions = a;
  with_sessions.max_sessions = std::max(a.max_sessions, a.parallel);  // KV for every running session
  moe_params p = ContextParams(with_sessions, model);
  Ctx ctx;
  if (moe_status st = moe_ctx_open(&p, &ctx.c); st != MOE_OK) DieOpening(model, st);
  WarnIfClamped(ctx.c, a);
  if (!HasTokenizer(ctx.c)) Die("'" + model + "' carries no tokenizer; serve needs one");

  server::ModelInfo m;
  m.id = ModelId(model);
  m.ctx = ctx.c;
  m.n_vocab = moe_ctx_vocab_size(ctx.c);
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  if (moe_status st = moe_ctx_plan(ctx.c, &plan); st != MOE_OK) Die(ApiError(st));
  m.n_ctx = plan.n_ctx;
  m.parallel = static_cast<int>(a.parallel);

  // The chat template: --template, else the model's; without one the chat route answers 400.
  std::string tmpl = a.chat_template;
  if (tmpl.empty()) {
    const char *name = nullptr;
    if (moe_ctx_chat_template_name(ctx.c, &name) == MOE_OK) {
      tmpl = name;
    } else {
      m.template_error = moe_last_error();
    }
  }
  if (!tmpl.empty()) {
    const moe_chat_message probe[1] = {{"user", "hello"}};
    size_t n = 0;
    moe_status st = moe_chat_tokenize(ctx.c, tmpl.c_str(), probe, 1, 1, nullptr, 0, &n);
    if (st != MOE_OK && st != MOE_ERR_LIMIT) Die("chat template '" + tmpl + "': " + ApiError(st));
    m.chat_template = tmpl;
    if (const char *eot = EndOfTurn(tmpl)) {
      std::vector<int32_t> ids = Tokenize(ctx.c, eot, true, false);
      if (ids.size() == 1) {
        m.end_of_turn_tokens = ids;
      } else {
        m.end_of_turn_text = eot;  // a model without the marker as a token may still write it as text
      }
    }
  } else {
    std::fprintf(stderr, "strata: warning: no chat template (%s); /v1/chat/completions will refuse requests, "
                 "--template NAME chooses one\n", m.template_error.c_str());
  }

  server::Sampling &d = m.defaults;
  d.temperature = a.temp;
  d.top_k = static_cast<int32_t>(a.top_k);
  d.top_p = a.top_p;
  d.min_p = a.min_p;
  d.repeat_penalty = a.repeat_penalty;
  d.presence_penalty = a.presence_penalty;
  d.frequency_penalty = a.frequency_penalty;
  d.penalty_last_n = static_cast<int32_t>(a.repeat_last_n);
  d.seed = a.seed;
  d.stop = a.stop;
  m.default_max_tokens = a.n_predict_given ? std::max<int64_t>(a.n_predict, 1) : -1;
  if (a.keep_given && !a.context_shift) Die("--keep sets what a context shift keeps: give it with --context-shift");
  m.context_shift = a.context_shift;
  m.keep = static_cast<int32_t>(a.keep);

  server::ServerOptions opts;
  opts.host = a.host;
  opts.port = static_cast<int>(a.port);
  opts.api_key = a.api_key;
  opts.queue = static_cast<int>(a.queue);
  opts.max_body = a.max_body;
  std::string error;
  if (!server::Serve(m, opts, &error)) Die(error);
  PrintStatsIf(a, ctx.c);
  return 0;
}

}  // namespace strata::cli
