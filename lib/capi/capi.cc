// The C ABI: the one place where internal absl::Status values become moe_status codes and
// thread-local error messages, and where no C++ exception is allowed to pass.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "include/strata/moe.h"
#include "lib/model/backend_registry.h"
#include "lib/runtime/context.h"
#include "lib/text/chat_template.h"
#include "lib/util/log.h"
#include "lib/util/safe_text.h"
#include "lib/util/status.h"

struct moe_expert_table {
  uint32_t n_layers = 0;
  uint32_t n_experts = 0;
  const strata::store::ExpertTable *table = nullptr;
};

struct moe_session;

struct moe_ctx {
  std::unique_ptr<strata::runtime::Context> impl;
  moe_expert_table experts;
  std::vector<moe_session *> sessions;
  std::mutex mu;
};

struct moe_session {
  moe_ctx *ctx = nullptr;
  strata::runtime::Session *impl = nullptr;
  std::string text;  // moe_session_sample_text / moe_session_text_end output
};

namespace {

thread_local std::string g_last_error;

// Every message leaves escaped: it may quote a file's or a caller's bytes (a NUL would cut it, a
// terminal escape or invalid UTF-8 would reach the host's log).
moe_status Fail(moe_status st, std::string msg) {
  g_last_error = strata::SafeText(msg, 1 << 16);
  return st;
}

moe_status FromStatus(const absl::Status &st) {
  if (st.ok()) return MOE_OK;
  return Fail(strata::StatusToMoe(st), std::string(st.message()));
}

// Runs fn, turning any escaping exception into a status: no exception crosses the ABI.
template <typename F>
moe_status Guard(F &&fn) {
  try {
    return fn();
  } catch (const std::bad_alloc &) {
    return Fail(MOE_ERR_NO_MEMORY, "out of memory");
  } catch (const std::exception &e) {
    return Fail(MOE_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return Fail(MOE_ERR_INTERNAL, "internal error: unknown exception");
  }
}

// ---- struct_size -----------------------------------------------------------------------------
// The sizes each params and out struct has had in a released header: the end of every appended
// "Since" group (the offset of the next group's first field, rounded up to the struct's alignment,
// is the sizeof an older header gave) and today's sizeof, which follows moe.h as fields are
// appended to the newest group. A size not in its list is refused: a size no header had cuts a
// pointer in half or reaches past the caller's struct. A new "Since" group adds its first field
// here.
// `covered` is where the older header's fields end: its padding, which a newer field may occupy,
// is never read.
struct ShippedSize {
  uint32_t size, covered;
};
template <typename T>
constexpr ShippedSize SizeBefore(size_t offset) {
  return {static_cast<uint32_t>((offset + alignof(T) - 1) / alignof(T) * alignof(T)), static_cast<uint32_t>(offset)};
}
template <typename T>
constexpr ShippedSize Newest() {
  return {static_cast<uint32_t>(sizeof(T)), static_cast<uint32_t>(sizeof(T))};
}
#define STRATA_SIZE_BEFORE(T, first_field_of_group) SizeBefore<T>(offsetof(T, first_field_of_group))

template <typename T>
struct StructSizes;
template <>
struct StructSizes<moe_params> {
  static constexpr const char *kName = "moe_params";
  static constexpr ShippedSize kSizes[] = {
      STRATA_SIZE_BEFORE(moe_params, cache_policy),     STRATA_SIZE_BEFORE(moe_params, max_batch_tokens),
      STRATA_SIZE_BEFORE(moe_params, kv_budget_bytes),  STRATA_SIZE_BEFORE(moe_params, cpu_experts),
      STRATA_SIZE_BEFORE(moe_params, load_progress),    STRATA_SIZE_BEFORE(moe_params, cuda_graphs),
      STRATA_SIZE_BEFORE(moe_params, load_continue),    STRATA_SIZE_BEFORE(moe_params, type_k),
      Newest<moe_params>()};
};
template <>
struct StructSizes<moe_session_params> {
  static constexpr const char *kName = "moe_session_params";
  static constexpr ShippedSize kSizes[] = {STRATA_SIZE_BEFORE(moe_session_params, min_p),
                                        STRATA_SIZE_BEFORE(moe_session_params, attn_window),
                                        STRATA_SIZE_BEFORE(moe_session_params, frequency_penalty),
                                        STRATA_SIZE_BEFORE(moe_session_params, ctx_shift),
                                        Newest<moe_session_params>()};
};
template <>
struct StructSizes<moe_cache_plan> {
  static constexpr const char *kName = "moe_cache_plan";
  static constexpr ShippedSize kSizes[] = {STRATA_SIZE_BEFORE(moe_cache_plan, kv_bytes_per_token),
                                        STRATA_SIZE_BEFORE(moe_cache_plan, ram_fixed_bytes), Newest<moe_cache_plan>()};
};
template <>
struct StructSizes<moe_stats> {
  static constexpr const char *kName = "moe_stats";
  static constexpr ShippedSize kSizes[] = {
      STRATA_SIZE_BEFORE(moe_stats, prefetch_skipped),   STRATA_SIZE_BEFORE(moe_stats, vram_expert_slots),
      STRATA_SIZE_BEFORE(moe_stats, gpu_graph_captures), STRATA_SIZE_BEFORE(moe_stats, numa_node),
      STRATA_SIZE_BEFORE(moe_stats, vram_cpu_layers),    STRATA_SIZE_BEFORE(moe_stats, vram_hits),
      STRATA_SIZE_BEFORE(moe_stats, locked_bytes),       Newest<moe_stats>()};
};
template <>
struct StructSizes<moe_expert_info> {
  static constexpr const char *kName = "moe_expert_info";
  static constexpr ShippedSize kSizes[] = {Newest<moe_expert_info>()};
};
#undef STRATA_SIZE_BEFORE

// The bytes a struct of `size` holds fields in; 0 for a size no header gave T.
template <typename T>
uint32_t CoveredBytes(uint32_t size) {
  for (const ShippedSize &s : StructSizes<T>::kSizes) {
    if (s.size == size) return s.covered;
  }
  return 0;
}
template <typename T>
bool KnownSize(uint32_t size) {
  return CoveredBytes<T>(size) != 0;
}

// MOE_OK when `size` is one a header gave T; else MOE_ERR_INVALID_ARGUMENT naming T, the size and
// the sizes accepted.
template <typename T>
moe_status CheckSize(uint32_t size) {
  if (KnownSize<T>(size)) return MOE_OK;
  std::string known;
  for (const ShippedSize &s : StructSizes<T>::kSizes) known += (known.empty() ? "" : ", ") + std::to_string(s.size);
  return Fail(MOE_ERR_INVALID_ARGUMENT, std::string(StructSizes<T>::kName) + ".struct_size " + std::to_string(size) +
                                            " is not a size any moe.h gave " + StructSizes<T>::kName + " (" + known +
                                            "); set it with " + StructSizes<T>::kName + "_init");
}

// Copies the caller's params struct into a defaults-filled one, reading only what its size covers.
template <typename T>
moe_status ReadParams(const T *in, T *out, void (*fill)(T *)) {
  std::memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  fill(out);
  if (in == nullptr) return MOE_OK;
  if (moe_status st = CheckSize<T>(in->struct_size); st != MOE_OK) return st;
  std::memcpy(reinterpret_cast<char *>(out) + sizeof(uint32_t), reinterpret_cast<const char *>(in) + sizeof(uint32_t),
              CoveredBytes<T>(in->struct_size) - sizeof(uint32_t));
  out->struct_size = sizeof *out;
  return MOE_OK;
}

// A moe_switch as a choice: unset for MOE_SWITCH_DEFAULT (the tunable decides).
std::optional<bool> FromSwitch(int32_t v) {
  if (v == MOE_SWITCH_ON) return true;
  if (v == MOE_SWITCH_OFF) return false;
  return std::nullopt;
}

// The fields ToOptions cannot map: values outside those moe.h lists.
moe_status CheckParams(const moe_params &p) {
  const std::pair<const char *, int32_t> switches[] = {
      {"cuda_graphs", p.cuda_graphs}, {"huge_pages", p.huge_pages}, {"cuda_streaming", p.cuda_streaming}};
  for (const auto &[name, v] : switches) {
    if (v < MOE_SWITCH_DEFAULT || v > MOE_SWITCH_OFF) {
      return Fail(MOE_ERR_INVALID_ARGUMENT,
                  std::string("moe_params.") + name + " is " + std::to_string(v) + " (0 default, 1 on, 2 off)");
    }
  }
  for (const auto &[name, v] : {std::pair<const char *, int32_t>{"type_k", p.type_k}, {"type_v", p.type_v}}) {
    if (v != MOE_KV_F32 && v != MOE_KV_F16 && v != MOE_KV_Q8_0) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, std::string("moe_params.") + name + " is " + std::to_string(v) +
                                                " (0 f32, 1 f16, 8 q8_0: moe_kv_type)");
    }
  }
  if (p.cuda_cold_copies < -1 || p.cuda_cold_copies > strata::runtime::kMaxColdCopies) {
    const int most = strata::runtime::kMaxColdCopies;
    return Fail(MOE_ERR_INVALID_ARGUMENT, "moe_params.cuda_cold_copies is " + std::to_string(p.cuda_cold_copies) +
                                              " (1-" + std::to_string(most) + " slots, -1 off, 0 default)");
  }
  return MOE_OK;
}

