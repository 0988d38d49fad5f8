// The Backend interface's default operations, for backends computing in host memory.
#include "lib/model/backend.h"

#include "lib/store/tier.h"

namespace strata::model {

void Backend::ExpertsFfn(const ExpertWeights *const *ew, int n, const int64_t *first, const float *xg, float *yg,
                         int64_t width) {
  for (int u = 0; u < n; ++u) {
    if (ew[u] != nullptr) ExpertFfn(*ew[u], xg + first[u] * width, first[u + 1] - first[u], yg + first[u] * width);
  }
}

void Backend::WriteKvRows(const KvRowRef *, const KvRowRef *rows_host, int64_t n, const float *k, const float *v,
                          int k_width, int v_width) {
  for (int64_t t = 0; t < n; ++t) {
    const KvRowRef &r = rows_host[t];
    const KvView kv{r.k_blocks, r.v_blocks, r.pos + 1, k_width, v_width, nullptr};
    CopyRows(kv.k_row(r.pos), k_width, k + t * k_width, k_width, 1, k_width);
    if (v_width > 0) CopyRows(kv.v_row(r.pos), v_width, v + t * v_width, v_width, 1, v_width);
  }
}

void Backend::AttentionRows(const float *q, const KvRowRef *, const KvRowRef *rows_host, int64_t n, int,
                            int n_head, int n_head_kv, int head_dim, int k_width, int v_width, float *out,
                            const AttentionParams &p) {
  const int64_t out_width = static_cast<int64_t>(n_head) * (p.latent ? p.v_dim : head_dim);
  for (int64_t t = 0; t < n; ++t) {
    const KvRowRef &r = rows_host[t];
    const KvView kv{r.k_blocks, r.v_blocks, r.pos + 1, k_width, v_width, r.masked};
    Attention(q + t * n_head * head_dim, kv, 1, r.pos, n_head, n_head_kv, head_dim, r.window, out + t * out_width, p);
  }
}

std::unique_ptr<store::DeviceSlots> Backend::MakeDeviceSlots() { return nullptr; }

}  // namespace strata::model
