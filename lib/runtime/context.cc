// Context: opening (describe -> plan -> load -> backend) and the step over sessions.
#include "lib/runtime/context.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unistd.h>

#include <optional>

#include "nlohmann/json.hpp"

#include "lib/format/file.h"
#include "lib/format/json.h"
#include "lib/model/backend_registry.h"
#include "lib/model/pack.h"
#include "lib/runtime/snapshot.h"
#include "lib/store/vram_tier.h"
#include "lib/util/numa.h"
#include "lib/util/tunables.h"

namespace strata::runtime {

absl::StatusOr<Context::Described> Context::Describe(const std::string &path) {
  Described d;
  STRATA_ASSIGN_OR_RETURN(d.file, model::ModelFile::Open(path));
  STRATA_ASSIGN_OR_RETURN(d.hp, model::ReadHParams(*d.file));
  STRATA_ASSIGN_OR_RETURN(d.weights, model::BindWeights(*d.file, d.hp));
  return d;
}

store::PlanInputs Context::PlanInputsFor(const ContextOptions &o, const model::HParams &hp) {
  store::PlanInputs in;
  in.ram_budget_bytes = o.ram_budget_bytes;
  in.vram_budget_bytes = o.vram_budget_bytes;
  in.n_ctx = o.n_ctx > 0 ? std::min(o.n_ctx, hp.n_ctx_train) : std::min(hp.n_ctx_train, 4096);
  in.max_sessions = std::max(1, o.max_sessions);
  in.kv_budget_bytes = o.kv_budget_bytes;
  in.kv_type_k = o.kv_type_k;
  in.kv_type_v = o.kv_type_v;
  // The workspace is planned for the batches the context will run.
  in.max_batch_tokens = o.max_batch_tokens > 0 ? o.max_batch_tokens : kDefaultMaxBatchTokens;
  // A device tier is planned for the CUDA backend asked by name (Open plans AUTO's choice again).
  in.have_gpu = o.backend == MOE_BACKEND_CUDA;
  in.device_activations = in.have_gpu;
  return in;
}

// The tokenizer a model file carries (GGUF tokenizer.ggml.*, or tokenizer.json in a checkpoint
// directory); nullptr when it has none. A tokenizer that is present but malformed fails the open.
absl::StatusOr<std::unique_ptr<text::Tokenizer>> LoadTokenizer(const model::ModelFile &mf) {
  if (mf.kind() == model::ModelFile::Kind::kGguf) {
    if (mf.gguf().Find("tokenizer.ggml.model") == nullptr) return nullptr;
    return text::Tokenizer::FromGguf(mf.gguf());
  }
  // Opened once: absent is no tokenizer; anything there that cannot be read fails, naming it.
  const std::string path = mf.path() + "/tokenizer.json";
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> json,
                          format::ReadOptionalSmallFile(path, text::kHfTokenizerMaxBytes));
  if (!json.has_value()) return nullptr;
  return text::Tokenizer::FromHfFile(path, *json);
}

// The model's Jinja chat template, "" when it has none. A template stored in a shape Strata cannot
// read (a list without a "default" entry) becomes a template that refuses every conversation with
// that reason, so it is reported, not skipped.
// A template file that is there but cannot be read (a FIFO, a device, too large, not JSON) fails
// the open, naming the file.
absl::StatusOr<std::string> LoadChatTemplate(const model::ModelFile &mf) {
  if (mf.kind() == model::ModelFile::Kind::kGguf) {
    auto s = mf.gguf().GetString("tokenizer.chat_template");
    return s.ok() ? *s : std::string();
  }
  constexpr uint64_t kTemplateMaxBytes = uint64_t{16} << 20;
  constexpr uint64_t kConfigMaxBytes = uint64_t{1} << 26;  // as the tokenizer reads it
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> jinja,
                          format::ReadOptionalSmallFile(mf.path() + "/chat_template.jinja", kTemplateMaxBytes));
  if (jinja.has_value()) return *std::move(jinja);
  const std::string config_path = mf.path() + "/tokenizer_config.json";
  STRATA_ASSIGN_OR_RETURN(std::optional<std::string> text, format::ReadOptionalSmallFile(config_path, kConfigMaxBytes));
  if (!text.has_value()) return std::string();
  // Malformed JSON (or JSON nested past the reader's limit) fails the open, as it does when the
  // tokenizer reads the same file.
  STRATA_ASSIGN_OR_RETURN(const nlohmann::json j, format::ParseJson(*text, MOE_ERR_FORMAT_METADATA, config_path));
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null()) return std::string();
  const auto &t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const auto &e : t) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string()) {
        return e["template"].get<std::string>();
      }
    }
  }
  return std::string(
      "{{ raise_exception('the chat_template in tokenizer_config.json is neither a string nor a list with a "
      "default entry') }}");
}

int DefaultPrefillLayerMin(int n_expert, int n_expert_used) {
  if (n_expert <= 0 || n_expert_used <= 0) return kNoLayerMajor;
  return (4 * n_expert + n_expert_used - 1) / n_expert_used;
}