// A moe_kv_type CheckParams accepted.
strata::model::KvType FromKvType(int32_t t) {
  return t == MOE_KV_F16 ? strata::model::KvType::kF16
                         : (t == MOE_KV_Q8_0 ? strata::model::KvType::kQ8_0 : strata::model::KvType::kF32);
}

strata::runtime::ContextOptions ToOptions(const moe_params &p) {
  strata::runtime::ContextOptions o;
  o.model_path = p.model_path ? p.model_path : "";
  o.backend = p.backend;
  o.vram_budget_bytes = p.vram_budget_bytes;
  o.ram_budget_bytes = p.ram_budget_bytes;
  o.n_threads = p.n_threads;
  o.n_ctx = static_cast<int>(std::min<uint32_t>(p.n_ctx, INT32_MAX));
  o.max_sessions = static_cast<int>(std::min<uint32_t>(p.max_sessions, 1u << 20));
  o.cache_policy = p.cache_policy;
  o.prefetch_distance = p.prefetch_distance;
  o.n_io_threads = p.n_io_threads;
  o.hotlist_path = p.hotlist_path != nullptr ? p.hotlist_path : "";
  o.hotlist_max = static_cast<int>(std::min<uint32_t>(p.hotlist_max_experts, INT32_MAX));
  o.direct_io = p.direct_io != 0;
  o.cpu_q8_activations = p.cpu_q8_activations != 0;
  o.max_batch_tokens = static_cast<int>(std::min<uint32_t>(p.max_batch_tokens, 1u << 24));
  o.prefill_token_max = static_cast<int>(std::min<uint32_t>(p.prefill_token_max, 1u << 24));
  o.prefill_layer_min = static_cast<int>(std::min<uint32_t>(p.prefill_layer_min, 1u << 24));
  o.kv_budget_bytes = p.kv_budget_bytes;
  o.kv_spill_dir = p.kv_spill_dir != nullptr ? p.kv_spill_dir : "";
  o.cpu_experts = p.cpu_experts;
  o.gpu_q8_activations = p.gpu_q8_activations != 0;
  if (p.load_progress != nullptr) {
    o.load_progress = [fn = p.load_progress, user = p.load_progress_user](uint64_t done, uint64_t total) {
      fn(done, total, user);
    };
  }
  if (p.load_continue != nullptr) {
    o.load_continue = [fn = p.load_continue, user = p.load_progress_user](uint64_t done, uint64_t total) {
      return fn(done, total, user) != 0;
    };
  }
  o.cuda_graphs = FromSwitch(p.cuda_graphs);
  if (p.cuda_cold_copies != 0) o.cuda_cold_copies = std::max(0, p.cuda_cold_copies);
  o.huge_pages = FromSwitch(p.huge_pages);
  o.cuda_streaming = FromSwitch(p.cuda_streaming);
  o.kv_type_k = FromKvType(p.type_k);
  o.kv_type_v = FromKvType(p.type_v);
  return o;
}

