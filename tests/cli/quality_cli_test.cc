// `strata perplexity` and `strata imatrix` on the bundled demo model over fresh random text: the
// perplexity against the llama-perplexity formula evaluated here on logits taken through the C ABI,
// the KL divergence against logits and half-float rounding done here, and the importance matrix
// read back with its layer-0 attention sums against the embeddings' RMS-normed rows computed here.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "lib/model/imatrix.h"
#include "lib/quant/codec.h"
#include "nlohmann/json.hpp"
#include "tests/cli/cli_test_util.h"
#include "tests/format/format_test_util.h"

namespace {

using strata::format::testing::TempDir;

const std::string kDemo = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe-q4_k.gguf";

using Result = strata::testing::CliResult;
using strata::testing::Slurp;

Result Cli(const std::string &args) { return strata::testing::RunCli(args); }

void ExpectError(const Result &r, const std::string &mention) { strata::testing::ExpectCliError(r, mention); }

// Fresh prose-like text: words drawn at random.
std::string RandomText(std::mt19937 &rng, int n_words) {
  static const char *const kWords[] = {"the",   "lady",  "of",     "Kellynch", "was",   "not",    "in",   "a",
                                       "humour", "to",   "walk",   "Anne",     "said",  "Captain", "and", "her",
                                       "father", "would", "never", "think",    "such",  "a",      "letter", "pleasant",
                                       "morning", "Bath", "with",  "every",    "heart", "gentle", "."};
  std::uniform_int_distribution<size_t> pick(0, std::size(kWords) - 1);
  std::string s;
  for (int i = 0; i < n_words; ++i) {
    if (i > 0) s += ' ';
    s += kWords[pick(rng)];
  }
  return s;
}

struct Model {
  moe_ctx *ctx = nullptr;
  explicit Model(const std::string &path) {
    moe_params p;
    moe_params_init(&p);
    p.model_path = path.c_str();
    p.backend = MOE_BACKEND_CPU;
    p.n_ctx = 512;
    REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  }
  ~Model() { moe_ctx_close(ctx); }
  std::vector<int32_t> Tokenize(const std::string &text) const {
    size_t n = 0;
    moe_tokenize(ctx, text.data(), text.size(), MOE_TOKENIZE_ADD_BOS, nullptr, 0, &n);
    std::vector<int32_t> ids(n);
    REQUIRE(moe_tokenize(ctx, text.data(), text.size(), MOE_TOKENIZE_ADD_BOS, ids.data(), n, &n) == MOE_OK);
    return ids;
  }
  // Every row's logits of one window evaluated from an empty session.
  std::vector<float> Logits(const int32_t *t, int n) const {
    moe_session_params sp;
    moe_session_params_init(&sp);
    sp.logits_all = 1;
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
    REQUIRE(moe_session_feed(s, t, static_cast<size_t>(n)) == MOE_OK);
    uint32_t pending = 1;
    while (pending > 0) REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
    const float *rows = nullptr;
    int32_t nt = 0, nv = 0;
    REQUIRE(moe_session_logits_all(s, &rows, &nt, &nv) == MOE_OK);
    REQUIRE(nt == n);
    std::vector<float> out(rows, rows + static_cast<size_t>(nt) * nv);
    moe_session_close(s);
    return out;
  }
  int32_t vocab() const { return moe_ctx_vocab_size(ctx); }
};

std::vector<long double> LogSoftmax(const float *l, int32_t n) {
  long double mx = l[0], sum = 0;
  for (int32_t i = 1; i < n; ++i) mx = std::max<long double>(mx, l[i]);
  for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<long double>(l[i]) - mx);
  std::vector<long double> out(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) out[i] = l[i] - mx - std::log(sum);
  return out;
}

}  // namespace

