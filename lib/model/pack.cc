// Pack: plan every output tensor (name, type, shape, source extent) from the bound weights before
// any data moves, write the GGUF header, then convert tensor by tensor in row chunks (dequantize the
// source to float, permute Q/K rows for llama-style RoPE when the source is an HF Mixtral, quantize).
#include "lib/util/str_format.h"
#include "lib/util/hash_containers.h"
#include "lib/model/pack.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "lib/format/gguf_writer.h"
#include "lib/model/imatrix.h"
#include "lib/model/weights.h"
#include "lib/util/log.h"
#include "lib/util/thread_pool.h"

namespace strata::model {
namespace {

using format::GgufType;
using quant::TypeId;

// Floats converted per chunk: bounds the working memory whatever the tensor's size.
constexpr int64_t kChunkFloats = int64_t{4} << 20;

// One tensor of the output file and where its values come from.
struct Job {
  std::string name;
  TypeId type = TypeId::kF32;
  int n_dims = 2;
  int64_t ne[4] = {1, 1, 1, 1};
  uint64_t file_alignment = 0;
  // Source: `rows` rows of `cols` values of type src_type at src_offset of file src_file.
  int src_file = 0;
  uint64_t src_offset = 0;
  uint32_t src_type = 0;
  int64_t rows = 1, cols = 1;
  uint64_t raw_bytes = 0;   // > 0: copy this many bytes unchanged (tensors pack does not know)
  int permute_head_dim = 0; // > 0: rows are HF rotate-half heads of this size, reorder to adjacent pairs
  bool expert = false;
  // A stacked tensor (ne[2] matrices): its matrices' jobs, converted in turn into its data.
  std::vector<Job> parts;
  // Where an importance matrix keeps this matrix's weights (llama.cpp's name: a routed expert is
  // matrix imatrix_m of its layer's stacked tensor), and the weights once looked up.
  std::string imatrix_name;
  int64_t imatrix_m = 0;
  bool carried = false;  // a tensor of the input that pack does not know, copied as it is
  std::vector<float> weights;
};

const quant::Codec &CodecFor(TypeId t) { return *quant::FindCodec(t); }

std::string Name(TypeId t) { return std::string(quant::TypeName(static_cast<uint32_t>(t))); }

// The type a matrix of `cols`-long rows is stored in: `want` when its rows are whole blocks of it,
// else Q8_0 for multiples of 32, else F16.
TypeId Fit(TypeId want, int64_t cols) {
  if (cols % CodecFor(want).block_elems == 0) return want;
  if (cols % 32 == 0) return TypeId::kQ8_0;
  return TypeId::kF16;
}

// ---- metadata --------------------------------------------------------------------------------

// llama.cpp's metadata for an HF checkpoint: qwen3moe keys, or llama keys for Mixtral.
void WriteHfMetadata(const ModelFile &mf, const HParams &hp, format::GgufWriter &w) {
  const bool qwen = hp.arch == Arch::kQwen3Moe;
  std::string name = mf.path();
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  name = name.substr(name.find_last_of('/') + 1);
  if (auto it = mf.config().find("_name_or_path"); it != mf.config().end() && it->is_string() &&
                                                    !it->get<std::string>().empty()) {
    name = it->get<std::string>();
  }
  int64_t dense_ff = hp.n_ff_expert;
  if (auto it = mf.config().find("intermediate_size"); it != mf.config().end() && it->is_number_unsigned()) {
    dense_ff = it->get<int64_t>();
  }
  WriteLlamaCppHParams(qwen ? "qwen3moe" : hp.arch == Arch::kOlmoe ? "olmoe" : "llama", name, hp, dense_ff, w);
}

// ---- planning --------------------------------------------------------------------------------

class Planner {
 public:
  void AddMatrix(const std::string &name, const Matrix &m, TypeId want, bool expert, uint64_t align,
                 int permute_head_dim = 0) {
    jobs_.push_back(MatrixJob(name, m, want, expert, align, permute_head_dim));
  }

  // One tensor of ne {cols, rows, n} holding the n matrices (of one shape) in order: llama.cpp's
  // stacked routed experts, blk.L.ffn_gate_exps.weight and the like.
  void AddStacked(const std::string &name, const std::vector<const Matrix *> &ms, TypeId want) {
    Job j;
    j.name = name;
    j.n_dims = 3;
    j.expert = true;
    const size_t before = fallbacks_.size();
    for (const Matrix *m : ms) {
      j.parts.push_back(MatrixJob(name, *m, want, true, 0, 0));
      j.parts.back().imatrix_m = static_cast<int64_t>(j.parts.size()) - 1;
      fallbacks_.resize(std::min(fallbacks_.size(), before + 1));  // one report for the stack
    }
    j.type = j.parts[0].type;
    j.ne[0] = ms[0]->cols;
    j.ne[1] = ms[0]->rows;
    j.ne[2] = static_cast<int64_t>(ms.size());
    jobs_.push_back(std::move(j));
  }

