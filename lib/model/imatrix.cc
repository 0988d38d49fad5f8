// Importance matrices: llama.cpp's GGUF and .dat files, and their collection from weight products.
#include "lib/model/imatrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "lib/format/gguf.h"
#include "lib/format/gguf_writer.h"
#include "lib/model/model_file.h"

namespace strata::model {
namespace {

constexpr char kSums[] = ".in_sum2";
constexpr char kCounts[] = ".counts";
// A .dat file's caps, so a hostile header cannot make the reader allocate what the file cannot hold.
constexpr int32_t kMaxNameBytes = 1 << 16;

// "blk.L.ffn_gate.E.weight" (one routed expert's own tensor) -> "blk.L.ffn_gate_exps.weight" and E.
bool ExpertTensor(const std::string &name, std::string *stacked, int64_t *expert) {
  for (const char *part : {".ffn_gate.", ".ffn_up.", ".ffn_down."}) {
    const size_t at = name.find(part);
    if (at == std::string::npos) continue;
    const size_t digits = at + std::strlen(part), dot = name.find('.', digits);
    if (dot == std::string::npos || dot == digits || dot - digits > 6 || name.compare(dot, std::string::npos, ".weight") != 0) {
      return false;
    }
    int64_t e = 0;
    for (size_t i = digits; i < dot; ++i) {
      if (name[i] < '0' || name[i] > '9') return false;
      e = e * 10 + (name[i] - '0');
    }
    *stacked = name.substr(0, digits - 1) + "_exps.weight";
    *expert = e;
    return true;
  }
  return false;
}

bool EndsWith(const std::string &s, const char *suffix, std::string *stem) {
  const size_t n = std::strlen(suffix);
  if (s.size() <= n || s.compare(s.size() - n, n, suffix) != 0) return false;
  *stem = s.substr(0, s.size() - n);
  return true;
}

// Reads the .dat layout (see imatrix.h) from `src`.
absl::StatusOr<Imatrix> ParseDat(const format::Source &src) {
  Imatrix im;
  im.legacy = true;
  uint64_t at = 0;
  auto read_i32 = [&](const char *what) -> absl::StatusOr<int32_t> {
    int32_t v = 0;
    if (absl::Status st = src.ReadAt(at, &v, sizeof v); !st.ok()) {
      return Errorf(MOE_ERR_FORMAT_TRUNCATED, "imatrix '%s': the file ends in %s at byte %u", src.name(), what, at);
    }
    at += sizeof v;
    return v;
  };
  STRATA_ASSIGN_OR_RETURN(const int32_t n_entries, read_i32("the entry count"));
  if (n_entries < 1) {
    return Errorf(MOE_ERR_FORMAT_HEADER, "imatrix '%s': %d entries (neither a GGUF file nor a .dat one)", src.name(),
                  n_entries);
  }
  for (int32_t i = 0; i < n_entries; ++i) {
    STRATA_ASSIGN_OR_RETURN(const int32_t len, read_i32("a name's length"));
    if (len < 1 || len > kMaxNameBytes || static_cast<uint64_t>(len) > src.size() - std::min(src.size(), at)) {
      return Errorf(MOE_ERR_FORMAT_METADATA, "imatrix '%s': entry %d's name is %d bytes", src.name(), i, len);
    }
    std::string name(static_cast<size_t>(len), '\0');
    STRATA_RETURN_IF_ERROR(src.ReadAt(at, name.data(), name.size()));
    at += name.size();
    STRATA_ASSIGN_OR_RETURN(const int32_t ncall, read_i32("a call count"));
    STRATA_ASSIGN_OR_RETURN(const int32_t nval, read_i32("a value count"));
    if (ncall < 0 || nval < 1 || static_cast<uint64_t>(nval) * 4 > src.size() - std::min(src.size(), at)) {
      return Errorf(MOE_ERR_FORMAT_TENSOR, "imatrix '%s': entry '%s' has %d calls and %d values", src.name(), name,
                    ncall, nval);
    }
    std::vector<float> v(static_cast<size_t>(nval));
    STRATA_RETURN_IF_ERROR(src.ReadAt(at, v.data(), v.size() * sizeof(float)));
    at += v.size() * sizeof(float);
    if (im.entries.count(name) != 0) {
      return Errorf(MOE_ERR_FORMAT_METADATA, "imatrix '%s': entry '%s' appears twice", src.name(), name);
    }
    ImatrixEntry &e = im.entries[name];
    e.n_cols = nval;  // one matrix: a .dat entry of a stacked tensor holds its experts side by side
    e.counts = {ncall};
    e.sums.assign(v.begin(), v.end());
    for (double s : e.sums) {
      if (!std::isfinite(s) || s < 0) {
        return Errorf(MOE_ERR_FORMAT_TENSOR, "imatrix '%s': entry '%s' holds %g", src.name(), name, s);
      }
    }
  }
  // The trailing chunk count and dataset name are optional.
  if (at + 4 <= src.size()) {
    STRATA_ASSIGN_OR_RETURN(const int32_t chunks, read_i32("the chunk count"));
    im.chunk_count = chunks > 0 ? static_cast<uint32_t>(chunks) : 0;
    if (at + 4 <= src.size()) {
      STRATA_ASSIGN_OR_RETURN(const int32_t len, read_i32("the dataset's name length"));
      if (len > 0 && len <= kMaxNameBytes && static_cast<uint64_t>(len) <= src.size() - at) {
        std::string name(static_cast<size_t>(len), '\0');
        STRATA_RETURN_IF_ERROR(src.ReadAt(at, name.data(), name.size()));
        im.datasets.push_back(name.substr(0, name.find('\0')));
      }
    }
  }
  return im;
}

absl::StatusOr<Imatrix> ParseGgufImatrix(const format::Source &src) {
  STRATA_ASSIGN_OR_RETURN(const format::GgufFile g, format::ParseGguf(src));
  Imatrix im;
  if (const format::GgufValue *v = g.Find("imatrix.datasets"); v != nullptr) {
    if (v->type != format::GgufType::kArray || v->elem_type != format::GgufType::kString) {
      return Errorf(MOE_ERR_FORMAT_METADATA, "imatrix '%s': imatrix.datasets is not an array of strings", src.name());
    }
    im.datasets = v->arr_str;
  }
  for (const char *key : {"imatrix.chunk_count", "imatrix.chunk_size"}) {
    if (g.Find(key) == nullptr) continue;
    STRATA_ASSIGN_OR_RETURN(const uint64_t n, g.GetUint(key));
    (std::strcmp(key, "imatrix.chunk_count") == 0 ? im.chunk_count : im.chunk_size) =
        static_cast<uint32_t>(std::min<uint64_t>(n, UINT32_MAX));
  }
  // Pair each tensor's sums with its counts.
  std::map<std::string, std::pair<const format::GgufTensorInfo *, const format::GgufTensorInfo *>> pairs;
  for (const format::GgufTensorInfo &t : g.tensors) {
    std::string stem;
    if (EndsWith(t.name, kSums, &stem)) {
      pairs[stem].first = &t;
    } else if (EndsWith(t.name, kCounts, &stem)) {
      pairs[stem].second = &t;
    }
  }
  if (pairs.empty()) return Errorf(MOE_ERR_FORMAT_TENSOR, "imatrix '%s' holds no importance data", src.name());
  for (const auto &[name, p] : pairs) {
    const format::GgufTensorInfo *sums = p.first, *counts = p.second;
    if (sums == nullptr || counts == nullptr) {
      return Errorf(MOE_ERR_FORMAT_TENSOR, "imatrix '%s': '%s' has %s without %s", src.name(), name,
                    sums != nullptr ? "sums" : "counts", sums != nullptr ? "counts" : "sums");
    }
    if (sums->type != 0 || counts->type != 0) {  // F32
      return Errorf(MOE_ERR_FORMAT_TENSOR, "imatrix '%s': '%s''s sums and counts must be F32", src.name(), name);
    }
    const int64_t n_sums = sums->ne[0] * sums->ne[1] * sums->ne[2] * sums->ne[3];
    const int64_t n_mat = counts->ne[0] * counts->ne[1] * counts->ne[2] * counts->ne[3];
    if (n_mat < 1 || n_sums % n_mat != 0) {
      return Errorf(MOE_ERR_FORMAT_TENSOR, "imatrix '%s': '%s' has %d sums for %d matrices", src.name(), name, n_sums,
                    n_mat);
    }
    std::vector<float> s(static_cast<size_t>(n_sums)), c(static_cast<size_t>(n_mat));
    STRATA_RETURN_IF_ERROR(src.ReadAt(sums->offset, s.data(), s.size() * sizeof(float)));
    STRATA_RETURN_IF_ERROR(src.ReadAt(counts->offset, c.data(), c.size() * sizeof(float)));
    ImatrixEntry &e = im.entries[name];
    e.n_cols = n_sums / n_mat;
    e.sums.assign(s.begin(), s.end());
    for (double v : e.sums) {
      if (!std::isfinite(v) || v < 0) {
        return Errorf(MOE_ERR_FORMAT_TENSOR, "imatrix '%s': '%s' holds a sum of %g", src.name(), name, v);
      }
    }
    for (float v : c) {
      if (!std::isfinite(v) || v < 0 || v > 9.0e15f) {
        return Errorf(MOE_ERR_FORMAT_TENSOR, "imatrix '%s': '%s' holds a count of %g", src.name(), name, v);
      }
      e.counts.push_back(std::llround(v));
    }
  }
  return im;
}

}  // namespace

std::vector<float> Imatrix::Weights(const std::string &name, int64_t m, int64_t n_cols) const {
  auto it = entries.find(name);
  if (it == entries.end()) return {};
  const ImatrixEntry &e = it->second;
  // A .dat entry of a stacked tensor lays its matrices side by side under one count.
  const int64_t n_mat = legacy ? (n_cols > 0 ? e.n_cols / n_cols : 0) : e.n_mat();
  if (n_cols <= 0 || m < 0 || m >= n_mat || (legacy ? e.n_cols % n_cols != 0 : e.n_cols != n_cols)) return {};
  const int64_t count = legacy ? e.counts[0] : e.counts[static_cast<size_t>(m)];
  std::vector<float> w(static_cast<size_t>(n_cols), 1.f);
  const double *s = e.sums.data() + m * n_cols;
  if (legacy) {
    for (int64_t j = 0; j < n_cols; ++j) w[j] = count > 0 ? static_cast<float>(s[j] / count) : static_cast<float>(s[j]);
  } else if (count > 0) {
    for (int64_t j = 0; j < n_cols; ++j) w[j] = static_cast<float>(s[j] / count);
  }
  return w;
}

absl::StatusOr<Imatrix> ParseImatrix(const format::Source &src) {
  char magic[4] = {};
  if (src.size() >= 4) STRATA_RETURN_IF_ERROR(src.ReadAt(0, magic, 4));
  absl::StatusOr<Imatrix> im = std::memcmp(magic, "GGUF", 4) == 0 ? ParseGgufImatrix(src) : ParseDat(src);
  // Every refusal names the file (a metadata getter's message names only the key).
  if (!im.ok() && im.status().message().find(src.name()) == std::string_view::npos) {
    return Annotate(im.status(), "imatrix '" + src.name() + "'");
  }
  return im;
}

absl::StatusOr<Imatrix> ReadImatrix(const std::string &path) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<format::File> f, format::File::Open(path));
  return ParseImatrix(*f);
}

