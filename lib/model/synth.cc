// Synthetic models: plan the tensors of the shape (llama.cpp names, 3-D expert tensors), write the
// metadata through pack's llama.cpp helpers plus a synthetic tokenizer, then stream the data: F32
// vectors drawn value by value, quantized matrices assembled from a per-codec pool of valid blocks.
// Everything random comes from SplitMix64 streams keyed by (seed, tensor, run), so the output does not
// depend on chunk sizes and the same options give the same bytes.
#include "lib/util/str_format.h"
#include "lib/util/hash_containers.h"
#include "lib/model/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "lib/format/gguf_writer.h"
#include "lib/model/pack.h"
#include "lib/quant/codec.h"

namespace strata::model {
namespace {

using format::GgufType;
using quant::TypeId;

// ---- random numbers --------------------------------------------------------------------------

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Mix(uint64_t a, uint64_t b) { return SplitMix(a ^ SplitMix(b + 0x632BE59BD9B4E019ull)); }

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() { return SplitMix(s_++ * 0xD1B54A32D192ED03ull); }
  double Uniform() { return static_cast<double>((Next() >> 11) + 1) * 0x1.0p-53; }  // (0, 1]
  // Box-Muller; libm's log/cos make it bit-reproducible on one platform (what the tests compare).
  float Normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(Uniform())), t = 6.283185307179586 * Uniform();
    spare_ = static_cast<float>(r * std::sin(t));
    have_spare_ = true;
    return static_cast<float>(r * std::cos(t));
  }

 private:
  uint64_t s_;
  bool have_spare_ = false;
  float spare_ = 0;
};

// ---- block pools -----------------------------------------------------------------------------

// Units of kUnitElems values (a whole number of blocks of every codec synth accepts) quantized once;
// kPoolUnits is prime so any multiplier 1..kPoolUnits-1 permutes the pool.
constexpr int64_t kUnitElems = 256;
constexpr uint64_t kPoolUnits = 509;
constexpr float kMatrixStd = 0.02f;
constexpr float kSpreadEmbdStd = 1.0f, kSpreadOutStd = 0.002f;  // token_embd and attn_output, "spread" routing
// "skewed" routing: spread's stream, each router row scaled by exp(kRouterSkew N(0, 1)), so experts
// with larger rows win more selections (calibrated on the Qwen3-30B-A3B shape: see synth.h).
constexpr float kRouterSkew = 0.45f;
constexpr uint64_t kChunkBytes = uint64_t{8} << 20;

struct Pool {
  uint64_t unit_bytes = 0;
  std::vector<uint8_t> bytes;  // kPoolUnits units
};

// Codecs whose blocks synth draws directly (the lattice i-quants, whose lattice searches are slow and
// for three of them need importance weights): random codes under a block scale d set so that the
// block's values have the pool's spread.
bool DrawnBlocks(TypeId t) {
  switch (t) {
    case TypeId::kIQ2_XXS: case TypeId::kIQ2_XS: case TypeId::kIQ2_S: case TypeId::kIQ3_XXS:
    case TypeId::kIQ3_S: case TypeId::kIQ1_S: case TypeId::kIQ1_M: return true;
    default: return false;
  }
}

// Writes the f16 block scale h into a drawn block: its first two bytes, or for IQ1_M the top
// nibbles of its four u16 scales at byte 48.
void SetBlockScale(TypeId t, uint8_t *block, uint16_t h) {
  if (t == TypeId::kIQ1_M) {
    quant::SetIQ1_MScaleBits(block, h);
  } else {
    std::memcpy(block, &h, 2);
  }
}