  Job MatrixJob(const std::string &name, const Matrix &m, TypeId want, bool expert, uint64_t align,
                int permute_head_dim) {
    Job j;
    j.name = name;
    j.imatrix_name = name;
    j.type = Fit(want, m.cols);
    if (j.type != want) fallbacks_.push_back({name, want, j.type, m.cols});
    j.n_dims = 2;
    j.ne[0] = m.cols;
    j.ne[1] = m.rows;
    j.file_alignment = align;
    j.src_file = m.tensor->file_index;
    j.src_offset = m.file_offset();
    j.src_type = m.tensor->type;
    j.rows = m.rows;
    j.cols = m.cols;
    j.permute_head_dim = permute_head_dim;
    j.expert = expert;
    // Already in the type wanted: its bytes go over unchanged. Decoding and encoding them again
    // would move weights another quantizer chose (llama.cpp's with an importance matrix, say).
    if (static_cast<uint32_t>(j.type) == j.src_type && permute_head_dim == 0) {
      j.raw_bytes = quant::RowBytes(j.src_type, m.cols).value_or(0) * static_cast<uint64_t>(m.rows);
    }
    Mark(m.tensor);
    return j;
  }

  void AddVec(const std::string &name, const Vec &v) {
    if (v.tensor == nullptr) return;
    Job j;
    j.name = name;
    j.type = TypeId::kF32;
    j.n_dims = 1;
    j.ne[0] = v.n;
    j.src_file = v.tensor->file_index;
    j.src_offset = v.tensor->offset;
    j.src_type = v.tensor->type;
    j.rows = 1;
    j.cols = v.n;
    Mark(v.tensor);
    jobs_.push_back(std::move(j));
  }

  static Job Raw(const TensorRef &t) {
    Job j;
    j.name = t.name;
    j.type = static_cast<TypeId>(t.type);
    j.n_dims = t.n_dims;
    std::copy(t.ne, t.ne + 4, j.ne);
    j.src_file = t.file_index;
    j.src_offset = t.offset;
    j.src_type = t.type;
    j.raw_bytes = t.nbytes;
    j.carried = true;
    return j;
  }

  void Mark(const TensorRef *t) { used_.insert(t); }
  bool Used(const TensorRef *t) const { return used_.count(t) != 0; }
  std::vector<Job> &jobs() { return jobs_; }
  std::vector<PackFallback> &fallbacks() { return fallbacks_; }

