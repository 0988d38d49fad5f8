// strata/moe.hpp — header-only C++17 conveniences over the C ABI of <strata/moe.h>: RAII handles,
// span-like views and exceptions. It has no ABI of its own: everything here is inline and calls the
// C functions, so it works with any libstrata of the same or a later version.
//
//   strata::Context ctx("model.gguf");               // or strata::Context(params)
//   strata::Session npc = ctx.session();
//   npc.feed(ctx.tokenize("Hello", MOE_TOKENIZE_ADD_BOS));
//   while (ctx.step() > 0) {}
//   int32_t next = npc.sample();
//
// Errors: every failing call throws strata::Error, carrying the moe_status and moe_last_error()'s
// message. Ownership: a Session keeps its context open (the context closes when the last Context
// and Session referring to it are gone), so destruction order never matters. Thread safety is that
// of the C call each method makes (see moe.h): a Session is used by one thread at a time;
// Context::abort may be called from any thread.
#ifndef STRATA_MOE_HPP_
#define STRATA_MOE_HPP_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/moe.h"

namespace strata {

// A failed call: what() is moe_last_error()'s message, status() the moe_status.
class Error : public std::runtime_error {
 public:
  Error(moe_status status, const std::string &message)
      : std::runtime_error(message.empty() ? std::string(moe_status_string(status)) : message), status_(status) {}
  moe_status status() const noexcept { return status_; }
  // The coarse category (MOE_ERR_FORMAT for every MOE_ERR_FORMAT_*).
  moe_status category() const noexcept { return MOE_STATUS_CATEGORY(status_); }
  const char *status_name() const noexcept { return moe_status_string(status_); }

 private:
  moe_status status_;
};

namespace detail {
inline void Check(moe_status st) {
  if (st != MOE_OK) throw Error(st, moe_last_error());
}
}  // namespace detail

// A read-only view of n contiguous elements (std::span's shape, for C++17).
template <typename T>
class Span {
 public:
  constexpr Span() noexcept = default;
  constexpr Span(T *data, size_t size) noexcept : data_(data), size_(size) {}
  // From a container with data() and size() (a std::vector, std::array, std::string, a Span); a
  // temporary lives to the end of the full expression, so `s.feed(ctx.tokenize(text))` is fine.
  template <typename C, typename = std::enable_if_t<std::is_convertible_v<decltype(std::declval<C &>().data()), T *>>>
  constexpr Span(C &&c) noexcept : data_(c.data()), size_(c.size()) {}  // NOLINT: implicit, as std::span
  constexpr T *data() const noexcept { return data_; }
  constexpr size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr T *begin() const noexcept { return data_; }
  constexpr T *end() const noexcept { return data_ + size_; }
  constexpr T &operator[](size_t i) const noexcept { return data_[i]; }
  // A copy of the elements (views into a session die with its next step).
  std::vector<std::remove_const_t<T>> to_vector() const { return {data_, data_ + size_}; }

