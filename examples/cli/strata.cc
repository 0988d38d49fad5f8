// The `strata` command line: run, logits, inspect, plan, pack. Inference goes through the public C ABI,
// as a host would drive it; inspect and plan also read internals (tensor table, ledger) that the ABI
// does not expose. Every failure prints one line `strata: error: <what>` and exits with status 1;
// output files are written to a temporary name and renamed, so nothing is left half-written.
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

#include "examples/cli/cli_util.h"
#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/model/pack.h"
#include "lib/model/synth.h"
#include "lib/quant/codec.h"
#include "lib/runtime/context.h"
#include "lib/util/memory_lock.h"
#include "lib/util/safe_text.h"
#include "lib/util/stats.h"
#include "lib/util/tunables.h"
#include "nlohmann/json.hpp"

namespace {

using strata::cli::ParseInt;
using strata::cli::ParseSize;
using strata::cli::ParseTokenList;

struct CliError {
  std::string msg;
};

[[noreturn]] void Die(const std::string &msg) { throw CliError{msg}; }

std::string ApiError(moe_status st) {
  return std::string(moe_last_error()) + " (" + moe_status_string(st) + ")";
}

// A context that did not open: the library's message, led by the model's path unless it leads with it.
[[noreturn]] void DieOpening(const std::string &model, moe_status st) {
  const std::string lead = "cannot open '" + model + "'";
  const std::string why = ApiError(st);
  Die(why.rfind(lead, 0) == 0 ? why : lead + ": " + why);
}

// Steps until no session has input left (a long input may take several steps).
moe_status StepAll(moe_ctx *ctx) {
  uint32_t pending = 1;
  moe_status st = MOE_OK;
  while (pending > 0 && (st = moe_ctx_step(ctx, &pending)) == MOE_OK) {
  }
  return st;
}

// Flags common to the commands; each command says which it accepts.
struct Args {
  std::string command;
  std::string model;
  std::string prompt;
  std::string tokens;
  std::string out;
  std::string text;
  bool special = false;
  std::vector<std::string> positional;
  int64_t n_predict = 32;
  int64_t prefill = -1;
  int64_t n_threads = 0;
  int64_t n_ctx = 0;
  float temp = 0.8f;
  int64_t top_k = 40;
  float top_p = 0.95f;
  uint64_t seed = 42;
  float min_p = 0.f, repeat_penalty = 1.f, presence_penalty = 0.f;
  int64_t repeat_last_n = 64;
  std::vector<std::string> stop;
  bool n_predict_given = false, verbose = false;
  // chat
  std::string system, chat_template;
  int backend = MOE_BACKEND_AUTO;
  uint64_t ram_budget = 0, vram_budget = 0;
  // expert cache, stats, bench, profile
  int policy = MOE_CACHE_HOTNESS;
  int64_t prefetch = 1, io_threads = 2, n_prompt = 64, hotlist_max = 0;
  bool stats = false, json = false, sweep = false;
  std::vector<std::string> argv;  // as given, for sweeps that re-run the command
  uint64_t lock_memory = 0;
  bool q8_activations = false;
  int cpu_experts = MOE_CPU_EXPERTS_AUTO;
  // moe_params' switches (MOE_SWITCH_*) and cold copies (0 = the tunable, -1 = off)
  int cuda_graphs = MOE_SWITCH_DEFAULT, huge_pages = MOE_SWITCH_DEFAULT, cuda_streaming = MOE_SWITCH_DEFAULT;
  int cold_copies = 0;
  bool sparse = false;
  // sessions and KV
  int64_t max_sessions = 1;
  uint64_t kv_budget = 0;
  std::string kv_spill_dir, save_session, load_session;
  std::string prompts;
  // pack
  std::string experts_type = "q4_k", attention_type = "q8_0", boost_type = "q6_k";
  std::string routing = "concentrated";
  std::string boost_layers, hotlist;
  // synth
  std::string shape, codec;  // synth: empty = the shape's expert codec
  std::string decode_tokens;  // bench: teacher-forced decode input instead of sampled tokens
  int64_t warmup = 0;         // bench: decode steps of a round before the timed one (a warm context)
  int64_t layers = 0;
  // batching (bench --sessions, and any command opening a context)
  int64_t sessions = 1, max_batch_tokens = 0, prefill_token_max = 0, prefill_layer_min = 0;
};

const char kUsage[] =
    "usage: strata <command> [options]\n"
    "\n"
    "commands:\n"
    "  run      [--model PATH] [--prompt TEXT | --tokens 1,2,3] [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S]\n"
    "           [--min-p P] [--repeat-penalty R] [--presence-penalty P] [--repeat-last-n N] [--stop STR]...\n"
    "           generate from a prompt (the bundled demo model when --model is not given); text stops at\n"
    "           EOS or at any --stop string; --save-session FILE saves the session at the end (the last\n"
    "           token queued), --load-session FILE continues a saved one (then --prompt/--tokens are\n"
    "           fed after its history, and may be left out)\n"
    "  chat     [--model PATH] [--system TEXT] [--template NAME] [-n N] [-v] [sampling options of run]\n"
    "           interactive chat on stdin/stdout, one line per user turn, until end of input; the\n"
    "           model's chat template unless --template chatml|qwen2|qwen2.5|qwen3|mistral-v1|\n"
    "           mistral-v3|llama3|deepseek-v2|deepseek-v3|gpt-oss; -n caps each reply (default 512);\n"
    "           -v reports each turn's tokens on stderr\n"
    "  logits   --model PATH --tokens 1,2,3 [--prefill N] --out FILE\n"
    "           teacher-forced logits of every position, float32 [n_tokens][n_vocab]; the first N\n"
    "           tokens go in as one batch, the rest one at a time\n"
    "  tokenize --model PATH [--special] --text TEXT   the token ids of TEXT, separated by spaces\n"
    "  inspect  PATH         architecture, hyper-parameters, tensors, per-expert bytes by codec\n"
    "  plan     --model PATH the cache plan ledger: what goes where, and why\n"
    "  bench    [--model PATH] [--prompt TEXT | --prompt-tokens N] [-n N] [--json] [--sweep]   prefill and decode tokens/s, expert\n"
    "           hits and misses, bytes read per token, time waiting on I/O\n"
    "           [--tokens 1,2,3] [--decode-tokens 4,5,6]: given prompt ids; decode fed these ids one\n"
    "           per step instead of sampled tokens\n"
    "           --warmup N: first a round of other prompts and N decode steps (a warm context, as in a\n"
    "           later conversation), then the timed round in fresh sessions\n"
    "           --sessions N: N sessions decode together (continuous batching): aggregate tok/s;\n"
    "           --max-batch-tokens N, --prefill-token-max N, --prefill-layer-min N set the scheduler\n"
    "           --sweep: every policy x prefetch distance x I/O threads, fastest first\n"
    "  profile  --model PATH --prompts FILE --out HOTLIST [-n N]   count (layer, expert) selections over\n"
    "           a prompt set (one prompt a line: text, or token ids 1,2,3) into a hotlist\n"
    "  pack     IN OUT [--experts q4_k] [--attention q8_0] [--boost-layers 0,1] [--boost q6_k]\n"
    "           [--hotlist FILE]   rewrite IN as a mixed-precision GGUF: routed experts in --experts\n"
    "           (--boost for the listed layers), attention/embeddings/output in --attention, norms and\n"
    "           routers F32; each expert's gate|up|down contiguous and 4 KiB-aligned; with --hotlist\n"
    "           (lines 'layer expert count', hottest first) the hottest experts come first; tensors\n"
    "           already in the type asked for keep their bytes\n"
    "  synth    --shape NAME --out FILE [--codec q4_k] [--attention q8_0] [--layers N] [--seed S] [--sparse]\n"
    "           [--routing concentrated|spread|skewed]   shapes: qwen3-30b-a3b, qwen3-235b-a22b, deepseek-v3,\n"
    "           gpt-oss-120b, olmoe-1b-7b, mixtral-8x7b, tiny\n"
    "           a GGUF with the shape's real tensors, metadata and a byte-level BPE tokenizer, and random\n"
    "           weights (experts in --codec, default q4_k, mxfp4 for gpt-oss-120b: a codec Strata quantizes,\n"
    "           mxfp4, or a lattice i-quant iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m, drawn as\n"
    "           random codes; every other matrix in --attention); --layers N: the shape's first N layers\n"
    "           at full width (deepseek-v3: the first min(3, N-1) dense); --sparse: header only, data a\n"
    "           hole (for plan/inspect at real size); spread routing: tokens pick\n"
    "           varied experts, as trained models do;\n"
    "           skewed: varied, with some experts favoured, about as a published count of Qwen3-30B-A3B's is\n"
    "\n"
    "common options: --backend cpu|cuda|auto  --ram-budget SIZE  --vram-budget SIZE  --threads N\n"
    "                --n-ctx N  --max-sessions N  --kv-budget SIZE (KV of all sessions; default\n"
    "                max-sessions x n-ctx)  --kv-spill-dir DIR (idle sessions' KV evicted there)\n"
    "                (SIZE: 512M, 8G, or bytes)\n"
    "expert cache:   --policy lru|lfu|hot  --prefetch N (layers ahead)  --io-threads N\n"
    "                --hotlist FILE [--hotlist-max N] (preload; with --vram-budget its experts\n"
    "                take the VRAM slots first)  --stats (JSON line on stderr)\n"
    "kernels:        --q8-activations  8-bit activations on both backends, integer dot products where\n"
    "                the codec has them (faster; on the GPU: Q8_0 and Q4_K)\n"
    "GPU tier:       --cpu-experts auto|off|always  who runs experts the VRAM tier misses in decode:\n"
    "                auto (default) splits them between the link and the CPU by measured rates;\n"
    "                off reads them all over the link (bit-identical at any --vram-budget)\n"
    "                --cuda-graphs on|off  decode steps recorded and replayed as CUDA graphs (default on)\n"
    "                --cold-copies N  slots a set for cold experts the copy engines move into VRAM\n"
    "                (0 = off; default sized from --vram-budget)\n"
    "                --cuda-streaming on|off  --backend cuda over experts streamed through the RAM cache\n"
    "                (default on)\n"
    "memory:         --huge-pages on|off  the weights in transparent huge pages where the host has them\n"
    "                (default on)\n"
    "testing aid:    --lock-memory SIZE  pins SIZE of RAM first, so the run sees a smaller machine\n"
    "tunables:       strata --list-tunables  every STRATA_* environment knob: type, default, value, doc;\n"
    "                the flags above win over their knobs\n"
    "PATH is a GGUF file or a Hugging Face checkpoint directory.\n";

float ParseFloat(const std::string &flag, const std::string &v) {
  char *end = nullptr;
  float f = std::strtof(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !(f == f)) Die(flag + " needs a number, got '" + v + "'");
  return f;
}

// A flag's on|off as a moe_switch.
int OnOff(const std::string &flag, const std::string &v) {
  if (v == "on") return MOE_SWITCH_ON;
  if (v == "off") return MOE_SWITCH_OFF;
  Die(flag + " must be on or off, got '" + v + "'");
}

Args ParseArgs(int argc, char **argv) {
  Args a;
  if (argc < 2) Die("no command given (strata --help lists them)");
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string f = argv[i];
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
    else if (f == "--repeat-last-n") a.repeat_last_n = integer(0, 1 << 24);
    else if (f == "--stop") a.stop.push_back(value());
    else if (f == "--system") a.system = value();
    else if (f == "--template") a.chat_template = value();
    else if (f == "-v" || f == "--verbose") a.verbose = true;
    else if (f == "--prefill") a.prefill = integer(0, 1 << 24);
    else if (f == "--sessions") a.sessions = integer(1, 4096);
    else if (f == "--max-batch-tokens") a.max_batch_tokens = integer(0, 1 << 24);
    else if (f == "--prefill-token-max") a.prefill_token_max = integer(0, 1 << 24);
    else if (f == "--prefill-layer-min") a.prefill_layer_min = integer(0, 1 << 24);
    else if (f == "--threads" || f == "-t") a.n_threads = integer(0, 4096);
    else if (f == "--n-ctx") a.n_ctx = integer(0, 1 << 24);
    else if (f == "--max-sessions") a.max_sessions = integer(1, 1 << 20);
    else if (f == "--kv-budget") a.kv_budget = size();
    else if (f == "--kv-spill-dir") a.kv_spill_dir = path();
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
    } else if (f == "-h" || f == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
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
  for (const auto &s : a.stop)
    if (s.empty()) Die("--stop needs a non-empty string");
  return a;
}

std::string DemoModelPath() {
  if (const std::string &env = strata::tunables::Get().demo_model; !env.empty()) return env;
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

// RAII for the C handles.
struct Ctx {
  moe_ctx *c = nullptr;
  ~Ctx() { moe_ctx_close(c); }
};
struct Sess {
  moe_session *s = nullptr;
  ~Sess() { moe_session_close(s); }
};

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
  sp.penalty_last_n = static_cast<int32_t>(a.repeat_last_n);
  stop_ptrs->clear();
  for (const auto &s : a.stop) stop_ptrs->push_back(s.c_str());
  sp.stop_strings = stop_ptrs->data();
  sp.n_stop_strings = stop_ptrs->size();
  return sp;
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
  Sess s;
  if (loaded) {
    // The saved session's own params (sampling, seed state, stop strings) carry on.
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
                 "%lld tokens; a larger --n-ctx lets it go on\n", moe_session_n_past(s.s),
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
  Sess s;
  if (moe_status st = moe_session_open(ctx.c, &sp, &s.s); st != MOE_OK) Die("cannot open a session: " + ApiError(st));

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
            "+ tokens; start again with a larger --n-ctx");
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
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE *f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) Die("cannot write '" + path + "': " + std::strerror(errno));
  bool ok = std::fwrite(data, 1, n, f) == n;
  ok = (std::fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = std::strerror(errno);
    std::remove(tmp.c_str());
    Die("cannot write '" + path + "': " + err);
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

// Decode throughput and expert-tier behaviour: a seeded random prompt of --prompt-tokens ids goes in
// as one batch, then -n tokens are decoded greedily, one step each.
// Runs `strata bench --json` (this same binary) once per configuration of the expert cache — each
// run a fresh process, so every configuration starts cold — and prints them fastest first.
int CmdSweep(const Args &a) {
  std::string self(4096, '\0');
  const ssize_t len = readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (len <= 0) Die("--sweep: cannot find this program's path");
  self.resize(static_cast<size_t>(len));
  std::string base;
  for (size_t i = 1; i < a.argv.size(); ++i) {
    const std::string &arg = a.argv[i];
    if (arg == "--sweep" || arg == "--json" || arg == "--stats") continue;
    if (arg == "--policy" || arg == "--prefetch" || arg == "--io-threads") {
      ++i;  // the sweep sets these
      continue;
    }
    std::string quoted = "'";
    for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    base += " " + quoted + "'";
  }
  struct Row {
    std::string policy;
    int prefetch, io;
    double decode, hit, mib_per_tok, wait;
  };
  std::vector<Row> rows;
  for (const char *policy : {"lru", "lfu", "hot"}) {
    for (int prefetch : {0, 1, 2}) {
      for (int io : {1, 2, 4}) {
        const std::string cmd = "'" + self + "'" + base + " --json --policy " + policy + " --prefetch " +
                                std::to_string(prefetch) + " --io-threads " + std::to_string(io) + " 2>/dev/null";
        FILE *pipe = popen(cmd.c_str(), "r");
        if (pipe == nullptr) Die("--sweep: cannot run " + self);
        std::string out;
        char buf[4096];
        size_t got;
        while ((got = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, got);
        if (pclose(pipe) != 0) Die(std::string("--sweep: the run with --policy ") + policy + " failed");
        auto j = nlohmann::json::parse(out, nullptr, false);
        if (j.is_discarded()) Die("--sweep: a run printed no JSON");
        rows.push_back(Row{policy, prefetch, io, j["decode_tok_s"].get<double>(), j["decode_hit_rate"].get<double>(),
                           j["decode_bytes_read_per_token"].get<double>() / 1048576.0,
                           j["decode_io_wait_s"].get<double>()});
        std::fprintf(stderr, "strata: sweep %zu/27\r", rows.size());
      }
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row &x, const Row &y) { return x.decode > y.decode; });
  std::printf("%-8s %9s %11s %13s %9s %13s %10s\n", "policy", "prefetch", "io threads", "decode tok/s",
              "hit rate", "MiB read/tok", "I/O wait");
  for (const Row &r : rows) {
    std::printf("%-8s %9d %11d %13.2f %8.1f%% %13.2f %9.3fs\n", r.policy.c_str(), r.prefetch, r.io, r.decode,
                100 * r.hit, r.mib_per_tok, r.wait);
  }
  const Row &best = rows.front();
  std::printf("fastest: --policy %s --prefetch %d --io-threads %d (%.2f tok/s)\n", best.policy.c_str(),
              best.prefetch, best.io, best.decode);
  return 0;
}

// Decode step times: the median, the 90th percentile (nearest rank) and the slowest.
struct StepTimes {
  double p50_ms = 0, p90_ms = 0, max_ms = 0;
};

StepTimes SummarizeSteps(const std::vector<double> &ms) {
  StepTimes t;
  if (ms.empty()) return t;
  t.p50_ms = strata::Median(ms);
  t.p90_ms = strata::NearestRank(ms, 90);
  t.max_ms = *std::max_element(ms.begin(), ms.end());
  return t;
}

std::string JsonArray(const std::vector<double> &v) {
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.3f", i == 0 ? "" : ",", v[i]);
    out += buf;
  }
  return out + "]";
}

int CmdBench(const Args &a) {
  if (a.sweep) return CmdSweep(a);
  const std::string model = a.model.empty() ? DemoModelPath() : a.model;
  moe_params p = ContextParams(a, model);
  Ctx ctx;
  auto t0 = std::chrono::steady_clock::now();
  if (moe_status st = moe_ctx_open(&p, &ctx.c); st != MOE_OK) DieOpening(model, st);
  auto t1 = std::chrono::steady_clock::now();
  WarnIfClamped(ctx.c, a);
  const int32_t n_vocab = moe_ctx_vocab_size(ctx.c);
  std::vector<int32_t> prompt(static_cast<size_t>(a.n_prompt));
  uint64_t x = a.seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto &t : prompt) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(n_vocab));
  }
  if (!a.prompt.empty()) {  // a text prompt routes like real use; random ids do not
    if (!HasTokenizer(ctx.c)) Die("'" + model + "' carries no tokenizer; bench --prompt needs one");
    prompt = Tokenize(ctx.c, a.prompt, false, true);
    if (prompt.empty()) Die("the prompt has no tokens");
  }
  if (!a.tokens.empty()) {
    if (!a.prompt.empty()) Die("give either --prompt or --tokens, not both");
    auto t = ParseTokenList(a.tokens);
    if (!t || t->empty()) Die("--tokens needs comma-separated non-negative integers, got '" + a.tokens + "'");
    prompt = *t;
  }
  // Sampling from a random-weight model tends to repeat a few tokens, which keeps re-selecting the
  // same experts; --decode-tokens feeds given ids one per step instead, so decode sees varied input.
  std::vector<int32_t> forced;
  if (!a.decode_tokens.empty()) {
    auto t = ParseTokenList(a.decode_tokens);
    if (!t || t->empty()) {
      Die("--decode-tokens needs comma-separated non-negative integers, got '" + a.decode_tokens + "'");
    }
    forced = *t;
  }
  // Checked here: each session below takes its own rotation of these ids modulo the vocabulary,
  // which would otherwise turn a bad id into a valid one silently.
  for (const auto *ids : {&prompt, &forced}) {
    for (int32_t t : *ids) {
      if (t >= n_vocab) Die("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(n_vocab));
    }
  }
  const int64_t n_decode = forced.empty() ? a.n_predict : static_cast<int64_t>(forced.size());
  // Each session gets its own prompt (a rotation of the first: same length, different routing).
  moe_session_params sp;
  moe_session_params_init(&sp);
  const size_t n_sess = static_cast<size_t>(a.sessions);
  std::vector<Sess> ss(n_sess);
  auto open_sessions = [&] {
    for (auto &s : ss) {
      moe_session_close(s.s);
      s.s = nullptr;
      if (moe_status st = moe_session_open(ctx.c, &sp, &s.s); st != MOE_OK) Die(ApiError(st));
    }
  };
  // Session i of a round takes rotation `salt + i` of the given ids (prompt and decode input).
  auto rotated = [&](int32_t t, uint64_t r) { return static_cast<int32_t>((t + 7919 * r) % static_cast<uint64_t>(n_vocab)); };
  auto feed_prompts = [&](uint64_t salt) {
    for (size_t i = 0; i < n_sess; ++i) {
      std::vector<int32_t> p_i(prompt);
      for (auto &t : p_i) t = rotated(t, salt + i);
      if (moe_status st = moe_session_feed(ss[i].s, p_i.data(), p_i.size()); st != MOE_OK) Die(ApiError(st));
    }
  };
  // Up to `steps` decode steps (fewer when a session's context fills); each step's wall time, the
  // sessions' feeding included, into `ms`. Returns the steps run.
  auto decode = [&](int64_t steps, uint64_t salt, std::vector<double> &ms) {
    int64_t n = 0;
    auto t_step = std::chrono::steady_clock::now();
    for (; n < steps; ++n) {
      for (size_t i = 0; i < ss.size(); ++i) {
        int32_t tok;
        if (!forced.empty()) {
          tok = rotated(forced[n % static_cast<int64_t>(forced.size())], salt + i);
        } else if (moe_status st = moe_session_sample(ss[i].s, &tok); st != MOE_OK) {
          Die(ApiError(st));
        }
        moe_status st = moe_session_feed(ss[i].s, &tok, 1);
        if (st == MOE_ERR_LIMIT_CONTEXT) return n;
        if (st != MOE_OK) Die(ApiError(st));
      }
      if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
      const auto now = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(now - t_step).count());
      t_step = now;
    }
    return n;
  };
  open_sessions();
  moe_ctx_wait_loads(ctx.c);  // a hotlist preload completes before the clock starts
  if (a.warmup > 0) {
    // A warm context: one round (other prompts, as a previous conversation) before the timed one,
    // in sessions closed after it. A context's one-time costs (the first steps of a batch shape,
    // graphs recorded, the CPU share timed) fall there; the timed prompt still re-plans its tier.
    feed_prompts(n_sess);
    if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
    std::vector<double> warm_ms;
    decode(a.warmup, n_sess, warm_ms);
    open_sessions();
  }
  moe_ctx_reset_stats(ctx.c);
  feed_prompts(0);
  auto t2 = std::chrono::steady_clock::now();
  if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
  auto t3 = std::chrono::steady_clock::now();
  moe_stats prefill;
  moe_stats_init(&prefill);
  moe_ctx_stats(ctx.c, &prefill);
  moe_ctx_reset_stats(ctx.c);
  std::vector<double> step_ms;  // each step's wall time, feeding the sessions included
  step_ms.reserve(static_cast<size_t>(std::max<int64_t>(n_decode, 0)));
  const int64_t n = decode(n_decode, 0, step_ms);  // decode steps; every session gets a token per step
  auto t4 = std::chrono::steady_clock::now();
  moe_stats dec;
  moe_stats_init(&dec);
  moe_ctx_stats(ctx.c, &dec);
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  moe_ctx_plan(ctx.c, &plan);
  auto secs = [](auto u, auto v) { return std::chrono::duration<double>(v - u).count(); };
  const double pre_s = secs(t2, t3), dec_s = secs(t3, t4);
  // Hits of either tier (VRAM over a streamed RAM tier, or RAM alone) against reads from the file.
  const double uses = static_cast<double>(dec.vram_hits + dec.expert_hits + dec.expert_misses);
  const double hit_rate = uses > 0 ? (dec.vram_hits + dec.expert_hits) / uses : 1.0;
  const int64_t n_tok = n * static_cast<int64_t>(n_sess);  // decode tokens of all sessions
  const double bytes_per_tok = n_tok > 0 ? static_cast<double>(dec.bytes_read) / n_tok : 0.0;
  const size_t n_prefill = prompt.size() * n_sess;
  // The median step is the rate of a long generation: the first steps (graphs recorded, a prompt's
  // promotions still crossing the link, the CPU-share probe) weigh on a short run's average.
  const StepTimes steps = SummarizeSteps(step_ms);
  const double steady_tok_s = steps.p50_ms > 0 ? 1e3 * static_cast<double>(n_sess) / steps.p50_ms : 0.0;
  // Bytes over the host-device link per decode token: slot fills, experts the GPU read in place (or
  // staged), and the GPU's prefetches its layers did not use.
  const double wasted = dec.vram_expert_slots > 0 && dec.streaming == 0 && dec.prefetch_issued > dec.prefetch_useful
                            ? static_cast<double>(dec.prefetch_issued - dec.prefetch_useful)
                            : 0.0;
  const double link_per_tok =
      n_tok > 0 ? (static_cast<double>(dec.vram_fill_bytes) +
                   (static_cast<double>(dec.vram_zero_copy) + wasted) * static_cast<double>(dec.cache_slot_bytes)) /
                      n_tok
                : 0.0;
  if (a.json) {
    std::printf("{\"model\":\"%s\",\"sessions\":%zu,\"warmup_steps\":%lld,\"load_s\":%.3f,\"ram_budget_bytes\":%llu,\"ram_expert_slots\":%u,"
                "\"routed_experts\":%u,\"prefill_tokens\":%zu,\"prefill_tok_s\":%.3f,\"decode_tokens\":%lld,"
                "\"decode_tok_s\":%.3f,\"decode_hit_rate\":%.4f,\"decode_bytes_read_per_token\":%.0f,"
                "\"decode_io_wait_s\":%.4f,\"prefill_bytes_read\":%llu,\"prefill_hit_rate\":%.4f,"
                "\"decode_link_bytes_per_token\":%.0f,\"decode_step_ms_p50\":%.3f,\"decode_step_ms_p90\":%.3f,"
                "\"decode_step_ms_max\":%.3f,\"decode_steady_tok_s\":%.3f,\"decode_step_ms\":%s,\"stats\":%s}\n",
                model.c_str(), n_sess, static_cast<long long>(a.warmup), secs(t0, t1),
                static_cast<unsigned long long>(plan.ram_budget_bytes),
                plan.ram_expert_slots, plan.n_routed_experts, n_prefill, n_prefill / pre_s,
                static_cast<long long>(n_tok), n_tok / dec_s, hit_rate, bytes_per_tok, dec.io_wait_s,
                static_cast<unsigned long long>(prefill.bytes_read),
                prefill.vram_hits + prefill.expert_hits + prefill.expert_misses
                    ? static_cast<double>(prefill.vram_hits + prefill.expert_hits) /
                          (prefill.vram_hits + prefill.expert_hits + prefill.expert_misses)
                    : 1.0,
                link_per_tok, steps.p50_ms, steps.p90_ms, steps.max_ms, steady_tok_s, JsonArray(step_ms).c_str(),
                StatsJson(ctx.c).c_str());
  } else {
    std::printf("model            %s\n", model.c_str());
    std::printf("load             %.2f s\n", secs(t0, t1));
    std::printf("RAM expert tier  %u of %u experts (%s, %s)\n", plan.ram_expert_slots, plan.n_routed_experts,
                dec.streaming ? "streaming" : "all resident", dec.memory_locked ? "locked" : "not locked");
    std::printf("sessions         %zu\n", n_sess);
    if (a.warmup > 0) std::printf("warm-up          a round of %lld decode steps first\n", static_cast<long long>(a.warmup));
    std::printf("prefill          %zu tokens, %.1f tok/s, %.1f MiB read\n", n_prefill, n_prefill / pre_s,
                prefill.bytes_read / 1048576.0);
    std::printf("decode           %lld tokens (%lld steps), %.2f tok/s\n", static_cast<long long>(n_tok),
                static_cast<long long>(n), n_tok / dec_s);
    if (n > 0) {
      std::printf("decode steps     %.2f ms median (%.2f tok/s steady), %.2f ms p90, %.2f ms slowest\n", steps.p50_ms,
                  steady_tok_s, steps.p90_ms, steps.max_ms);
    }
    if (dec.vram_hits > 0) {
      std::printf("expert hit rate  %.1f%% (%llu VRAM hits, %llu RAM hits, %llu misses; %llu moved up, %llu down)\n",
                  100 * hit_rate, static_cast<unsigned long long>(dec.vram_hits),
                  static_cast<unsigned long long>(dec.expert_hits), static_cast<unsigned long long>(dec.expert_misses),
                  static_cast<unsigned long long>(dec.vram_promotions),
                  static_cast<unsigned long long>(dec.vram_demotions));
    } else {
      std::printf("expert hit rate  %.1f%% (%llu hits, %llu misses)\n", 100 * hit_rate,
                  static_cast<unsigned long long>(dec.expert_hits), static_cast<unsigned long long>(dec.expert_misses));
    }
    std::printf("read per token   %.2f MiB\n", bytes_per_tok / 1048576.0);
    std::printf("I/O wait         %.3f s (%.0f%% of decode)\n", dec.io_wait_s, 100 * dec.io_wait_s / dec_s);
    std::printf("prefetch         %llu issued, %llu useful, %llu skipped (precision %.0f%%)\n",
                static_cast<unsigned long long>(dec.prefetch_issued),
                static_cast<unsigned long long>(dec.prefetch_useful),
                static_cast<unsigned long long>(dec.prefetch_skipped), 100 * dec.prefetch_precision);
    if (dec.vram_device_layers > 0 || dec.vram_expert_slots > 0) {
      std::printf("VRAM tier        %u slots, %u layers routed on the GPU, %.2f MiB/token over the link "
                  "(%llu fills, %llu promotions, %llu zero-copy uses), %llu expert uses on the CPU (%u layers)\n",
                  dec.vram_expert_slots, dec.vram_device_layers, link_per_tok / 1048576.0,
                  static_cast<unsigned long long>(dec.vram_fills), static_cast<unsigned long long>(dec.vram_promotions),
                  static_cast<unsigned long long>(dec.vram_zero_copy),
                  static_cast<unsigned long long>(dec.vram_cpu_experts), dec.vram_cpu_layers);
    }
    if (dec.gpu_graph_replays > 0 || dec.gpu_graph_captures > 0) {
      std::printf("CUDA graphs      %llu decode steps recorded, %llu replayed\n",
                  static_cast<unsigned long long>(dec.gpu_graph_captures),
                  static_cast<unsigned long long>(dec.gpu_graph_replays));
    }
  }
  PrintStatsIf(a, ctx.c);
  return 0;
}