Pool MakePool(const quant::Codec &c, float std_dev, uint64_t seed) {
  // Pools of another scale draw other values (not the default pool scaled).
  uint64_t stream = Mix(seed, 0x706F6F6C0000ull + static_cast<uint64_t>(c.id));
  if (std_dev != kMatrixStd) {
    uint32_t bits;
    std::memcpy(&bits, &std_dev, sizeof bits);
    stream = Mix(stream, bits);
  }
  Rng rng(stream);
  Pool p;
  p.unit_bytes = static_cast<uint64_t>(kUnitElems / c.block_elems * c.block_bytes);
  p.bytes.resize(p.unit_bytes * kPoolUnits);
  if (DrawnBlocks(c.id)) {  // one block a unit
    std::vector<float> v(static_cast<size_t>(kUnitElems));
    for (uint64_t u = 0; u < kPoolUnits; ++u) {
      uint8_t *b = p.bytes.data() + u * p.unit_bytes;
      for (uint64_t i = 0; i < p.unit_bytes; ++i) b[i] = static_cast<uint8_t>(rng.Next());
      SetBlockScale(c.id, b, quant::FloatToHalf(1.0f));
      c.dequantize(b, v.data(), kUnitElems);
      double ss = 0;
      for (float x : v) ss += static_cast<double>(x) * x;
      const double rms = std::sqrt(ss / kUnitElems);
      const float d = rms > 0 ? static_cast<float>(std_dev / rms) : std_dev;
      SetBlockScale(c.id, b, quant::FloatToHalf((rng.Next() & 1) != 0 ? -d : d));
    }
    return p;
  }
  std::vector<float> vals(kPoolUnits * kUnitElems);
  for (float &v : vals) v = std_dev * rng.Normal();
  c.quantize(vals.data(), p.bytes.data(), static_cast<int64_t>(vals.size()));
  return p;
}

// ---- the plan --------------------------------------------------------------------------------

enum class Fill { kNorm, kRouter, kBias, kPool };

// Scales of the F32 vectors that are not norms: attention, router and expert biases (gpt-oss),
// DeepSeek's selection bias (added to sigmoid scores in (0, 1)), and gpt-oss's per-head sink logits.
constexpr float kBiasStd = 0.1f, kSelectBiasStd = 0.02f, kSinkStd = 1.0f;

struct Tensor {
  std::string name;
  TypeId type = TypeId::kF32;
  int n_dims = 1;
  int64_t ne[4] = {1, 1, 1, 1};
  Fill fill = Fill::kNorm;
  float std_dev = kMatrixStd;  // of a pooled matrix's values, or a bias's
  float row_skew = 0;          // a router's rows scaled by exp(row_skew N(0, 1)), each its own draw
  bool expert = false;
  int layer = -1;              // blk.N, or -1 outside the layers
};

// The first min(n_dense_lead, n_layer - 1) layers are dense (see SynthShape).
int DenseLead(const SynthShape &s) { return std::max(0, std::min(s.n_dense_lead, s.n_layer - 1)); }

