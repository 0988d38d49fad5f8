// The server's engine: one thread that owns every session and drives the context through the C ABI
// (open, feed, moe_ctx_step, sample, close), so that concurrent requests decode together in one
// continuous batch. HTTP threads only hand it jobs and read what it writes back; no session call ever
// runs on two threads. A job's text depends only on its own prompt and sampling settings: the library
// computes each session's logits bit-identically to running it alone.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "include/strata/moe.h"

namespace strata::server {

// What a request asks of the sampler (moe_session_params' fields).
struct Sampling {
  float temperature = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.f;
  float repeat_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  int32_t penalty_last_n = 64;
  uint64_t seed = 42;
  std::vector<std::string> stop;      // stop strings (not shown in the text)
  std::vector<int32_t> stop_tokens;   // beside EOS (a chat template's end of turn)
};

// One sampled token's log-probability under the model (log-softmax of the raw logits, before
// penalties and temperature) and, when asked, the most likely alternatives.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.f;
  std::vector<std::pair<int32_t, float>> top;  // most likely first
};

// What the engine writes back for a choice: text that became final with one token (possibly empty
// while bytes are held back), and on the last piece the reason it ended ("stop" or "length").
struct Piece {
  int index = 0;
  std::string text;
  bool has_token = false;  // false for the text flushed at the end without a new token
  TokenLogprob logprob;    // when the job asked for logprobs and has_token
  std::string finish;      // "" until the choice's last piece
};

// A request as the engine runs it. The HTTP thread fills the request part, submits it, then reads
// pieces until done; the engine fills the rest under `mu` and signals `cv`.
struct Job {
  // Request (read-only once submitted).
  std::vector<std::vector<int32_t>> prompts;  // choices: n for each prompt, index = prompt * n + k
  int n = 1;
  int64_t max_tokens = 16;
  int logprobs = -1;  // -1: none; k >= 0: the sampled token's and the k most likely
  Sampling sampling;
  // Context shift (serve --context-shift): a full context drops half its tokens after the first
  // `keep` of the prompt (a BOS it starts with kept beside them; -1: the whole prompt) and goes on.
  bool context_shift = false;
  int32_t keep = 0;

  int n_choices() const { return static_cast<int>(prompts.size()) * n; }

  // Output.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Piece> pieces;
  bool done = false;
  std::string error;  // set with done when the engine failed the job (an internal or I/O failure)
  int64_t prompt_tokens = 0, completion_tokens = 0;

  // Set by the HTTP thread when its client went away: the engine closes the sessions at its next turn.
  std::atomic<bool> cancel{false};

  int live = 0;  // the engine thread's own: choices still generating
};

struct EngineCounters {
  int64_t running = 0, queued = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, cancelled = 0, failed = 0;
  int64_t steps = 0, step_sessions = 0;  // steps run, and the sessions in them (their mean: the batch)
  double busy_seconds = 0;  // time spent stepping with at least one session
};

class Engine {
 public:
  // At most `parallel` sessions run at once (a job takes one per choice); at most `queue` jobs wait.
  Engine(moe_ctx *ctx, int parallel, int queue);
  ~Engine();  // Shutdown()
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  enum class Admit { kOk, kBusy, kTooLarge };
  // kTooLarge: the job has more choices than `parallel`; kBusy: the queue is full.
  Admit Submit(const std::shared_ptr<Job> &job);
  // Stops the thread; unfinished jobs end with an error and new ones are refused (kBusy). Call it
  // from one thread at a time.
  void Shutdown();
  // Wakes the engine so it notices a cancelled job now rather than at its next step.
  void Wake();
  EngineCounters Counters() const;
  int parallel() const { return parallel_; }

 private:
  struct Slot {
    std::shared_ptr<Job> job;
    int index = 0;
    moe_session *s = nullptr;
    int64_t n_gen = 0;
  };
  int64_t QueuedLocked(int64_t *free) const;
  void Loop();
  void Start(const std::shared_ptr<Job> &job);
  void Advance(Slot &slot, bool *finished);
  void Finish(const std::shared_ptr<Job> &job, const std::string &error);
  void Drop(const std::shared_ptr<Job> &job);

  moe_ctx *ctx_;
  const int parallel_, queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  int64_t running_sessions_ = 0;  // under mu_: the sessions of the jobs taken from waiting_
  bool stop_ = false;
  EngineCounters counters_;       // under mu_
  std::vector<Slot> slots_;       // the engine thread's alone
  std::thread thread_;
};

}  // namespace strata::server