// Records how often each (layer, expert) is selected over a prompt set, hottest first, in the
// hotlist format `strata pack --hotlist` and `--hotlist` preloading read: `layer expert count`.
int CmdProfile(const Args &a) {
  if (a.model.empty()) Die("profile needs --model PATH");
  if (a.prompts.empty()) Die("profile needs --prompts FILE");
  if (a.out.empty()) Die("profile needs --out FILE");
  // Through the library's file layer: a FIFO or a device is refused, not waited on or read forever.
  absl::StatusOr<std::string> prompts = strata::format::ReadSmallFile(a.prompts, uint64_t{256} << 20);
  if (!prompts.ok()) Die(std::string(prompts.status().message()));
  std::vector<std::string> lines;
  std::istringstream in(*prompts);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  if (lines.empty()) Die("'" + a.prompts + "' holds no prompts");
  moe_params p = ContextParams(a, a.model);
  Ctx ctx;
  if (moe_status st = moe_ctx_open(&p, &ctx.c); st != MOE_OK) DieOpening(a.model, st);
  const bool has_text = HasTokenizer(ctx.c);
  for (const std::string &line : lines) {
    std::vector<int32_t> toks;
    if (auto ids = ParseTokenList(line); ids) {
      toks = *ids;
    } else if (has_text) {
      toks = Tokenize(ctx.c, line, false, true);
    } else {
      Die("'" + a.model + "' carries no tokenizer; give prompts as token ids (1,2,3)");
    }
    if (toks.empty()) continue;
    Sess s;
    if (moe_status st = moe_session_open(ctx.c, nullptr, &s.s); st != MOE_OK) Die(ApiError(st));
    if (moe_status st = moe_session_feed(s.s, toks.data(), toks.size()); st != MOE_OK) Die(ApiError(st));
    if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
    for (int64_t i = 0; i < a.n_predict; ++i) {
      int32_t tok;
      if (moe_status st = moe_session_sample(s.s, &tok); st != MOE_OK) Die(ApiError(st));
      if (moe_session_feed(s.s, &tok, 1) != MOE_OK) break;
      if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
    }
  }
  size_t n = 0;
  moe_ctx_expert_counts(ctx.c, nullptr, 0, &n);
  std::vector<uint64_t> counts(n);
  if (moe_status st = moe_ctx_expert_counts(ctx.c, counts.data(), n, &n); st != MOE_OK) Die(ApiError(st));
  const uint32_t n_exp = moe_expert_table_n_experts(moe_ctx_experts(ctx.c));
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return counts[x] > counts[y]; });
  std::string text = "# strata profile: layer expert count, hottest first\n";
  for (size_t i : order) {
    if (counts[i] == 0) break;
    text += std::to_string(i / n_exp) + " " + std::to_string(i % n_exp) + " " + std::to_string(counts[i]) + "\n";
  }
  WriteFileAtomically(a.out, text.data(), text.size());
  std::fprintf(stderr, "strata: profiled %zu prompts into '%s'\n", lines.size(), a.out.c_str());
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

