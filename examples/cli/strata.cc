// The `strata` command line: flags, run, chat, logits, tokenize and main (bench_cmds.cc and
// model_cmds.cc hold the other commands). Inference goes through the public C ABI,
// as a host would drive it; inspect and plan also read internals (tensor table, ledger) that the ABI
// does not expose. Every failure prints one line `strata: error: <what>` and exits with status 1;
// output files are written to a temporary name and renamed, so nothing is left half-written.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <fstream>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "examples/cli/cli.h"
#include "examples/cli/cli_util.h"
#include "examples/cli/options.h"
#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/model/backend.h"
#include "lib/model/pack.h"
#include "lib/model/synth.h"
#include "lib/quant/codec.h"
#include "lib/runtime/context.h"
#include "lib/util/memory_lock.h"
#include "lib/util/safe_text.h"
#include "lib/util/stats.h"
#include "lib/util/tunables.h"
#include "nlohmann/json.hpp"

namespace strata::cli {

float ParseFloat(const std::string &flag, const std::string &v) {
  char *end = nullptr;
  float f = std::strtof(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(f == f)) Die(flag + " needs a number, got '" + v + "'");
  return f;
}

// A --cache-type-k / -v value (llama.cpp's type names) as a moe_kv_type.
int KvTypeFlag(const std::string &flag, const std::string &v) {
  strata::model::KvType t;
  if (!strata::model::ParseKvType(v, &t)) {
    Die(flag + " must be f32, f16 or q8_0 (llama.cpp's KV cache types), got '" + v + "'");
  }
  return t == strata::model::KvType::kF16 ? MOE_KV_F16 : (t == strata::model::KvType::kQ8_0 ? MOE_KV_Q8_0 : MOE_KV_F32);
}

// A flag's on|off as a moe_switch.
int OnOff(const std::string &flag, const std::string &v) {
  if (v == "on") return MOE_SWITCH_ON;
  if (v == "off") return MOE_SWITCH_OFF;
  Die(flag + " must be on or off, got '" + v + "'");
}

// Help, the version, or the command named by argv[1]: each option checked against the table of
// options.cc (unknown: the nearest spelling suggested; known but not the command's: refused).
Args ParseArgs(int argc, char **argv) {
  Args a;
  if (argc < 2) Die("no command given (strata --help lists them)");
  a.command = argv[1];
  if (a.command == "--help" || a.command == "-h" || a.command == "help") {
    if (argc > 3) Die("help takes at most one command");
    if (argc == 3) {
      const CommandInfo *c = FindCommand(argv[2]);
      if (c == nullptr) Die("unknown command '" + std::string(argv[2]) + "' (strata --help lists them)");
      std::fputs(CommandHelp(*c).c_str(), stdout);
    } else {
      std::fputs(GlobalHelp().c_str(), stdout);
    }
    std::exit(0);
  }
  if (a.command == "--version" || a.command == "version") {
    if (argc > 2) Die(a.command + " takes no arguments");
    std::fputs(VersionText().c_str(), stdout);
    std::exit(0);
  }
  const CommandInfo *cmd = FindCommand(a.command);
  if (cmd == nullptr) {
    const std::string near = SuggestCommand(a.command);
    Die("unknown command '" + a.command + "' (" + (near.empty() ? "try strata --help" : "did you mean " + near + "?") +
        ")");
  }
  // --help anywhere it is not an option's value: the command's own help, whatever else is given.
  for (int i = 2; i < argc; ++i) {
    const OptionInfo *o = FindOption(argv[i]);
    if (o != nullptr && o == FindOption("--help")) {
      std::fputs(CommandHelp(*cmd).c_str(), stdout);
      std::exit(0);
    }
    if (o != nullptr && o->value != nullptr) ++i;
  }
  for (int i = 2; i < argc; ++i) {
    std::string f = argv[i];
    if (!f.empty() && f[0] == '-') {
      const OptionInfo *o = FindOption(f);
      if (o == nullptr) {
        const std::string near = SuggestOption(f, cmd);
        Die("unknown option '" + f + "'" + (near.empty() ? "" : " (did you mean " + near + "?)"));
      }
      if (!Takes(*cmd, *o)) {
        Die(a.command + " does not take " + f + " (strata " + a.command + " --help lists what it takes)");
      }
    } else if (cmd->max_positional == 0) {
      Die(a.command + " takes no argument '" + f + "' (strata " + a.command + " --help lists what it takes)");
    }
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Die(f + " needs a value");
      return argv[++i];
    };
    auto integer = [&](int64_t lo, int64_t hi) {
      std::string v = value();
      auto r = ParseInt(v, lo, hi);
      if (!r) Die(f + " needs an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
      return *r;
    };
    auto path = [&]() {  // an empty path would mean the demo model or the current directory
      std::string v = value();
      if (v.empty()) Die(f + " needs a non-empty path");
      return v;
    };
    auto size = [&]() {
      std::string v = value();
      auto r = ParseSize(v);
      if (!r) Die(f + " needs a size like 512M, 8G or a byte count, got '" + v + "'");
      return *r;
    };
    if (f == "--model" || f == "-m") a.model = path();
    else if (f == "--prompt" || f == "-p") a.prompt = value();
    else if (f == "--tokens") a.tokens = value();
    else if (f == "--decode-tokens") a.decode_tokens = value();
    else if (f == "--warmup") a.warmup = integer(0, 1 << 24);
    else if (f == "--text") a.text = value();
    else if (f == "--special") a.special = true;
    else if (f == "--out" || f == "-o") a.out = path();
    else if (f == "-n" || f == "--n-predict") a.n_predict = integer(0, 1 << 24), a.n_predict_given = true;
    else if (f == "--min-p") a.min_p = ParseFloat(f, value());
    else if (f == "--repeat-penalty") a.repeat_penalty = ParseFloat(f, value());
    else if (f == "--presence-penalty") a.presence_penalty = ParseFloat(f, value());
    else if (f == "--frequency-penalty") a.frequency_penalty = ParseFloat(f, value());
    else if (f == "--repeat-last-n") a.repeat_last_n = integer(0, 1 << 24);
    else if (f == "--stop") a.stop.push_back(value());
    else if (f == "--context-shift") a.context_shift = true;
    else if (f == "--keep") a.keep = integer(-1, INT32_MAX), a.keep_given = true;
    else if (f == "--system") a.system = value();
    else if (f == "--template") a.chat_template = value();
    else if (f == "-v" || f == "--verbose") a.verbose = true;
    else if (f == "--prefill") a.prefill = integer(0, 1 << 24);
    else if (f == "--sessions") a.sessions = integer(1, 4096);
    else if (f == "--max-batch-tokens") a.max_batch_tokens = integer(0, 1 << 24);
    else if (f == "--prefill-token-max") a.prefill_token_max = integer(0, 1 << 24);
    else if (f == "--prefill-layer-min") a.prefill_layer_min = integer(0, 1 << 24);
    else if (f == "--threads" || f == "-t") a.n_threads = integer(0, 4096);
    else if (f == "--n-ctx" || f == "-c" || f == "--ctx-size") a.n_ctx = integer(0, 1 << 24);
    else if (f == "--file" || f == "-f") a.text_file = path();
    else if (f == "--chunks") a.chunks = integer(0, 1 << 30);
    else if (f == "--kl-divergence-base") a.kl_base = path();
    else if (f == "--kl-divergence") a.kl_divergence = true;
    else if (f == "-b" || f == "--batch-size") a.max_batch_tokens = integer(0, 1 << 24);
    else if (f == "--max-sessions") a.max_sessions = integer(1, 1 << 20);
    else if (f == "--kv-budget") a.kv_budget = size();
    else if (f == "--kv-spill-dir") a.kv_spill_dir = path();
    else if (f == "--cache-type-k" || f == "-ctk") a.cache_type_k = KvTypeFlag(f, value());
    else if (f == "--cache-type-v" || f == "-ctv") a.cache_type_v = KvTypeFlag(f, value());
    else if (f == "--save-session") a.save_session = path();
    else if (f == "--load-session") a.load_session = path();
    else if (f == "--temp") a.temp = ParseFloat(f, value());
    else if (f == "--top-k") a.top_k = integer(0, 1 << 24);
    else if (f == "--top-p") a.top_p = ParseFloat(f, value());
    else if (f == "--seed") a.seed = static_cast<uint64_t>(integer(0, INT64_MAX));
    else if (f == "--experts") a.experts_type = value();
    else if (f == "--attention") a.attention_type = value();
    else if (f == "--boost") a.boost_type = value();
    else if (f == "--boost-layers") a.boost_layers = value();
    else if (f == "--hotlist") a.hotlist = path();
    else if (f == "--expert-contiguous") a.expert_contiguous = true;
    else if (f == "--imatrix") a.imatrix = path();
    else if (f == "--tensor-type") a.tensor_types.push_back(value());
    else if (f == "--target-size") a.target_size = size();
    else if (f == "--sensitivity") a.sensitivity = path();
    else if (f == "--shape") a.shape = value();
    else if (f == "--codec") a.codec = value();
    else if (f == "--layers") a.layers = integer(1, 1024);
    else if (f == "--ram-budget") a.ram_budget = size();
    else if (f == "--prefetch") a.prefetch = integer(0, 64);
    else if (f == "--io-threads") a.io_threads = integer(1, 64);
    else if (f == "--prompt-tokens") a.n_prompt = integer(1, 1 << 20);
    else if (f == "--hotlist-max") a.hotlist_max = integer(0, 1 << 30);
    else if (f == "--prompts") a.prompts = path();
    else if (f == "--stats") a.stats = true;
    else if (f == "--lock-memory") a.lock_memory = size();
    else if (f == "--q8-activations") a.q8_activations = true;
    else if (f == "--cpu-experts") {
      std::string v = value();
      if (v == "auto") a.cpu_experts = MOE_CPU_EXPERTS_AUTO;
      else if (v == "off") a.cpu_experts = MOE_CPU_EXPERTS_OFF;
      else if (v == "always") a.cpu_experts = MOE_CPU_EXPERTS_ALWAYS;
      else Die("--cpu-experts must be auto, off or always, got '" + v + "'");
    }
    else if (f == "--cuda-graphs") a.cuda_graphs = OnOff(f, value());
    else if (f == "--huge-pages") a.huge_pages = OnOff(f, value());
    else if (f == "--cuda-streaming") a.cuda_streaming = OnOff(f, value());
    else if (f == "--cold-copies") {
      const int64_t n = integer(0, strata::runtime::kMaxColdCopies);
      a.cold_copies = n == 0 ? -1 : static_cast<int>(n);
    }
    else if (f == "--sparse") a.sparse = true;
    else if (f == "--host") a.host = value();
    else if (f == "--port") a.port = integer(0, 65535);
    else if (f == "--parallel") a.parallel = integer(1, 1024);
    else if (f == "--queue") a.queue = integer(0, 1 << 16);
    else if (f == "--api-key") a.api_key = value();
    else if (f == "--max-body") a.max_body = size();
    else if (f == "--routing") a.routing = value();
    else if (f == "--json") a.json = true;
    else if (f == "--sweep") a.sweep = true;
    else if (f == "--policy") {
      std::string v = value();
      if (v == "lru") a.policy = MOE_CACHE_LRU;
      else if (v == "lfu") a.policy = MOE_CACHE_LFU;
      else if (v == "hot") a.policy = MOE_CACHE_HOTNESS;
      else Die("--policy must be lru, lfu or hot, got '" + v + "'");
    }
    else if (f == "--vram-budget") a.vram_budget = size();
    else if (f == "--backend") {
      std::string v = value();
      if (v == "cpu") a.backend = MOE_BACKEND_CPU;
      else if (v == "cuda") a.backend = MOE_BACKEND_CUDA;
      else if (v == "auto") a.backend = MOE_BACKEND_AUTO;
      else Die("--backend must be cpu, cuda or auto, got '" + v + "'");
    } else if (!f.empty() && f[0] == '-') {
      Die("unknown option '" + f + "'");
    } else {
      a.positional.push_back(f);
    }
  }
  if (a.temp < 0) Die("--temp must be >= 0");
  if (!(a.top_p > 0 && a.top_p <= 1)) Die("--top-p must be in (0, 1]");
  if (!(a.min_p >= 0 && a.min_p <= 1)) Die("--min-p must be in [0, 1]");
  if (!(a.repeat_penalty > 0) || a.repeat_penalty > 1e6f) Die("--repeat-penalty must be > 0");
  if (!(a.presence_penalty >= -1e6f && a.presence_penalty <= 1e6f)) Die("--presence-penalty must be finite");
  if (!(a.frequency_penalty >= -1e6f && a.frequency_penalty <= 1e6f)) Die("--frequency-penalty must be finite");
  for (const auto &s : a.stop)
    if (s.empty()) Die("--stop needs a non-empty string");
  return a;
}

std::string DemoModelPath() {
  if (const std::string &env = strata::tunables::Get().demo_model; !env.empty()) return env;
  // An installed binary finds the model its install put beside it (prefix/share/strata), wherever
  // the prefix is now; a binary of the build tree, the source tree's.
  char exe[4096];
  if (const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1); n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir.resize(dir.find_last_of('/') + 1);
    const std::string beside = dir + STRATA_DEMO_MODEL_FROM_BIN;
    if (access(beside.c_str(), R_OK) == 0) return beside;
  }
  if (access(STRATA_DEMO_MODEL_SOURCE, R_OK) == 0) return STRATA_DEMO_MODEL_SOURCE;
  return STRATA_DEMO_MODEL_INSTALLED;
}