absl::StatusOr<std::unique_ptr<Context>> Context::Open(const ContextOptions &o) {
  if (o.model_path.empty()) return Errorf(MOE_ERR_INVALID_ARGUMENT, "no model path given");
  // A backend asked for by name that cannot run here (for CUDA: its plugin not found or not
  // loaded, no device) is refused now, with why, before the file is read; AUTO falls back to the CPU.
  STRATA_RETURN_IF_ERROR(backends::Available(o.backend));
  if (o.n_ctx < 0 || o.n_threads < 0 || o.max_sessions < 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "negative n_ctx, n_threads or max_sessions");
  }
  if (o.n_threads > kMaxThreads || o.n_io_threads > kMaxThreads) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "n_threads %d or n_io_threads %d is above the most Strata starts, %d",
                  o.n_threads, o.n_io_threads, kMaxThreads);
  }
  if (o.cpu_experts < MOE_CPU_EXPERTS_AUTO || o.cpu_experts > MOE_CPU_EXPERTS_ALWAYS) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "unknown cpu_experts %d (0 auto, 1 off, 2 always)", o.cpu_experts);
  }
  if (o.max_batch_tokens < 0 || o.prefill_token_max < 0 || o.prefill_layer_min < 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "negative max_batch_tokens, prefill_token_max or prefill_layer_min");
  }
  auto ctx = std::unique_ptr<Context>(new Context());
  if (o.max_batch_tokens > 0) ctx->max_batch_tokens_ = o.max_batch_tokens;
  if (o.prefill_token_max > 0) ctx->prefill_token_max_ = o.prefill_token_max;
  STRATA_ASSIGN_OR_RETURN(Described d, Describe(o.model_path));
  ctx->file_ = std::move(d.file);
  ctx->hp_ = d.hp;
  ctx->prefill_layer_min_ = o.prefill_layer_min > 0 ? o.prefill_layer_min
                                                    : DefaultPrefillLayerMin(d.hp.n_expert, d.hp.n_expert_used);
  ctx->weights_ = std::move(d.weights);
  store::PlanInputs in = PlanInputsFor(o, ctx->hp_);
  ctx->n_ctx_ = in.n_ctx;
  STRATA_ASSIGN_OR_RETURN(ctx->plan_, store::MakePlan(ctx->hp_, ctx->weights_, in));
  ctx->kv_budget_ = std::make_unique<model::KvBudget>(ctx->plan_.kv_bytes);
  ctx->kv_spill_dir_ = o.kv_spill_dir;
  ctx->kv_type_k_ = o.kv_type_k;
  ctx->kv_type_v_ = o.kv_type_v;
  ctx->model_id_ = ModelIdentity(ctx->hp_, *ctx->file_);
  STRATA_ASSIGN_OR_RETURN(ctx->weights_digest_, WeightsDigest(*ctx->file_));
  STRATA_ASSIGN_OR_RETURN(ctx->tokenizer_, LoadTokenizer(*ctx->file_));
  STRATA_ASSIGN_OR_RETURN(ctx->chat_template_, LoadChatTemplate(*ctx->file_));
  if (ctx->tokenizer_ != nullptr && ctx->tokenizer_->vocab_size() > ctx->hp_.n_vocab) {
    return Errorf(MOE_ERR_FORMAT_HPARAMS, "the tokenizer has %d tokens but the model's vocabulary is %d",
                  ctx->tokenizer_->vocab_size(), ctx->hp_.n_vocab);
  }
  if (o.cache_policy < 0 || o.cache_policy > 2 || o.prefetch_distance < 0 || o.n_io_threads < 1) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "bad cache options: policy %d, prefetch distance %d, %d I/O threads",
                  o.cache_policy, o.prefetch_distance, o.n_io_threads);
  }
  // The registry picks the backend (AUTO's rule is there) and the NUMA node its memory traffic is
  // closest to: the weights and the backend's buffers are first touched on that node.
  const moe_backend_kind kind =
      backends::Resolve(o.backend, ctx->plan_.ram_expert_slots < ctx->plan_.n_routed_experts);
  const int backend_node = backends::PreferredNumaNode(kind);
  // The KV cache and the workspace are the backend's: in its own memory, not the RAM budget's.
  const bool device_activations = backends::HasDeviceMemory(kind);
  if (device_activations != in.device_activations) {
    in.device_activations = device_activations;
    STRATA_ASSIGN_OR_RETURN(ctx->plan_, store::MakePlan(ctx->hp_, ctx->weights_, in));
  }
  // A backend with memory of its own (or the tests' host-memory device) has a VRAM tier to plan;
  // the RAM tier's arithmetic is the same either way. With experts streaming and no VRAM budget, a
  // device's tier takes 90% of its free memory (the rest is for what the backend allocates beside
  // the plan): stacked over the RAM tier, it serves uses the RAM tier alone would read from the file.
  const bool device_tier = backends::HasDeviceMemory(kind) || store::DeviceSlotsForTesting() != nullptr;
  bool streaming = ctx->plan_.ram_expert_slots < ctx->plan_.n_routed_experts;
  uint64_t vram_budget = in.vram_budget_bytes;
  if (streaming && vram_budget == 0 && backends::HasDeviceMemory(kind)) {
    vram_budget = backends::DeviceFreeBytes(kind) / 10 * 9;
  }
  if (device_tier != in.have_gpu || vram_budget != in.vram_budget_bytes) {
    in.have_gpu = device_tier;
    in.vram_budget_bytes = vram_budget;
    STRATA_ASSIGN_OR_RETURN(ctx->plan_, store::MakePlan(ctx->hp_, ctx->weights_, in));
  }
  // Experts stream when the plan's RAM tier cannot hold them all. lib/store's tiers serve them then,
  // and also when a device's VRAM budget is short of them while RAM holds them all: VRAM over a RAM
  // tier of the experts VRAM does not hold (with one to spare), or, where the budget gives VRAM no
  // expert slot, a RAM tier of every expert that the device reads in place.
  bool tiered = streaming;
  if (!streaming && o.vram_budget_bytes > 0 && device_tier &&
      ctx->plan_.vram_expert_slots < ctx->plan_.n_routed_experts) {
    tiered = true;
    const uint32_t routed = ctx->plan_.n_routed_experts, vram_slots = ctx->plan_.vram_expert_slots;
    if (vram_slots > 0) {
      // The RAM tier holds one layer's experts at least (ExpertCache's floor).
      const uint32_t least = std::max<uint32_t>(ctx->hp_.n_expert, 2 * static_cast<uint32_t>(ctx->hp_.n_expert_used));
      // Beside the experts VRAM does not hold, spare slots where the budget has them (the landing
      // places of the VRAM tier's victims while its moves are in flight), one at least.
      const uint32_t rest = routed - vram_slots;
      const uint64_t spare = std::clamp<uint64_t>(
          std::min<uint64_t>(ctx->plan_.ram_expert_slots - std::min(ctx->plan_.ram_expert_slots, rest),
                             static_cast<uint64_t>(std::max<int64_t>(0, tunables::Get().vram_spare_ram_slots))),
          1, std::max<uint32_t>(1, vram_slots - 1));
      ctx->plan_.ram_expert_slots = std::min(routed, std::max(rest + static_cast<uint32_t>(spare), least));
    } else {
      ctx->plan_.ram_expert_slots = routed;
    }
    streaming = ctx->plan_.ram_expert_slots < routed;
  }
  // Tiers that hold every expert between them are filled whole at open (below), so the load's
  // progress counts the routed experts' bytes after the resident weights'.
  const bool fill_whole = tiered && device_tier &&
                          (ctx->plan_.ram_expert_slots >= ctx->plan_.n_routed_experts ||
                           (ctx->plan_.vram_expert_slots > 0 &&
                            uint64_t{ctx->plan_.vram_expert_slots} + ctx->plan_.ram_expert_slots >
                                ctx->plan_.n_routed_experts));
  uint64_t expert_bytes = 0, resident_bytes = 0;
  if (fill_whole) {
    for (const model::LayerWeights &L : ctx->weights_.layers) {
      for (const model::ExpertWeights &e : L.experts) expert_bytes += e.gate.nbytes() + e.up.nbytes() + e.down.nbytes();
    }
  }
  {
    numa::ScopedNodeBinding bind(backend_node);
    model::LoadOptions lo;
    lo.n_threads = o.n_threads;
    lo.numa_node = bind.bound() ? backend_node : -1;
    lo.progress = o.load_progress;
    lo.keep_going = o.load_continue;
    if (fill_whole) {
      if (o.load_progress) {
        lo.progress = [&](uint64_t d, uint64_t t) {
          resident_bytes = t;
          o.load_progress(d, t + expert_bytes);
        };
      }
      if (o.load_continue) {
        lo.keep_going = [&](uint64_t d, uint64_t t) {
          resident_bytes = t;
          return o.load_continue(d, t + expert_bytes);
        };
      }
    }
    lo.huge_pages = o.huge_pages;
    STRATA_RETURN_IF_ERROR(ctx->store_.Load(*ctx->file_, ctx->weights_, /*routed_experts=*/!tiered, lo));
    if (bind.bound()) ctx->numa_node_ = backend_node;
  }
  // A hotlist seeds the RAM expert cache of a streaming context, and the VRAM tier's slots.
  std::vector<model::HotExpert> hot;
  if (!o.hotlist_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(hot, model::ReadHotlist(o.hotlist_path, ctx->hp_));
  }
  // The one point where the backend is made.
  {
    model::BackendRequest req;
    req.weights = &ctx->weights_;
    req.arena = ctx->store_.arena();
    req.arena_bytes = ctx->store_.resident_bytes();
    req.n_threads = o.n_threads;
    req.cpu_q8_activations = o.cpu_q8_activations;
    req.gpu_q8_activations = o.gpu_q8_activations;
    req.cpu_experts = o.cpu_experts;
    req.ram_expert_slots = ctx->plan_.ram_expert_slots;
    req.n_routed_experts = ctx->plan_.n_routed_experts;
    req.graphs = o.cuda_graphs;
    if (o.cuda_cold_copies.has_value()) req.cold_copies = *o.cuda_cold_copies;
    req.device_streaming = o.cuda_streaming;
    numa::ScopedNodeBinding bind(backend_node);
    STRATA_ASSIGN_OR_RETURN(ctx->backend_, backends::Create(kind, req));
  }
  if (backends::HasDeviceMemory(kind)) {
    if (!streaming) ctx->plan_.vram_budget_bytes = o.vram_budget_bytes;
    // Without the tiers every expert is in VRAM; over them, the VRAM tier keeps the plan's slots.
    if (!tiered) ctx->plan_.vram_expert_slots = ctx->plan_.n_routed_experts;
  }
  // A slot lays each expert part out at the alignment the backend's kernels read host views at
  // (a checkpoint's tensors land aligned even where the file does not place them so).
  ctx->table_ = std::make_unique<store::ExpertTable>(ctx->weights_, ctx->backend_->host_view_alignment());
  ctx->resident_layer_hits_.assign(ctx->hp_.n_layer, 0);
  ctx->expert_counts_.assign(static_cast<size_t>(ctx->hp_.n_layer) * ctx->hp_.n_expert, 0);
  if (tiered) {
    store::CacheOptions co;
    co.n_slots = ctx->plan_.ram_expert_slots;
    co.policy = static_cast<store::PolicyKind>(o.cache_policy);
    co.prefetch_distance = o.prefetch_distance;
    co.n_io_threads = o.n_io_threads;
    co.direct_io = o.direct_io;
    co.numa_node = backend_node;
    STRATA_ASSIGN_OR_RETURN(ctx->cache_, store::ExpertCache::Create(*ctx->table_, *ctx->file_, ctx->weights_,
                                                                    ctx->backend_.get(), co));
    if (std::string w = store::LockWarning(ctx->cache_->stats()); !w.empty()) ctx->plan_.warnings.push_back(w);
    // The backend reads each expert where its slot holds it (a no-op for one that reads host memory
    // anyway), aligned as the table laid the slots out.
    if (const size_t align = ctx->backend_->host_view_alignment(); align > ctx->table_->view_alignment()) {
      return Errorf(MOE_ERR_INTERNAL, "the %s backend reads host views %u-byte aligned, the expert table lays them out %u",
                    backends::Name(kind), align, ctx->table_->view_alignment());
    }
    STRATA_RETURN_IF_ERROR(ctx->backend_->MapHostMemory(ctx->cache_->slab(), ctx->cache_->slab_bytes()));
    // The VRAM tier stacks over the RAM tier where the backend has memory of its own and the plan
    // gives it slots: the two hold distinct experts, so their budgets add up.
    ctx->device_slots_ = ctx->backend_->MakeDeviceSlots();
    if (ctx->device_slots_ == nullptr && store::DeviceSlotsForTesting() != nullptr) {
      ctx->device_slots_ = store::DeviceSlotsForTesting()();
    }
    if (ctx->device_slots_ != nullptr && ctx->plan_.vram_expert_slots > 0) {
      store::VramTierOptions vo;
      vo.n_slots = ctx->plan_.vram_expert_slots;
      vo.replan_moves = static_cast<int>(std::clamp<int64_t>(tunables::Get().vram_replan_moves, 0, 1 << 20));
      vo.max_moves = static_cast<int>(std::clamp<int64_t>(tunables::Get().vram_max_moves, 1, 1 << 20));
      vo.pass_moves = static_cast<int>(std::clamp<int64_t>(tunables::Get().vram_pass_moves, 0, 1 << 20));
      STRATA_ASSIGN_OR_RETURN(ctx->vram_, store::VramTier::Create(*ctx->table_, ctx->device_slots_.get(),
                                                                   ctx->cache_.get(), vo));
      ctx->cache_->SetTierAbove(ctx->vram_.get());
    } else {
      // No VRAM slot: a RAM tier of every expert keeps the device (its tables, below), else nothing.
      if (ctx->cache_->n_slots() < ctx->plan_.n_routed_experts) ctx->device_slots_.reset();
      ctx->plan_.vram_expert_slots = 0;
    }
    ctx->plan_.streamed_experts = store::StreamedExperts(ctx->plan_);
  }
  std::vector<uint32_t> hot_keys;
  for (const auto &h : hot) hot_keys.push_back(ctx->table_->Key(h.layer, h.expert));
  // Tiers that hold every expert are read whole now, the load's progress going on over their bytes.
  store::ExpertCache::FillOptions whole_fill;
  whole_fill.n_threads = o.n_threads;
  whole_fill.bytes_before = resident_bytes;
  whole_fill.bytes_total = resident_bytes + expert_bytes;
  whole_fill.progress = o.load_progress;
  whole_fill.keep_going = o.load_continue;
  bool filled_whole = false;
  if (ctx->vram_ != nullptr && ctx->vram_->complete()) {
    filled_whole = true;
    // The tiers hold every expert: VRAM takes the hotlist's and an equal share of each layer's,
    // RAM the rest. Both are read now by the load's threads through the page cache (VRAM's share
    // into free RAM slots first, then moved up, the RAM tier giving its copies up), so the first
    // step finds every expert in place and routes on the device (VramTier::Settle).
    store::ExpertCache::FillOptions fo = whole_fill;
    const std::vector<uint32_t> opening = ctx->vram_->OpeningKeys(hot_keys);
    const auto bytes_of = [&](const std::vector<uint32_t> &keys) {
      uint64_t b = 0;
      for (uint32_t key : keys) {
        const model::ExpertWeights *e = ctx->table_->entry(ctx->table_->LayerOf(key), ctx->table_->ExpertOf(key)).weights;
        if (e != nullptr) b += e->gate.nbytes() + e->up.nbytes() + e->down.nbytes();
      }
      return b;
    };
    for (size_t i = 0; i < opening.size();) {
      // As many as the RAM tier's slots take at once (all of them, unless VRAM outnumbers RAM).
      const size_t n = std::min<size_t>(opening.size() - i, ctx->cache_->n_slots());
      const std::vector<uint32_t> batch(opening.begin() + i, opening.begin() + i + n);
      STRATA_RETURN_IF_ERROR(ctx->cache_->Fill(batch, fo));
      STRATA_RETURN_IF_ERROR(ctx->vram_->Seed(batch, SIZE_MAX).status());
      fo.bytes_before += bytes_of(batch);
      i += n;
    }
    std::vector<uint32_t> rest;
    for (int l = 0; l < ctx->table_->n_layers(); ++l) {
      for (int x = 0; x < ctx->table_->n_experts(); ++x) {
        const uint32_t key = ctx->table_->Key(l, x);
        if (ctx->table_->entry(l, x).weights != nullptr && !ctx->vram_->Holds(key)) rest.push_back(key);
      }
    }
    STRATA_RETURN_IF_ERROR(ctx->cache_->Fill(rest, fo));
    STRATA_RETURN_IF_ERROR(ctx->vram_->Settle());
    // The opening's reads and moves are the load's; the counters are the run's.
    ctx->vram_->ResetStats();
    ctx->cache_->ResetStats();
  } else if (ctx->cache_ != nullptr && ctx->cache_->n_slots() >= ctx->plan_.n_routed_experts) {
    // A RAM tier of every expert under a device that holds none of them (its budget gives VRAM no
    // expert slot): read whole now, as the resident weights would have been, hotlist or not.
    std::vector<uint32_t> all;
    for (int l = 0; l < ctx->table_->n_layers(); ++l) {
      for (int x = 0; x < ctx->table_->n_experts(); ++x) {
        if (ctx->table_->entry(l, x).weights != nullptr) all.push_back(ctx->table_->Key(l, x));
      }
    }
    STRATA_RETURN_IF_ERROR(ctx->cache_->Fill(all, whole_fill));
    ctx->cache_->ResetStats();
    filled_whole = true;
    // Nothing moves in a RAM tier of every expert: the device's tables point at their slots, and
    // decode batches route on the device with no host wait between layers.
    if (ctx->device_slots_ != nullptr && ctx->device_slots_->EnableTables()) {
      bool pointed = true;
      for (uint32_t key : all) {
        const model::ExpertWeights *ram = ctx->cache_->ReadyViews(key);
        if (ram == nullptr) {
          pointed = false;
          break;
        }
        STRATA_RETURN_IF_ERROR(ctx->device_slots_->Point(ctx->table_->LayerOf(key), ctx->table_->ExpertOf(key), *ram));
      }
      ctx->ram_tables_ = pointed;
    }
  } else if (!hot_keys.empty() && ctx->cache_ != nullptr) {
    const size_t cap = o.hotlist_max > 0 ? static_cast<size_t>(o.hotlist_max) : hot_keys.size();
    // The hottest fill VRAM first (read through the RAM tier, which then gives them up), the next
    // ones RAM: the RAM tier's preload skips what the VRAM tier holds.
    if (ctx->vram_ != nullptr) STRATA_RETURN_IF_ERROR(ctx->vram_->Seed(hot_keys, cap).status());
    ctx->cache_->Preload(hot_keys, cap);  // loads run on the I/O threads while the host carries on
  }
  if (fill_whole && !filled_whole && o.load_progress) {
    o.load_progress(resident_bytes + expert_bytes, resident_bytes + expert_bytes);  // the total the load promised
  }
  return ctx;
}