TEST_CASE("strata perplexity: llama-perplexity's windows and formula", "[cli][quality]") {
  std::mt19937 rng(std::random_device{}());
  TempDir tmp;
  const std::string text_path = tmp.File("text.txt");
  {
    std::ofstream(text_path) << RandomText(rng, 400);
  }
  const int ctx = 64, chunks = 3;
  const Result r = Cli("perplexity --model " + kDemo + " --file " + text_path + " -c " + std::to_string(ctx) +
                       " --chunks " + std::to_string(chunks) + " --json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  // Here: the same windows through the C ABI, scored on their second halves.
  Model m(kDemo);
  const std::vector<int32_t> toks = m.Tokenize(Slurp(text_path));
  REQUIRE(toks.size() >= static_cast<size_t>(ctx * chunks));
  long double nll = 0, nll2 = 0;
  int count = 0;
  for (int c = 0; c < chunks; ++c) {
    const std::vector<float> logits = m.Logits(toks.data() + c * ctx, ctx);
    for (int i = ctx / 2; i < ctx - 1; ++i) {
      const auto lp = LogSoftmax(logits.data() + static_cast<size_t>(i) * m.vocab(), m.vocab());
      const long double v = -lp[static_cast<size_t>(toks[c * ctx + i + 1])];
      nll += v;
      nll2 += v * v;
      ++count;
    }
  }
  const long double mean = nll / count, ppl = std::exp(mean);
  const long double err = std::sqrt((nll2 / count - mean * mean) / (count - 1)) * ppl;
  CHECK(j["tokens"] == count);
  CHECK(j["chunks"] == chunks);
  CHECK(j["ppl"].get<double>() == Approx(static_cast<double>(ppl)).epsilon(1e-7));
  CHECK(j["ppl_stderr"].get<double>() == Approx(static_cast<double>(err)).epsilon(1e-5));
  CHECK(j["ppl"].get<double>() > 1.0);
}

TEST_CASE("strata perplexity: KL divergence against a saved base", "[cli][quality]") {
  std::mt19937 rng(std::random_device{}());
  TempDir tmp;
  const std::string text_path = tmp.File("text.txt"), base = tmp.File("base.kl"), other = tmp.File("q4_0.gguf");
  {
    std::ofstream(text_path) << RandomText(rng, 300);
  }
  const std::string common = " --file " + text_path + " -c 64 --chunks 2";
  Result r = Cli("perplexity --model " + kDemo + common + " --kl-divergence-base " + base);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("Final estimate: PPL = ") != std::string::npos);
  // Against itself: nothing diverges but the half floats the base keeps.
  r = Cli("perplexity --model " + kDemo + common + " --kl-divergence-base " + base + " --kl-divergence --json");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(std::abs(j["kld_mean"].get<double>()) < 1e-3);
  CHECK(j["top1_agreement"].get<double>() == 1.0);
  CHECK(j["base_ppl"].get<double>() == Approx(j["ppl"].get<double>()).epsilon(1e-3));
  // Another quantization of the same model: the divergence computed here from both models' logits.
  REQUIRE(Cli("pack " + kDemo + " " + other + " --experts q4_0").exit_code == 0);
  r = Cli("perplexity --model " + other + common + " --kl-divergence-base " + base + " --kl-divergence --json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  j = nlohmann::json::parse(r.out);
  Model a(kDemo), b(other);
  const std::vector<int32_t> toks = a.Tokenize(Slurp(text_path));
  std::vector<double> klds;
  int same = 0;
  for (int c = 0; c < 2; ++c) {
    const auto la = a.Logits(toks.data() + c * 64, 64), lb = b.Logits(toks.data() + c * 64, 64);
    for (int i = 32; i < 63; ++i) {
      const auto pa = LogSoftmax(la.data() + static_cast<size_t>(i) * a.vocab(), a.vocab());
      const auto pb = LogSoftmax(lb.data() + static_cast<size_t>(i) * b.vocab(), b.vocab());
      long double kld = 0;
      size_t top_a = 0, top_b = 0;
      for (size_t t = 0; t < pa.size(); ++t) {
        const long double base_lp = strata::quant::HalfToFloat(strata::quant::FloatToHalf(static_cast<float>(pa[t])));
        kld += std::exp(base_lp) * (base_lp - pb[t]);
        if (pa[t] > pa[top_a]) top_a = t;
        if (pb[t] > pb[top_b]) top_b = t;
      }
      klds.push_back(static_cast<double>(kld));
      same += top_a == top_b ? 1 : 0;
    }
  }
  double mean = 0;
  for (double k : klds) mean += k / static_cast<double>(klds.size());
  std::sort(klds.begin(), klds.end());
  CHECK(mean > 0);
  CHECK(j["kld_mean"].get<double>() == Approx(mean).epsilon(1e-4));
  CHECK(j["kld_max"].get<double>() == Approx(klds.back()).epsilon(1e-4));
  CHECK(j["kld_min"].get<double>() == Approx(klds.front()).epsilon(1e-3).margin(1e-9));
  CHECK(j["top1_agreement"].get<double>() == Approx(static_cast<double>(same) / klds.size()));
}

TEST_CASE("strata perplexity and imatrix: errors name what is wrong", "[cli][quality]") {
  TempDir tmp;
  const std::string short_text = tmp.File("short.txt"), base = tmp.File("base.kl");
  {
    std::ofstream(short_text) << "the lady of Kellynch";
  }
  ExpectError(Cli("perplexity --model " + kDemo), "--file");
  ExpectError(Cli("perplexity --model " + kDemo + " --file " + short_text + " -c 64"), "at least 64");
  ExpectError(Cli("perplexity --model " + kDemo + " --file " + tmp.File("none.txt")), "none.txt");
  ExpectError(Cli("perplexity --model " + kDemo + " --file " + short_text + " --kl-divergence"),
              "--kl-divergence-base");
  {
    std::ofstream(base) << "STRATAKL but not really";
  }
  std::mt19937 rng(std::random_device{}());
  const std::string text = tmp.File("text.txt");
  {
    std::ofstream(text) << RandomText(rng, 300);
  }
  ExpectError(Cli("perplexity --model " + kDemo + " --file " + text + " -c 64 --kl-divergence-base " + base +
                  " --kl-divergence"),
              "base.kl");
  // A base saved with another window size.
  REQUIRE(Cli("perplexity --model " + kDemo + " --file " + text + " -c 64 --kl-divergence-base " + base).exit_code ==
          0);
  ExpectError(Cli("perplexity --model " + kDemo + " --file " + text + " -c 32 --kl-divergence-base " + base +
                  " --kl-divergence"),
              "--ctx-size 64");
  ExpectError(Cli("imatrix --model " + kDemo + " --file " + text), "--out");
  ExpectError(Cli("imatrix --model " + kDemo + " --file " + text + " --out " + tmp.File("m.gguf") + " --backend cuda"),
              "CPU");
}

TEST_CASE("strata imatrix: llama.cpp's GGUF imatrix of the demo model, read back", "[cli][quality][imatrix]") {
  std::mt19937 rng(std::random_device{}());
  TempDir tmp;
  const std::string text_path = tmp.File("text.txt"), out = tmp.File("imatrix.gguf");
  {
    std::ofstream(text_path) << RandomText(rng, 300);
  }
  const int ctx = 64, chunks = 2;
  const Result r = Cli("imatrix --model " + kDemo + " --file " + text_path + " -c 64 --chunks 2 --out " + out);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto im = strata::model::ReadImatrix(out);
  REQUIRE(im.ok());
  CHECK(!im->legacy);
  CHECK(im->chunk_count == chunks);
  CHECK(im->chunk_size == ctx);
  REQUIRE(im->datasets.size() == 1);
  CHECK(im->datasets[0] == text_path);
  // 4 layers: q, k, v, output, router, and the three stacked expert tensors each.
  CHECK(im->entries.size() == 4 * 8);
  const int tokens = ctx * chunks;
  for (int l = 0; l < 4; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    for (const char *t : {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp"}) {
      const auto &e = im->entries.at(blk + t + ".weight");
      CHECK(e.n_mat() == 1);
      CHECK(e.counts[0] == tokens);
    }
    for (const char *t : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      const auto &e = im->entries.at(blk + t + ".weight");
      REQUIRE(e.n_mat() == 16);
      CHECK(e.n_cols == (std::string(t) == "ffn_down_exps" ? 256 : 512));
      int64_t routed = 0;
      for (int64_t c : e.counts) routed += c;
      CHECK(routed == 2 * tokens);  // top-2
    }
  }
  // Layer 0's attention input, computed here: each token's embedding row RMS-normed, times attn_norm.
  auto file = strata::format::File::Open(kDemo);
  REQUIRE(file.ok());
  auto g = strata::format::ParseGguf(**file);
  REQUIRE(g.ok());
  auto read_f32 = [&](const std::string &name) {
    const auto *t = g->FindTensor(name);
    REQUIRE(t != nullptr);
    std::vector<uint8_t> raw(t->nbytes);
    REQUIRE((*file)->ReadAt(t->offset, raw.data(), raw.size()).ok());
    const strata::quant::Codec *c = strata::quant::FindCodec(t->type);
    REQUIRE(c != nullptr);
    std::vector<float> v(static_cast<size_t>(t->ne[0] * t->ne[1]));
    c->dequantize(raw.data(), v.data(), static_cast<int64_t>(v.size()));
    return v;
  };
  const std::vector<float> embd = read_f32("token_embd.weight"), norm = read_f32("blk.0.attn_norm.weight");
  const double eps = *g->GetFloat("qwen3moe.attention.layer_norm_rms_epsilon");
  Model m(kDemo);
  const std::vector<int32_t> toks = m.Tokenize(Slurp(text_path));
  std::vector<double> want(512, 0.0);
  for (int i = 0; i < tokens; ++i) {
    const float *x = embd.data() + static_cast<size_t>(toks[i]) * 512;
    double ss = 0;
    for (int j = 0; j < 512; ++j) ss += static_cast<double>(x[j]) * x[j];
    const double scale = 1.0 / std::sqrt(ss / 512 + eps);
    for (int j = 0; j < 512; ++j) {
      const double h = x[j] * scale * norm[j];
      want[j] += h * h;
    }
  }
  const auto &q = im->entries.at("blk.0.attn_q.weight");
  for (int j = 0; j < 512; ++j) CHECK(q.sums[j] == Approx(want[j]).epsilon(1e-4));
  const std::vector<float> w = im->Weights("blk.0.attn_q.weight", 0, 512);
  REQUIRE(w.size() == 512);
  CHECK(w[7] == Approx(want[7] / tokens).epsilon(1e-4));
  CHECK(im->Weights("blk.0.attn_q.weight", 1, 512).empty());
  CHECK(im->Weights("blk.0.ffn_down_exps.weight", 3, 256).size() == 256);
}

TEST_CASE("imatrix files: GGUF round trip, the .dat layout, and malformed files", "[quality][imatrix]") {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(0.f, 50.f);
  TempDir tmp;
  strata::model::Imatrix im;
  im.datasets = {"a.txt", "b.txt"};
  im.chunk_count = 7;
  im.chunk_size = 512;
  auto &dense = im.entries["blk.0.attn_q.weight"];
  dense.n_cols = 32;
  dense.counts = {1234};
  for (int j = 0; j < 32; ++j) dense.sums.push_back(u(rng));
  auto &exps = im.entries["blk.0.ffn_down_exps.weight"];
  exps.n_cols = 16;
  exps.counts = {5, 0, 17};
  for (int j = 0; j < 48; ++j) exps.sums.push_back(u(rng));
  REQUIRE(strata::model::WriteImatrix(im, tmp.File("m.gguf")).ok());
  auto back = strata::model::ReadImatrix(tmp.File("m.gguf"));
  REQUIRE(back.ok());
  CHECK(back->datasets == im.datasets);
  CHECK(back->chunk_count == 7);
  CHECK(back->chunk_size == 512);
  REQUIRE(back->entries.size() == 2);
  for (const auto &[name, e] : im.entries) {
    const auto &b = back->entries.at(name);
    CHECK(b.n_cols == e.n_cols);
    CHECK(b.counts == e.counts);
    for (size_t k = 0; k < e.sums.size(); ++k) CHECK(b.sums[k] == static_cast<float>(e.sums[k]));
  }
  // An expert no token reached weighs every column 1, as llama.cpp's quantizer takes it.
  const std::vector<float> none = back->Weights("blk.0.ffn_down_exps.weight", 1, 16);
  CHECK(std::all_of(none.begin(), none.end(), [](float v) { return v == 1.f; }));
  CHECK(back->Weights("blk.0.ffn_down_exps.weight", 2, 16)[3] == Approx(static_cast<float>(exps.sums[35]) / 17));

  // The .dat layout: mean squares times ncall, then the chunk count and the dataset.
  {
    std::ofstream f(tmp.File("m.dat"), std::ios::binary);
    auto i32 = [&](int32_t v) { f.write(reinterpret_cast<const char *>(&v), 4); };
    i32(1);
    const std::string name = "blk.3.ffn_up.weight";
    i32(static_cast<int32_t>(name.size()));
    f << name;
    i32(10);  // ncall
    i32(4);
    const float vals[4] = {20.f, 0.5f, 3.f, 100.f};
    f.write(reinterpret_cast<const char *>(vals), sizeof vals);
    i32(10);
    i32(5);
    f << "x.txt";
  }
  auto dat = strata::model::ReadImatrix(tmp.File("m.dat"));
  REQUIRE(dat.ok());
  CHECK(dat->legacy);
  CHECK(dat->chunk_count == 10);
  CHECK(dat->datasets == std::vector<std::string>{"x.txt"});
  const std::vector<float> w = dat->Weights("blk.3.ffn_up.weight", 0, 4);
  REQUIRE(w.size() == 4);
  CHECK(w[0] == Approx(2.f));
  CHECK(w[3] == Approx(10.f));
  // A legacy entry of a stacked tensor holds its matrices side by side.
  CHECK(dat->Weights("blk.3.ffn_up.weight", 1, 2)[1] == Approx(10.f));

  // Malformed: every prefix of the GGUF file that cuts into its data (the padding after the last
  // tensor may go), garbage, a header that claims more than the file holds.
  const std::string bytes = Slurp(tmp.File("m.gguf"));
  strata::format::MemorySource whole(bytes.data(), bytes.size(), "m.gguf");
  auto layout = strata::format::ParseGguf(whole);
  REQUIRE(layout.ok());
  uint64_t data_end = 0;
  for (const auto &t : layout->tensors) data_end = std::max(data_end, t.offset + t.nbytes);
  for (size_t n = 0; n < data_end; n += 1 + data_end / 97) {
    strata::format::MemorySource src(bytes.data(), n, "cut.gguf");
    auto got = strata::model::ParseImatrix(src);
    INFO("cut at " << n << " of " << bytes.size());
    CHECK(!got.ok());
  }
  const std::string junk = "GGUF\x03\x00\x00\x00garbage";
  strata::format::MemorySource junk_src(junk.data(), junk.size(), "junk.gguf");
  auto bad = strata::model::ParseImatrix(junk_src);
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()).find("junk.gguf") != std::string::npos);
  const int32_t lies[3] = {1, 1 << 30, 0};
  strata::format::MemorySource lie_src(lies, sizeof lies, "lie.dat");
  auto lie = strata::model::ParseImatrix(lie_src);
  REQUIRE(!lie.ok());
  CHECK(std::string(lie.status().message()).find("lie.dat") != std::string::npos);
}

