// CPU GEMV (batch 1) and GEMM (batch 8) through CpuBackend::MatMul for every codec and both matmul
// modes, over weight matrices of >= 256 MiB (far beyond the LLC), against the memory read bandwidth
// this same run measures first. "roofline" = weight bytes/s divided by that bandwidth.
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels/kernels.h"
#include "lib/quant/codec.h"
#include "lib/util/thread_pool.h"

namespace {

using strata::cpu::CpuBackend;
using strata::cpu::MatMulMode;
using strata::quant::Codec;
using strata::quant::TypeId;

constexpr int64_t kBwBytes = int64_t{1} << 30;       // bandwidth probe buffer
constexpr int64_t kMinWeightBytes = int64_t{256} << 20;
constexpr int64_t kCols = 4096;
constexpr int kMaxThreads = 2;

struct AlignedFree {
  void operator()(void *p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, AlignedFree>;

Buffer Allocate(int64_t bytes) {
  auto *p = static_cast<uint8_t *>(std::aligned_alloc(4096, static_cast<size_t>((bytes + 4095) / 4096 * 4096)));
  return Buffer(p);
}

// ---- memory read bandwidth ----

__attribute__((target("avx2"))) uint64_t SumAvx2(const uint8_t *p, int64_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i *>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i *>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i *>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i *>(p + i + 96)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i *>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t SumPortable(const uint8_t *p, int64_t bytes) {
  uint64_t a[4] = {};
  for (int64_t i = 0; i < bytes; i += 32) {
    uint64_t v[4];
    std::memcpy(v, p + i, 32);
    for (int k = 0; k < 4; ++k) a[k] += v[k];
  }
  return a[0] + a[1] + a[2] + a[3];
}

uint64_t Sum(const uint8_t *p, int64_t bytes) {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2 ? SumAvx2(p, bytes) : SumPortable(p, bytes);
}

uint8_t *BwBuffer() {
  static Buffer buf = [] {
    Buffer b = Allocate(kBwBytes);
    std::memset(b.get(), 1, static_cast<size_t>(kBwBytes));  // fault every page in
    return b;
  }();
  return buf.get();
}

// Reads the whole buffer with n threads, each its own contiguous share; returns bytes/s.
double ReadOnce(int n_threads) {
  const uint8_t *p = BwBuffer();
  const int64_t share = kBwBytes / n_threads;
  std::vector<uint64_t> sink(n_threads);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> th;
  for (int i = 1; i < n_threads; ++i) th.emplace_back([&, i] { sink[i] = Sum(p + i * share, share); });
  sink[0] = Sum(p, share);
  for (auto &t : th) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(sink.data());
  return static_cast<double>(kBwBytes) / s;
}

// Best of several passes, measured once per thread count before the GEMV runs.
double MeasuredBandwidth(int n_threads) {
  static std::map<int, double> bw;
  double &b = bw[n_threads];
  if (b == 0) {
    for (int rep = 0; rep < 6; ++rep) b = std::max(b, ReadOnce(n_threads));
  }
  return b;
}

// Thread counts of the ExpertsFfn rows and their bandwidth probes: 1 and 2, or the list in
// STRATA_BENCH_EXPERTS_THREADS ("1,2,8,14": the CPU share of the hybrid GPU placement runs on
// all cores but two of a larger host).
std::vector<int> ExpertsThreads() {
  std::vector<int> out;
  if (const char *e = std::getenv("STRATA_BENCH_EXPERTS_THREADS"); e != nullptr) {
    for (const char *p = e; *p != '\0';) {
      char *end = nullptr;
      const long v = std::strtol(p, &end, 10);
      if (end == p) break;
      if (v >= 1 && v <= 256) out.push_back(static_cast<int>(v));
      p = *end == ',' ? end + 1 : end;
    }
  }
  if (out.empty()) out = {1, 2};
  return out;
}

// Reported alongside the GEMV rows; "best_GBps" is the figure the roofline counters divide by.
void BM_MemRead(benchmark::State &state) {
  const int n_threads = static_cast<int>(state.range(0));
  BwBuffer();
  for (auto _ : state) {
    const double bw = ReadOnce(n_threads);
    benchmark::DoNotOptimize(bw);
  }
  state.SetBytesProcessed(state.iterations() * kBwBytes);
  state.counters["best_GBps"] = MeasuredBandwidth(n_threads) / 1e9;
}

// ---- the cores' clock under load ----

// A chain of n dependent adds (one cycle each on x86 cores) on a general register (zmm = false) or
// on a zmm register (AVX-512, where the host has it); returns the adds a nanosecond, the core's GHz.
__attribute__((target("avx512f"))) double ClockZmm(int64_t n) {
  __m512i v = _mm512_set1_epi32(1);
  const __m512i one = v;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; i += 4) {
    asm volatile("vpaddd %1, %0, %0\n\tvpaddd %1, %0, %0\n\tvpaddd %1, %0, %0\n\tvpaddd %1, %0, %0"
                 : "+v"(v)
                 : "v"(one));
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(v);
  return static_cast<double>(n) / ns;
}

// Eight independent chains of zmm additions: what bounds them is the vector ports' throughput, which
// two hardware threads of one core would share. Returns additions a nanosecond.
__attribute__((target("avx512f"))) double ThroughputZmm(int64_t n) {
  __m512i v0 = _mm512_set1_epi32(1), v1 = v0, v2 = v0, v3 = v0, v4 = v0, v5 = v0, v6 = v0, v7 = v0;
  const __m512i one = v0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; i += 8) {
    asm volatile(
        "vpaddd %8, %0, %0\n\tvpaddd %8, %1, %1\n\tvpaddd %8, %2, %2\n\tvpaddd %8, %3, %3\n\t"
        "vpaddd %8, %4, %4\n\tvpaddd %8, %5, %5\n\tvpaddd %8, %6, %6\n\tvpaddd %8, %7, %7"
        : "+v"(v0), "+v"(v1), "+v"(v2), "+v"(v3), "+v"(v4), "+v"(v5), "+v"(v6), "+v"(v7)
        : "v"(one));
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(v0);
  benchmark::DoNotOptimize(v7);
  return static_cast<double>(n) / ns;
}

double ClockGpr(int64_t n) {
  uint64_t x = 0;
  const uint64_t one = 1;  // a register operand: some cores fold additions of immediates at rename
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; i += 4) {
    asm volatile("add %1, %0\n\tadd %1, %0\n\tadd %1, %0\n\tadd %1, %0" : "+r"(x) : "r"(one));
  }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(x);
  return static_cast<double>(n) / ns;
}

// args: threads, mode (0: one chain of general-register adds, 1: one chain of zmm adds, 2: eight
// independent zmm chains). Every thread runs its own at once; "GHz" is their mean rate in adds a
// nanosecond: for a chain, the clock (lower with more cores busy, if it were); for mode 2, the vector
// ports' rate a thread (lower if threads shared cores).
void BM_CoreClock(benchmark::State &state) {
  const int n_threads = static_cast<int>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  const bool zmm = mode != 0;
  if (zmm && !__builtin_cpu_supports("avx512f")) {
    state.SkipWithError("no AVX-512");
    return;
  }
  constexpr int64_t kAdds = int64_t{1} << 28;
  double ghz = 0;
  for (auto _ : state) {
    std::vector<double> rate(static_cast<size_t>(n_threads));
    std::vector<std::thread> th;
    for (int i = 0; i < n_threads; ++i) {
      th.emplace_back([&, i] {
        rate[i] = mode == 2 ? ThroughputZmm(4 * kAdds) : zmm ? ClockZmm(kAdds) : ClockGpr(kAdds);
      });
    }
    for (auto &t : th) t.join();
    ghz = 0;
    for (double r : rate) ghz += r / n_threads;
  }
  state.counters["GHz"] = ghz;
}

// ---- weights ----

void PutHalf(uint8_t *p, float f) {
  const uint16_t h = strata::quant::FloatToHalf(f);
  std::memcpy(p, &h, 2);
}

// One random row with sane scales (as tests/cpu/kernels_test.cc builds them).
std::vector<uint8_t> RandomRow(const Codec &c, std::mt19937 &rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t nb = kCols / c.block_elems;
  std::vector<uint8_t> row(static_cast<size_t>(nb * c.block_bytes));
  if (c.block_elems == 1) {
    std::vector<float> f(kCols);
    for (auto &v : f) v = normal(rng) * 0.02f;
    c.quantize(f.data(), row.data(), kCols);
    return row;
  }
  for (auto &b : row) b = static_cast<uint8_t>(byte(rng));
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t *p = row.data() + b * c.block_bytes;
    switch (c.id) {
      case TypeId::kQ4_1:
      case TypeId::kQ5_1: PutHalf(p, scale(rng)); PutHalf(p + 2, -scale(rng) * 8); break;
      case TypeId::kQ2_K: PutHalf(p + 80, scale(rng)); PutHalf(p + 82, scale(rng)); break;
      case TypeId::kQ3_K: PutHalf(p + 108, scale(rng)); break;
      case TypeId::kQ4_K:
      case TypeId::kQ5_K: PutHalf(p, scale(rng) * 0.1f); PutHalf(p + 2, scale(rng) * 0.1f); break;
      case TypeId::kQ6_K: PutHalf(p + 208, scale(rng) * 0.1f); break;
      case TypeId::kMXFP4: p[0] = static_cast<uint8_t>(118 + byte(rng) % 12); break;
      case TypeId::kIQ1_M: strata::quant::SetIQ1_MScaleBits(p, strata::quant::FloatToHalf(scale(rng) * 0.01f)); break;
      default: PutHalf(p, scale(rng)); break;
    }
  }
  return row;
}

// The weight matrix of one codec: kCols columns and enough rows for >= kMinWeightBytes. Only the
// most recent codec's matrix is kept (benchmarks run grouped by codec), bounding memory.
struct Weights {
  TypeId id;
  Buffer data;
  strata::model::Matrix m;
};

const strata::model::Matrix &WeightsFor(TypeId id) {
  static std::unique_ptr<Weights> cur;
  if (cur && cur->id == id) return cur->m;
  cur.reset();
  const Codec &c = *strata::quant::FindCodec(id);
  auto w = std::make_unique<Weights>();
  w->id = id;
  const int64_t row_bytes = kCols / c.block_elems * c.block_bytes;
  const int64_t rows = (kMinWeightBytes + row_bytes - 1) / row_bytes / 64 * 64 + 64;
  w->data = Allocate(rows * row_bytes);
  std::mt19937 rng(static_cast<uint32_t>(id) + 1);
  std::vector<std::vector<uint8_t>> distinct;
  for (int i = 0; i < 64; ++i) distinct.push_back(RandomRow(c, rng));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(w->data.get() + r * row_bytes, distinct[r % 64].data(), row_bytes);
  w->m.name = std::string(c.name);
  w->m.codec = &c;
  w->m.rows = rows;
  w->m.cols = kCols;
  w->m.row_bytes = static_cast<uint64_t>(row_bytes);
  w->m.data = w->data.get();
  cur = std::move(w);
  return cur->m;
}

// args: type id, mode (0 exact, 1 q8), tokens, threads
void BM_MatMul(benchmark::State &state) {
  const auto id = static_cast<TypeId>(state.range(0));
  const auto mode = state.range(1) ? MatMulMode::kQ8Activations : MatMulMode::kExact;
  const int64_t n_tok = state.range(2);
  const int n_threads = static_cast<int>(state.range(3));
  const double bw = MeasuredBandwidth(n_threads);
  const strata::model::Matrix &m = WeightsFor(id);
  CpuBackend backend(n_threads, mode);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_tok * kCols)), y(static_cast<size_t>(n_tok * m.rows));
  for (auto &v : x) v = normal(rng);
  backend.MatMul(m, x.data(), n_tok, y.data());  // warm the pool
  for (auto _ : state) {
    backend.MatMul(m, x.data(), n_tok, y.data());
    benchmark::ClobberMemory();
  }
  const int64_t bytes = static_cast<int64_t>(m.nbytes());
  state.SetBytesProcessed(state.iterations() * bytes);
  // Weight bytes/s over the read bandwidth measured with the same number of threads (a rate
  // counter, so Google Benchmark prints it with a "/s" suffix; it is a plain fraction).
  state.counters["roofline"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * bytes / bw, benchmark::Counter::kIsRate);
  state.counters["bw_GBps"] = bw / 1e9;
  state.SetLabel(std::string(m.codec->name) + (mode == MatMulMode::kExact ? " exact" : " q8") +
                 " b" + std::to_string(n_tok) + " t" + std::to_string(n_threads));
}