std::vector<Tensor> PlanTensors(const SynthShape &s, TypeId experts, TypeId attention, bool spread, float skew) {
  std::vector<Tensor> t;
  int layer = -1;
  auto vec = [&](std::string name, int64_t n, Fill fill = Fill::kNorm, float std_dev = 0) {
    Tensor x;
    x.name = std::move(name);
    x.ne[0] = n;
    x.fill = fill;
    if (fill == Fill::kBias) x.std_dev = std_dev;
    x.layer = layer;
    t.push_back(std::move(x));
  };
  // (rows, cols) matrix: ne = [cols, rows]; with n_expert > 0 a (n_expert, rows, cols) stack.
  auto mat = [&](std::string name, int64_t rows, int64_t cols, TypeId type, Fill fill, int64_t n_expert = 0) {
    Tensor x;
    x.name = std::move(name);
    x.type = type;
    x.fill = fill;
    x.n_dims = n_expert > 0 ? 3 : 2;
    x.ne[0] = cols;
    x.ne[1] = rows;
    x.ne[2] = n_expert > 0 ? n_expert : 1;
    x.expert = n_expert > 0;
    x.layer = layer;
    t.push_back(std::move(x));
  };
  // F32 biases of a stack of experts: (n_expert, n) as ne = [n, n_expert].
  auto bias2 = [&](std::string name, int64_t n, int64_t n_expert) {
    vec(std::move(name), n, Fill::kBias, kBiasStd);
    t.back().n_dims = 2;
    t.back().ne[1] = n_expert;
  };
  const int64_t q_dim = int64_t{s.n_head} * s.head_dim, kv_dim = int64_t{s.n_head_kv} * s.head_dim;
  const bool olmoe = s.arch == "olmoe", qwen = s.arch == "qwen3moe", deepseek = s.arch == "deepseek2",
             gptoss = s.arch == "gpt-oss";
  const int dense_lead = DenseLead(s);
  mat("token_embd.weight", s.n_vocab, s.n_embd, attention, Fill::kPool);                  // (n_vocab, n_embd)
  if (spread) t.back().std_dev = kSpreadEmbdStd;
  for (int l = 0; l < s.n_layer; ++l) {
    layer = l;
    auto n = [l](const char *what) { return strata::StrFormat("blk.%d.%s.weight", l, what); };
    auto b = [l](const char *what) { return strata::StrFormat("blk.%d.%s.bias", l, what); };
    vec(n("attn_norm"), s.n_embd);
    if (deepseek) {  // multi-head latent attention, as llama.cpp's converter splits kv_b into k_b and v_b
      const int64_t qk_nope = s.head_dim - s.qk_rope_dim;
      mat(n("attn_q_a"), s.q_lora_rank, s.n_embd, attention, Fill::kPool);                 // (q_lora, n_embd)
      vec(n("attn_q_a_norm"), s.q_lora_rank);
      mat(n("attn_q_b"), q_dim, s.q_lora_rank, attention, Fill::kPool);                    // (n_head * qk, q_lora)
      mat(n("attn_kv_a_mqa"), s.kv_lora_rank + s.qk_rope_dim, s.n_embd, attention, Fill::kPool);
      vec(n("attn_kv_a_norm"), s.kv_lora_rank);
      mat(n("attn_k_b"), s.kv_lora_rank, qk_nope, attention, Fill::kPool, s.n_head);        // (n_head, kv_lora, nope)
      t.back().expert = false;
      mat(n("attn_v_b"), s.v_head_dim, s.kv_lora_rank, attention, Fill::kPool, s.n_head);   // (n_head, v_head, kv_lora)
      t.back().expert = false;
      mat(n("attn_output"), s.n_embd, int64_t{s.n_head} * s.v_head_dim, attention, Fill::kPool);
    } else {
      mat(n("attn_q"), q_dim, s.n_embd, attention, Fill::kPool);                            // (q_dim, n_embd)
      mat(n("attn_k"), kv_dim, s.n_embd, attention, Fill::kPool);                           // (kv_dim, n_embd)
      mat(n("attn_v"), kv_dim, s.n_embd, attention, Fill::kPool);                           // (kv_dim, n_embd)
      mat(n("attn_output"), s.n_embd, q_dim, attention, Fill::kPool);                       // (n_embd, q_dim)
    }
    if (spread) t.back().std_dev = kSpreadOutStd;
    if (qwen) {  // per-head RMS norms
      vec(n("attn_q_norm"), s.head_dim);
      vec(n("attn_k_norm"), s.head_dim);
    } else if (olmoe) {  // over the whole projection
      vec(n("attn_q_norm"), q_dim);
      vec(n("attn_k_norm"), kv_dim);
    } else if (gptoss) {
      vec(b("attn_q"), q_dim, Fill::kBias, kBiasStd);
      vec(b("attn_k"), kv_dim, Fill::kBias, kBiasStd);
      vec(b("attn_v"), kv_dim, Fill::kBias, kBiasStd);
      vec(b("attn_output"), s.n_embd, Fill::kBias, kBiasStd);
      vec(n("attn_sinks"), s.n_head, Fill::kBias, kSinkStd);
    }
    vec(n(gptoss ? "post_attention_norm" : "ffn_norm"), s.n_embd);
    if (l < dense_lead) {
      mat(n("ffn_gate"), s.n_ff_dense, s.n_embd, attention, Fill::kPool);                   // (n_ff, n_embd)
      mat(n("ffn_up"), s.n_ff_dense, s.n_embd, attention, Fill::kPool);
      mat(n("ffn_down"), s.n_embd, s.n_ff_dense, attention, Fill::kPool);                   // (n_embd, n_ff)
      continue;
    }
    mat(n("ffn_gate_inp"), s.n_expert, s.n_embd, TypeId::kF32, Fill::kRouter);              // (n_expert, n_embd)
    t.back().row_skew = skew;
    if (gptoss) vec(b("ffn_gate_inp"), s.n_expert, Fill::kBias, kBiasStd);
    if (s.sigmoid_gating) vec(b("exp_probs_b"), s.n_expert, Fill::kBias, kSelectBiasStd);
    if (s.n_shared_experts > 0) {
      const int64_t ff = int64_t{s.n_shared_experts} * s.n_ff_expert;
      mat(n("ffn_gate_shexp"), ff, s.n_embd, attention, Fill::kPool);
      mat(n("ffn_up_shexp"), ff, s.n_embd, attention, Fill::kPool);
      mat(n("ffn_down_shexp"), s.n_embd, ff, attention, Fill::kPool);
    }
    mat(n("ffn_gate_exps"), s.n_ff_expert, s.n_embd, experts, Fill::kPool, s.n_expert);     // (n_expert, n_ff, n_embd)
    mat(n("ffn_down_exps"), s.n_embd, s.n_ff_expert, experts, Fill::kPool, s.n_expert);     // (n_expert, n_embd, n_ff)
    mat(n("ffn_up_exps"), s.n_ff_expert, s.n_embd, experts, Fill::kPool, s.n_expert);       // (n_expert, n_ff, n_embd)
    if (gptoss) {
      bias2(b("ffn_gate_exps"), s.n_ff_expert, s.n_expert);
      bias2(b("ffn_down_exps"), s.n_embd, s.n_expert);
      bias2(b("ffn_up_exps"), s.n_ff_expert, s.n_expert);
    }
  }
  layer = -1;
  vec("output_norm.weight", s.n_embd);
  mat("output.weight", s.n_vocab, s.n_embd, attention, Fill::kPool);                       // (n_vocab, n_embd)
  return t;
}

