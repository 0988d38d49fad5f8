// Importance matrices: for each weight tensor, the sum over the tokens that entered it of each input
// column's square, and how many tokens that was. A quantizer weighs each column's rounding error by
// its mean square (the importance weights), so columns that carry large activations keep more
// precision. The files are llama.cpp's: GGUF (general.type "imatrix"; per tensor NAME, an F32
// "NAME.in_sum2" of ne {n_cols, n_mat} and an F32 "NAME.counts" of ne {1, n_mat}; the keys
// imatrix.datasets, imatrix.chunk_count and imatrix.chunk_size), and the older .dat layout (int32
// entry count; per entry an int32 name length, the name, int32 ncall, int32 nval and nval floats of
// mean square times ncall; then optionally int32 chunk count, int32 length and the dataset's name).
// A stacked expert tensor (blk.N.ffn_*_exps.weight) holds one matrix per routed expert, each with
// its own count of the tokens routed to it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lib/format/file.h"
#include "lib/model/backend.h"
#include "lib/model/weights.h"
#include "lib/util/status.h"

namespace strata::model {

struct ImatrixEntry {
  int64_t n_cols = 0;
  std::vector<double> sums;     // n_mat * n_cols: matrix m's column j at m * n_cols + j
  std::vector<int64_t> counts;  // n_mat: tokens that entered each matrix
  int64_t n_mat() const { return static_cast<int64_t>(counts.size()); }
};

struct Imatrix {
  std::map<std::string, ImatrixEntry> entries;  // by weight tensor name
  std::vector<std::string> datasets;
  uint32_t chunk_count = 0, chunk_size = 0;
  // Read from a .dat file: sums hold mean squares times counts[0] (its ncall), one count an entry.
  bool legacy = false;

  // The importance weights of matrix m of tensor `name` as llama.cpp's quantizer takes them: each
  // column's mean square (1 for a matrix no token entered); empty when the file has no such tensor
  // or matrix, or its width is not n_cols.
  std::vector<float> Weights(const std::string &name, int64_t m, int64_t n_cols) const;
};

// Reads a GGUF imatrix, or a .dat one (a file that does not start with GGUF's magic). Errors name
// the file and what is wrong: MOE_ERR_FORMAT_* for malformed or inconsistent contents (a sum without
// its counts, a width that does not divide, non-F32 tensors, negative counts, non-finite sums),
// MOE_ERR_IO_* from the file.
absl::StatusOr<Imatrix> ReadImatrix(const std::string &path);
absl::StatusOr<Imatrix> ParseImatrix(const format::Source &src);

// Writes `im` as a GGUF imatrix at `path` (atomically: a temporary file renamed over it).
absl::Status WriteImatrix(const Imatrix &im, const std::string &path);

// Collects an importance matrix from a backend's weight products (Backend::ObserveActivations), as
// llama-imatrix does: the products of tensors named blk.* only, a dense tensor's only from products
// of 16 rows or more, each routed expert's whatever its rows. A routed expert stored as a tensor of
// its own (Strata's expert-contiguous files: blk.L.ffn_gate.E.weight) is entered under the stacked
// name llama.cpp uses (blk.L.ffn_gate_exps.weight, matrix E of n_expert), so the file applies to the
// model in either layout.
class ImatrixCollector final : public ActivationObserver {
 public:
  explicit ImatrixCollector(int n_expert) : n_expert_(n_expert) {}
  void OnProduct(const Matrix &w, const float *x, int64_t n_rows) override;
  // The first problem met (a non-finite activation, a tensor seen with two shapes); collection
  // stops at it.
  const absl::Status &status() const { return status_; }
  Imatrix &imatrix() { return im_; }

 private:
  int n_expert_ = 0;
  Imatrix im_;
  absl::Status status_;
};

}  // namespace strata::model