// moe_params.load_progress on a terminal: one line redrawn on stderr while the weights load. A load
// that ends before the first report (under 0.1 s: small models) draws nothing.
bool g_load_drawn = false;
void DrawLoadProgress(uint64_t done, uint64_t total, void *) {
  if (done >= total && !g_load_drawn) return;
  g_load_drawn = true;
  const double gib = 1.0 / (1 << 30), f = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  std::fprintf(stderr, "\rstrata: loading weights %3d%%  %.1f/%.1f GiB", static_cast<int>(100 * f), done * gib,
               total * gib);
  if (done >= total) {
    std::fputc('\n', stderr);
    g_load_drawn = false;
  }
  std::fflush(stderr);
}

moe_params ContextParams(const Args &a, const std::string &model) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.backend = a.backend;
  p.ram_budget_bytes = a.ram_budget;
  p.vram_budget_bytes = a.vram_budget;
  p.n_threads = static_cast<int32_t>(a.n_threads);
  p.n_ctx = static_cast<uint32_t>(a.n_ctx);
  p.cache_policy = a.policy;
  p.prefetch_distance = static_cast<int32_t>(a.prefetch);
  p.n_io_threads = static_cast<int32_t>(a.io_threads);
  p.hotlist_path = a.hotlist.empty() || a.command == "pack" ? nullptr : a.hotlist.c_str();
  p.hotlist_max_experts = static_cast<uint32_t>(a.hotlist_max);
  p.cpu_q8_activations = a.q8_activations ? 1 : 0;
  p.gpu_q8_activations = a.q8_activations ? 1 : 0;
  p.cpu_experts = a.cpu_experts;
  p.cuda_graphs = a.cuda_graphs;
  p.cuda_cold_copies = a.cold_copies;
  p.huge_pages = a.huge_pages;
  p.cuda_streaming = a.cuda_streaming;
  // bench --sessions N runs N sessions: the KV budget is sized for at least that many.
  p.max_sessions = static_cast<uint32_t>(std::max(a.max_sessions, a.sessions));
  p.kv_budget_bytes = a.kv_budget;
  p.kv_spill_dir = a.kv_spill_dir.empty() ? nullptr : a.kv_spill_dir.c_str();
  p.type_k = a.cache_type_k;
  p.type_v = a.cache_type_v;
  p.max_batch_tokens = static_cast<uint32_t>(a.max_batch_tokens);
  p.prefill_token_max = static_cast<uint32_t>(a.prefill_token_max);
  p.prefill_layer_min = static_cast<uint32_t>(a.prefill_layer_min);
  if (isatty(STDERR_FILENO) != 0) p.load_progress = DrawLoadProgress;
  return p;
}