// pack --imatrix: each quantized matrix's rows are quantized under its importance weights, a routed
// expert's looked up as a matrix of its layer's stacked tensor (the demo file stores one tensor per
// expert); recomputed here from the demo's rows, the imatrix and the codec's QuantizeRow.
TEST_CASE("strata pack --imatrix quantizes under the importance weights", "[cli][quality][imatrix]") {
  std::mt19937 rng(std::random_device{}());
  TempDir tmp;
  const std::string text = tmp.File("text.txt"), im_path = tmp.File("im.gguf");
  {
    std::ofstream(text) << RandomText(rng, 300);
  }
  REQUIRE(Cli("imatrix --model " + kDemo + " --file " + text + " -c 64 --chunks 2 --out " + im_path).exit_code == 0);
  const std::string plain = tmp.File("plain.gguf"), weighted = tmp.File("weighted.gguf");
  REQUIRE(Cli("pack " + kDemo + " " + plain + " --experts q2_k").exit_code == 0);
  const Result r = Cli("pack " + kDemo + " " + weighted + " --experts q2_k --imatrix " + im_path);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("importance weights for") != std::string::npos);
  auto im = strata::model::ReadImatrix(im_path);
  REQUIRE(im.ok());
  auto parse = [](const std::string &path) {
    auto f = strata::format::File::Open(path);
    REQUIRE(f.ok());
    auto g = strata::format::ParseGguf(**f);
    REQUIRE(g.ok());
    return std::make_pair(std::move(*f), std::move(*g));
  };
  auto [demo_f, demo] = parse(kDemo);
  auto [w_f, w] = parse(weighted);
  auto [p_f, p] = parse(plain);
  REQUIRE(w.GetString("quantize.imatrix.file").ok());
  CHECK(w.GetUint("quantize.imatrix.chunks_count").value() == 2);
  const strata::quant::Codec *q2 = strata::quant::FindCodec(strata::quant::TypeId::kQ2_K);
  const strata::quant::Codec *q4 = strata::quant::FindCodec(strata::quant::TypeId::kQ4_K);
  REQUIRE(q2 != nullptr);
  const auto *wt = w.FindTensor("blk.1.ffn_down_exps.weight");
  const auto *pt = p.FindTensor("blk.1.ffn_down_exps.weight");
  REQUIRE(wt != nullptr);
  REQUIRE(pt != nullptr);
  REQUIRE(wt->type == static_cast<uint32_t>(strata::quant::TypeId::kQ2_K));
  std::string wb(wt->nbytes, '\0'), pb(pt->nbytes, '\0');
  REQUIRE(w_f->ReadAt(wt->offset, wb.data(), wb.size()).ok());
  REQUIRE(p_f->ReadAt(pt->offset, pb.data(), pb.size()).ok());
  CHECK(wb != pb);  // the weights moved some rows' codes
  const int64_t cols = 256, rows = 512, row_bytes = cols / 256 * 84;
  for (int e : {0, 7, 15}) {
    INFO("expert " << e);
    // The demo's expert e: its own tensor (a per-expert layout) or its slice of the stacked one.
    const auto *own = demo.FindTensor("blk.1.ffn_down." + std::to_string(e) + ".weight");
    const auto *stacked = demo.FindTensor("blk.1.ffn_down_exps.weight");
    REQUIRE((own != nullptr || stacked != nullptr));
    const uint64_t expert_bytes = own != nullptr ? own->nbytes : stacked->nbytes / 16;
    const uint64_t at = own != nullptr ? own->offset : stacked->offset + static_cast<uint64_t>(e) * expert_bytes;
    std::string raw(expert_bytes, '\0');
    REQUIRE(demo_f->ReadAt(at, raw.data(), raw.size()).ok());
    std::vector<float> vals(static_cast<size_t>(rows * cols));
    q4->dequantize(raw.data(), vals.data(), rows * cols);
    const std::vector<float> weights = im->Weights("blk.1.ffn_down_exps.weight", e, cols);
    REQUIRE(weights.size() == static_cast<size_t>(cols));
    std::string want(static_cast<size_t>(rows * row_bytes), '\x5a');
    for (int64_t r0 = 0; r0 < rows; ++r0) {
      strata::quant::QuantizeRow(*q2, vals.data() + r0 * cols, want.data() + r0 * row_bytes, cols, weights.data());
    }
    CHECK(wb.compare(static_cast<size_t>(e) * want.size(), want.size(), want) == 0);
  }
  ExpectError(Cli("pack " + kDemo + " " + tmp.File("x.gguf") + " --experts q2_k --imatrix " + tmp.File("none.gguf")),
              "none.gguf");
}