absl::Status WriteImatrix(const Imatrix &im, const std::string &path) {
  format::GgufWriter w(path);
  w.SetValue("general.type", format::GgufString("imatrix"));
  w.SetValue("imatrix.datasets", format::GgufStringArray(im.datasets));
  w.SetValue("imatrix.chunk_count", format::GgufUint32(im.chunk_count));
  w.SetValue("imatrix.chunk_size", format::GgufUint32(im.chunk_size));
  for (const auto &[name, e] : im.entries) {  // the map's order: sorted names, as llama.cpp writes them
    const int64_t n_mat = e.n_mat();
    if (n_mat < 1 || e.n_cols < 1 || static_cast<int64_t>(e.sums.size()) != n_mat * e.n_cols) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "imatrix entry '%s': %u sums for %d matrices of %d columns", name,
                    e.sums.size(), n_mat, e.n_cols);
    }
    const int64_t sums_ne[4] = {e.n_cols, n_mat, 1, 1}, counts_ne[4] = {1, n_mat, 1, 1};
    STRATA_RETURN_IF_ERROR(w.AddTensor(name + kSums, 0, 2, sums_ne).status());
    STRATA_RETURN_IF_ERROR(w.AddTensor(name + kCounts, 0, 2, counts_ne).status());
  }
  STRATA_RETURN_IF_ERROR(w.Begin());
  for (const auto &[name, e] : im.entries) {
    const std::vector<float> s(e.sums.begin(), e.sums.end());
    std::vector<float> c(e.counts.size());
    for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(e.counts[i]);
    STRATA_RETURN_IF_ERROR(w.Write(s.data(), s.size() * sizeof(float)));
    STRATA_RETURN_IF_ERROR(w.Write(c.data(), c.size() * sizeof(float)));
  }
  return w.Finish();
}