// ---- the routed experts of one token: what the hybrid placement's CPU share runs per layer ----

// A pool of Q4_K experts (n_embd 2048, n_ff hidden units) of >= 1 GiB: each call reads experts
// nobody read since they left the LLC (300 MiB on the H200's host).
struct ExpertPool {
  int64_t n_ff = 0;
  Buffer data;
  std::vector<strata::model::ExpertWeights> experts;
};

const ExpertPool &ExpertsFor(int64_t n_ff) {
  static std::unique_ptr<ExpertPool> cur;
  if (cur && cur->n_ff == n_ff) return *cur;
  cur.reset();
  constexpr int64_t kEmbd = 2048;
  const Codec &c = *strata::quant::FindCodec(TypeId::kQ4_K);
  const int64_t in_row = kEmbd / c.block_elems * c.block_bytes, out_row = n_ff / c.block_elems * c.block_bytes;
  const int64_t expert_bytes = 2 * n_ff * in_row + kEmbd * out_row;
  constexpr int64_t kPoolBytes = int64_t{1} << 30;
  const int64_t n = (kPoolBytes + expert_bytes - 1) / expert_bytes + 1;
  auto pool = std::make_unique<ExpertPool>();
  pool->n_ff = n_ff;
  pool->data = Allocate(n * expert_bytes);
  std::mt19937 rng(11);
  std::vector<std::vector<uint8_t>> rows_in, rows_out;
  for (int i = 0; i < 64; ++i) {
    std::vector<uint8_t> a, b;
    for (int64_t k = 0; k < kEmbd / c.block_elems; ++k) {
      const auto blk = RandomRow(c, rng);
      a.insert(a.end(), blk.begin(), blk.begin() + c.block_bytes);
    }
    for (int64_t k = 0; k < n_ff / c.block_elems; ++k) {
      const auto blk = RandomRow(c, rng);
      b.insert(b.end(), blk.begin(), blk.begin() + c.block_bytes);
    }
    rows_in.push_back(std::move(a));
    rows_out.push_back(std::move(b));
  }
  auto matrix = [&](uint8_t *at, int64_t rows, int64_t cols, int64_t rb, bool in) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(at + r * rb, (in ? rows_in : rows_out)[r % 64].data(), rb);
    strata::model::Matrix m;
    m.name = "expert";
    m.codec = &c;
    m.rows = rows;
    m.cols = cols;
    m.row_bytes = static_cast<uint64_t>(rb);
    m.data = at;
    return m;
  };
  for (int64_t e = 0; e < n; ++e) {
    uint8_t *at = pool->data.get() + e * expert_bytes;
    strata::model::ExpertWeights w;
    w.gate = matrix(at, n_ff, kEmbd, in_row, true);
    w.up = matrix(at + n_ff * in_row, n_ff, kEmbd, in_row, true);
    w.down = matrix(at + 2 * n_ff * in_row, kEmbd, n_ff, out_row, false);
    pool->experts.push_back(w);
  }
  cur = std::move(pool);
  return *cur;
}

