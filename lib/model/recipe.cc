// llama-quantize's recipes: the rules of llama.cpp's llama_tensor_get_type for the file types whose
// quantizers Strata has, restricted to the families it packs (no Falcon- or 70B-only cases).
#include "lib/model/recipe.h"

#include <cctype>
#include <cstdio>

namespace strata::model {
namespace {

using quant::TypeId;

struct Entry {
  Recipe r;
  const char *name;
  TypeId base;
  uint32_t file_type;  // llama.cpp's LLAMA_FTYPE_MOSTLY_*
};

constexpr Entry kRecipes[] = {
    {Recipe::kQ2_K, "Q2_K", TypeId::kQ2_K, 10},        {Recipe::kQ2_K_S, "Q2_K_S", TypeId::kQ2_K, 21},
    {Recipe::kQ3_K_S, "Q3_K_S", TypeId::kQ3_K, 11},    {Recipe::kQ3_K_M, "Q3_K_M", TypeId::kQ3_K, 12},
    {Recipe::kQ3_K_L, "Q3_K_L", TypeId::kQ3_K, 13},    {Recipe::kQ4_K_S, "Q4_K_S", TypeId::kQ4_K, 14},
    {Recipe::kQ4_K_M, "Q4_K_M", TypeId::kQ4_K, 15},    {Recipe::kQ5_K_S, "Q5_K_S", TypeId::kQ5_K, 16},
    {Recipe::kQ5_K_M, "Q5_K_M", TypeId::kQ5_K, 17},    {Recipe::kQ6_K, "Q6_K", TypeId::kQ6_K, 18},
    {Recipe::kQ4_0, "Q4_0", TypeId::kQ4_0, 2},         {Recipe::kQ4_1, "Q4_1", TypeId::kQ4_1, 3},
    {Recipe::kQ5_0, "Q5_0", TypeId::kQ5_0, 8},         {Recipe::kQ5_1, "Q5_1", TypeId::kQ5_1, 9},
    {Recipe::kQ8_0, "Q8_0", TypeId::kQ8_0, 7},         {Recipe::kIQ4_NL, "IQ4_NL", TypeId::kIQ4_NL, 25},
    {Recipe::kIQ4_XS, "IQ4_XS", TypeId::kIQ4_XS, 30},  {Recipe::kMXFP4_MOE, "MXFP4_MOE", TypeId::kMXFP4, 38},
    {Recipe::kTQ1_0, "TQ1_0", TypeId::kTQ1_0, 36},     {Recipe::kTQ2_0, "TQ2_0", TypeId::kTQ2_0, 37},
};

const Entry &Of(Recipe r) {
  for (const Entry &e : kRecipes) {
    if (e.r == r) return e;
  }
  return kRecipes[0];
}

enum class Cat { kOutput, kTokenEmbd, kAttnV, kAttnK, kAttnQ, kAttnOutput, kFfnUp, kFfnGate, kFfnDown, kOther };

// llama.cpp's categories, by the same substring tests in the same order.
Cat CategoryOf(const std::string &name) {
  if (name == "output.weight") return Cat::kOutput;
  if (name == "token_embd.weight") return Cat::kTokenEmbd;
  if (name.find("attn_v.weight") != std::string::npos) return Cat::kAttnV;
  if (name.find("attn_k.weight") != std::string::npos) return Cat::kAttnK;
  if (name.find("attn_q.weight") != std::string::npos) return Cat::kAttnQ;
  if (name.find("attn_output.weight") != std::string::npos) return Cat::kAttnOutput;
  if (name.find("ffn_up") != std::string::npos) return Cat::kFfnUp;
  if (name.find("ffn_gate") != std::string::npos) return Cat::kFfnGate;
  if (name.find("ffn_down") != std::string::npos) return Cat::kFfnDown;
  return Cat::kOther;
}

bool UseMoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

int64_t Block(TypeId t) {
  const quant::Codec *c = quant::FindCodec(t);
  return c != nullptr ? c->block_elems : 1;
}

// llama.cpp's tensor_type_fallback: a type whose blocks do not divide the rows gives way.
TypeId Fallback(TypeId t, int64_t cols) {
  if (cols % Block(t) == 0) return t;
  TypeId f = t;
  switch (t) {
    case TypeId::kIQ4_XS: f = TypeId::kIQ4_NL; break;
    case TypeId::kQ2_K:
    case TypeId::kQ3_K:
    case TypeId::kTQ1_0:
    case TypeId::kTQ2_0: f = TypeId::kQ4_0; break;
    case TypeId::kQ4_K: f = TypeId::kQ5_0; break;
    case TypeId::kQ5_K: f = TypeId::kQ5_1; break;
    case TypeId::kQ6_K: f = TypeId::kQ8_0; break;
    default: break;
  }
  return cols % Block(f) == 0 ? f : TypeId::kF16;
}

}  // namespace

TypeId RecipeFallback(TypeId t, int64_t cols) { return Fallback(t, cols); }

absl::StatusOr<Recipe> ParseRecipe(const std::string &name) {
  std::string up;
  for (char c : name) up += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const Entry &e : kRecipes) {
    if (up == e.name) return e.r;
  }
  std::string known;
  for (const Entry &e : kRecipes) known += std::string(known.empty() ? "" : ", ") + e.name;
  return Errorf(MOE_ERR_INVALID_ARGUMENT,
                "unknown file type '%s': Strata packs %s (the lattice i-quant recipes IQ1_*, IQ2_*, IQ3_* need "
                "quantizers it does not have yet)",
                name, known);
}

const char *RecipeName(Recipe r) { return Of(r).name; }
TypeId RecipeBaseType(Recipe r) { return Of(r).base; }
uint32_t RecipeFileType(Recipe r) { return Of(r).file_type; }

