// Bad models: files that parse but whose hyper-parameters disagree with their tensors, name an
// architecture Strata does not run, or lack tensors. Each is a real golden model with one thing
// changed (GGUF metadata rewritten, a tensor dropped, config.json edited); opening it must fail with
// the right moe_status and a message naming the problem, and never crash.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "nlohmann/json.hpp"
#include "tests/format/format_test_util.h"

namespace {

using strata::format::GgufFile;
using strata::format::GgufType;
using strata::format::GgufValue;
using strata::format::testing::TempDir;

const std::string kGolden = std::string(STRATA_SOURCE_DIR) + "/tests/golden/";

struct Edit {
  std::map<std::string, GgufValue> set;   // keys to add or replace
  std::vector<std::string> drop_keys;
  std::vector<std::string> drop_tensors;
  std::map<std::string, float> poison;    // F32 tensor -> value written over one of its elements
};

void Put(std::string &out, const void *p, size_t n) { out.append(static_cast<const char *>(p), n); }
void PutU32(std::string &out, uint32_t v) { Put(out, &v, 4); }
void PutU64(std::string &out, uint64_t v) { Put(out, &v, 8); }
void PutStr(std::string &out, const std::string &s) {
  PutU64(out, s.size());
  out += s;
}

void PutValue(std::string &out, const GgufValue &v) {
  switch (v.type) {
    case GgufType::kUint32: { uint32_t x = static_cast<uint32_t>(v.u); Put(out, &x, 4); break; }
    case GgufType::kInt32: { int32_t x = static_cast<int32_t>(v.i); Put(out, &x, 4); break; }
    case GgufType::kUint64: PutU64(out, v.u); break;
    case GgufType::kFloat32: { float x = static_cast<float>(v.f); Put(out, &x, 4); break; }
    case GgufType::kBool: out.push_back(v.u ? 1 : 0); break;
    case GgufType::kString: PutStr(out, v.s); break;
    default: FAIL("golden GGUF has a value type this rewriter does not handle");
  }
}

GgufValue U32(uint32_t x) { GgufValue v; v.type = GgufType::kUint32; v.u = x; return v; }
GgufValue F32(float x) { GgufValue v; v.type = GgufType::kFloat32; v.f = x; return v; }
GgufValue Str(const std::string &s) { GgufValue v; v.type = GgufType::kString; v.s = s; return v; }

// Rewrites golden GGUF `src` with `e` applied, copying tensor data, into `dst`.
void Rewrite(const std::string &src, const std::string &dst, const Edit &e) {
  auto file = strata::format::File::Open(src);
  REQUIRE(file.ok());
  auto g = strata::format::ParseGguf(**file);
  REQUIRE(g.ok());
  std::vector<std::pair<std::string, GgufValue>> kv;
  for (const auto &[k, v] : g->kv) {
    if (std::find(e.drop_keys.begin(), e.drop_keys.end(), k) != e.drop_keys.end()) continue;
    auto it = e.set.find(k);
    kv.emplace_back(k, it != e.set.end() ? it->second : v);
  }
  for (const auto &[k, v] : e.set) {
    if (g->Find(k) == nullptr) kv.emplace_back(k, v);
  }
  std::vector<const strata::format::GgufTensorInfo *> tensors;
  for (const auto &t : g->tensors) {
    if (std::find(e.drop_tensors.begin(), e.drop_tensors.end(), t.name) == e.drop_tensors.end()) {
      tensors.push_back(&t);
    }
  }
  std::string out = "GGUF";
  PutU32(out, 3);
  PutU64(out, tensors.size());
  PutU64(out, kv.size());
  for (const auto &[k, v] : kv) {
    PutStr(out, k);
    PutU32(out, static_cast<uint32_t>(v.type));
    PutValue(out, v);
  }
  uint64_t off = 0;
  for (const auto *t : tensors) {
    PutStr(out, t->name);
    PutU32(out, static_cast<uint32_t>(t->n_dims));
    for (int d = 0; d < t->n_dims; ++d) PutU64(out, static_cast<uint64_t>(t->ne[d]));
    PutU32(out, t->type);
    PutU64(out, off);
    off += (t->nbytes + 31) / 32 * 32;
  }
  out.resize((out.size() + 31) / 32 * 32, '\0');
  for (const auto *t : tensors) {
    std::string data(t->nbytes, '\0');
    REQUIRE((*file)->ReadAt(t->offset, data.data(), t->nbytes).ok());
    if (auto it = e.poison.find(t->name); it != e.poison.end()) {
      REQUIRE(t->type == 0);  // F32
      const size_t n = t->nbytes / sizeof(float);
      std::memcpy(&data[(n / 2) * sizeof(float)], &it->second, sizeof(float));
    }
    out += data;
    out.resize((out.size() + 31) / 32 * 32, '\0');
  }
  std::ofstream(dst, std::ios::binary) << out;
}

// Opens `path` through the C ABI; returns the status and leaves the message in `msg`.
moe_status OpenStatus(const std::string &path, std::string *msg) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = path.c_str();
  moe_ctx *ctx = nullptr;
  moe_status st = moe_ctx_open(&p, &ctx);
  *msg = moe_last_error();
  if (st == MOE_OK) moe_ctx_close(ctx);
  else REQUIRE(ctx == nullptr);
  return st;
}