absl::StatusOr<TypeId> ParseCodec(const std::string &name, const char *what) {
  auto t = ParseTypeName(name);
  if (!t.ok()) return Errorf(MOE_ERR_INVALID_ARGUMENT, "%s: %s", what, t.status().message());
  if (!DrawnBlocks(*t)) STRATA_RETURN_IF_ERROR(RequireQuantizer(*t, what));
  const quant::Codec *c = quant::FindCodec(*t);
  if (kUnitElems % c->block_elems != 0) {
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "%s type %s: blocks of %d values are not supported by synth", what,
                  std::string(c->name), c->block_elems);
  }
  return *t;
}

// ---- writing ---------------------------------------------------------------------------------

// Streams one tensor's `nbytes` into the writer through `buf`.
using Pools = std::map<std::pair<TypeId, float>, Pool>;  // by codec and scale

absl::Status WriteTensor(const Tensor &t, uint64_t index, uint64_t nbytes, int n_embd, uint64_t seed,
                         const Pools &pools, std::vector<uint8_t> &buf, format::GgufWriter &w) {
  const uint64_t key = Mix(seed, index + 1);
  if (t.fill != Fill::kPool) {
    Rng rng(key);
    const float std_dev = t.fill == Fill::kRouter ? 2.0f / std::sqrt(static_cast<float>(n_embd))
                          : t.fill == Fill::kBias ? t.std_dev : 0.05f;
    const float mean = t.fill == Fill::kNorm ? 1.0f : 0.0f;
    const uint64_t n = nbytes / sizeof(float);
    std::vector<float> vals(std::min<uint64_t>(n, kChunkBytes / sizeof(float)));
    Rng row_rng(Mix(key, 0x5eed));  // the rows' scales, apart from the values' draws
    float row_std = std_dev;
    for (uint64_t at = 0; at < n; at += vals.size()) {
      const uint64_t k = std::min<uint64_t>(vals.size(), n - at);
      for (uint64_t i = 0; i < k; ++i) {
        if (t.row_skew > 0 && (at + i) % static_cast<uint64_t>(n_embd) == 0) {
          row_std = std_dev * std::exp(t.row_skew * row_rng.Normal());
        }
        vals[i] = mean + row_std * rng.Normal();
      }
      STRATA_RETURN_IF_ERROR(w.Write(vals.data(), k * sizeof(float)));
    }
    return absl::OkStatus();
  }
  const Pool &pool = pools.at({t.type, t.std_dev});
  const uint64_t ub = pool.unit_bytes;
  const uint64_t units_per_chunk = std::max<uint64_t>(1, kChunkBytes / ub);
  buf.resize(units_per_chunk * ub);
  uint64_t unit = 0, idx = 0, step = 1;
  for (uint64_t at = 0; at < nbytes;) {
    const uint64_t want = std::min<uint64_t>(buf.size(), nbytes - at);
    uint8_t *dst = buf.data();
    for (uint64_t filled = 0; filled < want; ++unit) {
      if (unit % kPoolUnits == 0) {  // a new run: a fresh affine permutation of the pool
        const uint64_t h = Mix(key, unit / kPoolUnits);
        step = 1 + h % (kPoolUnits - 1);
        idx = (h >> 32) % kPoolUnits;
      }
      // The last unit of a tensor may be cut short; units are whole blocks, so is the cut.
      const uint64_t n = std::min(ub, want - filled);
      std::memcpy(dst + filled, pool.bytes.data() + idx * ub, n);
      filled += n;
      idx += step;
      if (idx >= kPoolUnits) idx -= kPoolUnits;
    }
    STRATA_RETURN_IF_ERROR(w.Write(buf.data(), want));
    at += want;
  }
  return absl::OkStatus();
}

