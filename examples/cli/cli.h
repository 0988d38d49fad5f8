// The `strata` command line's shared pieces: the parsed flags (Args), the one-line errors (Die:
// `strata: error: <what>`, exit status 1, thrown to main), RAII for the C handles, and the helpers
// and commands the CLI's files share (options.cc: the table of which command takes which option,
// and the help printed from it; strata.cc: parsing, run, chat, logits, tokenize; bench_cmds.cc:
// bench, sweep, profile; model_cmds.cc: inspect, plan, pack, synth; serve_cmd.cc: serve;
// quality_cmds.cc: perplexity, imatrix).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "examples/cli/cli_util.h"
#include "include/strata/moe.h"
#include "lib/runtime/context.h"

namespace strata::cli {

struct CliError {
  std::string msg;
};

[[noreturn]] inline void Die(const std::string &msg) { throw CliError{msg}; }

inline std::string ApiError(moe_status st) {
  return std::string(moe_last_error()) + " (" + moe_status_string(st) + ")";
}

// A context that did not open: the library's message, led by the model's path unless it leads with it.
[[noreturn]] inline void DieOpening(const std::string &model, moe_status st) {
  const std::string lead = "cannot open '" + model + "'";
  const std::string why = ApiError(st);
  Die(why.rfind(lead, 0) == 0 ? why : lead + ": " + why);
}

// Steps until no session has input left (a long input may take several steps).
inline moe_status StepAll(moe_ctx *ctx) {
  uint32_t pending = 1;
  moe_status st = MOE_OK;
  while (pending > 0 && (st = moe_ctx_step(ctx, &pending)) == MOE_OK) {
  }
  return st;
}

// The parsed flags of every command; which command takes which is options.cc's table.
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
  float min_p = 0.f, repeat_penalty = 1.f, presence_penalty = 0.f, frequency_penalty = 0.f;
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
  int cache_type_k = MOE_KV_F32, cache_type_v = MOE_KV_F32;  // moe_kv_type (--cache-type-k / -v)
  // context shift (run, chat, serve): --context-shift, and --keep N (-1: the whole first input)
  bool context_shift = false;
  int64_t keep = 0;
  bool keep_given = false;
  std::string prompts;
  // pack
  std::string experts_type = "q4_k", attention_type = "q8_0", boost_type = "q6_k";
  std::string routing = "concentrated";
  std::string boost_layers, hotlist;
  bool expert_contiguous = false;
  std::string imatrix;  // pack --imatrix
  std::vector<std::string> tensor_types;  // pack --tensor-type PATTERN=TYPE
  uint64_t target_size = 0;              // pack --target-size
  std::string sensitivity;               // pack --sensitivity FILE (of strata sensitivity --out)
  // synth
  std::string shape, codec;  // synth: empty = the shape's expert codec
  std::string decode_tokens;  // bench: teacher-forced decode input instead of sampled tokens
  int64_t warmup = 0;         // bench: decode steps of a round before the timed one (a warm context)
  int64_t layers = 0;
  // serve
  std::string host = "127.0.0.1", api_key;
  int64_t port = 8080, parallel = 4, queue = 64;
  uint64_t max_body = 1 << 20;
  // perplexity, imatrix
  std::string text_file, kl_base;
  bool kl_divergence = false;
  int64_t chunks = 0;
  // batching (bench --sessions, and any command opening a context)
  int64_t sessions = 1, max_batch_tokens = 0, prefill_token_max = 0, prefill_layer_min = 0;
};


// RAII for the C handles.
struct Ctx {
  moe_ctx *c = nullptr;
  ~Ctx() { moe_ctx_close(c); }
};
struct Sess {
  moe_session *s = nullptr;
  ~Sess() { moe_session_close(s); }
};

// strata.cc
std::string DemoModelPath();
moe_params ContextParams(const Args &a, const std::string &model);
std::string StatsJson(moe_ctx *ctx);
void PrintStatsIf(const Args &a, moe_ctx *ctx);
void WarnIfClamped(moe_ctx *ctx, const Args &a);
bool HasTokenizer(moe_ctx *ctx);
std::vector<int32_t> Tokenize(moe_ctx *ctx, const std::string &text, bool special, bool add_bos);
moe_session_params SessionParams(const Args &a, std::vector<const char *> *stop_ptrs);
// The tokens a context shift keeps (moe_session_params.n_keep) for --keep over the session's first
// input `first`, as llama.cpp's main counts them: -1, or more than the input, keeps all of it; else
// --keep N keeps N tokens after a BOS the input starts with, and the BOS.
int32_t KeepFor(const Args &a, moe_ctx *ctx, const std::vector<int32_t> &first);
void WriteFileAtomically(const std::string &path, const void *data, size_t n);
const char *EndOfTurn(const std::string &tmpl);

// serve_cmd.cc
int CmdServe(const Args &a);

// quality_cmds.cc
int CmdPerplexity(const Args &a);
int CmdImatrix(const Args &a);
int CmdSensitivity(const Args &a);
// The pattern (pack --tensor-type) of layer l's "attention" or "experts" group.
std::string GroupPattern(int l, const std::string &group);

// bench_cmds.cc
int CmdSweep(const Args &a);
int CmdBench(const Args &a);
int CmdProfile(const Args &a);

// model_cmds.cc
std::string HumanBytes(uint64_t b);
std::string StatusText(const absl::Status &st);
strata::runtime::Context::Described DescribeOrDie(const std::string &path);
int CmdInspect(const Args &a);
int CmdPlan(const Args &a);
int CmdPack(const Args &a);
int CmdSynth(const Args &a);

// A moe_kv_type (Args::cache_type_k / v, which ParseArgs checked) as the library's KvType, for the
// commands that open a runtime::Context directly.
inline model::KvType KvTypeOf(int t) {
  return t == MOE_KV_F16 ? model::KvType::kF16 : (t == MOE_KV_Q8_0 ? model::KvType::kQ8_0 : model::KvType::kF32);
}

}  // namespace strata::cli