// args: n_ff, experts a call, threads, hot. One token each (q8 mode, as the CPU share runs); us_at_bw
// is a call's bytes at the measured read bandwidth: the time beyond it is the call's fixed cost (the
// pool's two passes, quantizing the input) and any compute the memory does not hide. hot = 1 runs the
// same experts every call (they stay in the LLC): what the threads take with DRAM out of the way.
void BM_ExpertsFfn(benchmark::State &state) {
  const int64_t n_ff = state.range(0);
  const int n_exp = static_cast<int>(state.range(1));
  const int n_threads = static_cast<int>(state.range(2));
  const bool hot = state.range(3) != 0;
  const double bw = MeasuredBandwidth(n_threads);
  const ExpertPool &pool = ExpertsFor(n_ff);
  CpuBackend backend(n_threads, MatMulMode::kQ8Activations);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n_exp * 2048)), y(x.size());
  for (auto &v : x) v = normal(rng);
  std::vector<int64_t> first(n_exp + 1);
  for (int i = 0; i <= n_exp; ++i) first[i] = i;
  std::vector<const strata::model::ExpertWeights *> ew(n_exp);
  size_t next = 0;
  auto pick = [&] {
    for (int i = 0; i < n_exp; ++i) ew[i] = &pool.experts[hot ? i : next++ % pool.experts.size()];
  };
  pick();
  backend.ExpertsFfn(ew.data(), n_exp, first.data(), x.data(), y.data(), 2048);  // warm the pool
  uint64_t bytes = 0;
  for (auto _ : state) {
    pick();
    backend.ExpertsFfn(ew.data(), n_exp, first.data(), x.data(), y.data(), 2048);
    benchmark::ClobberMemory();
    for (const auto *e : ew) bytes += e->nbytes();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["bytes_per_call"] = static_cast<double>(bytes) / std::max<int64_t>(1, state.iterations());
  state.counters["us_at_bw"] = 1e6 * static_cast<double>(bytes) / std::max<int64_t>(1, state.iterations()) / bw;
  state.SetLabel("Q4_K n_ff " + std::to_string(n_ff) + " x" + std::to_string(n_exp) + " t" + std::to_string(n_threads) +
                 (hot ? " hot" : ""));
}