// GPT-2's bytes_to_unicode: byte b is shown as code point cp[b]; the printable bytes stand for
// themselves, the others are moved to U+0100 and up. Token i < 256 of GPT-2-style vocabularies is
// the i-th of these code points in ascending order.
void ByteCodePoints(uint32_t cp[256]) {
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    cp[b] = printable ? b : next++;
  }
}

std::string Utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// Words whose left-to-right merges make the synthetic vocabulary (a leading space is part of a word).
constexpr const char *kWords[] = {
    " hello", " world", "hello", "world", " the", " of", " and", " to", " in", " is", " a", " that", " for", " it",
    " with", " as", " was", " on", " be", " at", " by", " this", " have", " from", " or", " are", " not", " but",
    " what", " all", " were", " we", " when", " your", " can", " said", " there", " use", " an", " each", " which",
    " she", " do", " how", " their", " if", " will", " up", " other", " about", " out", " many", " then", " them",
    " these", " so", " some", " her", " would", " make", " like", " him", " into", " time", " has", " look", " two",
    " more", " write", " go", " see", " number", " no", " way", " could", " people", " my", " than", " first",
    " water", " been", " call", " who", " its", " now", " find", " long", " down", " day", " did", " get", " come",
    " made", " may", " part", "The", " The", "ing", "ed", "er", "ly", " model", " expert", " token", " layer",
    " mixture", "\n\n", "  ", ".\n", ",", " I", " you", " he",
};

}  // namespace

const std::vector<SynthShape> &SynthShapes() {
  static const std::vector<SynthShape> shapes = [] {
    // name, arch, general.name, layers, embd, heads, kv heads, head dim, experts, used, expert ff,
    // dense ff, vocab, context, rope theta, rms eps, norm_topk_prob, tokenizer pre; the family
    // fields after (from each model's config.json, as llama.cpp's converter writes them).
    std::vector<SynthShape> v = {
        {"qwen3-30b-a3b", "qwen3moe", "Qwen3-30B-A3B (synthetic)", 48, 2048, 32, 4, 128, 128, 8, 768, 6144, 151936,
         40960, 1e6f, 1e-6f, true, "qwen2"},
        {"qwen3-235b-a22b", "qwen3moe", "Qwen3-235B-A22B (synthetic)", 94, 4096, 64, 4, 128, 128, 8, 1536, 12288,
         151936, 40960, 1e6f, 1e-6f, true, "qwen2"},
        {"deepseek-v3", "deepseek2", "DeepSeek-V3 (synthetic)", 61, 7168, 128, 128, 192, 256, 8, 2048, 18432, 129280,
         163840, 1e4f, 1e-6f, true, "deepseek-v3"},
        {"gpt-oss-120b", "gpt-oss", "gpt-oss-120b (synthetic)", 36, 2880, 64, 8, 64, 128, 4, 2880, 2880, 201088,
         131072, 150000.f, 1e-5f, true, "gpt-4o"},
        {"olmoe-1b-7b", "olmoe", "OLMoE-1B-7B-0924 (synthetic)", 16, 2048, 16, 16, 128, 64, 8, 1024, 1024, 50304,
         4096, 1e4f, 1e-5f, false, "default"},
        {"mixtral-8x7b", "llama", "Mixtral-8x7B-v0.1 (synthetic)", 32, 4096, 32, 8, 128, 8, 2, 14336, 14336, 32000,
         32768, 1e6f, 1e-5f, true, "default"},
        {"tiny", "qwen3moe", "strata-synth-tiny", 4, 256, 4, 2, 64, 16, 2, 256, 512, 512, 4096, 1e6f, 1e-6f, true,
         "qwen2"},
    };
    for (SynthShape &s : v) {
      if (s.name == "deepseek-v3") {
        s.n_dense_lead = 3;                      // first_k_dense_replace
        s.q_lora_rank = 1536;
        s.kv_lora_rank = 512;
        s.qk_rope_dim = 64;                      // head_dim 192 = qk_nope 128 + qk_rope 64
        s.v_head_dim = 128;
        s.n_shared_experts = 1;
        s.sigmoid_gating = true;                 // scoring_func sigmoid, topk_method noaux_tc
        s.n_group = 8;
        s.topk_group = 4;
        s.routed_scale = 2.5f;
        s.yarn_factor = 40.f;
        s.yarn_orig_ctx = 4096;
        s.yarn_log_mul = 0.1f;                   // 0.1 * mscale_all_dim (1.0)
      } else if (s.name == "gpt-oss-120b") {
        s.experts = "mxfp4";
        s.sliding_window = 128;
        s.yarn_factor = 32.f;
        s.yarn_orig_ctx = 4096;                  // initial_context_length
      } else if (s.name == "tiny") {
        s.stackable = true;
      }
    }
    return v;
  }();
  return shapes;
}

