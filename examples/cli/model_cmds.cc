// strata inspect, plan, pack and synth: what a model file holds, the cache plan over it, and the
// GGUF files Strata writes (repacked or synthesized).
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <fstream>
#include <cmath>
#include <map>
#include <sstream>
#include <string>
#include <vector>
#include "examples/cli/cli.h"
#include "examples/cli/cli_util.h"
#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/model/pack.h"
#include "lib/model/synth.h"
#include "lib/quant/codec.h"
#include "lib/runtime/context.h"
#include "lib/util/memory_lock.h"
#include "lib/util/safe_text.h"
#include "lib/util/stats.h"
#include "lib/util/tunables.h"
#include "nlohmann/json.hpp"

namespace strata::cli {

std::string HumanBytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", b / double(1ull << 20));
  else if (b >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.2f KiB", b / double(1ull << 10));
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

strata::runtime::Context::Described DescribeOrDie(const std::string &path) {
  auto d = strata::runtime::Context::Describe(path);
  if (!d.ok()) {
    moe_status st = strata::StatusToMoe(d.status());
    Die("'" + path + "': " + std::string(d.status().message()) + " (" + moe_status_string(st) + ")");
  }
  return std::move(*d);
}

int CmdInspect(const Args &a) {
  std::string path = a.model;
  if (path.empty() && a.positional.size() == 1) path = a.positional[0];
  if (path.empty() || a.positional.size() > 1) Die("inspect needs exactly one PATH");
  auto d = DescribeOrDie(path);
  const auto &hp = d.hp;
  const auto &mf = *d.file;
  std::printf("model:        %s (%s)\n", path.c_str(),
              mf.kind() == strata::model::ModelFile::Kind::kGguf ? "GGUF" : "Hugging Face checkpoint");
  if (mf.kind() == strata::model::ModelFile::Kind::kGguf) {
    std::printf("gguf:         version %u, %zu metadata keys, %zu tensors, alignment %llu\n", mf.gguf().version,
                mf.gguf().kv.size(), mf.gguf().tensors.size(),
                static_cast<unsigned long long>(mf.gguf().alignment));
  } else {
    std::printf("checkpoint:   %d safetensors file(s), %zu tensors\n", mf.n_files(), mf.tensors().size());
  }
  std::printf("architecture: %s\n", hp.arch_name.c_str());
  std::printf("layers %d, embedding %d, heads %d (kv %d, dim %d), vocab %d, context %d\n", hp.n_layer, hp.n_embd,
              hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab, hp.n_ctx_train);
  std::printf("experts %d (%d used per token), expert ffn %d, norm_topk_prob %s, qk_norm %s, tied %s\n", hp.n_expert,
              hp.n_expert_used, hp.n_ff_expert, hp.norm_topk_prob ? "yes" : "no", hp.qk_norm ? "yes" : "no",
              hp.tied_embeddings ? "yes" : "no");
  std::printf("rope theta %g (%s), rms eps %g%s\n", hp.rope_theta,
              hp.rope_style == strata::model::RopeStyle::kNeox ? "neox" : "normal", hp.rms_eps,
              hp.sliding_window ? (", sliding window " + std::to_string(hp.sliding_window)).c_str() : "");
  {
    // Family features: what stays resident besides attention (shared experts, dense MLP layers).
    int n_dense = 0;
    for (int l = 0; l < hp.n_layer; ++l) n_dense += hp.is_dense(l) ? 1 : 0;
    std::string extra;
    if (hp.qk_norm_full) extra += ", qk_norm over the whole projection";
    if (hp.attn_bias) extra += ", q/k/v bias";
    if (hp.attn_out_bias) extra += ", output bias";
    if (hp.n_ff_shared > 0) {
      extra += ", shared expert ffn " + std::to_string(hp.n_ff_shared) +
               (hp.shared_expert_gate ? " (sigmoid-gated)" : "") + " resident";
    }
    if (n_dense > 0) {
      extra += ", " + std::to_string(n_dense) + " dense layer(s) of ffn " + std::to_string(hp.n_ff_dense);
    }
    std::printf("kv cache %llu bytes per token (all layers)%s\n",
                static_cast<unsigned long long>(strata::model::KvCache::BytesFor(hp, 1)), extra.c_str());
  }
  // Attention, routing and RoPE variants of the DeepSeek and gpt-oss families.
  if (hp.mla) {
    std::printf("attention: multi-head latent (q_lora_rank %d, kv_lora_rank %d, qk_nope %d, qk_rope %d, v_head %d); "
                "cache row = latent %d + rope key %d floats per token and layer\n",
                hp.q_lora_rank, hp.kv_lora_rank, hp.qk_nope_dim, hp.qk_rope_dim, hp.v_head_dim, hp.kv_lora_rank,
                hp.qk_rope_dim);
  }
  if (hp.attn_sinks || !hp.layer_window.empty()) {
    std::string windows;
    for (int l = 0; l < hp.n_layer; ++l) {
      windows += (l ? "," : "") + (hp.window(l) > 0 ? std::to_string(hp.window(l)) : std::string("full"));
    }
    std::printf("attention: %swindow per layer [%s]\n", hp.attn_sinks ? "sinks per head, " : "", windows.c_str());
  }
  if (hp.gating != strata::model::Gating::kSoftmax || hp.n_group > 1 || hp.routed_scale != 1.f ||
      hp.n_shared_experts > 0) {
    const char *gating = hp.gating == strata::model::Gating::kSigmoid        ? "sigmoid"
                         : hp.gating == strata::model::Gating::kSoftmaxSelected ? "softmax over the selected"
                                                                                : "softmax";
    std::printf("routing: %s, groups %d (top %d kept)%s, routed scale %g%s%s\n", gating, hp.n_group, hp.topk_group,
                hp.expert_select_bias ? ", selection bias" : "", hp.routed_scale,
                hp.n_shared_experts > 0 ? (", " + std::to_string(hp.n_shared_experts) + " shared expert(s)").c_str() : "",
                hp.swiglu_limit > 0.f ? ", clamped SwiGLU" : "");
  }
  if (hp.yarn) {
    std::printf("rope scaling: yarn factor %g (original context %d), cos/sin x %g, score scale %g\n", hp.yarn_factor,
                hp.yarn_orig_ctx, hp.yarn_attn_factor,
                hp.attn_scale != 0.f ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp.head_dim)));
  }
  std::printf("\n%-48s %-6s %-24s %12s\n", "tensor", "type", "shape (innermost first)", "bytes");
  for (const auto &t : mf.tensors()) {
    std::string shape;
    for (int i = 0; i < t.n_dims; ++i) shape += (i ? " x " : "") + std::to_string(t.ne[i]);
    std::printf("%-48s %-6s %-24s %12llu\n", t.name.c_str(), std::string(strata::quant::TypeName(t.type)).c_str(),
                shape.c_str(), static_cast<unsigned long long>(t.nbytes));
  }
  // Per-expert bytes by codec (gate|up|down of one routed expert).
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_codec;  // codec set -> (experts, bytes)
  for (const auto &L : d.weights.layers) {
    for (const auto &e : L.experts) {
      std::string key = std::string(e.gate.codec->name) + "/" + std::string(e.up.codec->name) + "/" +
                        std::string(e.down.codec->name);
      by_codec[key].first += 1;
      by_codec[key].second += e.nbytes();
    }
  }
  std::printf("\nrouted experts (gate/up/down codecs): %d layers x %d experts\n", hp.n_layer, hp.n_expert);
  for (const auto &[k, v] : by_codec) {
    std::printf("  %-20s %6llu experts, %s each, %s total\n", k.c_str(), static_cast<unsigned long long>(v.first),
                HumanBytes(v.second / v.first).c_str(), HumanBytes(v.second).c_str());
  }
  std::printf("non-routed weights: %s; routed experts: %s; files: %s\n",
              HumanBytes(strata::model::NonRoutedBytes(d.weights)).c_str(),
              HumanBytes(strata::model::RoutedExpertBytes(d.weights)).c_str(), HumanBytes(mf.total_file_bytes()).c_str());
  return 0;
}