 private:
  T *data_ = nullptr;
  size_t size_ = 0;
};

// One token sampled as text (Session::sample_text): `text` is valid until the next call on the session.
struct TextPiece {
  int32_t token = -1;
  std::string_view text;
  int32_t stop = MOE_STOP_NONE;  // MOE_STOP_*
};

inline std::string version() { return moe_version_string(); }
// moe_log_set: lines to fn(level, msg, user) instead of stderr; nullptr restores stderr.
inline void set_log(moe_log_fn fn, void *user = nullptr) noexcept { moe_log_set(fn, user); }

namespace detail {
inline std::function<void(int32_t, std::string_view)> &LogFunction() {
  static std::function<void(int32_t, std::string_view)> fn;
  return fn;
}
inline void LogTrampoline(int32_t level, const char *msg, void *) {
  try {
    LogFunction()(level, msg);
  } catch (...) {
    // An exception from the host's function must not unwind into the library.
  }
}
}  // namespace detail

// The library's log lines to a C++ callable (level MOE_LOG_*, the line without its newline); an
// empty function restores stderr. Not to be called from inside the callable.
inline void set_log(std::function<void(int32_t level, std::string_view line)> fn) {
  moe_log_set(nullptr, nullptr);  // the old callable is no longer running once this returns
  detail::LogFunction() = std::move(fn);
  if (detail::LogFunction()) moe_log_set(detail::LogTrampoline, nullptr);
}

class Context;

// One conversation: a unique handle (movable, not copyable), closed by its destructor.
class Session {
 public:
  Session() noexcept = default;
  Session(Session &&o) noexcept : ctx_(std::move(o.ctx_)), s_(std::exchange(o.s_, nullptr)) {}
  Session &operator=(Session &&o) noexcept {
    if (this != &o) {
      reset();
      ctx_ = std::move(o.ctx_);
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  Session(const Session &) = delete;
  Session &operator=(const Session &) = delete;
  ~Session() { reset(); }

  moe_session *get() const noexcept { return s_; }
  explicit operator bool() const noexcept { return s_ != nullptr; }
  // Closes the session now (its KV blocks go back to the context's budget).
  void reset() noexcept {
    moe_session_close(s_);
    s_ = nullptr;
    ctx_.reset();
  }

  void feed(Span<const int32_t> tokens) { detail::Check(moe_session_feed(s_, tokens.data(), tokens.size())); }
  void feed(std::initializer_list<int32_t> tokens) { detail::Check(moe_session_feed(s_, tokens.begin(), tokens.size())); }
  bool ready() const noexcept { return moe_session_ready(s_) == 1; }
  int32_t n_past() const noexcept { return moe_session_n_past(s_); }
  int32_t n_pending() const noexcept { return moe_session_n_pending(s_); }
  // The logits after the last processed token; valid until this session's input is processed again.
  Span<const float> logits() const {
    const float *l = nullptr;
    int32_t n = 0;
    detail::Check(moe_session_logits(s_, &l, &n));
    return {l, static_cast<size_t>(n)};
  }
  // With logits_all: every row of the last input, row-major (*n_tokens rows of n_vocab).
  Span<const float> logits_all(int32_t *n_tokens, int32_t *n_vocab) const {
    const float *l = nullptr;
    detail::Check(moe_session_logits_all(s_, &l, n_tokens, n_vocab));
    return {l, static_cast<size_t>(*n_tokens) * static_cast<size_t>(*n_vocab)};
  }
  int32_t sample() {
    int32_t t = -1;
    detail::Check(moe_session_sample(s_, &t));
    return t;
  }
  TextPiece sample_text() {
    TextPiece p;
    const char *text = nullptr;
    size_t n = 0;
    detail::Check(moe_session_sample_text(s_, &p.token, &text, &n, &p.stop));
    p.text = std::string_view(text, n);
    return p;
  }
  std::string_view text_end() {
    const char *text = nullptr;
    size_t n = 0;
    detail::Check(moe_session_text_end(s_, &text, &n));
    return std::string_view(text, n);
  }
  // A copy sharing this session's KV blocks until they diverge (moe_session_fork).
  Session fork() const {
    moe_session *out = nullptr;
    detail::Check(moe_session_fork(s_, &out));
    return Session(ctx_, out);
  }
  void rewind(int32_t n_tokens) { detail::Check(moe_session_rewind(s_, n_tokens)); }
  // Drops n_discard tokens after the first n_keep, the rest moved down (moe_session_shift).
  void shift(int32_t n_keep, int32_t n_discard) { detail::Check(moe_session_shift(s_, n_keep, n_discard)); }
  // The snapshot's bytes (moe_session_save_buffer), for a host's save system.
  std::vector<uint8_t> save() const {
    size_t need = 0;
    const moe_status st = moe_session_save_buffer(s_, nullptr, 0, &need);
    if (st != MOE_ERR_LIMIT) detail::Check(st == MOE_OK ? MOE_ERR_INTERNAL : st);
    std::vector<uint8_t> buf(need);
    size_t n = 0;
    detail::Check(moe_session_save_buffer(s_, buf.data(), buf.size(), &n));
    buf.resize(n);
    return buf;
  }
  void save(const std::string &path) const { detail::Check(moe_session_save(s_, path.c_str())); }
  void evict() { detail::Check(moe_session_evict(s_)); }
  uint64_t kv_bytes() const noexcept { return moe_session_kv_bytes(s_); }

 private:
  friend class Context;
  Session(std::shared_ptr<moe_ctx> ctx, moe_session *s) noexcept : ctx_(std::move(ctx)), s_(s) {}
  std::shared_ptr<moe_ctx> ctx_;  // keeps the context open while the session lives
  moe_session *s_ = nullptr;
};

// A model opened with its tiers and backend. Movable, not copyable; the context itself closes when
// this and every Session opened on it are gone.
class Context {
 public:
  explicit Context(const moe_params &p) {
    moe_ctx *c = nullptr;
    detail::Check(moe_ctx_open(&p, &c));
    ctx_.reset(c, moe_ctx_close);
  }
  explicit Context(const std::string &model_path, int32_t backend = MOE_BACKEND_AUTO) {
    moe_params p;
    moe_params_init(&p);
    p.model_path = model_path.c_str();
    p.backend = backend;
    moe_ctx *c = nullptr;
    detail::Check(moe_ctx_open(&p, &c));
    ctx_.reset(c, moe_ctx_close);
  }
  Context(Context &&) noexcept = default;
  Context &operator=(Context &&) noexcept = default;
  Context(const Context &) = delete;
  Context &operator=(const Context &) = delete;

  moe_ctx *get() const noexcept { return ctx_.get(); }

  Session session(const moe_session_params *p = nullptr) const {
    moe_session *s = nullptr;
    detail::Check(moe_session_open(ctx_.get(), p, &s));
    return Session(ctx_, s);
  }
  Session session(const moe_session_params &p) const { return session(&p); }
  Session load(const std::string &path, const moe_session_params *p = nullptr) const {
    moe_session *s = nullptr;
    detail::Check(moe_session_load(ctx_.get(), path.c_str(), p, &s));
    return Session(ctx_, s);
  }
  Session load(Span<const uint8_t> bytes, const moe_session_params *p = nullptr) const {
    moe_session *s = nullptr;
    detail::Check(moe_session_load_buffer(ctx_.get(), bytes.data(), bytes.size(), p, &s));
    return Session(ctx_, s);
  }

  // One batch over all sessions with input; returns the sessions still with input.
  uint32_t step() const {
    uint32_t pending = 0;
    detail::Check(moe_ctx_step(ctx_.get(), &pending));
    return pending;
  }
  // Batches while the next is expected to end within `budget`; returns the sessions still with input.
  uint32_t step_for(std::chrono::microseconds budget, uint32_t *n_steps = nullptr) const {
    uint32_t pending = 0;
    detail::Check(moe_ctx_step_for(ctx_.get(), static_cast<uint64_t>(budget.count() > 0 ? budget.count() : 0),
                                   &pending, n_steps));
    return pending;
  }
  // Stops the running step (or the next one) with MOE_ERR_ABORTED; callable from any thread.
  void abort() const noexcept { (void)moe_ctx_abort(ctx_.get()); }

  int32_t vocab_size() const noexcept { return moe_ctx_vocab_size(ctx_.get()); }
  int32_t token_bos() const noexcept { return moe_ctx_token_bos(ctx_.get()); }
  int32_t token_eos() const noexcept { return moe_ctx_token_eos(ctx_.get()); }
  std::vector<int32_t> tokenize(std::string_view text, uint32_t flags = 0) const {
    size_t n = 0;
    const moe_status st = moe_tokenize(ctx_.get(), text.data(), text.size(), flags, nullptr, 0, &n);
    if (st != MOE_OK && st != MOE_ERR_LIMIT) detail::Check(st);
    std::vector<int32_t> ids(n);
    if (n > 0) detail::Check(moe_tokenize(ctx_.get(), text.data(), text.size(), flags, ids.data(), ids.size(), &n));
    ids.resize(n);
    return ids;
  }
  std::string detokenize(Span<const int32_t> ids) const {
    size_t n = 0;
    const moe_status st = moe_detokenize(ctx_.get(), ids.data(), ids.size(), nullptr, 0, &n);
    if (st != MOE_OK && st != MOE_ERR_LIMIT) detail::Check(st);
    std::string out(n, '\0');
    if (n > 0) detail::Check(moe_detokenize(ctx_.get(), ids.data(), ids.size(), &out[0], out.size(), &n));
    out.resize(n);
    return out;
  }
  moe_cache_plan plan() const {
    moe_cache_plan p;
    moe_cache_plan_init(&p);
    detail::Check(moe_ctx_plan(ctx_.get(), &p));
    return p;
  }
  moe_stats stats() const {
    moe_stats s;
    moe_stats_init(&s);
    detail::Check(moe_ctx_stats(ctx_.get(), &s));
    return s;
  }
  // KV bytes all sessions hold, and the budget they share.
  std::pair<uint64_t, uint64_t> kv_usage() const {
    uint64_t used = 0, budget = 0;
    detail::Check(moe_ctx_kv_usage(ctx_.get(), &used, &budget));
    return {used, budget};
  }

 private:
  std::shared_ptr<moe_ctx> ctx_;
};

}  // namespace strata

#endif  // STRATA_MOE_HPP_