// The context's expert-tier counters as one line of JSON (DESIGN.md §3.2, --stats).
std::string StatsJson(moe_ctx *ctx) {
  moe_stats st;
  moe_stats_init(&st);
  if (moe_ctx_stats(ctx, &st) != MOE_OK) return "{}";
  char buf[2048];
  std::snprintf(buf, sizeof buf,
                "{\"streaming\":%u,\"expert_hits\":%llu,\"expert_misses\":%llu,\"bytes_read\":%llu,"
                "\"io_wait_s\":%.6f,\"prefetch_issued\":%llu,\"prefetch_useful\":%llu,\"evictions\":%llu,"
                "\"cache_slots\":%u,\"cache_slot_bytes\":%llu,\"memory_locked\":%u,\"load_errors\":%llu,"
                "\"prefetch_skipped\":%llu,\"prefetch_precision\":%.4f,\"vram_expert_slots\":%u,"
                "\"vram_device_layers\":%u,\"vram_fills\":%llu,\"vram_fill_bytes\":%llu,\"vram_zero_copy\":%llu,"
                "\"vram_promotions\":%llu,\"gpu_graph_captures\":%llu,\"gpu_graph_replays\":%llu,\"numa_node\":%d,"
                "\"vram_cpu_layers\":%u,\"vram_cpu_experts\":%llu,\"vram_replans\":%llu,\"vram_hits\":%llu,"
                "\"vram_demotions\":%llu,\"locked_bytes\":%llu}",
                st.streaming, static_cast<unsigned long long>(st.expert_hits),
                static_cast<unsigned long long>(st.expert_misses), static_cast<unsigned long long>(st.bytes_read),
                st.io_wait_s, static_cast<unsigned long long>(st.prefetch_issued),
                static_cast<unsigned long long>(st.prefetch_useful), static_cast<unsigned long long>(st.evictions),
                st.cache_slots, static_cast<unsigned long long>(st.cache_slot_bytes), st.memory_locked,
                static_cast<unsigned long long>(st.load_errors),
                static_cast<unsigned long long>(st.prefetch_skipped), st.prefetch_precision, st.vram_expert_slots,
                st.vram_device_layers, static_cast<unsigned long long>(st.vram_fills),
                static_cast<unsigned long long>(st.vram_fill_bytes), static_cast<unsigned long long>(st.vram_zero_copy),
                static_cast<unsigned long long>(st.vram_promotions),
                static_cast<unsigned long long>(st.gpu_graph_captures),
                static_cast<unsigned long long>(st.gpu_graph_replays), st.numa_node, st.vram_cpu_layers,
                static_cast<unsigned long long>(st.vram_cpu_experts),
                static_cast<unsigned long long>(st.vram_replans), static_cast<unsigned long long>(st.vram_hits),
                static_cast<unsigned long long>(st.vram_demotions), static_cast<unsigned long long>(st.locked_bytes));
  return buf;
}

