// `strata serve`'s HTTP side: an OpenAI-compatible server (cpp-httplib) in front of the engine.
// Routes: GET /health, GET /v1/models (and /v1/models/ID), POST /v1/completions, POST /v1/chat/completions (stream: true
// as server-sent events ending with `data: [DONE]`), GET /metrics (Prometheus text). Every error is
// OpenAI's error object with a 4xx/5xx status; the server keeps serving after any bad request.
#pragma once

#include <signal.h>

#include <cstdint>
#include <string>

#include "examples/server/openai_api.h"

namespace strata::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port (the line on stderr names it)
  std::string api_key;         // non-empty: every route but /health needs `Authorization: Bearer KEY`
  int queue = 64;              // requests waiting beyond --parallel; more get 503
  uint64_t max_body = 1 << 20; // larger bodies get 413
};

// Blocks SIGINT and SIGTERM in the calling thread and the threads it starts from now on (Serve's
// watcher takes them with sigwait), and ignores SIGPIPE. Call it before any thread starts: the
// context's own threads too, so moe_ctx_open comes after.
sigset_t BlockStopSignals();

// Serves until SIGINT or SIGTERM. Returns false with *error when it cannot listen.
bool Serve(const ModelInfo &model, const ServerOptions &opts, std::string *error);

}  // namespace strata::server
