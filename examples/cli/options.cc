// The table of the `strata` commands and of the options each takes (options.h), the typo
// suggestions and the help and version texts printed from it.
#include "examples/cli/options.h"

#include <algorithm>
#include <string>
#include <vector>

#include "include/strata/moe.h"

namespace strata::cli {
namespace {

// Commands that open a context through moe_params (ContextParams): the memory, cache and kernel options.
constexpr uint32_t kCtx = kRun | kChat | kServe | kLogits | kTokenize | kBench | kProfile;
// Commands whose sessions sample (SessionParams).
constexpr uint32_t kSample = kRun | kChat | kServe;
// perplexity, imatrix, sensitivity: a context of their own (OpenScorer), on fewer options.
constexpr uint32_t kQuality = kPerplexity | kImatrix | kSensitivity;
constexpr uint32_t kAll = (kSensitivity << 1) - 1;

}  // namespace

const std::vector<CommandInfo> &Commands() {
  static const std::vector<CommandInfo> commands = {
      {"run", kRun, 0, "[--model PATH] [--prompt TEXT | --tokens 1,2,3] [-n N] [options]",
       "generate from a prompt (the bundled demo model when --model is not given)",
       "Generates from a prompt (the bundled demo model when --model is not given); the text stops at\n"
       "EOS, at -n tokens or at any --stop string. --save-session FILE saves the session at the end (the\n"
       "last token queued); --load-session FILE continues a saved one (then --prompt/--tokens are fed\n"
       "after its history, and may be left out)."},
      {"chat", kChat, 0, "[--model PATH] [--system TEXT] [--template NAME] [-n N] [-v] [options]",
       "interactive chat on stdin/stdout, one line per user turn",
       "Interactive chat on stdin/stdout, one line per user turn, until end of input, in the model's\n"
       "chat template (on the Jinja engine, or a built-in renderer that agrees) unless --template\n"
       "chatml|qwen2|qwen2.5|qwen3|mistral-v1|mistral-v3|llama3|deepseek-v2|deepseek-v3|gpt-oss (or\n"
       "jinja: the model's own on the engine). -n caps each reply (default 512); -v reports each turn's\n"
       "tokens on stderr."},
      {"serve", kServe, 0, "[--model PATH] [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key KEY] [options]",
       "an OpenAI-compatible HTTP server",
       "An OpenAI-compatible HTTP server: GET /v1/models, POST /v1/completions and /v1/chat/completions\n"
       "(stream: true as server-sent events), GET /health, GET /metrics (Prometheus text). The sampling\n"
       "options and -n are the defaults of requests that do not set them."},
      {"logits", kLogits, 0, "--model PATH --tokens 1,2,3 [--prefill N] --out FILE [options]",
       "teacher-forced logits of every position",
       "Teacher-forced logits of every position, raw little-endian float32 [n_tokens][n_vocab]; the\n"
       "first --prefill N tokens go in as one batch (default all), the rest one at a time."},
      {"tokenize", kTokenize, 0, "--model PATH [--special] --text TEXT",
       "the token ids of a text, separated by spaces", "Prints the token ids of TEXT, separated by single spaces."},
      {"inspect", kInspect, 1, "PATH", "architecture, hyper-parameters, tensors, per-expert bytes by codec",
       "Prints the model's architecture, hyper-parameters, tensors and per-expert bytes by codec."},
      {"plan", kPlan, 1, "--model PATH [budgets] [--json]", "the cache plan ledger: what goes where, and why",
       "Prints the cache plan ledger (what goes where, and why) without loading the weights; --json: one\n"
       "object of its integer fields. --backend cuda plans the GPU's tiers on a machine without a GPU."},
      {"bench", kBench, 0, "[--model PATH] [--prompt TEXT | --prompt-tokens N] [-n N] [--json] [--sweep] [options]",
       "prefill and decode tokens/s, expert hits and misses, I/O",
       "Prefill and decode tokens/s, expert hits and misses, bytes read per token, time waiting on I/O.\n"
       "--tokens and --decode-tokens give the prompt's ids and feed decode these ids one per step\n"
       "instead of sampled tokens; --warmup N first runs a round of other prompts and N decode steps (a\n"
       "warm context), then the timed round in fresh sessions; --sessions N decode together (continuous\n"
       "batching: aggregate tok/s); --sweep: every policy x prefetch distance x I/O threads, fastest first."},
      {"profile", kProfile, 0, "--model PATH --prompts FILE --out HOTLIST [-n N] [options]",
       "count expert selections over a prompt set into a hotlist",
       "Counts (layer, expert) selections over a prompt set (one prompt a line: text, or token ids\n"
       "1,2,3) into a hotlist, hottest first (for --hotlist of the other commands and of pack)."},
      {"pack", kPack, 3, "IN OUT [TYPE] [options]", "rewrite a model as a mixed-precision GGUF",
       "Rewrites IN as a mixed-precision GGUF: routed experts in --experts (--boost for the listed\n"
       "layers), attention/embeddings/output in --attention, norms and routers F32, as llama.cpp's\n"
       "stacked expert tensors (the file loads in llama.cpp); tensors already in the type asked for keep\n"
       "their bytes. TYPE: a llama-quantize file type (Q4_K_M, Q3_K_S, IQ4_XS, IQ2_M, MXFP4_MOE, ...):\n"
       "every matrix's type by llama.cpp's rules for it, instead of --experts and --attention (the\n"
       "very low-bit types need --imatrix where llama-quantize does). --target-size SIZE --sensitivity FILE:\n"
       "every tensor keeps its type but the groups whose step down costs the least KL divergence per\n"
       "byte (strata sensitivity), lowered until the file fits SIZE."},
      {"synth", kSynth, 0, "--shape NAME --out FILE [--codec q4_k] [--layers N] [options]",
       "a GGUF of a real model's shape with random weights",
       "Writes a GGUF with the shape's real tensors, metadata and a byte-level BPE tokenizer, and random\n"
       "weights. Shapes: qwen3-30b-a3b, qwen3-235b-a22b, deepseek-v3, gpt-oss-120b, olmoe-1b-7b,\n"
       "mixtral-8x7b, tiny. Experts in --codec (default q4_k, mxfp4 for gpt-oss-120b: a codec Strata\n"
       "quantizes, mxfp4, or a lattice i-quant iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m,\n"
       "drawn as random codes); every other matrix in --attention."},
      {"perplexity", kPerplexity, 0, "--model PATH --file TEXT [-c N] [--chunks N] [--json] [options]",
       "perplexity over a text, as llama-perplexity computes it",
       "Perplexity over TEXT as llama-perplexity computes it: windows of -c tokens (default 512), each\n"
       "scored on its second half, with its +/- estimate. --kl-divergence-base FILE saves the model's\n"
       "distributions, and with --kl-divergence compares against them (mean KL divergence, its\n"
       "percentiles, top-token agreement); --json: one object (ppl, tokens, ...)."},
      {"imatrix", kImatrix, 0, "--model PATH --file TEXT --out FILE [-c N] [--chunks N] [options]",
       "the importance matrix of a model's weights over a text",
       "The importance matrix of a GGUF model's weights over TEXT (the squares of every column entering\n"
       "each blk.* tensor, per routed expert), on the CPU, in llama.cpp's GGUF imatrix format."},
      {"sensitivity", kSensitivity, 0, "--model PATH --file TEXT [-c N] [--chunks N] [--out FILE] [--json]",
       "per layer, the KL divergence of storing it one step lower",
       "Per layer, the KL divergence from the model when its attention, or its routed experts, are stored\n"
       "one step lower (float to Q8_0, Q8_0 to Q6_K, ... Q3_K to Q2_K), and the bytes saved; --out FILE\n"
       "keeps the table for pack --target-size."},
  };
  return commands;
}

const std::vector<OptionInfo> &Options() {
  static const std::vector<OptionInfo> options = {
      // What the command reads and writes.
      {"--model|-m", "PATH", kCtx | kInspect | kPlan | kQuality, "",
       "a GGUF file or a Hugging Face checkpoint directory"},
      {"--prompt|-p", "TEXT", kRun | kBench, "", "the prompt's text"},
      {"--tokens", "1,2,3", kRun | kLogits | kBench, "", "the prompt as token ids"},
      {"--prefill", "N", kLogits, "", "the first N tokens go in as one batch (default: all)"},
      {"--text", "TEXT", kTokenize, "", "the text to tokenize"},
      {"--special", nullptr, kTokenize, "", "parse special tokens (<|im_start|>, ...) in the text"},
      {"--out|-o", "FILE", kLogits | kProfile | kImatrix | kSensitivity | kSynth, "", "the file written"},
      {"--n-predict|-n", "N", kRun | kChat | kServe | kBench | kProfile, "", "tokens to generate"},
      {"--system", "TEXT", kChat, "", "the system message"},
      {"--template", "NAME", kChat | kServe, "", "the chat template (default: the model's own)"},
      {"--verbose|-v", nullptr, kChat, "", "each turn's token counts on stderr"},
      {"--save-session", "FILE", kRun, "", "save the session at the end"},
      {"--load-session", "FILE", kRun, "", "continue a saved session"},
      {"--host", "ADDR", kServe, "", "the address to listen on (default 127.0.0.1)"},
      {"--port", "N", kServe, "", "the port (default 8080; 0 picks a free one)"},
      {"--parallel", "N", kServe, "", "requests that decode together (default 4)"},
      {"--queue", "N", kServe, "", "requests that wait beyond --parallel (default 64; beyond: 503)"},
      {"--api-key", "KEY", kServe, "", "every route but /health needs 'Authorization: Bearer KEY'"},
      {"--max-body", "SIZE", kServe, "", "the largest request body (default 1M)"},
      {"--prompt-tokens", "N", kBench, "", "a seeded random prompt of N ids (default 64)"},
      {"--decode-tokens", "4,5,6", kBench, "", "decode fed these ids one per step instead of sampled tokens"},
      {"--warmup", "N", kBench, "", "a round of other prompts and N decode steps before the timed one"},
      {"--sessions", "N", kBench, "", "N sessions decode together (aggregate tok/s)"},
      {"--sweep", nullptr, kBench, "", "every policy x prefetch x I/O threads, fastest first"},
      {"--prompts", "FILE", kProfile, "", "the prompt set, one prompt a line (text, or ids 1,2,3)"},
      {"--file|-f", "TEXT", kQuality, "", "the text file scored"},
      {"--chunks", "N", kQuality, "", "score only the first N windows (default: all)"},
      {"--kl-divergence-base", "FILE", kPerplexity, "", "save the model's distributions, or the base compared against"},
      {"--kl-divergence", nullptr, kPerplexity, "", "compare against --kl-divergence-base"},
      {"--json", nullptr, kPlan | kBench | kPerplexity | kSensitivity, "", "one JSON object on stdout"},
      {"--experts", "TYPE", kPack, "", "the routed experts' type (default q4_k)"},
      {"--attention", "TYPE", kPack | kSynth, "", "attention, embeddings and output's type (default q8_0)"},
      {"--boost", "TYPE", kPack, "", "the --boost-layers' experts' type (default q6_k)"},
      {"--boost-layers", "0,1", kPack, "", "layers whose experts get --boost"},
      {"--expert-contiguous", nullptr, kPack, "", "each expert's gate|up|down contiguous, 4 KiB-aligned"},
      {"--imatrix", "FILE", kPack, "", "weigh the quantizers by an importance matrix (strata imatrix's)"},
      {"--tensor-type", "RE=TYPE", kPack, "", "tensors whose name RE finds in TYPE (repeatable)"},
      {"--target-size", "SIZE", kPack, "", "lower the cheapest groups until the file fits SIZE"},
      {"--sensitivity", "FILE", kPack, "", "the table of strata sensitivity --out, for --target-size"},
      {"--shape", "NAME", kSynth, "", "the model shape (qwen3-30b-a3b, deepseek-v3, tiny, ...)"},
      {"--codec", "TYPE", kSynth, "", "the experts' codec (default: the shape's)"},
      {"--layers", "N", kSynth, "", "the shape's first N layers at full width"},
      {"--sparse", nullptr, kSynth, "", "header only, the data a hole (for plan and inspect at real size)"},
      {"--routing", "KIND", kSynth, "", "concentrated (default), spread or skewed"},
      {"--seed", "S", kSample | kBench | kSynth, "", "the random seed"},
      // Sampling.
      {"--temp", "T", kSample, "sampling options", "temperature (default 0.8; 0: greedy)"},
      {"--top-k", "K", kSample, "sampling options", "sample among the K likeliest (default 40; 0: all)"},
      {"--top-p", "P", kSample, "sampling options", "nucleus sampling (default 0.95)"},
      {"--min-p", "P", kSample, "sampling options", "drop tokens below P x the likeliest's probability"},
      {"--repeat-penalty", "R", kSample, "sampling options", "penalty of tokens in the last --repeat-last-n (default 1)"},
      {"--presence-penalty", "P", kSample, "sampling options", "subtracted once from tokens already seen"},
      {"--frequency-penalty", "F", kSample, "sampling options", "subtracted per occurrence of tokens already seen"},
      {"--repeat-last-n", "N", kSample, "sampling options", "the window of the penalties (default 64)"},
      {"--stop", "STR", kSample, "sampling options", "stop at this string (repeatable)"},
      // Context shift.
      {"--context-shift", nullptr, kSample, "context shift options",
       "a full context drops half the tokens after --keep (default: stop)"},
      {"--keep", "N", kSample, "context shift options",
       "tokens kept at the start, and BOS (default 0; -1: the prompt)"},
      // The context: backend, memory, sessions.
      {"--backend", "cpu|cuda|auto", kCtx | kPlan | kPerplexity | kImatrix, "context options", "the backend (default auto)"},
      {"--ram-budget", "SIZE", kCtx | kPlan | kQuality, "context options", "RAM for the model (512M, 8G or bytes)"},
      {"--vram-budget", "SIZE", kCtx | kPlan | kQuality, "context options", "VRAM for the model"},
      {"--threads|-t", "N", kCtx | kQuality, "context options", "CPU threads (default: the cores)"},
      {"--n-ctx|-c|--ctx-size", "N", kCtx | kPlan | kQuality, "context options",
       "context length (the quality tools: their window)"},
      {"--max-sessions", "N", kCtx | kPlan, "context options", "sessions the KV is sized for (default 1)"},
      {"--kv-budget", "SIZE", kCtx | kPlan, "context options", "the KV of all sessions (default max-sessions x n-ctx)"},
      {"--kv-spill-dir", "DIR", kCtx, "context options", "idle sessions' KV evicted there"},
      {"--cache-type-k|-ctk", "f32|f16|q8_0", kCtx | kPlan | kQuality, "context options",
       "how the KV cache stores keys, llama.cpp's names (default f32; CUDA: f32 only)"},
      {"--cache-type-v|-ctv", "f32|f16|q8_0", kCtx | kPlan | kQuality, "context options",
       "how the KV cache stores values (q8_0: 17/64 of f32's bytes)"},
      // Batching.
      {"--batch-size|-b|--max-batch-tokens", "N", kCtx | kQuality, "batching options", "tokens in one forward pass"},
      {"--prefill-token-max", "N", kCtx, "batching options", "the scheduler's prefill tokens per step"},
      {"--prefill-layer-min", "N", kCtx, "batching options", "the scheduler's smallest prefill by layers"},
      // The expert cache.
      {"--policy", "lru|lfu|hot", kCtx, "expert cache options", "eviction policy (default hot)"},
      {"--prefetch", "N", kCtx, "expert cache options", "layers ahead to prefetch (default 1)"},
      {"--io-threads", "N", kCtx, "expert cache options", "reader threads (default 2)"},
      {"--hotlist", "FILE", kCtx | kPack, "expert cache options",
       "a profile's hotlist: preloaded experts (pack: the hottest first)"},
      {"--hotlist-max", "N", kCtx, "expert cache options", "preload at most N experts of the hotlist"},
      {"--stats", nullptr, kRun | kLogits | kBench | kProfile | kServe, "expert cache options",
       "the context's stats, one JSON line last on stderr"},
      // Kernels and the GPU tier.
      {"--q8-activations", nullptr, kCtx | kQuality, "kernel options", "8-bit activations, integer dot products"},
      {"--cpu-experts", "auto|off|always", kCtx, "GPU tier options", "who runs experts the VRAM tier misses in decode"},
      {"--cuda-graphs", "on|off", kCtx, "GPU tier options", "decode steps replayed as CUDA graphs (default on)"},
      {"--cold-copies", "N", kCtx, "GPU tier options", "slots a set for cold experts copied into VRAM (0 = off)"},
      {"--cuda-streaming", "on|off", kCtx, "GPU tier options", "--backend cuda over experts streamed through RAM"},
      {"--huge-pages", "on|off", kCtx, "GPU tier options", "the weights in transparent huge pages (default on)"},
      {"--lock-memory", "SIZE", kAll, "testing options", "pin SIZE of RAM first, so the run sees a smaller machine"},
      {"--help|-h", nullptr, kAll, "", "this help"},
  };
  return options;
}

const CommandInfo *FindCommand(const std::string &name) {
  for (const CommandInfo &c : Commands())
    if (name == c.name) return &c;
  return nullptr;
}

std::vector<std::string> Spellings(const OptionInfo &opt) {
  std::vector<std::string> out;
  std::string s = opt.names;
  size_t start = 0;
  while (true) {
    const size_t bar = s.find('|', start);
    out.push_back(s.substr(start, bar == std::string::npos ? std::string::npos : bar - start));
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  return out;
}

const OptionInfo *FindOption(const std::string &flag) {
  for (const OptionInfo &o : Options())
    for (const std::string &s : Spellings(o))
      if (s == flag) return &o;
  return nullptr;
}

size_t EditDistance(const std::string &a, const std::string &b) {
  // Optimal string alignment: Levenshtein with a swap of two adjacent characters costing one.
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

namespace {

// Near enough to be a typo: a third of the longer word's letters (the dashes not counted), at least 1.
size_t MaxTypoDistance(const std::string &a, const std::string &b) {
  auto letters = [](const std::string &s) { return s.size() - std::min(s.find_first_not_of('-'), s.size()); };
  return std::max<size_t>(1, std::max(letters(a), letters(b)) / 3);
}

std::string Undashed(const std::string &s) { return s.substr(std::min(s.find_first_not_of('-'), s.size())); }

// The nearest of `candidates` to `word` within MaxTypoDistance, or "" (ties: the first listed). A
// word of one or two letters is too short to guess from: only its dashes may be wrong (--n: -n).
std::string Nearest(const std::string &word, const std::vector<std::string> &candidates) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string &c : candidates) {
    if (Undashed(word).size() <= 2 && Undashed(word) != Undashed(c)) continue;
    const size_t d = EditDistance(word, c);
    if (d <= MaxTypoDistance(word, c) && d < best_d) best = c, best_d = d;
  }
  return best;
}

}  // namespace

std::string SuggestOption(const std::string &flag, const CommandInfo *cmd) {
  std::vector<std::string> own, others;
  for (const OptionInfo &o : Options())
    for (const std::string &s : Spellings(o)) (cmd == nullptr || Takes(*cmd, o) ? own : others).push_back(s);
  std::string s = Nearest(flag, own);
  return s.empty() ? Nearest(flag, others) : s;
}

std::string SuggestCommand(const std::string &name) {
  std::vector<std::string> names;
  for (const CommandInfo &c : Commands()) names.push_back(c.name);
  return Nearest(name, names);
}

std::string GlobalHelp() {
  std::string s =
      "usage: strata <command> [options]\n"
      "       strata <command> --help    the command's usage and every option it takes\n"
      "       strata --version           the library's version and what this build carries\n"
      "       strata --list-tunables     every STRATA_* environment knob: type, default, value, doc\n"
      "\ncommands:\n";
  for (const CommandInfo &c : Commands()) {
    std::string name = c.name;
    name.resize(std::max<size_t>(name.size() + 1, 13), ' ');
    s += "  " + name + c.summary + "\n";
  }
  s += "\nPATH is a GGUF file or a Hugging Face checkpoint directory; SIZE is 512M, 8G, or bytes.\n";
  return s;
}

std::string CommandHelp(const CommandInfo &cmd) {
  std::string s = std::string("usage: strata ") + cmd.name + " " + cmd.synopsis + "\n\n" + cmd.description + "\n";
  // The groups in the table's order, each with the options of cmd under it.
  std::vector<std::string> groups;
  for (const OptionInfo &o : Options())
    if (Takes(cmd, o) && std::find(groups.begin(), groups.end(), o.group) == groups.end()) groups.push_back(o.group);
  for (const std::string &g : groups) {
    s += "\n" + (g.empty() ? std::string("options") : g) + ":\n";
    for (const OptionInfo &o : Options()) {
      if (!Takes(cmd, o) || g != o.group) continue;
      std::string left;
      const std::vector<std::string> names = Spellings(o);
      // The short (single-dash) spellings first, as is usual: "-n, --n-predict N".
      auto is_short = [](const std::string &n) { return n.size() >= 2 && n[1] != '-'; };
      for (const std::string &n : names)
        if (is_short(n)) left += n + ", ";
      bool first = true;
      for (const std::string &n : names) {
        if (is_short(n)) continue;
        left += (first ? "" : ", ") + n;
        first = false;
      }
      if (o.value != nullptr) left += std::string(" ") + o.value;
      left = "  " + left;
      if (left.size() < 34) left.resize(34, ' ');
      else left += "\n" + std::string(34, ' ');
      s += left + o.doc + "\n";
    }
  }
  return s;
}

std::string VersionText() {
  std::string s = std::string("strata ") + moe_version_string() + " (built against moe.h " +
                  std::to_string(MOE_VERSION_MAJOR) + "." + std::to_string(MOE_VERSION_MINOR) + "." +
                  std::to_string(MOE_VERSION_PATCH) + ")\n";
#ifdef STRATA_CLI_HAVE_CUDA
  // The build made the CUDA backend's plugin (libstrata-cuda.so): whether it loads here, and why not.
  s += "CUDA backend: ";
  s += moe_backend_available(MOE_BACKEND_CUDA) == 1 ? std::string("its plugin loaded, a device is present\n")
                                                    : "unavailable: " + std::string(moe_last_error()) + "\n";
#else
  s += "CUDA backend: not built in (CPU only)\n";
#endif
  return s;
}

}  // namespace strata::cli