void PrintStatsIf(const Args &a, moe_ctx *ctx) {
  if (a.stats) std::fprintf(stderr, "%s\n", StatsJson(ctx).c_str());
}


// After open: a RAM budget raised to the minimum, and a RAM expert tier not wholly locked in RAM
// (the context's plan words the reason; the C ABI carries the bytes).
void WarnIfClamped(moe_ctx *ctx, const Args &a) {
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  const bool planned = moe_ctx_plan(ctx, &plan) == MOE_OK;
  if (planned && plan.clamped) {
    std::fprintf(stderr, "strata: warning: RAM budget raised to the minimum that can run, %llu bytes\n",
                 static_cast<unsigned long long>(plan.ram_budget_bytes));
  }
  if (planned && a.n_ctx > 0 && static_cast<uint64_t>(a.n_ctx) != plan.n_ctx) {
    std::fprintf(stderr, "strata: warning: --n-ctx %lld is beyond the model's context length; using %u\n",
                 static_cast<long long>(a.n_ctx), plan.n_ctx);
  }
  moe_stats st;
  moe_stats_init(&st);
  const uint64_t slab = moe_ctx_stats(ctx, &st) == MOE_OK ? uint64_t{st.cache_slots} * st.cache_slot_bytes : 0;
  if (st.streaming != 0 && st.memory_locked == 0 && slab > 0) {
    std::fprintf(stderr,
                 "strata: warning: RAM expert tier: locked %s of %s; the rest may be paged out (see ulimit -l)\n",
                 strata::FormatBytes(st.locked_bytes).c_str(), strata::FormatBytes(slab).c_str());
  }
}

bool HasTokenizer(moe_ctx *ctx) {
  size_t n = 0;
  return moe_tokenize(ctx, "", 0, 0, nullptr, 0, &n) == MOE_OK;
}

std::vector<int32_t> Tokenize(moe_ctx *ctx, const std::string &text, bool special, bool add_bos) {
  const uint32_t flags = (special ? MOE_TOKENIZE_PARSE_SPECIAL : 0u) | (add_bos ? MOE_TOKENIZE_ADD_BOS : 0u);
  size_t n = 0;
  moe_status st = moe_tokenize(ctx, text.data(), text.size(), flags, nullptr, 0, &n);
  if (st != MOE_OK && st != MOE_ERR_LIMIT) Die(ApiError(st));
  std::vector<int32_t> ids(n);
  if (n > 0 && (st = moe_tokenize(ctx, text.data(), text.size(), flags, ids.data(), n, &n)) != MOE_OK) {
    Die(ApiError(st));
  }
  return ids;
}

