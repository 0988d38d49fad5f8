// The CPU backend's attention over a KV cache of any KvType (backends/cpu/attention.cc).
#pragma once

#include <cstdint>

#include "lib/model/backend.h"
#include "lib/util/thread_pool.h"

namespace strata::cpu {

// Backend::Attention on the host: q (n_tok, n_head, head_dim) at positions pos0.. -> out (n_tok,
// n_head, head_dim or p.v_dim when p.latent), over kv's rows in their types, tiled (query blocks x
// key tiles, online softmax) and threaded over pool. A row's numbers depend only on its own query,
// position and keys: not on n_tok, on where the call starts, or on the thread count.
void TiledAttention(ThreadPool &pool, const float *q, const model::KvView &kv, int64_t n_tok, int pos0, int n_head,
                    int n_head_kv, int head_dim, int window, float *out, const model::AttentionParams &p);

}  // namespace strata::cpu