 private:
  std::vector<Job> jobs_;
  std::vector<PackFallback> fallbacks_;
  HashSet<const TensorRef *> used_;
};

// ---- conversion ------------------------------------------------------------------------------

absl::Status Convert(const ModelFile &mf, const Job &j, ThreadPool &pool, format::GgufWriter &w,
                     std::vector<uint8_t> &src, std::vector<float> &vals, std::vector<float> &perm,
                     std::vector<uint8_t> &dst) {
  for (const Job &part : j.parts) STRATA_RETURN_IF_ERROR(Convert(mf, part, pool, w, src, vals, perm, dst));
  if (!j.parts.empty()) return absl::OkStatus();
  const format::File &file = mf.file(j.src_file);
  auto read = [&](uint64_t off, void *p, uint64_t n) {
    absl::Status st = file.ReadAt(off, p, n);
    return st.ok() ? st : Annotate(st, absl::StrCat("reading tensor for '", j.name, "'"));
  };
  if (j.raw_bytes > 0) {
    const uint64_t chunk = uint64_t{16} << 20;
    src.resize(std::min(chunk, j.raw_bytes));
    for (uint64_t at = 0; at < j.raw_bytes; at += chunk) {
      const uint64_t n = std::min(chunk, j.raw_bytes - at);
      STRATA_RETURN_IF_ERROR(read(j.src_offset + at, src.data(), n));
      STRATA_RETURN_IF_ERROR(w.Write(src.data(), n));
    }
    return absl::OkStatus();
  }
  const quant::Codec *in = quant::FindCodec(j.src_type);
  if (in == nullptr || in->dequantize == nullptr) {
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "tensor for '%s' has type %s, which Strata cannot decode", j.name,
                  std::string(quant::TypeName(j.src_type)));
  }
  const quant::Codec &out = CodecFor(j.type);
  STRATA_ASSIGN_OR_RETURN(const uint64_t in_row, quant::RowBytes(j.src_type, j.cols));
  STRATA_ASSIGN_OR_RETURN(const uint64_t out_row, quant::RowBytes(static_cast<uint32_t>(j.type), j.cols));
  // Rows per chunk: a whole number of heads when permuting, else as many rows as kChunkFloats holds.
  const int64_t group = j.permute_head_dim > 0 ? j.permute_head_dim : 1;
  int64_t chunk_rows = std::max<int64_t>(1, kChunkFloats / j.cols) / group * group;
  if (chunk_rows == 0) chunk_rows = group;
  for (int64_t r0 = 0; r0 < j.rows; r0 += chunk_rows) {
    const int64_t k = std::min(chunk_rows, j.rows - r0);
    const uint64_t n = static_cast<uint64_t>(k * j.cols);
    src.resize(in_row * k);
    vals.resize(n);
    dst.resize(out_row * k);
    STRATA_RETURN_IF_ERROR(read(j.src_offset + in_row * r0, src.data(), src.size()));
    in->dequantize(src.data(), vals.data(), static_cast<int64_t>(n));
    // (rows are quantized one at a time under importance weights: see quant::QuantizeRow)
    const float *rows = vals.data();
    if (j.permute_head_dim > 0) {
      // HF rotate-half order → adjacent pairs, as convert_hf_to_gguf.py:
      // GGUF row h*d + 2i + a = HF row h*d + a*d/2 + i.
      const int64_t d = j.permute_head_dim, half = d / 2;
      perm.resize(n);
      for (int64_t h = 0; h < k / d; ++h) {
        for (int64_t i = 0; i < half; ++i) {
          for (int64_t a = 0; a < 2; ++a) {
            const float *from = vals.data() + (h * d + a * half + i) * j.cols;
            std::copy(from, from + j.cols, perm.data() + (h * d + 2 * i + a) * j.cols);
          }
        }
      }
      rows = perm.data();
    }
    if (j.weights.empty() && out.quantize == nullptr) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "tensor '%s': type %s needs an importance matrix", j.name,
                    std::string(out.name));
    }
    // Rows quantize independently (whole blocks), so any split over the pool gives the same bytes.
    const float *weights = j.weights.empty() ? nullptr : j.weights.data();
    uint8_t *out_rows = dst.data();
    pool.ParallelFor(k, 1, [&](int64_t begin, int64_t end, int) {
      if (weights == nullptr) {
        out.quantize(rows + begin * j.cols, out_rows + out_row * begin, (end - begin) * j.cols);
        return;
      }
      for (int64_t r = begin; r < end; ++r) {
        quant::QuantizeRow(out, rows + r * j.cols, out_rows + out_row * r, j.cols, weights);
      }
    });
    STRATA_RETURN_IF_ERROR(w.Write(dst.data(), dst.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RequireQuantizer(TypeId t, const char *what) {
  const quant::Codec *c = quant::FindCodec(t);
  if (c == nullptr || !quant::CanQuantize(*c)) {
    return Errorf(MOE_ERR_UNSUPPORTED_TYPE, "%s type %s: Strata has no quantizer for it yet", what, Name(t));
  }
  return absl::OkStatus();
}

int GgufFileType(TypeId t) {
  switch (t) {
    case TypeId::kF32: return 0;
    case TypeId::kF16: return 1;
    case TypeId::kQ4_0: return 2;
    case TypeId::kQ4_1: return 3;
    case TypeId::kQ8_0: return 7;
    case TypeId::kQ5_0: return 8;
    case TypeId::kQ5_1: return 9;
    case TypeId::kQ2_K: return 10;
    case TypeId::kQ3_K: return 12;
    case TypeId::kQ4_K: return 15;
    case TypeId::kQ5_K: return 17;
    case TypeId::kQ6_K: return 18;
    case TypeId::kIQ2_XXS: return 19;
    case TypeId::kIQ2_XS: return 20;
    case TypeId::kIQ3_XXS: return 23;
    case TypeId::kIQ1_S: return 24;
    case TypeId::kIQ4_NL: return 25;
    case TypeId::kIQ3_S: return 26;
    case TypeId::kIQ2_S: return 28;
    case TypeId::kIQ4_XS: return 30;
    case TypeId::kIQ1_M: return 31;
    case TypeId::kBF16: return 32;
    case TypeId::kMXFP4: return 38;  // llama.cpp's MXFP4_MOE (experts MXFP4)
    default: return -1;
  }
}

void WriteLlamaCppHParams(const std::string &arch, const std::string &name, const HParams &hp, int64_t dense_ff,
                          format::GgufWriter &w) {
  const bool qwen = arch == "qwen3moe", llama = arch == "llama";
  const std::string p = arch + ".";
  w.SetValue("general.architecture", format::GgufString(arch));
  w.SetValue("general.name", format::GgufString(name));
  auto u32 = [&](const std::string &k, int64_t v) { w.SetValue(p + k, format::GgufUint32(static_cast<uint32_t>(v))); };
  u32("block_count", hp.n_layer);
  u32("context_length", hp.n_ctx_train);
  u32("embedding_length", hp.n_embd);
  if (qwen) {
    u32("feed_forward_length", dense_ff);
    u32("expert_feed_forward_length", hp.n_ff_expert);
  } else {
    u32("feed_forward_length", hp.n_ff_expert);
  }
  u32("attention.head_count", hp.n_head);
  u32("attention.head_count_kv", hp.n_head_kv);
  if (qwen || hp.head_dim != hp.n_embd / hp.n_head) {
    u32("attention.key_length", hp.head_dim);
    u32("attention.value_length", hp.head_dim);
  }
  w.SetValue(p + "rope.freq_base", format::GgufFloat32(hp.rope_theta));
  if (llama) u32("rope.dimension_count", hp.head_dim);
  w.SetValue(p + "attention.layer_norm_rms_epsilon", format::GgufFloat32(hp.rms_eps));
  u32("expert_count", hp.n_expert);
  u32("expert_used_count", hp.n_expert_used);
  if (qwen) w.SetValue(p + "expert_weights_norm", format::GgufBool(hp.norm_topk_prob));
  if (llama) u32("vocab_size", hp.n_vocab);
  if (hp.sliding_window > 0) u32("attention.sliding_window", hp.sliding_window);
}

// The bar draws itself on the terminal's stderr (the CLI turns it on there); with a host's log
// callback set, stderr is the host's and the bar stays off.
ProgressBar::ProgressBar(bool on, uint64_t total_bytes, std::string label)
    : on_(on && !LogToHost()), total_(total_bytes), label_(std::move(label)) {}

ProgressBar::~ProgressBar() {
  if (on_ && drawn_) std::fputc('\n', stderr);
}

void ProgressBar::Update(uint64_t done, size_t tensor, size_t n_tensors) {
  if (!on_) return;
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  if (drawn_ && done < total_ && now - last_ns_ < 100'000'000) return;
  last_ns_ = now;
  drawn_ = true;
  const int width = 30;
  const double f = total_ ? static_cast<double>(done) / total_ : 1.0;
  const int fill = static_cast<int>(f * width);
  std::fprintf(stderr, "\rstrata: %s [%s%s] %3d%%  %zu/%zu tensors  %.1f/%.1f MiB", label_.c_str(),
               std::string(fill, '#').c_str(), std::string(width - fill, '.').c_str(), static_cast<int>(f * 100),
               tensor, n_tensors, done / 1048576.0, total_ / 1048576.0);
  std::fflush(stderr);
}

absl::StatusOr<TypeId> ParseTypeName(const std::string &name) {
  const std::string want = absl::AsciiStrToUpper(name);
  for (uint32_t id = 0; id < 64; ++id) {
    const quant::Codec *c = quant::FindCodec(id);
    if (c != nullptr && c->name == want) return c->id;
  }
  return Errorf(MOE_ERR_INVALID_ARGUMENT, "unknown tensor type '%s' (e.g. q4_k, q5_k, q6_k, q8_0, q4_0, f16, f32)",
                name);
}

absl::StatusOr<std::vector<HotExpert>> ReadHotlist(const std::string &path, const HParams &hp) {
  STRATA_ASSIGN_OR_RETURN(std::string text, format::ReadSmallFile(path, uint64_t{256} << 20));
  return ParseHotlist(text, path, hp);
}

absl::StatusOr<std::vector<HotExpert>> ParseHotlist(std::string_view text, const std::string &path,
                                                    const HParams &hp) {
  std::vector<HotExpert> out;
  HashSet<int64_t> seen;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++line_no;
    if (auto hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (f.empty()) continue;
    auto bad = [&](const std::string &why) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "hotlist '%s' line %d: %s", path, line_no, why);
    };
    uint64_t layer = 0, expert = 0, count = 0;
    if (f.size() != 3 || !absl::SimpleAtoi(f[0], &layer) || !absl::SimpleAtoi(f[1], &expert) ||
        !absl::SimpleAtoi(f[2], &count) || f[0][0] == '+' || f[1][0] == '+' || f[2][0] == '+') {
      return bad("expected 'layer expert count' (three non-negative integers)");
    }
    if (layer >= static_cast<uint64_t>(hp.n_layer)) {
      return bad(strata::StrFormat("layer %u is out of range (the model has %d layers)", layer, hp.n_layer));
    }
    if (expert >= static_cast<uint64_t>(hp.n_expert)) {
      return bad(strata::StrFormat("expert %u is out of range (the model has %d experts per layer)", expert,
                                 hp.n_expert));
    }
    if (!seen.insert(static_cast<int64_t>(layer) * hp.n_expert + static_cast<int64_t>(expert)).second) {
      return bad(strata::StrFormat("layer %u expert %u is listed twice", layer, expert));
    }
    out.push_back({static_cast<int>(layer), static_cast<int>(expert), count});
  }
  std::stable_sort(out.begin(), out.end(), [](const HotExpert &a, const HotExpert &b) { return a.count > b.count; });
  return out;
}

absl::StatusOr<PackReport> Pack(const std::string &in, const std::string &out, const PackOptions &o) {
  STRATA_RETURN_IF_ERROR(RequireQuantizer(o.experts, "--experts"));
  STRATA_RETURN_IF_ERROR(RequireQuantizer(o.attention, "--attention"));
  if (!o.boost_layers.empty()) STRATA_RETURN_IF_ERROR(RequireQuantizer(o.boost, "--boost"));

  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<ModelFile> mf, ModelFile::Open(in));
  STRATA_ASSIGN_OR_RETURN(HParams hp, ReadHParams(*mf));
  if (hp.arch != Arch::kQwen3Moe && hp.arch != Arch::kMixtral && hp.arch != Arch::kOlmoe) {
    return Errorf(MOE_ERR_UNSUPPORTED, "pack does not handle architecture '%s' yet", hp.arch_name);
  }
  STRATA_ASSIGN_OR_RETURN(ModelWeights w, BindWeights(*mf, hp));
  std::vector<bool> boosted(hp.n_layer, false);
  for (int l : o.boost_layers) {
    if (l < 0 || l >= hp.n_layer) {
      return Errorf(MOE_ERR_INVALID_ARGUMENT, "boost layer %d is out of range (the model has %d layers)", l,
                    hp.n_layer);
    }
    boosted[l] = true;
  }
  std::vector<HotExpert> hot;
  if (!o.hotlist_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(hot, ReadHotlist(o.hotlist_path, hp));
  }