// The session parameters of run and chat: sampling, penalties, stop strings (stop_ptrs points into a).
moe_session_params SessionParams(const Args &a, std::vector<const char *> *stop_ptrs) {
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.temperature = a.temp;
  sp.top_k = static_cast<int32_t>(a.top_k);
  sp.top_p = a.top_p;
  sp.seed = a.seed;
  sp.min_p = a.min_p;
  sp.repeat_penalty = a.repeat_penalty;
  sp.presence_penalty = a.presence_penalty;
  sp.frequency_penalty = a.frequency_penalty;
  sp.penalty_last_n = static_cast<int32_t>(a.repeat_last_n);
  stop_ptrs->clear();
  for (const auto &s : a.stop) stop_ptrs->push_back(s.c_str());
  sp.stop_strings = stop_ptrs->data();
  sp.n_stop_strings = stop_ptrs->size();
  sp.ctx_shift = a.context_shift ? 1 : 0;
  return sp;
}

int32_t KeepFor(const Args &a, moe_ctx *ctx, const std::vector<int32_t> &first) {
  const int64_t n = static_cast<int64_t>(first.size());
  if (a.keep < 0 || a.keep > n) return static_cast<int32_t>(n);
  const int32_t bos = moe_ctx_token_bos(ctx);
  const bool has_bos = !first.empty() && bos >= 0 && first[0] == bos;
  return static_cast<int32_t>(std::min<int64_t>(n, a.keep + (has_bos ? 1 : 0)));
}

int CmdRun(const Args &a) {
  const std::string model = a.model.empty() ? DemoModelPath() : a.model;
  std::vector<int32_t> prompt;
  if (!a.prompt.empty() && !a.tokens.empty()) Die("give either --prompt or --tokens, not both");
  if (!a.tokens.empty()) {
    auto t = ParseTokenList(a.tokens);
    if (!t) Die("--tokens needs comma-separated non-negative integers, got '" + a.tokens + "'");
    prompt = *t;
  }
  moe_params p = ContextParams(a, model);
  Ctx ctx;
  auto t_open = std::chrono::steady_clock::now();
  if (moe_status st = moe_ctx_open(&p, &ctx.c); st != MOE_OK) DieOpening(model, st);
  WarnIfClamped(ctx.c, a);
  // With a tokenizer the prompt is text and the output streams as text; without one, token ids.
  const bool has_text = HasTokenizer(ctx.c);
  const bool loaded = !a.load_session.empty();
  if (loaded && prompt.empty() && !a.prompt.empty()) {
    if (!has_text) Die("'" + model + "' carries no tokenizer; give the prompt as token ids with --tokens 1,2,3");
    prompt = Tokenize(ctx.c, a.prompt, false, false);  // it continues a conversation: no BOS
  }
  if (prompt.empty() && !loaded) {
    if (!has_text && !a.prompt.empty()) {
      Die("'" + model + "' carries no tokenizer; give the prompt as token ids with --tokens 1,2,3");
    }
    if (has_text) {
      prompt = Tokenize(ctx.c, a.prompt.empty() ? std::string("The") : a.prompt, false, true);
    } else {
      prompt = {1, 2, 3, 4};
    }
    if (prompt.empty()) Die("the prompt has no tokens");
  }
  std::vector<const char *> stop_ptrs;
  moe_session_params sp = SessionParams(a, &stop_ptrs);
  if (a.keep_given && !a.context_shift) Die("--keep sets what a context shift keeps: give it with --context-shift");
  if (loaded && a.context_shift) {
    Die("--context-shift applies to a new session; a loaded session shifts as it was saved (moe_session_params)");
  }
  sp.n_keep = a.context_shift ? KeepFor(a, ctx.c, prompt) : 0;
  Sess s;
  if (loaded) {
    // The saved session's own params (sampling, seed state, stop strings, context shift) carry on.
    if (moe_status st = moe_session_load(ctx.c, a.load_session.c_str(), nullptr, &s.s); st != MOE_OK) {
      Die("cannot load the session '" + a.load_session + "': " + ApiError(st));
    }
  } else if (moe_status st = moe_session_open(ctx.c, &sp, &s.s); st != MOE_OK) {
    Die("cannot open a session: " + ApiError(st));
  }
  auto t_prefill = std::chrono::steady_clock::now();
  if (moe_status st = moe_session_feed(s.s, prompt.data(), prompt.size()); st != MOE_OK) Die(ApiError(st));
  if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
  auto t_decode = std::chrono::steady_clock::now();
  if (loaded) {
    if (!has_text) std::printf("generated:");
  } else if (has_text) {
    std::fputs(a.prompt.empty() ? "The" : a.prompt.c_str(), stdout);
  } else {
    std::printf("prompt:");
    for (int32_t t : prompt) std::printf(" %d", t);
    std::printf("\ngenerated:");
  }
  std::fflush(stdout);
  int64_t n_gen = 0;
  bool stopped = false, cut = false;
  for (int64_t i = 0; i < a.n_predict; ++i) {
    int32_t tok;
    if (has_text) {
      // Text mode: the session turns tokens into text and applies EOS and the --stop strings.
      const char *text = nullptr;
      size_t n = 0;
      int32_t stop = MOE_STOP_NONE;
      if (moe_status st = moe_session_sample_text(s.s, &tok, &text, &n, &stop); st != MOE_OK) Die(ApiError(st));
      ++n_gen;
      std::fwrite(text, 1, n, stdout);
      std::fflush(stdout);
      if ((stopped = stop != MOE_STOP_NONE)) break;
    } else {
      if (moe_status st = moe_session_sample(s.s, &tok); st != MOE_OK) Die(ApiError(st));
      ++n_gen;
      std::printf(" %d", tok);
    }
    std::fflush(stdout);
    // With --save-session the last token is queued too, so a loaded session continues from it.
    if (i + 1 == a.n_predict && a.save_session.empty()) break;
    moe_status st = moe_session_feed(s.s, &tok, 1);
    if (st == MOE_ERR_LIMIT_CONTEXT) {
      cut = i + 1 < a.n_predict;  // the last token not queued for a saved session is no loss of text
      break;
    }
    if (st == MOE_OK && i + 1 == a.n_predict) break;
    if (st != MOE_OK) Die(ApiError(st));
    if ((st = StepAll(ctx.c)) != MOE_OK) Die(ApiError(st));
  }
  auto t_end = std::chrono::steady_clock::now();
  if (has_text && !stopped) {
    const char *text = nullptr;
    size_t n = 0;
    if (moe_status st = moe_session_text_end(s.s, &text, &n); st != MOE_OK) Die(ApiError(st));
    std::fwrite(text, 1, n, stdout);
  }
  std::printf("\n");
  std::fflush(stdout);  // the text before the summary on stderr, where both go to one pipe
  if (cut) {
    std::fprintf(stderr, "strata: warning: generation stopped at the context length (%d positions) after %lld of "
                 "%lld tokens; a larger --n-ctx or --context-shift lets it go on\n", moe_session_n_past(s.s),
                 static_cast<long long>(n_gen), static_cast<long long>(a.n_predict));
  }
  if (!a.save_session.empty()) {
    if (moe_status st = moe_session_save(s.s, a.save_session.c_str()); st != MOE_OK) {
      Die("cannot save the session to '" + a.save_session + "': " + ApiError(st));
    }
  }
  auto secs = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::fprintf(stderr, "strata: %s: load %.2f s, prefill %zu tokens %.1f tok/s, decode %lld tokens %.1f tok/s\n",
               model.c_str(), secs(t_open, t_prefill), prompt.size(), prompt.size() / secs(t_prefill, t_decode),
               static_cast<long long>(n_gen), n_gen > 1 ? (n_gen - 1) / secs(t_decode, t_end) : 0.0);
  PrintStatsIf(a, ctx.c);
  return 0;
}

