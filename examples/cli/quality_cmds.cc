// `strata perplexity` and `strata imatrix`: a model's perplexity over a text (and its KL divergence
// from another model's saved distributions), and the importance matrix of its weights over a text.
// Both score the text as llama-perplexity does: non-overlapping windows of --ctx-size tokens (the
// first set to BOS where the model adds one), each evaluated from an empty context; the tokens of a
// window's second half are scored, each from the logits of the token before it.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "examples/cli/cli.h"
#include "lib/format/gguf.h"
#include "lib/model/imatrix.h"
#include "lib/model/pack.h"
#include "lib/quant/codec.h"
#include "lib/text/tokenizer.h"

namespace strata::cli {
namespace {

constexpr char kKlMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'K', 'L'};
constexpr uint32_t kKlVersion = 1;

std::string ReadText(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) Die("cannot read '" + path + "'");
  return ss.str();
}

std::string Num(double v, int prec = 6) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", prec, v);
  return b;
}

// log_softmax of a logits row, in double.
void LogSoftmax(const float *logits, int32_t n, std::vector<double> *out) {
  double mx = -INFINITY;
  for (int32_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  out->resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) (*out)[i] = static_cast<double>(logits[i]) - lse;
}

// A context over the model for windows of n_ctx tokens, and the text's tokens.
struct Scorer {
  std::unique_ptr<runtime::Context> ctx;
  std::vector<int32_t> tokens;
  int32_t bos = -1;
  bool add_bos = false;
  int n_ctx = 0, n_chunk = 0, first = 0;
  int32_t n_vocab = 0;
};

Scorer OpenScorer(const Args &a, const std::string &what, int backend) {
  if (a.model.empty()) Die(what + " needs --model PATH");
  if (a.text_file.empty()) Die(what + " needs --file TEXT");
  Scorer sc;
  sc.n_ctx = a.n_ctx > 0 ? static_cast<int>(a.n_ctx) : 512;
  if (sc.n_ctx < 4) Die("--ctx-size must be at least 4 for " + what);
  runtime::ContextOptions o;
  o.model_path = a.model;
  o.backend = backend;
  o.ram_budget_bytes = a.ram_budget;
  o.vram_budget_bytes = a.vram_budget;
  o.n_threads = static_cast<int>(a.n_threads);
  o.n_ctx = sc.n_ctx;
  o.max_batch_tokens = static_cast<int>(a.max_batch_tokens);
  o.cpu_q8_activations = a.q8_activations;
  o.gpu_q8_activations = a.q8_activations;
  o.kv_type_k = KvTypeOf(a.cache_type_k);
  o.kv_type_v = KvTypeOf(a.cache_type_v);
  auto ctx = runtime::Context::Open(o);
  if (!ctx.ok()) Die("cannot open '" + a.model + "': " + StatusText(ctx.status()));
  sc.ctx = std::move(*ctx);
  const text::Tokenizer *tok = sc.ctx->tokenizer();
  if (tok == nullptr) Die("'" + a.model + "' has no tokenizer: " + what + " reads text");
  sc.bos = tok->bos();
  sc.add_bos = tok->add_bos() && sc.bos >= 0;
  const std::string text = ReadText(a.text_file);
  sc.tokens = tok->Encode(text, false);
  if (sc.add_bos) sc.tokens.insert(sc.tokens.begin(), sc.bos);
  sc.n_vocab = sc.ctx->hparams().n_vocab;
  const int64_t n_max = static_cast<int64_t>(sc.tokens.size()) / sc.n_ctx;
  if (n_max < 1) {
    Die("'" + a.text_file + "' has " + std::to_string(sc.tokens.size()) + " tokens: " + what + " needs at least " +
        std::to_string(sc.n_ctx) + " (one window of --ctx-size)");
  }
  sc.n_chunk = static_cast<int>(a.chunks > 0 ? std::min<int64_t>(a.chunks, n_max) : n_max);
  sc.first = sc.n_ctx / 2;
  return sc;
}