void FillPlan(const strata::store::CachePlan &p, moe_cache_plan *out) {
  moe_cache_plan full;
  std::memset(&full, 0, sizeof full);
  full.struct_size = out->struct_size;
  full.ram_budget_bytes = p.ram_budget_bytes;
  full.vram_budget_bytes = p.vram_budget_bytes;
  full.non_routed_bytes = p.non_routed_bytes;
  full.routed_expert_bytes = p.routed_expert_bytes;
  full.kv_bytes = p.kv_bytes;
  full.workspace_bytes = p.workspace_bytes;
  full.expert_slot_bytes = p.expert_slot_bytes;
  full.n_layers = p.n_layers;
  full.n_routed_experts = p.n_routed_experts;
  full.ram_expert_slots = p.ram_expert_slots;
  full.vram_expert_slots = p.vram_expert_slots;
  full.clamped = p.clamped ? 1 : 0;
  full.n_ctx = static_cast<uint32_t>(p.n_ctx);
  full.max_sessions = static_cast<uint32_t>(p.max_sessions);
  full.kv_bytes_per_token = p.kv_bytes_per_token;
  full.kv_block_tokens = strata::model::kKvBlockTokens;
  full.kv_max_blocks = p.kv_max_blocks;
  full.ram_fixed_bytes = p.ram_fixed_bytes;
  full.vram_fixed_bytes = p.vram_fixed_bytes;
  full.streamed_experts = p.streamed_experts;
  std::memcpy(out, &full, std::min<size_t>(out->struct_size, sizeof full));
}

// The session options of a defaults-filled params struct.
moe_status ToSessionOptions(const moe_session_params &sp, strata::runtime::SessionOptions *out) {
  strata::runtime::SessionOptions &o = *out;
  o.n_ctx = static_cast<int>(std::min<uint32_t>(sp.n_ctx, INT32_MAX));
  o.seed = sp.seed;
  o.sampler.temperature = sp.temperature;
  o.sampler.top_k = sp.top_k;
  o.sampler.top_p = sp.top_p;
  o.logits_all = sp.logits_all != 0;
  o.sampler.min_p = sp.min_p;
  o.sampler.repeat_penalty = sp.repeat_penalty;
  o.sampler.presence_penalty = sp.presence_penalty;
  o.sampler.frequency_penalty = sp.frequency_penalty;
  o.sampler.penalty_last_n = sp.penalty_last_n;
  o.stop_at_eos = sp.stop_at_eos != 0;
  if ((sp.stop_tokens == nullptr && sp.n_stop_tokens > 0) || (sp.stop_strings == nullptr && sp.n_stop_strings > 0)) {
    return Fail(MOE_ERR_INVALID_ARGUMENT, "moe_session_params: stop_tokens or stop_strings is NULL with a count");
  }
  if (sp.n_stop_tokens > (1u << 20) || sp.n_stop_strings > (1u << 20)) {
    return Fail(MOE_ERR_INVALID_ARGUMENT, "moe_session_params: too many stop tokens or strings");
  }
  if (sp.n_stop_tokens > 0) o.stop_tokens.assign(sp.stop_tokens, sp.stop_tokens + sp.n_stop_tokens);
  for (size_t i = 0; i < sp.n_stop_strings; ++i) {
    if (sp.stop_strings[i] == nullptr) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "moe_session_params: stop_strings[" + std::to_string(i) + "] is NULL");
    }
    o.stop_strings.emplace_back(sp.stop_strings[i]);
  }
  if (sp.blocked_tokens == nullptr && sp.n_blocked_tokens > 0) {
    return Fail(MOE_ERR_INVALID_ARGUMENT, "moe_session_params: blocked_tokens is NULL with a count");
  }
  if (sp.n_blocked_tokens > (1u << 24)) return Fail(MOE_ERR_INVALID_ARGUMENT, "moe_session_params: too many blocked tokens");
  if (sp.attn_window > INT32_MAX) return Fail(MOE_ERR_INVALID_ARGUMENT, "moe_session_params: attn_window is too large");
  o.window = static_cast<int>(sp.attn_window);
  if (sp.n_blocked_tokens > 0) o.blocked_tokens.assign(sp.blocked_tokens, sp.blocked_tokens + sp.n_blocked_tokens);
  if (sp.ctx_shift > 1) {
    return Fail(MOE_ERR_INVALID_ARGUMENT,
                "moe_session_params: ctx_shift is " + std::to_string(sp.ctx_shift) + ", not 0 (off) or 1 (on)");
  }
  o.ctx_shift = sp.ctx_shift != 0;
  o.n_keep = sp.n_keep;  // range-checked against the session's n_ctx when it opens
  return MOE_OK;
}

moe_status CheckPlanOut(moe_cache_plan *out) {
  if (out == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "plan output is NULL");
  return CheckSize<moe_cache_plan>(out->struct_size);
}

// A handle for a session the context just opened (or loaded), listed on the context for close.
moe_status AddSession(moe_ctx *ctx, strata::runtime::Session *impl, moe_session **out) {
  auto *h = new moe_session();
  h->ctx = ctx;
  h->impl = impl;
  std::lock_guard<std::mutex> lk(ctx->mu);
  ctx->sessions.push_back(h);
  *out = h;
  return MOE_OK;
}

// The token ids of a call into the caller's buffer: *n_tokens is how many there are, also when the
// buffer is too small (MOE_ERR_LIMIT, nothing written).
moe_status CopyTokensOut(const std::vector<int32_t> &ids, int32_t *tokens, size_t capacity, size_t *n_tokens) {
  *n_tokens = ids.size();
  if (ids.size() > capacity) {
    return Fail(MOE_ERR_LIMIT, "token buffer of " + std::to_string(capacity) + " is too small for " +
                                   std::to_string(ids.size()));
  }
  if (!ids.empty()) {
    if (tokens == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "tokens is NULL");
    std::copy(ids.begin(), ids.end(), tokens);
  }
  return MOE_OK;
}

}  // namespace