Context::~Context() {
  // The cache goes before the backend: a backend that maps its slab lets go of it first (a no-op
  // for the others).
  if (cache_ != nullptr && backend_ != nullptr) backend_->UnmapHostMemory(cache_->slab());
}

absl::StatusOr<Session *> Context::OpenSession(const SessionOptions &o) {
  if (o.n_ctx < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "negative n_ctx %d", o.n_ctx);
  if (o.n_ctx > hp_.n_ctx_train) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "session n_ctx %d exceeds the model's context length %d", o.n_ctx,
                  hp_.n_ctx_train);
  }
  if (!(o.sampler.temperature >= 0.f) || !(o.sampler.top_p > 0.f)) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "temperature must be >= 0 and top_p > 0");
  }
  const SamplerParams &sp = o.sampler;
  if (!(sp.min_p >= 0.f && sp.min_p <= 1.f) || !(sp.repeat_penalty > 0.f) || !std::isfinite(sp.repeat_penalty) ||
      !std::isfinite(sp.presence_penalty) || !std::isfinite(sp.frequency_penalty) || sp.penalty_last_n < 0) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT,
                  "min_p must be in [0, 1], repeat_penalty > 0, presence_penalty and frequency_penalty finite and "
                  "penalty_last_n >= 0 (got %g, %g, %g, %g, %d)", sp.min_p, sp.repeat_penalty, sp.presence_penalty,
                  sp.frequency_penalty, sp.penalty_last_n);
  }
  for (int32_t t : o.stop_tokens) {
    if (t < 0 || t >= hp_.n_vocab) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "stop token %d is outside the vocabulary [0, %d)", t, hp_.n_vocab);
    }
  }
  if (o.window < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "negative attention window %d", o.window);
  for (int32_t t : o.blocked_tokens) {
    if (t < 0 || t >= hp_.n_vocab) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "blocked token %d is outside the vocabulary [0, %d)", t, hp_.n_vocab);
    }
  }
  const int n_ctx = o.n_ctx > 0 ? o.n_ctx : n_ctx_;
  if (o.n_keep < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "negative n_keep %d (tokens a context shift keeps)", o.n_keep);
  if (o.ctx_shift && o.n_keep >= n_ctx) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT,
                  "n_keep %d leaves a context shift nothing to drop: it must be below the session's n_ctx %d", o.n_keep,
                  n_ctx);
  }
  auto s = std::unique_ptr<Session>(new Session(this, o));
  s->n_ctx_ = n_ctx;
  STRATA_RETURN_IF_ERROR(s->kv_.Init(hp_, s->n_ctx_, kv_budget_.get(), backend_.get(), kv_type_k_, kv_type_v_));
  s->kv_.SetMask(o.window, o.blocked_tokens);
  std::lock_guard<std::mutex> lk(mu_);
  sessions_.push_back(std::move(s));
  return sessions_.back().get();
}

