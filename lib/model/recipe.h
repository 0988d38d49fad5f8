// llama-quantize's file types ("recipes": q4_k_m, q3_k_s, ...) for `strata pack`: a base type and
// per-tensor rules that keep more bits where quantization hurts most (attn_v and ffn_down of the
// first, last and every third layer, the output, the attention of 8-expert models), as
// llama.cpp's llama_tensor_get_type chooses them for the families Strata packs. A tensor whose
// rows are not whole blocks of its type falls back as llama.cpp falls back (Q4_K to Q5_0, ...).
#pragma once

#include <cstdint>
#include <string>

#include "lib/quant/codec.h"
#include "lib/util/status.h"

namespace strata::model {

enum class Recipe {
  kQ2_K, kQ2_K_S, kQ3_K_S, kQ3_K_M, kQ3_K_L, kQ4_K_S, kQ4_K_M, kQ5_K_S, kQ5_K_M, kQ6_K,
  kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0, kIQ4_NL, kIQ4_XS, kMXFP4_MOE, kTQ1_0, kTQ2_0,
  kIQ2_XXS, kIQ2_XS, kIQ2_S, kIQ2_M, kIQ3_XXS, kIQ3_XS, kIQ3_S, kIQ3_M, kIQ1_S, kIQ1_M,
};

// The recipe of a llama-quantize type name (any case: "Q4_K_M", "q4_k_m"); MOE_ERR_INVALID_ARGUMENT
// naming the known ones otherwise. The lattice i-quant recipes (IQ1_*, IQ2_*, IQ3_XXS) store some
// tensors in types ggml makes only under importance weights: packing them needs an imatrix.
absl::StatusOr<Recipe> ParseRecipe(const std::string &name);
const char *RecipeName(Recipe r);
// The recipe's base type: what a tensor no rule singles out is stored in.
quant::TypeId RecipeBaseType(Recipe r);
// llama.cpp's general.file_type value of the recipe.
uint32_t RecipeFileType(Recipe r);

// llama.cpp's fallback for a type whose blocks do not divide rows of `cols` (Q4_K to Q5_0, ..., then F16).
quant::TypeId RecipeFallback(quant::TypeId t, int64_t cols);

struct RecipeModel {
  int n_layer = 0;
  int n_expert = 0;   // routed experts a layer (0: dense)
  int n_gqa = 1;      // query heads per KV head
  int n_attn_v = 0;   // attn_v tensors the file holds (one a layer)
  bool tied_embeddings = false;  // no output.weight: token_embd is the output too
};

// Chooses each tensor's type, called in the file's tensor order (its counts of attn_v tensors
// seen follow that order, as llama-quantize's do).
class RecipeTyper {
 public:
  RecipeTyper(Recipe r, const RecipeModel &m, bool has_imatrix) : r_(r), m_(m), imatrix_(has_imatrix) {}
  // The type of tensor `name` of `n_dims` dimensions and rows of `cols`; `current` when llama.cpp
  // leaves it unquantized (norms, routers, 1-D tensors).
  quant::TypeId TypeFor(const std::string &name, int n_dims, int64_t cols, quant::TypeId current);

 private:
  quant::TypeId Rule(const std::string &name, int64_t cols, quant::TypeId t);
  Recipe r_;
  RecipeModel m_;
  bool imatrix_;
  int i_attn_v_ = 0, i_ffn_down_ = 0, i_ffn_gate_ = 0, i_ffn_up_ = 0;
};

}  // namespace strata::model