int CmdPlan(const Args &a) {
  std::string path = a.model;
  if (path.empty() && a.positional.size() == 1) path = a.positional[0];
  if (path.empty()) Die("plan needs --model PATH");
  auto d = DescribeOrDie(path);
  strata::runtime::ContextOptions o;
  o.model_path = path;
  o.ram_budget_bytes = a.ram_budget;
  o.vram_budget_bytes = a.vram_budget;
  o.n_ctx = static_cast<int>(a.n_ctx);
  o.max_sessions = static_cast<int>(a.max_sessions);
  o.kv_budget_bytes = a.kv_budget;
  o.backend = a.backend;
  o.kv_type_k = KvTypeOf(a.cache_type_k);
  o.kv_type_v = KvTypeOf(a.cache_type_v);
  auto plan = strata::store::MakePlan(d.hp, d.weights, strata::runtime::Context::PlanInputsFor(o, d.hp));
  if (!plan.ok()) Die(std::string(plan.status().message()));
  if (plan->clamped) {
    std::fprintf(stderr, "strata: warning: RAM budget raised to the minimum that can run, %llu bytes\n",
                 static_cast<unsigned long long>(plan->ram_budget_bytes));
  }
  if (a.json) {
    // One object a script sizes budgets from (DESIGN.md 3.2): the integer fields are exact.
    const auto &p = *plan;
    const std::string model = nlohmann::json(path).dump();  // a JSON string, quoted
    std::printf(
        "{\"model\":%s,\"backend\":\"%s\",\"routed_experts\":%u,\"vram_expert_slots\":%u,"
        "\"ram_expert_slots\":%u,\"streamed_experts\":%u,\"ram_fixed_bytes\":%llu,\"vram_fixed_bytes\":%llu,"
        "\"expert_slot_bytes\":%llu,\"kv_bytes_per_token\":%llu,\"kv_type_k\":\"%s\",\"kv_type_v\":\"%s\","
        "\"ram_budget_bytes\":%llu,"
        "\"vram_budget_bytes\":%llu,\"non_routed_bytes\":%llu,\"kv_bytes\":%llu,\"workspace_bytes\":%llu,"
        "\"routed_expert_bytes\":%llu,\"n_layers\":%u,\"experts_per_layer\":%u,\"clamped\":%s}\n",
        model.c_str(), p.vram_fixed_bytes > 0 ? "cuda" : "cpu", p.n_routed_experts, p.vram_expert_slots,
        p.ram_expert_slots, p.streamed_experts, static_cast<unsigned long long>(p.ram_fixed_bytes),
        static_cast<unsigned long long>(p.vram_fixed_bytes), static_cast<unsigned long long>(p.expert_slot_bytes),
        static_cast<unsigned long long>(p.kv_bytes_per_token), strata::model::KvTypeName(p.kv_type_k),
        strata::model::KvTypeName(p.kv_type_v), static_cast<unsigned long long>(p.ram_budget_bytes),
        static_cast<unsigned long long>(p.vram_budget_bytes), static_cast<unsigned long long>(p.non_routed_bytes),
        static_cast<unsigned long long>(p.kv_bytes), static_cast<unsigned long long>(p.workspace_bytes),
        static_cast<unsigned long long>(p.routed_expert_bytes), p.n_layers, p.n_experts_per_layer,
        p.clamped ? "true" : "false");
    return 0;
  }
  std::printf("cache plan for %s (%s, %d layers x %d experts)\n\n", path.c_str(), d.hp.arch_name.c_str(), d.hp.n_layer,
              d.hp.n_expert);
  std::fputs(strata::store::FormatLedger(*plan).c_str(), stdout);
  return 0;
}

