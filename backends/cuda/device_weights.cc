// CudaBackend's weights on the device: the host arena's resident matrices copied once (float32
// where a codec has no device kernel), the packed vectors, mapped host ranges, and Resolve from a
// host weight address to its device copy. A region's host bytes are its key and never move.
#include "backends/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cuda_backend_internal.h"
#include "backends/cuda/cuda_status.h"
#include "backends/cuda/device_slots.h"
#include "lib/quant/codec.h"
#include "lib/util/tunables.h"

namespace strata::cuda {

std::atomic<bool> g_copier_claimed{false};

namespace {

template <typename F>
void ForEachExpert(const model::LayerWeights &L, F &&f) {
  for (const auto &e : L.experts) f(e);
  f(L.dense);
  f(L.shared);
}

// Every matrix and vector of the model, for adoption.
template <typename FM, typename FV>
void ForEachWeight(const model::ModelWeights &w, FM &&fm, FV &&fv) {
  fm(w.tok_embd);
  fm(w.output);
  fv(w.output_norm);
  for (const auto &L : w.layers) {
    for (const model::Matrix *m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.wq_a, &L.wq_b, &L.wkv_a, &L.wkv_b, &L.wk_b,
                                   &L.wv_b, &L.router, &L.shared_gate}) {
      fm(*m);
    }
    for (const model::Vec *v : {&L.attn_norm, &L.bq, &L.bk, &L.bv, &L.bo, &L.q_norm, &L.k_norm, &L.sinks,
                                &L.q_a_norm, &L.kv_a_norm, &L.ffn_norm, &L.router_bias, &L.expert_select_bias}) {
      fv(*v);
    }
    ForEachExpert(L, [&](const model::ExpertWeights &e) {
      fm(e.gate);
      fm(e.up);
      fm(e.down);
      fv(e.gate_bias);
      fv(e.up_bias);
      fv(e.down_bias);
    });
  }
}

}  // namespace

// Writes m's device form (its bytes, or float32 rows) to dst.
void HostForm(const model::Matrix &m, uint8_t *dst, bool convert) {
  if (!convert) {
    std::memcpy(dst, m.data, m.nbytes());
    return;
  }
  float *out = reinterpret_cast<float *>(dst);
  for (int64_t r = 0; r < m.rows; ++r) m.codec->dequantize(m.row(r), out + r * m.cols, m.cols);
}