std::string HumanBytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
  else if (b >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.2f KiB", b / double(1ull << 10));
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

strata::runtime::Context::Described DescribeOrDie(const std::string &path) {
  auto d = strata::runtime::Context::Describe(path);
  if (!d.ok()) {
    moe_status st = strata::StatusToMoe(d.status());
    Die("'" + path + "': " + std::string(d.status().message()) + " (" + moe_status_string(st) + ")");
  }
  return std::move(*d);
}

int CmdInspect(const Args &a) {
  std::string path = a.model;
  if (path.empty() && a.positional.size() == 1) path = a.positional[0];
  if (path.empty() || a.positional.size() > 1) Die("inspect needs exactly one PATH");
  auto d = DescribeOrDie(path);
  const auto &hp = d.hp;
  const auto &mf = *d.file;
  std::printf("model:        %s (%s)\n", path.c_str(),
              mf.kind() == strata::model::ModelFile::Kind::kGguf ? "GGUF" : "Hugging Face checkpoint");
  if (mf.kind() == strata::model::ModelFile::Kind::kGguf) {
    std::printf("gguf:         version %u, %zu metadata keys, %zu tensors, alignment %llu\n", mf.gguf().version,
                mf.gguf().kv.size(), mf.gguf().tensors.size(),
                static_cast<unsigned long long>(mf.gguf().alignment));
  } else {
    std::printf("checkpoint:   %d safetensors file(s), %zu tensors\n", mf.n_files(), mf.tensors().size());
  }
  std::printf("architecture: %s\n", hp.arch_name.c_str());
  std::printf("layers %d, embedding %d, heads %d (kv %d, dim %d), vocab %d, context %d\n", hp.n_layer, hp.n_embd,
              hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab, hp.n_ctx_train);
  std::printf("experts %d (%d used per token), expert ffn %d, norm_topk_prob %s, qk_norm %s, tied %s\n", hp.n_expert,
              hp.n_expert_used, hp.n_ff_expert, hp.norm_topk_prob ? "yes" : "no", hp.qk_norm ? "yes" : "no",
              hp.tied_embeddings ? "yes" : "no");
  std::printf("rope theta %g (%s), rms eps %g%s\n", hp.rope_theta,
              hp.rope_style == strata::model::RopeStyle::kNeox ? "neox" : "normal", hp.rms_eps,
              hp.sliding_window ? (", sliding window " + std::to_string(hp.sliding_window)).c_str() : "");
  {
    // Family features: what stays resident besides attention (shared experts, dense MLP layers).
    int n_dense = 0;
    for (int l = 0; l < hp.n_layer; ++l) n_dense += hp.is_dense(l) ? 1 : 0;
    std::string extra;
    if (hp.qk_norm_full) extra += ", qk_norm over the whole projection";
    if (hp.attn_bias) extra += ", q/k/v bias";
    if (hp.attn_out_bias) extra += ", output bias";
    if (hp.n_ff_shared > 0) {
      extra += ", shared expert ffn " + std::to_string(hp.n_ff_shared) +
               (hp.shared_expert_gate ? " (sigmoid-gated)" : "") + " resident";
    }
    if (n_dense > 0) {
      extra += ", " + std::to_string(n_dense) + " dense layer(s) of ffn " + std::to_string(hp.n_ff_dense);
    }
    std::printf("kv cache %llu bytes per token (all layers)%s\n",
                static_cast<unsigned long long>(strata::model::KvCache::BytesFor(hp, 1)), extra.c_str());
  }
  // Attention, routing and RoPE variants of the DeepSeek and gpt-oss families.
  if (hp.mla) {
    std::printf("attention: multi-head latent (q_lora_rank %d, kv_lora_rank %d, qk_nope %d, qk_rope %d, v_head %d); "
                "cache row = latent %d + rope key %d floats per token and layer\n",
                hp.q_lora_rank, hp.kv_lora_rank, hp.qk_nope_dim, hp.qk_rope_dim, hp.v_head_dim, hp.kv_lora_rank,
                hp.qk_rope_dim);
  }
  if (hp.attn_sinks || !hp.layer_window.empty()) {
    std::string windows;
    for (int l = 0; l < hp.n_layer; ++l) {
      windows += (l ? "," : "") + (hp.window(l) > 0 ? std::to_string(hp.window(l)) : std::string("full"));
    }
    std::printf("attention: %swindow per layer [%s]\n", hp.attn_sinks ? "sinks per head, " : "", windows.c_str());
  }
  if (hp.gating != strata::model::Gating::kSoftmax || hp.n_group > 1 || hp.routed_scale != 1.f ||
      hp.n_shared_experts > 0) {
    const char *gating = hp.gating == strata::model::Gating::kSigmoid        ? "sigmoid"
                         : hp.gating == strata::model::Gating::kSoftmaxSelected ? "softmax over the selected"
                                                                                : "softmax";
    std::printf("routing: %s, groups %d (top %d kept)%s, routed scale %g%s%s\n", gating, hp.n_group, hp.topk_group,
                hp.expert_select_bias ? ", selection bias" : "", hp.routed_scale,
                hp.n_shared_experts > 0 ? (", " + std::to_string(hp.n_shared_experts) + " shared expert(s)").c_str() : "",
                hp.swiglu_limit > 0.f ? ", clamped SwiGLU" : "");
  }
  if (hp.yarn) {
    std::printf("rope scaling: yarn factor %g (original context %d), cos/sin x %g, score scale %g\n", hp.yarn_factor,
                hp.yarn_orig_ctx, hp.yarn_attn_factor,
                hp.attn_scale != 0.f ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim)));
  }
  std::printf("\n%-48s %-6s %-24s %12s\n", "tensor", "type", "shape (innermost first)", "bytes");
  for (const auto &t : mf.tensors()) {
    std::string shape;
    for (int i = 0; i < t.n_dims; ++i) shape += (i ? " x " : "") + std::to_string(t.ne[i]);
    std::printf("%-48s %-6s %-24s %12llu\n", t.name.c_str(), std::string(strata::quant::TypeName(t.type)).c_str(),
                shape.c_str(), static_cast<unsigned long long>(t.nbytes));
  }
  // Per-expert bytes by codec (gate|up|down of one routed expert).
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_codec;  // codec set -> (experts, bytes)
  for (const auto &L : d.weights.layers) {
    for (const auto &e : L.experts) {
      std::string key = std::string(e.gate.codec->name) + "/" + std::string(e.up.codec->name) + "/" +
                        std::string(e.down.codec->name);
      by_codec[key].first += 1;
      by_codec[key].second += e.nbytes();
    }
  }
  std::printf("\nrouted experts (gate/up/down codecs): %d layers x %d experts\n", hp.n_layer, hp.n_expert);
  for (const auto &[k, v] : by_codec) {
    std::printf("  %-20s %6llu experts, %s each, %s total\n", k.c_str(), static_cast<unsigned long long>(v.first),
                HumanBytes(v.second / v.first).c_str(), HumanBytes(v.second).c_str());
  }
  std::printf("non-routed weights: %s; routed experts: %s; files: %s\n",
              HumanBytes(strata::model::NonRoutedBytes(d.weights)).c_str(),
              HumanBytes(strata::model::RoutedExpertBytes(d.weights)).c_str(), HumanBytes(mf.total_file_bytes()).c_str());
  return 0;
}