  const bool from_hf = mf->kind() == ModelFile::Kind::kHfCheckpoint;
  // HF Mixtral keeps Q/K in rotate-half order; the GGUF (arch llama) wants adjacent pairs.
  const bool permute_qk = from_hf && hp.arch == Arch::kMixtral;

  // Non-routed tensors first (one contiguous resident region), then the experts.
  Planner plan;
  plan.AddMatrix("token_embd.weight", w.tok_embd, o.attention, false, 0);
  plan.AddVec("output_norm.weight", w.output_norm);
  if (!hp.tied_embeddings) plan.AddMatrix("output.weight", w.output, o.attention, false, 0);
  for (int l = 0; l < hp.n_layer; ++l) {
    const LayerWeights &L = w.layers[l];
    auto n = [l](const char *s) { return strata::StrFormat("blk.%d.%s.weight", l, s); };
    plan.AddVec(n("attn_norm"), L.attn_norm);
    plan.AddMatrix(n("attn_q"), L.wq, o.attention, false, 0, permute_qk ? hp.head_dim : 0);
    plan.AddMatrix(n("attn_k"), L.wk, o.attention, false, 0, permute_qk ? hp.head_dim : 0);
    plan.AddMatrix(n("attn_v"), L.wv, o.attention, false, 0);
    plan.AddMatrix(n("attn_output"), L.wo, o.attention, false, 0);
    plan.AddVec(n("attn_q_norm"), L.q_norm);
    plan.AddVec(n("attn_k_norm"), L.k_norm);
    plan.AddVec(n("ffn_norm"), L.ffn_norm);
    plan.AddMatrix(n("ffn_gate_inp"), L.router, TypeId::kF32, false, 0);
  }
  const bool contiguous = o.layout == ExpertLayout::kExpertContiguous;
  if (!contiguous && !hot.empty()) {
    return Errorf(MOE_ERR_INVALID_ARGUMENT,
                  "--hotlist orders the experts of the expert-contiguous layout: give --expert-contiguous too");
  }
  // Expert order: the hotlist's (hottest first), then the rest by layer and id.
  std::vector<std::pair<int, int>> order;
  std::vector<bool> placed(static_cast<size_t>(hp.n_layer) * hp.n_expert, false);
  for (const HotExpert &h : hot) {
    order.emplace_back(h.layer, h.expert);
    placed[static_cast<size_t>(h.layer) * hp.n_expert + h.expert] = true;
  }
  for (int l = 0; l < hp.n_layer; ++l) {
    for (int e = 0; e < hp.n_expert; ++e) {
      if (!placed[static_cast<size_t>(l) * hp.n_expert + e]) order.emplace_back(l, e);
    }
  }
  const size_t first_expert_job = plan.jobs().size();
  for (int l = 0; l < hp.n_layer && !contiguous; ++l) {
    const TypeId t = boosted[l] ? o.boost : o.experts;
    const auto &ex = w.layers[l].experts;
    std::vector<const Matrix *> gate, up, down;
    for (const ExpertWeights &x : ex) {
      gate.push_back(&x.gate);
      up.push_back(&x.up);
      down.push_back(&x.down);
    }
    if (ex.empty()) continue;
    auto n = [l](const char *s) { return strata::StrFormat("blk.%d.%s.weight", l, s); };
    plan.AddStacked(n("ffn_gate_exps"), gate, t);
    plan.AddStacked(n("ffn_up_exps"), up, t);
    plan.AddStacked(n("ffn_down_exps"), down, t);
  }
  for (const auto &[l, e] : order) {
    if (!contiguous) break;
    const ExpertWeights &x = w.layers[l].experts[e];
    const TypeId t = boosted[l] ? o.boost : o.experts;
    auto n = [l = l, e = e](const char *s) { return strata::StrFormat("blk.%d.%s.%d.weight", l, s, e); };
    plan.AddMatrix(n("ffn_gate"), x.gate, t, true, kPackExpertAlignment);
    plan.AddMatrix(n("ffn_up"), x.up, t, true, 0);
    plan.AddMatrix(n("ffn_down"), x.down, t, true, 0);
    // An importance matrix names a routed expert as a matrix of its layer's stacked tensor.
    const char *stacked[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int k = 0; k < 3; ++k) {
      Job &job = plan.jobs()[plan.jobs().size() - 3 + k];
      job.imatrix_name = strata::StrFormat("blk.%d.%s.weight", l, stacked[k]);
      job.imatrix_m = e;
    }
  }
  // Tensors of a GGUF input that the model binding does not use are carried over unchanged (placed
  // before the experts); an HF checkpoint's extras (e.g. rotary caches) are not model weights.
  std::vector<Job> extras;
  if (!from_hf) {
    for (const TensorRef &t : mf->tensors()) {
      if (plan.Used(&t)) continue;
      extras.push_back(Planner::Raw(t));
    }
  }
  std::vector<Job> &jobs = plan.jobs();
  jobs.insert(jobs.begin() + static_cast<std::ptrdiff_t>(first_expert_job), extras.begin(), extras.end());

