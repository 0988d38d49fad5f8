// `strata synth`: writes a synthetic GGUF model with the real tensor names, shapes and metadata of a
// published MoE (plus a byte-level BPE tokenizer) and random weights, so benchmarks run at real sizes
// and llama.cpp can load the same file. The bytes are a pure function of (shape, layers, codecs, seed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lib/format/gguf_writer.h"
#include "lib/util/status.h"

namespace strata::model {

// A published model's shape, as its config.json gives it, and the GGUF architecture it is written as.
struct SynthShape {
  std::string name;          // "qwen3-30b-a3b"
  std::string arch;          // GGUF general.architecture: "qwen3moe", "olmoe", "llama" (Mixtral),
                             // "deepseek2" (DeepSeek-V3) or "gpt-oss"
  std::string model_name;    // general.name
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;          // deepseek2: the query/key head width qk_nope + qk_rope
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_expert = 0;
  int n_ff_dense = 0;        // qwen3moe's and deepseek2's feed_forward_length (intermediate_size); else n_ff_expert
  int n_vocab = 0;
  int n_ctx = 0;             // max_position_embeddings
  float rope_theta = 10000.f;
  float rms_eps = 1e-6f;
  bool norm_topk_prob = false;
  std::string tokenizer_pre; // tokenizer.ggml.pre
  std::string experts = "q4_k";  // routed experts' codec when SynthOptions::experts is empty
  bool stackable = false;    // may be written deeper than n_layer (tiny: not a published model)

  // deepseek2 (DeepSeek-V3): leading dense layers, multi-head latent attention, shared experts and
  // sigmoid gating with a selection bias over groups of experts. A --layers slice keeps the first
  // min(n_dense_lead, layers - 1) layers dense, so a slice of 2 or more layers has a MoE layer and a
  // full-depth one the real count.
  int n_dense_lead = 0;
  int q_lora_rank = 0, kv_lora_rank = 0, qk_rope_dim = 0, v_head_dim = 0;
  int n_shared_experts = 0;
  bool sigmoid_gating = false;   // and blk.N.exp_probs_b.bias (e_score_correction_bias)
  int n_group = 0, topk_group = 0;
  float routed_scale = 0.f;      // routed_scaling_factor
  // YaRN (deepseek2, gpt-oss): factor > 1 turns it on.
  float yarn_factor = 0.f;
  int yarn_orig_ctx = 0;
  float yarn_log_mul = 0.f;      // deepseek2's 0.1 * mscale_all_dim
  // gpt-oss: attention and expert biases, sinks, a sliding window on the even layers.
  int sliding_window = 0;
};

// The shapes `synth` knows: qwen3-30b-a3b, olmoe-1b-7b, mixtral-8x7b, the big ones qwen3-235b-a22b,
// deepseek-v3 and gpt-oss-120b (whose experts default to MXFP4, as published), and tiny (qwen3moe,
// 4 layers, hidden 256, 16 experts top-2, expert ffn 256, vocab 512: ~7 MB at Q4_K, for tests).
const std::vector<SynthShape> &SynthShapes();

struct SynthOptions {
  std::string shape;                 // a SynthShapes() name
  std::string experts;               // codec of the routed experts (ffn_{gate,up,down}_exps); empty: the shape's
  std::string attention = "q8_0";    // codec of every other matrix: attention, token_embd, output, and
                                     // deepseek2's dense FFN and shared expert (routers stay F32)
  int layers = 0;                    // > 0: the first this many layers of the shape (same width)
  uint64_t seed = 1;
  bool progress = false;             // progress bar on stderr
  bool sparse = false;               // header and metadata only; tensor data left as a hole (zeros)
  std::string routing = "concentrated";  // or "spread", "skewed" (see Synthesize: how varied the routing is)
};

struct SynthReport {
  int n_tensors = 0;
  uint64_t file_bytes = 0;
  uint64_t expert_bytes = 0;         // all routed expert tensors
  uint64_t expert_slot_bytes = 0;    // gate + up + down of one expert
  std::vector<uint64_t> layer_bytes; // each layer's tensors (blk.N.*), experts and all
  int n_dense_layers = 0;            // the leading layers without routed experts
  double seconds = 0;
};

// Writes the synthetic model to `out` (through a temporary file renamed at the end; on failure
// nothing is left behind).
//
// Weights. Norms are 1 + 0.05·N(0,1) and routers N(0, (2/sqrt(n_embd))^2), both F32 and drawn
// value by value (so router logits have a standard deviation of about 2: routing is neither uniform
// nor always the same experts). Every quantized matrix is N(0, 0.02^2) in distribution but is built
// from a pool: 509 units of 256 random values are quantized once per codec, and a tensor is the
// sequence of those units in a seeded order (each run of 509 units is an affine permutation
// j -> (a·j + b) mod 509 of the pool with (a, b) drawn per run), so writing costs a memcpy per unit
// whatever the codec and every byte is a valid block of it.
//
// Routing. With every matrix at that scale, a token's attention is nearly uniform over its context,
// so the residual stream is mostly the context's average and the routers pick much the same experts
// for every token ("concentrated", the default: on olmoe-1b-7b the busiest quarter of a layer's
// experts takes 71-86% of the selections over a prompt set, and a cache of a quarter of the experts
// hits 92-98%). "spread" draws token_embd at N(0, 1) and attn_output at N(0, 0.002^2), so each
// token's own embedding dominates the stream and routing is spread the way a load-balanced model's
// is (the busiest quarter takes ~40%): the case where the experts a decode touches do not fit a
// small cache. "skewed" is spread with each router row scaled by exp(0.45 N(0, 1)), so experts of
// larger rows win more of the selections: on the Qwen3-30B-A3B shape, over the bench's 576 tokens,
// 90% of a layer's selections fall on 49-52% of its experts (spread: 87%), the busiest quarter takes
// 63-65% and the top expert 3.5-3.9%. The scale was chosen to match a published measure of the real
// Qwen3-30B-A3B (llama.cpp imatrix counts over ~1k tokens of prose, code and math: 90% on 65 of 128
// experts, top expert 4.3%; 58 of 128 on single-domain Python): a measure of others, not of Strata.
// Written as strata.synth.routing.
//
// Errors: MOE_ERR_INVALID_ARGUMENT naming the unknown shape, codec or routing, or a layer count outside
// [1, the shape's layers] ([1, 1024] for tiny); MOE_ERR_UNSUPPORTED_TYPE for a codec Strata cannot quantize or whose block does not
// divide the rows; MOE_ERR_IO_WRITE naming `out` for any write failure.
absl::StatusOr<SynthReport> Synthesize(const SynthOptions &o, const std::string &out);

// The tensors Synthesize would write (names, types, shapes, nbytes; offsets 0), with the same errors
// for bad options, without writing anything.
absl::StatusOr<std::vector<format::GgufTensorLayout>> PlanSynth(const SynthOptions &o);

// The synthetic tokenizer's vocabulary (exposed for tests): the 256 byte tokens in GPT-2 order,
// tokens made by `merges` (English words, merged left to right), the special tokens <|endoftext|>,
// <|im_start|>, <|im_end|>, then unique "[PAD<id>]" fillers up to `n_vocab` (>= 300).
struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<int64_t> token_type;   // 1 normal, 3 control
  std::vector<std::string> merges;
  int32_t bos = -1, eos = -1;
};
SynthVocab MakeSynthVocab(int n_vocab, const std::string &arch);

}  // namespace strata::model