// Evaluates window c (its first token BOS where the model adds one) in a fresh session; calls
// score(j, logits row of token j) for j in [first, n_ctx - 1).
template <typename F>
void RunWindow(Scorer &sc, int c, F &&score) {
  std::vector<int32_t> w(sc.tokens.begin() + static_cast<int64_t>(c) * sc.n_ctx,
                         sc.tokens.begin() + static_cast<int64_t>(c + 1) * sc.n_ctx);
  if (sc.add_bos) w[0] = sc.bos;
  runtime::SessionOptions so;
  so.n_ctx = sc.n_ctx;
  so.logits_all = true;
  auto s = sc.ctx->OpenSession(so);
  if (!s.ok()) Die("cannot open a session: " + StatusText(s.status()));
  runtime::Session *session = *s;
  struct Closer {
    runtime::Context *ctx;
    runtime::Session *s;
    ~Closer() { ctx->CloseSession(s); }
  } closer{sc.ctx.get(), session};
  if (absl::Status st = session->Feed(w.data(), w.size()); !st.ok()) Die(StatusText(st));
  uint32_t pending = 1;
  while (pending > 0) {
    if (absl::Status st = sc.ctx->Step(&pending); !st.ok()) Die(StatusText(st));
  }
  const float *rows = nullptr;
  int32_t n_rows = 0;
  if (absl::Status st = session->LogitsAll(&rows, &n_rows); !st.ok()) Die(StatusText(st));
  if (n_rows != sc.n_ctx) Die("a window gave " + std::to_string(n_rows) + " rows of logits");
  for (int j = sc.first; j < sc.n_ctx - 1; ++j) score(j, rows + static_cast<int64_t>(j) * sc.n_vocab);
}

void Progress(int done, int total, double ppl) {
  if (isatty(STDERR_FILENO) == 0) return;
  std::fprintf(stderr, "\r[%d/%d] PPL %.4f", done, total, ppl);
  if (done == total) std::fputc('\n', stderr);
  std::fflush(stderr);
}

double Percentile(const std::vector<double> &sorted, double q) {
  if (sorted.empty()) return 0;
  const double at = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(at)), hi = std::min(sorted.size() - 1, lo + 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (at - static_cast<double>(lo));
}

// The base file of --kl-divergence-base: magic, version, n_ctx, n_vocab, n_chunk, the windows'
// tokens, each scored token's most probable next token (from the exact logits: two that round to one
// half float stay apart), then for each scored token its n_vocab log-probabilities as IEEE half floats.
struct KlBase {
  int n_ctx = 0, n_chunk = 0;
  int32_t n_vocab = 0;
  std::vector<int32_t> tokens, top;
  std::vector<uint16_t> logp;
};

KlBase ReadKlBase(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read '" + path + "'");
  char magic[8];
  uint32_t head[4];
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char *>(head), sizeof head);
  if (!in || std::memcmp(magic, kKlMagic, sizeof magic) != 0) {
    Die("'" + path + "' is not a file of `strata perplexity --kl-divergence-base`");
  }
  if (head[0] != kKlVersion) Die("'" + path + "' is version " + std::to_string(head[0]) + ", not 1");
  KlBase b;
  b.n_ctx = static_cast<int>(head[1]);
  b.n_vocab = static_cast<int32_t>(head[2]);
  b.n_chunk = static_cast<int>(head[3]);
  const uint64_t n_tok = static_cast<uint64_t>(b.n_ctx) * static_cast<uint64_t>(b.n_chunk);
  const uint64_t scored = static_cast<uint64_t>(b.n_chunk) * static_cast<uint64_t>(b.n_ctx - 1 - b.n_ctx / 2);
  if (b.n_ctx < 4 || b.n_ctx > (1 << 24) || b.n_vocab < 1 || b.n_chunk < 1 || n_tok > (1ull << 32)) {
    Die("'" + path + "' has a bad header");
  }
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  const uint64_t want = sizeof magic + sizeof head + 4 * n_tok + 4 * scored + 2 * scored * static_cast<uint64_t>(b.n_vocab);
  if (size != want) {
    Die("'" + path + "' is " + std::to_string(size) + " bytes; its header says " + std::to_string(want));
  }
  in.seekg(sizeof magic + sizeof head);
  b.tokens.resize(n_tok);
  b.top.resize(scored);
  b.logp.resize(scored * static_cast<uint64_t>(b.n_vocab));
  in.read(reinterpret_cast<char *>(b.tokens.data()), static_cast<std::streamsize>(4 * n_tok));
  in.read(reinterpret_cast<char *>(b.top.data()), static_cast<std::streamsize>(4 * scored));
  in.read(reinterpret_cast<char *>(b.logp.data()), static_cast<std::streamsize>(2 * b.logp.size()));
  if (!in) Die("cannot read '" + path + "'");
  return b;
}

}  // namespace

