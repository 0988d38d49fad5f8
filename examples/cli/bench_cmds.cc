// strata bench, its --sweep and strata profile: decode and prefill throughput, the expert tiers'
// behaviour per step, the fastest cache configuration, and hotlists recorded from prompts.
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

// Decode throughput and expert-tier behaviour: a seeded random prompt of --prompt-tokens ids goes in
// as one batch, then -n tokens are decoded greedily, one step each.
// Runs `strata bench --json` (this same binary) once per configuration of the expert cache — each
// run a fresh process, so every configuration starts cold — and prints them fastest first.
int CmdSweep(const Args &a) {
  std::string self(4096, '\0');
  const ssize_t len = readlink("/proc/self/exe", self.data(), self.size() - 1);
  if (len <= 0) Die("--sweep: cannot find this program's path");
  self.resize(static_cast<size_t>(len));
  std::string base;
  for (size_t i = 1; i < a.argv.size(); ++i) {
    const std::string &arg = a.argv[i];
    if (arg == "--sweep" || arg == "--json" || arg == "--stats") continue;
    if (arg == "--policy" || arg == "--prefetch" || arg == "--io-threads") {
      ++i;  // the sweep sets these
      continue;
    }
    std::string quoted = "'";
    for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    base += " " + quoted + "'";
  }
  struct Row {
    std::string policy;
    int prefetch, io;
    double decode, hit, mib_per_tok, wait;
  };
  std::vector<Row> rows;
  for (const char *policy : {"lru", "lfu", "hot"}) {
    for (int prefetch : {0, 1, 2}) {
      for (int io : {1, 2, 4}) {
        const std::string cmd = "'" + self + "'" + base + " --json --policy " + policy + " --prefetch " +
                                std::to_string(prefetch) + " --io-threads " + std::to_string(io) + " 2>/dev/null";
        FILE *pipe = popen(cmd.c_str(), "r");
        if (pipe == nullptr) Die("--sweep: cannot run " + self);
        std::string out;
        char buf[4096];
        size_t got;
        while ((got = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, got);
        if (pclose(pipe) != 0) Die(std::string("--sweep: the run with --policy ") + policy + " failed");
        auto j = nlohmann::json::parse(out, nullptr, false);
        if (j.is_discarded()) Die("--sweep: a run printed no JSON");
        rows.push_back(Row{policy, prefetch, io, j["decode_tok_s"].get<double>(), j["decode_hit_rate"].get<double>(),
                           j["decode_bytes_read_per_token"].get<double>() / 1048576.0,
                           j["decode_io_wait_s"].get<double>()});
        std::fprintf(stderr, "strata: sweep %zu/27\r", rows.size());
      }
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row &x, const Row &y) { return x.decode > y.decode; });
  std::printf("%-8s %9s %11s %13s %9s %13s %10s\n", "policy", "prefetch", "io threads", "decode tok/s",
              "hit rate", "MiB read/tok", "I/O wait");
  for (const Row &r : rows) {
    std::printf("%-8s %9d %11d %13.2f %8.1f%% %13.2f %9.3fs\n", r.policy.c_str(), r.prefetch, r.io, r.decode,
                100 * r.hit, r.mib_per_tok, r.wait);
  }
  const Row &best = rows.front();
  std::printf("fastest: --policy %s --prefetch %d --io-threads %d (%.2f tok/s)\n", best.policy.c_str(),
              best.prefetch, best.io, best.decode);
  return 0;
}

// Decode step times: the median, the 90th percentile (nearest rank) and the slowest.
struct StepTimes {
  double p50_ms = 0, p90_ms = 0, max_ms = 0;
};

StepTimes SummarizeSteps(const std::vector<double> &ms) {
  StepTimes t;
  if (ms.empty()) return t;
  t.p50_ms = strata::Median(ms);
  t.p90_ms = strata::NearestRank(ms, 90);
  t.max_ms = *std::max_element(ms.begin(), ms.end());
  return t;
}

std::string JsonArray(const std::vector<double> &v) {
  std::string out = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.3f", i == 0 ? "" : ",", v[i]);
    out += buf;
  }
  return out + "]";
}

