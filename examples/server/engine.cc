// The engine's thread: admit queued jobs while sessions are free, step the context once, then give
// every session whose input is processed its next token. Cancelled jobs are dropped before each
// step, so a client that went away costs at most the step in flight.
#include "examples/server/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

namespace strata::server {

namespace {

std::string LastError(moe_status st) { return std::string(moe_last_error()) + " (" + moe_status_string(st) + ")"; }

// log-softmax of the raw logits at `token`, and the `k` most likely tokens (the lower id first
// among equal logits).
TokenLogprob Logprobs(const float *l, int32_t n_vocab, int32_t token, int k) {
  TokenLogprob out;
  out.token = token;
  float mx = l[0];
  for (int32_t i = 1; i < n_vocab; ++i) mx = std::max(mx, l[i]);
  double sum = 0;
  for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(l[i]) - mx);
  const double lse = mx + std::log(sum);
  out.logprob = static_cast<float>(l[token] - lse);
  k = std::min<int>(k, n_vocab);
  if (k > 0) {
    std::vector<int32_t> idx(n_vocab);
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int i = 0; i < k; ++i) out.top.emplace_back(idx[i], static_cast<float>(l[idx[i]] - lse));
  }
  return out;
}

}  // namespace

Engine::Engine(moe_ctx *ctx, int parallel, int queue) : ctx_(ctx), parallel_(parallel), queue_(queue) {
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(); }

void Engine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::vector<std::shared_ptr<Job>> jobs;
  for (const Slot &slot : slots_) {
    if (std::find(jobs.begin(), jobs.end(), slot.job) == jobs.end()) jobs.push_back(slot.job);
  }
  for (const auto &job : jobs) {
    Drop(job);
    Finish(job, "the server is shutting down");
  }
  std::deque<std::shared_ptr<Job>> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    waiting.swap(waiting_);
  }
  for (const auto &job : waiting) Finish(job, "the server is shutting down");
}

Engine::Admit Engine::Submit(const std::shared_ptr<Job> &job) {
  if (job->n_choices() > parallel_) return Admit::kTooLarge;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return Admit::kBusy;
    // A job that will run as soon as the engine looks (free sessions, none queued before it) never
    // counts against the queue, also while the engine has not yet taken it.
    int64_t free = 0;
    const int64_t queued = QueuedLocked(&free);
    const bool runs_now = queued == 0 && job->n_choices() <= free;
    if (!runs_now && queued >= queue_) return Admit::kBusy;
    waiting_.push_back(job);
  }
  cv_.notify_all();
  return Admit::kOk;
}

void Engine::Wake() { cv_.notify_all(); }

// The waiting jobs that cannot start yet: those from the first that does not fit in the free
// sessions on (the engine admits in order). *free: the sessions left for a new job.
int64_t Engine::QueuedLocked(int64_t *free) const {
  int64_t left = parallel_ - running_sessions_, queued = 0;
  for (const auto &job : waiting_) {
    if (queued == 0 && job->n_choices() <= left) {
      left -= job->n_choices();
    } else {
      ++queued;
    }
  }
  if (free != nullptr) *free = left;
  return queued;
}

EngineCounters Engine::Counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineCounters c = counters_;
  c.queued = QueuedLocked(nullptr);
  c.running = running_sessions_;
  return c;
}

void Engine::Finish(const std::shared_ptr<Job> &job, const std::string &error) {
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (!job->done) job->error = error;
    job->done = true;
  }
  job->cv.notify_all();
}