int CmdPerplexity(const Args &a) {
  // As llama-perplexity: --kl-divergence-base FILE alone saves the model's distributions there; with
  // --kl-divergence it compares against the ones saved.
  if (a.kl_divergence && a.kl_base.empty()) Die("--kl-divergence needs --kl-divergence-base FILE to compare with");
  const bool save = !a.kl_base.empty() && !a.kl_divergence;
  Scorer sc = OpenScorer(a, "perplexity", a.backend);
  KlBase base;
  if (a.kl_divergence) {
    base = ReadKlBase(a.kl_base);
    if (base.n_ctx != sc.n_ctx || base.n_vocab != sc.n_vocab) {
      Die("'" + a.kl_base + "' was made with --ctx-size " + std::to_string(base.n_ctx) + " and " +
          std::to_string(base.n_vocab) + " tokens in the vocabulary; this run has " + std::to_string(sc.n_ctx) +
          " and " + std::to_string(sc.n_vocab));
    }
    sc.n_chunk = std::min(sc.n_chunk, base.n_chunk);
    if (!std::equal(base.tokens.begin(), base.tokens.begin() + static_cast<int64_t>(sc.n_chunk) * sc.n_ctx,
                    sc.tokens.begin())) {
      Die("'" + a.kl_base + "' scored other tokens: give the same --file and a model with the same tokenizer");
    }
  }
  std::vector<uint16_t> saved;
  std::vector<int32_t> saved_top;
  double nll = 0, nll2 = 0, base_nll = 0;
  int64_t count = 0, same_top = 0;
  std::vector<double> lp, klds;
  size_t at = 0;  // scored tokens so far, across windows
  for (int c = 0; c < sc.n_chunk; ++c) {
    const int32_t *win = sc.tokens.data() + static_cast<int64_t>(c) * sc.n_ctx;
    RunWindow(sc, c, [&](int j, const float *logits) {
      LogSoftmax(logits, sc.n_vocab, &lp);
      const double v = -lp[static_cast<size_t>(win[j + 1])];
      nll += v;
      nll2 += v * v;
      ++count;
      int32_t top_n = 0;
      for (int32_t t = 1; t < sc.n_vocab; ++t) top_n = lp[t] > lp[top_n] ? t : top_n;
      if (save) {
        for (double x : lp) saved.push_back(quant::FloatToHalf(static_cast<float>(x)));
        saved_top.push_back(top_n);
      }
      if (a.kl_divergence) {
        const uint16_t *b = base.logp.data() + at * static_cast<size_t>(sc.n_vocab);
        double kld = 0;
        for (int32_t t = 0; t < sc.n_vocab; ++t) {
          const double lb = quant::HalfToFloat(b[t]);
          kld += std::exp(lb) * (lb - lp[t]);
        }
        klds.push_back(kld);
        same_top += base.top[at] == top_n ? 1 : 0;
        base_nll += -static_cast<double>(quant::HalfToFloat(b[win[j + 1]]));
      }
      ++at;
    });
    Progress(c + 1, sc.n_chunk, std::exp(nll / static_cast<double>(count)));
  }
  const double mean = nll / static_cast<double>(count);
  const double ppl = std::exp(mean);
  const double var = nll2 / static_cast<double>(count) - mean * mean;
  const double ppl_err = count > 1 && var > 0 ? std::sqrt(var / static_cast<double>(count - 1)) * ppl : 0;
  if (save) {
    std::vector<uint8_t> out;
    const uint32_t head[4] = {kKlVersion, static_cast<uint32_t>(sc.n_ctx), static_cast<uint32_t>(sc.n_vocab),
                              static_cast<uint32_t>(sc.n_chunk)};
    auto put = [&](const void *p, size_t n) {
      out.insert(out.end(), static_cast<const uint8_t *>(p), static_cast<const uint8_t *>(p) + n);
    };
    put(kKlMagic, sizeof kKlMagic);
    put(head, sizeof head);
    put(sc.tokens.data(), static_cast<size_t>(sc.n_chunk) * sc.n_ctx * sizeof(int32_t));
    put(saved_top.data(), saved_top.size() * sizeof(int32_t));
    put(saved.data(), saved.size() * sizeof(uint16_t));
    WriteFileAtomically(a.kl_base, out.data(), out.size());
  }
  std::string kl_json;
  if (a.kl_divergence) {
    const double n = static_cast<double>(klds.size());
    double sum = 0, sum2 = 0;
    for (double k : klds) {
      sum += k;
      sum2 += k * k;
    }
    const double kl_mean = sum / n, kl_var = sum2 / n - kl_mean * kl_mean;
    const double kl_err = n > 1 && kl_var > 0 ? std::sqrt(kl_var / (n - 1)) : 0;
    std::vector<double> sorted = klds;
    std::sort(sorted.begin(), sorted.end());
    const double top = static_cast<double>(same_top) / n;
    const double top_err = n > 1 ? std::sqrt(top * (1 - top) / (n - 1)) : 0;
    const double base_ppl = std::exp(base_nll / n);
    const struct {
      const char *key;
      double q;
    } qs[] = {{"kld_max", 1.0},   {"kld_p99_9", 0.999}, {"kld_p99", 0.99}, {"kld_p95", 0.95}, {"kld_p90", 0.90},
              {"kld_median", 0.5}, {"kld_p10", 0.10},    {"kld_p5", 0.05},  {"kld_p1", 0.01},  {"kld_min", 0.0}};
    if (a.json) {
      kl_json = ", \"base_ppl\": " + Num(base_ppl, 10) + ", \"ln_ppl_ratio\": " + Num(std::log(ppl / base_ppl), 10) +
                ", \"kld_mean\": " + Num(kl_mean, 10) + ", \"kld_stderr\": " + Num(kl_err, 10);
      for (const auto &q : qs) kl_json += std::string(", \"") + q.key + "\": " + Num(Percentile(sorted, q.q), 10);
      kl_json += ", \"top1_agreement\": " + Num(top, 10) + ", \"top1_stderr\": " + Num(top_err, 10);
    } else {
      std::printf("PPL(base): %.4f, PPL: %.4f, ln(PPL/PPL(base)): %.6f\n", base_ppl, ppl, std::log(ppl / base_ppl));
      std::printf("Mean KLD: %.6f +/- %.6f\n", kl_mean, kl_err);
      for (const auto &q : qs) std::printf("%-10s %.6f\n", q.key + 4, Percentile(sorted, q.q));
      std::printf("Same top token: %.3f%% +/- %.3f%%\n", 100 * top, 100 * top_err);
    }
  }
  if (a.json) {
    std::printf("{\"ppl\": %s, \"ppl_stderr\": %s, \"tokens\": %lld, \"chunks\": %d, \"ctx\": %d%s}\n",
                Num(ppl, 10).c_str(), Num(ppl_err, 10).c_str(), static_cast<long long>(count), sc.n_chunk, sc.n_ctx,
                kl_json.c_str());
  } else {
    std::printf("Final estimate: PPL = %.4f +/- %.5f (%lld tokens scored in %d windows of %d)\n", ppl, ppl_err,
                static_cast<long long>(count), sc.n_chunk, sc.n_ctx);
  }
  return 0;
}

