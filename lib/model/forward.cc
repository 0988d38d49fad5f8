// Forward pass. Shapes in comments are (rows, cols) of float32 row-major buffers; T = tokens in the
// call. Every activation lives in backend memory (one workspace carved by Lay) and every element
// operation is a backend call, so the same code runs on the CPU and on a GPU. Expert outputs are
// kept per (token, slot) and summed in slot order, so a token's result does not depend on which
// other tokens share the batch.
#include "lib/util/str_format.h"
#include "lib/model/forward.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "lib/model/routing.h"
#include "lib/util/crc32c.h"

namespace strata::model {

namespace {

// A KV block in host memory for a cache without a backend (zero-filled, as new float[]() was).
class HostBlock final : public Buffer {
 public:
  static absl::StatusOr<std::unique_ptr<Buffer>> Allocate(size_t bytes) {
    void *p = std::calloc(std::max<size_t>(bytes, 1), 1);
    if (p == nullptr) return Errorf(MOE_ERR_NO_MEMORY, "cannot allocate %u bytes", bytes);
    auto b = std::unique_ptr<HostBlock>(new HostBlock());
    b->data_ = p;
    b->bytes_ = bytes;
    return std::unique_ptr<Buffer>(std::move(b));
  }
  ~HostBlock() override { std::free(data_); }
};

}  // namespace

KvCache::Widths KvCache::WidthsFor(const HParams &hp) {
  if (hp.mla) return Widths{hp.kv_lora_rank + hp.qk_rope_dim, 0};
  return Widths{hp.kv_dim(), hp.kv_dim()};
}

KvCache::~KvCache() { FreeAll(); }

void KvCache::FreeAll() {
  blocks_.clear();  // each block gives its budget back when its last holder lets it go
  for (auto &t : k_tab_) t.clear();
  for (auto &t : v_tab_) t.clear();
  masked_.clear();
  mask_nonzero_ = 0;
  if (spill_fd_ >= 0) close(spill_fd_);
  spill_fd_ = -1;
  spill_blocks_ = 0;
}

bool KvBudget::Take(uint64_t bytes) {
  uint64_t cur = used_.load();
  do {
    if (cur + bytes > limit_) return false;
  } while (!used_.compare_exchange_weak(cur, cur + bytes));
  return true;
}

absl::Status KvCache::Init(const HParams &hp, int n_ctx, KvBudget *budget, Backend *be, KvType k_type,
                          KvType v_type) {
  if (n_ctx <= 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "a KV cache of %d positions", n_ctx);
  FreeAll();
  n_ctx_ = n_ctx;
  n_layer_ = hp.n_layer;
  w_ = WidthsFor(hp);
  k_type_ = k_type;
  v_type_ = v_type;
  budget_ = budget;
  be_ = be;
  k_tab_.assign(n_layer_, {});
  v_tab_.assign(n_layer_, {});
  dev_.reset();
  max_blocks_ = (n_ctx + kKvBlockTokens - 1) / kKvBlockTokens;
  if (be != nullptr) {
    const size_t bytes = static_cast<size_t>(2) * n_layer_ * max_blocks_ * sizeof(float *) + n_ctx;
    absl::StatusOr<std::unique_ptr<Buffer>> b = be->Allocate(bytes);
    if (!b.ok()) return Errorf(MOE_ERR_NO_MEMORY, "cannot allocate the %u bytes of a KV cache's block tables", bytes);
    dev_ = std::move(*b);  // zero-filled: no blocks, nothing masked
    dev_mask_sent_.assign(n_ctx, 0);
    dev_tab_dirty_ = dev_mask_any_ = false;
    mask_dirty_lo_ = SIZE_MAX;
    mask_dirty_hi_ = 0;
  }
  return absl::OkStatus();
}

absl::Status KvCache::SyncDevice() {
  if (dev_ == nullptr) return absl::OkStatus();
  if (dev_tab_dirty_) {
    // KvRowRef's tables are float pointers (block addresses whatever the rows' type).
    std::vector<float *> tab(static_cast<size_t>(2) * n_layer_ * max_blocks_, nullptr);
    auto as_float = [](uint8_t *p) { return reinterpret_cast<float *>(p); };
    for (int l = 0; l < n_layer_; ++l) {
      std::transform(k_tab_[l].begin(), k_tab_[l].end(), tab.begin() + static_cast<size_t>(2 * l) * max_blocks_,
                     as_float);
      std::transform(v_tab_[l].begin(), v_tab_[l].end(), tab.begin() + static_cast<size_t>(2 * l + 1) * max_blocks_,
                     as_float);
    }
    be_->Upload(dev_->data(), tab.data(), tab.size() * sizeof(float *));
    dev_tab_dirty_ = false;
  }
  // The mask: only positions that changed since the last sync are looked at, and only the bytes that
  // differ from what was sent go up. Positions past the blocks count as unmasked (Adopt marks them
  // changed when blocks come back).
  const size_t end = std::min({mask_dirty_hi_, masked_.size(), dev_mask_sent_.size()});
  size_t lo = end, hi = 0;
  for (size_t p = mask_dirty_lo_; p < end; ++p) {
    if (masked_[p] != dev_mask_sent_[p]) {
      lo = std::min(lo, p);
      hi = p + 1;
    }
  }
  if (lo < hi) {
    be_->Upload(DevMask() + lo, masked_.data() + lo, hi - lo);
    std::copy(masked_.begin() + lo, masked_.begin() + hi, dev_mask_sent_.begin() + lo);
  }
  mask_dirty_lo_ = SIZE_MAX;
  mask_dirty_hi_ = 0;
  dev_mask_any_ = mask_nonzero_ > 0;
  return be_->TakeError();
}

void KvCache::MaskChanged(size_t lo, size_t hi) {
  mask_dirty_lo_ = std::min(mask_dirty_lo_, lo);
  mask_dirty_hi_ = std::max(mask_dirty_hi_, hi);
}

void KvCache::RecountMask() {
  mask_nonzero_ = std::count_if(masked_.begin(), masked_.end(), [](uint8_t m) { return m != 0; });
}

void KvCache::SetMask(int window, std::vector<int32_t> blocked) {
  window_ = std::max(0, window);
  std::sort(blocked.begin(), blocked.end());
  blocked.erase(std::unique(blocked.begin(), blocked.end()), blocked.end());
  blocked_ = std::move(blocked);
}

int KvCache::WindowFor(const HParams &hp, int l) const {
  const int m = hp.window(l);
  if (m <= 0) return window_;
  if (window_ <= 0) return m;
  return std::min(m, window_);
}

// Allocates n blocks (zeroed) against the budget, into *out; all or nothing.
absl::Status KvCache::AddBlocks(int n, std::vector<BlockRef> *out) {
  const uint64_t bytes = static_cast<uint64_t>(n) * block_bytes();
  if (budget_ != nullptr && !budget_->Take(bytes)) {
    return Errorf(MOE_ERR_LIMIT_KV,
                  "the context's KV budget of %u bytes cannot hold %d more block(s) of %u bytes (%u bytes in use); "
                  "raise moe_params.kv_budget_bytes or max_sessions, close or evict sessions",
                  budget_->limit(), n, block_bytes(), budget_->used());
  }
  // Each block owns its share of the charge from here on; a failure gives back the shares of the
  // blocks not made (the blocks made give theirs as they go).
  for (int i = 0; i < n; ++i) {
    auto fail = [&] {
      if (budget_ != nullptr) budget_->Give(static_cast<uint64_t>(n - i) * block_bytes());
      out->clear();
      return Errorf(MOE_ERR_NO_MEMORY, "cannot allocate %d KV block(s) of %u bytes", n, block_bytes());
    };
    BlockRef block;
    try {
      block = std::make_shared<Block>();
    } catch (const std::bad_alloc &) {
      return fail();
    }
    absl::StatusOr<std::unique_ptr<Buffer>> b =
        be_ != nullptr ? be_->Allocate(block_bytes()) : HostBlock::Allocate(block_bytes());
    if (!b.ok()) return fail();
    block->buf = std::move(*b);
    block->budget = budget_;
    block->charged = budget_ != nullptr ? block_bytes() : 0;
    out->push_back(std::move(block));  // reserved by the caller (no throw)
  }
  return absl::OkStatus();
}

void KvCache::SetTables(int b, uint8_t *base) {
  const size_t k_bytes = static_cast<size_t>(kKvBlockTokens) * k_row_bytes();
  const size_t per_layer = k_bytes + static_cast<size_t>(kKvBlockTokens) * v_row_bytes();
  for (int l = 0; l < n_layer_; ++l) {
    uint8_t *k = base + l * per_layer;
    k_tab_[l][b] = k;
    v_tab_[l][b] = k + k_bytes;
  }
}

// Appends allocated blocks to the tables.
void KvCache::Adopt(std::vector<BlockRef> *blocks) {
  for (auto &b : *blocks) {
    for (int l = 0; l < n_layer_; ++l) {
      k_tab_[l].push_back(nullptr);
      v_tab_[l].push_back(nullptr);
    }
    SetTables(n_blocks(), Data(b));
    blocks_.push_back(std::move(b));
  }
  blocks->clear();
  const size_t had = masked_.size();
  masked_.resize(capacity(), 0);
  MaskChanged(had, masked_.size());
  dev_tab_dirty_ = true;
}

absl::Status KvCache::Reserve(int n) {
  if (n > n_ctx_) {
    return Errorf(MOE_ERR_LIMIT_CONTEXT, "position %d does not fit the session's context of %d tokens", n - 1,
                  n_ctx_);
  }
  if (n <= capacity()) return absl::OkStatus();
  if (spilled()) return Errorf(MOE_ERR_STATE, "the KV cache is spilled to disk");
  const int need = (n + kKvBlockTokens - 1) / kKvBlockTokens - n_blocks();
  std::vector<BlockRef> fresh;
  fresh.reserve(static_cast<size_t>(need));
  STRATA_RETURN_IF_ERROR(AddBlocks(need, &fresh));
  Adopt(&fresh);
  return absl::OkStatus();
}

absl::Status KvCache::Prepare(int pos0, const int32_t *tokens, int64_t n) {
  if (pos0 < 0 || n < 0 || pos0 + n > n_ctx_) {
    return Errorf(MOE_ERR_LIMIT_CONTEXT, "positions %d..%d do not fit the context of %d tokens", pos0,
                  pos0 + n - 1, n_ctx_);
  }
  STRATA_RETURN_IF_ERROR(Unshare(pos0, n));
  STRATA_RETURN_IF_ERROR(Reserve(static_cast<int>(pos0 + n)));
  for (int64_t t = 0; t < n; ++t) {
    uint8_t &m = masked_[pos0 + t];
    mask_nonzero_ -= m != 0;
    m = std::binary_search(blocked_.begin(), blocked_.end(), tokens[t]) ? 1 : 0;
    mask_nonzero_ += m != 0;
  }
  MaskChanged(pos0, pos0 + n);
  return absl::OkStatus();
}

void KvCache::Trim(int n) {
  if (spilled()) return;
  const int keep = (std::max(0, n) + kKvBlockTokens - 1) / kKvBlockTokens;
  if (keep >= n_blocks()) return;
  blocks_.resize(keep);  // a block's budget goes back with its last holder
  for (auto &t : k_tab_) t.resize(keep);
  for (auto &t : v_tab_) t.resize(keep);
  masked_.resize(capacity());
  RecountMask();
  dev_tab_dirty_ = true;
}

absl::Status KvCache::Unshare(int pos0, int64_t n) {
  if (n <= 0 || spilled()) return absl::OkStatus();
  const int last = static_cast<int>(std::min<int64_t>(n_blocks() - 1, (pos0 + n - 1) / kKvBlockTokens));
  std::vector<char> host;
  for (int b = pos0 / kKvBlockTokens; b <= last; ++b) {
    if (blocks_[b].use_count() <= 1) continue;
    std::vector<BlockRef> fresh;
    fresh.reserve(1);
    STRATA_RETURN_IF_ERROR(AddBlocks(1, &fresh));
    const size_t bytes = block_bytes();
    if (be_ == nullptr) {
      std::memcpy(fresh[0]->buf->data(), blocks_[b]->buf->data(), bytes);
    } else {
      host.resize(bytes);
      be_->Download(host.data(), blocks_[b]->buf->data(), bytes);
      be_->Upload(fresh[0]->buf->data(), host.data(), bytes);
      STRATA_RETURN_IF_ERROR(be_->TakeError());
    }
    blocks_[b] = std::move(fresh[0]);
    SetTables(b, Data(blocks_[b]));
    dev_tab_dirty_ = true;
  }
  return absl::OkStatus();
}

absl::Status KvCache::ShareFrom(const KvCache &src) {
  if (src.spilled()) return Errorf(MOE_ERR_STATE, "the KV cache to share is spilled to disk");
  if (n_blocks() > 0 || spilled()) return Errorf(MOE_ERR_STATE, "a KV cache shares another's blocks only while empty");
  if (src.n_layer_ != n_layer_ || src.w_.k != w_.k || src.w_.v != w_.v || src.n_ctx_ > n_ctx_ ||
      src.k_type_ != k_type_ || src.v_type_ != v_type_) {
    return Errorf(MOE_ERR_INTERNAL, "KV caches of different shapes cannot share blocks");
  }
  blocks_ = src.blocks_;
  k_tab_ = src.k_tab_;
  v_tab_ = src.v_tab_;
  const size_t had = masked_.size();
  masked_ = src.masked_;
  mask_nonzero_ = src.mask_nonzero_;
  MaskChanged(0, std::max(had, masked_.size()));
  dev_tab_dirty_ = true;
  return absl::OkStatus();
}

int KvCache::shared_blocks() const {
  int n = 0;
  for (const BlockRef &b : blocks_) n += b.use_count() > 1 ? 1 : 0;
  return n;
}

int KvCache::SharedBlocksIn(int pos0, int64_t n) const {
  if (n <= 0 || spilled()) return 0;
  const int last = static_cast<int>(std::min<int64_t>(n_blocks() - 1, (pos0 + n - 1) / kKvBlockTokens));
  int shared = 0;
  for (int b = pos0 / kKvBlockTokens; b <= last; ++b) shared += blocks_[b].use_count() > 1 ? 1 : 0;
  return shared;
}

absl::Status KvCache::Spill(const std::string &dir, int n) {
  if (spilled()) return absl::OkStatus();
  const int keep = std::min(n_blocks(), (std::max(0, n) + kKvBlockTokens - 1) / kKvBlockTokens);
  std::string tmpl = (dir.empty() ? std::string(".") : dir) + "/strata-kv-XXXXXX";
  int fd = mkstemp(tmpl.data());
  if (fd < 0) {
    return Errorf(MOE_ERR_IO_OPEN, "cannot create a KV spill file in '%s': %s", dir, std::strerror(errno));
  }
  unlink(tmpl.c_str());  // the file lives while fd is open; nothing stays behind after a crash
  uint32_t crc = 0;
  std::vector<char> host(block_bytes());
  for (int b = 0; b < keep; ++b) {
    const uint64_t bytes = block_bytes();
    ToHost(host.data(), blocks_[b]->buf->data(), bytes);
    const char *p = host.data();
    crc = Crc32c(crc, p, bytes);
    uint64_t done = 0;
    while (done < bytes) {
      ssize_t w = pwrite(fd, p + done, bytes - done, static_cast<off_t>(b * bytes + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = errno;
        close(fd);
        return Errorf(MOE_ERR_IO_WRITE, "writing the KV spill file in '%s': %s", dir,
                      w < 0 ? std::strerror(err) : "no space written");
      }
      done += static_cast<uint64_t>(w);
    }
  }
  std::vector<uint8_t> mask(masked_.begin(), masked_.begin() + keep * kKvBlockTokens);
  FreeAll();
  masked_ = std::move(mask);  // the mask stays in RAM (one byte per position)
  RecountMask();
  spill_fd_ = fd;
  spill_blocks_ = keep;
  spill_crc_ = crc;
  return absl::OkStatus();
}

absl::Status KvCache::Unspill() {
  if (!spilled()) return absl::OkStatus();
  std::vector<BlockRef> fresh;
  fresh.reserve(static_cast<size_t>(spill_blocks_));
  STRATA_RETURN_IF_ERROR(AddBlocks(spill_blocks_, &fresh));
  const uint64_t bytes = block_bytes();
  uint32_t crc = 0;
  std::vector<char> host(bytes);
  for (int b = 0; b < spill_blocks_; ++b) {
    char *p = host.data();
    uint64_t done = 0;
    while (done < bytes) {
      ssize_t r = pread(spill_fd_, p + done, bytes - done, static_cast<off_t>(b * bytes + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        const int err = errno;  // the fresh blocks give their budget back as they go
        return Errorf(MOE_ERR_IO_READ, "reading the KV spill file back: %s", r < 0 ? std::strerror(err) : "end of file");
      }
      done += static_cast<uint64_t>(r);
    }
    crc = Crc32c(crc, p, bytes);
    FromHost(fresh[b]->buf->data(), p, bytes);
  }
  if (crc != spill_crc_) {
    return Errorf(MOE_ERR_IO_READ, "the KV spill file came back different from what was written (checksum)");
  }
  std::vector<uint8_t> mask = std::move(masked_);
  close(spill_fd_);
  spill_fd_ = -1;
  spill_blocks_ = 0;
  Adopt(&fresh);
  std::copy(mask.begin(), mask.begin() + std::min(mask.size(), masked_.size()), masked_.begin());
  RecountMask();
  return absl::OkStatus();
}

absl::Status KvCache::ReadRows(int l, bool values, int n, float *out) const {
  const int width = values ? w_.v : w_.k;
  if (width == 0 || n <= 0) return absl::OkStatus();
  const KvType type = values ? v_type_ : k_type_;
  const size_t row_bytes = values ? v_row_bytes() : k_row_bytes();
  const size_t k_bytes = static_cast<size_t>(kKvBlockTokens) * k_row_bytes();
  const size_t per_layer = k_bytes + static_cast<size_t>(kKvBlockTokens) * v_row_bytes();
  const size_t within = l * per_layer + (values ? k_bytes : 0);
  std::vector<uint8_t> raw;
  for (int p0 = 0; p0 < n; p0 += kKvBlockTokens) {
    const int b = p0 / kKvBlockTokens, rows = std::min(kKvBlockTokens, n - p0);
    const uint64_t bytes = static_cast<uint64_t>(rows) * row_bytes;
    raw.resize(bytes);
    if (!spilled()) {
      if (b >= n_blocks()) return Errorf(MOE_ERR_INTERNAL, "KV rows %d.. are not allocated", p0);
      ToHost(raw.data(), Data(blocks_[b]) + within, bytes);
    } else {
      if (b >= spill_blocks_) return Errorf(MOE_ERR_INTERNAL, "KV rows %d.. are not in the spill file", p0);
      char *p = reinterpret_cast<char *>(raw.data());
      const uint64_t at = b * block_bytes() + within;
      uint64_t done = 0;
      while (done < bytes) {
        ssize_t r = pread(spill_fd_, p + done, bytes - done, static_cast<off_t>(at + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          return Errorf(MOE_ERR_IO_READ, "reading the KV spill file: %s", r < 0 ? std::strerror(errno) : "end of file");
        }
        done += static_cast<uint64_t>(r);
      }
    }
    for (int r = 0; r < rows; ++r) {
      DecodeKvCols(type, raw.data() + r * row_bytes, 0, width, out + static_cast<size_t>(p0 + r) * width);
    }
  }
  return absl::OkStatus();
}

void KvCache::WriteRows(int l, bool values, int n, const float *in) {
  const int width = values ? w_.v : w_.k;
  if (width == 0) return;
  const KvView view = layer(l);
  const KvType type = values ? v_type_ : k_type_;
  std::vector<uint8_t> row(KvRowBytes(type, width));
  for (int p = 0; p < n; ++p) {
    EncodeKvRow(type, in + static_cast<size_t>(p) * width, width, row.data());
    FromHost(values ? view.v_row(p) : view.k_row(p), row.data(), row.size());
  }
}

void KvCache::ToHost(void *dst, const void *src, size_t bytes) const {
  if (be_ != nullptr) {
    be_->Download(dst, src, bytes);
  } else if (bytes > 0) {
    std::memcpy(dst, src, bytes);
  }
}

void KvCache::FromHost(void *dst, const void *src, size_t bytes) const {
  if (be_ != nullptr) {
    be_->Upload(dst, src, bytes);
  } else if (bytes > 0) {
    std::memcpy(dst, src, bytes);
  }
}

std::vector<float> RopeFrequencies(const HParams &hp, int dim) {
  if (!hp.yarn) return {};
  const int half = dim / 2;
  const double base = hp.rope_theta;
  auto corr_dim = [&](double rot) {
    return dim * std::log(hp.yarn_orig_ctx / (rot * 2.0 * M_PI)) / (2.0 * std::log(base));
  };
  double low = corr_dim(hp.yarn_beta_fast), high = corr_dim(hp.yarn_beta_slow);
  if (hp.yarn_truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    const float pos_freq = std::pow(static_cast<float>(base), static_cast<float>(2 * i) / static_cast<float>(dim));
    const float extra = 1.0f / pos_freq;
    const float inter = 1.0f / (hp.yarn_factor * pos_freq);
    const float ramp = std::clamp(static_cast<float>((i - low) / (high - low)), 0.0f, 1.0f);
    const float extra_factor = 1.0f - ramp;
    inv[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
  }
  return inv;
}

namespace {

RopeParams RopeParamsFor(const HParams &hp, const std::vector<float> &inv_freq) {
  RopeParams rp;
  rp.inv_freq = inv_freq.empty() ? nullptr : inv_freq.data();
  rp.mscale = hp.yarn ? hp.yarn_attn_factor : 1.f;
  return rp;
}

// Rows [r0, r0 + n) of a resident matrix, as a matrix.
Matrix RowsOf(const Matrix &m, int64_t r0, int64_t n) {
  Matrix v = m;
  v.rows = n;
  v.sub_offset += static_cast<uint64_t>(r0) * m.row_bytes;
  v.data = m.data + static_cast<uint64_t>(r0) * m.row_bytes;
  return v;
}

// Hands out 256-byte aligned pieces of one buffer; with no buffer it only adds up the sizes, so the
// same Lay() call both plans the workspace and carves it.
class Carver {
 public:
  explicit Carver(void *base) : base_(static_cast<char *>(base)) {}
  template <typename T>
  T *Take(int64_t n) {
    off_ = (off_ + 255) & ~size_t{255};
    T *p = base_ == nullptr ? nullptr : reinterpret_cast<T *>(base_ + off_);
    off_ += static_cast<size_t>(n) * sizeof(T);
    return p;
  }
  size_t used() const { return off_; }

 private:
  char *base_;
  size_t off_ = 0;
};

// The activations of one forward pass over T tokens with n_out output rows, all in backend memory.
// Attention buffers are sized for T tokens and reused by each sequence in turn.
struct Scratch {
  int32_t *tok = nullptr, *pos = nullptr;   // (T) token ids, (T) positions, uploaded together
  KvRowRef *rows = nullptr;                 // (n_layer, T) decode rows, uploaded with them
  float *x = nullptr, *h = nullptr, *o = nullptr;  // (T, D) residual stream, normed input, block output
  // grouped-query attention
  float *q = nullptr, *k = nullptr, *v = nullptr, *att = nullptr;
  // latent attention
  float *qa = nullptr, *kva = nullptr, *c = nullptr, *kpe = nullptr, *qpe = nullptr, *qlat = nullptr;
  float *qn = nullptr, *ql = nullptr, *ah = nullptr, *oh = nullptr, *ov = nullptr;
  // experts
  float *router = nullptr, *wts = nullptr, *xg = nullptr, *yg = nullptr, *sh = nullptr, *shg = nullptr;
  int32_t *idx = nullptr;                   // (2, T * K) gather rows, then each slot's grouped row
  int32_t *sel = nullptr;                   // (n_layer, T * K) selections routed in backend memory
  // output head
  float *xo = nullptr, *logits = nullptr;
};

size_t Lay(const HParams &hp, int64_t T, int64_t n_out, int64_t n_seq, void *base, Scratch *s) {
  Carver c(base);
  const int64_t D = hp.n_embd, K = hp.n_expert_used;
  s->tok = c.Take<int32_t>(2 * T);
  s->pos = s->tok == nullptr ? nullptr : s->tok + T;
  s->rows = c.Take<KvRowRef>(static_cast<int64_t>(hp.n_layer) * T);
  s->x = c.Take<float>(T * D);
  s->h = c.Take<float>(T * D);
  s->o = c.Take<float>(T * D);
  if (hp.mla) {
    const int64_t H = hp.n_head, R = hp.kv_lora_rank, ROPE = hp.qk_rope_dim, W = R + ROPE;
    s->q = c.Take<float>(T * H * hp.head_dim);
    s->qa = c.Take<float>(T * std::max(hp.q_lora_rank, 1));
    s->kva = c.Take<float>(T * W);
    s->c = c.Take<float>(T * R);
    s->kpe = c.Take<float>(T * ROPE);
    s->qpe = c.Take<float>(T * H * ROPE);
    s->qlat = c.Take<float>(T * H * W);
    s->qn = c.Take<float>(T * hp.qk_nope_dim);
    s->ql = c.Take<float>(T * R);
    s->att = c.Take<float>(T * H * R);
    s->ah = c.Take<float>(T * R);
    s->oh = c.Take<float>(T * hp.v_head_dim);
    s->ov = c.Take<float>(T * H * hp.v_head_dim);
  } else {
    s->q = c.Take<float>(T * hp.q_dim());
    s->k = c.Take<float>(T * hp.kv_dim());
    s->v = c.Take<float>(T * hp.kv_dim());
    s->att = c.Take<float>(T * hp.q_dim());
  }
  if (hp.n_expert > 0) {
    s->router = c.Take<float>(T * hp.n_expert);
    s->wts = c.Take<float>(T * K);
    s->xg = c.Take<float>(T * K * D);
    s->yg = c.Take<float>(T * K * D);
    s->idx = c.Take<int32_t>(2 * T * K);
    s->sel = c.Take<int32_t>(static_cast<int64_t>(hp.n_layer) * T * K);
  }
  s->sh = c.Take<float>(T * D);
  s->shg = c.Take<float>(T);
  s->xo = c.Take<float>(n_out * D);
  s->logits = c.Take<float>(LogitsRowsHeld(n_out, n_seq) * hp.n_vocab);
  return c.used();
}

// Writes the whole k (or v) rows of positions [pos0, pos0 + T) from src (T rows of src_stride
// floats), encoded in the view's type: one call per run of positions inside one block.
void WriteKvRows(Backend &be, const KvView &kv, bool values, int pos0, int64_t T, const float *src,
                 int64_t src_stride) {
  const int width = values ? kv.v_width : kv.k_width;
  const KvType type = values ? kv.v_type : kv.k_type;
  const int64_t row_bytes = static_cast<int64_t>(values ? kv.v_row_bytes() : kv.k_row_bytes());
  for (int64_t t = 0; t < T;) {
    const int pos = pos0 + static_cast<int>(t);
    const int64_t run = std::min<int64_t>(T - t, kKvBlockTokens - pos % kKvBlockTokens);
    uint8_t *dst = values ? kv.v_row(pos) : kv.k_row(pos);
    be.WriteKvBytes(dst, row_bytes, src + t * src_stride, src_stride, run, width, type);
    t += run;
  }
}

// The rows of one sequence in the batch: rows [row0, row0 + n) at positions pos0.. of its cache.
struct SeqRows {
  KvCache *kv = nullptr;
  int64_t row0 = 0, n = 0;
  int pos0 = 0;
};

// A decode step's rows as KvRowRefs (one row per sequence): layer l's are dev + l T in backend
// memory and host + l T on the host; max_keys bounds every row's visible positions.
struct DecodeRows {
  const KvRowRef *dev = nullptr, *host = nullptr;
  int max_keys = 0;
};

// Self-attention of layer l over the T new rows of every sequence (positions in S.pos, backend
// memory): h (T, D) is the normalised layer input, o (T, D) receives the output projection. The
// projections, norms and rotations run over all T rows at once; each sequence then writes its K/V
// rows into its own cache and attends over it.
void LatentAttention(const HParams &hp, const LayerWeights &L, int l, Backend &be, const std::vector<SeqRows> &seqs,
                     const float *h, int64_t T, const Scratch &S, float *o);

void SelfAttention(const HParams &hp, const LayerWeights &L, int l, Backend &be, const std::vector<SeqRows> &seqs,
                   const DecodeRows &rows, const float *h, int64_t T, const Scratch &S, float *o) {
  if (hp.mla) {
    LatentAttention(hp, L, l, be, seqs, h, T, S, o);
    return;
  }
  const int32_t *pos = S.pos;
  const int64_t D = hp.n_embd, QD = hp.q_dim(), KVD = hp.kv_dim();
  float *q = S.q, *k = S.k, *v = S.v, *att = S.att;
  // q (T, n_head * head_dim), k and v (T, n_head_kv * head_dim)
  const Matrix *qkv[3] = {&L.wq, &L.wk, &L.wv};
  float *const qkv_out[3] = {q, k, v};
  be.MatMulMany(qkv, qkv_out, 3, h, T);
  if (hp.attn_bias) {
    be.AddBias(q, T, QD, L.bq.values.data());
    be.AddBias(k, T, KVD, L.bk.values.data());
    be.AddBias(v, T, KVD, L.bv.values.data());
  }
  const std::vector<float> inv_freq = RopeFrequencies(hp, hp.head_dim);
  const RopeParams rp = RopeParamsFor(hp, inv_freq);
  if (hp.qk_norm && !hp.qk_norm_full) {  // Qwen3: a norm per head, then the rotation
    be.NormRope(q, k, T, hp.n_head, hp.n_head_kv, hp.head_dim, L.q_norm.values.data(), L.k_norm.values.data(),
                hp.rms_eps, pos, hp.rope_theta, hp.rope_style, rp);
  } else {
    if (hp.qk_norm) {  // OLMoE: one norm over the whole projection
      be.RmsNorm(q, L.q_norm.values.data(), T, QD, hp.rms_eps, q);
      be.RmsNorm(k, L.k_norm.values.data(), T, KVD, hp.rms_eps, k);
    }
    be.Rope(q, T, hp.n_head, hp.head_dim, pos, hp.rope_theta, hp.rope_style, rp);
    be.Rope(k, T, hp.n_head_kv, hp.head_dim, pos, hp.rope_theta, hp.rope_style, rp);
  }
  AttentionParams ap;
  ap.scale = hp.attn_scale;
  if (L.sinks.tensor != nullptr) ap.sinks = L.sinks.values.data();
  if (rows.dev != nullptr) {  // a decode step: every sequence in one call each
    const KvRowRef *rd = rows.dev + static_cast<int64_t>(l) * T, *rh = rows.host + static_cast<int64_t>(l) * T;
    const int kvd = static_cast<int>(KVD);
    be.WriteKvRows(rd, rh, T, k, v, kvd, kvd);
    be.AttentionRows(q, rd, rh, T, rows.max_keys, hp.n_head, hp.n_head_kv, hp.head_dim, kvd, kvd, att, ap);
  } else {
    for (const SeqRows &sq : seqs) {
      KvView cache = sq.kv->layer(l);
      WriteKvRows(be, cache, false, sq.pos0, sq.n, k + sq.row0 * KVD, KVD);
      WriteKvRows(be, cache, true, sq.pos0, sq.n, v + sq.row0 * KVD, KVD);
      be.Attention(q + sq.row0 * QD, cache, sq.n, sq.pos0, hp.n_head, hp.n_head_kv, hp.head_dim,
                   sq.kv->WindowFor(hp, l), att + sq.row0 * QD, ap);
    }
  }
  be.MatMul(L.wo, att, T, o);  // o (T, D)
  if (hp.attn_out_bias) be.AddBias(o, T, D, L.bo.values.data());
}

// Multi-head latent attention (DeepSeek-V2/V3) of layer l over T new tokens of one sequence, in the
// absorbed-weights form: the cache row of a token is its normalised latent c (kv_lora_rank) and its
// rotated shared RoPE key (qk_rope_dim); each head's query is taken into the latent space
// (q_nope · W_UK[h]), attention runs over the latent rows as one shared key/value head, and the
// result leaves the latent space through W_UV[h]. Never expands per-head keys or values.
void LatentAttention(const HParams &hp, const LayerWeights &L, int l, Backend &be, const std::vector<SeqRows> &seqs,
                     const float *h, int64_t T, const Scratch &S, float *o) {
  const int32_t *pos = S.pos;
  const int64_t H = hp.n_head, QK = hp.head_dim, NOPE = hp.qk_nope_dim, ROPE = hp.qk_rope_dim;
  const int64_t R = hp.kv_lora_rank, V = hp.v_head_dim, W = R + ROPE;
  // q (T, H, QK): per head qk_nope_dim plain dims then qk_rope_dim rotated ones.
  float *q = S.q;
  if (hp.q_lora_rank > 0) {
    be.MatMul(L.wq_a, h, T, S.qa);  // (T, q_lora_rank)
    be.RmsNorm(S.qa, L.q_a_norm.values.data(), T, hp.q_lora_rank, hp.lora_norm_eps, S.qa);
    be.MatMul(L.wq_b, S.qa, T, q);
  } else {
    be.MatMul(L.wq, h, T, q);
  }
  // kva (T, kv_lora_rank + qk_rope_dim): the latent then the shared RoPE key. c (T, R) the
  // normalised latent, kpe (T, ROPE) the key, qpe (T, H, ROPE) the queries' rotated parts.
  be.MatMul(L.wkv_a, h, T, S.kva);
  be.CopyRows(S.c, R, S.kva, W, T, R);
  be.RmsNorm(S.c, L.kv_a_norm.values.data(), T, R, hp.lora_norm_eps, S.c);
  be.CopyRows(S.kpe, ROPE, S.kva + R, W, T, ROPE);
  be.CopyRows(S.qpe, ROPE, q + NOPE, QK, T * H, ROPE);
  const std::vector<float> inv_freq = RopeFrequencies(hp, static_cast<int>(ROPE));
  const RopeParams rp = RopeParamsFor(hp, inv_freq);
  be.Rope(S.kpe, T, 1, static_cast<int>(ROPE), pos, hp.rope_theta, hp.rope_style, rp);
  be.Rope(S.qpe, T, static_cast<int>(H), static_cast<int>(ROPE), pos, hp.rope_theta, hp.rope_style, rp);
  // The cache rows [c | kpe] are put together in kva (whose raw latent is no longer needed), so each
  // row is written (and encoded) whole.
  be.CopyRows(S.kva, W, S.c, R, T, R);
  be.CopyRows(S.kva + R, W, S.kpe, ROPE, T, ROPE);
  for (const SeqRows &sq : seqs) WriteKvRows(be, sq.kv->layer(l), false, sq.pos0, sq.n, S.kva + sq.row0 * W, W);
  // qlat (T, H, R + ROPE) = [q_nope[h] · W_UK[h] | q_pe[h]]
  const bool fused = L.wkv_b.tensor != nullptr;
  for (int64_t hh = 0; hh < H; ++hh) {
    be.CopyRows(S.qn, NOPE, q + hh * QK, H * QK, T, NOPE);  // qn (T, NOPE)
    if (fused) {  // W_UK[h] is (qk_nope_dim, R): rows [h (NOPE + V), + NOPE) of kv_b
      be.MatMulInputMajor(RowsOf(L.wkv_b, hh * (NOPE + V), NOPE), S.qn, T, S.ql);
    } else {      // k_b holds W_UK[h] transposed, (R, qk_nope_dim)
      be.MatMul(RowsOf(L.wk_b, hh * R, R), S.qn, T, S.ql);
    }
    be.CopyRows(S.qlat + hh * W, H * W, S.ql, R, T, R);
    be.CopyRows(S.qlat + hh * W + R, H * W, S.qpe + hh * ROPE, H * ROPE, T, ROPE);
  }
  // att (T, H, R): each head's softmax-weighted sum of latents
  AttentionParams ap;
  ap.scale = hp.attn_scale;
  ap.latent = true;
  ap.v_dim = static_cast<int>(R);
  for (const SeqRows &sq : seqs) {
    be.Attention(S.qlat + sq.row0 * H * W, sq.kv->layer(l), sq.n, sq.pos0, static_cast<int>(H), 1,
                 static_cast<int>(W), sq.kv->WindowFor(hp, l), S.att + sq.row0 * H * R, ap);
  }
  for (int64_t hh = 0; hh < H; ++hh) {
    be.CopyRows(S.ah, R, S.att + hh * R, H * R, T, R);  // ah (T, R)
    // W_UV[h] (V, R): rows [h (NOPE + V) + NOPE, + V) of kv_b, or slice h of v_b
    const Matrix wuv = fused ? RowsOf(L.wkv_b, hh * (NOPE + V) + NOPE, V) : RowsOf(L.wv_b, hh * V, V);
    be.MatMul(wuv, S.ah, T, S.oh);  // (T, V)
    be.CopyRows(S.ov + hh * V, H * V, S.oh, V, T, V);
  }
  be.MatMul(L.wo, S.ov, T, o);  // o (T, D)
}

// The feed-forward part of layer l for T tokens (of any sequences): h (T, D) normalised input ->
// o (T, D). A dense layer runs its MLP; a MoE layer routes each token, gathers the tokens of each
// distinct selected expert into one contiguous group (expert by expert, ascending), runs each
// expert once over its group, sums each token's slots in slot order, and adds the shared
// expert(s). The host sees the selections (one download per layer) to group tokens and to drive
// the ExpertSource; the activations stay in backend memory. When the source hands out resident
// weights and the backend can route and group by itself (RoutedExperts), the host sees nothing
// during the pass: *on_backend is set and the selections stay in S.sel for the accounting after it.
void AddShared(const HParams &hp, const LayerWeights &L, Backend &be, const float *h, int64_t T, const Scratch &S,
               float *o);

absl::Status FeedForward(const HParams &hp, const LayerWeights &L, int l, Backend &be, ExpertSource *source,
                         const float *h, int64_t T, const Scratch &S, float *o, bool *on_backend) {
  const int64_t D = hp.n_embd, K = hp.n_expert_used;
  if (hp.is_dense(l)) {
    be.ExpertFfn(L.dense, h, T, o);
    return absl::OkStatus();
  }
  be.MatMul(L.router, h, T, S.router);  // router (T, n_expert)
  if (L.router_bias.tensor != nullptr) be.AddBias(S.router, T, hp.n_expert, L.router_bias.values.data());
  const bool on_tables = source != nullptr && !source->resident() && source->routes_on_device();
  if (source == nullptr || source->resident() || on_tables) {
    RoutedExpertsArgs ra;
    ra.tables_only = on_tables;
    ra.layer = l;
    ra.weights = &L;
    ra.route = RouteParamsFor(hp, L.expert_select_bias);
    ra.logits = S.router;
    ra.h = h;
    ra.n_tok = T;
    ra.sel = S.sel + static_cast<int64_t>(l) * T * K;
    ra.wts = S.wts;
    ra.xg = S.xg;
    ra.yg = S.yg;
    ra.idx = S.idx;
    ra.n_embd = D;
    ra.out = o;
    if (be.RoutedExperts(ra)) {
      *on_backend = true;
      AddShared(hp, L, be, h, T, S, o);
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> sel(T * K);
  be.Route(RouteParamsFor(hp, L.expert_select_bias), S.router, T, sel.data(), S.wts);
  STRATA_RETURN_IF_ERROR(be.TakeError());
  if (source != nullptr) source->OnRoute(l, h, T, sel.data(), static_cast<int>(K));
  // Group tokens by expert so each expert's weights are fetched and used once per batch.
  const ExpertGroups groups = GroupByExpert(sel.data(), T, static_cast<int>(K), hp.n_expert);
  const std::vector<int32_t> &used = groups.used, &idx = groups.idx;
  const std::vector<int64_t> &first = groups.first;
  std::vector<const ExpertWeights *> ew(used.size());
  if (source != nullptr) {
    // Experts still being read come back null: the others run first, overlapping those reads.
    absl::Status st = source->AcquireAsync(l, used, &ew);
    if (!st.ok()) return Annotate(st, strata::StrFormat("layer %d experts", l));
  } else {
    for (size_t u = 0; u < used.size(); ++u) ew[u] = &L.experts[used[u]];
  }
  be.Upload(S.idx, idx.data(), idx.size() * sizeof(int32_t));
  be.GatherRows(h, D, S.idx, T * K, S.xg);  // xg (T K, D): the tokens of each expert in turn
  // Each expert writes its own rows of yg, so the order they run in does not change a number: the
  // ready ones together, then each missing one as its read completes.
  be.ExpertsFfn(ew.data(), static_cast<int>(used.size()), first.data(), S.xg, S.yg, D);
  for (size_t u = 0; u < used.size(); ++u) {
    if (ew[u] != nullptr) continue;
    absl::StatusOr<const ExpertWeights *> w = source->Await(l, used[u]);
    if (!w.ok()) {
      source->Release(l, used);
      return Annotate(w.status(), strata::StrFormat("layer %d experts", l));
    }
    be.ExpertFfn(**w, S.xg + first[u] * D, first[u + 1] - first[u], S.yg + first[u] * D);
  }
  if (source != nullptr) source->Release(l, used);
  // o (T, D) = sum over slots of weight * expert output.
  be.WeightedRowSum(S.yg, S.idx + T * K, S.wts, T, static_cast<int>(K), D, o);
  AddShared(hp, L, be, h, T, S, o);
  return absl::OkStatus();
}

// o (T, D) += the shared expert(s) over every token (resident), gated when the family gates them.
void AddShared(const HParams &hp, const LayerWeights &L, Backend &be, const float *h, int64_t T, const Scratch &S,
               float *o) {
  const int64_t D = hp.n_embd;
  if (L.shared.present()) {
    be.ExpertFfn(L.shared, h, T, S.sh);
    if (L.shared_gate.tensor != nullptr) {
      be.MatMul(L.shared_gate, h, T, S.shg);  // (T, 1)
      be.SigmoidScaleRows(S.sh, S.shg, T, D);
    }
    be.Add(o, S.sh, T * D);
  }
}

// The accounting of layers whose experts were routed in backend memory: the source hears of each
// layer's selections and uses, in layer order, as the host path would have told it during the pass.
absl::Status ReportRouted(const HParams &hp, Backend &be, ExpertSource *source,
                          const std::vector<char> &routed, const Scratch &S, int64_t T) {
  if (source == nullptr || std::none_of(routed.begin(), routed.end(), [](char r) { return r != 0; })) {
    return absl::OkStatus();
  }
  const int64_t K = hp.n_expert_used;
  std::vector<int32_t> sel(static_cast<size_t>(hp.n_layer) * T * K);
  be.Download(sel.data(), S.sel, sel.size() * sizeof(int32_t));
  STRATA_RETURN_IF_ERROR(be.TakeError());
  std::vector<const ExpertWeights *> ew;
  for (int l = 0; l < hp.n_layer; ++l) {
    if (!routed[l]) continue;
    const int32_t *ls = sel.data() + static_cast<int64_t>(l) * T * K;
    source->OnRoute(l, nullptr, T, ls, static_cast<int>(K));
    std::vector<char> seen(hp.n_expert, 0);
    for (int64_t i = 0; i < T * K; ++i) {
      if (ls[i] < 0 || ls[i] >= hp.n_expert) {
        return Errorf(MOE_ERR_INTERNAL, "layer %d routed to expert %d of %d", l, ls[i], hp.n_expert);
      }
      seen[ls[i]] = 1;
    }
    std::vector<int32_t> used;
    for (int e = 0; e < hp.n_expert; ++e) {
      if (seen[e]) used.push_back(e);
    }
    STRATA_RETURN_IF_ERROR(source->Acquire(l, used, &ew));
    source->Release(l, used);
  }
  return absl::OkStatus();
}

}  // namespace

size_t ForwardWorkspaceBytes(const HParams &hp, int64_t n_tok, int64_t n_out, int64_t n_seq) {
  Scratch s;
  return Lay(hp, n_tok, n_out, n_seq, nullptr, &s);
}

namespace {
void (*g_layer_hook)(int, void *) = nullptr;
void *g_layer_hook_user = nullptr;
}  // namespace

void SetLayerHookForTesting(void (*fn)(int layer, void *user), void *user) {
  g_layer_hook = fn;
  g_layer_hook_user = user;
}

absl::Status Forward(const HParams &hp, const ModelWeights &w, Backend &be, const ForwardArgs &a,
                     std::vector<std::vector<float>> *logits) {
  // Between layers: the test hook, then the host's abort request.
  auto aborted = [&](int l) {
    if (g_layer_hook != nullptr) g_layer_hook(l, g_layer_hook_user);
    return a.abort != nullptr && a.abort->load(std::memory_order_acquire);
  };
  auto abort_status = [&](int l) {
    return Errorf(MOE_ERR_ABORTED, "the step was aborted (moe_ctx_abort) before layer %d of %d", l, hp.n_layer);
  };
  if (aborted(0)) return abort_status(0);
  const size_t n_seq = a.seqs.size();
  if (n_seq == 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "forward pass over no sequence");
  // Row offsets of each sequence in the concatenated batch.
  std::vector<int64_t> row0(n_seq + 1, 0);
  for (size_t s = 0; s < n_seq; ++s) {
    const SequenceArgs &q = a.seqs[s];
    if (q.kv == nullptr || q.n_tok <= 0 || q.tokens == nullptr) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "sequence %u of the batch: no cache or %d tokens", s, q.n_tok);
    }
    if (q.logits_dst == nullptr && logits == nullptr) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "sequence %u of the batch: nowhere to put its logits", s);
    }
    if (q.pos0 < 0 || q.pos0 + q.n_tok > q.kv->n_ctx()) {
      return Errorf(MOE_ERR_LIMIT_CONTEXT, "positions %d..%d do not fit the context of %d tokens", q.pos0,
                    q.pos0 + q.n_tok - 1, q.kv->n_ctx());
    }
    for (int64_t t = 0; t < q.n_tok; ++t) {
      if (q.tokens[t] < 0 || q.tokens[t] >= hp.n_vocab) {
        return Errorf(MOE_ERR_INVALID_ARGUMENT, "token id %d is outside the vocabulary of %d", q.tokens[t],
                      hp.n_vocab);
      }
    }
    for (size_t r = 0; r < s; ++r) {
      if (a.seqs[r].kv == q.kv) return Errorf(MOE_ERR_INVALID_ARGUMENT, "sequences %u and %u share a cache", r, s);
    }
    row0[s + 1] = row0[s] + q.n_tok;
  }
  // Blocks for every sequence's new positions (the budget may refuse: nothing is written then) and
  // their mask.
  for (const SequenceArgs &q : a.seqs) STRATA_RETURN_IF_ERROR(q.kv->Prepare(q.pos0, q.tokens, q.n_tok));
  const int64_t T = row0[n_seq], D = hp.n_embd;
  int64_t n_out = 0;
  for (size_t s = 0; s < n_seq; ++s) n_out += a.seqs[s].all_logits ? a.seqs[s].n_tok : 1;

  // --- workspace: the caller's when it is large enough, else one for this call ---
  const int64_t held = LogitsRowsHeld(n_out, static_cast<int64_t>(n_seq));  // < n_out: chunked
  const size_t ws_bytes = ForwardWorkspaceBytes(hp, T, n_out, static_cast<int64_t>(n_seq));
  std::unique_ptr<Buffer> own;
  std::unique_ptr<Buffer> *ws = a.workspace != nullptr ? a.workspace : &own;
  if (*ws == nullptr || (*ws)->bytes() < ws_bytes) {
    ws->reset();
    STRATA_ASSIGN_OR_RETURN(*ws, be.Allocate(ws_bytes));
  }
  Scratch S;
  Lay(hp, T, n_out, static_cast<int64_t>(n_seq), (*ws)->data(), &S);

  // A decode step (one new token per sequence, grouped-query attention, caches whose tables are in
  // backend memory) attends through KvRowRefs: each layer's K/V writes and attention serve every
  // sequence in one call, and nothing the step's launches take changes from one step to the next
  // but memory contents, so a backend may replay the step as a graph.
  bool decode = !hp.mla && a.workspace != nullptr && held == n_out;
  int max_pos = 0;
  for (const SequenceArgs &q : a.seqs) {
    decode = decode && q.n_tok == 1 && q.kv->has_device_table();
    max_pos = std::max(max_pos, q.pos0);
  }
  // tokens then positions of every sequence in order (then a decode step's rows), in one upload
  const size_t rows_off = static_cast<size_t>(reinterpret_cast<char *>(S.rows) - reinterpret_cast<char *>(S.tok));
  const size_t n_rows = decode ? static_cast<size_t>(hp.n_layer) * T : 0;
  std::vector<char> inputs(decode ? rows_off + n_rows * sizeof(KvRowRef) : 2 * T * sizeof(int32_t));
  int32_t *tok_pos = reinterpret_cast<int32_t *>(inputs.data());
  for (size_t s = 0; s < n_seq; ++s) {
    const SequenceArgs &q = a.seqs[s];
    std::copy(q.tokens, q.tokens + q.n_tok, tok_pos + row0[s]);
    for (int64_t t = 0; t < q.n_tok; ++t) tok_pos[T + row0[s] + t] = q.pos0 + static_cast<int32_t>(t);
  }
  DecodeRows rows;
  if (decode) {
    KvRowRef *rh = reinterpret_cast<KvRowRef *>(inputs.data() + rows_off);
    for (size_t s = 0; s < n_seq; ++s) {
      KvCache &kv = *a.seqs[s].kv;
      STRATA_RETURN_IF_ERROR(kv.SyncDevice());
      for (int l = 0; l < hp.n_layer; ++l) {
        rh[static_cast<int64_t>(l) * T + row0[s]] =
            KvRowRef{kv.device_k_table(l), kv.device_v_table(l), kv.device_mask(), a.seqs[s].pos0, kv.WindowFor(hp, l),
                     kv.k_type(), kv.v_type()};
      }
    }
    rows.dev = S.rows;
    rows.host = rh;
    // Launch bounds by powers of two, so a growing context changes them (and the step) rarely.
    rows.max_keys = 64;
    while (rows.max_keys < max_pos + 1) rows.max_keys *= 2;
  }
  be.Upload(S.tok, inputs.data(), inputs.size());

  std::vector<SeqRows> seq_rows;
  for (size_t s = 0; s < n_seq; ++s) {
    seq_rows.push_back(SeqRows{a.seqs[s].kv, row0[s], a.seqs[s].n_tok, a.seqs[s].pos0});
  }
  std::vector<char> routed_on_backend(hp.n_layer, 0);
  // Sequence s's logits are output rows [out0[s], out0[s + 1]), bound for dst[s].
  if (logits != nullptr) logits->assign(n_seq, {});
  std::vector<int64_t> out0(n_seq + 1, 0);
  std::vector<float *> dst(n_seq);
  for (size_t s = 0; s < n_seq; ++s) {
    out0[s + 1] = out0[s] + (a.seqs[s].all_logits ? a.seqs[s].n_tok : 1);
    dst[s] = a.seqs[s].logits_dst;
    if (dst[s] == nullptr) {
      (*logits)[s].resize(static_cast<size_t>(out0[s + 1] - out0[s]) * hp.n_vocab);
      dst[s] = (*logits)[s].data();
    }
  }
  // Output rows [r0, r0 + n), held in S.logits, straight to where they are read: one transfer, one
  // part a sequence.
  auto download = [&](int64_t r0, int64_t n) {
    std::vector<Backend::DownloadPart> parts;
    for (size_t s = 0; s < n_seq; ++s) {
      const int64_t lo = std::max(r0, out0[s]), hi = std::min(r0 + n, out0[s + 1]);
      if (lo < hi) {
        parts.push_back(Backend::DownloadPart{dst[s] + (lo - out0[s]) * hp.n_vocab,
                                              static_cast<size_t>(hi - lo) * hp.n_vocab * sizeof(float)});
      }
    }
    be.DownloadParts(S.logits, parts.data(), parts.size());
  };
  // While a backend records the step (a graph), nothing runs yet: no layer boundary to stop at.
  bool recording = false;
  // The step's device work, from the embeddings to the logits.
  auto run = [&]() -> absl::Status {
    be.GetRows(w.tok_embd, S.tok, T, S.x);  // x (T, D): every sequence's rows in order
    // Each residual add is fused with the norm that follows it (the next block's input).
    be.RmsNorm(S.x, w.layers[0].attn_norm.values.data(), T, D, hp.rms_eps, S.h);
    for (int l = 0; l < hp.n_layer; ++l) {
      if (l > 0 && !recording && aborted(l)) {
        // The work queued so far ends before the caller frees what it writes (KV blocks).
        float sink;
        be.Download(&sink, S.x, sizeof sink);
        (void)be.TakeError();
        return abort_status(l);
      }
      const LayerWeights &L = w.layers[l];
      SelfAttention(hp, L, l, be, seq_rows, rows, S.h, T, S, S.o);
      be.AddRmsNorm(S.x, S.o, L.ffn_norm.values.data(), T, D, hp.rms_eps, S.h);
      bool routed = false;
      STRATA_RETURN_IF_ERROR(FeedForward(hp, L, l, be, a.experts, S.h, T, S, S.o, &routed));  // all tokens at once
      routed_on_backend[l] = routed;
      if (l + 1 < hp.n_layer) {
        be.AddRmsNorm(S.x, S.o, w.layers[l + 1].attn_norm.values.data(), T, D, hp.rms_eps, S.h);
      } else {
        be.Add(S.x, S.o, T * D);
      }
      STRATA_RETURN_IF_ERROR(be.TakeError());
    }
    // --- output head: the rows each sequence wants, gathered into one matrix ---
    int64_t done = 0;
    for (size_t s = 0; s < n_seq; ++s) {
      const int64_t n = a.seqs[s].all_logits ? a.seqs[s].n_tok : 1;
      be.CopyRows(S.xo + done * D, D, S.x + (row0[s + 1] - n) * D, D, n, D);
      done += n;
    }
    be.RmsNorm(S.xo, w.output_norm.values.data(), n_out, D, hp.rms_eps, S.h);
    if (held == n_out) {
      be.MatMul(w.output, S.h, n_out, S.logits);  // (n_out, n_vocab), downloaded after the step
      return be.TakeError();
    }
    // More rows than the workspace holds (an eager pass, never recorded): chunk by chunk.
    for (int64_t r0 = 0; r0 < n_out; r0 += held) {
      const int64_t n = std::min(held, n_out - r0);
      be.MatMul(w.output, S.h + r0 * D, n, S.logits);
      STRATA_RETURN_IF_ERROR(be.TakeError());
      download(r0, n);
    }
    return be.TakeError();
  };
  // A step whose experts the backend routes by itself (resident, or on the tiers' tables) is keyed
  // apart from one that asks the host, so a recording of the one never replays for the other.
  const bool on_backend = a.experts == nullptr || a.experts->resident() || a.experts->routes_on_device();
  const StepKey key{T, n_out, (*ws)->data(), rows.max_keys, on_backend};
  const Backend::StepMode mode = decode ? be.BeginStep(key) : Backend::StepMode::kEager;
  if (mode == Backend::StepMode::kReplay) {
    // Replayed only after a run of the same step went without a host round trip: every MoE layer
    // routed in backend memory.
    for (int l = 0; l < hp.n_layer; ++l) routed_on_backend[l] = hp.n_expert > 0 && !hp.is_dense(l);
  } else {
    recording = mode == Backend::StepMode::kCapture;
    absl::Status st = run();
    recording = false;
    absl::Status end = decode ? be.EndStep() : absl::OkStatus();
    if (mode == Backend::StepMode::kCapture && !(st.ok() && end.ok())) {
      (void)be.TakeError();  // the recording failed and nothing ran: run the step as usual
      std::fill(routed_on_backend.begin(), routed_on_backend.end(), 0);
      STRATA_RETURN_IF_ERROR(run());
    } else {
      STRATA_RETURN_IF_ERROR(st);
      STRATA_RETURN_IF_ERROR(end);
    }
  }
  if (held == n_out) download(0, n_out);  // else run() did, chunk by chunk
  STRATA_RETURN_IF_ERROR(be.TakeError());
  return ReportRouted(hp, be, a.experts, routed_on_backend, S, T);
}

absl::Status Forward(const HParams &hp, const ModelWeights &w, Backend &be, KvCache &kv, const int32_t *tokens,
                     int64_t n_tok, int pos0, bool all_logits, ExpertSource *experts, std::vector<float> *logits) {
  ForwardArgs a;
  a.seqs.push_back(SequenceArgs{&kv, tokens, n_tok, pos0, all_logits});
  a.experts = experts;
  std::vector<std::vector<float>> out;
  STRATA_RETURN_IF_ERROR(Forward(hp, w, be, a, &out));
  *logits = std::move(out[0]);
  return absl::OkStatus();
}

}  // namespace strata::model
