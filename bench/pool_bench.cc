// ParallelFor under oversubscription: a decode-sized job (~1 ms of arithmetic split over the pool)
// called many times while `hogs` threads keep cores busy, as a game's own threads or the GPU
// driver's spinning threads do beside Strata's pool. Prints the call time's median, 90th and 99th
// percentile and mean, against the job's time on one thread divided by the cores left, and when the
// threads took their first chunk of a call (the mean over calls of the first, the median and the
// last thread to arrive: a pool whose workers line up behind one another shows a staircase here).
// Usage: pool_bench [pool threads, default all cores] [hog threads, default 1] [calls, default 2000]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "lib/util/thread_pool.h"

namespace {

using Clock = std::chrono::steady_clock;

// ~0.25 us of dependent arithmetic, kept from being folded away.
float Unit(int64_t i) {
  float x = static_cast<float>(i & 1023) * 1e-3f;
  for (int k = 0; k < 96; ++k) x = x * 0.999f + 0.5f;
  return x;
}

}  // namespace

int main(int argc, char **argv) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = argc > 1 ? std::max(1, std::atoi(argv[1])) : cores;
  const int hogs = argc > 2 ? std::max(0, std::atoi(argv[2])) : 1;
  const int calls = argc > 3 ? std::max(10, std::atoi(argv[3])) : 2000;
  constexpr int64_t kUnits = 4096;
  std::atomic<bool> stop{false};
  std::vector<std::thread> hog;
  for (int i = 0; i < hogs; ++i) {
    hog.emplace_back([&] {
      volatile float x = 1;
      while (!stop.load(std::memory_order_relaxed)) x = x * 0.999f + 0.5f;
    });
  }
  std::vector<float> out(kUnits);
  // Each thread's first chunk of the call, in us from the call's start (slot t of `first`, set by
  // thread t alone; padded so the threads do not share a line).
  constexpr int kPad = 16;
  std::vector<double> first(static_cast<size_t>(kPad * std::max(threads, 1)));
  Clock::time_point call_start;
  bool timed = false;
  auto job = [&](int64_t b, int64_t e, int t) {
    if (timed && first[kPad * t] < 0) {
      first[kPad * t] = std::chrono::duration<double, std::micro>(Clock::now() - call_start).count();
    }
    for (int64_t i = b; i < e; ++i) out[i] = Unit(i);
  };
  const auto t0 = Clock::now();
  job(0, kUnits, 0);
  const double one_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  strata::ThreadPool pool(threads, 10 * strata::ThreadPool::kSpinIterations);
  std::vector<double> us, arrive(3, 0.0);  // first, median and last thread's first chunk, summed
  us.reserve(calls);
  timed = true;
  for (int c = 0; c < calls; ++c) {
    for (int t = 0; t < threads; ++t) first[kPad * t] = -1;
    call_start = Clock::now();
    pool.ParallelFor(kUnits, 16, job);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - call_start).count());
    std::vector<double> f;
    for (int t = 0; t < threads; ++t) {
      if (first[kPad * t] >= 0) f.push_back(first[kPad * t]);
    }
    std::sort(f.begin(), f.end());
    arrive[0] += f.front();
    arrive[1] += f[f.size() / 2];
    arrive[2] += f.back();
  }
  stop = true;
  for (auto &t : hog) t.join();
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (double u : us) sum += u;
  const int free_cores = std::max(1, std::min(threads, cores - hogs));
  std::printf("%d cores, pool %d, hogs %d: job %.0f us on one thread, %.0f us over %d free cores\n", cores, threads,
              hogs, one_us, one_us / free_cores, free_cores);
  std::printf("call us: median %.0f, p90 %.0f, p99 %.0f, mean %.0f (checksum %.3f)\n", us[us.size() / 2],
              us[us.size() * 9 / 10], us[us.size() * 99 / 100], sum / us.size(), out[kUnits / 2]);
  std::printf("threads' first chunk, us into the call: first %.1f, median %.1f, last %.1f (mean over calls)\n",
              arrive[0] / calls, arrive[1] / calls, arrive[2] / calls);
  return 0;
}