int CmdImatrix(const Args &a) {
  if (a.out.empty()) Die("imatrix needs --out FILE");
  if (a.backend != MOE_BACKEND_AUTO && a.backend != MOE_BACKEND_CPU) {
    Die("imatrix reads the activations on the CPU backend: drop --backend or give --backend cpu");
  }
  Scorer sc = OpenScorer(a, "imatrix", MOE_BACKEND_CPU);
  model::ImatrixCollector collector(sc.ctx->hparams().n_expert);
  if (absl::Status st = sc.ctx->ObserveActivations(&collector); !st.ok()) Die(StatusText(st));
  double nll = 0;
  int64_t count = 0;
  std::vector<double> lp;
  for (int c = 0; c < sc.n_chunk; ++c) {
    const int32_t *win = sc.tokens.data() + static_cast<int64_t>(c) * sc.n_ctx;
    RunWindow(sc, c, [&](int j, const float *logits) {
      LogSoftmax(logits, sc.n_vocab, &lp);
      nll += -lp[static_cast<size_t>(win[j + 1])];
      ++count;
    });
    if (!collector.status().ok()) Die(StatusText(collector.status()));
    Progress(c + 1, sc.n_chunk, std::exp(nll / static_cast<double>(count)));
  }
  (void)sc.ctx->ObserveActivations(nullptr);
  model::Imatrix &im = collector.imatrix();
  if (im.entries.empty()) Die("no weight product of '" + a.model + "' was seen (tensors named blk.*: a GGUF model)");
  im.datasets = {a.text_file};
  im.chunk_count = static_cast<uint32_t>(sc.n_chunk);
  im.chunk_size = static_cast<uint32_t>(sc.n_ctx);
  if (absl::Status st = model::WriteImatrix(im, a.out); !st.ok()) Die(StatusText(st));
  size_t partial = 0;
  for (const auto &[name, e] : im.entries) {
    partial += std::count(e.counts.begin(), e.counts.end(), int64_t{0}) > 0 ? 1 : 0;
  }
  std::printf("%s: %zu tensors over %d windows of %d tokens (%zu with matrices no token reached); PPL %.4f\n",
              a.out.c_str(), im.entries.size(), sc.n_chunk, sc.n_ctx, partial,
              std::exp(nll / static_cast<double>(count)));
  return 0;
}

}  // namespace strata::cli