// Chat. The conversation lives in the session's KV cache: each turn feeds only its own tokens, those
// of the text the template writes between the previous reply and the new one. They are cut from the
// tokens of a stand-in conversation whose last reply is a marker: tokenized with two markers that
// differ in their last byte, the two lists share exactly the tokens after the reply (a reply is
// closed by a control token, where tokenization restarts), so the template decides what closes a
// reply and opens the next turn (and, for Mistral v3, that the system text joins it). Tokens come
// from moe_chat_tokenize: what the user types never becomes a control token.
std::vector<int32_t> ChatTokens(moe_ctx *ctx, const std::string &tmpl, const std::vector<moe_chat_message> &msgs) {
  size_t n = 0;
  moe_status st = moe_chat_tokenize(ctx, tmpl.c_str(), msgs.data(), msgs.size(), 1, nullptr, 0, &n);
  if (st != MOE_OK && st != MOE_ERR_LIMIT) Die("chat template '" + tmpl + "': " + ApiError(st));
  std::vector<int32_t> ids(n);
  if (n > 0 && (st = moe_chat_tokenize(ctx, tmpl.c_str(), msgs.data(), msgs.size(), 1, ids.data(), n, &n)) != MOE_OK) {
    Die("chat template '" + tmpl + "': " + ApiError(st));
  }
  return ids;
}

// The tokens of `msgs` (its last message a user's) after the reply at msgs[reply], whose content
// this replaces with the markers.
std::vector<int32_t> ChatTokensAfterReply(moe_ctx *ctx, const std::string &tmpl, std::vector<moe_chat_message> msgs,
                                          size_t reply) {
  static const char *const kMarkers[2] = {"strata reply a", "strata reply b"};
  std::vector<int32_t> ids[2];
  for (int k = 0; k < 2; ++k) {
    msgs[reply].content = kMarkers[k];
    ids[k] = ChatTokens(ctx, tmpl, msgs);
  }
  size_t common = 0;
  while (common < ids[0].size() && common < ids[1].size() &&
         ids[0][ids[0].size() - 1 - common] == ids[1][ids[1].size() - 1 - common]) {
    ++common;
  }
  if (common == ids[0].size() || common == ids[1].size()) {
    Die("chat template '" + tmpl + "' does not write the assistant's reply");
  }
  return std::vector<int32_t>(ids[0].end() - static_cast<std::ptrdiff_t>(common), ids[0].end());
}

// The text that ends an assistant turn when it is not the model's EOS; it becomes a stop token.
const char *EndOfTurn(const std::string &tmpl) {
  if (tmpl == "chatml" || tmpl.rfind("qwen", 0) == 0) return "<|im_end|>";
  if (tmpl == "llama3") return "<|eot_id|>";
  if (tmpl == "deepseek-v3") return "<｜end▁of▁sentence｜>";
  if (tmpl == "gpt-oss") return "<|return|>";
  return nullptr;  // Mistral, DeepSeek-V2: EOS
}