void Context::CloseSession(Session *s) {
  std::lock_guard<std::mutex> lk(mu_);
  sessions_.erase(std::remove_if(sessions_.begin(), sessions_.end(),
                                 [s](const std::unique_ptr<Session> &p) { return p.get() == s; }),
                  sessions_.end());
}

absl::StatusOr<Session *> Context::ForkSession(Session *src) {
  std::lock_guard<std::mutex> lk(mu_);
  auto s = std::unique_ptr<Session>(new Session(this, src->opts_));
  std::lock_guard<std::mutex> slk(src->mu_);
  s->n_ctx_ = src->n_ctx_;
  STRATA_RETURN_IF_ERROR(s->kv_.Init(hp_, s->n_ctx_, kv_budget_.get(), backend_.get(), kv_type_k_, kv_type_v_));
  s->kv_.SetMask(src->opts_.window, src->opts_.blocked_tokens);
  if (src->kv_.spilled()) {
    STRATA_RETURN_IF_ERROR(Annotate(WithKvRoom(src, [&]() { return src->kv_.Unspill(); }),
                                    "reading the evicted session back to fork it"));
  }
  STRATA_RETURN_IF_ERROR(s->kv_.ShareFrom(src->kv_));
  s->n_past_ = src->n_past_;
  s->pending_ = src->pending_;
  s->logits_ = src->logits_;
  s->n_logit_rows_ = src->n_logit_rows_;
  s->rows_open_ = src->rows_open_;
  s->history_ = src->history_;
  uint64_t rng[4];
  src->rng_.GetState(rng);
  s->rng_.SetState(rng);
  s->last_step_ = src->last_step_;
  sessions_.push_back(std::move(s));
  return sessions_.back().get();
}

absl::Status Context::RewindSession(Session *s, int n) {
  std::lock_guard<std::mutex> lk(mu_);  // no step runs the session meanwhile
  std::lock_guard<std::mutex> slk(s->mu_);
  if (n < 0 || n > s->n_past_) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "cannot rewind %d tokens: the session has processed %d", n, s->n_past_);
  }
  if (!s->pending_.empty()) {
    return Errorf(MOE_ERR_STATE, "the session has %u tokens of input queued; rewind once a step has processed them",
                  s->pending_.size());
  }
  if (n == 0) return absl::OkStatus();
  s->n_past_ -= n;
  s->history_.resize(static_cast<size_t>(s->n_past_));
  s->kv_.Trim(s->n_past_);  // positions past n_past_ in a kept block are written again before use
  s->logits_.clear();
  s->n_logit_rows_ = 0;
  s->rows_open_ = false;
  s->detok_.reset();
  s->stop_filter_.reset();
  return absl::OkStatus();
}

