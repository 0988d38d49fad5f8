// sampler_bench: host time of one sampled token over a Qwen3-sized vocabulary (151,936 logits,
// N(0, 3)), per sampler setting. Each session's token is sampled on the host after every step, so
// with many sessions this adds to the step. Usage: build/bench/sampler_bench
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "lib/runtime/sampler.h"

namespace {

constexpr int32_t kVocab = 151936;

const std::vector<float> &Logits() {
  static const std::vector<float> l = [] {
    std::mt19937 gen(1);
    std::normal_distribution<float> nd(0.f, 3.f);
    std::vector<float> v(kVocab);
    for (float &x : v) x = nd(gen);
    return v;
  }();
  return l;
}

// args: temperature x 10, top_k, top_p x 100
void BM_Sample(benchmark::State &state) {
  strata::runtime::SamplerParams sp;
  sp.temperature = static_cast<float>(state.range(0)) / 10.f;
  sp.top_k = static_cast<int32_t>(state.range(1));
  sp.top_p = static_cast<float>(state.range(2)) / 100.f;
  strata::runtime::Rng rng(7);
  const std::vector<float> &l = Logits();
  for (auto _ : state) benchmark::DoNotOptimize(strata::runtime::Sample(l.data(), kVocab, sp, rng));
}
BENCHMARK(BM_Sample)
    ->ArgNames({"temp10", "top_k", "top_p100"})
    ->Args({0, 0, 100})    // greedy
    ->Args({8, 40, 95})    // strata run's defaults at --temp 0.8
    ->Args({8, 0, 95})     // top-p alone: every id sorted
    ->Args({10, 0, 100})   // plain temperature
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
