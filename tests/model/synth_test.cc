// `strata synth`: the tiny shape opens and runs through the C ABI with finite, non-degenerate logits
// and a working tokenizer; metadata keys, tensor names and shapes are llama.cpp's; the bytes depend
// only on the seed; real shapes have the published per-expert sizes, and a sparse slice of the big
// ones (Qwen3-235B-A22B, DeepSeek-V3, gpt-oss-120b) reads back as the published hyper-parameters;
// bad options fail, naming the problem, and leave no file.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "lib/model/hparams.h"
#include "lib/model/model_file.h"
#include "lib/model/synth.h"
#include "lib/model/weights.h"
#include "lib/quant/codec.h"
#include "lib/text/tokenizer.h"
#include "tests/format/format_test_util.h"
#include "tests/model/golden_util.h"

namespace {

using strata::format::testing::TempDir;
using strata::model::SynthOptions;
using strata::quant::TypeId;

std::string Slurp(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

strata::format::GgufFile Parse(const std::string &path) {
  auto file = strata::format::File::Open(path);
  REQUIRE(file.ok());
  auto g = strata::format::ParseGguf(**file);
  INFO(g.status().message());
  REQUIRE(g.ok());
  return std::move(*g);
}

std::vector<std::string> Listing(const std::string &dir) {
  std::vector<std::string> names;
  for (const auto &e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

void Synth(const SynthOptions &o, const std::string &out) {
  auto r = strata::model::Synthesize(o, out);
  INFO(r.status().message());
  REQUIRE(r.ok());
  REQUIRE(r->file_bytes == std::filesystem::file_size(out));
}

// `path` opened through the C ABI on the CPU backend with two threads.
moe_ctx *OpenOnCpu(const std::string &path) {
  moe_params mp;
  moe_params_init(&mp);
  mp.model_path = path.c_str();
  mp.backend = MOE_BACKEND_CPU;
  mp.n_threads = 2;
  moe_ctx *ctx = nullptr;
  INFO(moe_last_error());
  REQUIRE(moe_ctx_open(&mp, &ctx) == MOE_OK);
  return ctx;
}

void CheckShape(const strata::format::GgufFile &g, const std::string &name, uint32_t type,
                std::vector<int64_t> ne) {
  INFO(name);
  const auto *t = g.FindTensor(name);
  REQUIRE(t != nullptr);
  CHECK(t->type == type);
  REQUIRE(t->n_dims == static_cast<int>(ne.size()));
  for (size_t d = 0; d < ne.size(); ++d) CHECK(t->ne[d] == ne[d]);
}

}  // namespace

TEST_CASE("synth tiny: llama.cpp metadata, names and shapes, run through the C ABI", "[synth]") {
  TempDir dir;
  const auto codec = GENERATE(std::string("q4_k"), std::string("q8_0"));
  const uint32_t type = codec == "q4_k" ? 12u : 8u;
  SynthOptions o;
  o.shape = "tiny";
  o.experts = codec;
  const std::string path = dir.File("tiny-" + codec + ".gguf");
  Synth(o, path);
  CHECK(Listing(dir.path()) == std::vector<std::string>{"tiny-" + codec + ".gguf"});

  const strata::format::GgufFile g = Parse(path);
  CHECK(g.alignment == 32);
  CHECK(g.GetUint("general.alignment").value() == 32);
  CHECK(g.GetString("general.architecture").value() == "qwen3moe");
  CHECK(g.GetUint("general.file_type").value() == (codec == "q4_k" ? 15u : 7u));
  const std::string p = "qwen3moe.";
  CHECK(g.GetUint(p + "block_count").value() == 4);
  CHECK(g.GetUint(p + "context_length").value() == 4096);
  CHECK(g.GetUint(p + "embedding_length").value() == 256);
  CHECK(g.GetUint(p + "feed_forward_length").value() == 512);
  CHECK(g.GetUint(p + "expert_feed_forward_length").value() == 256);
  CHECK(g.GetUint(p + "attention.head_count").value() == 4);
  CHECK(g.GetUint(p + "attention.head_count_kv").value() == 2);
  CHECK(g.GetUint(p + "attention.key_length").value() == 64);
  CHECK(g.GetUint(p + "attention.value_length").value() == 64);
  CHECK(g.GetFloat(p + "rope.freq_base").value() == 1e6);
  CHECK(g.GetFloat(p + "attention.layer_norm_rms_epsilon").value() == Approx(1e-6));
  CHECK(g.GetUint(p + "expert_count").value() == 16);
  CHECK(g.GetUint(p + "expert_used_count").value() == 2);
  CHECK(g.GetBool(p + "expert_weights_norm").value());
  CHECK(g.Find(p + "vocab_size") == nullptr);  // llama.cpp takes it from token_embd

  // Tokenizer keys as llama.cpp reads them.
  CHECK(g.GetString("tokenizer.ggml.model").value() == "gpt2");
  CHECK(g.GetString("tokenizer.ggml.pre").value() == "qwen2");
  const auto *tokens = g.Find("tokenizer.ggml.tokens");
  REQUIRE(tokens != nullptr);
  REQUIRE(tokens->arr_str.size() == 512);
  CHECK(std::set<std::string>(tokens->arr_str.begin(), tokens->arr_str.end()).size() == 512);  // unique
  CHECK(tokens->arr_str[0] == "!");
  CHECK(tokens->arr_str[188] == "\xC4\x80");  // byte 0 as GPT-2's U+0100
  const auto *types = g.Find("tokenizer.ggml.token_type");
  REQUIRE(types != nullptr);
  CHECK(types->elem_type == strata::format::GgufType::kInt32);
  CHECK(types->arr_len == 512);
  const auto *merges = g.Find("tokenizer.ggml.merges");
  REQUIRE(merges != nullptr);
  CHECK(merges->arr_str.size() > 100);
  const uint64_t bos = g.GetUint("tokenizer.ggml.bos_token_id").value();
  const uint64_t eos = g.GetUint("tokenizer.ggml.eos_token_id").value();
  CHECK(tokens->arr_str[bos] == "<|endoftext|>");
  CHECK(tokens->arr_str[eos] == "<|im_end|>");
  CHECK(types->IntAt(eos) == 3);

  // Tensors: llama.cpp's names, ne innermost first, 3-D experts (n_expert outermost).
  CHECK(g.tensors.size() == 3 + 4 * 12);
  CheckShape(g, "token_embd.weight", 8, {256, 512});
  CheckShape(g, "output.weight", 8, {256, 512});
  CheckShape(g, "output_norm.weight", 0, {256});
  for (int l = 0; l < 4; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    CheckShape(g, b + "attn_norm.weight", 0, {256});
    CheckShape(g, b + "attn_q.weight", 8, {256, 256});
    CheckShape(g, b + "attn_k.weight", 8, {256, 128});
    CheckShape(g, b + "attn_v.weight", 8, {256, 128});
    CheckShape(g, b + "attn_output.weight", 8, {256, 256});
    CheckShape(g, b + "attn_q_norm.weight", 0, {64});
    CheckShape(g, b + "attn_k_norm.weight", 0, {64});
    CheckShape(g, b + "ffn_norm.weight", 0, {256});
    CheckShape(g, b + "ffn_gate_inp.weight", 0, {256, 16});
    CheckShape(g, b + "ffn_gate_exps.weight", type, {256, 256, 16});
    CheckShape(g, b + "ffn_up_exps.weight", type, {256, 256, 16});
    CheckShape(g, b + "ffn_down_exps.weight", type, {256, 256, 16});
  }
  for (const auto &t : g.tensors) CHECK(t.offset % 32 == 0);

  // Every quantized tensor decodes to finite values of the intended scale.
  {
    auto file = strata::format::File::Open(path);
    REQUIRE(file.ok());
    const auto *t = g.FindTensor("blk.1.ffn_down_exps.weight");
    std::vector<uint8_t> raw(t->nbytes);
    REQUIRE((*file)->ReadAt(t->offset, raw.data(), raw.size()).ok());
    const int64_t n = t->ne[0] * t->ne[1] * t->ne[2];
    std::vector<float> vals(n);
    strata::quant::FindCodec(t->type)->dequantize(raw.data(), vals.data(), n);
    double sum2 = 0;
    int64_t non_finite = 0;
    for (float v : vals) {
      non_finite += !std::isfinite(v);
      sum2 += double(v) * v;
    }
    REQUIRE(non_finite == 0);
    CHECK(std::sqrt(sum2 / n) == Approx(0.02).epsilon(0.15));
  }

  // Strata's tokenizer loads the vocabulary; the engine opens the file and runs tokens.
  auto tok = strata::text::Tokenizer::FromGguf(g);
  INFO(tok.status().message());
  REQUIRE(tok.ok());
  const std::vector<int32_t> hello = (*tok)->Encode("hello world", false);
  CHECK(hello.size() == 2);
  CHECK((*tok)->Decode(hello).value() == "hello world");
  const std::string odd = "Grüße, 世界!\n\t\x01 the model";
  CHECK((*tok)->Decode((*tok)->Encode(odd, false)).value() == odd);

  moe_ctx *ctx = OpenOnCpu(path);
  CHECK(moe_ctx_vocab_size(ctx) == 512);
  int32_t ids[16];
  size_t n_ids = 0;
  REQUIRE(moe_tokenize(ctx, "hello world", 11, 0, ids, 16, &n_ids) == MOE_OK);
  CHECK(std::vector<int32_t>(ids, ids + n_ids) == hello);
  moe_ctx_close(ctx);

  const std::vector<int32_t> run = {hello[0], hello[1], 7, 300, 42, 511};
  const std::vector<float> logits = strata::testing::TeacherForced(path, run, 3);
  REQUIRE(logits.size() == run.size() * 512);
  for (size_t t = 0; t < run.size(); ++t) {
    double mean = 0, var = 0;
    int non_finite = 0;
    for (int v = 0; v < 512; ++v) {
      const float x = logits[t * 512 + v];
      non_finite += !std::isfinite(x);
      mean += x;
    }
    REQUIRE(non_finite == 0);
    mean /= 512;
    for (int v = 0; v < 512; ++v) var += (logits[t * 512 + v] - mean) * (logits[t * 512 + v] - mean);
    const double sd = std::sqrt(var / 512);
    INFO("position " << t << " logit sd " << sd);
    CHECK(sd > 0.05);  // not flat
    CHECK(sd < 20);
  }
}

// Synth draws the lattice i-quants' blocks (random codes, a block scale that gives the values the
// pool's spread) rather than searching the lattice, and quantizes MXFP4, so a synthetic model can be
// in any of them.
TEST_CASE("synth draws lattice i-quant and MXFP4 experts of the pool's spread, and the model runs", "[synth]") {
  TempDir dir;
  const auto codec = GENERATE(std::string("iq2_xxs"), std::string("iq2_xs"), std::string("iq2_s"),
                              std::string("iq3_xxs"), std::string("iq3_s"), std::string("iq1_s"),
                              std::string("iq1_m"), std::string("mxfp4"));
  SynthOptions o;
  o.shape = "tiny";
  o.layers = 2;
  o.experts = codec;
  const std::string path = dir.File("tiny-" + codec + ".gguf");
  Synth(o, path);
  const strata::format::GgufFile g = Parse(path);
  const auto *t = g.FindTensor("blk.1.ffn_up_exps.weight");
  REQUIRE(t != nullptr);
  const strata::quant::Codec *c = strata::quant::FindCodec(t->type);
  REQUIRE(c != nullptr);
  INFO(codec << " -> " << c->name);
  std::string lower(c->name);
  for (char &ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  CHECK(lower == codec);
  // The values' spread is the pool's (0.02), block by block, and the blocks differ.
  auto file = strata::format::File::Open(path);
  REQUIRE(file.ok());
  std::vector<uint8_t> bytes(t->nbytes);
  REQUIRE((*file)->ReadAt(t->offset, bytes.data(), bytes.size()).ok());
  const int64_t n = static_cast<int64_t>(t->nbytes / c->block_bytes) * c->block_elems;
  std::vector<float> v(static_cast<size_t>(n));
  c->dequantize(bytes.data(), v.data(), n);
  double ss = 0;
  for (float x : v) {
    REQUIRE(std::isfinite(x));
    ss += static_cast<double>(x) * x;
  }
  const double rms = std::sqrt(ss / static_cast<double>(n));
  CHECK(rms > 0.015);
  CHECK(rms < 0.025);
  CHECK(std::memcmp(bytes.data(), bytes.data() + c->block_bytes, static_cast<size_t>(c->block_bytes)) != 0);
  // It runs: a prompt and decode steps give finite logits.
  const std::vector<int32_t> tokens = {3, 141, 59, 26, 53, 58};
  const auto logits = strata::testing::TeacherForced(path, tokens, 4);
  for (float x : logits) REQUIRE(std::isfinite(x));
}

TEST_CASE("synth is deterministic per seed", "[synth]") {
  TempDir dir;
  SynthOptions o;
  o.shape = "tiny";
  o.layers = 2;
  o.seed = 7;
  Synth(o, dir.File("a.gguf"));
  Synth(o, dir.File("b.gguf"));
  o.seed = 8;
  Synth(o, dir.File("c.gguf"));
  const std::string a = Slurp(dir.File("a.gguf")), b = Slurp(dir.File("b.gguf")), c = Slurp(dir.File("c.gguf"));
  CHECK(a.size() > 1000000);
  CHECK(a == b);
  CHECK(a.size() == c.size());
  CHECK(a != c);
  const strata::format::GgufFile g = Parse(dir.File("a.gguf"));
  CHECK(g.GetUint("qwen3moe.block_count").value() == 2);
  CHECK(g.GetUint("strata.synth.seed").value() == 7);
  // Experts are not copies of each other: expert 0 and 1 of a layer differ.
  const auto *t = g.FindTensor("blk.0.ffn_gate_exps.weight");
  const uint64_t per = t->nbytes / 16;
  CHECK(a.compare(t->offset, per, a, t->offset + per, per) != 0);
}

namespace {

// The busiest quarter of each layer's experts: its share of the layer's selections, averaged over
// the layers, after running `runs` through the model (teacher-forced, one session each).
double BusiestQuarterShare(const std::string &path, const std::vector<std::vector<int32_t>> &runs) {
  moe_ctx *ctx = OpenOnCpu(path);
  for (const auto &run : runs) {
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(ctx, nullptr, &s) == MOE_OK);
    for (int32_t tok : run) {
      REQUIRE(moe_session_feed(s, &tok, 1) == MOE_OK);
      uint32_t pending = 0;
      REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
    }
    moe_session_close(s);
  }
  size_t n = 0;
  moe_ctx_expert_counts(ctx, nullptr, 0, &n);
  std::vector<uint64_t> counts(n);
  REQUIRE(moe_ctx_expert_counts(ctx, counts.data(), n, &n) == MOE_OK);
  const size_t n_exp = moe_expert_table_n_experts(moe_ctx_experts(ctx));
  moe_ctx_close(ctx);
  REQUIRE(n_exp > 0);
  REQUIRE(n % n_exp == 0);
  double sum = 0;
  for (size_t l = 0; l < n / n_exp; ++l) {
    std::vector<uint64_t> c(counts.begin() + l * n_exp, counts.begin() + (l + 1) * n_exp);
    std::sort(c.begin(), c.end(), std::greater<uint64_t>());
    const uint64_t all = std::accumulate(c.begin(), c.end(), uint64_t{0});
    REQUIRE(all > 0);
    sum += double(std::accumulate(c.begin(), c.begin() + n_exp / 4, uint64_t{0})) / all;
  }
  return sum / double(n / n_exp);
}

}  // namespace

TEST_CASE("synth routing: spread routing picks varied experts, the default concentrates, skewed favours some experts", "[synth]") {
  TempDir dir;
  SynthOptions o;
  o.shape = "tiny";
  const std::string concentrated = dir.File("c.gguf"), spread = dir.File("s.gguf"), skewed = dir.File("k.gguf");
  Synth(o, concentrated);
  o.routing = "spread";
  Synth(o, spread);
  o.routing = "skewed";
  Synth(o, skewed);
  CHECK(Parse(spread).GetString("strata.synth.routing").value() == "spread");
  CHECK(Parse(concentrated).GetString("strata.synth.routing").value() == "concentrated");
  CHECK(Parse(skewed).GetString("strata.synth.routing").value() == "skewed");
  // Sixteen runs of 32 fresh random token ids each.
  const unsigned seed = std::random_device{}();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, 511);
  std::vector<std::vector<int32_t>> runs(16);
  for (auto &r : runs) {
    for (int i = 0; i < 32; ++i) r.push_back(id(rng));
  }
  const double c = BusiestQuarterShare(concentrated, runs), s = BusiestQuarterShare(spread, runs),
               k = BusiestQuarterShare(skewed, runs);
  INFO("busiest quarter of the experts: concentrated " << c << ", spread " << s << ", skewed " << k);
  // On this 16-expert shape the busiest quarter takes 0.37-0.43 concentrated and 0.29-0.32 spread
  // (uniform: 0.25); larger shapes differ more (olmoe-1b-7b: 0.71-0.86 against 0.38-0.41).
  CHECK(s < 0.36);
  CHECK(c > s + 0.03);
  // Skewed: spread's stream with router rows of unequal scale, 0.43-0.47 here (the rows' scales are
  // the file's, the tokens fresh). On the Qwen3-30B-A3B shape 90% of the selections fall on 49-52%
  // of a layer's experts, against 87% spread (synth.h).
  CHECK(k > s + 0.08);
}

TEST_CASE("synth shapes: published sizes, llama.cpp layouts", "[synth]") {
  using strata::model::PlanSynth;
  auto find = [](const std::vector<strata::format::GgufTensorLayout> &ts, const std::string &name) {
    for (const auto &t : ts)
      if (t.name == name) return &t;
    FAIL("no tensor " << name);
    return static_cast<const strata::format::GgufTensorLayout *>(nullptr);
  };
  SynthOptions o;
  o.layers = 1;

  o.shape = "qwen3-30b-a3b";
  auto q = PlanSynth(o);
  REQUIRE(q.ok());
  const auto *gate = find(*q, "blk.0.ffn_gate_exps.weight");
  CHECK(gate->type == 12);
  CHECK((gate->ne[0] == 2048 && gate->ne[1] == 768 && gate->ne[2] == 128));
  CHECK(gate->nbytes / 128 == 768 * 2048 / 256 * 144);
  CHECK(find(*q, "blk.0.ffn_down_exps.weight")->ne[0] == 768);
  CHECK(find(*q, "blk.0.attn_q.weight")->ne[1] == 32 * 128);
  CHECK(find(*q, "blk.0.attn_k.weight")->ne[1] == 4 * 128);
  CHECK(find(*q, "blk.0.attn_q_norm.weight")->ne[0] == 128);
  CHECK(find(*q, "token_embd.weight")->ne[1] == 151936);
  o.layers = 0;
  auto full = PlanSynth(o);
  REQUIRE(full.ok());
  CHECK(full->size() == 3 + 48 * 12);

  o.layers = 1;
  o.shape = "olmoe-1b-7b";
  auto ol = PlanSynth(o);
  REQUIRE(ol.ok());
  CHECK(find(*ol, "blk.0.ffn_up_exps.weight")->ne[2] == 64);
  CHECK(find(*ol, "blk.0.ffn_up_exps.weight")->nbytes == 64ull * 1024 * 2048 / 256 * 144);
  CHECK(find(*ol, "blk.0.attn_q_norm.weight")->ne[0] == 2048);  // OLMoE norms the whole projection
  CHECK(find(*ol, "blk.0.attn_k_norm.weight")->ne[0] == 2048);
  CHECK(find(*ol, "token_embd.weight")->ne[1] == 50304);

  o.shape = "mixtral-8x7b";
  auto mx = PlanSynth(o);
  REQUIRE(mx.ok());
  CHECK(find(*mx, "blk.0.ffn_down_exps.weight")->ne[0] == 14336);
  CHECK(find(*mx, "blk.0.ffn_down_exps.weight")->ne[2] == 8);
  CHECK(find(*mx, "blk.0.attn_k.weight")->ne[1] == 8 * 128);
  for (const auto &t : *mx) CHECK(t.name.find("attn_q_norm") == std::string::npos);  // no q/k norms

  // The full depths: DeepSeek-V3's first 3 layers dense (no routed experts), the rest MoE.
  o.layers = 0;
  o.shape = "deepseek-v3";
  auto ds = PlanSynth(o);
  REQUIRE(ds.ok());
  int exps = 0;
  for (const auto &t : *ds) exps += t.name.find("ffn_gate_exps") != std::string::npos;
  CHECK(exps == 61 - 3);
  CHECK(find(*ds, "blk.2.ffn_gate.weight")->ne[1] == 18432);
  CHECK(find(*ds, "blk.3.ffn_gate_exps.weight")->nbytes == 256ull * 2048 * 7168 / 256 * 144);
  CHECK(find(*ds, "blk.60.attn_k_b.weight")->ne[2] == 128);
  o.shape = "gpt-oss-120b";
  auto go = PlanSynth(o);
  REQUIRE(go.ok());
  CHECK(find(*go, "blk.35.ffn_up_exps.weight")->nbytes == 128ull * 2880 * 2880 / 32 * 17);  // MXFP4
  CHECK(find(*go, "blk.35.ffn_up_exps.bias")->ne[1] == 128);
  o.shape = "qwen3-235b-a22b";
  auto q2 = PlanSynth(o);
  REQUIRE(q2.ok());
  CHECK(q2->size() == 3 + 94 * 12);
}

namespace {

// A --sparse slice of a big shape (real header and tensor table, data a hole: a few MB on disk
// whatever the apparent size), read back through Strata's loader; BindWeights checks every tensor's
// name and dimensions against the hyper-parameters.
strata::model::HParams ReadBack(const std::string &shape, int layers, const std::string &path) {
  SynthOptions o;
  o.shape = shape;
  o.layers = layers;
  o.sparse = true;
  o.seed = std::random_device{}();
  auto r = strata::model::Synthesize(o, path);
  INFO(r.status().message());
  REQUIRE(r.ok());
  CHECK(r->file_bytes == std::filesystem::file_size(path));
  REQUIRE(static_cast<int>(r->layer_bytes.size()) == layers);
  auto mf = strata::model::ModelFile::Open(path);
  INFO(mf.status().message());
  REQUIRE(mf.ok());
  auto hp = strata::model::ReadHParams(**mf);
  INFO(hp.status().message());
  REQUIRE(hp.ok());
  auto w = strata::model::BindWeights(**mf, *hp);
  INFO(w.status().message());
  REQUIRE(w.ok());
  REQUIRE(static_cast<int>(w->layers.size()) == layers);
  for (int l = 0; l < layers; ++l) {
    CHECK(static_cast<int>(w->layers[l].experts.size()) == (hp->is_dense(l) ? 0 : hp->n_expert));
  }
  return *hp;
}

}  // namespace

TEST_CASE("synth big shapes: Strata reads back the published hyper-parameters from a slice", "[synth]") {
  using strata::model::Arch;
  using strata::model::Gating;
  TempDir dir;

  SECTION("Qwen3-235B-A22B") {
    const auto hp = ReadBack("qwen3-235b-a22b", 1, dir.File("q235.gguf"));
    CHECK(hp.arch == Arch::kQwen3Moe);
    CHECK(hp.n_layer == 1);
    CHECK(hp.n_embd == 4096);
    CHECK(hp.n_head == 64);
    CHECK(hp.n_head_kv == 4);
    CHECK(hp.head_dim == 128);
    CHECK(hp.n_expert == 128);
    CHECK(hp.n_expert_used == 8);
    CHECK(hp.n_ff_expert == 1536);
    CHECK(hp.n_vocab == 151936);
    CHECK(hp.n_ctx_train == 40960);
    CHECK(hp.rope_theta == 1e6f);
    CHECK(hp.rms_eps == 1e-6f);
    CHECK(hp.norm_topk_prob);
    CHECK(hp.qk_norm);
    CHECK(hp.dense_layer.empty());
  }

  SECTION("DeepSeek-V3") {
    // 4 layers: the 3 leading dense layers and a MoE one; 2 layers: one of each.
    const int layers = GENERATE(2, 4);
    const auto hp = ReadBack("deepseek-v3", layers, dir.File("dsv3.gguf"));
    CHECK(hp.arch == Arch::kDeepseek2);
    CHECK(hp.n_layer == layers);
    for (int l = 0; l < layers; ++l) CHECK(hp.is_dense(l) == (l < std::min(3, layers - 1)));
    CHECK(hp.n_ff_dense == 18432);
    CHECK(hp.n_embd == 7168);
    CHECK(hp.n_head == 128);
    CHECK(hp.mla);
    CHECK(hp.q_lora_rank == 1536);
    CHECK(hp.kv_lora_rank == 512);
    CHECK(hp.qk_nope_dim == 128);
    CHECK(hp.qk_rope_dim == 64);
    CHECK(hp.head_dim == 192);
    CHECK(hp.v_head_dim == 128);
    CHECK(hp.n_expert == 256);
    CHECK(hp.n_expert_used == 8);
    CHECK(hp.n_ff_expert == 2048);
    CHECK(hp.n_shared_experts == 1);
    CHECK(hp.n_ff_shared == 2048);
    CHECK(hp.gating == Gating::kSigmoid);
    CHECK(hp.expert_select_bias);
    CHECK(hp.n_group == 8);
    CHECK(hp.topk_group == 4);
    CHECK(hp.routed_scale == 2.5f);
    CHECK(hp.norm_topk_prob);
    CHECK(hp.yarn);
    CHECK(hp.yarn_factor == 40.f);
    CHECK(hp.yarn_orig_ctx == 4096);
    // 1/sqrt(192) times YaRN's mscale^2, mscale = 1 + 0.1 ln 40
    const double m = 1.0 + 0.1 * std::log(40.0);
    CHECK(hp.attn_scale == Approx(m * m / std::sqrt(192.0)).epsilon(1e-5));
    CHECK(hp.n_vocab == 129280);
    CHECK(hp.n_ctx_train == 163840);
    CHECK(hp.rms_eps == 1e-6f);
  }

  SECTION("gpt-oss-120b") {
    const auto hp = ReadBack("gpt-oss-120b", 2, dir.File("gptoss.gguf"));
    CHECK(hp.arch == Arch::kGptOss);
    CHECK(hp.n_layer == 2);
    CHECK(hp.n_embd == 2880);
    CHECK(hp.n_head == 64);
    CHECK(hp.n_head_kv == 8);
    CHECK(hp.head_dim == 64);
    CHECK(hp.n_expert == 128);
    CHECK(hp.n_expert_used == 4);
    CHECK(hp.n_ff_expert == 2880);
    CHECK(hp.n_vocab == 201088);
    CHECK(hp.n_ctx_train == 131072);
    CHECK(hp.rope_theta == 150000.f);
    CHECK(hp.rms_eps == 1e-5f);
    CHECK(hp.attn_sinks);
    CHECK(hp.attn_bias);
    CHECK(hp.expert_bias);
    CHECK(hp.swiglu_limit == 7.f);
    CHECK(hp.window(0) == 128);
    CHECK(hp.window(1) == 0);
    CHECK(hp.yarn_factor == 32.f);
    CHECK(hp.yarn_orig_ctx == 4096);
    const strata::format::GgufFile g = Parse(dir.File("gptoss.gguf"));
    CHECK(g.FindTensor("blk.1.ffn_down_exps.weight")->type == static_cast<uint32_t>(TypeId::kMXFP4));
    CHECK(g.GetUint("general.file_type").value() == 38);
  }
  // Sparse: gigabytes long, but the data is a hole, so the disk holds little more than the header.
  for (const auto &e : std::filesystem::directory_iterator(dir.path())) {
    struct stat st;
    REQUIRE(::stat(e.path().c_str(), &st) == 0);
    CHECK(static_cast<uint64_t>(st.st_size) > (uint64_t{1} << 30));
    CHECK(static_cast<uint64_t>(st.st_blocks) * 512 < (uint64_t{64} << 20));
  }
}

TEST_CASE("synth: bad options fail naming the problem and leave no file", "[synth]") {
  TempDir dir;
  const std::string out = dir.File("bad.gguf");
  auto expect = [&](SynthOptions o, const std::string &target, moe_status code, const std::string &needle) {
    auto r = strata::model::Synthesize(o, target);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message());
    CHECK(strata::StatusToMoe(r.status()) == code);
    CHECK(std::string(r.status().message()).find(needle) != std::string::npos);
    CHECK(Listing(dir.path()).empty());
  };
  SynthOptions o;
  o.shape = "qwen9-moe";
  expect(o, out, MOE_ERR_INVALID_ARGUMENT, "unknown shape 'qwen9-moe'");
  o.shape = "tiny";
  o.experts = "q9_z";
  expect(o, out, MOE_ERR_INVALID_ARGUMENT, "q9_z");
  // (Every codec Strata decodes is now quantized or drawn by synth, so no known codec is refused.)
  o.experts = "q4_k";
  o.attention = "nope";
  expect(o, out, MOE_ERR_INVALID_ARGUMENT, "--attention");
  o.attention = "q8_0";
  o.routing = "wide";
  expect(o, out, MOE_ERR_INVALID_ARGUMENT, "unknown routing 'wide'");
  o.routing = "spread";
  o.layers = -3;
  expect(o, out, MOE_ERR_INVALID_ARGUMENT, "--layers");
  o.shape = "qwen3-235b-a22b";  // a published shape has no more layers than the model
  o.layers = 95;
  expect(o, out, MOE_ERR_INVALID_ARGUMENT, "--layers 95 is outside [1, 94]");
  o.shape = "gpt-oss-120b";
  o.layers = 1;
  o.experts = "q4_k";  // 2880-wide rows are not whole Q4_K blocks
  expect(o, out, MOE_ERR_UNSUPPORTED_TYPE, "Q4_K");
  o.experts = "q4_k";
  o.shape = "tiny";
  o.layers = 1;
  const std::string unwritable = dir.File("no/such/dir/x.gguf");
  auto r = strata::model::Synthesize(o, unwritable);
  REQUIRE_FALSE(r.ok());
  CHECK(strata::StatusToMoe(r.status()) == MOE_ERR_IO_WRITE);
  CHECK(std::string(r.status().message()).find(unwritable) != std::string::npos);
  CHECK(Listing(dir.path()).empty());
}

#ifdef STRATA_CLI_PATH
TEST_CASE("strata synth and strata tokenize on its output", "[synth][cli]") {
  TempDir dir;
  const std::string out = dir.File("t.gguf");
  const std::string cli = STRATA_CLI_PATH;
  REQUIRE(std::system((cli + " synth --shape tiny --layers 1 --codec q5_k --seed 3 --out " + out + " 2>/dev/null")
                          .c_str()) == 0);
  FILE *f = popen((cli + " tokenize --model " + out + " --text 'hello world'").c_str(), "r");
  REQUIRE(f != nullptr);
  char line[256] = {0};
  const bool got = std::fgets(line, sizeof line, f) != nullptr;
  CHECK(pclose(f) == 0);
  REQUIRE(got);
  CHECK(std::string(line).find(' ') != std::string::npos);  // two ids
  CHECK(std::system((cli + " synth --shape nope --out " + dir.File("x.gguf") + " 2>/dev/null").c_str()) != 0);
  CHECK(Listing(dir.path()) == std::vector<std::string>{"t.gguf"});
}
#endif