int CmdChat(const Args &a) {
  const std::string model = a.model.empty() ? DemoModelPath() : a.model;
  moe_params p = ContextParams(a, model);
  Ctx ctx;
  if (moe_status st = moe_ctx_open(&p, &ctx.c); st != MOE_OK) DieOpening(model, st);
  WarnIfClamped(ctx.c, a);
  if (!HasTokenizer(ctx.c)) Die("'" + model + "' carries no tokenizer; chat needs one");
  std::string tmpl = a.chat_template;
  if (tmpl.empty()) {
    const char *name = nullptr;
    if (moe_status st = moe_ctx_chat_template_name(ctx.c, &name); st != MOE_OK) {
      Die(ApiError(st) + "; choose one with --template NAME");
    }
    tmpl = name;
  }
  std::vector<moe_chat_message> probe;
  if (!a.system.empty()) probe.push_back({"system", a.system.c_str()});
  probe.push_back({"user", "hello"});
  ChatTokens(ctx.c, tmpl, probe);  // an unknown --template fails here, before any input is read

  std::vector<const char *> stop_ptrs;
  moe_session_params sp = SessionParams(a, &stop_ptrs);
  std::vector<int32_t> stop_tokens;
  if (const char *eot = EndOfTurn(tmpl)) {
    std::vector<int32_t> ids = Tokenize(ctx.c, eot, true, false);
    if (ids.size() == 1) stop_tokens = ids;
  }
  sp.stop_tokens = stop_tokens.data();
  sp.n_stop_tokens = stop_tokens.size();
  if (a.keep_given && !a.context_shift) Die("--keep sets what a context shift keeps: give it with --context-shift");
  // The session opens with the first turn, whose tokens --keep counts (the prompt of llama.cpp's).
  Sess s;
  auto open_session = [&](const std::vector<int32_t> &first) {
    sp.n_keep = a.context_shift ? KeepFor(a, ctx.c, first) : 0;
    if (moe_status st = moe_session_open(ctx.c, &sp, &s.s); st != MOE_OK) Die("cannot open a session: " + ApiError(st));
  };

  const int64_t max_reply = a.n_predict_given ? a.n_predict : 512;
  const bool tty = isatty(STDIN_FILENO) != 0;
  std::string line;
  for (int turn = 1;; ++turn) {
    if (tty) std::fputs("> ", stderr), std::fflush(stderr);
    if (!std::getline(std::cin, line)) break;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {
      --turn;
      continue;
    }
    std::vector<moe_chat_message> msgs;
    if (!a.system.empty()) msgs.push_back({"system", a.system.c_str()});
    std::vector<int32_t> ids;
    if (turn == 1) {
      msgs.push_back({"user", line.c_str()});
      ids = ChatTokens(ctx.c, tmpl, msgs);
      open_session(ids);
    } else {
      msgs.push_back({"user", "hello"});
      msgs.push_back({"assistant", ""});
      msgs.push_back({"user", line.c_str()});
      ids = ChatTokensAfterReply(ctx.c, tmpl, msgs, msgs.size() - 2);
    }
    auto feed = [&](const int32_t *t, size_t n) {
      moe_status st = moe_session_feed(s.s, t, n);
      if (st == MOE_ERR_LIMIT_CONTEXT) {
        Die("the conversation no longer fits in the context of " + std::to_string(moe_session_n_past(s.s)) +
            "+ tokens; start again with a larger --n-ctx, or --context-shift");
      }
      if (st != MOE_OK || (st = StepAll(ctx.c)) != MOE_OK) Die(ApiError(st));
    };
    feed(ids.data(), ids.size());
    int64_t n_gen = 0;
    bool stopped = false;
    while (n_gen < max_reply) {
      int32_t tok;
      const char *out = nullptr;
      size_t n = 0;
      int32_t stop = MOE_STOP_NONE;
      if (moe_status st = moe_session_sample_text(s.s, &tok, &out, &n, &stop); st != MOE_OK) Die(ApiError(st));
      std::fwrite(out, 1, n, stdout);
      std::fflush(stdout);
      if ((stopped = stop != MOE_STOP_NONE)) break;
      ++n_gen;
      feed(&tok, 1);
    }
    if (!stopped) {
      const char *out = nullptr;
      size_t n = 0;
      if (moe_status st = moe_session_text_end(s.s, &out, &n); st != MOE_OK) Die(ApiError(st));
      std::fwrite(out, 1, n, stdout);
    }
    std::fputs("\n", stdout);
    std::fflush(stdout);
    if (a.verbose) {
      std::fprintf(stderr, "strata: chat: turn %d: fed %zu tokens, generated %lld, %s, context %d tokens\n", turn,
                   ids.size(), static_cast<long long>(n_gen), stopped ? "stopped" : "length limit",
                   moe_session_n_past(s.s));
    }
  }
  return 0;
}

void WriteFileAtomically(const std::string &path, const void *data, size_t n) {
  // The temporary file is created, never opened: O_EXCL | O_NOFOLLOW refuse whatever is already
  // at its name (a FIFO that would block the open, a symlink or a link to someone else's file).
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  strata::format::OpenOptions o;
  o.flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW;
  o.mode = 0644;
  absl::StatusOr<strata::format::UniqueFd> fd = strata::format::OpenRegularFile(tmp, o);
  if (!fd.ok()) Die("cannot write '" + path + "': " + std::string(fd.status().message()));
  absl::Status st = strata::format::WriteAll(fd->get(), data, n, tmp);
  if (st.ok()) st = strata::format::SyncFile(fd->get(), tmp);
  if (::close(fd->Release()) != 0 && st.ok()) st = absl::InternalError(std::string("close: ") + std::strerror(errno));
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    st = absl::InternalError(std::string("rename: ") + std::strerror(errno));
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    Die("cannot write '" + path + "': " + std::string(st.message()));
  }
}