// args: n_ff, experts a call, threads, hot. The bytes of BM_ExpertsFfn's call read by the same kind
// of pool in the same two passes (the experts' gate and up rows, then their down rows, in chunks
// of rows), summed instead of multiplied: what the job's reads and barriers cost without its
// arithmetic.
void BM_PoolRead(benchmark::State &state) {
  const int64_t n_ff = state.range(0);
  const int n_exp = static_cast<int>(state.range(1));
  const int n_threads = static_cast<int>(state.range(2));
  const bool hot = state.range(3) != 0;
  const ExpertPool &pool = ExpertsFor(n_ff);
  strata::ThreadPool threads(n_threads, 10 * strata::ThreadPool::kSpinIterations);
  std::vector<const strata::model::ExpertWeights *> ew(n_exp);
  size_t next = 0;
  std::vector<uint64_t> sink(static_cast<size_t>(8 * n_threads));
  auto read = [&](bool gate_up) {
    const strata::model::Matrix &m0 = gate_up ? ew[0]->gate : ew[0]->down;
    const int64_t rows = gate_up ? 2 * m0.rows : m0.rows, rb = static_cast<int64_t>(m0.row_bytes);
    threads.ParallelFor(n_exp * rows, std::max<int64_t>(1, 16384 / m0.cols), [&](int64_t b, int64_t e, int t) {
      while (b < e) {  // gate and up lie back to back in an expert, so a chunk's rows of one expert do too
        const int64_t x = b / rows, r = b % rows, k = std::min(e - b, rows - r);
        const strata::model::Matrix &m = gate_up ? ew[x]->gate : ew[x]->down;
        sink[8 * t] += Sum(m.data + r * rb, k * rb / 128 * 128);
        b += k;
      }
    });
  };
  uint64_t bytes = 0;
  for (auto _ : state) {
    for (int i = 0; i < n_exp; ++i) ew[i] = &pool.experts[hot ? i : next++ % pool.experts.size()];
    read(true);
    read(false);
    for (const auto *e : ew) bytes += e->nbytes();
  }
  benchmark::DoNotOptimize(sink.data());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}