absl::Status Context::ShiftSession(Session *s, int n_keep, int n_discard) {
  std::lock_guard<std::mutex> lk(mu_);  // no step runs the session meanwhile
  const int n_past = s->n_past();
  if (n_keep < 0 || n_discard < 0 || n_keep > n_past - n_discard) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT,
                  "cannot drop %d tokens after the first %d: the session has processed %d (n_keep and n_discard must "
                  "be >= 0 and n_keep + n_discard <= n_past)",
                  n_discard, n_keep, n_past);
  }
  if (n_discard == 0) return absl::OkStatus();
  if (s->kv_.spilled()) {
    STRATA_RETURN_IF_ERROR(Annotate(WithKvRoom(s, [&]() { return s->kv_.Unspill(); }),
                                    "reading the evicted session back to shift it"));
  }
  // Copying blocks shared with a fork may need budget: other sessions make room as for a fork.
  STRATA_RETURN_IF_ERROR(WithKvRoom(s, [&]() { return s->kv_.Unshare(n_keep, n_past - n_discard - n_keep); }));
  return ShiftLocked(s, n_keep, n_discard);
}

absl::Status Context::ShiftLocked(Session *s, int n_keep, int n_discard) {
  STRATA_RETURN_IF_ERROR(s->kv_.Shift(*backend_, hp_, s->n_past(), n_keep, n_discard));
  std::lock_guard<std::mutex> slk(s->mu_);
  s->n_past_ -= n_discard;
  s->history_.erase(s->history_.begin() + n_keep, s->history_.begin() + n_keep + n_discard);
  return absl::OkStatus();
}

// Counts every routing selection per (layer, expert), then defers to the real source. In layer-major
// mode (a long prefill pass) it also asks the expert cache for the whole next layer once this
// layer's experts are in, so the reads of layer l+1 overlap layer l's compute without waiting for a
// prediction.
class CountingExperts final : public model::ExpertSource {
 public:
  CountingExperts(model::ExpertSource *inner, std::vector<uint64_t> *counts, int n_expert,
                  store::ExpertCache *cache, int n_layer)
      : inner_(inner), counts_(counts), n_expert_(n_expert), cache_(cache), n_layer_(n_layer) {}
  bool layer_major = false;
  bool ram_tables = false;  // the device's tables point at a RAM tier of every expert
  void OnRoute(int layer, const float *h, int64_t n_tok, const int32_t *selected, int k) override {
    for (int64_t i = 0; i < n_tok * k; ++i) ++(*counts_)[static_cast<size_t>(layer) * n_expert_ + selected[i]];
    inner_->OnRoute(layer, h, n_tok, selected, k);
  }
  absl::Status Acquire(int layer, const std::vector<int32_t> &experts,
                       std::vector<const model::ExpertWeights *> *out) override {
    STRATA_RETURN_IF_ERROR(inner_->Acquire(layer, experts, out));
    if (layer_major && cache_ != nullptr && layer + 1 < n_layer_) cache_->PrefetchLayer(layer + 1);
    return absl::OkStatus();
  }
  void Release(int layer, const std::vector<int32_t> &experts) override { inner_->Release(layer, experts); }
  absl::Status AcquireAsync(int layer, const std::vector<int32_t> &experts,
                            std::vector<const model::ExpertWeights *> *out) override {
    STRATA_RETURN_IF_ERROR(inner_->AcquireAsync(layer, experts, out));
    if (layer_major && cache_ != nullptr && layer + 1 < n_layer_) cache_->PrefetchLayer(layer + 1);
    return absl::OkStatus();
  }
  absl::StatusOr<const model::ExpertWeights *> Await(int layer, int32_t expert) override {
    return inner_->Await(layer, expert);
  }
  bool resident() const override { return !layer_major && inner_->resident(); }
  bool routes_on_device() const override { return !layer_major && (ram_tables || inner_->routes_on_device()); }

 private:
  model::ExpertSource *inner_;
  std::vector<uint64_t> *counts_;
  int n_expert_;
  store::ExpertCache *cache_;
  int n_layer_;
};

// Counts expert uses when every expert is resident, so stats read the same either way.
class ResidentExperts final : public model::ExpertSource {
 public:
  ResidentExperts(const model::ModelWeights &w, uint64_t *hits, std::vector<uint64_t> *layer_hits)
      : w_(w), hits_(hits), layer_hits_(layer_hits) {}
  absl::Status Acquire(int layer, const std::vector<int32_t> &experts,
                       std::vector<const model::ExpertWeights *> *out) override {
    out->resize(experts.size());
    for (size_t i = 0; i < experts.size(); ++i) (*out)[i] = &w_.layers[layer].experts[experts[i]];
    *hits_ += experts.size();
    (*layer_hits_)[layer] += experts.size();
    return absl::OkStatus();
  }
  void Release(int, const std::vector<int32_t> &) override {}
  bool resident() const override { return true; }

 private:
  const model::ModelWeights &w_;
  uint64_t *hits_;
  std::vector<uint64_t> *layer_hits_;
};

absl::Status Context::Step(uint32_t *n_pending) {
  std::lock_guard<std::mutex> lk(mu_);
  bool ran = false;
  absl::Status st = SpendAbort(StepLocked(max_batch_tokens_, &ran));
  if (n_pending != nullptr) *n_pending = CountPendingLocked();
  return st;
}

absl::Status Context::SpendAbort(absl::Status st) {
  if (StatusToMoe(st) == MOE_ERR_ABORTED) abort_.store(false, std::memory_order_release);
  return st;
}

absl::Status Context::StepFor(int64_t budget_us, uint32_t *n_pending, uint32_t *n_steps) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  absl::Status st = absl::OkStatus();
  uint32_t steps = 0;
  for (;;) {
    const double left_us =
        static_cast<double>(budget_us) - std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    // Size the pass to the time left; unmeasured yet, start small.
    int cap = max_batch_tokens_;
    if (us_per_token_ > 0) {
      cap = static_cast<int>(std::min<double>(cap, std::floor(left_us / us_per_token_)));
    } else {
      cap = std::min(cap, 16);
    }
    if (cap < 1) {
      if (steps > 0) break;
      cap = 1;  // the first pass always runs: progress even when the budget is below one token
    }
    bool ran = false;
    st = SpendAbort(StepLocked(cap, &ran));
    if (!st.ok() || !ran) break;
    ++steps;
  }
  if (n_pending != nullptr) *n_pending = CountPendingLocked();
  if (n_steps != nullptr) *n_steps = steps;
  return st;
}

uint32_t Context::CountPendingLocked() const {
  uint32_t n = 0;
  for (const auto &sp : sessions_) n += sp->n_pending() > 0 ? 1 : 0;
  return n;
}