extern "C" {

int32_t moe_version_number(void) { return MOE_VERSION_NUMBER; }

#define STRATA_STR_(x) #x
#define STRATA_STR(x) STRATA_STR_(x)
const char *moe_version_string(void) {
  return STRATA_STR(MOE_VERSION_MAJOR) "." STRATA_STR(MOE_VERSION_MINOR) "." STRATA_STR(MOE_VERSION_PATCH);
}
#undef STRATA_STR
#undef STRATA_STR_

void moe_log_set(moe_log_fn fn, void *user) { strata::SetLogCallback(fn, user); }

const char *moe_status_string(moe_status st) {
  switch (st) {
#define MOE_NAME(x) \
  case x: return #x;
    MOE_NAME(MOE_OK)
    MOE_NAME(MOE_ERR_INVALID_ARGUMENT)
    MOE_NAME(MOE_ERR_IO)
    MOE_NAME(MOE_ERR_FORMAT)
    MOE_NAME(MOE_ERR_UNSUPPORTED)
    MOE_NAME(MOE_ERR_NO_MEMORY)
    MOE_NAME(MOE_ERR_STATE)
    MOE_NAME(MOE_ERR_BACKEND)
    MOE_NAME(MOE_ERR_INTERNAL)
    MOE_NAME(MOE_ERR_LIMIT)
    MOE_NAME(MOE_ERR_IO_READ)
    MOE_NAME(MOE_ERR_IO_OPEN)
    MOE_NAME(MOE_ERR_IO_CHANGED)
    MOE_NAME(MOE_ERR_IO_WRITE)
    MOE_NAME(MOE_ERR_FORMAT_TRUNCATED)
    MOE_NAME(MOE_ERR_FORMAT_HEADER)
    MOE_NAME(MOE_ERR_FORMAT_METADATA)
    MOE_NAME(MOE_ERR_FORMAT_TENSOR)
    MOE_NAME(MOE_ERR_FORMAT_HPARAMS)
    MOE_NAME(MOE_ERR_FORMAT_CONFIG)
    MOE_NAME(MOE_ERR_FORMAT_CHECKSUM)
    MOE_NAME(MOE_ERR_FORMAT_FOREIGN)
    MOE_NAME(MOE_ERR_UNSUPPORTED_ARCH)
    MOE_NAME(MOE_ERR_UNSUPPORTED_TYPE)
    MOE_NAME(MOE_ERR_UNSUPPORTED_BACKEND)
    MOE_NAME(MOE_ERR_LIMIT_CONTEXT)
    MOE_NAME(MOE_ERR_LIMIT_KV)
    MOE_NAME(MOE_ERR_CANCELLED)
    MOE_NAME(MOE_ERR_ABORTED)
#undef MOE_NAME
    default: return "MOE_ERR_UNKNOWN";
  }
}

const char *moe_last_error(void) { return g_last_error.c_str(); }

int32_t moe_backend_available(int32_t kind) {
  moe_status st = Guard([&]() -> moe_status { return FromStatus(strata::backends::Available(kind)); });
  return st == MOE_OK ? 1 : 0;
}

void moe_params_fill_defaults(moe_params *p) {
  if (p == nullptr || !KnownSize<moe_params>(p->struct_size)) return;  // moe_ctx_open will say why
  moe_params d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = p->struct_size;
  d.model_path = nullptr;
  d.backend = MOE_BACKEND_AUTO;
  d.n_threads = 0;
  d.n_ctx = 0;
  d.max_sessions = 1;
  d.cache_policy = MOE_CACHE_HOTNESS;
  d.prefetch_distance = 1;
  d.n_io_threads = 2;
  d.direct_io = 1;
  d.cpu_experts = MOE_CPU_EXPERTS_AUTO;
  std::memcpy(reinterpret_cast<char *>(p) + sizeof(uint32_t), reinterpret_cast<const char *>(&d) + sizeof(uint32_t),
              std::min<size_t>(p->struct_size, sizeof d) - sizeof(uint32_t));
}

void moe_session_params_fill_defaults(moe_session_params *p) {
  if (p == nullptr || !KnownSize<moe_session_params>(p->struct_size)) return;  // moe_session_open will say why
  moe_session_params d;
  std::memset(&d, 0, sizeof d);
  d.struct_size = p->struct_size;
  d.n_ctx = 0;
  d.seed = 0x5eed;
  d.temperature = 0.f;
  d.top_k = 0;
  d.top_p = 1.f;
  d.logits_all = 0;
  d.min_p = 0.f;
  d.repeat_penalty = 1.f;
  d.presence_penalty = 0.f;
  d.frequency_penalty = 0.f;
  d.penalty_last_n = 64;
  d.stop_at_eos = 1;
  d.stop_tokens = nullptr;
  d.n_stop_tokens = 0;
  d.stop_strings = nullptr;
  d.n_stop_strings = 0;
  d.attn_window = 0;
  d.blocked_tokens = nullptr;
  d.n_blocked_tokens = 0;
  d.ctx_shift = 0;
  d.n_keep = 0;
  std::memcpy(reinterpret_cast<char *>(p) + sizeof(uint32_t), reinterpret_cast<const char *>(&d) + sizeof(uint32_t),
              std::min<size_t>(p->struct_size, sizeof d) - sizeof(uint32_t));
}

moe_status moe_plan(const moe_params *p, moe_cache_plan *out) {
  return Guard([&]() -> moe_status {
    if (p == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "params is NULL");
    if (moe_status st = CheckPlanOut(out); st != MOE_OK) return st;
    moe_params params;
    if (moe_status st = ReadParams(p, &params, moe_params_fill_defaults); st != MOE_OK) return st;
    if (params.model_path == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "moe_params.model_path is NULL");
    if (moe_status st = CheckParams(params); st != MOE_OK) return st;
    auto d = strata::runtime::Context::Describe(params.model_path);
    if (!d.ok()) return FromStatus(d.status());
    const auto opts = ToOptions(params);
    auto plan = strata::store::MakePlan(d->hp, d->weights, strata::runtime::Context::PlanInputsFor(opts, d->hp));
    if (!plan.ok()) return FromStatus(plan.status());
    FillPlan(*plan, out);
    return MOE_OK;
  });
}

moe_status moe_ctx_open(const moe_params *p, moe_ctx **out) {
  return Guard([&]() -> moe_status {
    if (p == nullptr || out == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "params or out is NULL");
    moe_params params;
    if (moe_status st = ReadParams(p, &params, moe_params_fill_defaults); st != MOE_OK) return st;
    if (params.model_path == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "moe_params.model_path is NULL");
    if (moe_status st = CheckParams(params); st != MOE_OK) return st;
    auto ctx = strata::runtime::Context::Open(ToOptions(params));
    if (!ctx.ok()) return FromStatus(ctx.status());
    auto *c = new moe_ctx();
    c->impl = std::move(*ctx);
    c->experts.n_layers = static_cast<uint32_t>(c->impl->hparams().n_layer);
    c->experts.n_experts = static_cast<uint32_t>(c->impl->hparams().n_expert);
    c->experts.table = &c->impl->expert_table();
    *out = c;
    return MOE_OK;
  });
}

void moe_ctx_close(moe_ctx *ctx) {
  if (ctx == nullptr) return;
  try {
    for (moe_session *s : ctx->sessions) delete s;
    delete ctx;
  } catch (...) {
  }
}

int32_t moe_ctx_vocab_size(const moe_ctx *ctx) { return ctx ? ctx->impl->hparams().n_vocab : -1; }

moe_status moe_ctx_plan(const moe_ctx *ctx, moe_cache_plan *out) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx is NULL");
    if (moe_status st = CheckPlanOut(out); st != MOE_OK) return st;
    FillPlan(ctx->impl->plan(), out);
    return MOE_OK;
  });
}