SynthVocab MakeSynthVocab(int n_vocab, const std::string &arch) {
  SynthVocab v;
  uint32_t cp[256];
  ByteCodePoints(cp);
  std::vector<uint32_t> sorted(cp, cp + 256);
  std::sort(sorted.begin(), sorted.end());
  HashSet<std::string> have;
  for (uint32_t c : sorted) {
    v.tokens.push_back(Utf8(c));
    v.token_type.push_back(1);
    have.insert(v.tokens.back());
  }
  const char *specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  const int n_special = 3;
  const size_t merge_budget = static_cast<size_t>(std::max(0, n_vocab - 256 - n_special));
  HashSet<std::string> merged;
  for (const char *w : kWords) {
    std::string sym;
    for (const char *p = w; *p != '\0'; ++p) {
      const std::string ch = Utf8(cp[static_cast<unsigned char>(*p)]);
      if (sym.empty()) {
        sym = ch;
        continue;
      }
      const std::string rule = sym + " " + ch;
      sym += ch;
      if (merged.count(rule) != 0) continue;
      if (have.count(sym) == 0) {
        if (v.tokens.size() - 256 >= merge_budget) break;
        v.tokens.push_back(sym);
        v.token_type.push_back(1);
        have.insert(sym);
      }
      merged.insert(rule);
      v.merges.push_back(rule);
    }
  }
  const int32_t first_special = static_cast<int32_t>(v.tokens.size());
  for (const char *s : specials) {
    v.tokens.push_back(s);
    v.token_type.push_back(3);
  }
  // Qwen: <|endoftext|> is BOS (not added) and <|im_end|> ends a turn; the others end on <|endoftext|>.
  v.bos = first_special;
  v.eos = arch == "qwen3moe" ? first_special + 2 : first_special;
  while (static_cast<int>(v.tokens.size()) < n_vocab) {
    v.tokens.push_back(absl::StrCat("[PAD", v.tokens.size(), "]"));
    v.token_type.push_back(1);
  }
  return v;
}

namespace {

// The shape with the options applied, and its tensors; every check that can fail before the file
// exists.
struct Resolved {
  SynthShape shape;
  TypeId experts = TypeId::kQ4_K;
  std::vector<Tensor> tensors;
};

absl::StatusOr<Resolved> Resolve(const SynthOptions &o) {
  const SynthShape *found = nullptr;
  std::vector<std::string> names;
  for (const SynthShape &s : SynthShapes()) {
    names.push_back(s.name);
    if (s.name == absl::AsciiStrToLower(o.shape)) found = &s;
  }
  if (found == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "unknown shape '%s' (known: %s)", o.shape, absl::StrJoin(names, ", "));
  }
  Resolved r;
  SynthShape &s = r.shape;
  s = *found;
  if (o.layers != 0) {
    const int most = s.stackable ? 1024 : s.n_layer;
    if (o.layers < 1 || o.layers > most) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "--layers %d is outside [1, %d] (%s)", o.layers, most, s.name);
    }
    s.n_layer = o.layers;
  }
  if (o.routing != "concentrated" && o.routing != "spread" && o.routing != "skewed") {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "unknown routing '%s' (known: concentrated, spread, skewed)", o.routing);
  }
  STRATA_ASSIGN_OR_RETURN(r.experts, ParseCodec(o.experts.empty() ? s.experts : o.experts, "--codec"));
  STRATA_ASSIGN_OR_RETURN(const TypeId attention, ParseCodec(o.attention, "--attention"));
  r.tensors = PlanTensors(s, r.experts, attention, o.routing != "concentrated", o.routing == "skewed" ? kRouterSkew : 0.0f);
  for (const Tensor &t : r.tensors) {
    const quant::Codec &c = *quant::FindCodec(t.type);
    if (t.ne[0] % c.block_elems != 0) {
      return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "tensor '%s': rows of %d values are not whole %s blocks (%d values)",
                    t.name, t.ne[0], std::string(c.name), c.block_elems);
    }
  }
  return r;
}