absl::Status Context::StepLocked(int cap, bool *ran) {
  *ran = false;
  if (abort_.load(std::memory_order_acquire)) {
    return Errorf(MOE_ERR_ABORTED, "the step was aborted (moe_ctx_abort) before it started");
  }
  // --- take each session's chunk: round-robin from rr_next_, a fair share each round ---
  struct Chunk {
    Session *s;
    std::vector<int32_t> tokens;
    int pos0;
    bool token_by_token;  // a very short input: one token per pass
    bool new_input;       // the first chunk of the session's input (rows start afresh)
    int32_t rows = 0;     // logits rows in the session's step_logits_
  };
  const size_t n_sess = sessions_.size();
  std::vector<size_t> want(n_sess, 0);
  std::vector<int> shift(n_sess, 0);  // tokens a context shift drops before the session's input
  std::vector<size_t> order;
  for (size_t i = 0; i < n_sess; ++i) {
    const size_t idx = (rr_next_ + i) % n_sess;
    const Session &s = *sessions_[idx];
    want[idx] = s.n_pending();
    if (want[idx] > 0 && s.opts_.ctx_shift) {
      // Input past n_ctx: the context fills up, then shifts, as often as the input needs; a step
      // takes what fits, so where the shifts fall does not depend on how the input is cut into steps.
      const int n_past = s.n_past();
      int room = s.n_ctx_ - n_past;
      if (room <= 0) room = shift[idx] = DiscardFor(n_past, s.opts_.n_keep);
      want[idx] = std::min(want[idx], static_cast<size_t>(room));
    }
    if (want[idx] > 0) order.push_back(idx);
  }
  if (order.empty()) return absl::OkStatus();
  if (cache_ != nullptr) {
    // A model file replaced or resized under us must not feed stale or torn experts.
    for (int i = 0; i < file_->n_files(); ++i) STRATA_RETURN_IF_ERROR(file_->file(i).CheckUnchanged());
  }
  std::vector<size_t> take(n_sess, 0);
  size_t left = static_cast<size_t>(std::max(1, cap));
  const size_t quantum = std::max<size_t>(1, left / order.size());
  for (bool more = true; more && left > 0;) {
    more = false;
    for (size_t idx : order) {
      if (left == 0) break;
      const size_t n = std::min({quantum, want[idx] - take[idx], left});
      take[idx] += n;
      left -= n;
      more = more || take[idx] < want[idx];
    }
  }
  // --- KV: each session in turn gets the blocks for all its queued input (evicted sessions come
  // back first), or sits this step out; a budget that cannot hold one session fails the step before
  // anything is computed ---
  size_t first_left_out = n_sess;
  STRATA_RETURN_IF_ERROR(AdmitKv(order, want, shift, &take, &first_left_out));
  std::vector<Chunk> chunks;
  size_t last_served = order.front();
  for (size_t idx : order) {
    if (take[idx] == 0) continue;
    Session &s = *sessions_[idx];
    std::lock_guard<std::mutex> slk(s.mu_);
    Chunk c;
    c.s = &s;
    c.tokens.assign(s.pending_.begin(), s.pending_.begin() + take[idx]);
    c.pos0 = s.n_past_;
    c.new_input = !s.rows_open_;
    c.token_by_token = c.tokens.size() > 1 && s.pending_.size() <= static_cast<size_t>(prefill_token_max_);
    chunks.push_back(std::move(c));
    last_served = idx;
  }
  // The next step starts with the first session the KV budget left out, else after the last
  // session served when the token cap left some out, else one further.
  rr_next_ = (first_left_out < n_sess          ? first_left_out
              : chunks.size() < order.size() ? last_served + 1
                                             : rr_next_ + 1) %
             n_sess;
  ++step_count_;
  for (Chunk &c : chunks) c.s->last_step_ = step_count_;
  auto trim_all = [&] {
    for (Chunk &c : chunks) c.s->kv_.Trim(c.pos0);
  };

  // --- the passes: one over every chunk; token-by-token chunks add one pass per further token ---
  ResidentExperts resident(weights_, &resident_hits_, &resident_layer_hits_);
  model::ExpertSource *tiers = vram_ != nullptr    ? static_cast<model::ExpertSource *>(vram_.get())
                               : cache_ != nullptr ? static_cast<model::ExpertSource *>(cache_.get())
                                                   : &resident;
  CountingExperts counting(tiers, &expert_counts_, hp_.n_expert, cache_.get(), hp_.n_layer);
  counting.ram_tables = ram_tables_;
  size_t n_pass = 1;
  bool prompt = false;
  for (const Chunk &c : chunks) {
    if (c.token_by_token) n_pass = std::max(n_pass, c.tokens.size());
    prompt = prompt || (c.tokens.size() > 1 && c.new_input);
  }
  if (cache_ != nullptr && prompt) cache_->OnNewPrompt();
  if (vram_ != nullptr && prompt) vram_->OnNewPrompt();
  if (vram_ != nullptr) STRATA_RETURN_IF_ERROR(vram_->Settle());
  const auto t0 = std::chrono::steady_clock::now();
  int64_t n_tok = 0;
  for (size_t p = 0; p < n_pass; ++p) {
    model::ForwardArgs a;
    std::vector<Chunk *> in_pass;
    int64_t pass_tok = 0;
    for (Chunk &c : chunks) {
      const bool all = c.s->opts_.logits_all;
      if (c.token_by_token && p < c.tokens.size()) {
        a.seqs.push_back(model::SequenceArgs{&c.s->kv_, c.tokens.data() + p, 1, c.pos0 + static_cast<int>(p), all});
      } else if (!c.token_by_token && p == 0) {
        a.seqs.push_back(model::SequenceArgs{&c.s->kv_, c.tokens.data(), static_cast<int64_t>(c.tokens.size()),
                                             c.pos0, all});
      } else {
        continue;
      }
      // The pass's rows go after the chunk's earlier rows (every token's logits), else replace them.
      const int32_t first = all ? c.rows : 0, n = all ? static_cast<int32_t>(a.seqs.back().n_tok) : 1;
      std::vector<float> &dst = c.s->step_logits_;
      const size_t need = static_cast<size_t>(first + n) * hp_.n_vocab;
      if (dst.size() < need) dst.resize(need);
      a.seqs.back().logits_dst = dst.data() + static_cast<size_t>(first) * hp_.n_vocab;
      c.rows = first + n;
      in_pass.push_back(&c);
      pass_tok += a.seqs.back().n_tok;
    }
    // A pass whose experts the device routes over the tiers' tables by itself stays token-major: it
    // is computed as with every expert resident (the same kernels, the same bits), no host wait a layer.
    const bool on_tables = ram_tables_ || (vram_ != nullptr && vram_->routes_on_device());
    const bool device_routes = on_tables && pass_tok * hp_.n_expert_used <= backend_->routed_rows_max();
    counting.layer_major = cache_ != nullptr && pass_tok >= prefill_layer_min_ && !device_routes;
    if (vram_ != nullptr) vram_->BeginPass(counting.layer_major);
    a.experts = &counting;
    a.workspace = &workspace_;
    a.abort = &abort_;
    // On failure no session is committed: the KV rows written at positions >= n_past are not part
    // of any session and are overwritten by the retry, and step_logits_ is not read.
    if (absl::Status st = model::Forward(hp_, weights_, *backend_, a, nullptr); !st.ok()) {
      trim_all();
      return st;
    }
    n_tok += pass_tok;
    const bool decode = std::any_of(in_pass.begin(), in_pass.end(), [&](Chunk *c) {
      return c->tokens.size() == 1;
    });
    if (cache_ != nullptr && decode) cache_->OnDecodeToken();
    // Moves between the tiers happen here, between passes; a failed copy fails the step.
    absl::Status moved = vram_ == nullptr ? absl::OkStatus()
                         : decode         ? vram_->OnDecodeToken()
                         : prompt         ? vram_->OnPromptDone()
                                          : absl::OkStatus();
    if (!moved.ok()) {
      trim_all();
      return moved;
    }
  }
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  const double per_tok = us / static_cast<double>(std::max<int64_t>(1, n_tok));
  us_per_token_ = us_per_token_ > 0 ? 0.7 * us_per_token_ + 0.3 * per_tok : per_tok;

  // --- commit: every session's chunk together, after every pass succeeded ---
  for (Chunk &c : chunks) {
    Session &s = *c.s;
    std::lock_guard<std::mutex> slk(s.mu_);
    s.pending_.erase(s.pending_.begin(), s.pending_.begin() + c.tokens.size());
    s.n_past_ += static_cast<int>(c.tokens.size());
    s.history_.insert(s.history_.end(), c.tokens.begin(), c.tokens.end());
    const size_t floats = static_cast<size_t>(c.rows) * hp_.n_vocab;
    if (s.opts_.logits_all && !c.new_input) {
      s.logits_.insert(s.logits_.end(), s.step_logits_.begin(), s.step_logits_.begin() + floats);
      s.n_logit_rows_ += c.rows;
    } else {
      s.logits_.swap(s.step_logits_);
      s.logits_.resize(floats);  // within its room: logits_ holds exactly its rows
      s.n_logit_rows_ = c.rows;
    }
    // A buffer far larger than this step needed (an earlier prompt's rows of every token) is let go.
    if (s.step_logits_.capacity() > 2 * std::max<size_t>(floats, hp_.n_vocab)) {
      std::vector<float>().swap(s.step_logits_);
    }
    s.rows_open_ = !s.pending_.empty();
  }
  *ran = true;
  return absl::OkStatus();
}