int CmdBench(const Args &a) {
  if (a.sweep) return CmdSweep(a);
  const std::string model = a.model.empty() ? DemoModelPath() : a.model;
  moe_params p = ContextParams(a, model);
  Ctx ctx;
  auto t0 = std::chrono::steady_clock::now();
  if (moe_status st = moe_ctx_open(&p, &ctx.c); st != MOE_OK) DieOpening(model, st);
  auto t1 = std::chrono::steady_clock::now();
  WarnIfClamped(ctx.c, a);
  const int32_t n_vocab = moe_ctx_vocab_size(ctx.c);
  std::vector<int32_t> prompt(static_cast<size_t>(a.n_prompt));
  uint64_t x = a.seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto &t : prompt) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(n_vocab));
  }
  if (!a.prompt.empty()) {  // a text prompt routes like real use; random ids do not
    if (!HasTokenizer(ctx.c)) Die("'" + model + "' carries no tokenizer; bench --prompt needs one");
    prompt = Tokenize(ctx.c, a.prompt, false, true);
    if (prompt.empty()) Die("the prompt has no tokens");
  }
  if (!a.tokens.empty()) {
    if (!a.prompt.empty()) Die("give either --prompt or --tokens, not both");
    auto t = ParseTokenList(a.tokens);
    if (!t || t->empty()) Die("--tokens needs comma-separated non-negative integers, got '" + a.tokens + "'");
    prompt = *t;
  }
  // Sampling from a random-weight model tends to repeat a few tokens, which keeps re-selecting the
  // same experts; --decode-tokens feeds given ids one per step instead, so decode sees varied input.
  std::vector<int32_t> forced;
  if (!a.decode_tokens.empty()) {
    auto t = ParseTokenList(a.decode_tokens);
    if (!t || t->empty()) {
      Die("--decode-tokens needs comma-separated non-negative integers, got '" + a.decode_tokens + "'");
    }
    forced = *t;
  }
  // Checked here: each session below takes its own rotation of these ids modulo the vocabulary,
  // which would otherwise turn a bad id into a valid one silently.
  for (const auto *ids : {&prompt, &forced}) {
    for (int32_t t : *ids) {
      if (t >= n_vocab) Die("token id " + std::to_string(t) + " is outside the vocabulary of " + std::to_string(n_vocab));
    }
  }
  const int64_t n_decode = forced.empty() ? a.n_predict : static_cast<int64_t>(forced.size());
  // Each session gets its own prompt (a rotation of the first: same length, different routing).
  moe_session_params sp;
  moe_session_params_init(&sp);
  const size_t n_sess = static_cast<size_t>(a.sessions);
  std::vector<Sess> ss(n_sess);
  auto open_sessions = [&] {
    for (auto &s : ss) {
      moe_session_close(s.s);
      s.s = nullptr;
      if (moe_status st = moe_session_open(ctx.c, &sp, &s.s); st != MOE_OK) Die(ApiError(st));
    }
  };
  // Session i of a round takes rotation `salt + i` of the given ids (prompt and decode input).
  auto rotated = [&](int32_t t, uint64_t r) { return static_cast<int32_t>((t + 7919 * r) % static_cast<uint64_t>(n_vocab)); };
  auto feed_prompts = [&](uint64_t salt) {
    for (size_t i = 0; i < n_sess; ++i) {
      std::vector<int32_t> p_i(prompt);
      for (auto &t : p_i) t = rotated(t, salt + i);
      if (moe_status st = moe_session_feed(ss[i].s, p_i.data(), p_i.size()); st != MOE_OK) Die(ApiError(st));
    }
  };
  // Up to `steps` decode steps (fewer when a session's context fills); each step's wall time, the
  // sessions' feeding included, into `ms`. Returns the steps run.
  auto decode = [&](int64_t steps, uint64_t salt, std::vector<double> &ms) {
    int64_t n = 0;
    auto t_step = std::chrono::steady_clock::now();
    for (; n < steps; ++n) {
      for (size_t i = 0; i < ss.size(); ++i) {
        int32_t tok;
        if (!forced.empty()) {
          tok = rotated(forced[n % static_cast<int64_t>(forced.size())], salt + i);
        } else if (moe_status st = moe_session_sample(ss[i].s, &tok); st != MOE_OK) {
          Die(ApiError(st));
        }
        moe_status st = moe_session_feed(ss[i].s, &tok, 1);
        if (st == MOE_ERR_LIMIT_CONTEXT) return n;
        if (st != MOE_OK) Die(ApiError(st));
      }
      if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
      const auto now = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(now - t_step).count());
      t_step = now;
    }
    return n;
  };
  open_sessions();
  moe_ctx_wait_loads(ctx.c);  // a hotlist preload completes before the clock starts
  if (a.warmup > 0) {
    // A warm context: one round (other prompts, as a previous conversation) before the timed one,
    // in sessions closed after it. A context's one-time costs (the first steps of a batch shape,
    // graphs recorded, the CPU share timed) fall there; the timed prompt still re-plans its tier.
    feed_prompts(n_sess);
    if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
    std::vector<double> warm_ms;
    decode(a.warmup, n_sess, warm_ms);
    open_sessions();
  }
  moe_ctx_reset_stats(ctx.c);
  feed_prompts(0);
  auto t2 = std::chrono::steady_clock::now();
  if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
  auto t3 = std::chrono::steady_clock::now();
  moe_stats prefill;
  moe_stats_init(&prefill);
  moe_ctx_stats(ctx.c, &prefill);
  moe_ctx_reset_stats(ctx.c);
  std::vector<double> step_ms;  // each step's wall time, feeding the sessions included
  step_ms.reserve(static_cast<size_t>(std::max<int64_t>(n_decode, 0)));
  const int64_t n = decode(n_decode, 0, step_ms);  // decode steps; every session gets a token per step
  auto t4 = std::chrono::steady_clock::now();
  moe_stats dec;
  moe_stats_init(&dec);
  moe_ctx_stats(ctx.c, &dec);
  moe_cache_plan plan;
  moe_cache_plan_init(&plan);
  moe_ctx_plan(ctx.c, &plan);
  auto secs = [](auto u, auto v) { return std::chrono::duration<double>(v - u).count(); };
  const double pre_s = secs(t2, t3), dec_s = secs(t3, t4);
  // Hits of either tier (VRAM over a streamed RAM tier, or RAM alone) against reads from the file.
  const double uses = static_cast<double>(dec.vram_hits + dec.expert_hits + dec.expert_misses);
  const double hit_rate = uses > 0 ? (dec.vram_hits + dec.expert_hits) / uses : 1.0;
  const int64_t n_tok = n * static_cast<int64_t>(n_sess);  // decode tokens of all sessions
  const double bytes_per_tok = n_tok > 0 ? static_cast<double>(dec.bytes_read) / n_tok : 0.0;
  const size_t n_prefill = prompt.size() * n_sess;
  // The median step is the rate of a long generation: the first steps (graphs recorded, a prompt's
  // promotions still crossing the link, the CPU-share probe) weigh on a short run's average.
  const StepTimes steps = SummarizeSteps(step_ms);
  const double steady_tok_s = steps.p50_ms > 0 ? 1e3 * static_cast<double>(n_sess) / steps.p50_ms : 0.0;
  // Bytes over the host-device link per decode token: slot fills, experts the GPU read in place (or
  // staged), and the GPU's prefetches its layers did not use.
  const double wasted = dec.vram_expert_slots > 0 && dec.streaming == 0 && dec.prefetch_issued > dec.prefetch_useful
                            ? static_cast<double>(dec.prefetch_issued - dec.prefetch_useful)
                            : 0.0;
  const double link_per_tok =
      n_tok > 0 ? (static_cast<double>(dec.vram_fill_bytes) +
                   (static_cast<double>(dec.vram_zero_copy) + wasted) * static_cast<double>(dec.cache_slot_bytes)) /
                      n_tok
                : 0.0;
  if (a.json) {
    std::printf("{\"model\":\"%s\",\"sessions\":%zu,\"warmup_steps\":%lld,\"load_s\":%.3f,\"ram_budget_bytes\":%llu,\"ram_expert_slots\":%u,"
                "\"routed_experts\":%u,\"prefill_tokens\":%zu,\"prefill_tok_s\":%.3f,\"decode_tokens\":%lld,"
                "\"decode_tok_s\":%.3f,\"decode_hit_rate\":%.4f,\"decode_bytes_read_per_token\":%.0f,"
                "\"decode_io_wait_s\":%.4f,\"prefill_bytes_read\":%llu,\"prefill_hit_rate\":%.4f,"
                "\"decode_link_bytes_per_token\":%.0f,\"decode_step_ms_p50\":%.3f,\"decode_step_ms_p90\":%.3f,"
                "\"decode_step_ms_max\":%.3f,\"decode_steady_tok_s\":%.3f,\"decode_step_ms\":%s,\"stats\":%s}\n",
                model.c_str(), n_sess, static_cast<long long>(a.warmup), secs(t0, t1),
                static_cast<unsigned long long>(plan.ram_budget_bytes),
                plan.ram_expert_slots, plan.n_routed_experts, n_prefill, n_prefill / pre_s,
                static_cast<long long>(n_tok), n_tok / dec_s, hit_rate, bytes_per_tok, dec.io_wait_s,
                static_cast<unsigned long long>(prefill.bytes_read),
                prefill.vram_hits + prefill.expert_hits + prefill.expert_misses
                    ? static_cast<double>(prefill.vram_hits + prefill.expert_hits) /
                          (prefill.vram_hits + prefill.expert_hits + prefill.expert_misses)
                    : 1.0,
                link_per_tok, steps.p50_ms, steps.p90_ms, steps.max_ms, steady_tok_s, JsonArray(step_ms).c_str(),
                StatsJson(ctx.c).c_str());
  } else {
    std::printf("model            %s\n", model.c_str());
    std::printf("load             %.2f s\n", secs(t0, t1));
    std::printf("RAM expert tier  %u of %u experts (%s, %s)\n", plan.ram_expert_slots, plan.n_routed_experts,
                dec.streaming ? "streaming" : "all resident", dec.memory_locked ? "locked" : "not locked");
    std::printf("sessions         %zu\n", n_sess);
    if (a.warmup > 0) std::printf("warm-up          a round of %lld decode steps first\n", static_cast<long long>(a.warmup));
    std::printf("prefill          %zu tokens, %.1f tok/s, %.1f MiB read\n", n_prefill, n_prefill / pre_s,
                prefill.bytes_read / 1048576.0);
    std::printf("decode           %lld tokens (%lld steps), %.2f tok/s\n", static_cast<long long>(n_tok),
                static_cast<long long>(n), n_tok / dec_s);
    if (n > 0) {
      std::printf("decode steps     %.2f ms median (%.2f tok/s steady), %.2f ms p90, %.2f ms slowest\n", steps.p50_ms,
                  steady_tok_s, steps.p90_ms, steps.max_ms);
    }
    if (dec.vram_hits > 0) {
      std::printf("expert hit rate  %.1f%% (%llu VRAM hits, %llu RAM hits, %llu misses; %llu moved up, %llu down)\n",
                  100 * hit_rate, static_cast<unsigned long long>(dec.vram_hits),
                  static_cast<unsigned long long>(dec.expert_hits), static_cast<unsigned long long>(dec.expert_misses),
                  static_cast<unsigned long long>(dec.vram_promotions),
                  static_cast<unsigned long long>(dec.vram_demotions));
    } else {
      std::printf("expert hit rate  %.1f%% (%llu hits, %llu misses)\n", 100 * hit_rate,
                  static_cast<unsigned long long>(dec.expert_hits), static_cast<unsigned long long>(dec.expert_misses));
    }
    std::printf("read per token   %.2f MiB\n", bytes_per_tok / 1048576.0);
    std::printf("I/O wait         %.3f s (%.0f%% of decode)\n", dec.io_wait_s, 100 * dec.io_wait_s / dec_s);
    std::printf("prefetch         %llu issued, %llu useful, %llu skipped (precision %.0f%%)\n",
                static_cast<unsigned long long>(dec.prefetch_issued),
                static_cast<unsigned long long>(dec.prefetch_useful),
                static_cast<unsigned long long>(dec.prefetch_skipped), 100 * dec.prefetch_precision);
    if (dec.vram_device_layers > 0 || dec.vram_expert_slots > 0) {
      std::printf("VRAM tier        %u slots, %u layers routed on the GPU, %.2f MiB/token over the link "
                  "(%llu fills, %llu promotions, %llu zero-copy uses), %llu expert uses on the CPU (%u layers)\n",
                  dec.vram_expert_slots, dec.vram_device_layers, link_per_tok / 1048576.0,
                  static_cast<unsigned long long>(dec.vram_fills), static_cast<unsigned long long>(dec.vram_promotions),
                  static_cast<unsigned long long>(dec.vram_zero_copy),
                  static_cast<unsigned long long>(dec.vram_cpu_experts), dec.vram_cpu_layers);
    }
    if (dec.gpu_graph_replays > 0 || dec.gpu_graph_captures > 0) {
      std::printf("CUDA graphs      %llu decode steps recorded, %llu replayed\n",
                  static_cast<unsigned long long>(dec.gpu_graph_captures),
                  static_cast<unsigned long long>(dec.gpu_graph_replays));
    }
  }
  PrintStatsIf(a, ctx.c);
  return 0;
}