int CmdPlan(const Args &a) {
  std::string path = a.model;
  if (path.empty() && a.positional.size() == 1) path = a.positional[0];
  if (path.empty()) Die("plan needs --model PATH");
  auto d = DescribeOrDie(path);
  strata::runtime::ContextOptions o;
  o.model_path = path;
  o.ram_budget_bytes = a.ram_budget;
  o.vram_budget_bytes = a.vram_budget;
  o.n_ctx = static_cast<int>(a.n_ctx);
  o.max_sessions = static_cast<int>(a.max_sessions);
  o.kv_budget_bytes = a.kv_budget;
  o.backend = a.backend;
  auto plan = strata::store::MakePlan(d.hp, d.weights, strata::runtime::Context::PlanInputsFor(o, d.hp));
  if (!plan.ok()) Die(std::string(plan.status().message()));
  if (plan->clamped) {
    std::fprintf(stderr, "strata: warning: RAM budget raised to the minimum that can run, %llu bytes\n",
                 static_cast<unsigned long long>(plan->ram_budget_bytes));
  }
  if (a.json) {
    // One object a script sizes budgets from (DESIGN.md 3.2): the integer fields are exact.
    const auto &p = *plan;
    const std::string model = nlohmann::json(path).dump();  // a JSON string, quoted
    std::printf(
        "{\"model\":%s,\"backend\":\"%s\",\"routed_experts\":%u,\"vram_expert_slots\":%u,"
        "\"ram_expert_slots\":%u,\"streamed_experts\":%u,\"ram_fixed_bytes\":%llu,\"vram_fixed_bytes\":%llu,"
        "\"expert_slot_bytes\":%llu,\"kv_bytes_per_token\":%llu,\"ram_budget_bytes\":%llu,"
        "\"vram_budget_bytes\":%llu,\"non_routed_bytes\":%llu,\"kv_bytes\":%llu,\"workspace_bytes\":%llu,"
        "\"routed_expert_bytes\":%llu,\"n_layers\":%u,\"experts_per_layer\":%u,\"clamped\":%s}\n",
        model.c_str(), p.vram_fixed_bytes > 0 ? "cuda" : "cpu", p.n_routed_experts, p.vram_expert_slots,
        p.ram_expert_slots, p.streamed_experts, static_cast<unsigned long long>(p.ram_fixed_bytes),
        static_cast<unsigned long long>(p.vram_fixed_bytes), static_cast<unsigned long long>(p.expert_slot_bytes),
        static_cast<unsigned long long>(p.kv_bytes_per_token), static_cast<unsigned long long>(p.ram_budget_bytes),
        static_cast<unsigned long long>(p.vram_budget_bytes), static_cast<unsigned long long>(p.non_routed_bytes),
        static_cast<unsigned long long>(p.kv_bytes), static_cast<unsigned long long>(p.workspace_bytes),
        static_cast<unsigned long long>(p.routed_expert_bytes), p.n_layers, p.n_experts_per_layer,
        p.clamped ? "true" : "false");
    return 0;
  }
  std::printf("cache plan for %s (%s, %d layers x %d experts)\n\n", path.c_str(), d.hp.arch_name.c_str(), d.hp.n_layer,
              d.hp.n_expert);
  std::fputs(strata::store::FormatLedger(*plan).c_str(), stdout);
  return 0;
}