// Closes the job's sessions and gives their places back.
void Engine::Drop(const std::shared_ptr<Job> &job) {
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (it->job == job) {
      moe_session_close(it->s);
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  running_sessions_ -= job->live;  // the choices that ended earlier gave theirs back as they ended
  job->live = 0;
}

// Opens a session for each choice and feeds it its prompt.
void Engine::Start(const std::shared_ptr<Job> &job) {
  const Sampling &sm = job->sampling;
  std::vector<const char *> stops;
  for (const auto &s : sm.stop) stops.push_back(s.c_str());
  int64_t prompt_tokens = 0;
  for (const auto &p : job->prompts) prompt_tokens += static_cast<int64_t>(p.size());
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->prompt_tokens = prompt_tokens;
  }
  job->live = job->n_choices();
  for (int i = 0; i < job->n_choices(); ++i) {
    moe_session_params sp;
    moe_session_params_init(&sp);
    sp.temperature = sm.temperature;
    sp.top_k = sm.top_k;
    sp.top_p = sm.top_p;
    sp.min_p = sm.min_p;
    sp.repeat_penalty = sm.repeat_penalty;
    sp.presence_penalty = sm.presence_penalty;
    sp.frequency_penalty = sm.frequency_penalty;
    sp.penalty_last_n = sm.penalty_last_n;
    sp.seed = sm.seed + static_cast<uint64_t>(i % job->n);  // the n choices of a prompt differ by seed
    sp.stop_strings = stops.data();
    sp.n_stop_strings = stops.size();
    sp.stop_tokens = sm.stop_tokens.data();
    sp.n_stop_tokens = sm.stop_tokens.size();
    Slot slot;
    slot.job = job;
    slot.index = i;
    const auto &prompt = job->prompts[static_cast<size_t>(i / job->n)];
    if (job->context_shift) {
      // As llama.cpp's server: --keep tokens of the prompt, and its BOS.
      const int32_t n = static_cast<int32_t>(prompt.size()), bos = moe_ctx_token_bos(ctx_);
      const int32_t with_bos = job->keep + (n > 0 && bos >= 0 && prompt[0] == bos ? 1 : 0);
      sp.ctx_shift = 1;
      sp.n_keep = job->keep < 0 ? n : std::min(n, with_bos);
    }
    moe_status st = moe_session_open(ctx_, &sp, &slot.s);
    if (st == MOE_OK) st = moe_session_feed(slot.s, prompt.data(), prompt.size());
    if (st != MOE_OK) {
      const std::string why = LastError(st);
      moe_session_close(slot.s);
      Drop(job);  // also gives back the places of the choices not opened
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++counters_.failed;
      }
      Finish(job, "cannot start the request: " + why);
      return;
    }
    slots_.push_back(std::move(slot));
  }
  std::lock_guard<std::mutex> lock(mu_);
  counters_.prompt_tokens += prompt_tokens;
}

// Samples the slot's next token, hands its text to the job, and feeds the token or ends the choice.
void Engine::Advance(Slot &slot, bool *finished) {
  Job &job = *slot.job;
  Piece piece;
  piece.index = slot.index;
  piece.has_token = true;
  const float *logits = nullptr;
  int32_t n_vocab = 0;
  if (job.logprobs >= 0 && moe_session_logits(slot.s, &logits, &n_vocab) != MOE_OK) logits = nullptr;
  int32_t tok = -1, stop = MOE_STOP_NONE;
  const char *text = nullptr;
  size_t n = 0;
  moe_status st = moe_session_sample_text(slot.s, &tok, &text, &n, &stop);
  if (st == MOE_OK) {
    piece.text.assign(text, n);
    if (logits != nullptr) piece.logprob = Logprobs(logits, n_vocab, tok, job.logprobs);
    ++slot.n_gen;
    if (stop != MOE_STOP_NONE) {
      piece.finish = "stop";
    } else if (slot.n_gen >= job.max_tokens || (st = moe_session_feed(slot.s, &tok, 1)) == MOE_ERR_LIMIT_CONTEXT) {
      st = moe_session_text_end(slot.s, &text, &n);
      if (st == MOE_OK) piece.text.append(text, n);
      piece.finish = "length";
    }
  }
  if (st != MOE_OK) {
    const std::string why = LastError(st);
    Finish(slot.job, "generation failed: " + why);
    *finished = true;
    return;
  }
  *finished = !piece.finish.empty();
  {
    std::lock_guard<std::mutex> lock(job.mu);
    ++job.completion_tokens;
    job.pieces.push_back(std::move(piece));
    if (*finished && --job.live == 0) job.done = true;
  }
  job.cv.notify_all();
}