std::string StatusText(const absl::Status &st) {
  return std::string(st.message()) + " (" + moe_status_string(strata::StatusToMoe(st)) + ")";
}

// The temporary file of a pack in progress, removed if the user interrupts it (unlink is
// async-signal-safe); the output itself only appears by rename at the very end.
char g_pack_temp[4096];

void RemovePackTempAndDie(int sig) {
  if (g_pack_temp[0] != '\0') unlink(g_pack_temp);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

namespace {

// pack --target-size: every tensor keeps its type except the groups whose measured step down
// (strata sensitivity) costs the least KL divergence per byte saved, taken in that order until the
// file fits.
int PackToSize(const Args &a, const std::string &in, const std::string &out, strata::model::PackOptions o) {
  std::ifstream f(a.sensitivity);
  if (!f) Die("cannot read '" + a.sensitivity + "'");
  nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded() || !j.contains("rows") || !j["rows"].is_array()) {
    Die("'" + a.sensitivity + "' is not a table of strata sensitivity --out");
  }
  struct Step {
    int layer;
    std::string group;
    strata::quant::TypeId to;
    uint64_t saved;
    double kld;
  };
  std::vector<Step> steps;
  for (const auto &r : j["rows"]) {
    if (!r.contains("layer") || !r["layer"].is_number_integer() || !r.contains("group") || !r["group"].is_string() ||
        !r.contains("to") || !r["to"].is_string() || !r.contains("saved_bytes") || !r["saved_bytes"].is_number() ||
        !r.contains("kld") || !r["kld"].is_number()) {
      Die("'" + a.sensitivity + "' has a row without layer, group, to, saved_bytes and kld");
    }
    auto t = strata::model::ParseTypeName(r["to"].get<std::string>());
    if (!t.ok()) Die("'" + a.sensitivity + "': " + std::string(t.status().message()));
    steps.push_back({r["layer"].get<int>(), r["group"].get<std::string>(), *t, r["saved_bytes"].get<uint64_t>(),
                     r["kld"].get<double>()});
  }
  std::sort(steps.begin(), steps.end(), [](const Step &x, const Step &y) {
    return x.kld * static_cast<double>(y.saved + 1) < y.kld * static_cast<double>(x.saved + 1);
  });
  o.keep_types = true;
  o.progress = false;
  o.verbose = false;
  const auto base_rules = o.tensor_types;
  for (size_t taken = 0;; ++taken) {
    o.tensor_types = base_rules;
    for (size_t i = 0; i < taken; ++i) {
      const Step &s = steps[i];
      o.tensor_types.emplace_back(GroupPattern(s.layer, s.group), s.to);
    }
    auto report = strata::model::Pack(in, out, o);
    if (!report.ok()) Die("pack '" + in + "': " + StatusText(report.status()));
    if (report->file_bytes <= a.target_size) {
      std::fprintf(stderr, "strata: pack: wrote %s: %s, %zu of %zu groups one step lower:", out.c_str(),
                   HumanBytes(report->file_bytes).c_str(), taken, steps.size());
      for (size_t i = 0; i < taken; ++i) std::fprintf(stderr, " %d/%s", steps[i].layer, steps[i].group.c_str());
      std::fputc('\n', stderr);
      return 0;
    }
    if (taken == steps.size()) {
      std::remove(out.c_str());
      Die("every group one step lower still takes " + HumanBytes(report->file_bytes) + ", more than --target-size " +
          HumanBytes(a.target_size));
    }
  }
}

}  // namespace