const moe_expert_table *moe_ctx_experts(const moe_ctx *ctx) { return ctx ? &ctx->experts : nullptr; }
uint32_t moe_expert_table_n_layers(const moe_expert_table *t) { return t ? t->n_layers : 0; }
uint32_t moe_expert_table_n_experts(const moe_expert_table *t) { return t ? t->n_experts : 0; }

moe_status moe_expert_table_get(const moe_expert_table *t, uint32_t layer, uint32_t expert, moe_expert_info *out) {
  return Guard([&]() -> moe_status {
    if (t == nullptr || out == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "table or out is NULL");
    if (moe_status st = CheckSize<moe_expert_info>(out->struct_size); st != MOE_OK) return st;
    if (layer >= t->n_layers || expert >= t->n_experts) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "expert " + std::to_string(expert) + " of layer " + std::to_string(layer) +
                                                " is outside the table (" + std::to_string(t->n_layers) + " x " +
                                                std::to_string(t->n_experts) + ")");
    }
    const strata::store::ExpertEntry &en = t->table->entry(static_cast<int>(layer), static_cast<int>(expert));
    moe_expert_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = out->struct_size;
    const strata::model::Matrix *m[3] = {&en.weights->gate, &en.weights->up, &en.weights->down};
    for (int p = 0; p < 3; ++p) {
      info.file_index[p] = static_cast<uint32_t>(en.part[p].file_index);
      info.file_offset[p] = en.part[p].file_offset;
      info.bytes[p] = en.part[p].bytes;
      info.codec[p] = static_cast<uint32_t>(m[p]->codec->id);
      info.rows[p] = static_cast<uint32_t>(m[p]->rows);
      info.cols[p] = static_cast<uint32_t>(m[p]->cols);
    }
    info.total_bytes = en.bytes;
    info.slot_bytes = en.slot_bytes;
    info.single_read = en.single_read ? 1 : 0;
    std::memcpy(out, &info, std::min<size_t>(out->struct_size, sizeof info));
    return MOE_OK;
  });
}

moe_status moe_ctx_stats(const moe_ctx *ctx, moe_stats *out) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr || out == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx or out is NULL");
    if (moe_status st = CheckSize<moe_stats>(out->struct_size); st != MOE_OK) return st;
    const strata::runtime::ContextStats cs = ctx->impl->Stats();
    moe_stats st;
    std::memset(&st, 0, sizeof st);
    st.struct_size = out->struct_size;
    st.streaming = cs.streaming ? 1 : 0;
    st.expert_hits = cs.cache.hits;
    st.expert_misses = cs.cache.misses;
    st.prefetch_issued = cs.cache.prefetch_issued;
    st.prefetch_useful = cs.cache.prefetch_useful;
    st.evictions = cs.cache.evictions;
    st.bytes_read = cs.cache.bytes_read;
    st.io_wait_s = cs.cache.io_wait_s;
    st.cache_slots = cs.cache.n_slots;
    st.memory_locked = cs.cache.memory_locked ? 1 : 0;
    st.cache_slot_bytes = cs.cache.slot_bytes;
    st.load_errors = cs.cache.load_errors;
    st.direct_reads = cs.cache.direct_reads;
    st.prefetch_skipped = cs.cache.prefetch_skipped;
    st.prefetch_precision = cs.cache.prefetch_precision;
    st.vram_expert_slots = cs.device.slots;
    st.vram_device_layers = cs.device.table_layers;
    st.vram_fills = cs.device.fills;
    st.vram_fill_bytes = cs.device.fill_bytes;
    st.vram_zero_copy = cs.device.zero_copy;
    st.vram_promotions = cs.device.promotions;
    st.gpu_graph_captures = cs.device.graph_captures;
    st.gpu_graph_replays = cs.device.graph_replays;
    st.numa_node = cs.numa_node;
    st.vram_cpu_layers = cs.device.cpu_layers;
    st.vram_cpu_experts = cs.device.cpu_experts;
    st.vram_replans = cs.device.replans;
    if (cs.vram.n_slots > 0) {  // the VRAM tier over the streamed RAM tier
      st.vram_expert_slots = cs.vram.n_slots;
      // Moves up, and a prompt's experts staged from RAM (the backend's copies).
      st.vram_fills = cs.vram.promotions + cs.device.fills;
      st.vram_fill_bytes = cs.vram.bytes_up + cs.device.fill_bytes;
      st.vram_promotions = cs.vram.promotions;
      st.vram_hits = cs.vram.hits;
      st.vram_demotions = cs.vram.demotions;
    }
    st.locked_bytes = cs.cache.locked_bytes;
    // The GPU's prefetch, where the RAM tier's is idle (every expert resident, or all in RAM).
    if (cs.device.prefetched > 0 && st.prefetch_issued == 0) {
      st.prefetch_issued = cs.device.prefetched;
      st.prefetch_useful = cs.device.prefetch_used;
      st.prefetch_precision = static_cast<double>(cs.device.prefetch_used) / static_cast<double>(cs.device.prefetched);
    }
    std::memcpy(out, &st, std::min<size_t>(out->struct_size, sizeof st));
    return MOE_OK;
  });
}