absl::Status Context::WithKvRoom(Session *s, const std::function<absl::Status()> &fn) {
  for (;;) {
    absl::Status st = fn();
    if (st.ok() || StatusToMoe(st) != MOE_ERR_LIMIT_KV || kv_spill_dir_.empty()) return st;
    // Outside a step any other session may go (one with input comes back at its next step):
    // sessions without input first, then the least recently run.
    Session *victim = nullptr;
    bool victim_idle = false;
    for (auto &sp : sessions_) {
      Session *c = sp.get();
      if (c == s || c->kv_.spilled() || c->kv_.n_blocks() == 0) continue;
      const bool idle = c->n_pending() == 0;
      if (victim == nullptr || (idle && !victim_idle) ||
          (idle == victim_idle && c->last_step_ < victim->last_step_)) {
        victim = c;
        victim_idle = idle;
      }
    }
    if (victim == nullptr) return st;
    STRATA_RETURN_IF_ERROR(Annotate(victim->kv_.Spill(kv_spill_dir_, victim->n_past()), "evicting an idle session"));
  }
}

absl::Status Context::AdmitKv(const std::vector<size_t> &order, const std::vector<size_t> &want,
                              const std::vector<int> &shift, std::vector<size_t> *take, size_t *first_left_out) {
  const size_t n_sess = sessions_.size();
  const uint64_t limit = kv_budget_->limit();
  auto blocks_for = [](int64_t positions) { return (positions + model::kKvBlockTokens - 1) / model::kKvBlockTokens; };
  auto free_bytes = [&] { return limit - std::min(limit, kv_budget_->used()); };
  // A session whose queued input needs more than the whole budget can never run: the step fails
  // rather than leave it queued forever.
  for (size_t idx : order) {
    if ((*take)[idx] == 0) continue;
    const Session &s = *sessions_[idx];
    // A session that shifts holds its n_past positions first, then its input after the shift.
    const int64_t positions =
        std::max<int64_t>(s.n_past() - shift[idx] + static_cast<int64_t>(want[idx]), shift[idx] > 0 ? s.n_past() : 0);
    const uint64_t bytes = static_cast<uint64_t>(blocks_for(positions)) * s.kv_.block_bytes();
    if (bytes > limit) {
      return Errorf(MOE_ERR_LIMIT_KV,
                    "a session's %d positions (%d processed, %u queued) need %d KV block(s) of %u bytes, more than "
                    "the context's whole KV budget of %u bytes (%u bytes in use); raise moe_params.kv_budget_bytes "
                    "or close the session",
                    positions, s.n_past(), want[idx], blocks_for(positions), s.kv_.block_bytes(), limit,
                    kv_budget_->used());
    }
  }
  std::vector<char> in_step(n_sess, 0);  // admitted, or still to be looked at
  for (size_t idx : order) in_step[idx] = (*take)[idx] > 0;
  std::vector<Session *> admitted;
  auto rollback = [&] {
    for (Session *s : admitted) s->kv_.Trim(s->n_past());
  };
  auto leave_out = [&](size_t idx) {
    (*take)[idx] = 0;
    in_step[idx] = 0;
    // The first in the order: the one the next step starts with.
    for (size_t o : order) {
      if (o == idx || o == *first_left_out) {
        *first_left_out = o;
        break;
      }
    }
  };
  uint64_t short_bytes = 0;  // what the last session left out lacked (for the message)
  for (size_t oi = 0; oi < order.size(); ++oi) {
    const size_t idx = order[oi];
    if ((*take)[idx] == 0) continue;
    Session &s = *sessions_[idx];
    const int n_past = s.n_past(), base = n_past - shift[idx];  // the input goes at base..
    const int positions = base + static_cast<int>(want[idx]);
    // New blocks, and the blocks shared with a fork that the input writes into (each is copied
    // first; an eviction below may end the sharing, so it is counted again). A shift holds the
    // n_past positions first (an evicted session comes back whole) and writes the rows from n_keep.
    const int hold = shift[idx] > 0 ? std::max(positions, n_past) : positions;
    const int write0 = shift[idx] > 0 ? s.opts_.n_keep : n_past;
    auto need_now = [&] {
      return static_cast<uint64_t>(std::max<int64_t>(0, blocks_for(hold) - s.kv_.n_blocks()) +
                                   s.kv_.SharedBlocksIn(write0, positions - write0)) *
             s.kv_.block_bytes();
    };
    uint64_t need = need_now();
    if (need > free_bytes() && !kv_spill_dir_.empty()) {
      // Who can make room: idle sessions, least recently run first, then the ones after this one
      // in the order, the last first (they leave this step).
      std::vector<size_t> victims;
      for (size_t v = 0; v < n_sess; ++v) {
        if (!in_step[v] && v != idx) victims.push_back(v);
      }
      std::sort(victims.begin(), victims.end(),
                [&](size_t a, size_t b) { return sessions_[a]->last_step_ < sessions_[b]->last_step_; });
      for (size_t oj = order.size(); oj-- > oi + 1;) {
        if (in_step[order[oj]]) victims.push_back(order[oj]);
      }
      uint64_t can_free = 0;
      for (size_t v : victims) can_free += sessions_[v]->kv_.resident_bytes();
      if (need <= free_bytes() + can_free) {
        for (size_t v : victims) {
          if (need <= free_bytes()) break;
          Session &victim = *sessions_[v];
          if (victim.kv_.spilled() || victim.kv_.n_blocks() == 0) continue;
          if (in_step[v]) leave_out(v);
          absl::Status st = victim.kv_.Spill(kv_spill_dir_, victim.n_past());
          if (!st.ok()) {
            rollback();
            return Annotate(st, "evicting a session to make KV room");
          }
          need = need_now();
        }
      }
    }
    if (need > free_bytes()) {
      short_bytes = need - free_bytes();
      leave_out(idx);
      continue;
    }
    absl::Status st = s.kv_.Unspill();
    if (st.ok() && shift[idx] > 0) st = ShiftLocked(&s, s.opts_.n_keep, shift[idx]);
    if (st.ok()) st = s.kv_.Unshare(s.n_past(), static_cast<int64_t>(want[idx]));
    if (st.ok()) st = s.kv_.Reserve(positions);
    if (!st.ok()) {
      // Unspill may have brought the blocks back: as resident they are the same session.
      s.kv_.Trim(s.n_past());
      rollback();
      return st;
    }
    admitted.push_back(&s);
  }
  if (admitted.empty()) {
    return Errorf(MOE_ERR_LIMIT_KV,
                  "the context's KV budget of %u bytes (%u bytes in use) lacks %u bytes for the next session with "
                  "input: other sessions hold them%s",
                  limit, kv_budget_->used(), short_bytes,
                  kv_spill_dir_.empty() ? "; close some, or give moe_params.kv_spill_dir so idle ones can be evicted"
                                        : "");
  }
  return absl::OkStatus();
}