// strata sensitivity: each (layer, group) row lowers just that group one step, so the file it
// measured differs from the model in that group only, with a KL divergence above zero; pack
// --target-size then lowers the cheapest groups per byte, in that order, until the file fits, and
// refuses a size nothing reaches.
TEST_CASE("strata sensitivity and pack --target-size", "[cli][quality]") {
  std::mt19937 rng(std::random_device{}());
  TempDir tmp;
  const std::string text = tmp.File("text.txt"), table = tmp.File("s.json");
  {
    std::ofstream(text) << RandomText(rng, 300);
  }
  Result r = Cli("sensitivity --model " + kDemo + " --file " + text + " -c 64 --chunks 2 --out " + table + " --json");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(nlohmann::json::parse(Slurp(table)) == j);
  REQUIRE(j["rows"].size() == 8);  // 4 layers: attention, experts
  for (const auto &row : j["rows"]) {
    INFO(row.dump());
    CHECK(row["kld"].get<double>() > 0);
    CHECK(row["saved_bytes"].get<uint64_t>() > 0);
    const std::string group = row["group"];
    CHECK(row["from"] == (group == "attention" ? "Q8_0" : "Q4_K"));
    CHECK(row["to"] == (group == "attention" ? "Q6_K" : "Q3_K"));
    // 16 experts of gate, up (256 x 512) and down (512 x 256): Q4_K 144 bytes a block, Q3_K 110.
    if (group == "experts") CHECK(row["saved_bytes"].get<uint64_t>() == 16ull * 3 * 512 * (144 - 110));
  }
  const uint64_t demo_bytes = std::filesystem::file_size(kDemo);
  const uint64_t target = demo_bytes - 300000;
  const std::string out = tmp.File("fit.gguf");
  r = Cli("pack " + kDemo + " " + out + " --target-size " + std::to_string(target) + " --sensitivity " + table);
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(std::filesystem::file_size(out) <= target);
  // The cheapest group per byte went down first: its tensors are in the lower type, a costlier one's are not.
  std::vector<nlohmann::json> rows(j["rows"].begin(), j["rows"].end());
  std::sort(rows.begin(), rows.end(), [](const nlohmann::json &a, const nlohmann::json &b) {
    return a["kld"].get<double>() * (b["saved_bytes"].get<double>() + 1) <
           b["kld"].get<double>() * (a["saved_bytes"].get<double>() + 1);
  });
  auto f = strata::format::File::Open(out);
  REQUIRE(f.ok());
  auto g = strata::format::ParseGguf(**f);
  REQUIRE(g.ok());
  auto type_of = [&](const nlohmann::json &row) {
    const std::string blk = "blk." + std::to_string(row["layer"].get<int>()) + ".";
    const auto *t = g->FindTensor(blk + (row["group"] == "attention" ? "attn_q.weight" : "ffn_up_exps.weight"));
    REQUIRE(t != nullptr);
    return std::string(strata::quant::TypeName(t->type));
  };
  CHECK(type_of(rows.front()) == rows.front()["to"].get<std::string>());
  CHECK(type_of(rows.back()) == rows.back()["from"].get<std::string>());
  ExpectError(Cli("pack " + kDemo + " " + tmp.File("tiny.gguf") + " --target-size 1000000 --sensitivity " + table),
              "--target-size");
  ExpectError(Cli("pack " + kDemo + " " + tmp.File("x.gguf") + " --target-size 1000000"), "--sensitivity");
}
