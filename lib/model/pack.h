// `strata pack`: rewrites a GGUF file or HF checkpoint as a mixed-precision GGUF. By default the
// routed experts are llama.cpp's stacked tensors `blk.L.ffn_{gate,up,down}_exps.weight` (ne {cols,
// rows, n_expert}), so llama.cpp and the `gguf` package load the file. ExpertLayout::kExpertContiguous
// writes per-expert tensors `blk.L.ffn_{gate,up,down}.E.weight` instead, gate|up|down of one expert
// adjacent (only the 32-byte tensor alignment between them) and each expert's start 4096-aligned in
// the file, so a cache miss is one sequential read (a layout only Strata reads). Tensors are
// converted one at a time (no whole-model buffer).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lib/model/hparams.h"
#include "lib/model/recipe.h"
#include "lib/quant/codec.h"
#include "lib/util/status.h"

namespace strata::format {
class GgufWriter;
}  // namespace strata::format

namespace strata::model {

constexpr uint32_t kPackVersion = 1;
constexpr uint32_t kPackExpertAlignment = 4096;
constexpr uint32_t kPackFileAlignment = 32;

enum class ExpertLayout { kStacked, kExpertContiguous };

struct PackOptions {
  ExpertLayout layout = ExpertLayout::kStacked;
  quant::TypeId experts = quant::TypeId::kQ4_K;    // routed experts
  quant::TypeId attention = quant::TypeId::kQ8_0;  // attention, embeddings, output (and shared experts)
  quant::TypeId boost = quant::TypeId::kQ6_K;      // routed experts of the boost layers
  std::vector<int> boost_layers;
  // Hotlist file (format: see ReadHotlist), the expert-contiguous layout only; empty keeps the
  // experts in (layer, expert) order.
  std::string hotlist_path;
  // An importance matrix (lib/model/imatrix.h: llama.cpp's GGUF or .dat) whose per-column weights
  // the quantizers take, as llama-quantize --imatrix does; a tensor it has no entry for, or one
  // kept in its type (its bytes go over unchanged), is quantized without them. A tensor to be stored
  // in IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_M or IQ1_S (but the token embeddings and the output), or
  // in Q2_K within a Q2_K_S file, needs its weights, as llama-quantize rules: without, Pack fails with
  // MOE_ERR_INVALID_ARGUMENT naming the tensor and the type, before writing.
  std::string imatrix_path;
  // A llama-quantize file type ("q4_k_m"): every matrix's type by llama.cpp's per-tensor rules for
  // it, instead of experts / attention / boost (which are then ignored).
  std::optional<Recipe> recipe;
  // Every matrix keeps its input's type (its bytes go over unchanged) unless a rule below says
  // otherwise; experts / attention / boost are then ignored.
  bool keep_types = false;
  // llama-quantize's --tensor-type: a tensor whose name the pattern (ECMAScript regex) finds is stored
  // in the type (the first pattern that matches; after the recipe or keep_types), with llama.cpp's
  // fallback where its rows are not whole blocks.
  std::vector<std::pair<std::string, quant::TypeId>> tensor_types;
  bool progress = false;  // draw a progress bar on stderr (the CLI sets it when stderr is a terminal)
  bool verbose = true;    // print each fallback and a summary on stderr
};

// One hotlist entry: expert `expert` of layer `layer`, selected `count` times.
struct HotExpert {
  int layer = 0;
  int expert = 0;
  uint64_t count = 0;
};

// One tensor stored in another type than asked, because its rows are not whole blocks of it.
struct PackFallback {
  std::string tensor;
  quant::TypeId wanted;
  quant::TypeId used;
  int64_t row_length = 0;
};

struct PackReport {
  int n_tensors = 0;
  int imatrix_used = 0, imatrix_missing = 0;  // quantized matrices with and without importance weights
  uint64_t file_bytes = 0;
  uint64_t expert_bytes = 0;      // gate|up|down of every routed expert, padding excluded
  std::vector<PackFallback> fallbacks;
};

// "q4_k", "Q8_0", "f16", ... (case-insensitive GGUF type names). MOE_ERR_INVALID_ARGUMENT otherwise.
absl::StatusOr<quant::TypeId> ParseTypeName(const std::string &name);

// MOE_ERR_UNSUPPORTED_TYPE naming `what` (an option, e.g. "--experts") when Strata has no quantizer
// for `t`.
absl::Status RequireQuantizer(quant::TypeId t, const char *what);

// llama.cpp's general.file_type for a model whose bulk (the routed experts) is `t`; -1 when no
// llama ftype describes it.
int GgufFileType(quant::TypeId t);

// Writes general.architecture, general.name and llama.cpp's hyper-parameter keys for `hp` under
// the GGUF architecture `arch`: "qwen3moe" (key/value_length, expert_feed_forward_length, the
// dense `dense_ff` as feed_forward_length, expert_weights_norm), "llama" (Mixtral: expert width as
// feed_forward_length, rope.dimension_count, vocab_size) or "olmoe" (expert width as
// feed_forward_length). hp.arch is not consulted.
void WriteLlamaCppHParams(const std::string &arch, const std::string &name, const HParams &hp, int64_t dense_ff,
                          format::GgufWriter &w);

// A one-line progress bar on stderr (`strata: LABEL [####....] 42%  n/N tensors  x/y MiB`), redrawn at
// most every 100 ms and ended with a newline when destroyed; does nothing when `on` is false.
class ProgressBar {
 public:
  ProgressBar(bool on, uint64_t total_bytes, std::string label);
  ~ProgressBar();
  ProgressBar(const ProgressBar &) = delete;
  ProgressBar &operator=(const ProgressBar &) = delete;
  void Update(uint64_t done_bytes, size_t tensor, size_t n_tensors);

 private:
  bool on_;
  uint64_t total_;
  std::string label_;
  bool drawn_ = false;
  int64_t last_ns_ = 0;
};

// Reads a hotlist: a text file of lines `layer expert count` (decimal, separated by blanks), hottest
// first; blank lines and text after '#' are ignored. Every (layer, expert) must be in range for `hp`
// and appear at most once; counts are informational and, when not descending, the entries are
// stably sorted by count so the hottest experts come first. Errors: MOE_ERR_IO_OPEN/READ, or
// MOE_ERR_INVALID_ARGUMENT naming the file and line.
absl::StatusOr<std::vector<HotExpert>> ReadHotlist(const std::string &path, const HParams &hp);
// The same from the file's text; `path` names it in messages.
absl::StatusOr<std::vector<HotExpert>> ParseHotlist(std::string_view text, const std::string &path, const HParams &hp);

// Packs `in` (GGUF file or HF checkpoint directory) into the GGUF file `out`. The output is written
// as `out.tmp.<pid>`, fsynced and renamed; on any error neither `out` (if it did not exist) nor the
// temporary file is left behind. Errors: the input's MOE_ERR_IO_*/FORMAT_*/UNSUPPORTED_* codes,
// MOE_ERR_INVALID_ARGUMENT for bad options (boost layer out of range, bad hotlist),
// MOE_ERR_UNSUPPORTED_TYPE when Strata has no quantizer for a requested type, MOE_ERR_IO_WRITE for
// any write failure (ENOSPC, ...) naming `out`.
absl::StatusOr<PackReport> Pack(const std::string &in, const std::string &out, const PackOptions &o);

}  // namespace strata::model