absl::Status CudaBackend::CheckReadsInPlace(const model::ModelWeights &w) {
  for (const model::LayerWeights &L : w.layers) {
    for (const model::ExpertWeights &e : L.experts) {
      // (A streamed expert's bias vectors are resolved by the tensor rows they copy: Resolve(Vec).)
      for (const model::Matrix *m : {&e.gate, &e.up, &e.down}) {
        if (m->tensor != nullptr && NeedsConversion(*m)) {
          return Errorf(MOE_ERR_UNSUPPORTED_BACKEND,
                        "the CUDA backend reads the experts its VRAM budget does not hold where they lie, which %s "
                        "(%s, %lld x %lld) does not allow: its kernels need rows of a multiple of 32 columns; "
                        "give VRAM room for every expert, or use the CPU backend",
                        m->name, std::string(quant::TypeName(static_cast<uint32_t>(m->codec->id))),
                        static_cast<long long>(m->rows), static_cast<long long>(m->cols));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::MapHostMemory(const uint8_t *p, size_t bytes) {
  if (p == nullptr || bytes == 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "mapping %zu bytes at %p", bytes, p);
  STRATA_RETURN_IF_ERROR(CheckReadsInPlace(*w_));
  if (cudaError_t e = cudaHostRegister(const_cast<uint8_t *>(p), bytes, cudaHostRegisterMapped); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Errorf(MOE_ERR_NO_MEMORY, "cannot page-lock the %zu bytes of the expert cache for the GPU: %s", bytes,
                  cudaGetErrorString(e));
  }
  void *dev = nullptr;
  if (cudaError_t e = cudaHostGetDevicePointer(&dev, const_cast<uint8_t *>(p), 0); e != cudaSuccess) {
    (void)cudaHostUnregister(const_cast<uint8_t *>(p));
    (void)cudaGetLastError();
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "the GPU cannot map the expert cache: %s", cudaGetErrorString(e));
  }
  regions_[p] = Region{bytes, 0, 0, false, static_cast<uint8_t *>(dev)};
  mapped_.push_back(p);
  return absl::OkStatus();
}

std::unique_ptr<store::DeviceSlots> CudaBackend::MakeDeviceSlots() {
  return std::make_unique<CudaDeviceSlots>(this);
}

void CudaBackend::AddDeviceRegion(uint8_t *dev, size_t bytes) { regions_[dev] = Region{bytes, 0, 0, false, dev}; }

void CudaBackend::ForgetDeviceRegion(uint8_t *dev) {
  (void)stream_.Synchronize();
  regions_.erase(dev);
}

void CudaBackend::UnmapHostMemory(const uint8_t *p) {
  auto it = std::find(mapped_.begin(), mapped_.end(), p);
  if (it == mapped_.end()) return;
  (void)stream_.Synchronize();
  if (p == tier_copies_) {
    // The copier reads this range: it stops first, and the tables' layers read in place from here on.
    copier_.reset();
    if (copy_stream_.get() != nullptr) (void)copy_stream_.Synchronize();
    for (LayerTable &t : tables_) t.stage = false;
    tier_copies_ = nullptr;
  }
  (void)cudaHostUnregister(const_cast<uint8_t *>(p));
  (void)cudaGetLastError();
  regions_.erase(p);
  mapped_.erase(it);
}

// The kernels read a matrix in its codec (they have a decoder for every codec lib/quant decodes) when
// they accept its shape (checked at a 256-byte aligned address, as every device copy starts); float32
// needs no conversion (cuBLASLt takes any shape). A shape they refuse (columns not a multiple of 32)
// is converted: exact, as the host dequantizer defines values.
bool CudaBackend::NeedsConversion(const model::Matrix &m) {
  if (m.codec->id == quant::TypeId::kF32 && m.row_bytes == static_cast<uint64_t>(m.cols) * 4) return false;
  const DeviceMatrix dm{m.codec->id, reinterpret_cast<const void *>(uintptr_t{256}), m.rows, m.cols, m.row_bytes};
  return !(HasDeviceCodec(m.codec->id) && CheckMatrix(dm).ok());
}

uint64_t CudaBackend::DeviceBytes(const model::Matrix &m) {
  return NeedsConversion(m) ? static_cast<uint64_t>(m.rows * m.cols) * sizeof(float) : m.nbytes();
}

absl::Status CudaBackend::Adopt(const model::ModelWeights &w, const uint8_t *arena, size_t arena_bytes) {
  // Routed experts in the arena are all resident: the runtime's tiers serve those a VRAM budget
  // does not hold (they are not in the arena then).
  absl::Status st;
  std::vector<const model::Matrix *> resident;
  size_t total = 0;
  auto on_matrix = [&](const model::Matrix &m) {
    if (m.tensor == nullptr || m.data == nullptr || m.rows <= 0) return;
    if (m.data < arena || m.data + m.nbytes() > arena + arena_bytes) {
      st.Update(Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s is not in the resident weights", m.name));
      return;
    }
    if (regions_.count(m.data) != 0) return;  // seen (tied)
    regions_[m.data] = Region{m.nbytes(), m.row_bytes, m.cols, NeedsConversion(m), nullptr};
    resident.push_back(&m);
    total += Align(DeviceBytes(m));
  };
  std::vector<const model::Vec *> vecs;
  size_t vec_floats = 0;
  auto on_vec = [&](const model::Vec &v) {
    if (v.tensor == nullptr || v.values.empty()) return;
    vecs.push_back(&v);
    vec_floats += Align(v.values.size() * sizeof(float)) / sizeof(float);
  };
  ForEachWeight(w, on_matrix, on_vec);
  STRATA_RETURN_IF_ERROR(st);
  STRATA_ASSIGN_OR_RETURN(weight_buf_, DeviceBuffer::Allocate(total));
  size_t off = 0;
  std::vector<uint8_t> tmp;
  for (const model::Matrix *m : resident) {
    Region &r = regions_[m->data];
    r.dev = weight_buf_.as<uint8_t>() + off;
    const uint64_t bytes = DeviceBytes(*m);
    if (r.converted) {
      tmp.resize(bytes);
      HostForm(*m, tmp.data(), true);
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(r.dev, tmp.data(), bytes, cudaMemcpyHostToDevice));
    } else {
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(r.dev, m->data, bytes, cudaMemcpyHostToDevice));
    }
    off += Align(bytes);
  }
  std::vector<float> packed(vec_floats, 0.f);
  STRATA_ASSIGN_OR_RETURN(vec_buf_, DeviceBuffer::Allocate(vec_floats * sizeof(float)));
  off = 0;
  for (const model::Vec *v : vecs) {
    std::copy(v->values.begin(), v->values.end(), packed.begin() + off);
    vecs_[v->values.data()] = DeviceVec{static_cast<int64_t>(v->values.size()), vec_buf_.as<float>() + off};
    vec_refs_[{v->tensor, v->sub_offset}] = vec_buf_.as<float>() + off;
    off += Align(v->values.size() * sizeof(float)) / sizeof(float);
  }
  if (!packed.empty()) {
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(vec_buf_.data(), packed.data(), packed.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  weight_bytes_ = total + vec_floats * sizeof(float);
  return absl::OkStatus();
}

absl::StatusOr<DeviceMatrix> CudaBackend::Resolve(const model::Matrix &w) const {
  if (w.data == nullptr) return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s has no resident bytes", w.name);
  const uint8_t *start = nullptr;
  const Region *r = nullptr;
  auto slot = in_slots_.find(w.data);
  if (slot != in_slots_.end()) {
    start = slot->first;
    r = &slot->second;
  } else {
    auto it = regions_.upper_bound(w.data);
    if (it != regions_.begin()) {
      --it;
      if (w.data < it->first + it->second.bytes) {
        start = it->first;
        r = &it->second;
      }
    }
  }
  if (r == nullptr) {
    return Errorf(MOE_ERR_UNSUPPORTED_BACKEND, "%s is not on the device (experts from the RAM cache need the VRAM tier)",
                  w.name);
  }
  const uint64_t off = static_cast<uint64_t>(w.data - start);
  if (!r->converted) return DeviceMatrix{w.codec->id, r->dev + off, w.rows, w.cols, w.row_bytes};
  if (off % r->host_row_bytes != 0 || w.cols != r->cols) {
    return Errorf(MOE_ERR_INTERNAL, "%s is not a row range of a converted matrix", w.name);
  }
  const int64_t row = static_cast<int64_t>(off / r->host_row_bytes);
  return DeviceMatrix{quant::TypeId::kF32, r->dev + row * r->cols * sizeof(float), w.rows, w.cols,
                      static_cast<uint64_t>(r->cols) * 4};
}

absl::StatusOr<const float *> CudaBackend::Resolve(const model::Vec &v) const {
  if (v.tensor == nullptr) return static_cast<const float *>(nullptr);
  if (absl::StatusOr<const float *> d = Resolve(v.values.data()); d.ok()) return d;
  // A streamed expert's views carry copies of its bias vectors: the same rows of the same tensors.
  auto it = vec_refs_.find({v.tensor, v.sub_offset});
  if (it == vec_refs_.end()) return Errorf(MOE_ERR_INTERNAL, "%s is not on the device", v.name);
  return static_cast<const float *>(it->second);
}

absl::StatusOr<const float *> CudaBackend::Resolve(const float *host_vec) const {
  if (host_vec == nullptr) return static_cast<const float *>(nullptr);
  auto it = vecs_.upper_bound(host_vec);
  if (it != vecs_.begin()) {
    --it;
    if (host_vec < it->first + it->second.n) return it->second.dev + (host_vec - it->first);
  }
  return Errorf(MOE_ERR_INTERNAL, "a weight vector is not on the device");
}

}  // namespace strata::cuda