moe_status moe_ctx_layer_stats(const moe_ctx *ctx, uint32_t layer, uint64_t *hits, uint64_t *misses) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr || hits == nullptr || misses == nullptr) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx, hits or misses is NULL");
    }
    const strata::runtime::ContextStats cs = ctx->impl->Stats();
    if (layer >= cs.cache.layer_hits.size()) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "layer " + std::to_string(layer) + " is out of range");
    }
    *hits = cs.cache.layer_hits[layer];
    *misses = cs.cache.layer_misses[layer];
    return MOE_OK;
  });
}

moe_status moe_ctx_expert_counts(const moe_ctx *ctx, uint64_t *counts, size_t capacity, size_t *n) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr || n == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx or n is NULL");
    const std::vector<uint64_t> c = ctx->impl->ExpertCounts();
    *n = c.size();
    if (c.size() > capacity) {
      return Fail(MOE_ERR_LIMIT, "counts buffer of " + std::to_string(capacity) + " is too small for " +
                                     std::to_string(c.size()));
    }
    if (counts == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "counts is NULL");
    std::copy(c.begin(), c.end(), counts);
    return MOE_OK;
  });
}

moe_status moe_ctx_wait_loads(moe_ctx *ctx) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx is NULL");
    if (strata::store::ExpertCache *c = ctx->impl->expert_cache(); c != nullptr) c->WaitIdle();
    return MOE_OK;
  });
}

void moe_ctx_reset_stats(moe_ctx *ctx) {
  if (ctx == nullptr) return;
  try {
    ctx->impl->ResetStats();
  } catch (...) {
  }
}

moe_status moe_session_open(moe_ctx *ctx, const moe_session_params *p, moe_session **out) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr || out == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx or out is NULL");
    moe_session_params sp;
    if (moe_status st = ReadParams(p, &sp, moe_session_params_fill_defaults); st != MOE_OK) {
      return st;
    }
    strata::runtime::SessionOptions o;
    if (moe_status st = ToSessionOptions(sp, &o); st != MOE_OK) return st;
    auto s = ctx->impl->OpenSession(o);
    if (!s.ok()) return FromStatus(s.status());
    return AddSession(ctx, *s, out);
  });
}

void moe_session_close(moe_session *s) {
  if (s == nullptr) return;
  try {
    moe_ctx *ctx = s->ctx;
    ctx->impl->CloseSession(s->impl);
    {
      std::lock_guard<std::mutex> lk(ctx->mu);
      auto &v = ctx->sessions;
      v.erase(std::remove(v.begin(), v.end(), s), v.end());
    }
    delete s;
  } catch (...) {
  }
}

moe_status moe_session_feed(moe_session *s, const int32_t *tokens, size_t n) {
  return Guard([&]() -> moe_status {
    if (s == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "session is NULL");
    return FromStatus(s->impl->Feed(tokens, n));
  });
}

moe_status moe_ctx_step(moe_ctx *ctx, uint32_t *n_pending) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx is NULL");
    return FromStatus(ctx->impl->Step(n_pending));
  });
}

moe_status moe_ctx_step_for(moe_ctx *ctx, uint64_t budget_us, uint32_t *n_pending, uint32_t *n_steps) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx is NULL");
    const int64_t us = static_cast<int64_t>(std::min<uint64_t>(budget_us, uint64_t{INT64_MAX}));
    return FromStatus(ctx->impl->StepFor(us, n_pending, n_steps));
  });
}

moe_status moe_ctx_abort(moe_ctx *ctx) {
  if (ctx == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx is NULL");
  ctx->impl->Abort();  // one atomic store: nothing here can throw
  return MOE_OK;
}

int32_t moe_session_ready(const moe_session *s) { return s ? (s->impl->Ready() ? 1 : 0) : -1; }

int32_t moe_session_n_pending(const moe_session *s) {
  return s ? static_cast<int32_t>(std::min<size_t>(s->impl->n_pending(), INT32_MAX)) : -1;
}

moe_status moe_session_logits(const moe_session *s, const float **logits, int32_t *n_vocab) {
  return Guard([&]() -> moe_status {
    if (s == nullptr || logits == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "session or logits is NULL");
    auto l = s->impl->Logits();
    if (!l.ok()) return FromStatus(l.status());
    *logits = *l;
    if (n_vocab) *n_vocab = s->ctx->impl->hparams().n_vocab;
    return MOE_OK;
  });
}

moe_status moe_session_logits_all(const moe_session *s, const float **logits, int32_t *n_tokens,
                                  int32_t *n_vocab) {
  return Guard([&]() -> moe_status {
    if (s == nullptr || logits == nullptr || n_tokens == nullptr) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "session, logits or n_tokens is NULL");
    }
    const float *rows = nullptr;
    int32_t n = 0;
    if (moe_status st = FromStatus(s->impl->LogitsAll(&rows, &n)); st != MOE_OK) return st;
    *logits = rows;
    *n_tokens = n;
    if (n_vocab) *n_vocab = s->ctx->impl->hparams().n_vocab;
    return MOE_OK;
  });
}

moe_status moe_session_sample(moe_session *s, int32_t *token) {
  return Guard([&]() -> moe_status {
    if (s == nullptr || token == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "session or token is NULL");
    auto t = s->impl->SampleNext();
    if (!t.ok()) return FromStatus(t.status());
    *token = *t;
    return MOE_OK;
  });
}

int32_t moe_session_n_past(const moe_session *s) { return s ? s->impl->n_past() : -1; }