  // Metadata: everything the input says (GGUF) or llama.cpp's keys from the HParams (HF), then ours.
  format::GgufWriter writer(out, kPackFileAlignment);
  if (from_hf) {
    WriteHfMetadata(*mf, hp, writer);
  } else {
    for (const auto &[key, value] : mf->gguf().kv) {
      if (key.rfind("strata.pack.", 0) == 0) continue;
      writer.SetValue(key, value);
    }
  }
  if (int ft = GgufFileType(o.experts); ft >= 0) {
    writer.SetValue("general.file_type", format::GgufUint32(static_cast<uint32_t>(ft)));
  } else {
    writer.RemoveValue("general.file_type");
  }
  writer.SetValue("strata.pack.version", format::GgufUint32(kPackVersion));
  writer.SetValue("strata.pack.expert_layout", format::GgufString(contiguous ? "expert-contiguous" : "stacked"));
  if (contiguous) writer.SetValue("strata.pack.expert_alignment", format::GgufUint32(kPackExpertAlignment));
  writer.SetValue("strata.pack.expert_type", format::GgufString(Name(o.experts)));
  writer.SetValue("strata.pack.attention_type", format::GgufString(Name(o.attention)));
  if (!o.boost_layers.empty()) {
    writer.SetValue("strata.pack.boost_type", format::GgufString(Name(o.boost)));
    std::vector<int64_t> bl(o.boost_layers.begin(), o.boost_layers.end());
    writer.SetValue("strata.pack.boost_layers", format::GgufIntArray(GgufType::kUint32, bl));
  }
  if (contiguous) writer.SetValue("strata.pack.expert_order", format::GgufString(hot.empty() ? "layer" : "hotlist"));
  if (!hot.empty()) {
    std::vector<int64_t> hl, he, hc;
    for (const HotExpert &h : hot) {
      hl.push_back(h.layer);
      he.push_back(h.expert);
      hc.push_back(static_cast<int64_t>(h.count));
    }
    writer.SetValue("strata.pack.hotlist.layer", format::GgufIntArray(GgufType::kUint32, hl));
    writer.SetValue("strata.pack.hotlist.expert", format::GgufIntArray(GgufType::kUint32, he));
    writer.SetValue("strata.pack.hotlist.count", format::GgufIntArray(GgufType::kUint64, hc));
  }
  std::vector<std::string> fb;
  for (const PackFallback &f : plan.fallbacks()) {
    fb.push_back(absl::StrCat(f.tensor, ": ", Name(f.wanted), " -> ", Name(f.used), " (row length ",
                              f.row_length, ")"));
  }
  writer.SetValue("strata.pack.fallbacks", format::GgufStringArray(std::move(fb)));