// Records how often each (layer, expert) is selected over a prompt set, hottest first, in the
// hotlist format `strata pack --hotlist` and `--hotlist` preloading read: `layer expert count`.
int CmdProfile(const Args &a) {
  if (a.model.empty()) Die("profile needs --model PATH");
  if (a.prompts.empty()) Die("profile needs --prompts FILE");
  if (a.out.empty()) Die("profile needs --out FILE");
  // Through the library's file layer: a FIFO or a device is refused, not waited on or read forever.
  absl::StatusOr<std::string> prompts = strata::format::ReadSmallFile(a.prompts, uint64_t{256} << 20);
  if (!prompts.ok()) Die(std::string(prompts.status().message()));
  std::vector<std::string> lines;
  std::istringstream in(*prompts);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  if (lines.empty()) Die("'" + a.prompts + "' holds no prompts");
  moe_params p = ContextParams(a, a.model);
  Ctx ctx;
  if (moe_status st = moe_ctx_open(&p, &ctx.c); st != MOE_OK) DieOpening(a.model, st);
  const bool has_text = HasTokenizer(ctx.c);
  for (const std::string &line : lines) {
    std::vector<int32_t> toks;
    if (auto ids = ParseTokenList(line); ids) {
      toks = *ids;
    } else if (has_text) {
      toks = Tokenize(ctx.c, line, false, true);
    } else {
      Die("'" + a.model + "' carries no tokenizer; give prompts as token ids (1,2,3)");
    }
    if (toks.empty()) continue;
    Sess s;
    if (moe_status st = moe_session_open(ctx.c, nullptr, &s.s); st != MOE_OK) Die(ApiError(st));
    if (moe_status st = moe_session_feed(s.s, toks.data(), toks.size()); st != MOE_OK) Die(ApiError(st));
    if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
    for (int64_t i = 0; i < a.n_predict; ++i) {
      int32_t tok;
      if (moe_status st = moe_session_sample(s.s, &tok); st != MOE_OK) Die(ApiError(st));
      if (moe_session_feed(s.s, &tok, 1) != MOE_OK) break;
      if (moe_status st = StepAll(ctx.c); st != MOE_OK) Die(ApiError(st));
    }
  }
  size_t n = 0;
  moe_ctx_expert_counts(ctx.c, nullptr, 0, &n);
  std::vector<uint64_t> counts(n);
  if (moe_status st = moe_ctx_expert_counts(ctx.c, counts.data(), n, &n); st != MOE_OK) Die(ApiError(st));
  const uint32_t n_exp = moe_expert_table_n_experts(moe_ctx_experts(ctx.c));
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) { return counts[x] > counts[y]; });
  std::string text = "# strata profile: layer expert count, hottest first\n";
  for (size_t i : order) {
    if (counts[i] == 0) break;
    text += std::to_string(i / n_exp) + " " + std::to_string(i % n_exp) + " " + std::to_string(counts[i]) + "\n";
  }
  WriteFileAtomically(a.out, text.data(), text.size());
  std::fprintf(stderr, "strata: profiled %zu prompts into '%s'\n", lines.size(), a.out.c_str());
  PrintStatsIf(a, ctx.c);
  return 0;
}

}  // namespace strata::cli