std::string StatusText(const absl::Status &st) {
  return std::string(st.message()) + " (" + moe_status_string(strata::StatusToMoe(st)) + ")";
}

// The temporary file of a pack in progress, removed if the user interrupts it (unlink is
// async-signal-safe); the output itself only appears by rename at the very end.
char g_pack_temp[4096];

void RemovePackTempAndDie(int sig) {
  if (g_pack_temp[0] != '\0') unlink(g_pack_temp);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

int CmdPack(const Args &a) {
  if (a.positional.size() != 2) Die("pack needs IN and OUT (strata pack IN OUT [options])");
  const std::string &in = a.positional[0], &out = a.positional[1];
  strata::model::PackOptions o;
  auto type = [](const char *flag, const std::string &v) {
    auto t = strata::model::ParseTypeName(v);
    if (!t.ok()) Die(std::string(flag) + ": " + std::string(t.status().message()));
    return *t;
  };
  o.experts = type("--experts", a.experts_type);
  o.attention = type("--attention", a.attention_type);
  o.boost = type("--boost", a.boost_type);
  if (!a.boost_layers.empty()) {
    auto layers = ParseTokenList(a.boost_layers);
    if (!layers) Die("--boost-layers needs comma-separated layer numbers, got '" + a.boost_layers + "'");
    o.boost_layers.assign(layers->begin(), layers->end());
  }
  o.hotlist_path = a.hotlist;
  o.progress = isatty(STDERR_FILENO) != 0;
  const std::string temp = out + ".tmp." + std::to_string(getpid());
  if (temp.size() < sizeof g_pack_temp) {
    std::memcpy(g_pack_temp, temp.c_str(), temp.size() + 1);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, RemovePackTempAndDie);
  }
  auto report = strata::model::Pack(in, out, o);
  if (!report.ok()) Die("pack '" + in + "': " + StatusText(report.status()));
  for (const auto &f : report->fallbacks) {
    std::fprintf(stderr, "strata: pack: fallback: %s: row length %lld is not a multiple of the %s block; stored as %s\n",
                 f.tensor.c_str(), static_cast<long long>(f.row_length),
                 std::string(strata::quant::TypeName(static_cast<uint32_t>(f.wanted))).c_str(),
                 std::string(strata::quant::TypeName(static_cast<uint32_t>(f.used))).c_str());
  }
  std::fprintf(stderr, "strata: pack: wrote %s: %d tensors, %s (routed experts %s), %zu fallback(s)\n", out.c_str(),
               report->n_tensors, HumanBytes(report->file_bytes).c_str(), HumanBytes(report->expert_bytes).c_str(),
               report->fallbacks.size());
  return 0;
}