// args: n_ff, experts a call, threads, hot. BM_ExpertsFfn's two passes of row dots (the gate and up
// rows, then the down rows; one token, q8 mode, the same kernels and chunks) without its serial
// parts, each thread timing its chunks: "busy" is the threads' summed time in chunks over threads x
// the passes' time, "start_us" when a thread took its first chunk of a pass (mean), "ns_block" a
// thread's time a 256-weight block while busy. Low busy with a late start: the pool; high busy with
// slow blocks: the cores.
void BM_PoolDot(benchmark::State &state) {
  using Clock = std::chrono::steady_clock;
  namespace kn = strata::cpu::kernels;
  const int64_t n_ff = state.range(0);
  const int n_exp = static_cast<int>(state.range(1));
  const int n_threads = static_cast<int>(state.range(2));
  const bool hot = state.range(3) != 0;
  const ExpertPool &pool = ExpertsFor(n_ff);
  const Codec &codec = *pool.experts[0].gate.codec;
  const kn::RowKernels k = kn::FindRowKernels(codec, kn::BestIsa());
  strata::ThreadPool threads(n_threads, 10 * strata::ThreadPool::kSpinIterations);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(2048), hx(static_cast<size_t>(n_ff));
  for (auto &v : x) v = normal(rng);
  for (auto &v : hx) v = normal(rng);
  std::vector<uint8_t> xq(static_cast<size_t>(kn::ActRowBytes(k.act, 2048))),
      hq(static_cast<size_t>(kn::ActRowBytes(k.act, n_ff)));
  kn::QuantizeActivations(k.act, x.data(), 2048, xq.data());
  kn::QuantizeActivations(k.act, hx.data(), n_ff, hq.data());
  std::vector<float> y(static_cast<size_t>(n_exp * std::max<int64_t>(2 * n_ff, 2048)));
  std::vector<const strata::model::ExpertWeights *> ew(n_exp);
  struct alignas(64) PerThread {
    double busy_ns = 0, first_ns = -1;
    int64_t blocks = 0;
  };
  std::vector<PerThread> per(static_cast<size_t>(n_threads));
  double busy = 0, wall = 0, start = 0;
  int64_t starts = 0, blocks = 0;
  size_t next = 0;
  auto pass = [&](bool gate_up) {
    const strata::model::Matrix &m0 = gate_up ? ew[0]->gate : ew[0]->down;
    const int64_t rows = gate_up ? 2 * m0.rows : m0.rows, nb = m0.cols / 256;
    for (auto &p : per) p = PerThread{};
    const auto t0 = Clock::now();
    threads.ParallelFor(n_exp * rows, std::max<int64_t>(1, 16384 / m0.cols), [&](int64_t b, int64_t e, int t) {
      const auto c0 = Clock::now();
      for (int64_t i = b; i < e; ++i) {
        const int64_t xi = i / rows, r = i % rows;
        const strata::model::Matrix &m = !gate_up ? ew[xi]->down : r < m0.rows ? ew[xi]->gate : ew[xi]->up;
        k.dot_q8(codec, m.row(gate_up ? r % m0.rows : r), gate_up ? xq.data() : hq.data(), 0, 1, m.cols, &y[i]);
      }
      const auto c1 = Clock::now();
      PerThread &p = per[t];
      if (p.first_ns < 0) p.first_ns = std::chrono::duration<double, std::nano>(c0 - t0).count();
      p.busy_ns += std::chrono::duration<double, std::nano>(c1 - c0).count();
      p.blocks += (e - b) * nb;
    });
    const double w = std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
    wall += w;
    for (const auto &p : per) {
      busy += p.busy_ns;
      blocks += p.blocks;
      if (p.first_ns >= 0) {
        start += p.first_ns;
        ++starts;
      }
    }
  };
  for (auto _ : state) {
    for (int i = 0; i < n_exp; ++i) ew[i] = &pool.experts[hot ? i : next++ % pool.experts.size()];
    pass(true);
    pass(false);
  }
  benchmark::DoNotOptimize(y.data());
  state.counters["busy"] = busy / (static_cast<double>(n_threads) * wall);
  state.counters["start_us"] = starts > 0 ? start / static_cast<double>(starts) / 1e3 : 0;
  state.counters["ns_block"] = blocks > 0 ? busy / static_cast<double>(blocks) : 0;
}