struct GgufCase {
  const char *name;
  const char *golden;  // case dir
  Edit edit;
  moe_status want;
  const char *mention;  // the message must contain this
};

// A Hugging Face checkpoint whose config.json is edited (the safetensors copied beside it).
struct ConfigCase {
  const char *name;
  const char *golden;  // case dir (its hf/ checkpoint)
  std::function<void(nlohmann::json &)> edit;
  moe_status want;
  const char *mention;
};

// Opening `path` fails with `want` and a message that contains `mention`.
void ExpectRefused(const std::string &path, const char *name, moe_status want, const char *mention) {
  std::string msg;
  moe_status st = OpenStatus(path, &msg);
  INFO(name << ": " << moe_status_string(st) << ": " << msg);
  CHECK(st == want);
  CHECK(msg.find(mention) != std::string::npos);
}

// Each case's golden `file` rewritten with its edit is refused as the case says.
void ExpectGgufRefused(const std::vector<GgufCase> &cases, const char *file, TempDir &tmp) {
  for (const auto &c : cases) {
    const std::string dst = tmp.File("bad.gguf");
    Rewrite(kGolden + c.golden + "/" + file, dst, c.edit);
    ExpectRefused(dst, c.name, c.want, c.mention);
  }
}

// Each case's checkpoint with its config.json edited is refused as the case says.
void ExpectConfigRefused(const std::vector<ConfigCase> &cases, TempDir &tmp) {
  for (const auto &c : cases) {
    const std::string src = kGolden + c.golden + "/hf";
    const std::string dir = tmp.File(std::string("cfg_") + std::to_string(&c - cases.data()));
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors");
    std::ifstream in(src + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    c.edit(cfg);
    std::ofstream(dir + "/config.json") << cfg.dump(2);
    ExpectRefused(dir, c.name, c.want, c.mention);
  }
}

}  // namespace