void ImatrixCollector::OnProduct(const Matrix &w, const float *x, int64_t n_rows) {
  if (!status_.ok() || w.tensor == nullptr || x == nullptr || n_rows <= 0 || w.cols <= 0 || w.nbytes() == 0) return;
  std::string name = w.tensor->name;
  if (name.rfind("blk.", 0) != 0) return;
  // A stacked tensor's view is one of its matrices, at sub_offset.
  const uint64_t one = w.nbytes();
  int64_t n_mat = static_cast<int64_t>(w.tensor->nbytes / one);
  int64_t m = static_cast<int64_t>(w.sub_offset / one);
  if (n_mat < 1 || m >= n_mat || w.tensor->nbytes % one != 0) {
    status_ = Errorf(MOE_ERR_INTERNAL, "imatrix: '%s' is not a stack of %u-byte matrices", name, one);
    return;
  }
  bool routed = n_mat > 1;
  if (std::string stacked; n_mat == 1 && ExpertTensor(name, &stacked, &m)) {
    if (m >= n_expert_) {
      status_ = Errorf(MOE_ERR_INTERNAL, "imatrix: '%s' names expert %d of %d", name, m, n_expert_);
      return;
    }
    name = stacked;
    n_mat = n_expert_;
    routed = true;
  }
  if (!routed && n_rows < 16) return;  // as llama-imatrix: a dense product of few rows is left out
  ImatrixEntry &e = im_.entries[name];
  if (e.counts.empty()) {
    e.n_cols = w.cols;
    e.counts.assign(static_cast<size_t>(n_mat), 0);
    e.sums.assign(static_cast<size_t>(n_mat * w.cols), 0.0);
  } else if (e.n_cols != w.cols || e.n_mat() != n_mat) {
    status_ = Errorf(MOE_ERR_INTERNAL, "imatrix: '%s' seen as %d x %d and as %d x %d", name, e.n_mat(), e.n_cols,
                     n_mat, w.cols);
    return;
  }
  double *acc = e.sums.data() + m * w.cols;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float *row = x + r * w.cols;
    for (int64_t j = 0; j < w.cols; ++j) {
      const double v = row[j];
      acc[j] += v * v;
    }
  }
  for (int64_t j = 0; j < w.cols; ++j) {
    if (!std::isfinite(acc[j])) {
      status_ = Errorf(MOE_ERR_INTERNAL, "imatrix: non-finite activations enter '%s'", name);
      return;
    }
  }
  e.counts[static_cast<size_t>(m)] += n_rows;
}

}  // namespace strata::model