// args: elements, format (0: 256-element blocks, 1: 32). One token's activations quantized for the
// q8 mode: serial in a CPU expert job (its input, then each expert's SwiGLU output).
void BM_Quantize(benchmark::State &state) {
  namespace kn = strata::cpu::kernels;
  const int64_t n = state.range(0);
  const kn::ActFormat f = state.range(1) == 0 ? kn::ActFormat::kQ8Block256 : kn::ActFormat::kQ8Block32;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto &v : x) v = normal(rng);
  std::vector<uint8_t> q(static_cast<size_t>(kn::ActRowBytes(f, n)));
  for (auto _ : state) {
    kn::QuantizeActivations(f, x.data(), n, q.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * n);
}

void RegisterAll() {
  std::vector<int> mem_threads = ExpertsThreads();
  for (int th = 1; th <= kMaxThreads; ++th) mem_threads.push_back(th);
  std::sort(mem_threads.begin(), mem_threads.end());
  mem_threads.erase(std::unique(mem_threads.begin(), mem_threads.end()), mem_threads.end());
  auto *mem = benchmark::RegisterBenchmark("MemRead", BM_MemRead);
  for (int th : mem_threads) mem->Arg(th);
  mem->UseRealTime()->Unit(benchmark::kMillisecond);
  auto *clock = benchmark::RegisterBenchmark("CoreClock", BM_CoreClock);
  for (int mode = 0; mode < 3; ++mode) {
    for (int th : mem_threads) clock->Args({th, mode});
  }
  clock->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(3);
  benchmark::RegisterBenchmark("Quantize", BM_Quantize)
      ->Args({2048, 0})
      ->Args({768, 0})
      ->Args({2048, 1})
      ->Unit(benchmark::kMicrosecond);
  for (int hot = 0; hot < 2; ++hot) {
    for (int64_t n_ff : {256, 768}) {
      for (int n : {1, 2, 4}) {
        for (int th : ExpertsThreads()) {
          const std::string args = "/ff" + std::to_string(n_ff) + "/x" + std::to_string(n) + "/t" + std::to_string(th);
          const std::pair<const char *, void (*)(benchmark::State &)> kinds[] = {
              {hot ? "PoolReadHot" : "PoolRead", BM_PoolRead},
              {hot ? "PoolDotHot" : "PoolDot", BM_PoolDot},
              {hot ? "ExpertsFfnHot" : "ExpertsFfn", BM_ExpertsFfn}};
          for (const auto &[kind, fn] : kinds) {
            benchmark::RegisterBenchmark((kind + args).c_str(), fn)
                ->Args({n_ff, n, th, hot})
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond)
                ->MinTime(0.3);
          }
        }
      }
    }
  }
  const TypeId kTypes[] = {TypeId::kQ8_0, TypeId::kQ4_K, TypeId::kQ6_K, TypeId::kQ4_0, TypeId::kF16,
                           TypeId::kBF16, TypeId::kF32, TypeId::kQ5_K, TypeId::kQ2_K, TypeId::kQ3_K,
                           TypeId::kQ5_0, TypeId::kQ5_1, TypeId::kQ4_1, TypeId::kIQ4_NL,
                           TypeId::kIQ4_XS, TypeId::kMXFP4, TypeId::kIQ2_XXS, TypeId::kIQ2_XS,
                           TypeId::kIQ2_S, TypeId::kIQ3_XXS, TypeId::kIQ3_S, TypeId::kIQ1_S, TypeId::kIQ1_M};
  for (TypeId id : kTypes) {
    const Codec &c = *strata::quant::FindCodec(id);
    const bool float_weights = c.block_elems == 1;  // q8 mode runs the exact kernels for these
    for (int mode = 0; mode < (float_weights ? 1 : 2); ++mode) {
      for (int tok : {1, 8}) {
        for (int th = 1; th <= kMaxThreads; ++th) {
          const std::string name = std::string("MatMul/") + std::string(c.name) + (mode ? "/q8" : "/exact") +
                                   "/b" + std::to_string(tok) + "/t" + std::to_string(th);
          benchmark::RegisterBenchmark(name.c_str(), BM_MatMul)
              ->Args({static_cast<int64_t>(id), mode, tok, th})
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond)
              ->MinTime(0.3);
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char **argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  // The bandwidth every roofline counter divides by, measured before any GEMV touches memory.
  for (int t = 1; t <= kMaxThreads; ++t) MeasuredBandwidth(t);
  RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