TEST_CASE("GGUF models whose metadata disagrees with their tensors are refused", "[model][bad-input]") {
  const std::vector<GgufCase> cases = {
      {"one layer more than the file has", "qwen3moe_f32", {{{"qwen3moe.block_count", U32(4)}}, {}, {}},
       MOE_ERR_FORMAT_TENSOR, "blk.3."},
      {"embedding width disagrees", "qwen3moe_f32", {{{"qwen3moe.embedding_length", U32(32)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "token_embd.weight"},
      {"expert count disagrees with the router", "qwen3moe_f32", {{{"qwen3moe.expert_count", U32(4)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "ffn_gate_inp"},
      {"more experts used than exist", "qwen3moe_f32", {{{"qwen3moe.expert_used_count", U32(9)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "expert_used_count"},
      {"heads not a multiple of kv heads", "qwen3moe_f32", {{{"qwen3moe.attention.head_count", U32(3)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "head_count"},
      {"odd head dimension", "qwen3moe_f32",
       {{{"qwen3moe.attention.key_length", U32(15)}, {"qwen3moe.attention.value_length", U32(15)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "odd"},
      {"absurd layer count", "qwen3moe_f32", {{{"qwen3moe.block_count", U32(1u << 31)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "block_count"},
      {"zero epsilon", "qwen3moe_f32", {{{"qwen3moe.attention.layer_norm_rms_epsilon", F32(0.f)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "epsilon"},
      {"expert ffn width disagrees", "qwen3moe_f32",
       {{{"qwen3moe.expert_feed_forward_length", U32(64)}}, {}, {}}, MOE_ERR_FORMAT_HPARAMS, "ffn_gate_exps"},
      {"missing architecture", "qwen3moe_f32", {{}, {"general.architecture"}, {}}, MOE_ERR_FORMAT_HPARAMS,
       "general.architecture"},
      {"unknown architecture", "qwen3moe_f32", {{{"general.architecture", Str("gpt2")}}, {}, {}},
       MOE_ERR_UNSUPPORTED_ARCH, "gpt2"},
      {"dense llama", "mixtral_f32", {{}, {"llama.expert_count"}, {}}, MOE_ERR_UNSUPPORTED_ARCH, "dense"},
      {"vocab_size disagrees with the embedding", "mixtral_f32", {{{"llama.vocab_size", U32(300)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "vocab_size"},
      {"missing attention tensor", "mixtral_f32", {{}, {}, {"blk.1.attn_q.weight"}}, MOE_ERR_FORMAT_TENSOR,
       "blk.1.attn_q.weight"},
      {"missing expert tensor", "qwen3moe_f32", {{}, {}, {"blk.0.ffn_down_exps.weight"}}, MOE_ERR_FORMAT_TENSOR,
       "blk.0.ffn_down_exps.weight"},
      {"missing q norm", "qwen3moe_f32", {{}, {}, {"blk.2.attn_q_norm.weight"}}, MOE_ERR_FORMAT_TENSOR,
       "attn_q_norm"},
      {"missing required key", "mixtral_f32", {{}, {"llama.attention.layer_norm_rms_epsilon"}, {}},
       MOE_ERR_FORMAT_HPARAMS, "layer_norm_rms_epsilon"},
      {"scaled RoPE", "qwen3moe_f32", {{{"qwen3moe.rope.scaling.type", Str("yarn")}}, {}, {}},
       MOE_ERR_UNSUPPORTED, "yarn"},
  };
  TempDir tmp;
  ExpectGgufRefused(cases, "model-q8_0.gguf", tmp);
  // The unedited rewrite opens: the cases above fail for their edit alone.
  Rewrite(kGolden + "qwen3moe_f32/model-q8_0.gguf", tmp.File("ok.gguf"), {});
  std::string msg;
  CHECK(OpenStatus(tmp.File("ok.gguf"), &msg) == MOE_OK);
}

TEST_CASE("HF checkpoints with a bad config.json are refused", "[model][bad-input]") {
  struct QwenCase {
    const char *name;
    std::function<void(nlohmann::json &)> edit;
    moe_status want;
    const char *mention;
  };
  const std::vector<QwenCase> qwen = {
      {"unknown model_type", [](auto &c) { c["model_type"] = "bert"; }, MOE_ERR_UNSUPPORTED_ARCH, "bert"},
      {"no model_type", [](auto &c) { c.erase("model_type"); }, MOE_ERR_FORMAT_CONFIG, "model_type"},
      {"no hidden_size", [](auto &c) { c.erase("hidden_size"); }, MOE_ERR_FORMAT_HPARAMS, "hidden_size"},
      {"hidden_size a string", [](auto &c) { c["hidden_size"] = "64"; }, MOE_ERR_FORMAT_HPARAMS, "hidden_size"},
      {"hidden size disagrees", [](auto &c) { c["hidden_size"] = 128; }, MOE_ERR_FORMAT_HPARAMS,
       "model.embed_tokens.weight"},
      {"more layers than tensors", [](auto &c) { c["num_hidden_layers"] = 5; }, MOE_ERR_FORMAT_TENSOR,
       "model.layers.3."},
      {"negative expert count", [](auto &c) { c["num_local_experts"] = -8; }, MOE_ERR_FORMAT_HPARAMS,
       "num_local_experts"},
      {"no rope theta", [](auto &c) { c.erase("rope_parameters"); c.erase("rope_theta"); }, MOE_ERR_FORMAT_HPARAMS,
       "rope_theta"},
      {"unsupported activation", [](auto &c) { c["hidden_act"] = "gelu"; }, MOE_ERR_UNSUPPORTED, "gelu"},
      {"vocab disagrees", [](auto &c) { c["vocab_size"] = 1000; }, MOE_ERR_FORMAT_HPARAMS, "embed_tokens"},
  };
  std::vector<ConfigCase> cases;
  for (const auto &q : qwen) cases.push_back({q.name, "qwen3moe_f32", q.edit, q.want, q.mention});
  TempDir tmp;
  ExpectConfigRefused(cases, tmp);
  const std::string src = kGolden + "qwen3moe_f32/hf";
  // Not JSON at all.
  const std::string dir = tmp.File("notjson");
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors");
  std::ofstream(dir + "/config.json") << "{\"model_type\": \"qwen3_moe\",";
  std::string msg;
  CHECK(MOE_STATUS_CATEGORY(OpenStatus(dir, &msg)) == MOE_ERR_FORMAT);
  CHECK(msg.find("config.json") != std::string::npos);
}

TEST_CASE("a tokenizer larger than the model's vocabulary is refused, and no tokenizer is reported", "[model][bad-input]") {
  TempDir tmp;
  const std::string src = kGolden + "qwen3moe_f32/hf";
  const std::string dir = tmp.File("ck");
  std::filesystem::create_directories(dir);
  for (const char *f : {"config.json", "model.safetensors"}) std::filesystem::copy_file(src + "/" + f, dir + "/" + f);
  // A 1138-token tokenizer (tests/text fixtures) on a 256-token model.
  std::filesystem::copy_file(std::string(STRATA_SOURCE_DIR) + "/tests/text/fixtures/gpt2/tokenizer.json",
                             dir + "/tokenizer.json");
  std::string msg;
  CHECK(OpenStatus(dir, &msg) == MOE_ERR_FORMAT_HPARAMS);
  CHECK(msg.find("tokenizer") != std::string::npos);
  // A malformed tokenizer.json fails the open too, naming the problem.
  std::ofstream(dir + "/tokenizer.json") << "{\"model\": 3}";
  CHECK(MOE_STATUS_CATEGORY(OpenStatus(dir, &msg)) == MOE_ERR_FORMAT);
  // Without one, text calls answer MOE_ERR_UNSUPPORTED and the model still runs on token ids.
  std::filesystem::remove(dir + "/tokenizer.json");
  moe_params p;
  moe_params_init(&p);
  p.model_path = dir.c_str();
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  size_t n = 99;
  int32_t ids[4];
  CHECK(moe_tokenize(ctx, "hi", 2, 0, ids, 4, &n) == MOE_ERR_UNSUPPORTED);
  CHECK(std::string(moe_last_error()).find("tokenizer") != std::string::npos);
  char buf[8];
  CHECK(moe_token_to_piece(ctx, 1, buf, sizeof buf, &n) == MOE_ERR_UNSUPPORTED);
  CHECK(moe_ctx_token_bos(ctx) == -1);
  CHECK(moe_ctx_token_eos(ctx) == -1);
  moe_ctx_close(ctx);
}

TEST_CASE("malformed DeepSeek and gpt-oss files are refused with the reason", "[model][bad-input][families]") {
  const std::vector<GgufCase> cases = {
      {"missing kv_a norm", "deepseek2_f32", {{}, {}, {"blk.1.attn_kv_a_norm.weight"}}, MOE_ERR_FORMAT_TENSOR,
       "blk.1.attn_kv_a_norm.weight"},
      {"kv LoRA rank disagrees", "deepseek2_f32", {{{"deepseek2.attention.kv_lora_rank", U32(16)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "attn_kv_a_mqa"},
      {"q LoRA rank disagrees", "deepseek2_f32", {{{"deepseek2.attention.q_lora_rank", U32(24)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "attn_q_a"},
      {"experts not a multiple of the groups", "deepseek2_f32",
       {{{"deepseek2.expert_group_count", U32(3)}, {"deepseek2.expert_group_used_count", U32(1)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "expert_group_count"},
      {"unknown gating function", "deepseek3_f32", {{{"deepseek2.expert_gating_func", U32(7)}}, {}, {}},
       MOE_ERR_UNSUPPORTED, "expert_gating_func"},
      {"odd rope dimension", "deepseek3_f32", {{{"deepseek2.rope.dimension_count", U32(7)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "qk_rope_head_dim"},
      {"more dense layers than layers", "deepseek3_f32", {{{"deepseek2.leading_dense_block_count", U32(9)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "leading_dense_block_count"},
      {"missing selection bias", "deepseek3_f32", {{}, {}, {"blk.1.exp_probs_b.bias"}}, MOE_ERR_FORMAT_TENSOR,
       "blk.1.exp_probs_b.bias"},
      {"missing shared expert", "deepseek3_f32", {{}, {}, {"blk.2.ffn_up_shexp.weight"}}, MOE_ERR_FORMAT_TENSOR,
       "blk.2.ffn_up_shexp.weight"},
      {"split latent projection without v_b", "deepseek2lite_f32", {{}, {}, {"blk.0.attn_v_b.weight"}},
       MOE_ERR_FORMAT_TENSOR, "blk.0.attn_v_b.weight"},
      {"unknown RoPE scaling", "deepseek3_f32", {{{"deepseek2.rope.scaling.type", Str("longrope")}}, {}, {}},
       MOE_ERR_UNSUPPORTED, "longrope"},
      {"missing attention sinks", "gptoss_f32", {{}, {}, {"blk.1.attn_sinks.weight"}}, MOE_ERR_FORMAT_TENSOR,
       "blk.1.attn_sinks.weight"},
      {"missing expert bias", "gptoss_f32", {{}, {}, {"blk.0.ffn_down_exps.bias"}}, MOE_ERR_FORMAT_TENSOR,
       "blk.0.ffn_down_exps.bias"},
      {"expert width disagrees", "gptoss_f32", {{{"gpt-oss.expert_feed_forward_length", U32(64)}}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "ffn_gate_exps"},
  };
  TempDir tmp;
  ExpectGgufRefused(cases, "model-f32.gguf", tmp);
  for (const char *g : {"deepseek2_f32", "deepseek2lite_f32", "deepseek3_f32", "gptoss_f32"}) {
    Rewrite(kGolden + g + "/model-f32.gguf", tmp.File("ok.gguf"), {});
    std::string msg;
    INFO(g << ": " << msg);
    CHECK(OpenStatus(tmp.File("ok.gguf"), &msg) == MOE_OK);
  }
  // HF configs of the same families.
  const std::vector<ConfigCase> cfg_cases = {
      {"kv LoRA rank disagrees", "deepseek3_f32", [](auto &c) { c["kv_lora_rank"] = 16; }, MOE_ERR_FORMAT_HPARAMS,
       "kv_a_proj_with_mqa"},
      {"unknown top-k method", "deepseek2_f32", [](auto &c) { c["topk_method"] = "noaux"; }, MOE_ERR_UNSUPPORTED,
       "noaux"},
      {"unknown RoPE scaling", "deepseek3_f32", [](auto &c) { c["rope_parameters"]["rope_type"] = "longrope"; },
       MOE_ERR_UNSUPPORTED, "longrope"},
      {"YaRN without original context", "deepseek3_f32",
       [](auto &c) { c["rope_parameters"].erase("original_max_position_embeddings"); }, MOE_ERR_FORMAT_HPARAMS,
       "original_max_position_embeddings"},
      {"other SwiGLU alpha", "gptoss_f32", [](auto &c) { c["swiglu_alpha"] = 1.0; }, MOE_ERR_UNSUPPORTED, "alpha"},
      {"layer types of another length", "gptoss_f32", [](auto &c) { c["layer_types"].push_back("full_attention"); },
       MOE_ERR_FORMAT_HPARAMS, "layer_types"},
  };
  TempDir cfg_tmp;
  ExpectConfigRefused(cfg_cases, cfg_tmp);
}

// Hyper-parameters inside each type's range but absurd for a model: products that overflow int,
// floats that turn every logit into NaN, a layer count that disagrees with the tensors. Each
// names the key (or the tensor) and the value.
TEST_CASE("absurd hyper-parameters, layer counts and non-finite weights are refused", "[model][bad-input][hparams]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<GgufCase> q8 = {
      {"fewer layers declared than the file has", "qwen3moe_f32", {{{"qwen3moe.block_count", U32(2)}}, {}, {}, {}},
       MOE_ERR_FORMAT_TENSOR, "blk.2."},
      {"epsilon not small", "qwen3moe_f32", {{{"qwen3moe.attention.layer_norm_rms_epsilon", F32(0.5f)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "layer_norm_rms_epsilon"},
      {"infinite epsilon", "qwen3moe_f32", {{{"qwen3moe.attention.layer_norm_rms_epsilon", F32(inf)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "inf"},
      {"NaN RoPE base", "qwen3moe_f32", {{{"qwen3moe.rope.freq_base", F32(nan)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "rope.freq_base"},
  };
  TempDir tmp;
  ExpectGgufRefused(q8, "model-q8_0.gguf", tmp);
  const std::vector<GgufCase> f32 = {
      {"NaN in a norm vector", "qwen3moe_f32", {{}, {}, {}, {{"blk.1.attn_norm.weight", nan}}},
       MOE_ERR_FORMAT_TENSOR, "blk.1.attn_norm.weight"},
      {"Inf in the output norm", "mixtral_f32", {{}, {}, {}, {{"output_norm.weight", -inf}}},
       MOE_ERR_FORMAT_TENSOR, "output_norm.weight"},
      {"Inf in an attention bias", "gptoss_f32", {{}, {}, {}, {{"blk.0.attn_q.bias", inf}}},
       MOE_ERR_FORMAT_TENSOR, "blk.0.attn_q.bias"},
      {"NaN in an expert bias", "gptoss_f32", {{}, {}, {}, {{"blk.1.ffn_down_exps.bias", nan}}},
       MOE_ERR_FORMAT_TENSOR, "blk.1.ffn_down_exps.bias"},
      // 2^28 shared experts of width 16: the product is 2^32, 0 in 32 bits.
      {"shared expert width overflows", "deepseek3_f32", {{{"deepseek2.expert_shared_count", U32(1u << 28)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "expert_shared_count"},
      {"absurd YaRN factor", "deepseek3_f32", {{{"deepseek2.rope.scaling.factor", F32(1e30f)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "factor"},
      {"infinite YaRN beta", "deepseek3_f32", {{{"deepseek2.rope.scaling.yarn_beta_fast", F32(inf)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "beta_fast"},
      {"NaN YaRN log multiplier", "deepseek3_f32", {{{"deepseek2.rope.scaling.yarn_log_multiplier", F32(nan)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "yarn_log_multiplier"},
      {"YaRN original context beyond any context", "deepseek3_f32",
       {{{"deepseek2.rope.scaling.original_context_length", U32(0x7fffffff)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "original_context_length"},
      {"absurd routed scale", "deepseek3_f32", {{{"deepseek2.expert_weights_scale", F32(1e30f)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "expert_weights_scale"},
      {"fewer layers declared than the file has (MLA)", "deepseek3_f32", {{{"deepseek2.block_count", U32(2)}}, {}, {}, {}},
       MOE_ERR_FORMAT_TENSOR, "blk.2."},
      {"absurd sliding window", "gptoss_f32", {{{"gpt-oss.attention.sliding_window", U32(0x7fffffff)}}, {}, {}, {}},
       MOE_ERR_FORMAT_HPARAMS, "sliding_window"},
  };
  ExpectGgufRefused(f32, "model-f32.gguf", tmp);

  const std::vector<ConfigCase> cfg = {
      {"fewer layers declared than the checkpoint has", "qwen3moe_f32", [](auto &c) { c["num_hidden_layers"] = 2; },
       MOE_ERR_FORMAT_TENSOR, "model.layers.2."},
      {"shared expert width overflows", "deepseek3_f32", [](auto &c) { c["n_shared_experts"] = 1 << 28; },
       MOE_ERR_FORMAT_HPARAMS, "n_shared_experts"},
      {"absurd YaRN factor", "deepseek3_f32", [](auto &c) { c["rope_parameters"]["factor"] = 1e30; },
       MOE_ERR_FORMAT_HPARAMS, "factor"},
      {"YaRN beta beyond float", "deepseek3_f32", [](auto &c) { c["rope_parameters"]["beta_fast"] = 1e300; },
       MOE_ERR_FORMAT_HPARAMS, "beta_fast"},
      {"negative YaRN mscale", "deepseek3_f32", [](auto &c) { c["rope_parameters"]["mscale_all_dim"] = -1e6; },
       MOE_ERR_FORMAT_HPARAMS, "mscale_all_dim"},
      {"RoPE theta beyond float", "deepseek3_f32", [](auto &c) { c["rope_parameters"]["rope_theta"] = 1e300; },
       MOE_ERR_FORMAT_HPARAMS, "rope_theta"},
      {"absurd attention factor", "gptoss_f32", [](auto &c) { c["rope_parameters"]["attention_factor"] = -3.0; },
       MOE_ERR_FORMAT_HPARAMS, "attention_factor"},
      {"infinite SwiGLU limit", "gptoss_f32", [](auto &c) { c["swiglu_limit"] = 1e300; },
       MOE_ERR_FORMAT_HPARAMS, "swiglu_limit"},
      {"absurd routed scale", "deepseek3_f32", [](auto &c) { c["routed_scaling_factor"] = 1e30; },
       MOE_ERR_FORMAT_HPARAMS, "routed_scaling_factor"},
      {"epsilon not small", "qwen3moe_f32", [](auto &c) { c["rms_norm_eps"] = 0.5; },
       MOE_ERR_FORMAT_HPARAMS, "rms_norm_eps"},
  };
  TempDir cfg_tmp;
  ExpectConfigRefused(cfg, cfg_tmp);
}

TEST_CASE("messages that echo a file's strings escape NUL, control bytes and invalid UTF-8", "[model][bad-input]") {
  TempDir tmp;
  // An architecture name with a NUL inside, a byte that is never UTF-8, and a terminal escape.
  const std::string arch = std::string("gpt\0\xff\x1b[2Jx", 10);
  Rewrite(kGolden + "qwen3moe_f32/model-q8_0.gguf", tmp.File("a.gguf"), {{{"general.architecture", Str(arch)}}, {}, {}, {}});
  std::string msg;
  CHECK(OpenStatus(tmp.File("a.gguf"), &msg) == MOE_ERR_UNSUPPORTED_ARCH);
  INFO(msg);
  CHECK(msg.find("gpt\\x00\\xff\\x1b[2Jx") != std::string::npos);  // whole: not cut at the NUL
  // HF: a config.json with invalid UTF-8 and a terminal escape in a string; the parser's message
  // quotes the bytes it read.
  const std::string dir = tmp.File("ck");
  std::filesystem::create_directories(dir);
  const std::string src = kGolden + "qwen3moe_f32/hf";
  std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors");
  std::ifstream in(src + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find("qwen3_moe");
  REQUIRE(at != std::string::npos);
  text.replace(at, 9, "qwen3\x1b[2J\xff");
  std::ofstream(dir + "/config.json") << text;
  CHECK(MOE_STATUS_CATEGORY(OpenStatus(dir, &msg)) == MOE_ERR_FORMAT);
  INFO(msg);
  CHECK(msg.find("config.json") != std::string::npos);
  CHECK(msg.find('\x1b') == std::string::npos);
  CHECK(msg.find('\xff') == std::string::npos);
}