// deepseek2's and gpt-oss's keys, as llama.cpp's converter writes them for DeepSeek-V3 and gpt-oss
// (and hparams.cc reads them back): deepseek2 describes MLA as MQA over the latent (head_count_kv 1,
// key_length kv_lora + rope, value_length kv_lora) with the per-head widths in the *_mla keys.
void WriteFamilyHParams(const SynthShape &s, format::GgufWriter &w) {
  const std::string p = s.arch + ".";
  auto u32 = [&](const std::string &k, int64_t v) { w.SetValue(p + k, format::GgufUint32(static_cast<uint32_t>(v))); };
  auto f32 = [&](const std::string &k, float v) { w.SetValue(p + k, format::GgufFloat32(v)); };
  w.SetValue("general.architecture", format::GgufString(s.arch));
  w.SetValue("general.name", format::GgufString(s.model_name));
  u32("block_count", s.n_layer);
  u32("context_length", s.n_ctx);
  u32("embedding_length", s.n_embd);
  u32("feed_forward_length", s.n_ff_dense);
  u32("attention.head_count", s.n_head);
  f32("rope.freq_base", s.rope_theta);
  f32("attention.layer_norm_rms_epsilon", s.rms_eps);
  u32("expert_count", s.n_expert);
  u32("expert_used_count", s.n_expert_used);
  u32("expert_feed_forward_length", s.n_ff_expert);
  if (s.arch == "deepseek2") {
    u32("attention.head_count_kv", 1);
    u32("leading_dense_block_count", DenseLead(s));
    u32("vocab_size", s.n_vocab);
    u32("attention.q_lora_rank", s.q_lora_rank);
    u32("attention.kv_lora_rank", s.kv_lora_rank);
    u32("attention.key_length", s.kv_lora_rank + s.qk_rope_dim);
    u32("attention.value_length", s.kv_lora_rank);
    u32("attention.key_length_mla", s.head_dim);
    u32("attention.value_length_mla", s.v_head_dim);
    u32("expert_shared_count", s.n_shared_experts);
    f32("expert_weights_scale", s.routed_scale);
    w.SetValue(p + "expert_weights_norm", format::GgufBool(s.norm_topk_prob));
    u32("expert_gating_func", s.sigmoid_gating ? 2 : 1);  // llama.cpp: 1 softmax, 2 sigmoid
    u32("expert_group_count", s.n_group);
    u32("expert_group_used_count", s.topk_group);
    u32("rope.dimension_count", s.qk_rope_dim);
  } else {
    u32("attention.head_count_kv", s.n_head_kv);
    u32("attention.key_length", s.head_dim);
    u32("attention.value_length", s.head_dim);
    u32("attention.sliding_window", s.sliding_window);
  }
  if (s.yarn_factor > 1.f) {
    w.SetValue(p + "rope.scaling.type", format::GgufString("yarn"));
    f32("rope.scaling.factor", s.yarn_factor);
    u32("rope.scaling.original_context_length", s.yarn_orig_ctx);
    if (s.yarn_log_mul > 0.f) f32("rope.scaling.yarn_log_multiplier", s.yarn_log_mul);
  }
}

}  // namespace

absl::StatusOr<std::vector<format::GgufTensorLayout>> PlanSynth(const SynthOptions &o) {
  STRATA_ASSIGN_OR_RETURN(Resolved r, Resolve(o));
  std::vector<format::GgufTensorLayout> out;
  for (const Tensor &t : r.tensors) {
    format::GgufTensorLayout l;
    l.name = t.name;
    l.type = static_cast<uint32_t>(t.type);
    l.n_dims = t.n_dims;
    std::copy(t.ne, t.ne + 4, l.ne);
    STRATA_ASSIGN_OR_RETURN(const uint64_t row, quant::RowBytes(l.type, t.ne[0]));
    l.nbytes = row * static_cast<uint64_t>(t.ne[1] * t.ne[2] * t.ne[3]);
    out.push_back(std::move(l));
  }
  return out;
}