namespace strata::cli {
namespace {

// One step down the ladder the sensitivity measures: float to Q8_0, then the K-quants to Q2_K.
std::optional<quant::TypeId> StepDown(uint32_t t) {
  using quant::TypeId;
  switch (static_cast<TypeId>(t)) {
    case TypeId::kF32:
    case TypeId::kF16:
    case TypeId::kBF16: return TypeId::kQ8_0;
    case TypeId::kQ8_0: return TypeId::kQ6_K;
    case TypeId::kQ6_K: return TypeId::kQ5_K;
    case TypeId::kQ5_K: return TypeId::kQ4_K;
    case TypeId::kQ4_K: return TypeId::kQ3_K;
    case TypeId::kQ3_K: return TypeId::kQ2_K;
    default: return std::nullopt;
  }
}

}  // namespace

// The tensors of layer l's group as a pattern over the names pack writes (stacked experts, or one
// tensor an expert).
std::string GroupPattern(int l, const std::string &group) {
  const std::string blk = "^blk\\." + std::to_string(l) + "\\.";
  return group == "attention" ? blk + "attn_(q|k|v|output)\\.weight$"
                              : blk + "ffn_(gate|up|down)(_exps|\\.[0-9]+)\\.weight$";
}

namespace {

// The tensors of layer l's group: "attention" (q, k, v, output) or "experts" (the routed experts'
// gate, up and down, stacked or one tensor an expert).
bool InGroup(const std::string &name, int l, const std::string &group) {
  const std::string blk = "blk." + std::to_string(l) + ".";
  if (name.rfind(blk, 0) != 0) return false;
  const std::string rest = name.substr(blk.size());
  if (group == "attention") {
    return rest == "attn_q.weight" || rest == "attn_k.weight" || rest == "attn_v.weight" || rest == "attn_output.weight";
  }
  for (const char *p : {"ffn_gate", "ffn_up", "ffn_down"}) {
    const std::string s(p);
    if (rest == s + "_exps.weight") return true;
    if (rest.rfind(s + ".", 0) == 0 && rest.size() > s.size() + 8 &&
        rest.compare(rest.size() - 7, 7, ".weight") == 0 && std::isdigit(static_cast<unsigned char>(rest[s.size() + 1]))) {
      return true;
    }
  }
  return false;
}

}  // namespace

int CmdSensitivity(const Args &a) {
  Scorer base = OpenScorer(a, "sensitivity", MOE_BACKEND_CPU);
  auto file = format::File::Open(a.model);
  if (!file.ok()) Die(StatusText(file.status()));
  auto g = format::ParseGguf(**file);
  if (!g.ok()) Die("sensitivity reads a GGUF model: " + StatusText(g.status()));
  // The model's own distributions over the scored tokens.
  std::vector<float> base_lp;
  std::vector<double> lp;
  for (int c = 0; c < base.n_chunk; ++c) {
    RunWindow(base, c, [&](int, const float *logits) {
      LogSoftmax(logits, base.n_vocab, &lp);
      base_lp.insert(base_lp.end(), lp.begin(), lp.end());
    });
  }
  const int n_layer = base.ctx->hparams().n_layer;
  base.ctx.reset();
  struct Row {
    int layer;
    std::string group, from, to;
    uint64_t saved = 0;
    double kld = 0;
  };
  std::vector<Row> rows;
  // Each variant is written here and removed once scored.
  const std::string variant =
      (std::filesystem::temp_directory_path() / ("strata-sensitivity-" + std::to_string(getpid()) + ".gguf")).string();
  struct Remover {
    std::string path;
    ~Remover() { std::remove(path.c_str()); }
  } remover{variant};
  for (int l = 0; l < n_layer; ++l) {
    for (const std::string group : {"attention", "experts"}) {
      model::PackOptions o;
      o.keep_types = true;
      o.verbose = false;
      Row row{l, group, "", "", 0, 0};
      for (const format::GgufTensorInfo &t : g->tensors) {
        if (!InGroup(t.name, l, group)) continue;
        const std::optional<quant::TypeId> lower = StepDown(t.type);
        if (!lower) continue;
        auto bytes = quant::RowBytes(static_cast<uint32_t>(*lower), t.ne[0]);
        if (!bytes.ok() || t.ne[0] % quant::FindCodec(*lower)->block_elems != 0) continue;
        if (o.tensor_types.empty()) o.tensor_types.emplace_back(GroupPattern(l, group), *lower);
        row.from = std::string(quant::TypeName(t.type));
        row.to = std::string(quant::TypeName(static_cast<uint32_t>(*lower)));
        const uint64_t now = *bytes * static_cast<uint64_t>(t.ne[1] * t.ne[2] * t.ne[3]);
        row.saved += t.nbytes > now ? t.nbytes - now : 0;
      }
      if (o.tensor_types.empty()) continue;
      auto packed = model::Pack(a.model, variant, o);
      if (!packed.ok()) Die("packing layer " + std::to_string(l) + "'s " + group + ": " + StatusText(packed.status()));
      Args va = a;
      va.model = variant;
      Scorer sc = OpenScorer(va, "sensitivity", MOE_BACKEND_CPU);
      size_t at = 0;
      double sum = 0;
      for (int c = 0; c < sc.n_chunk && c < base.n_chunk; ++c) {
        RunWindow(sc, c, [&](int, const float *logits) {
          LogSoftmax(logits, sc.n_vocab, &lp);
          const float *b = base_lp.data() + at * static_cast<size_t>(sc.n_vocab);
          double kld = 0;
          for (int32_t t = 0; t < sc.n_vocab; ++t) kld += std::exp(static_cast<double>(b[t])) * (b[t] - lp[t]);
          sum += kld;
          ++at;
        });
      }
      row.kld = at > 0 ? sum / static_cast<double>(at) : 0;
      rows.push_back(row);
      if (isatty(STDERR_FILENO) != 0) std::fprintf(stderr, "\r[%zu] layer %d %s", rows.size(), l, group.c_str());
    }
  }
  if (isatty(STDERR_FILENO) != 0) std::fputc('\n', stderr);
  std::string json = "{\"model\": \"" + a.model + "\", \"file_bytes\": " + std::to_string(g->file_size) + ", \"rows\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    json += std::string(i ? ", " : "") + "{\"layer\": " + std::to_string(r.layer) + ", \"group\": \"" + r.group +
            "\", \"from\": \"" + r.from + "\", \"to\": \"" + r.to + "\", \"saved_bytes\": " + std::to_string(r.saved) +
            ", \"kld\": " + Num(r.kld, 10) + "}";
  }
  json += "]}\n";
  if (!a.out.empty()) WriteFileAtomically(a.out, json.data(), json.size());
  if (a.json) {
    std::fputs(json.c_str(), stdout);
  } else {
    std::printf("%-6s %-10s %-14s %12s %12s %14s\n", "layer", "group", "step", "saved MiB", "mean KLD", "KLD per MiB");
    for (const Row &r : rows) {
      const double mib = static_cast<double>(r.saved) / (1 << 20);
      std::printf("%-6d %-10s %-14s %12.3f %12.6f %14.6f\n", r.layer, r.group.c_str(), (r.from + "->" + r.to).c_str(),
                  mib, r.kld, mib > 0 ? r.kld / mib : 0.0);
    }
  }
  return 0;
}

}  // namespace strata::cli
