// The HTTP routes. A generation request is checked on its HTTP thread, handed to the engine, and
// answered through a chunked content provider that waits for the engine's pieces: streamed as
// server-sent events, or gathered into one JSON object. The provider probes the connection while it
// waits, so a client that goes away cancels its job (the engine drops its sessions before its next
// step). Signals are taken by one thread with sigwait, never by a handler.
#include "examples/server/server.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "httplib.h"

namespace strata::server {

using nlohmann::json;

namespace {

// Bodies up to this size are read whole and answered (413 above --max-body); beyond it the HTTP
// library refuses them before reading.
constexpr uint64_t kReadLimit = 64ull << 20;
constexpr auto kPoll = std::chrono::milliseconds(50);  // how often a waiting response probes its client

void SendError(httplib::Response &res, const ApiError &e) {
  res.status = e.status;
  res.set_content(Dump(ErrorJson(e)), "application/json");
}

ApiError Error(int status, const std::string &message, const std::string &type, const std::string &code) {
  ApiError e;
  e.status = status;
  e.message = message;
  e.type = type;
  e.code = code;
  return e;
}

// Requests answered, by route and status, for /metrics.
class RequestCounts {
 public:
  void Count(const std::string &path, int status) {
    static const char *const kKnown[] = {"/health", "/metrics", "/v1/models", "/v1/completions",
                                         "/v1/chat/completions"};  // other paths (a model's) count as "other"
    const bool known = std::find(std::begin(kKnown), std::end(kKnown), path) != std::end(kKnown);
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[{known ? path : "other", status}];
  }
  std::map<std::pair<std::string, int>, int64_t> Get() const {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> counts_;
};

std::string MetricsText(const ModelInfo &m, const Engine &engine, const RequestCounts &counts) {
  std::string out;
  auto metric = [&](const char *name, const char *type, const char *help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto value = [&](const std::string &series, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " %.17g\n", v);
    out += series + buf;
  };
  metric("strata_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto &[key, n] : counts.Get()) {
    value("strata_requests_total{path=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"}",
          static_cast<double>(n));
  }
  const EngineCounters c = engine.Counters();
  metric("strata_sessions_running", "gauge", "Sessions generating now (one per choice of a running request).");
  value("strata_sessions_running", static_cast<double>(c.running));
  metric("strata_requests_queued", "gauge", "Requests waiting for a free session.");
  value("strata_requests_queued", static_cast<double>(c.queued));
  metric("strata_requests_cancelled_total", "counter", "Requests whose client went away before the end.");
  value("strata_requests_cancelled_total", static_cast<double>(c.cancelled));
  metric("strata_requests_failed_total", "counter", "Requests the engine failed (I/O or compute errors).");
  value("strata_requests_failed_total", static_cast<double>(c.failed));
  metric("strata_prompt_tokens_total", "counter", "Prompt tokens processed.");
  value("strata_prompt_tokens_total", static_cast<double>(c.prompt_tokens));
  metric("strata_generated_tokens_total", "counter", "Tokens generated.");
  value("strata_generated_tokens_total", static_cast<double>(c.generated_tokens));
  metric("strata_steps_total", "counter", "Decode steps (batches) run.");
  value("strata_steps_total", static_cast<double>(c.steps));
  metric("strata_step_sessions_total", "counter", "Sessions in those steps (over strata_steps_total: the mean batch).");
  value("strata_step_sessions_total", static_cast<double>(c.step_sessions));
  metric("strata_busy_seconds_total", "counter", "Time spent stepping with at least one session.");
  value("strata_busy_seconds_total", c.busy_seconds);
  metric("strata_generated_tokens_per_second", "gauge", "Tokens generated per second of busy time, all sessions.");
  value("strata_generated_tokens_per_second", c.busy_seconds > 0 ? c.generated_tokens / c.busy_seconds : 0.0);
  moe_stats st;
  moe_stats_init(&st);
  if (moe_ctx_stats(m.ctx, &st) == MOE_OK) {
    metric("strata_expert_hits_total", "counter", "Routed-expert uses served from a tier's slots, by tier.");
    value("strata_expert_hits_total{tier=\"vram\"}", static_cast<double>(st.vram_hits));
    value("strata_expert_hits_total{tier=\"ram\"}", static_cast<double>(st.expert_hits));
    metric("strata_expert_misses_total", "counter", "Routed-expert uses that waited for a read from the model file.");
    value("strata_expert_misses_total", static_cast<double>(st.expert_misses));
    metric("strata_expert_cpu_total", "counter", "Routed-expert uses the CPU computed from host RAM instead of the GPU.");
    value("strata_expert_cpu_total", static_cast<double>(st.vram_cpu_experts));
    metric("strata_bytes_read_total", "counter", "Expert bytes read from the model files.");
    value("strata_bytes_read_total", static_cast<double>(st.bytes_read));
    metric("strata_io_wait_seconds_total", "counter", "Time compute waited for expert reads.");
    value("strata_io_wait_seconds_total", st.io_wait_s);
    metric("strata_prefetch_issued_total", "counter", "Predicted experts loaded ahead of use.");
    value("strata_prefetch_issued_total", static_cast<double>(st.prefetch_issued));
    metric("strata_prefetch_useful_total", "counter", "Prefetched experts used before eviction.");
    value("strata_prefetch_useful_total", static_cast<double>(st.prefetch_useful));
    metric("strata_evictions_total", "counter", "Experts evicted from the RAM tier.");
    value("strata_evictions_total", static_cast<double>(st.evictions));
  }
  uint64_t kv_used = 0, kv_budget = 0;
  if (moe_ctx_kv_usage(m.ctx, &kv_used, &kv_budget) == MOE_OK) {
    metric("strata_kv_bytes", "gauge", "KV cache bytes the sessions hold in RAM.");
    value("strata_kv_bytes", static_cast<double>(kv_used));
    metric("strata_kv_budget_bytes", "gauge", "The KV budget all sessions share.");
    value("strata_kv_budget_bytes", static_cast<double>(kv_budget));
  }
  return out;
}

// Takes the pieces the engine wrote so far, waiting up to kPoll for some.
void TakePieces(Job &job, std::vector<Piece> *out, bool *done, std::string *error) {
  std::unique_lock<std::mutex> lock(job.mu);
  job.cv.wait_for(lock, kPoll, [&] { return !job.pieces.empty() || job.done; });
  for (auto &p : job.pieces) out->push_back(std::move(p));
  job.pieces.clear();
  *done = job.done;
  *error = job.error;
}

std::string Event(const json &j) { return "data: " + Dump(j) + "\n\n"; }

// The response's body for a submitted request: SSE chunks, or one JSON object at the end.
httplib::ContentProviderWithoutLength Provider(const Request &req, const ModelInfo &m, Engine *engine) {
  const ResponseId rid = NewResponseId(req.chat);
  return [req, &m, engine, rid, started = std::vector<bool>(static_cast<size_t>(req.job->n_choices())),
          all = std::vector<Piece>()](size_t, httplib::DataSink &sink) mutable {
    Job &job = *req.job;
    auto gone = [&] {
      job.cancel = true;
      engine->Wake();
      return false;
    };
    for (;;) {
      std::vector<Piece> got;
      bool done = false;
      std::string error;
      TakePieces(job, &got, &done, &error);
      if (req.stream) {
        for (const Piece &p : got) {
          const bool first = req.chat && !started[static_cast<size_t>(p.index)];
          started[static_cast<size_t>(p.index)] = true;
          if (p.text.empty() && p.finish.empty() && !first && !(req.want_logprobs && p.has_token)) continue;
          const std::string ev = Event(ChunkJson(req, m, rid, p, first));
          if (!sink.write(ev.data(), ev.size())) return gone();
        }
      } else {
        for (auto &p : got) all.push_back(std::move(p));
      }
      if (done) {
        std::string tail;
        if (!error.empty()) {
          tail = req.stream ? Event(ErrorJson(Error(500, error, "server_error", "internal_error")))
                            : Dump(ErrorJson(Error(500, error, "server_error", "internal_error")));
        } else if (!req.stream) {
          tail = Dump(ResponseJson(req, m, rid, all));
        } else if (req.include_usage) {
          tail = Event(UsageChunkJson(req, m, rid));
        }
        if (req.stream) tail += "data: [DONE]\n\n";
        if (!sink.write(tail.data(), tail.size())) return gone();
        sink.done();
        return true;
      }
      if (got.empty() && !sink.is_writable()) return gone();
    }
  };
}

// The HTTP library listens with a backlog of 5 (a constant compiled into it): a burst of clients
// would overflow the accept queue and see resets. Listening again on the bound socket raises it.
class HttpServer : public httplib::Server {
 public:
  void RaiseBacklog() {
    const socket_t fd = svr_sock_;
    if (fd != INVALID_SOCKET) ::listen(fd, SOMAXCONN);
  }
};

// Constant-time comparison of the Authorization header with the key.
bool Authorized(const httplib::Request &req, const std::string &key) {
  const std::string want = "Bearer " + key, got = req.get_header_value("Authorization");
  unsigned diff = got.size() != want.size() ? 1u : 0u;
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned>(want[i] ^ (i < got.size() ? got[i] : 0));
  return diff == 0;
}

}  // namespace

sigset_t BlockStopSignals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal
  return sigs;
}

