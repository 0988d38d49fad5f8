// The SwiGLU expert FFN over a group of tokens: for small groups one fused gate/up GEMV (SwiGLU
// applied as the rows finish) and a down GEMV; for larger groups three cuBLASLt GEMMs around an
// element-wise SwiGLU. Scratch comes from the caller's workspace, carved in 256-byte-aligned pieces.
#include <algorithm>

#include "backends/cuda/cuda_status.h"
#include "backends/cuda/kernels.h"

namespace strata::cuda {
namespace {

size_t RoundUp(size_t n) { return (n + 255) / 256 * 256; }

bool Fusable(const DeviceExpert &e) {
  return e.gate.type == e.up.type && e.gate.rows == e.up.rows && e.gate.cols == e.up.cols &&
         e.gate.row_bytes == e.up.row_bytes;
}

}  // namespace

size_t ExpertFfnWorkspaceBytes(const DeviceExpert &e, int64_t n_tok, Blas::Path path) {
  const size_t act = RoundUp(static_cast<size_t>(std::max<int64_t>(n_tok, 0)) * e.gate.rows * sizeof(float));
  if (Blas::Choose(n_tok, path) == Blas::Path::kGemv) return Fusable(e) ? act : 2 * act;
  return 2 * act + std::max({Blas::MatMulWorkspaceBytes(e.gate, n_tok, path), Blas::MatMulWorkspaceBytes(e.up, n_tok, path),
                             Blas::MatMulWorkspaceBytes(e.down, n_tok, path)});
}

absl::Status ExpertFfn(const Blas &blas, const DeviceExpert &e, const float *x, int64_t n_tok, float *y, Workspace ws,
                       cudaStream_t stream, Blas::Path path) {
  if (n_tok < 0) return Errorf(MOE_ERR_INVALID_ARGUMENT, "expert FFN over %d tokens", n_tok);
  if (n_tok == 0) return absl::OkStatus();
  const int64_t n_ff = e.gate.rows, n_embd = e.gate.cols;
  if (e.up.rows != n_ff || e.up.cols != n_embd || e.down.rows != n_embd || e.down.cols != n_ff) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "expert shapes disagree: gate %dx%d, up %dx%d, down %dx%d", e.gate.rows,
                  e.gate.cols, e.up.rows, e.up.cols, e.down.rows, e.down.cols);
  }
  const size_t need = ExpertFfnWorkspaceBytes(e, n_tok, path);
  if (ws.bytes < need || ws.data == nullptr) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT, "expert FFN workspace of %u bytes, %u needed", ws.bytes, need);
  }
  const size_t act = RoundUp(static_cast<size_t>(n_tok) * n_ff * sizeof(float));
  auto *base = static_cast<uint8_t *>(ws.data);
  float *g = reinterpret_cast<float *>(base);  // (n_tok, n_ff)
  if (Blas::Choose(n_tok, path) == Blas::Path::kGemv) {
    if (Fusable(e)) {
      STRATA_RETURN_IF_ERROR(GemvSwiGlu(e.gate, e.up, x, n_tok, g, stream));
    } else {
      float *u = reinterpret_cast<float *>(base + act);
      STRATA_RETURN_IF_ERROR(Gemv(e.gate, x, n_tok, g, stream));
      STRATA_RETURN_IF_ERROR(Gemv(e.up, x, n_tok, u, stream));
      STRATA_RETURN_IF_ERROR(SwiGlu(g, u, n_tok * n_ff, g, stream));
    }
    return Gemv(e.down, g, n_tok, y, stream);
  }
  float *u = reinterpret_cast<float *>(base + act);
  const Workspace rest = {base + 2 * act, ws.bytes - 2 * act};
  STRATA_RETURN_IF_ERROR(blas.MatMul(e.gate, x, n_tok, g, rest, stream, path));
  STRATA_RETURN_IF_ERROR(blas.MatMul(e.up, x, n_tok, u, rest, stream, path));
  STRATA_RETURN_IF_ERROR(SwiGlu(g, u, n_tok * n_ff, g, stream));
  return blas.MatMul(e.down, g, n_tok, y, rest, stream, path);
}

}  // namespace strata::cuda