moe_status moe_session_sample_text(moe_session *s, int32_t *token, const char **text, size_t *n_bytes,
                                   int32_t *stop) {
  return Guard([&]() -> moe_status {
    if (s == nullptr || token == nullptr || text == nullptr || n_bytes == nullptr) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "session, token, text or n_bytes is NULL");
    }
    int32_t t = -1;
    strata::runtime::StopReason why = strata::runtime::StopReason::kNone;
    if (moe_status st = FromStatus(s->impl->NextText(&t, &s->text, &why)); st != MOE_OK) return st;
    *token = t;
    *text = s->text.data();
    *n_bytes = s->text.size();
    if (stop) *stop = static_cast<int32_t>(why);
    return MOE_OK;
  });
}

moe_status moe_session_text_end(moe_session *s, const char **text, size_t *n_bytes) {
  return Guard([&]() -> moe_status {
    if (s == nullptr || text == nullptr || n_bytes == nullptr) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "session, text or n_bytes is NULL");
    }
    s->text = s->impl->EndText();
    *text = s->text.data();
    *n_bytes = s->text.size();
    return MOE_OK;
  });
}

uint64_t moe_session_kv_bytes(const moe_session *s) { return s ? s->impl->kv_resident_bytes() : 0; }

moe_status moe_ctx_kv_usage(const moe_ctx *ctx, uint64_t *used, uint64_t *budget) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx is NULL");
    if (used) *used = ctx->impl->kv_used_bytes();
    if (budget) *budget = ctx->impl->kv_budget_bytes();
    return MOE_OK;
  });
}

moe_status moe_session_evict(moe_session *s) {
  return Guard([&]() -> moe_status {
    if (s == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "session is NULL");
    return FromStatus(s->ctx->impl->EvictSession(s->impl));
  });
}

moe_status moe_session_save(moe_session *s, const char *path) {
  return Guard([&]() -> moe_status {
    if (s == nullptr || path == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "session or path is NULL");
    return FromStatus(s->ctx->impl->SaveSession(s->impl, path));
  });
}

moe_status moe_session_load(moe_ctx *ctx, const char *path, const moe_session_params *p, moe_session **out) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr || path == nullptr || out == nullptr) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx, path or out is NULL");
    }
    strata::runtime::SessionOptions o;
    if (p != nullptr) {
      moe_session_params sp;
      if (moe_status st = ReadParams(p, &sp, moe_session_params_fill_defaults); st != MOE_OK) {
        return st;
      }
      if (moe_status st = ToSessionOptions(sp, &o); st != MOE_OK) return st;
    }
    auto s = ctx->impl->LoadSession(path, p != nullptr ? &o : nullptr);
    if (!s.ok()) return FromStatus(s.status());
    return AddSession(ctx, *s, out);
  });
}

moe_status moe_session_save_buffer(moe_session *s, void *buf, size_t cap, size_t *n_written) {
  return Guard([&]() -> moe_status {
    if (s == nullptr || n_written == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "session or n_written is NULL");
    return FromStatus(s->ctx->impl->SaveSessionBuffer(s->impl, buf, cap, n_written));
  });
}

moe_status moe_session_load_buffer(moe_ctx *ctx, const void *buf, size_t n, const moe_session_params *p,
                                   moe_session **out) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr || buf == nullptr || out == nullptr) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx, buf or out is NULL");
    }
    strata::runtime::SessionOptions o;
    if (p != nullptr) {
      moe_session_params sp;
      if (moe_status st = ReadParams(p, &sp, moe_session_params_fill_defaults); st != MOE_OK) return st;
      if (moe_status st = ToSessionOptions(sp, &o); st != MOE_OK) return st;
    }
    auto s = ctx->impl->LoadSessionBytes(static_cast<const uint8_t *>(buf), n,
                                         "(a buffer of " + std::to_string(n) + " bytes)", p != nullptr ? &o : nullptr);
    if (!s.ok()) return FromStatus(s.status());
    return AddSession(ctx, *s, out);
  });
}

moe_status moe_session_fork(moe_session *s, moe_session **out) {
  return Guard([&]() -> moe_status {
    if (s == nullptr || out == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "session or out is NULL");
    auto fork = s->ctx->impl->ForkSession(s->impl);
    if (!fork.ok()) return FromStatus(fork.status());
    return AddSession(s->ctx, *fork, out);
  });
}

moe_status moe_session_rewind(moe_session *s, int32_t n_tokens) {
  return Guard([&]() -> moe_status {
    if (s == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "session is NULL");
    return FromStatus(s->ctx->impl->RewindSession(s->impl, n_tokens));
  });
}

moe_status moe_session_shift(moe_session *s, int32_t n_keep, int32_t n_discard) {
  return Guard([&]() -> moe_status {
    if (s == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "session is NULL");
    return FromStatus(s->ctx->impl->ShiftSession(s->impl, n_keep, n_discard));
  });
}

static moe_status NeedTokenizer(const moe_ctx *ctx, const strata::text::Tokenizer **out) {
  if (ctx == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx is NULL");
  *out = ctx->impl->tokenizer();
  if (*out == nullptr) return Fail(MOE_ERR_UNSUPPORTED, "the model carries no tokenizer");
  return MOE_OK;
}

// Copies `bytes` to buf when it fits; *n receives the size either way.
static moe_status CopyOut(const std::string &bytes, char *buf, size_t capacity, size_t *n) {
  if (n == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "length output is NULL");
  *n = bytes.size();
  if (bytes.size() > capacity) {
    return Fail(MOE_ERR_LIMIT, "buffer of " + std::to_string(capacity) + " bytes is too small for " +
                                   std::to_string(bytes.size()));
  }
  if (!bytes.empty()) {
    if (buf == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "buffer is NULL");
    std::memcpy(buf, bytes.data(), bytes.size());
  }
  return MOE_OK;
}

moe_status moe_tokenize(const moe_ctx *ctx, const char *text, size_t text_len, uint32_t flags, int32_t *tokens,
                        size_t capacity, size_t *n_tokens) {
  return Guard([&]() -> moe_status {
    const strata::text::Tokenizer *tok;
    if (moe_status st = NeedTokenizer(ctx, &tok); st != MOE_OK) return st;
    if (n_tokens == nullptr || (text == nullptr && text_len > 0)) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "text or n_tokens is NULL");
    }
    if (flags & ~(MOE_TOKENIZE_PARSE_SPECIAL | MOE_TOKENIZE_ADD_BOS)) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "unknown tokenize flags " + std::to_string(flags));
    }
    std::vector<int32_t> ids;
    if ((flags & MOE_TOKENIZE_ADD_BOS) && tok->add_bos() && tok->bos() >= 0) ids.push_back(tok->bos());
    std::vector<int32_t> body =
        tok->Encode(std::string_view(text ? text : "", text_len), (flags & MOE_TOKENIZE_PARSE_SPECIAL) != 0);
    ids.insert(ids.end(), body.begin(), body.end());
    return CopyTokensOut(ids, tokens, capacity, n_tokens);
  });
}