void Engine::Loop() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> admitted, gone;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty() || !slots_.empty(); });
      if (stop_) return;
      // Queued jobs whose clients went away leave the queue at once.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if ((*it)->cancel.load()) {
          gone.push_back(std::move(*it));
          it = waiting_.erase(it);
          ++counters_.cancelled;
        } else {
          ++it;
        }
      }
      while (!waiting_.empty() && running_sessions_ + waiting_.front()->n_choices() <= parallel_) {
        running_sessions_ += waiting_.front()->n_choices();
        admitted.push_back(std::move(waiting_.front()));
        waiting_.pop_front();
      }
    }
    for (const auto &job : gone) Finish(job, "");
    gone.clear();
    for (const auto &job : admitted) {
      if (job->cancel.load()) {
        std::lock_guard<std::mutex> lock(mu_);
        running_sessions_ -= job->n_choices();
        ++counters_.cancelled;
        Finish(job, "");
      } else {
        Start(job);
      }
    }
    // Clients that went away: their sessions close before the step.
    for (const Slot &slot : slots_) {
      if (slot.job->cancel.load() && std::find(gone.begin(), gone.end(), slot.job) == gone.end()) {
        gone.push_back(slot.job);
      }
    }
    for (const auto &job : gone) {
      Drop(job);
      Finish(job, "");
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.cancelled;
    }
    if (slots_.empty()) continue;

    const auto t0 = std::chrono::steady_clock::now();
    const int64_t in_step = static_cast<int64_t>(slots_.size());
    uint32_t pending = 0;
    const moe_status st = moe_ctx_step(ctx_, &pending);
    if (st != MOE_OK) {
      // Every running job fails: its sessions keep the input the step could not run.
      const std::string why = "a decode step failed: " + LastError(st);
      std::vector<std::shared_ptr<Job>> jobs;
      for (const Slot &slot : slots_) {
        if (std::find(jobs.begin(), jobs.end(), slot.job) == jobs.end()) jobs.push_back(slot.job);
      }
      for (const auto &job : jobs) {
        Drop(job);
        Finish(job, why);
        std::lock_guard<std::mutex> lock(mu_);
        ++counters_.failed;
      }
      continue;
    }
    int64_t generated = 0;
    std::vector<std::shared_ptr<Job>> failed;
    for (size_t i = 0; i < slots_.size();) {
      Slot &slot = slots_[i];
      if (moe_session_ready(slot.s) != 1 || std::find(failed.begin(), failed.end(), slot.job) != failed.end()) {
        ++i;
        continue;
      }
      bool finished = false;
      Advance(slot, &finished);
      ++generated;
      if (!finished) {
        ++i;
        continue;
      }
      bool job_failed;
      {
        std::lock_guard<std::mutex> lock(slot.job->mu);
        job_failed = !slot.job->error.empty();
      }
      if (job_failed) {
        if (std::find(failed.begin(), failed.end(), slot.job) == failed.end()) failed.push_back(slot.job);
        ++i;
        continue;
      }
      moe_session_close(slot.s);
      slots_.erase(slots_.begin() + static_cast<std::ptrdiff_t>(i));
      std::lock_guard<std::mutex> lock(mu_);
      --running_sessions_;
    }
    for (const auto &job : failed) {
      Drop(job);
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.failed;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu_);
    counters_.generated_tokens += generated;
    counters_.busy_seconds += dt;
    ++counters_.steps;
    counters_.step_sessions += in_step;
  }
}

}  // namespace strata::server