TypeId RecipeTyper::TypeFor(const std::string &name, int n_dims, int64_t cols, TypeId current) {
  // llama.cpp quantizes 2-D and 3-D weights only, never norms or the routers.
  const bool weight = name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0;
  if (n_dims < 2 || !weight || name.find("_norm.weight") != std::string::npos ||
      name.find("ffn_gate_inp.weight") != std::string::npos) {
    return current;
  }
  return Fallback(Rule(name, cols, RecipeBaseType(r_)), cols);
}

TypeId RecipeTyper::Rule(const std::string &name, int64_t cols, TypeId t) {
  const Cat cat = CategoryOf(name);
  const Recipe f = r_;
  auto is = [f](std::initializer_list<Recipe> rs) {
    for (Recipe r : rs) {
      if (r == f) return true;
    }
    return false;
  };
  const bool eight = m_.n_expert == 8;
  if (cat == Cat::kOutput || (m_.tied_embeddings && cat == Cat::kTokenEmbd)) {
    if (f == Recipe::kMXFP4_MOE || cols % Block(t) != 0) return TypeId::kQ8_0;
    return t == TypeId::kQ8_0 ? t : TypeId::kQ6_K;
  }
  if (f == Recipe::kMXFP4_MOE) {
    const bool routed = name.find("_exps") != std::string::npos ||
                        (name.rfind("blk.", 0) == 0 && (name.find(".ffn_gate.") != std::string::npos ||
                                                         name.find(".ffn_up.") != std::string::npos ||
                                                         name.find(".ffn_down.") != std::string::npos));
    return routed ? TypeId::kMXFP4 : TypeId::kQ8_0;
  }
  if (cat == Cat::kTokenEmbd) return is({Recipe::kTQ1_0, Recipe::kTQ2_0}) ? TypeId::kQ4_K : t;
  if (cat == Cat::kAttnV) {
    if (f == Recipe::kQ2_K) {
      t = m_.n_gqa >= 4 ? TypeId::kQ4_K : TypeId::kQ3_K;
    } else if (f == Recipe::kQ2_K_S && m_.n_gqa >= 4) {
      t = TypeId::kQ4_K;
    } else if (f == Recipe::kQ3_K_M) {
      t = i_attn_v_ < 2 ? TypeId::kQ5_K : TypeId::kQ4_K;
    } else if (f == Recipe::kQ3_K_L) {
      t = TypeId::kQ5_K;
    } else if (is({Recipe::kIQ4_NL, Recipe::kIQ4_XS}) && m_.n_gqa >= 4) {
      t = TypeId::kQ5_K;
    } else if (is({Recipe::kQ4_K_M, Recipe::kQ5_K_M}) && UseMoreBits(i_attn_v_, m_.n_attn_v)) {
      t = TypeId::kQ6_K;
    } else if (f == Recipe::kQ4_K_S && i_attn_v_ < 4) {
      t = TypeId::kQ5_K;
    }
    if (eight) t = TypeId::kQ8_0;  // an 8-expert model's attention is a small share of it
    ++i_attn_v_;
    return t;
  }
  if (cat == Cat::kAttnK) return eight ? TypeId::kQ8_0 : t;
  if (cat == Cat::kFfnDown) {
    int i_layer = i_ffn_down_;
    const int n_layer = m_.n_layer;
    if (m_.n_expert > 1 && std::sscanf(name.c_str(), "blk.%d.", &i_layer) != 1) i_layer = 0;
    if (f == Recipe::kQ2_K) {
      t = TypeId::kQ3_K;
    } else if (f == Recipe::kQ2_K_S) {
      if (i_layer < n_layer / 8) t = TypeId::kQ4_K;
    } else if (f == Recipe::kQ3_K_M) {
      t = i_layer < n_layer / 16 ? TypeId::kQ5_K : TypeId::kQ4_K;
    } else if (f == Recipe::kQ3_K_L) {
      t = TypeId::kQ5_K;
    } else if (f == Recipe::kQ4_K_M) {
      if (UseMoreBits(i_layer, n_layer)) t = TypeId::kQ6_K;
    } else if (i_layer < n_layer / 8 && is({Recipe::kIQ4_NL, Recipe::kIQ4_XS}) && !imatrix_) {
      t = TypeId::kQ5_K;
    } else if (f == Recipe::kQ5_K_M && UseMoreBits(i_layer, n_layer)) {
      t = TypeId::kQ6_K;
    } else if (f == Recipe::kQ4_K_S && i_layer < n_layer / 8) {
      t = TypeId::kQ5_K;
    } else if (is({Recipe::kQ4_0, Recipe::kQ5_0}) && imatrix_ && i_layer < n_layer / 8) {
      t = f == Recipe::kQ4_0 ? TypeId::kQ4_1 : TypeId::kQ5_1;
    }
    ++i_ffn_down_;
    return t;
  }
  if (cat == Cat::kAttnOutput) {
    if (eight) {
      if (is({Recipe::kQ2_K, Recipe::kQ3_K_S, Recipe::kQ3_K_M, Recipe::kIQ4_NL, Recipe::kQ4_K_S, Recipe::kQ4_K_M,
              Recipe::kIQ4_XS})) {
        t = TypeId::kQ5_K;
      }
    } else if (f == Recipe::kQ2_K) {
      t = TypeId::kQ3_K;
    } else if (f == Recipe::kQ3_K_M) {
      t = TypeId::kQ4_K;
    } else if (f == Recipe::kQ3_K_L) {
      t = TypeId::kQ5_K;
    }
    return t;
  }
  return t;
}

}  // namespace strata::model
