// llama-quantize's recipes: the rules of llama.cpp's llama_tensor_get_type for its file types,
// restricted to the families Strata packs (no Falcon- or 70B-only cases, no fused QKV).
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
    {Recipe::kIQ2_XXS, "IQ2_XXS", TypeId::kIQ2_XXS, 19}, {Recipe::kIQ2_XS, "IQ2_XS", TypeId::kIQ2_XS, 20},
    {Recipe::kIQ2_S, "IQ2_S", TypeId::kIQ2_XS, 28},    {Recipe::kIQ2_M, "IQ2_M", TypeId::kIQ2_S, 29},
    {Recipe::kIQ3_XXS, "IQ3_XXS", TypeId::kIQ3_XXS, 23}, {Recipe::kIQ3_XS, "IQ3_XS", TypeId::kIQ3_S, 22},
    {Recipe::kIQ3_S, "IQ3_S", TypeId::kIQ3_S, 26},     {Recipe::kIQ3_M, "IQ3_M", TypeId::kIQ3_S, 27},
    {Recipe::kIQ1_S, "IQ1_S", TypeId::kIQ1_S, 24},     {Recipe::kIQ1_M, "IQ1_M", TypeId::kIQ1_M, 31},
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
    case TypeId::kIQ1_S:
    case TypeId::kIQ1_M:
    case TypeId::kIQ2_XXS:
    case TypeId::kIQ2_XS:
    case TypeId::kIQ2_S:
    case TypeId::kIQ3_XXS:
    case TypeId::kIQ3_S:
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
  return Errorf(MOE_ERR_INVALID_ARGUMENT, "unknown file type '%s': Strata packs %s", name, known);
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
  // The lowest-bit lattice recipes, which llama.cpp treats as one family.
  const bool low_iq = is({Recipe::kIQ2_XXS, Recipe::kIQ2_XS, Recipe::kIQ1_S, Recipe::kIQ2_S, Recipe::kIQ2_M,
                          Recipe::kIQ1_M});
  const bool iq2_sm = is({Recipe::kIQ2_S, Recipe::kIQ2_M});
  if (cat == Cat::kOutput || (m_.tied_embeddings && cat == Cat::kTokenEmbd)) {
    if (f == Recipe::kMXFP4_MOE || cols % Block(t) != 0) return TypeId::kQ8_0;
    if (low_iq || f == Recipe::kIQ3_XXS) return TypeId::kQ5_K;
    return t == TypeId::kQ8_0 ? t : TypeId::kQ6_K;
  }
  if (f == Recipe::kMXFP4_MOE) {
    const bool routed = name.find("_exps") != std::string::npos ||
                        (name.rfind("blk.", 0) == 0 && (name.find(".ffn_gate.") != std::string::npos ||
                                                         name.find(".ffn_up.") != std::string::npos ||
                                                         name.find(".ffn_down.") != std::string::npos));
    return routed ? TypeId::kMXFP4 : TypeId::kQ8_0;
  }
  if (cat == Cat::kTokenEmbd) {
    if (is({Recipe::kIQ2_XXS, Recipe::kIQ2_XS, Recipe::kIQ1_S, Recipe::kIQ1_M})) return TypeId::kQ2_K;
    if (iq2_sm || f == Recipe::kIQ3_XXS) return TypeId::kIQ3_S;
    return is({Recipe::kTQ1_0, Recipe::kTQ2_0}) ? TypeId::kQ4_K : t;
  }
  if (low_iq) {
    if (cat == Cat::kAttnV) {
      ++i_attn_v_;
      if (m_.n_gqa >= 4 || m_.n_expert >= 4) return TypeId::kQ4_K;
      return iq2_sm ? TypeId::kIQ3_S : TypeId::kQ2_K;
    }
    if (eight && cat == Cat::kAttnK) return TypeId::kQ4_K;
    if (cat == Cat::kFfnDown) {
      if (i_ffn_down_ < m_.n_layer / 8) t = iq2_sm ? TypeId::kIQ3_S : TypeId::kQ2_K;
      ++i_ffn_down_;
      return t;
    }
    if (cat == Cat::kAttnOutput) {
      if (eight) return TypeId::kQ5_K;
      if (is({Recipe::kIQ1_S, Recipe::kIQ1_M})) return TypeId::kIQ2_XXS;
      if (iq2_sm) return TypeId::kIQ3_S;
    }
    return t;
  }
  if (cat == Cat::kAttnV) {
    if (f == Recipe::kQ2_K) {
      t = m_.n_gqa >= 4 ? TypeId::kQ4_K : TypeId::kQ3_K;
    } else if (f == Recipe::kQ2_K_S && m_.n_gqa >= 4) {
      t = TypeId::kQ4_K;
    } else if (f == Recipe::kIQ3_XXS) {
      t = m_.n_gqa >= 4 ? TypeId::kQ4_K : !imatrix_ ? TypeId::kIQ3_S : TypeId::kIQ3_XXS;
    } else if (is({Recipe::kIQ3_XS, Recipe::kIQ3_S}) && m_.n_gqa >= 4) {
      t = TypeId::kQ4_K;
    } else if (f == Recipe::kIQ3_M) {
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
  if (cat == Cat::kAttnK) {
    if (eight) return TypeId::kQ8_0;
    if (f == Recipe::kIQ3_XS) return TypeId::kIQ3_XXS;
    return f == Recipe::kIQ3_XXS ? TypeId::kIQ2_S : t;
  }
  if (cat == Cat::kAttnQ) {
    if (f == Recipe::kIQ3_XS) return TypeId::kIQ3_XXS;
    return f == Recipe::kIQ3_XXS ? TypeId::kIQ2_S : t;
  }
  // The layer of an ffn tensor: parsed from its name in an MoE model (experts need not come in
  // order), else the count of such tensors seen.
  auto layer_of = [&](int counter) {
    int i_layer = counter;
    if (m_.n_expert > 1 && std::sscanf(name.c_str(), "blk.%d.", &i_layer) != 1) i_layer = 0;
    return i_layer;
  };
  if (cat == Cat::kFfnDown) {
    const int i_layer = layer_of(i_ffn_down_);
    const int n_layer = m_.n_layer;
    if (f == Recipe::kQ2_K) {
      t = TypeId::kQ3_K;
    } else if (f == Recipe::kQ2_K_S) {
      if (i_layer < n_layer / 8) t = TypeId::kQ4_K;
    } else if (f == Recipe::kIQ3_XXS && !imatrix_) {
      t = i_layer < n_layer / 8 ? TypeId::kQ4_K : TypeId::kQ3_K;
    } else if (f == Recipe::kQ3_K_M) {
      t = i_layer < n_layer / 16 ? TypeId::kQ5_K : TypeId::kQ4_K;
    } else if (f == Recipe::kIQ3_M && (i_layer < n_layer / 8 || (eight && UseMoreBits(i_layer, n_layer)))) {
      t = TypeId::kQ4_K;
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
      if (is({Recipe::kQ2_K, Recipe::kIQ3_XS, Recipe::kIQ3_XXS, Recipe::kQ3_K_S, Recipe::kQ3_K_M, Recipe::kIQ4_NL,
              Recipe::kQ4_K_S, Recipe::kQ4_K_M, Recipe::kIQ3_S, Recipe::kIQ3_M, Recipe::kIQ4_XS})) {
        t = TypeId::kQ5_K;
      }
    } else if (f == Recipe::kQ2_K) {
      t = TypeId::kQ3_K;
    } else if (f == Recipe::kIQ3_XXS) {
      t = TypeId::kIQ3_S;
    } else if (f == Recipe::kQ3_K_M) {
      t = TypeId::kQ4_K;
    } else if (f == Recipe::kQ3_K_L) {
      t = TypeId::kQ5_K;
    } else if (f == Recipe::kIQ3_M) {
      t = TypeId::kQ4_K;
    }
    return t;
  }
  if (cat == Cat::kFfnGate || cat == Cat::kFfnUp) {
    int &counter = cat == Cat::kFfnGate ? i_ffn_gate_ : i_ffn_up_;
    const int i_layer = layer_of(counter);
    if (f == Recipe::kIQ3_XS && i_layer >= m_.n_layer / 8 && i_layer < 7 * m_.n_layer / 8) t = TypeId::kIQ3_XXS;
    ++counter;
    return t;
  }
  return t;
}

}  // namespace strata::model
