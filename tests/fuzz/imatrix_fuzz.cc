// libFuzzer target for importance matrices (llama.cpp's GGUF and .dat files, read by
// `strata pack --imatrix`): any bytes must give an imatrix or a status naming the file. An imatrix
// read must be consistent: every entry's sums are its matrices times its width, its counts and
// sums non-negative and finite, and each matrix's weights have its width.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "lib/format/file.h"
#include "lib/model/imatrix.h"
#include "tests/fuzz/fuzz_util.h"

using strata::fuzz::Require;
using strata::fuzz::RequireRefusal;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  strata::format::MemorySource src(data, size, "fuzz.imatrix");
  auto r = strata::model::ParseImatrix(src);
  if (!r.ok()) {
    RequireRefusal(r.status(), {MOE_ERR_FORMAT, MOE_ERR_UNSUPPORTED_TYPE, MOE_ERR_IO});
    Require(r.status().message().find("fuzz.imatrix") != std::string_view::npos, r.status());
    return 0;
  }
  for (const auto &[name, e] : r->entries) {
    Require(e.n_cols > 0 && !e.counts.empty());
    Require(e.sums.size() == static_cast<size_t>(e.n_cols) * (r->legacy ? 1 : e.counts.size()));
    for (double s : e.sums) Require(std::isfinite(s) && s >= 0);
    for (int64_t c : e.counts) Require(c >= 0);
    const int64_t n_mat = r->legacy ? 1 : e.n_mat();
    for (int64_t m = 0; m < n_mat && m < 4; ++m) {
      const std::vector<float> w = r->Weights(name, m, e.n_cols);
      Require(w.size() == static_cast<size_t>(e.n_cols));
      for (float v : w) Require(std::isfinite(v) && v >= 0);
    }
    Require(r->Weights(name, n_mat, e.n_cols).empty());
  }
  return 0;
}