int CmdPack(const Args &a) {
  if (a.positional.size() != 2 && a.positional.size() != 3) {
    Die("pack needs IN and OUT, and optionally a llama-quantize type (strata pack IN OUT [Q4_K_M] [options])");
  }
  const std::string &in = a.positional[0], &out = a.positional[1];
  strata::model::PackOptions o;
  if (a.positional.size() == 3) {
    auto r = strata::model::ParseRecipe(a.positional[2]);
    if (!r.ok()) Die(std::string(r.status().message()));
    if (!a.boost_layers.empty()) Die("--boost-layers and a file type (" + a.positional[2] + ") do not go together");
    o.recipe = *r;
  }
  auto type = [](const char *flag, const std::string &v) {
    auto t = strata::model::ParseTypeName(v);
    if (!t.ok()) Die(std::string(flag) + ": " + std::string(t.status().message()));
    return *t;
  };
  o.experts = type("--experts", a.experts_type);
  o.attention = type("--attention", a.attention_type);
  o.boost = type("--boost", a.boost_type);
  if (!a.boost_layers.empty()) {
    auto layers = ParseTokenList(a.boost_layers);
    if (!layers) Die("--boost-layers needs comma-separated layer numbers, got '" + a.boost_layers + "'");
    o.boost_layers.assign(layers->begin(), layers->end());
  }
  o.hotlist_path = a.hotlist;
  if (a.expert_contiguous) o.layout = strata::model::ExpertLayout::kExpertContiguous;
  o.imatrix_path = a.imatrix;
  for (const std::string &tt : a.tensor_types) {
    const size_t eq = tt.rfind('=');
    if (eq == std::string::npos || eq == 0) Die("--tensor-type needs PATTERN=TYPE, got '" + tt + "'");
    o.tensor_types.emplace_back(tt.substr(0, eq), type("--tensor-type", tt.substr(eq + 1)));
  }
  if ((a.target_size > 0) != !a.sensitivity.empty()) Die("--target-size and --sensitivity FILE go together");
  if (a.target_size > 0) return PackToSize(a, in, out, o);
  o.progress = isatty(STDERR_FILENO) != 0;
  const std::string temp = out + ".tmp." + std::to_string(getpid());
  if (temp.size() < sizeof g_pack_temp) {
    std::memcpy(g_pack_temp, temp.c_str(), temp.size() + 1);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, RemovePackTempAndDie);
  }
  auto report = strata::model::Pack(in, out, o);
  if (!report.ok()) Die("pack '" + in + "': " + StatusText(report.status()));
  for (const auto &f : report->fallbacks) {
    std::fprintf(stderr, "strata: pack: fallback: %s: row length %lld is not a multiple of the %s block; stored as %s\n",
                 f.tensor.c_str(), static_cast<long long>(f.row_length),
                 std::string(strata::quant::TypeName(static_cast<uint32_t>(f.wanted))).c_str(),
                 std::string(strata::quant::TypeName(static_cast<uint32_t>(f.used))).c_str());
  }
  std::fprintf(stderr, "strata: pack: wrote %s: %d tensors, %s (routed experts %s), %zu fallback(s)\n", out.c_str(),
               report->n_tensors, HumanBytes(report->file_bytes).c_str(), HumanBytes(report->expert_bytes).c_str(),
               report->fallbacks.size());
  if (!a.imatrix.empty()) {
    std::fprintf(stderr, "strata: pack: importance weights for %d matrices (%d quantized without: no entry)\n",
                 report->imatrix_used, report->imatrix_missing);
  }
  return 0;
}

