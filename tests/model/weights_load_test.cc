// WeightStore::Load: several readers and any piece size give the bytes of the file; progress is
// reported on the loading thread and ends at the total; a failed read fails the load, naming its
// tensor, and leaves the store able to load again.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lib/format/file.h"
#include "lib/model/weights.h"
#include "lib/util/status.h"
#include "tests/model/bound_model.h"
#include "tests/model/golden_util.h"

namespace {

using namespace strata::model;
using strata::testing::kGolden;

using Bound = strata::testing::BoundModel;

Bound Bind(const std::string &path) {
  Bound b;
  strata::testing::BindModel(path, &b);
  return b;
}

// Every layer's attention and expert matrices against the file's own bytes at their tensors' offsets.
void CheckAgainstFile(const Bound &b) {
  int checked = 0;
  for (const LayerWeights &L : b.w.layers) {
    std::vector<const Matrix *> ms = {&L.wq, &L.wk, &L.wv, &L.wo};
    for (const ExpertWeights &e : L.experts) ms.insert(ms.end(), {&e.gate, &e.up, &e.down});
    for (const Matrix *m : ms) {
      if (m->tensor == nullptr) continue;
      REQUIRE(m->data != nullptr);
      std::vector<uint8_t> want(m->nbytes());
      REQUIRE(b.mf->file(m->tensor->file_index).ReadAt(m->tensor->offset + m->sub_offset, want.data(), want.size()).ok());
      REQUIRE(std::memcmp(m->data, want.data(), want.size()) == 0);
      ++checked;
    }
  }
  CHECK(checked > 10);
}

std::atomic<int> g_reads{0};
std::atomic<int> g_fail_at{-1};
std::atomic<int> g_sleep_us{0};
ssize_t Hooked(int fd, void *buf, size_t n, off_t off) {
  const int i = g_reads++;
  if (i == g_fail_at.load()) {
    errno = EIO;
    return -1;
  }
  if (g_sleep_us.load() > 0) usleep(static_cast<useconds_t>(g_sleep_us.load()));
  return ::pread(fd, buf, n, off);
}
struct HookGuard {
  HookGuard() {
    g_reads = 0;
    g_fail_at = -1;
    g_sleep_us = 0;
    strata::format::SetPreadForTesting(Hooked);
  }
  ~HookGuard() { strata::format::SetPreadForTesting(nullptr); }
};

}  // namespace

TEST_CASE("WeightStore::Load gives the file's bytes with any readers and piece size", "[weights][load]") {
  const std::string path = kGolden + "qwen3moe_f32/model-f32.gguf";
  Bound ref = Bind(path);
  WeightStore ref_store;
  LoadOptions one;
  one.n_threads = 1;
  REQUIRE(ref_store.Load(*ref.mf, ref.w, true, one).ok());
  CheckAgainstFile(ref);
  for (int threads : {2, 5, 8}) {
    for (uint64_t piece : {uint64_t{4096}, uint64_t{1000}, uint64_t{64} << 20}) {
      INFO(threads << " readers, pieces of " << piece << " bytes");
      Bound b = Bind(path);
      WeightStore store;
      LoadOptions lo;
      lo.n_threads = threads;
      lo.piece_bytes = piece;
      REQUIRE(store.Load(*b.mf, b.w, true, lo).ok());
      REQUIRE(store.resident_bytes() == ref_store.resident_bytes());
      // Tensors lie 64-byte aligned in the arena; the padding between them is never read.
      CheckAgainstFile(b);
    }
  }
}

TEST_CASE("WeightStore::Load reports progress on the loading thread, ending at the total", "[weights][load]") {
  Bound b = Bind(kGolden + "qwen3moe_f32/model-f32.gguf");
  HookGuard hook;
  g_sleep_us = 2000;  // a slow disk: the load takes long enough to report on the way
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  const std::thread::id loader = std::this_thread::get_id();
  bool other_thread = false;
  LoadOptions lo;
  lo.n_threads = 2;
  lo.piece_bytes = 2048;  // ~450 reads of 2 ms over two readers: ~0.45 s
  lo.progress = [&](uint64_t done, uint64_t total) {
    calls.emplace_back(done, total);
    other_thread |= std::this_thread::get_id() != loader;
  };
  WeightStore store;
  REQUIRE(store.Load(*b.mf, b.w, true, lo).ok());
  INFO(g_reads.load() << " reads, " << calls.size() << " reports");
  REQUIRE(calls.size() >= 3);
  CHECK_FALSE(other_thread);
  const uint64_t total = calls.back().second;
  CHECK(total > 500000);  // the f32 golden's tensors
  CHECK(calls.back().first == total);
  for (size_t i = 0; i < calls.size(); ++i) {
    CHECK(calls[i].second == total);
    if (i > 0) CHECK(calls[i].first >= calls[i - 1].first);
    if (i + 1 < calls.size()) CHECK(calls[i].first < total);
  }
  CheckAgainstFile(b);
}

TEST_CASE("WeightStore::Load fails on a failed read, naming the tensor, and can load again", "[weights][load]") {
  Bound b = Bind(kGolden + "qwen3moe_f32/model-f32.gguf");
  WeightStore store;
  for (int fail_at : {0, 7, 40}) {
    INFO("read " << fail_at << " fails");
    HookGuard hook;
    g_fail_at = fail_at;
    LoadOptions lo;
    lo.n_threads = 4;
    lo.piece_bytes = 8192;
    const absl::Status st = store.Load(*b.mf, b.w, true, lo);
    REQUIRE_FALSE(st.ok());
    CHECK(strata::StatusToMoe(st) == MOE_ERR_IO_READ);
    CHECK(std::string(st.message()).find("reading tensor '") != std::string::npos);
  }
  REQUIRE(store.Load(*b.mf, b.w).ok());
  CheckAgainstFile(b);
}