int CmdSynth(const Args &a) {
  if (a.shape.empty() || a.out.empty() || !a.positional.empty()) {
    Die("synth needs --shape NAME and --out FILE (strata synth --shape tiny --out tiny.gguf)");
  }
  strata::model::SynthOptions o;
  o.shape = a.shape;
  o.experts = a.codec;
  o.attention = a.attention_type;
  o.layers = static_cast<int>(a.layers);
  o.seed = a.seed;
  o.sparse = a.sparse;
  o.routing = a.routing;
  o.progress = isatty(STDERR_FILENO) != 0;
  const std::string temp = a.out + ".tmp." + std::to_string(getpid());
  if (temp.size() < sizeof g_pack_temp) {
    std::memcpy(g_pack_temp, temp.c_str(), temp.size() + 1);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, RemovePackTempAndDie);
  }
  auto r = strata::model::Synthesize(o, a.out);
  if (!r.ok()) Die("synth '" + a.out + "': " + StatusText(r.status()));
  std::fprintf(stderr, "strata: synth: wrote %s: %d tensors, %s (routed experts %s, %s per expert) in %.1f s, "
               "%.0f MB/s\n", a.out.c_str(), r->n_tensors, HumanBytes(r->file_bytes).c_str(),
               HumanBytes(r->expert_bytes).c_str(), HumanBytes(r->expert_slot_bytes).c_str(), r->seconds,
               r->file_bytes / 1e6 / std::max(r->seconds, 1e-9));
  // Per-layer sizes, for sizing a --layers slice of the full model.
  uint64_t in_layers = 0;
  for (uint64_t b : r->layer_bytes) in_layers += b;
  std::string dense;
  if (r->n_dense_layers > 0) dense = ", a dense layer " + HumanBytes(r->layer_bytes.front());
  std::fprintf(stderr, "strata: synth: a MoE layer %s%s, outside the layers %s\n",
               HumanBytes(r->layer_bytes.back()).c_str(), dense.c_str(),
               HumanBytes(r->file_bytes - in_layers).c_str());
  return 0;
}

}  // namespace

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
    if (a.command == "help" || a.command == "--help" || a.command == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
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