int CmdSynth(const Args &a) {
  if (a.shape.empty() || a.out.empty() || !a.positional.empty()) {
    Die("synth needs --shape NAME and --out FILE (strata synth --shape tiny --out tiny.gguf)");
  }
  strata::model::SynthOptions o;
  o.shape = a.shape;
  o.experts = a.codec;
  o.attention = a.attention_type;
  o.layers = static_cast<int>(a.layers);
  o.seed = a.seed;
  o.sparse = a.sparse;
  o.routing = a.routing;
  o.progress = isatty(STDERR_FILENO) != 0;
  const std::string temp = a.out + ".tmp." + std::to_string(getpid());
  if (temp.size() < sizeof g_pack_temp) {
    std::memcpy(g_pack_temp, temp.c_str(), temp.size() + 1);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, RemovePackTempAndDie);
  }
  auto r = strata::model::Synthesize(o, a.out);
  if (!r.ok()) Die("synth '" + a.out + "': " + StatusText(r.status()));
  std::fprintf(stderr, "strata: synth: wrote %s: %d tensors, %s (routed experts %s, %s per expert) in %.1f s, "
               "%.0f MB/s\n", a.out.c_str(), r->n_tensors, HumanBytes(r->file_bytes).c_str(),
               HumanBytes(r->expert_bytes).c_str(), HumanBytes(r->expert_slot_bytes).c_str(), r->seconds,
               r->file_bytes / 1e6 / std::max(r->seconds, 1e-9));
  // Per-layer sizes, for sizing a --layers slice of the full model.
  uint64_t in_layers = 0;
  for (uint64_t b : r->layer_bytes) in_layers += b;
  std::string dense;
  if (r->n_dense_layers > 0) dense = ", a dense layer " + HumanBytes(r->layer_bytes.front());
  std::fprintf(stderr, "strata: synth: a MoE layer %s%s, outside the layers %s\n",
               HumanBytes(r->layer_bytes.back()).c_str(), dense.c_str(),
               HumanBytes(r->file_bytes - in_layers).c_str());
  return 0;
}

}  // namespace strata::cli
