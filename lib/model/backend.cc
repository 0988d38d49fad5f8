// The Backend interface's default operations, for backends computing in host memory.
#include "lib/model/backend.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "lib/quant/codec.h"
#include "lib/store/tier.h"

namespace strata::model {

const char *KvTypeName(KvType t) {
  switch (t) {
    case KvType::kF16:
      return "f16";
    case KvType::kQ8_0:
      return "q8_0";
    default:
      return "f32";
  }
}

bool ParseKvType(std::string_view name, KvType *out) {
  std::string lower(name);
  for (char &c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kQ8_0}) {
    if (lower == KvTypeName(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

void EncodeKvRow(KvType t, const float *src, int width, uint8_t *dst) {
  switch (t) {
    case KvType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(width) * sizeof(float));
      return;
    case KvType::kF16:
      for (int i = 0; i < width; ++i) {
        const uint16_t h = quant::FloatToHalf(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      return;
    case KvType::kQ8_0: {
      // The whole blocks through the codec (ggml's rounding), a partial last block zero-padded.
      static const quant::Codec *q8 = quant::FindCodec(quant::TypeId::kQ8_0);
      const int full = width / kKvQ8Elems * kKvQ8Elems;
      if (full > 0) q8->quantize(src, dst, full);
      if (full < width) {
        float tail[kKvQ8Elems] = {};
        std::memcpy(tail, src + full, static_cast<size_t>(width - full) * sizeof(float));
        q8->quantize(tail, dst + full / kKvQ8Elems * kKvQ8Bytes, kKvQ8Elems);
      }
      return;
    }
  }
}

namespace {

// Every half's float value (256 KiB), for decoding f16 rows without a conversion per value.
const float *HalfTable() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = quant::HalfToFloat(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

}  // namespace

void DecodeKvCols(KvType t, const uint8_t *row, int c0, int n, float *out) {
  switch (t) {
    case KvType::kF32:
      std::memcpy(out, row + static_cast<size_t>(c0) * sizeof(float), static_cast<size_t>(n) * sizeof(float));
      return;
    case KvType::kF16: {
      const float *half = HalfTable();
      for (int i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * static_cast<size_t>(c0 + i), 2);
        out[i] = half[h];
      }
      return;
    }
    case KvType::kQ8_0: {
      const float *half = HalfTable();
      // Block by block: the values [lo, hi) of block b, each q d.
      for (int c = c0, end = c0 + n; c < end;) {
        const int b = c / kKvQ8Elems, lo = c - b * kKvQ8Elems;
        const int hi = std::min(kKvQ8Elems, end - b * kKvQ8Elems);
        const uint8_t *blk = row + static_cast<size_t>(b) * kKvQ8Bytes;
        uint16_t h;
        std::memcpy(&h, blk, 2);
        const float d = half[h];
        const int8_t *qs = reinterpret_cast<const int8_t *>(blk + 2);
        float *o = out + (c - c0);
        for (int j = lo; j < hi; ++j) o[j - lo] = static_cast<float>(qs[j]) * d;
        c = b * kKvQ8Elems + hi;
      }
      return;
    }
  }
}

void Backend::ExpertsFfn(const ExpertWeights *const *ew, int n, const int64_t *first, const float *xg, float *yg,
                         int64_t width) {
  for (int u = 0; u < n; ++u) {
    if (ew[u] != nullptr) ExpertFfn(*ew[u], xg + first[u] * width, first[u + 1] - first[u], yg + first[u] * width);
  }
}

void Backend::WriteKvBytes(uint8_t *dst, int64_t dst_stride, const float *src, int64_t src_stride, int64_t rows,
                           int width, KvType t) {
  if (t == KvType::kF32 && dst_stride % sizeof(float) == 0) {
    CopyRows(reinterpret_cast<float *>(dst), dst_stride / static_cast<int64_t>(sizeof(float)), src, src_stride, rows,
             width);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) EncodeKvRow(t, src + r * src_stride, width, dst + r * dst_stride);
}

void Backend::ReadKvBytes(float *dst, int64_t dst_stride, const uint8_t *src, int64_t src_stride, int64_t rows,
                          int width, KvType t) {
  if (t == KvType::kF32 && src_stride % sizeof(float) == 0) {
    CopyRows(dst, dst_stride, reinterpret_cast<const float *>(src), src_stride / static_cast<int64_t>(sizeof(float)),
             rows, width);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) DecodeKvCols(t, src + r * src_stride, 0, width, dst + r * dst_stride);
}

void Backend::WriteKvRows(const KvRowRef *, const KvRowRef *rows_host, int64_t n, const float *k, const float *v,
                          int k_width, int v_width) {
  for (int64_t t = 0; t < n; ++t) {
    const KvRowRef &r = rows_host[t];
    const KvView kv = r.HostView(k_width, v_width);
    WriteKvBytes(kv.k_row(r.pos), 0, k + t * k_width, k_width, 1, k_width, kv.k_type);
    if (v_width > 0) WriteKvBytes(kv.v_row(r.pos), 0, v + t * v_width, v_width, 1, v_width, kv.v_type);
  }
}

void Backend::AttentionRows(const float *q, const KvRowRef *, const KvRowRef *rows_host, int64_t n, int,
                            int n_head, int n_head_kv, int head_dim, int k_width, int v_width, float *out,
                            const AttentionParams &p) {
  const int64_t out_width = static_cast<int64_t>(n_head) * (p.latent ? p.v_dim : head_dim);
  for (int64_t t = 0; t < n; ++t) {
    const KvRowRef &r = rows_host[t];
    Attention(q + t * n_head * head_dim, r.HostView(k_width, v_width), 1, r.pos, n_head, n_head_kv, head_dim, r.window,
              out + t * out_width, p);
  }
}

std::unique_ptr<store::DeviceSlots> Backend::MakeDeviceSlots() { return nullptr; }

}  // namespace strata::model