int CmdLogits(const Args &a) {
  if (a.model.empty()) Die("logits needs --model PATH");
  if (a.out.empty()) Die("logits needs --out FILE");
  if (a.tokens.empty()) Die("logits needs --tokens 1,2,3");
  auto toks = ParseTokenList(a.tokens);
  if (!toks) Die("--tokens needs comma-separated non-negative integers, got '" + a.tokens + "'");
  const int64_t n = static_cast<int64_t>(toks->size());
  const int64_t prefill = a.prefill < 0 ? n : a.prefill;
  if (prefill > n) Die("--prefill " + std::to_string(prefill) + " is more than the " + std::to_string(n) + " tokens");
  moe_params p = ContextParams(a, a.model);
  Ctx ctx;
  if (moe_status st = moe_ctx_open(&p, &ctx.c); st != MOE_OK) DieOpening(a.model, st);
  WarnIfClamped(ctx.c, a);
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.logits_all = 1;
  Sess s;
  if (moe_status st = moe_session_open(ctx.c, &sp, &s.s); st != MOE_OK) Die("cannot open a session: " + ApiError(st));
  const int32_t n_vocab = moe_ctx_vocab_size(ctx.c);
  std::vector<float> all;
  all.reserve(static_cast<size_t>(n) * n_vocab);
  auto run = [&](const int32_t *t, int64_t k) {
    if (moe_status st = moe_session_feed(s.s, t, static_cast<size_t>(k)); st != MOE_OK) Die(ApiError(st));
    if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
    const float *rows;
    int32_t nt, nv;
    if (moe_status st = moe_session_logits_all(s.s, &rows, &nt, &nv); st != MOE_OK) Die(ApiError(st));
    all.insert(all.end(), rows, rows + static_cast<size_t>(nt) * nv);
  };
  if (prefill > 0) run(toks->data(), prefill);
  for (int64_t i = prefill; i < n; ++i) run(toks->data() + i, 1);
  WriteFileAtomically(a.out, all.data(), all.size() * sizeof(float));
  PrintStatsIf(a, ctx.c);
  return 0;
}

int CmdTokenize(const Args &a) {
  if (a.model.empty()) Die("tokenize needs --model PATH");
  moe_params p = ContextParams(a, a.model);
  Ctx ctx;
  if (moe_status st = moe_ctx_open(&p, &ctx.c); st != MOE_OK) DieOpening(a.model, st);
  if (!HasTokenizer(ctx.c)) Die("'" + a.model + "' carries no tokenizer");
  std::vector<int32_t> ids = Tokenize(ctx.c, a.text, a.special, false);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace strata::cli

using namespace strata::cli;

// Pins `bytes` of anonymous memory for the life of the process (and so out of the page cache's
// reach), so a run behaves as on a machine with that much less RAM.
void LockMemory(uint64_t bytes) {
  if (bytes == 0) return;
  void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Die("--lock-memory: cannot map " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
  if (mlock(p, bytes) != 0) {
    Die("--lock-memory: cannot lock " + std::to_string(bytes) + " bytes: " + std::strerror(errno) +
        " (raise RLIMIT_MEMLOCK, e.g. ulimit -l unlimited)");
  }
  std::fprintf(stderr, "strata: locked %llu bytes of RAM\n", static_cast<unsigned long long>(bytes));
}

// strata --list-tunables: one knob a line, in columns: name, type, default, value, doc.
int ListTunables() {
  namespace tn = strata::tunables;
  const tn::Values defaults;
  const tn::Values &now = tn::Get();
  size_t w[4] = {4, 4, 7, 5};
  for (const tn::Row &r : tn::Table()) {
    w[0] = std::max(w[0], std::strlen(r.name));
    w[1] = std::max(w[1], std::strlen(tn::TypeName(r.type)));
    w[2] = std::max(w[2], r.format(defaults).size());
    w[3] = std::max(w[3], r.format(now).size());
  }
  const auto line = [&](const char *name, const char *type, const std::string &def, const std::string &val,
                        const char *doc) {
    std::printf("%-*s  %-*s  %-*s  %-*s  %s\n", static_cast<int>(w[0]), name, static_cast<int>(w[1]), type,
                static_cast<int>(w[2]), def.c_str(), static_cast<int>(w[3]), val.c_str(), doc);
  };
  line("NAME", "TYPE", "DEFAULT", "VALUE", "DOC");
  for (const tn::Row &r : tn::Table()) line(r.name, tn::TypeName(r.type), r.format(defaults), r.format(now), r.doc);
  return 0;
}

int main(int argc, char **argv) {
  try {
    if (argc >= 2 && std::strcmp(argv[1], "--list-tunables") == 0) {
      if (argc > 2) Die("--list-tunables takes no arguments");
      return ListTunables();
    }
    Args a = ParseArgs(argc, argv);
    a.argv.assign(argv, argv + argc);
    LockMemory(a.lock_memory);
    if (a.command == "run") return CmdRun(a);
    if (a.command == "chat") return CmdChat(a);
    if (a.command == "logits") return CmdLogits(a);
    if (a.command == "inspect") return CmdInspect(a);
    if (a.command == "tokenize") return CmdTokenize(a);
    if (a.command == "bench") return CmdBench(a);
    if (a.command == "profile") return CmdProfile(a);
    if (a.command == "plan") return CmdPlan(a);
    if (a.command == "pack") return CmdPack(a);
    if (a.command == "synth") return CmdSynth(a);
    if (a.command == "serve") return CmdServe(a);
    if (a.command == "perplexity") return CmdPerplexity(a);
    if (a.command == "imatrix") return CmdImatrix(a);
    if (a.command == "sensitivity") return CmdSensitivity(a);
    Die("unknown command '" + a.command + "' (try strata --help)");
  } catch (const CliError &e) {
    // One line, whatever the message quotes (a flag's value, a file's bytes): escaped.
    std::fprintf(stderr, "strata: error: %s\n", strata::SafeText(e.msg, 1 << 16).c_str());
    return 1;
  } catch (const std::exception &e) {
    std::fprintf(stderr, "strata: error: %s\n", strata::SafeText(e.what(), 1 << 16).c_str());
    return 1;
  }
}