absl::Status Context::EvictSession(Session *s) {
  if (kv_spill_dir_.empty()) {
    return Errorf(MOE_ERR_STATE, "the context has no KV spill directory (moe_params.kv_spill_dir)");
  }
  std::lock_guard<std::mutex> lk(mu_);
  return s->kv_.Spill(kv_spill_dir_, s->n_past());
}

ContextStats Context::Stats() const {
  ContextStats st;
  st.streaming = cache_ != nullptr;
  if (vram_ != nullptr) st.vram = vram_->stats();
  if (cache_ != nullptr) {
    st.cache = cache_->stats();
  } else {
    std::lock_guard<std::mutex> lk(const_cast<std::mutex &>(mu_));
    st.cache.hits = resident_hits_;
    st.cache.layer_hits = resident_layer_hits_;
    st.cache.layer_misses.assign(resident_layer_hits_.size(), 0);
    st.cache.n_slots = plan_.n_routed_experts;
    st.cache.slot_bytes = table_->slot_bytes();
  }
  std::lock_guard<std::mutex> lk(const_cast<std::mutex &>(mu_));
  st.device = backend_->tier_stats();
  st.device.fills -= device_base_.fills;
  st.device.fill_bytes -= device_base_.fill_bytes;
  st.device.zero_copy -= device_base_.zero_copy;
  st.device.cpu_experts -= device_base_.cpu_experts;
  st.device.promotions -= device_base_.promotions;
  st.device.replans -= device_base_.replans;
  st.device.prefetched -= device_base_.prefetched;
  st.device.prefetch_used -= device_base_.prefetch_used;
  st.device.graph_captures -= device_base_.graph_captures;
  st.device.graph_replays -= device_base_.graph_replays;
  st.numa_node = numa_node_;
  return st;
}

absl::Status Context::ObserveActivations(model::ActivationObserver *o) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!backend_->ObserveActivations(o)) {
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND,
                  "this backend cannot show its activations to the host: open the model on the CPU backend");
  }
  return absl::OkStatus();
}

std::vector<uint64_t> Context::ExpertCounts() const {
  std::lock_guard<std::mutex> lk(const_cast<std::mutex &>(mu_));
  return expert_counts_;
}

void Context::ResetStats() {
  if (cache_ != nullptr) cache_->ResetStats();
  if (vram_ != nullptr) vram_->ResetStats();
  std::lock_guard<std::mutex> lk(mu_);
  std::fill(expert_counts_.begin(), expert_counts_.end(), 0);
  resident_hits_ = 0;
  std::fill(resident_layer_hits_.begin(), resident_layer_hits_.end(), 0);
  device_base_ = backend_->tier_stats();
}

absl::Status Session::Feed(const int32_t *tokens, size_t n) {
  if (n == 0) return absl::OkStatus();
  if (tokens == nullptr) return Errorf(MOE_ERR_INVALID_ARGUMENT, "tokens is NULL with n = %u", n);
  const int32_t n_vocab = ctx_->hparams().n_vocab;
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= n_vocab) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "token %u has id %d, outside the vocabulary [0, %d)", i, tokens[i],
                    n_vocab);
    }
  }
  std::lock_guard<std::mutex> lk(mu_);
  // With a context shift any input fits: the steps make room as it comes.
  if (!opts_.ctx_shift && static_cast<uint64_t>(n_past_) + pending_.size() + n > static_cast<uint64_t>(n_ctx_)) {
    return Errorf(MOE_ERR_LIMIT_CONTEXT, "%u more tokens do not fit: %d in the cache, %u queued, n_ctx %d", n,
                  n_past_, pending_.size(), n_ctx_);
  }
  pending_.insert(pending_.end(), tokens, tokens + n);
  return absl::OkStatus();
}

absl::StatusOr<const float *> Session::Logits() const {
  std::lock_guard<std::mutex> lk(mu_);
  return LogitsLocked();
}

absl::StatusOr<const float *> Session::LogitsLocked() const {
  if (n_logit_rows_ == 0) return Errorf(MOE_ERR_STATE, "no token has been processed yet");
  return logits_.data() + static_cast<size_t>(n_logit_rows_ - 1) * ctx_->hparams().n_vocab;
}

absl::Status Session::LogitsAll(const float **rows, int32_t *n_tokens) const {
  if (!opts_.logits_all) return Errorf(MOE_ERR_STATE, "the session was opened without logits_all");
  std::lock_guard<std::mutex> lk(mu_);
  if (n_logit_rows_ == 0) return Errorf(MOE_ERR_STATE, "no token has been processed yet");
  *rows = logits_.data();
  *n_tokens = n_logit_rows_;
  return absl::OkStatus();
}

absl::StatusOr<int32_t> Session::SampleNext() {
  std::lock_guard<std::mutex> lk(mu_);
  STRATA_ASSIGN_OR_RETURN(const float *l, LogitsLocked());
  return Sample(l, ctx_->hparams().n_vocab, opts_.sampler, rng_, history_);
}

bool Session::IsStopToken(int32_t id) const {
  const text::Tokenizer *tok = ctx_->tokenizer();
  if (opts_.stop_at_eos && tok != nullptr && tok->eos() >= 0 && id == tok->eos()) return true;
  return std::find(opts_.stop_tokens.begin(), opts_.stop_tokens.end(), id) != opts_.stop_tokens.end();
}

absl::Status Session::NextText(int32_t *token, std::string *text, StopReason *stop) {
  const text::Tokenizer *tok = ctx_->tokenizer();
  if (tok == nullptr) return Errorf(MOE_ERR_UNSUPPORTED, "the model carries no tokenizer");
  STRATA_ASSIGN_OR_RETURN(int32_t id, SampleNext());
  if (detok_ == nullptr) {
    detok_ = std::make_unique<text::StreamDetokenizer>(*tok);
    stop_filter_ = std::make_unique<StopStrings>(opts_.stop_strings);
  }
  *token = id;
  *stop = StopReason::kNone;
  bool hit = false;
  if (IsStopToken(id)) {
    *text = stop_filter_->Push(detok_->Finish(), &hit);
    if (!hit) *text += stop_filter_->Finish();
    *stop = hit ? StopReason::kString : StopReason::kToken;
  } else {
    *text = stop_filter_->Push(detok_->Push(id), &hit);
    if (hit) *stop = StopReason::kString;
  }
  if (*stop != StopReason::kNone) {
    detok_.reset();
    stop_filter_.reset();
  }
  return absl::OkStatus();
}

std::string Session::EndText() {
  std::string out;
  if (detok_ != nullptr) {
    bool hit = false;
    out = stop_filter_->Push(detok_->Finish(), &hit);
    if (!hit) out += stop_filter_->Finish();
  }
  detok_.reset();
  stop_filter_.reset();
  return out;
}

}  // namespace strata::runtime