absl::StatusOr<SynthReport> Synthesize(const SynthOptions &o, const std::string &out) {
  const auto t0 = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(Resolved res, Resolve(o));
  const SynthShape &s = res.shape;
  const TypeId experts = res.experts;
  const std::vector<Tensor> &tensors = res.tensors;

  format::GgufWriter w(out, kPackFileAlignment);
  HParams hp;
  hp.n_layer = s.n_layer;
  hp.n_embd = s.n_embd;
  hp.n_head = s.n_head;
  hp.n_head_kv = s.n_head_kv;
  hp.head_dim = s.head_dim;
  hp.n_vocab = s.n_vocab;
  hp.n_expert = s.n_expert;
  hp.n_expert_used = s.n_expert_used;
  hp.n_ff_expert = s.n_ff_expert;
  hp.n_ctx_train = s.n_ctx;
  hp.rope_theta = s.rope_theta;
  hp.rms_eps = s.rms_eps;
  hp.norm_topk_prob = s.norm_topk_prob;
  if (s.arch == "deepseek2" || s.arch == "gpt-oss") {
    WriteFamilyHParams(s, w);
  } else {
    WriteLlamaCppHParams(s.arch, s.model_name, hp, s.n_ff_dense, w);
  }
  if (int ft = GgufFileType(experts); ft >= 0) {
    w.SetValue("general.file_type", format::GgufUint32(static_cast<uint32_t>(ft)));
  }
  w.SetValue("general.quantization_version", format::GgufUint32(2));

  SynthVocab v = MakeSynthVocab(s.n_vocab, s.arch);
  w.SetValue("tokenizer.ggml.model", format::GgufString("gpt2"));
  w.SetValue("tokenizer.ggml.pre", format::GgufString(s.tokenizer_pre));
  w.SetValue("tokenizer.ggml.tokens", format::GgufStringArray(std::move(v.tokens)));
  w.SetValue("tokenizer.ggml.token_type", format::GgufIntArray(GgufType::kInt32, v.token_type));
  w.SetValue("tokenizer.ggml.merges", format::GgufStringArray(std::move(v.merges)));
  w.SetValue("tokenizer.ggml.bos_token_id", format::GgufUint32(static_cast<uint32_t>(v.bos)));
  w.SetValue("tokenizer.ggml.eos_token_id", format::GgufUint32(static_cast<uint32_t>(v.eos)));
  w.SetValue("tokenizer.ggml.padding_token_id", format::GgufUint32(static_cast<uint32_t>(v.bos)));
  w.SetValue("tokenizer.ggml.add_bos_token", format::GgufBool(false));

  w.SetValue("strata.synth.shape", format::GgufString(s.name));
  w.SetValue("strata.synth.seed", format::GgufUint64(o.seed));
  w.SetValue("strata.synth.routing", format::GgufString(o.routing));
  w.SetValue("strata.synth.pool_units", format::GgufUint32(static_cast<uint32_t>(kPoolUnits)));

  for (const Tensor &t : tensors) {
    auto added = w.AddTensor(t.name, static_cast<uint32_t>(t.type), t.n_dims, t.ne);
    if (!added.ok()) return Annotate(added.status(), absl::StrCat("synthesizing '", out, "'"));
  }
  Pools pools;
  for (const Tensor &t : tensors) {
    if (t.fill == Fill::kPool && !pools.count({t.type, t.std_dev})) {
      pools.emplace(std::make_pair(t.type, t.std_dev), MakePool(*quant::FindCodec(t.type), t.std_dev, o.seed));
    }
  }
  STRATA_RETURN_IF_ERROR(w.Begin());

  SynthReport r;
  {
    ProgressBar progress(o.progress, w.tensor_bytes_total(), "synth");
    std::vector<uint8_t> buf;
    uint64_t done = 0;
    for (size_t i = 0; i < tensors.size() && !o.sparse; ++i) {
      const uint64_t nbytes = w.tensors()[i].nbytes;
      STRATA_RETURN_IF_ERROR(WriteTensor(tensors[i], i, nbytes, s.n_embd, o.seed, pools, buf, w));
      done += nbytes;
      progress.Update(done, i + 1, tensors.size());
    }
  }
  if (o.sparse) STRATA_RETURN_IF_ERROR(w.SkipRemainingData());
  STRATA_RETURN_IF_ERROR(w.Finish());
  r.layer_bytes.assign(static_cast<size_t>(s.n_layer), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t nbytes = w.tensors()[i].nbytes;
    if (tensors[i].expert) r.expert_bytes += nbytes;
    if (tensors[i].layer >= 0) r.layer_bytes[static_cast<size_t>(tensors[i].layer)] += nbytes;
  }
  r.n_tensors = static_cast<int>(tensors.size());
  r.n_dense_layers = DenseLead(s);
  r.file_bytes = w.file_size();
  r.expert_slot_bytes = r.expert_bytes / (static_cast<uint64_t>(s.n_layer - r.n_dense_layers) * s.n_expert);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace strata::model
