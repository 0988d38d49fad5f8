// The forward pass of the supported MoE decoder architectures, written once against the Backend
// interface: embeddings, RMSNorm, GQA attention with RoPE (and Qwen3's QK-norm) over a session's KV
// cache, router softmax -> top-k -> optional renormalisation, SwiGLU experts, output head.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "lib/model/backend.h"
#include "lib/model/hparams.h"
#include "lib/model/weights.h"
#include "lib/util/status.h"

namespace strata::model {

// One session's KV cache: for each layer, n_ctx rows of k_width keys and v_width values, in the
// memory of the backend that computes with it. The widths depend on the family: kv_dim each for
// grouped-query attention; for multi-head latent attention the compressed latent plus the shared
// RoPE key in the k rows and no v rows.
class KvCache {
 public:
  struct Widths {
    int k = 0, v = 0;
  };
  static Widths WidthsFor(const HParams &hp);
  // Zero-filled rows from be.Allocate. MOE_ERR_NO_MEMORY when the backend cannot hold them.
  absl::Status Init(const HParams &hp, int n_ctx, Backend &be);
  KvView layer(int l) {
    return KvView{base(k_) + static_cast<size_t>(l) * n_ctx_ * w_.k,
                  base(v_) + static_cast<size_t>(l) * n_ctx_ * w_.v, n_ctx_, w_.k, w_.v};
  }
  int n_ctx() const { return n_ctx_; }
  Widths widths() const { return w_; }
  static uint64_t BytesFor(const HParams &hp, int n_ctx) {
    const Widths w = WidthsFor(hp);
    return static_cast<uint64_t>(hp.n_layer) * static_cast<uint64_t>(n_ctx) * (w.k + w.v) * sizeof(float);
  }

 private:
  static float *base(const std::unique_ptr<Buffer> &b) {
    return b == nullptr ? nullptr : static_cast<float *>(b->data());
  }
  int n_ctx_ = 0;
  Widths w_;
  std::unique_ptr<Buffer> k_, v_;
};

// Where the routed experts' bytes come from. For each layer the forward pass reports the routing
// of the whole batch, then acquires the distinct selected experts (ascending ids, each once per
// batch), computes with them, and releases them. An implementation may bring experts in from a slower
// tier inside Acquire and must keep them in place until Release; it may use the routing and the
// layer input to predict what later layers need. Without one, the resident weights are used.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  // `h` (n_tok, n_embd): the normalised input of layer l's experts, in the backend's memory; `selected` (n_tok * k) the
  // expert ids chosen for each token.
  virtual void OnRoute(int layer, const float *h, int64_t n_tok, const int32_t *selected, int k) {}
  // out[i] receives the weights of experts[i], valid until Release(layer, experts). On failure
  // nothing stays acquired and Release is not called.
  virtual absl::Status Acquire(int layer, const std::vector<int32_t> &experts,
                               std::vector<const ExpertWeights *> *out) = 0;
  virtual void Release(int layer, const std::vector<int32_t> &experts) = 0;
};

// One sequence of a batch: its KV cache and the new tokens at positions pos0..pos0+n_tok-1.
struct SequenceArgs {
  KvCache *kv = nullptr;
  const int32_t *tokens = nullptr;
  int64_t n_tok = 0;
  int pos0 = 0;                      // position of tokens[0]; the cache holds positions < pos0
  bool all_logits = false;           // logits for every token, else only the last
};

// A forward pass over several sequences at once (continuous batching): embeddings, norms, routing
// and experts run over the concatenated tokens, so an expert is acquired once per batch for every
// token of every sequence that routes to it; attention runs per sequence over its own cache. Each
// token's numbers do not depend on the other tokens of the batch.
struct ForwardArgs {
  std::vector<SequenceArgs> seqs;
  ExpertSource *experts = nullptr;   // nullptr: the resident weights in `w`
  // Caller-owned activation workspace in the backend's memory, replaced by a larger one when it
  // holds fewer than ForwardWorkspaceBytes; nullptr: one for this call only.
  std::unique_ptr<Buffer> *workspace = nullptr;
};

// Bytes of backend memory a forward pass over n_tok tokens with n_out rows of logits needs.
size_t ForwardWorkspaceBytes(const HParams &hp, int64_t n_tok, int64_t n_out);

// Runs the sequences through the model, writing their K/V into their caches and the logits of
// sequence i into (*logits)[i] ((all_logits ? n_tok : 1) x n_vocab). Requires pos0 + n_tok <=
// kv->n_ctx() for each, and distinct caches. Arguments are checked before any cache is written; on a
// later failure (an expert load) the caches may hold rows at positions >= pos0, which are not yet
// part of any sequence, so the sequences stay as they were.
absl::Status Forward(const HParams &hp, const ModelWeights &w, Backend &be, const ForwardArgs &args,
                     std::vector<std::vector<float>> *logits);

// One sequence: the same as a batch of one.
absl::Status Forward(const HParams &hp, const ModelWeights &w, Backend &be, KvCache &kv, const int32_t *tokens,
                     int64_t n_tok, int pos0, bool all_logits, ExpertSource *experts, std::vector<float> *logits);

}  // namespace strata::model