bool Serve(const ModelInfo &m, const ServerOptions &opts, std::string *error) {
  const sigset_t sigs = BlockStopSignals();

  Engine engine(m.ctx, m.parallel, opts.queue);
  RequestCounts counts;
  HttpServer svr;
  // A thread per connection being answered: the running and queued requests, plus room for
  // /health, /metrics and idle keep-alive connections.
  const size_t threads = static_cast<size_t>(m.parallel + opts.queue) + 16;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(std::max<uint64_t>(kReadLimit, opts.max_body + 1));
  svr.set_tcp_nodelay(true);
  svr.set_keep_alive_max_count(1000);

  svr.set_pre_routing_handler([&](const httplib::Request &req, httplib::Response &res) {
    if (opts.api_key.empty() || req.path == "/health" || Authorized(req, opts.api_key)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    SendError(res, Error(401, "a valid API key is needed: send the header 'Authorization: Bearer KEY'",
                         "invalid_request_error", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // The library's own refusals (no route, a body beyond its limit, a malformed request line) get
  // OpenAI's error object too.
  svr.set_error_handler([](const httplib::Request &req, httplib::Response &res) {
    if (!res.body.empty()) return;
    std::string msg = "HTTP " + std::to_string(res.status);
    if (res.status == 404) msg = "no route " + req.method + " " + req.path;
    if (res.status == 413) {
      msg = "the request body is too large";
      if (req.get_header_value("Content-Type").find("x-www-form-urlencoded") != std::string::npos) {
        msg += "; send it as Content-Type: application/json (form-encoded bodies are capped at 8 KiB)";
      }
    }
    SendError(res, Error(res.status, msg, "invalid_request_error", res.status == 404 ? "not_found" : ""));
  });
  svr.set_exception_handler([](const httplib::Request &, httplib::Response &res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception &e) {
      what = e.what();
    } catch (...) {
    }
    SendError(res, Error(500, "internal error: " + what, "server_error", "internal_error"));
  });
  svr.set_logger([&](const httplib::Request &req, const httplib::Response &res) { counts.Count(req.path, res.status); });

  const int64_t started = static_cast<int64_t>(std::time(nullptr));
  svr.Get("/health", [&](const httplib::Request &, httplib::Response &res) {
    const EngineCounters c = engine.Counters();
    res.set_content(Dump({{"status", "ok"}, {"sessions_running", c.running}, {"requests_queued", c.queued}}),
                    "application/json");
  });
  auto models = [&](const httplib::Request &, httplib::Response &res) {
    res.set_content(Dump(ModelsJson(m, started)), "application/json");
  };
  svr.Get("/v1/models", models);
  svr.Get(R"(/v1/models/(.+))", [&](const httplib::Request &req, httplib::Response &res) {
    if (req.matches[1] != m.id) {
      return SendError(res, Error(404, "the model '" + std::string(req.matches[1]) + "' does not exist; this server has '" +
                                           m.id + "'", "invalid_request_error", "model_not_found"));
    }
    res.set_content(Dump(ModelsJson(m, started)["data"][0]), "application/json");
  });
  svr.Get("/metrics", [&](const httplib::Request &, httplib::Response &res) {
    res.set_content(MetricsText(m, engine, counts), "text/plain; version=0.0.4");
  });
  auto generate = [&](bool chat) {
    return [&, chat](const httplib::Request &hreq, httplib::Response &res) {
      if (hreq.body.size() > opts.max_body) {
        return SendError(res, Error(413, "the request body is " + std::to_string(hreq.body.size()) +
                                             " bytes; this server takes at most " + std::to_string(opts.max_body) +
                                             " (--max-body)", "invalid_request_error", "request_too_large"));
      }
      json body;
      if (auto e = ParseBody(hreq.body, &body)) return SendError(res, *e);
      Request req;
      if (auto e = ParseRequest(body, chat, m, &req)) return SendError(res, *e);
      switch (engine.Submit(req.job)) {
        case Engine::Admit::kOk: break;
        case Engine::Admit::kTooLarge:
          return SendError(res, Error(400, "the request has more choices than --parallel sessions",
                                      "invalid_request_error", "invalid_value"));
        case Engine::Admit::kBusy:
          res.set_header("Retry-After", "1");
          return SendError(res, Error(503, "the server is busy: every session is running and the queue of " +
                                               std::to_string(opts.queue) + " is full; try again later",
                                      "server_error", "server_busy"));
      }
      if (req.stream) res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(req.stream ? "text/event-stream" : "application/json", Provider(req, m, &engine),
                                       [job = req.job, &engine](bool success) {
                                         if (!success) {  // the connection broke: let the engine drop the job
                                           job->cancel = true;
                                           engine.Wake();
                                         }
                                       });
    };
  };
  svr.Post("/v1/completions", generate(false));
  svr.Post("/v1/chat/completions", generate(true));

  int port = opts.port;
  if (port == 0) {
    port = svr.bind_to_any_port(opts.host);
    if (port < 0) port = 0;
  } else if (!svr.bind_to_port(opts.host, port)) {
    port = 0;
  }
  if (port != 0) svr.RaiseBacklog();
  if (port == 0) {
    *error = "cannot listen on " + opts.host + ":" + std::to_string(opts.port) + " (in use, or not an address here)";
    return false;
  }
  std::fprintf(stderr, "strata: serving '%s' on http://%s:%d (%d sessions at once, %d queued at most)%s\n",
               m.id.c_str(), opts.host.c_str(), port, m.parallel, opts.queue,
               opts.api_key.empty() ? "" : ", API key required");
  std::fflush(stderr);

  bool stopping = false;
  std::mutex stop_mu;
  std::thread watcher([&] {
    for (;;) {
      timespec wait{0, 200 * 1000 * 1000};
      const int sig = sigtimedwait(&sigs, nullptr, &wait);
      std::lock_guard<std::mutex> lock(stop_mu);
      if (stopping) return;
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "strata: stopping on signal %d\n", sig);
        stopping = true;
        engine.Shutdown();  // the responses waiting on jobs end, so the server's threads can be joined
        svr.stop();
        return;
      }
    }
  });
  bool ok = svr.listen_after_bind();
  {
    std::lock_guard<std::mutex> lock(stop_mu);
    ok = ok || stopping;  // stopped by a signal
    stopping = true;
  }
  watcher.join();
  if (!ok) *error = "the server stopped listening on " + opts.host + ":" + std::to_string(port);
  return ok;
}

}  // namespace strata::server
