// Do the copy engines and the CPU's cores share the host's memory bandwidth? The hybrid path reads
// cold experts from page-locked host memory two ways at once: the copy engines move some into VRAM
// (cudaMemcpyAsync) while the CPU's threads compute others. This times, for about a second each:
// the copy engines alone (256 MiB copies from one page-locked region, back to back); T threads
// alone summing another page-locked region (each its own slice, 8 bytes a load, vectorized); and
// the two at once. A sum near the larger of the two alone says they share one limit, and the
// "+CPU roofline" that adds the link's rate to the CPU's overstates what the host can give.
// Usage: host_share_bench [threads, default all hardware threads, several comma-separated].
// Prints a table; exits 0 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/probe_check.cuh"

namespace {

constexpr size_t kCopyBytes = size_t{256} << 20;  // one copy
constexpr size_t kCopyRegion = size_t{2} << 30;   // the copies cycle over it
constexpr size_t kReadRegion = size_t{4} << 30;   // the threads' slices
constexpr double kSeconds = 1.0;

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Copies until *stop; returns the bytes copied and sets *secs to the time they took.
uint64_t CopyLoop(const uint8_t *src, uint8_t *dst, cudaStream_t s, const std::atomic<bool> *stop, double *secs) {
  uint64_t bytes = 0;
  size_t at = 0;
  const Clock::time_point t0 = Clock::now();
  while (!stop->load(std::memory_order_relaxed)) {
    PROBE_CHECK(cudaMemcpyAsync(dst, src + at, kCopyBytes, cudaMemcpyHostToDevice, s));
    PROBE_CHECK(cudaStreamSynchronize(s));
    bytes += kCopyBytes;
    at = (at + kCopyBytes) % kCopyRegion;
  }
  *secs = Since(t0);
  return bytes;
}

// One reader: sums its slice over and over until *stop. The sum goes to *sink (so the loads stay).
uint64_t ReadLoop(const uint64_t *p, size_t n, const std::atomic<bool> *stop, uint64_t *sink) {
  uint64_t bytes = 0, acc = 0;
  while (!stop->load(std::memory_order_relaxed)) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i + 4 <= n; i += 4) {
      a0 += p[i];
      a1 += p[i + 1];
      a2 += p[i + 2];
      a3 += p[i + 3];
    }
    acc += a0 ^ a1 ^ a2 ^ a3;
    bytes += n * sizeof(uint64_t);
  }
  *sink = acc;
  return bytes;
}

struct Rates {
  double copy = 0, read = 0;  // GB/s
};

// Runs the copy engines (copy) and `threads` readers (threads > 0) at once for kSeconds.
Rates Run(bool copy, int threads, const uint8_t *csrc, uint8_t *cdst, const uint64_t *rbuf, cudaStream_t s) {
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  std::vector<uint64_t> rbytes(threads, 0), sinks(threads, 0);
  const size_t words = kReadRegion / sizeof(uint64_t), slice = words / std::max(threads, 1);
  const Clock::time_point t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    readers.emplace_back([&, t] { rbytes[t] = ReadLoop(rbuf + t * slice, slice, &stop, &sinks[t]); });
  }
  double copy_secs = 0;
  uint64_t cbytes = 0;
  std::thread copier;
  if (copy) copier = std::thread([&] { cbytes = CopyLoop(csrc, cdst, s, &stop, &copy_secs); });
  std::this_thread::sleep_for(std::chrono::duration<double>(kSeconds));
  stop.store(true);
  if (copy) copier.join();
  for (auto &r : readers) r.join();
  const double secs = Since(t0);
  Rates r;
  if (copy) r.copy = static_cast<double>(cbytes) / copy_secs / 1e9;
  uint64_t total = 0;
  for (uint64_t b : rbytes) total += b;
  r.read = static_cast<double>(total) / secs / 1e9;  // a slice under way at the stop is not counted
  return r;
}

}  // namespace

int main(int argc, char **argv) {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::printf("host_share_bench: no CUDA device\n");
    return 0;
  }
  std::vector<int> thread_counts;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (argc > 1) {
    std::string list = argv[1];
    for (size_t at = 0; at <= list.size();) {
      const size_t comma = std::min(list.find(',', at), list.size());
      const int t = std::atoi(list.substr(at, comma - at).c_str());
      if (t <= 0 || t > 1024) {
        std::fprintf(stderr, "host_share_bench: thread counts are 1-1024, comma-separated (got '%s')\n", argv[1]);
        return 2;
      }
      thread_counts.push_back(t);
      at = comma + 1;
    }
  } else {
    thread_counts.push_back(hw);
  }
  uint8_t *csrc = nullptr, *cdst = nullptr;
  uint64_t *rbuf = nullptr;
  PROBE_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&csrc), kCopyRegion, cudaHostAllocDefault));
  PROBE_CHECK(cudaHostAlloc(reinterpret_cast<void **>(&rbuf), kReadRegion, cudaHostAllocDefault));
  PROBE_CHECK(cudaMalloc(reinterpret_cast<void **>(&cdst), kCopyBytes));
  // Fresh bytes, every page touched before timing.
  std::memset(csrc, 0x5a, kCopyRegion);
  for (size_t i = 0; i < kReadRegion / sizeof(uint64_t); ++i) rbuf[i] = i * 0x9e3779b97f4a7c15ull;
  cudaStream_t s;
  PROBE_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  (void)Run(true, 0, csrc, cdst, rbuf, s);  // warm-up
  const Rates link = Run(true, 0, csrc, cdst, rbuf, s);
  std::printf("host memory shared by the copy engines and %d hardware threads' reads (GB/s, ~%.0f s each)\n\n", hw,
              kSeconds);
  std::printf("| threads | copy engines alone | threads alone | both: copy engines | both: threads | both: sum | sum / larger alone |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int t : thread_counts) {
    const Rates cpu = Run(false, t, csrc, cdst, rbuf, s);
    const Rates both = Run(true, t, csrc, cdst, rbuf, s);
    const double sum = both.copy + both.read;
    std::printf("| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", t, link.copy, cpu.read, both.copy, both.read,
                sum, sum / std::max(link.copy, cpu.read));
  }
  PROBE_CHECK(cudaStreamDestroy(s));
  PROBE_CHECK(cudaFree(cdst));
  PROBE_CHECK(cudaFreeHost(rbuf));
  PROBE_CHECK(cudaFreeHost(csrc));
  return 0;
}