moe_status moe_token_to_piece(const moe_ctx *ctx, int32_t token, char *buf, size_t capacity, size_t *n_bytes) {
  return Guard([&]() -> moe_status {
    const strata::text::Tokenizer *tok;
    if (moe_status st = NeedTokenizer(ctx, &tok); st != MOE_OK) return st;
    if (token < 0 || token >= tok->vocab_size()) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "token id " + std::to_string(token) + " is outside the vocabulary");
    }
    return CopyOut(tok->TokenToPiece(token), buf, capacity, n_bytes);
  });
}

moe_status moe_detokenize(const moe_ctx *ctx, const int32_t *tokens, size_t n, char *buf, size_t capacity,
                          size_t *n_bytes) {
  return Guard([&]() -> moe_status {
    const strata::text::Tokenizer *tok;
    if (moe_status st = NeedTokenizer(ctx, &tok); st != MOE_OK) return st;
    if (tokens == nullptr && n > 0) return Fail(MOE_ERR_INVALID_ARGUMENT, "tokens is NULL");
    auto text = tok->Decode(absl::MakeConstSpan(tokens, n));
    if (!text.ok()) return FromStatus(text.status());
    return CopyOut(*text, buf, capacity, n_bytes);
  });
}

int32_t moe_ctx_token_bos(const moe_ctx *ctx) {
  return ctx && ctx->impl->tokenizer() ? ctx->impl->tokenizer()->bos() : -1;
}
int32_t moe_ctx_token_eos(const moe_ctx *ctx) {
  return ctx && ctx->impl->tokenizer() ? ctx->impl->tokenizer()->eos() : -1;
}

moe_status moe_ctx_chat_template_name(const moe_ctx *ctx, const char **name) {
  return Guard([&]() -> moe_status {
    if (ctx == nullptr || name == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "ctx or name is NULL");
    auto t = strata::text::ResolveChatTemplate("", ctx->impl->chat_template_source(), ctx->impl->hparams().arch_name);
    if (!t.ok()) return FromStatus(t.status());
    *name = t->name();
    return MOE_OK;
  });
}

// The conversation rendered with the template `template_name` (NULL: the model's), its template
// ranges marked; MOE_OK or the status already recorded with Fail.
static moe_status RenderChat(const moe_ctx *ctx, const char *template_name, const moe_chat_message *msgs, size_t n,
                             int32_t add_generation_prompt, const strata::text::Tokenizer **tok_out,
                             strata::text::RenderedChat *out) {
  const strata::text::Tokenizer *tok;
  if (moe_status st = NeedTokenizer(ctx, &tok); st != MOE_OK) return st;
  if (msgs == nullptr && n > 0) return Fail(MOE_ERR_INVALID_ARGUMENT, "msgs is NULL");
  std::vector<strata::text::ChatMessage> m(n);
  for (size_t i = 0; i < n; ++i) {
    if (msgs[i].role == nullptr || msgs[i].content == nullptr) {
      return Fail(MOE_ERR_INVALID_ARGUMENT, "message " + std::to_string(i) + " has a NULL role or content");
    }
    m[i] = {msgs[i].role, msgs[i].content};
  }
  auto t = strata::text::ResolveChatTemplate(template_name ? template_name : "", ctx->impl->chat_template_source(),
                                             ctx->impl->hparams().arch_name);
  if (!t.ok()) return FromStatus(t.status());
  strata::text::ChatSpecialTokens sp;
  if (tok->bos() >= 0) sp.bos = tok->token_text(tok->bos());
  if (tok->eos() >= 0) sp.eos = tok->token_text(tok->eos());
  auto r = t->RenderTagged(m, add_generation_prompt != 0, sp);
  if (!r.ok()) return FromStatus(r.status());
  *tok_out = tok;
  *out = std::move(*r);
  return MOE_OK;
}

moe_status moe_chat_render(const moe_ctx *ctx, const char *template_name, const moe_chat_message *msgs, size_t n,
                           int32_t add_generation_prompt, char *buf, size_t capacity, size_t *n_bytes) {
  return Guard([&]() -> moe_status {
    if (n_bytes == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "n_bytes is NULL");
    const strata::text::Tokenizer *tok = nullptr;
    strata::text::RenderedChat r;
    if (moe_status st = RenderChat(ctx, template_name, msgs, n, add_generation_prompt, &tok, &r); st != MOE_OK) {
      return st;
    }
    return CopyOut(r.text, buf, capacity, n_bytes);
  });
}

moe_status moe_chat_tokenize(const moe_ctx *ctx, const char *template_name, const moe_chat_message *msgs, size_t n,
                             int32_t add_generation_prompt, int32_t *tokens, size_t capacity, size_t *n_tokens) {
  return Guard([&]() -> moe_status {
    if (n_tokens == nullptr) return Fail(MOE_ERR_INVALID_ARGUMENT, "n_tokens is NULL");
    const strata::text::Tokenizer *tok = nullptr;
    strata::text::RenderedChat r;
    if (moe_status st = RenderChat(ctx, template_name, msgs, n, add_generation_prompt, &tok, &r); st != MOE_OK) {
      return st;
    }
    const std::vector<int32_t> ids = tok->EncodeSpecialWithin(r.text, r.template_ranges);
    return CopyTokensOut(ids, tokens, capacity, n_tokens);
  });
}

}  // extern "C"