  auto retype_job = [](Job &j, TypeId t) {
    j.type = t;
    j.raw_bytes = 0;
    if (static_cast<uint32_t>(t) == j.src_type && j.permute_head_dim == 0 && j.parts.empty()) {
      j.raw_bytes = quant::RowBytes(j.src_type, j.cols).value_or(0) * static_cast<uint64_t>(j.rows);
    }
  };
  auto retype_all = [&](Job &j, TypeId t) -> absl::Status {
    if (j.parts.empty()) {
      retype_job(j, t);
    } else {
      j.type = t;
      for (Job &p : j.parts) retype_job(p, t);
    }
    if (j.raw_bytes == 0 && j.parts.empty() && j.n_dims >= 2) return RequireQuantizer(t, j.name.c_str());
    return absl::OkStatus();
  };
  if (o.keep_types && !o.recipe.has_value()) {
    for (Job &j : jobs) {
      if (j.carried || j.n_dims < 2) continue;
      const uint32_t src = j.parts.empty() ? j.src_type : j.parts[0].src_type;
      const quant::Codec *c = quant::FindCodec(src);
      if (c == nullptr || !quant::CanQuantize(*c)) continue;  // stays as planned
      STRATA_RETURN_IF_ERROR(retype_all(j, static_cast<TypeId>(src)));
    }
    plan.fallbacks().clear();
  }
  if (o.recipe.has_value()) {
    // llama.cpp's rules, in the order llama-quantize meets the tensors (attention layer by layer).
    RecipeModel rm;
    rm.n_layer = hp.n_layer;
    rm.n_expert = hp.n_expert;
    rm.n_gqa = hp.n_head_kv > 0 ? hp.n_head / hp.n_head_kv : 1;
    rm.tied_embeddings = hp.tied_embeddings;
    for (const Job &j : jobs) rm.n_attn_v += j.name.find("attn_v.weight") != std::string::npos ? 1 : 0;
    RecipeTyper typer(*o.recipe, rm, !o.imatrix_path.empty());
    for (Job &j : jobs) {
      if (j.carried) continue;  // a tensor pack does not know goes over as it is
      STRATA_RETURN_IF_ERROR(retype_all(j, typer.TypeFor(j.name, j.n_dims, j.ne[0], j.type)));
    }
    plan.fallbacks().clear();  // the types asked for were the recipe's, not --experts / --attention
    writer.RemoveValue("strata.pack.expert_type");
    writer.RemoveValue("strata.pack.attention_type");
    writer.SetValue("general.file_type", format::GgufUint32(RecipeFileType(*o.recipe)));
    writer.SetValue("strata.pack.recipe", format::GgufString(RecipeName(*o.recipe)));
  }
  if (!o.tensor_types.empty()) {
    std::vector<std::pair<std::regex, TypeId>> rules;
    for (const auto &[pattern, t] : o.tensor_types) {
      try {
        rules.emplace_back(std::regex(pattern), t);
      } catch (const std::regex_error &e) {
        return Errorf(MOE_ERR_INVALID_ARGUMENT, "--tensor-type pattern '%s': %s", pattern, e.what());
      }
    }
    for (Job &j : jobs) {
      if (j.carried || j.n_dims < 2) continue;
      for (const auto &[re, t] : rules) {
        if (!std::regex_search(j.name, re)) continue;
        STRATA_RETURN_IF_ERROR(retype_all(j, RecipeFallback(t, j.ne[0])));
        break;
      }
    }
  }
  PackReport report;
  if (!o.imatrix_path.empty()) {
    STRATA_ASSIGN_OR_RETURN(const Imatrix im, ReadImatrix(o.imatrix_path));
    auto look_up = [&](Job &j) {
      if (j.raw_bytes > 0 || j.n_dims != 2 || static_cast<uint32_t>(j.type) == j.src_type) return;
      j.weights = im.Weights(j.imatrix_name, j.imatrix_m, j.cols);
      ++(j.weights.empty() ? report.imatrix_missing : report.imatrix_used);
    };
    for (Job &j : jobs) {
      if (j.type == TypeId::kF32 || j.type == TypeId::kF16 || j.type == TypeId::kBF16) continue;
      look_up(j);
      for (Job &p : j.parts) look_up(p);
    }
    // llama-quantize's keys, so other tools see how the file was made.
    std::string file = o.imatrix_path;
    file = file.substr(file.find_last_of('/') + 1);
    writer.SetValue("quantize.imatrix.file", format::GgufString(file));
    if (!im.datasets.empty()) writer.SetValue("quantize.imatrix.dataset", format::GgufString(im.datasets.back()));
    writer.SetValue("quantize.imatrix.entries_count", format::GgufInt32(static_cast<int32_t>(im.entries.size())));
    writer.SetValue("quantize.imatrix.chunks_count", format::GgufInt32(static_cast<int32_t>(im.chunk_count)));
  }
  // ggml makes IQ2_XXS, IQ2_XS and IQ1_S only under importance weights, and llama-quantize refuses
  // to make a tensor of those or of IQ3_XXS, IQ2_S and IQ1_M without them (but the token embeddings
  // and the output), nor Q2_K in a Q2_K_S file: so does pack, before writing anything.
  const bool q2_k_s = o.recipe.has_value() && *o.recipe == Recipe::kQ2_K_S;
  for (const Job &j : jobs) {
    auto needs_weights = [&](const Job &m, const std::string &name) {
      if (m.raw_bytes > 0 || m.n_dims < 2 || static_cast<uint32_t>(m.type) == m.src_type || !m.weights.empty()) {
        return false;
      }
      const quant::Codec *c = quant::FindCodec(m.type);
      if (c != nullptr && quant::RequiresImportance(*c)) return true;
      if (name.rfind("token_embd.", 0) == 0 || name.rfind("output.", 0) == 0) return false;
      switch (m.type) {
        case TypeId::kIQ3_XXS: case TypeId::kIQ2_S: case TypeId::kIQ1_M: return true;
        case TypeId::kQ2_K: return q2_k_s;
        default: return false;
      }
    };
    bool missing = j.parts.empty() && needs_weights(j, j.name);  // a stacked tensor's weights are its parts'
    for (const Job &p : j.parts) missing = missing || needs_weights(p, j.name);
    if (!missing) continue;
    return Errorf(MOE_ERR_INVALID_ARGUMENT,
                  "tensor '%s' would be stored as %s, which needs an importance matrix: %s", j.name, Name(j.type),
                  o.imatrix_path.empty() ? std::string("pass one with --imatrix")
                                         : StrFormat("'%s' has no entry for it", o.imatrix_path));
  }
  for (const Job &j : jobs) {
    auto added = writer.AddTensor(j.name, static_cast<uint32_t>(j.type), j.n_dims, j.ne, j.file_alignment);
    if (!added.ok()) return Annotate(added.status(), absl::StrCat("packing '", out, "'"));
  }
  STRATA_RETURN_IF_ERROR(writer.Begin());
  ProgressBar progress(o.progress, writer.tensor_bytes_total(), "pack");
  std::vector<uint8_t> src, dst;
  std::vector<float> vals, perm;
  ThreadPool pool(0);  // one thread per core quantizes the rows of a chunk
  uint64_t done = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    STRATA_RETURN_IF_ERROR(Convert(*mf, jobs[i], pool, writer, src, vals, perm, dst));
    done += writer.tensors()[i].nbytes;
    if (jobs[i].expert) report.expert_bytes += writer.tensors()[i].nbytes;
    progress.Update(done, i + 1, jobs.size());
  }
  STRATA_RETURN_IF_ERROR(writer.Finish());
  report.n_tensors = static_cast<int>(jobs.size());
  report.file_bytes = writer.file_size();
  report.fallbacks = std::move(plan.fallbacks());
  return report;
}

}  // namespace strata::model
