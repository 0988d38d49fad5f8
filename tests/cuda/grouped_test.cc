// Grouped experts against the path they replace: GroupByExpert against the host grouping of the
// forward pass's FeedForward, and GroupedSwiGlu + GroupedGemv against GemvSwiGlu + Gemv run expert
// by expert on the same groups, bit for bit (memcmp), with weights in VRAM and in mapped host
// memory. Fresh random inputs every run (the seed is reported); outputs poisoned with NaN first.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>

#include "backends/cuda/cold_copier.h"
#include "backends/cuda/cuda_status.h"
#include "lib/model/routing.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/util/tunables_test_util.h"

using strata::tunables::testing::SetKnob;
using strata::tunables::testing::UnsetKnob;

namespace strata::cuda {
namespace {

using quant::TypeId;
using test::Download;
using test::HaveGpu;
using test::Poisoned;
using test::RandomFloats;
using test::RandomMatrix;
using test::Upload;

// The grouping FeedForward makes on the host (lib/model/forward.cc), in GroupByExpert's layout.
struct HostGroups {
  std::vector<int32_t> idx;     // (2 n): token of each grouped row, then grouped row of each selection
  std::vector<int32_t> expert;  // expert of each group, ascending
  std::vector<int32_t> first;   // first grouped row of each group, then n
};

// The grouping the forward pass and the CPU backend use (model::GroupByExpert), as the device's
// reference; selections must be in range.
HostGroups ReferenceGroups(const std::vector<int32_t> &sel, int k, int n_expert) {
  const int64_t n = static_cast<int64_t>(sel.size());
  const model::ExpertGroups g = model::GroupByExpert(sel.data(), n / k, k, n_expert);
  HostGroups h;
  h.idx = g.idx;
  h.expert = g.used;
  h.first.assign(g.first.begin(), g.first.end());
  return h;
}

// "" when a and b are equal, else where they first differ (so a failure names the entry, not two
// printed arrays of thousands of values).
std::string FirstDifference(const std::vector<int32_t> &got, const std::vector<int32_t> &want, const char *what) {
  if (got.size() != want.size()) return std::string(what) + ": sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      std::ostringstream os;
      os << what << "[" << i << "] is " << got[i] << ", expected " << want[i];
      return os.str();
    }
  }
  return "";
}

// The first float that differs in its bits, with both values; "" when all match.
std::string FirstBitDifference(const std::vector<float> &got, const std::vector<float> &want, int64_t width,
                               const char *what) {
  if (got.size() != want.size()) return std::string(what) + ": sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      std::ostringstream os;
      os.precision(9);
      os << what << " row " << i / width << " column " << i % width << " is " << got[i] << ", per-expert path gave "
         << want[i];
      return os.str();
    }
  }
  return "";
}

// The plan's defined entries: group count, experts of the groups, first rows (n_groups + 1).
struct DevicePlan {
  int32_t n_groups = 0;
  std::vector<int32_t> expert, first;
};

DevicePlan ReadPlan(const DeviceBuffer &plan, int64_t n_max) {
  const std::vector<int32_t> p = Download<int32_t>(plan, 2 + 2 * n_max);
  DevicePlan d;
  d.n_groups = p[0];
  REQUIRE(d.n_groups >= 0);
  REQUIRE(d.n_groups <= n_max);
  d.expert.assign(p.begin() + 1, p.begin() + 1 + d.n_groups);
  d.first.assign(p.begin() + 1 + n_max, p.begin() + 2 + n_max + d.n_groups);
  return d;
}

// int32 device memory filled with -1.
DeviceBuffer PoisonedInts(size_t n) {
  auto b = DeviceBuffer::Allocate(n * sizeof(int32_t));
  REQUIRE(b.ok());
  REQUIRE(cudaMemset(b->data(), 0xff, n * sizeof(int32_t)) == cudaSuccess);
  return std::move(b).value();
}

// Runs GroupByExpert on sel and checks idx and the plan against the host grouping.
void CheckGrouping(const std::vector<int32_t> &sel, int64_t n_tok, int k, int n_expert) {
  const int64_t n = n_tok * k, n_max = GroupMaxGroups(n_tok, k, n_expert);
  REQUIRE(static_cast<int64_t>(sel.size()) == n);
  REQUIRE(GroupPlanInts(n_tok, k, n_expert) == 2 + 2 * n_max);
  const HostGroups ref = ReferenceGroups(sel, k, n_expert);
  DeviceBuffer dsel = Upload(sel), idx = PoisonedInts(2 * n), plan = PoisonedInts(GroupPlanInts(n_tok, k, n_expert));
  REQUIRE(GroupByExpert(dsel.as<int32_t>(), n_tok, k, n_expert, idx.as<int32_t>(), plan.as<int32_t>(), nullptr).ok());
  const DevicePlan p = ReadPlan(plan, n_max);
  CHECK(p.n_groups == static_cast<int32_t>(ref.expert.size()));
  CHECK(FirstDifference(p.expert, ref.expert, "plan expert") == "");
  CHECK(FirstDifference(p.first, ref.first, "plan first row") == "");
  CHECK(FirstDifference(Download<int32_t>(idx, 2 * n), ref.idx, "idx") == "");
}

// k distinct experts per token, uniformly random (what a top-k router yields).
std::vector<int32_t> DistinctSelections(std::mt19937 &rng, int64_t n_tok, int k, int n_expert) {
  std::vector<int32_t> all(n_expert), sel;
  std::iota(all.begin(), all.end(), 0);
  for (int64_t t = 0; t < n_tok; ++t) {
    std::shuffle(all.begin(), all.end(), rng);
    sel.insert(sel.end(), all.begin(), all.begin() + k);
  }
  return sel;
}

TEST_CASE("GroupByExpert groups as the forward pass does on the host", "[gpu][grouped]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  struct Case { int64_t n_tok; int k, n_expert; };
  for (Case c : {Case{1, 8, 128}, Case{16, 8, 128}, Case{600, 8, 64}, Case{1, 1, 1}, Case{3, 2, 256}, Case{64, 8, 256},
                 Case{512, 8, 128}, Case{37, 4, 8}, Case{1000, 10, 200}}) {
    INFO("n_tok " << c.n_tok << ", k " << c.k << ", " << c.n_expert << " experts, distinct per token");
    CheckGrouping(DistinctSelections(rng, c.n_tok, c.k, c.n_expert), c.n_tok, c.k, c.n_expert);
  }
  // Skewed: most selections go to one expert (groups far longer than a warp's 32), and a token may
  // name an expert twice; the grouping is defined all the same.
  for (Case c : {Case{64, 8, 128}, Case{600, 8, 64}, Case{2048, 2, 256}, Case{5, 8, 128}}) {
    INFO("n_tok " << c.n_tok << ", k " << c.k << ", " << c.n_expert << " experts, skewed");
    std::uniform_int_distribution<int32_t> any(0, c.n_expert - 1), pct(0, 99);
    const int32_t hot = any(rng);
    std::vector<int32_t> sel(c.n_tok * c.k);
    for (auto &e : sel) e = pct(rng) < 85 ? hot : any(rng);
    CheckGrouping(sel, c.n_tok, c.k, c.n_expert);
  }
  {
    INFO("every selection to the last expert");
    CheckGrouping(std::vector<int32_t>(300 * 8, 255), 300, 8, 256);
  }
}

TEST_CASE("GroupByExpert drops selections outside the experts without writing out of bounds", "[gpu][grouped]") {
  if (!HaveGpu()) return;
  const int64_t n_tok = 4;
  const int k = 2, n_expert = 4;
  const std::vector<int32_t> sel = {3, 7, -1, 1, 3, 0, 4, 1};  // 7, -1 and 4 are out of range
  DeviceBuffer dsel = Upload(sel), idx = PoisonedInts(2 * 8), plan = PoisonedInts(GroupPlanInts(n_tok, k, n_expert));
  REQUIRE(GroupByExpert(dsel.as<int32_t>(), n_tok, k, n_expert, idx.as<int32_t>(), plan.as<int32_t>(), nullptr).ok());
  const DevicePlan p = ReadPlan(plan, GroupMaxGroups(n_tok, k, n_expert));
  CHECK(p.expert == std::vector<int32_t>{0, 1, 3});
  CHECK(p.first == std::vector<int32_t>{0, 1, 3, 5});
  const std::vector<int32_t> got = Download<int32_t>(idx, 16);
  CHECK(std::vector<int32_t>(got.begin(), got.begin() + 5) == std::vector<int32_t>{2, 1, 3, 0, 2});
  CHECK(std::vector<int32_t>(got.begin() + 8, got.end()) == std::vector<int32_t>{3, -1, -1, 1, 4, 0, -1, 2});
}

// n_expert experts' matrices in device memory (optionally some in mapped host memory) and the
// device pointer tables of GroupedExperts.
struct CodecCase {
  TypeId gate, down;
  int64_t n_embd, n_ff;
};

struct Experts {
  // n_expert experts of random rows in the shape and codecs of c.
  static Experts Random(std::mt19937 &rng, const CodecCase &c, int n_expert) {
    Experts e;
    e.n_embd = c.n_embd;
    e.n_ff = c.n_ff;
    e.gate_type = c.gate;
    e.down_type = c.down;
    e.Randomize(rng, n_expert);
    return e;
  }

  int64_t n_embd = 0, n_ff = 0;
  TypeId gate_type{}, down_type{};
  uint64_t rb_in = 0, rb_out = 0;
  std::vector<std::vector<uint8_t>> gate, up, down;  // host bytes per expert

  void Randomize(std::mt19937 &rng, int n_expert) {
    for (int e = 0; e < n_expert; ++e) {
      gate.push_back(RandomMatrix(rng, gate_type, n_ff, n_embd, &rb_in));
      up.push_back(RandomMatrix(rng, gate_type, n_ff, n_embd, &rb_in));
      down.push_back(RandomMatrix(rng, down_type, n_embd, n_ff, &rb_out));
    }
  }
  int n_expert() const { return static_cast<int>(gate.size()); }
  DeviceMatrix GateShape() const { return {gate_type, nullptr, n_ff, n_embd, rb_in}; }
  DeviceMatrix DownShape() const { return {down_type, nullptr, n_embd, n_ff, rb_out}; }
};

// Where the weights live for one run: each expert's three matrices in VRAM, or (mapped[e]) in
// page-locked host memory the kernels read over the link.
struct Placement {
  std::vector<DeviceBuffer> vram;
  std::vector<PinnedBuffer> host;
  std::vector<const void *> gate, up, down;  // device-usable addresses per expert
  DeviceBuffer gate_tab, up_tab, down_tab;

  const void *Place(const std::vector<uint8_t> &bytes, bool mapped) {
    if (!mapped) {
      vram.push_back(Upload(bytes));
      return vram.back().data();
    }
    auto b = PinnedBuffer::Allocate(bytes.size(), cudaHostAllocMapped);
    REQUIRE(b.ok());
    std::memcpy(b->data(), bytes.data(), bytes.size());
    auto dev = b->device<void>();
    REQUIRE(dev.ok());
    host.push_back(std::move(b).value());
    return *dev;
  }

  Placement(const Experts &x, const std::vector<bool> &mapped) {
    for (int e = 0; e < x.n_expert(); ++e) {
      gate.push_back(Place(x.gate[e], mapped[e]));
      up.push_back(Place(x.up[e], mapped[e]));
      down.push_back(Place(x.down[e], mapped[e]));
    }
    gate_tab = Upload(gate);
    up_tab = Upload(up);
    down_tab = Upload(down);
  }

  GroupedExperts Grouped(const Experts &x) const {
    GroupedExperts g;
    g.gate = static_cast<const void *const *>(gate_tab.data());
    g.up = static_cast<const void *const *>(up_tab.data());
    g.down = static_cast<const void *const *>(down_tab.data());
    g.gate_shape = g.up_shape = x.GateShape();
    g.down_shape = x.DownShape();
    g.n_expert = x.n_expert();
    return g;
  }
};

// One MoE layer's routed experts over sel, grouped on the device: h (n, n_ff) and y (n, n_embd) as
// the grouped kernels produce them, plus the device buffers the per-expert path reuses.
struct GroupedRun {
  std::vector<float> h, y;
};

GroupedRun RunGrouped(const Experts &x, const Placement &pl, const DeviceBuffer &dsel, int64_t n_tok, int k,
                      const DeviceBuffer &dx, DeviceBuffer *xg_out) {
  const int64_t n = n_tok * k;
  const int n_max = static_cast<int>(GroupMaxGroups(n_tok, k, x.n_expert()));
  DeviceBuffer idx = PoisonedInts(2 * n), plan = PoisonedInts(GroupPlanInts(n_tok, k, x.n_expert()));
  REQUIRE(GroupByExpert(dsel.as<int32_t>(), n_tok, k, x.n_expert(), idx.as<int32_t>(), plan.as<int32_t>(), nullptr).ok());
  DeviceBuffer xg = Poisoned(n * x.n_embd), hg = Poisoned(n * x.n_ff), yg = Poisoned(n * x.n_embd);
  REQUIRE(GatherRows(dx.as<float>(), x.n_embd, idx.as<int32_t>(), n, xg.as<float>(), nullptr).ok());
  const GroupedExperts ge = pl.Grouped(x);
  REQUIRE(CheckGroupedExperts(ge).ok());
  REQUIRE(GroupedSwiGlu(ge, plan.as<int32_t>(), n_max, xg.as<float>(), hg.as<float>(), nullptr, n_tok).ok());
  REQUIRE(GroupedGemv(ge.down, ge.down_shape, plan.as<int32_t>(), n_max, hg.as<float>(), yg.as<float>(), nullptr,
                      n_tok).ok());
  GroupedRun r{Download<float>(hg, n * x.n_ff), Download<float>(yg, n * x.n_embd)};
  // Kernels sized for any number of tokens (n_tok unknown) give the same bits.
  DeviceBuffer hg8 = Poisoned(n * x.n_ff), yg8 = Poisoned(n * x.n_embd);
  REQUIRE(GroupedSwiGlu(ge, plan.as<int32_t>(), n_max, xg.as<float>(), hg8.as<float>(), nullptr).ok());
  REQUIRE(GroupedGemv(ge.down, ge.down_shape, plan.as<int32_t>(), n_max, hg.as<float>(), yg8.as<float>(), nullptr).ok());
  CHECK(Download<float>(hg8, n * x.n_ff) == r.h);
  CHECK(Download<float>(yg8, n * x.n_embd) == r.y);
  // And kernels told to take one token at a time (a group of more takes more chunks): the same bits.
  DeviceBuffer hg1 = Poisoned(n * x.n_ff), yg1 = Poisoned(n * x.n_embd);
  REQUIRE(GroupedSwiGlu(ge, plan.as<int32_t>(), n_max, xg.as<float>(), hg1.as<float>(), nullptr, 1).ok());
  REQUIRE(GroupedGemv(ge.down, ge.down_shape, plan.as<int32_t>(), n_max, hg.as<float>(), yg1.as<float>(), nullptr, 1).ok());
  CHECK(Download<float>(hg1, n * x.n_ff) == r.h);
  CHECK(Download<float>(yg1, n * x.n_embd) == r.y);
  // And a grid of fewer rows than groups, each block serving several: the same bits.
  const int n_grid = std::max(1, n_max / 3);
  DeviceBuffer hg3 = Poisoned(n * x.n_ff), yg3 = Poisoned(n * x.n_embd);
  REQUIRE(GroupedSwiGlu(ge, plan.as<int32_t>(), n_max, xg.as<float>(), hg3.as<float>(), nullptr, n_tok, nullptr,
                        n_grid).ok());
  REQUIRE(GroupedGemv(ge.down, ge.down_shape, plan.as<int32_t>(), n_max, hg.as<float>(), yg3.as<float>(), nullptr,
                      n_tok, nullptr, n_grid).ok());
  CHECK(Download<float>(hg3, n * x.n_ff) == r.h);
  CHECK(Download<float>(yg3, n * x.n_embd) == r.y);
  if (xg_out != nullptr) *xg_out = std::move(xg);
  return r;
}

// The path grouping replaces: GemvSwiGlu + Gemv once per group on that group's rows of xg.
GroupedRun RunPerExpert(const Experts &x, const Placement &pl, const HostGroups &groups, const DeviceBuffer &xg,
                        int64_t n) {
  DeviceBuffer hg = Poisoned(n * x.n_ff), yg = Poisoned(n * x.n_embd);
  for (size_t g = 0; g < groups.expert.size(); ++g) {
    const int e = groups.expert[g];
    const int64_t r0 = groups.first[g], cnt = groups.first[g + 1] - r0;
    const DeviceMatrix gate{x.gate_type, pl.gate[e], x.n_ff, x.n_embd, x.rb_in};
    const DeviceMatrix up{x.gate_type, pl.up[e], x.n_ff, x.n_embd, x.rb_in};
    const DeviceMatrix down{x.down_type, pl.down[e], x.n_embd, x.n_ff, x.rb_out};
    REQUIRE(GemvSwiGlu(gate, up, xg.as<float>() + r0 * x.n_embd, cnt, hg.as<float>() + r0 * x.n_ff, nullptr).ok());
    REQUIRE(Gemv(down, hg.as<float>() + r0 * x.n_ff, cnt, yg.as<float>() + r0 * x.n_embd, nullptr).ok());
  }
  return {Download<float>(hg, n * x.n_ff), Download<float>(yg, n * x.n_embd)};
}

// Selections over n_expert experts whose groups have the given sizes (one expert each, the rest
// unused), in a random order; the total must be a multiple of k.
std::vector<int32_t> SelectionsWithGroupSizes(std::mt19937 &rng, const std::vector<int> &sizes, int n_expert) {
  std::vector<int32_t> experts(n_expert);
  std::iota(experts.begin(), experts.end(), 0);
  std::shuffle(experts.begin(), experts.end(), rng);
  std::vector<int32_t> sel;
  for (size_t g = 0; g < sizes.size(); ++g) sel.insert(sel.end(), sizes[g], experts[g]);
  std::shuffle(sel.begin(), sel.end(), rng);
  return sel;
}

TEST_CASE("Grouped SwiGLU and down GEMV are bit-identical to the per-expert GEMVs", "[gpu][grouped]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  // Shapes valid for each codec (K-quants and IQ4_XS need columns in 256s); Q4_K/Q6_K is the mix
  // of a Q4_K_M file.
  const CodecCase cases[] = {
      {TypeId::kQ4_K, TypeId::kQ4_K, 2048, 768}, {TypeId::kQ4_K, TypeId::kQ6_K, 1024, 512},
      {TypeId::kQ6_K, TypeId::kQ6_K, 512, 256},  {TypeId::kQ8_0, TypeId::kQ8_0, 768, 352},
      {TypeId::kMXFP4, TypeId::kMXFP4, 1024, 160}, {TypeId::kIQ4_XS, TypeId::kIQ4_XS, 1536, 256},
      {TypeId::kF16, TypeId::kF16, 512, 224},    {TypeId::kF32, TypeId::kF32, 256, 128},
      {TypeId::kBF16, TypeId::kBF16, 384, 192},
      // The mixes of Q5_K_M, Q3_K_M and Q2_K files, and the 32-element legacy codecs.
      {TypeId::kQ5_K, TypeId::kQ6_K, 1024, 512}, {TypeId::kQ3_K, TypeId::kQ5_K, 768, 256},
      {TypeId::kQ2_K, TypeId::kQ4_K, 512, 256},  {TypeId::kQ4_0, TypeId::kQ5_0, 544, 224},
      {TypeId::kQ4_1, TypeId::kQ5_1, 320, 160},
      // The mixes of IQ2_XXS, IQ2_XS, IQ3_S, IQ1_S and IQ1_M files, IQ4_NL, and the ternary codecs;
      // odd block counts (768, 1280 columns) start every other row mid-word.
      {TypeId::kIQ2_XXS, TypeId::kIQ3_XXS, 1280, 512}, {TypeId::kIQ2_XS, TypeId::kIQ2_S, 768, 256},
      {TypeId::kIQ3_S, TypeId::kIQ3_S, 512, 768},      {TypeId::kIQ1_S, TypeId::kIQ1_M, 1024, 256},
      {TypeId::kIQ1_M, TypeId::kIQ2_XXS, 768, 512},    {TypeId::kIQ4_NL, TypeId::kIQ4_NL, 544, 224},
      {TypeId::kTQ1_0, TypeId::kTQ2_0, 768, 256},      {TypeId::kTQ2_0, TypeId::kTQ1_0, 512, 768},
      // Rows split over warps (GemvTeamWarps): 2 warps for MXFP4 at 1024 and IQ4_XS at 1536 columns
      // above, 4 here, 8 for the down projection of 4096 columns.
      {TypeId::kQ8_0, TypeId::kQ8_0, 2048, 512}, {TypeId::kF32, TypeId::kF16, 256, 4096},
  };
  // Groups of 1, 3, 8 and 13 tokens (13 = 8 + 4 + 1 chunks, 3 = 2 + 1) and another 1 for an even total.
  const std::vector<int> sizes = {1, 3, 8, 13, 1};
  const int k = 2, n_expert = 12;
  const int64_t n = std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), n_tok = n / k;
  for (const CodecCase &c : cases) {
    INFO(quant::TypeName(static_cast<uint32_t>(c.gate)) << " gate/up, " << quant::TypeName(static_cast<uint32_t>(c.down))
                                                        << " down, n_embd " << c.n_embd << ", n_ff " << c.n_ff);
    Experts x = Experts::Random(rng, c, n_expert);
    const std::vector<int32_t> sel = SelectionsWithGroupSizes(rng, sizes, n_expert);
    const HostGroups groups = ReferenceGroups(sel, k, n_expert);
    DeviceBuffer dsel = Upload(sel), dx = Upload(RandomFloats(rng, n_tok * c.n_embd, -2.f, 2.f));
    const Placement vram(x, std::vector<bool>(n_expert, false));
    DeviceBuffer xg;
    const GroupedRun got = RunGrouped(x, vram, dsel, n_tok, k, dx, &xg);
    const GroupedRun want = RunPerExpert(x, vram, groups, xg, n);
    CHECK(FirstBitDifference(got.h, want.h, c.n_ff, "SwiGLU output") == "");
    CHECK(FirstBitDifference(got.y, want.y, c.n_embd, "down output") == "");
  }
}

// Hybrid placement's half on the device: groups whose expert is flagged are not run (their rows keep
// the poison), the others give the bits of the unflagged run, and CopySkippedGroups brings exactly
// the flagged groups' rows in from page-locked host memory read in place.
TEST_CASE("Grouped kernels skip flagged experts and CopySkippedGroups fills their rows from host memory",
          "[gpu][grouped]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int k = 2, n_expert = 12;
  Experts x = Experts::Random(rng, {TypeId::kQ8_0, TypeId::kQ8_0, 768, 352}, n_expert);
  const std::vector<int> sizes = {1, 3, 8, 13, 1};
  const int64_t n = 26, n_tok = n / k;
  const std::vector<int32_t> sel = SelectionsWithGroupSizes(rng, sizes, n_expert);
  const HostGroups groups = ReferenceGroups(sel, k, n_expert);
  DeviceBuffer dsel = Upload(sel), dx = Upload(RandomFloats(rng, n_tok * x.n_embd, -2.f, 2.f));
  const Placement vram(x, std::vector<bool>(n_expert, false));
  DeviceBuffer xg;
  const GroupedRun all = RunGrouped(x, vram, dsel, n_tok, k, dx, &xg);
  // Flag every other used expert, starting at a random one of the first two.
  std::vector<uint8_t> skip(n_expert, 0);
  const size_t start = std::uniform_int_distribution<size_t>(0, 1)(rng);
  for (size_t g = start; g < groups.expert.size(); g += 2) skip[groups.expert[g]] = 1;
  const int n_max = static_cast<int>(GroupMaxGroups(n_tok, k, n_expert));
  DeviceBuffer idx = PoisonedInts(2 * n), plan = PoisonedInts(GroupPlanInts(n_tok, k, n_expert)), dskip = Upload(skip);
  REQUIRE(GroupByExpert(dsel.as<int32_t>(), n_tok, k, n_expert, idx.as<int32_t>(), plan.as<int32_t>(), nullptr).ok());
  DeviceBuffer hg = Poisoned(n * x.n_ff), yg = Poisoned(n * x.n_embd);
  const GroupedExperts ge = vram.Grouped(x);
  // Two rows of groups: each block walks every other group, skipped ones among them.
  REQUIRE(GroupedSwiGlu(ge, plan.as<int32_t>(), n_max, xg.as<float>(), hg.as<float>(), nullptr, n_tok,
                        dskip.as<uint8_t>(), 2).ok());
  REQUIRE(GroupedGemv(ge.down, ge.down_shape, plan.as<int32_t>(), n_max, hg.as<float>(), yg.as<float>(), nullptr,
                      n_tok, dskip.as<uint8_t>(), 2).ok());
  const std::vector<float> y = Download<float>(yg, n * x.n_embd);
  auto group_rows = [&](size_t g, const std::vector<float> &v) {
    return std::vector<float>(v.begin() + groups.first[g] * x.n_embd, v.begin() + groups.first[g + 1] * x.n_embd);
  };
  for (size_t g = 0; g < groups.expert.size(); ++g) {
    INFO("group " << g << " (expert " << groups.expert[g] << ", skipped " << int(skip[groups.expert[g]]) << ")");
    const std::vector<float> got = group_rows(g, y);
    if (skip[groups.expert[g]]) {
      CHECK(std::all_of(got.begin(), got.end(), [](float f) { return std::isnan(f); }));
    } else {
      CHECK(std::memcmp(got.data(), group_rows(g, all.y).data(), got.size() * sizeof(float)) == 0);
    }
  }
  auto pinned = PinnedBuffer::Allocate(n * x.n_embd * sizeof(float), cudaHostAllocMapped);
  REQUIRE(pinned.ok());
  const std::vector<float> host_rows = RandomFloats(rng, n * x.n_embd, -3.f, 3.f);
  std::memcpy(pinned->data(), host_rows.data(), host_rows.size() * sizeof(float));
  REQUIRE(CopySkippedGroups(plan.as<int32_t>(), n_max, dskip.as<uint8_t>(), pinned->as<float>(), yg.as<float>(),
                            x.n_embd, nullptr).ok());
  const std::vector<float> merged = Download<float>(yg, n * x.n_embd);
  for (size_t g = 0; g < groups.expert.size(); ++g) {
    INFO("group " << g << " after the copy");
    const std::vector<float> want = group_rows(g, skip[groups.expert[g]] ? host_rows : all.y);
    CHECK(std::memcmp(group_rows(g, merged).data(), want.data(), want.size() * sizeof(float)) == 0);
  }
  CHECK(!CopySkippedGroups(plan.as<int32_t>(), n_max, nullptr, pinned->as<float>(), yg.as<float>(), x.n_embd,
                           nullptr).ok());
}

// A layer's call to the CPU's expert worker (cpu_experts.h) without host functions: the device
// writes the call's data and then the call to mapped memory, and waits for the host thread's two
// answers; a thread here plays the worker. Two calls (row widths that take the vector and the scalar
// copy), fresh random data; then a call nobody answers.
TEST_CASE("PostCpuCall and WaitCpuCall carry a call to a host thread and its answers back", "[gpu][grouped]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  const int k = 8, n_expert = 128;
  const int64_t n_tok = std::uniform_int_distribution<int>(1, 6)(rng);
  const int64_t widths[2] = {2048, 1001};
  auto mapped = [](size_t bytes) {
    auto b = PinnedBuffer::Allocate(bytes, cudaHostAllocMapped);
    REQUIRE(b.ok());
    std::memset(b->data(), 0xee, bytes);  // poison: what the device writes must replace it
    return std::move(b).value();
  };
  auto dev = [](const PinnedBuffer &b) {
    auto d = b.device<uint8_t>();
    REQUIRE(d.ok());
    return *d;
  };
  PinnedBuffer box = mapped(256), hsel = mapped(n_tok * k * 4), hh = mapped(n_tok * 2048 * 4),
               htab = mapped(n_expert * 8), hskip = mapped(n_expert), hy = mapped(16);
  std::memset(box.data(), 0, 256);
  DeviceBuffer counters = DeviceBuffer::Allocate(32).value();
  REQUIRE(cudaMemset(counters.data(), 0, 32) == cudaSuccess);
  CpuCallBox b;
  b.call = reinterpret_cast<CpuCall *>(dev(box));
  b.answer = reinterpret_cast<const uint32_t *>(dev(box) + 128);
  b.timed_out = reinterpret_cast<uint32_t *>(dev(box) + 144);
  b.sel = reinterpret_cast<int32_t *>(dev(hsel));
  b.h = reinterpret_cast<float *>(dev(hh));
  b.tab = reinterpret_cast<const void **>(dev(htab));
  b.next = counters.as<uint32_t>();
  b.waited_ns = reinterpret_cast<unsigned long long *>(counters.as<uint8_t>() + 16);
  auto *answer = reinterpret_cast<uint32_t *>(box.as<uint8_t>() + 128);
  const auto *timed_out = reinterpret_cast<volatile const uint32_t *>(box.as<uint8_t>() + 144);

  // What the host thread saw of each call, and the flags it answered with.
  struct Seen {
    CpuCall call;
    std::vector<int32_t> sel;
    std::vector<float> h;
    std::vector<uint64_t> tab;
    std::vector<uint8_t> skip;
  };
  std::vector<Seen> seen(2);
  std::vector<std::vector<uint8_t>> flags(2, std::vector<uint8_t>(n_expert));
  for (auto &f : flags)
    for (uint8_t &v : f) v = static_cast<uint8_t>(std::uniform_int_distribution<int>(0, 1)(rng));
  std::thread host([&] {
    const volatile CpuCall *call = box.as<CpuCall>();
    for (uint32_t want = 1; want <= 2; ++want) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (__atomic_load_n(&const_cast<const CpuCall *>(call)->seq, __ATOMIC_ACQUIRE) != want) {
        if (std::chrono::steady_clock::now() > deadline) return;
      }
      Seen &s = seen[want - 1];
      s.call.layer = call->layer;
      s.call.k = call->k;
      s.call.n_expert = call->n_expert;
      s.call.n_tok = call->n_tok;
      s.call.seq = want;
      s.sel.assign(hsel.as<int32_t>(), hsel.as<int32_t>() + n_tok * k);
      s.h.assign(hh.as<float>(), hh.as<float>() + n_tok * widths[want - 1]);
      s.tab.assign(htab.as<uint64_t>(), htab.as<uint64_t>() + n_expert);
      std::memcpy(hskip.data(), flags[want - 1].data(), n_expert);
      __atomic_store_n(&answer[0], want, __ATOMIC_RELEASE);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the device must wait for "done"
      hy.as<uint32_t>()[0] = 7 * want;
      __atomic_store_n(&answer[1], want, __ATOMIC_RELEASE);
    }
  });
  std::vector<int32_t> sel(n_tok * k);
  for (int32_t &v : sel) v = std::uniform_int_distribution<int32_t>(0, n_expert - 1)(rng);
  std::vector<uint64_t> tab(n_expert);
  for (uint64_t &v : tab) v = rng() * uint64_t{0x100000001};
  DeviceBuffer dsel = Upload(sel), dtab = Upload(tab), dskip = DeviceBuffer::Allocate(n_expert).value(),
               dy = DeviceBuffer::Allocate(16).value();
  std::vector<std::vector<float>> hs;
  for (int c = 0; c < 2; ++c) {
    INFO("call " << c + 1 << ", rows of " << widths[c]);
    hs.push_back(RandomFloats(rng, n_tok * widths[c], -3.f, 3.f));
    DeviceBuffer dh = Upload(hs.back());
    REQUIRE(cudaMemset(dskip.data(), 0x5a, n_expert) == cudaSuccess);
    CpuCall call;
    call.layer = 3 + c;
    call.k = k;
    call.n_expert = n_expert;
    call.n_tok = n_tok;
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(PostCpuCall(b, call, dsel.as<int32_t>(), dh.as<float>(), widths[c], dtab.as<const void *>(), nullptr).ok());
    REQUIRE(WaitCpuCall(b, 0, dev(hskip), dskip.as<uint8_t>(), n_expert, nullptr).ok());
    REQUIRE(WaitCpuCall(b, 1, nullptr, nullptr, 0, nullptr).ok());
    REQUIRE(cudaMemcpyAsync(dy.data(), dev(hy), 4, cudaMemcpyDefault, nullptr) == cudaSuccess);
    const std::vector<uint8_t> got_skip = Download<uint8_t>(dskip, n_expert);
    CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(5));
    CHECK(Download<uint32_t>(dy, 1)[0] == 7u * (c + 1));  // read after "done", not before
    CHECK(got_skip == flags[c]);
  }
  host.join();
  for (int c = 0; c < 2; ++c) {
    INFO("call " << c + 1);
    const Seen &s = seen[c];
    CHECK(s.call.layer == 3 + c);
    CHECK(s.call.k == k);
    CHECK(s.call.n_expert == n_expert);
    CHECK(s.call.n_tok == n_tok);
    CHECK(s.sel == sel);
    CHECK(s.tab == tab);
    REQUIRE(s.h.size() == hs[c].size());
    CHECK(std::memcmp(s.h.data(), hs[c].data(), s.h.size() * sizeof(float)) == 0);
  }
  CHECK(timed_out[0] == 0);

  // A call nobody answers: the wait gives up after its timeout, says which call and stage, and
  // lets the stream go on with every flag 0; later waits that would wait return at once.
  b.timeout_ns = 20000000;  // 20 ms
  DeviceBuffer dh = Upload(hs[0]);
  REQUIRE(cudaMemset(dskip.data(), 0x5a, n_expert) == cudaSuccess);
  CpuCall call;
  call.k = k;
  call.n_expert = n_expert;
  call.n_tok = n_tok;
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(PostCpuCall(b, call, dsel.as<int32_t>(), dh.as<float>(), 2048, dtab.as<const void *>(), nullptr).ok());
  REQUIRE(WaitCpuCall(b, 0, dev(hskip), dskip.as<uint8_t>(), n_expert, nullptr).ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(t1 - t0 >= std::chrono::milliseconds(20));
  CHECK(timed_out[0] == 1);
  CHECK(timed_out[1] == 0);
  CHECK(timed_out[2] == 3);
  CHECK(timed_out[3] == 2);
  const std::vector<uint8_t> zero_skip = Download<uint8_t>(dskip, n_expert);
  CHECK(std::all_of(zero_skip.begin(), zero_skip.end(), [](uint8_t v) { return v == 0; }));
  b.timeout_ns = 30000000000;  // 30 s: not waited
  for (int i = 0; i < 4; ++i) REQUIRE(WaitCpuCall(b, i % 2, nullptr, nullptr, 0, nullptr).ok());
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::seconds(2));
  const std::vector<unsigned long long> waited = Download<unsigned long long>(counters, 4);
  CHECK(waited[2] >= 20000000ull);  // stage 0 waited the timeout (and the answered calls' decisions)
  CHECK(waited[3] >= 8000000ull);  // stage 1 waited most of the two 5 ms sleeps

  // Refusals: an incomplete box, a stage other than 0 and 1, flags without a source, no tokens.
  const auto invalid = [](const absl::Status &st) { return StatusToMoe(st) == MOE_ERR_INVALID_ARGUMENT; };
  CpuCallBox partial = b;
  partial.h = nullptr;
  CHECK(invalid(PostCpuCall(partial, call, dsel.as<int32_t>(), dh.as<float>(), 2048, dtab.as<const void *>(), nullptr)));
  CHECK(invalid(WaitCpuCall(b, 2, nullptr, nullptr, 0, nullptr)));
  CHECK(invalid(WaitCpuCall(b, 0, nullptr, dskip.as<uint8_t>(), n_expert, nullptr)));
  call.n_tok = 0;
  CHECK(invalid(PostCpuCall(b, call, dsel.as<int32_t>(), dh.as<float>(), 2048, dtab.as<const void *>(), nullptr)));
}

TEST_CASE("Grouped experts over a decode and a batch of routed tokens match the per-expert GEMVs", "[gpu][grouped]") {
  if (!HaveGpu()) return;
  auto rng = test::Rng();
  // Qwen3-30B-A3B's expert shape, 8 of 64 experts per token: one token, a batch of 16 (groups of
  // mixed sizes), 40 tokens (groups past 8 tokens).
  const int n_expert = 64, k = 8;
  Experts x = Experts::Random(rng, {TypeId::kQ4_K, TypeId::kQ6_K, 2048, 768}, n_expert);
  const Placement vram(x, std::vector<bool>(n_expert, false));
  for (int64_t n_tok : {1, 16, 40}) {
    INFO("n_tok " << n_tok);
    const std::vector<int32_t> sel = DistinctSelections(rng, n_tok, k, n_expert);
    DeviceBuffer dsel = Upload(sel), dx = Upload(RandomFloats(rng, n_tok * x.n_embd, -2.f, 2.f));
    DeviceBuffer xg;
    const GroupedRun got = RunGrouped(x, vram, dsel, n_tok, k, dx, &xg);
    const GroupedRun want = RunPerExpert(x, vram, ReferenceGroups(sel, k, n_expert), xg, n_tok * k);
    CHECK(FirstBitDifference(got.h, want.h, x.n_ff, "SwiGLU output") == "");
    CHECK(FirstBitDifference(got.y, want.y, x.n_embd, "down output") == "");
  }
}

// Whether the device can read page-locked host memory in place; a test that needs it says why it
// stops when not.
bool CanMapHostMemory(const char *test) {
  int can_map = 0;
  REQUIRE(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, 0) == cudaSuccess);
  if (can_map == 0) WARN("device cannot map host memory: " << test << " test skipped");
  return can_map != 0;
}

TEST_CASE("Grouped experts read weights in mapped host memory as they read VRAM", "[gpu][grouped]") {
  if (!HaveGpu() || !CanMapHostMemory("zero-copy")) return;
  auto rng = test::Rng();
  const CodecCase cases[] = {{TypeId::kQ4_K, TypeId::kQ6_K, 2048, 768}, {TypeId::kMXFP4, TypeId::kMXFP4, 1024, 320},
                             {TypeId::kQ5_K, TypeId::kQ6_K, 1024, 512},  {TypeId::kQ3_K, TypeId::kQ2_K, 768, 256},
                             {TypeId::kQ5_0, TypeId::kQ4_1, 544, 160},   {TypeId::kIQ2_XXS, TypeId::kIQ3_S, 1024, 512},
                             {TypeId::kIQ1_M, TypeId::kIQ4_NL, 768, 256}, {TypeId::kTQ1_0, TypeId::kIQ2_S, 768, 256}};
  const int n_expert = 16, k = 4;
  const int64_t n_tok = 9;
  for (const CodecCase &c : cases) {
    INFO(quant::TypeName(static_cast<uint32_t>(c.gate)) << " gate/up, " << quant::TypeName(static_cast<uint32_t>(c.down))
                                                        << " down");
    Experts x = Experts::Random(rng, c, n_expert);
    std::vector<bool> mixed(n_expert), all_host(n_expert, true);
    for (int e = 0; e < n_expert; ++e) mixed[e] = e % 3 != 0;  // two thirds on the host
    const Placement vram(x, std::vector<bool>(n_expert, false)), part(x, mixed), host(x, all_host);
    const std::vector<int32_t> sel = DistinctSelections(rng, n_tok, k, n_expert);
    DeviceBuffer dsel = Upload(sel), dx = Upload(RandomFloats(rng, n_tok * c.n_embd, -2.f, 2.f));
    const GroupedRun want = RunGrouped(x, vram, dsel, n_tok, k, dx, nullptr);
    for (const Placement *pl : {&part, &host}) {
      INFO((pl == &part ? "two thirds of the experts" : "every expert") << " in mapped host memory");
      const GroupedRun got = RunGrouped(x, *pl, dsel, n_tok, k, dx, nullptr);
      CHECK(FirstBitDifference(got.h, want.h, c.n_ff, "SwiGLU output") == "");
      CHECK(FirstBitDifference(got.y, want.y, c.n_embd, "down output") == "");
    }
  }
}

TEST_CASE("StageColdExperts copies the plan's cold experts into VRAM slots, and the products keep their bits",
          "[gpu][grouped]") {
  if (!HaveGpu() || !CanMapHostMemory("staging")) return;
  auto rng = test::Rng();
  const int n_expert = 16, k = 4;
  const int64_t n_tok = 5;
  const CodecCase c{TypeId::kQ4_K, TypeId::kQ6_K, 512, 256};
  Experts x = Experts::Random(rng, c, n_expert);
  const auto align = [](uint64_t b) { return (b + 255) / 256 * 256; };
  const uint64_t sizes[3] = {x.gate[0].size(), x.up[0].size(), x.down[0].size()};
  const uint64_t offs[3] = {0, align(sizes[0]), align(sizes[0]) + align(sizes[1])};
  // Two thirds of the experts cold: in one mapped host arena (as the VRAM tier's), the rest in VRAM.
  std::vector<bool> cold(n_expert);
  for (int e = 0; e < n_expert; ++e) cold[e] = e % 3 != 0;
  const uint64_t expert_bytes = offs[2] + align(sizes[2]);
  auto arena = PinnedBuffer::Allocate(n_expert * expert_bytes, cudaHostAllocMapped);
  REQUIRE(arena.ok());
  auto arena_dev_or = arena->device<uint8_t>();
  REQUIRE(arena_dev_or.ok());
  void *arena_dev = *arena_dev_or;
  std::vector<DeviceBuffer> vram;
  std::vector<const void *> tabs[3];
  for (int e = 0; e < n_expert; ++e) {
    const std::vector<uint8_t> *parts[3] = {&x.gate[e], &x.up[e], &x.down[e]};
    for (int m = 0; m < 3; ++m) {
      if (cold[e]) {
        std::memcpy(arena->as<uint8_t>() + e * expert_bytes + offs[m], parts[m]->data(), sizes[m]);
        tabs[m].push_back(static_cast<uint8_t *>(arena_dev) + e * expert_bytes + offs[m]);
      } else {
        vram.push_back(Upload(*parts[m]));
        tabs[m].push_back(vram.back().data());
      }
    }
  }
  DeviceBuffer from_tab[3] = {Upload(tabs[0]), Upload(tabs[1]), Upload(tabs[2])};
  GroupedExperts from;
  from.gate = static_cast<const void *const *>(from_tab[0].data());
  from.up = static_cast<const void *const *>(from_tab[1].data());
  from.down = static_cast<const void *const *>(from_tab[2].data());
  from.gate_shape = from.up_shape = x.GateShape();
  from.down_shape = x.DownShape();
  from.n_expert = n_expert;
  REQUIRE(ExpertStageSlotBytes(from) == expert_bytes);

  const std::vector<int32_t> sel = DistinctSelections(rng, n_tok, k, n_expert);
  const int n_max = static_cast<int>(GroupMaxGroups(n_tok, k, n_expert));
  const int64_t n = n_tok * k;
  DeviceBuffer dsel = Upload(sel), idx = PoisonedInts(2 * n), plan = PoisonedInts(GroupPlanInts(n_tok, k, n_expert));
  REQUIRE(GroupByExpert(dsel.as<int32_t>(), n_tok, k, n_expert, idx.as<int32_t>(), plan.as<int32_t>(), nullptr).ok());
  const DevicePlan dp = ReadPlan(plan, n_max);
  DeviceBuffer dx = Upload(RandomFloats(rng, n_tok * c.n_embd, -2.f, 2.f));
  DeviceBuffer xg = Poisoned(n * x.n_embd);
  REQUIRE(GatherRows(dx.as<float>(), x.n_embd, idx.as<int32_t>(), n, xg.as<float>(), nullptr).ok());
  // The products straight from the mixed placement (cold experts read over the link).
  const auto products = [&](const GroupedExperts &ge) {
    DeviceBuffer hg = Poisoned(n * x.n_ff), yg = Poisoned(n * x.n_embd);
    REQUIRE(GroupedSwiGlu(ge, plan.as<int32_t>(), n_max, xg.as<float>(), hg.as<float>(), nullptr, n_tok).ok());
    REQUIRE(GroupedGemv(ge.down, ge.down_shape, plan.as<int32_t>(), n_max, hg.as<float>(), yg.as<float>(), nullptr,
                        n_tok).ok());
    return GroupedRun{Download<float>(hg, n * x.n_ff), Download<float>(yg, n * x.n_embd)};
  };
  const GroupedRun want = products(from);

  std::vector<uint8_t> skip_host(n_expert, 0);
  int n_cold_groups = 0;
  for (int e : dp.expert) n_cold_groups += cold[e] ? 1 : 0;
  REQUIRE(n_cold_groups >= 3);
  // One cold expert the CPU takes (skipped: not staged), slots fewer than, equal to and more than
  // the cold groups.
  for (int e : dp.expert) {
    if (cold[e]) {
      skip_host[e] = 1;
      break;
    }
  }
  DeviceBuffer skip = Upload(skip_host);
  // The same choice moved by the copy engines: PlanColdCopies posts it, a ColdCopier copies it.
  Stream copy_stream = Stream::Create().value();
  auto copier = ColdCopier::Create(arena->as<uint8_t>(), static_cast<const uint8_t *>(arena_dev),
                                   n_expert * expert_bytes, copy_stream.get());
  REQUIRE(copier.ok());
  // And one that copies each request's number into `done` (as where the driver refuses the
  // stream's own write), on a stream of its own.
  Stream copy_stream2 = Stream::Create().value();
  REQUIRE(SetKnob("STRATA_COLD_COPIES_NUMBER", "copy") == 0);
  auto copier_copying = ColdCopier::Create(arena->as<uint8_t>(), static_cast<const uint8_t *>(arena_dev),
                                           n_expert * expert_bytes, copy_stream2.get());
  REQUIRE(UnsetKnob("STRATA_COLD_COPIES_NUMBER") == 0);
  REQUIRE(copier_copying.ok());
  // n_slots slots in `slots` and the staged tables in `tab` (3 x n_expert entries), over the arena.
  const auto stage_of = [&](DeviceBuffer &slots, int n_slots, DeviceBuffer &tab) {
    ExpertStage st;
    st.slots = slots.as<uint8_t>();
    st.n_slots = n_slots;
    st.slot_bytes = expert_bytes;
    st.gate = tab.as<const void *>();
    st.up = st.gate + n_expert;
    st.down = st.up + n_expert;
    st.host_lo = reinterpret_cast<uintptr_t>(arena_dev);
    st.host_hi = st.host_lo + n_expert * expert_bytes;
    return st;
  };
  struct Run { int n_slots; bool skip; bool copy_engines; bool copied_number = false; };
  std::vector<Run> runs;
  for (bool ce : {false, true}) {
    for (Run r : {Run{2, false, ce}, Run{n_cold_groups, false, ce}, Run{n_cold_groups + 3, false, ce},
                  Run{n_cold_groups, true, ce}}) {
      runs.push_back(r);
    }
  }
  runs.push_back(Run{n_cold_groups, false, true, true});
  runs.push_back(Run{2, true, true, true});
  for (Run r : runs) {
    INFO(r.n_slots << " slots for " << n_cold_groups << " cold groups" << (r.skip ? ", one skipped" : "")
                   << (r.copy_engines ? ", by the copy engines" : "") << (r.copied_number ? ", number copied" : ""));
    ColdCopier &cc = r.copied_number ? **copier_copying : **copier;
    DeviceBuffer slots = DeviceBuffer::Allocate(r.n_slots * expert_bytes).value();
    REQUIRE(cudaMemset(slots.data(), 0xab, r.n_slots * expert_bytes) == cudaSuccess);
    std::vector<const void *> poison(3 * n_expert, reinterpret_cast<const void *>(uintptr_t{0xdead0}));
    DeviceBuffer to_tab = Upload(poison);
    const ExpertStage st = stage_of(slots, r.n_slots, to_tab);
    REQUIRE(CheckExpertStage(from, st).ok());
    const uint8_t *skip_dev = r.skip ? skip.as<uint8_t>() : nullptr;
    if (r.copy_engines) {
      REQUIRE(PlanColdCopies(from, st, plan.as<int32_t>(), n_max, skip_dev, cc.mailbox(), 3, true, nullptr).ok());
      REQUIRE(WaitColdCopies(cc.mailbox(), nullptr).ok());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      REQUIRE(cc.status().ok());
    } else {
      REQUIRE(StageColdExperts(from, st, plan.as<int32_t>(), n_max, skip_dev, nullptr).ok());
    }
    // Which experts take which slot: the cold, unskipped groups in group order.
    std::vector<int> slot_of(n_expert, -1);
    int next = 0;
    for (int e : dp.expert) {
      if (cold[e] && !(r.skip && skip_host[e]) && next < r.n_slots) slot_of[e] = next++;
    }
    const std::vector<const void *> got_tab = Download<const void *>(to_tab, 3 * n_expert);
    const std::vector<uint8_t> got_slots = Download<uint8_t>(slots, r.n_slots * expert_bytes);
    for (int e = 0; e < n_expert; ++e) {
      const std::vector<uint8_t> *parts[3] = {&x.gate[e], &x.up[e], &x.down[e]};
      for (int m = 0; m < 3; ++m) {
        INFO("expert " << e << " matrix " << m << " slot " << slot_of[e]);
        const void *want_ptr = tabs[m][e];
        if (slot_of[e] >= 0) want_ptr = slots.as<uint8_t>() + slot_of[e] * expert_bytes + offs[m];
        CHECK(got_tab[m * n_expert + e] == want_ptr);
        if (slot_of[e] >= 0) {
          CHECK(std::memcmp(got_slots.data() + slot_of[e] * expert_bytes + offs[m], parts[m]->data(), sizes[m]) == 0);
        }
      }
    }
    // Slots no expert took, and the padding after each matrix, keep their poison.
    for (int j = next; j < r.n_slots; ++j) {
      CHECK(std::all_of(got_slots.begin() + j * expert_bytes, got_slots.begin() + (j + 1) * expert_bytes,
                        [](uint8_t b) { return b == 0xab; }));
    }
    for (int j = 0; j < next; ++j) {
      const uint8_t *sl = got_slots.data() + j * expert_bytes;
      CHECK(std::all_of(sl + sizes[0], sl + offs[1], [](uint8_t b) { return b == 0xab; }));
    }
    const GroupedRun got = products(StagedExperts(from, st));
    CHECK(FirstBitDifference(got.h, want.h, c.n_ff, "SwiGLU output") == "");
    CHECK(FirstBitDifference(got.y, want.y, c.n_embd, "down output") == "");
  }

  // A prediction copied ahead (two slots, as a prefetch of the next layer posts it; then slots for
  // every cold group), then the layer's own request from the prediction's tables: it copies only
  // the cold groups the prediction did not hold, and posts no request (no round trip to the host)
  // when it held them all, its wait then waiting for the prediction's copies alone. The products
  // keep their bits, and the counters see both.
  for (const int n_pred : {2, n_cold_groups}) {
    INFO(n_pred << " predicted of " << n_cold_groups << " cold groups");
    DeviceBuffer pf_slots = DeviceBuffer::Allocate(n_pred * expert_bytes).value();
    DeviceBuffer slots = DeviceBuffer::Allocate(n_cold_groups * expert_bytes).value();
    REQUIRE(cudaMemset(pf_slots.data(), 0xab, n_pred * expert_bytes) == cudaSuccess);
    REQUIRE(cudaMemset(slots.data(), 0xab, n_cold_groups * expert_bytes) == cudaSuccess);
    std::vector<const void *> poison(3 * n_expert, reinterpret_cast<const void *>(uintptr_t{0xdead0}));
    DeviceBuffer pf_tab = Upload(poison), to_tab = Upload(poison);
    std::vector<unsigned long long> zeros(4, 0);
    DeviceBuffer counts = Upload(zeros);
    ExpertStage pf = stage_of(pf_slots, n_pred, pf_tab), urgent = stage_of(slots, n_cold_groups, to_tab);
    pf.counts = counts.as<unsigned long long>();
    urgent.counts = pf.counts + 2;
    urgent.hit_lo = reinterpret_cast<uintptr_t>(pf.slots);
    urgent.hit_hi = urgent.hit_lo + n_pred * expert_bytes;
    const ColdMailbox &mb = (*copier)->mailbox();
    const uint32_t served_before = (*copier)->served();
    const uint64_t copied_before = (*copier)->experts_copied();
    REQUIRE(PlanColdCopies(from, pf, plan.as<int32_t>(), n_max, nullptr, mb, 4, false, nullptr).ok());
    const GroupedExperts predicted = StagedExperts(from, pf);
    REQUIRE(PlanColdCopies(predicted, urgent, plan.as<int32_t>(), n_max, nullptr, mb, 4, true, nullptr).ok());
    REQUIRE(WaitColdCopies(mb, nullptr).ok());
    const GroupedRun got = products(StagedExperts(predicted, urgent));
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE((*copier)->status().ok());
    CHECK((*copier)->served() == served_before + (n_pred < n_cold_groups ? 2 : 1));
    CHECK((*copier)->experts_copied() == copied_before + static_cast<uint64_t>(n_cold_groups));
    const std::vector<unsigned long long> got_counts = Download<unsigned long long>(counts, 4);
    CHECK(got_counts[0] == static_cast<unsigned long long>(n_pred));
    CHECK(got_counts[2] == static_cast<unsigned long long>(n_cold_groups - n_pred));
    CHECK(got_counts[3] == static_cast<unsigned long long>(n_pred));
    CHECK(FirstBitDifference(got.h, want.h, c.n_ff, "SwiGLU output") == "");
    CHECK(FirstBitDifference(got.y, want.y, c.n_embd, "down output") == "");
  }
  // The same plans run at the end of the routing's launch (RouteGroupQuantize given a ColdPlan), as
  // a decode step runs them: a layer's own (urgent, its tokens' rows quantized too) and a
  // prediction's (routing alone). From random logits, both ways give the same selections, plan,
  // staged tables, slot bytes, counters and copies.
  for (const bool urgent : {true, false}) {
    INFO((urgent ? "urgent, quantizing" : "a prediction, routing alone"));
    RouteArgs ra;
    ra.n_expert = n_expert;
    ra.k = k;
    ra.norm_topk_prob = true;
    const int64_t n = n_tok * k;
    const Q8Act f = urgent ? Q8Act::kBlock256 : Q8Act::kNone;
    const int64_t xq_bytes = urgent ? n_tok * Q8ActRowBytes(f, x.n_embd) : 0;
    DeviceBuffer logits = Upload(RandomFloats(rng, n_tok * n_expert, -4.f, 4.f));
    const int n_slots = 3;
    struct Way {
      std::vector<int32_t> sel, idx, plan;
      std::vector<float> wts;
      std::vector<uint64_t> tab;  // staged tables, an entry into the run's slots as its offset (top bit set)
      std::vector<uint8_t> slots, xq;
      std::vector<unsigned long long> counts;
      uint32_t served;
      uint64_t copied;
    };
    const auto run = [&](bool fused) {
      DeviceBuffer sel = PoisonedInts(n), wts = Poisoned(n), ix = PoisonedInts(2 * n),
                   pl = PoisonedInts(GroupPlanInts(n_tok, k, n_expert)), xq = Poisoned((xq_bytes + 3) / 4 + 1);
      DeviceBuffer slots = DeviceBuffer::Allocate(n_slots * expert_bytes).value();
      REQUIRE(cudaMemset(slots.data(), 0xab, n_slots * expert_bytes) == cudaSuccess);
      std::vector<const void *> poison(3 * n_expert, reinterpret_cast<const void *>(uintptr_t{0xdead0}));
      std::vector<unsigned long long> zeros(4, 0);
      DeviceBuffer to_tab = Upload(poison), counts = Upload(zeros);
      ExpertStage st = stage_of(slots, n_slots, to_tab);
      st.counts = counts.as<unsigned long long>();
      const ColdMailbox &mb = (*copier)->mailbox();
      const uint32_t served_before = (*copier)->served();
      const uint64_t copied_before = (*copier)->experts_copied();
      if (fused) {
        auto cold = MakeColdPlan(from, st, nullptr, mb, 5, urgent);
        REQUIRE(cold.ok());
        REQUIRE(RouteGroupQuantize(ra, logits.as<float>(), n_tok, sel.as<int32_t>(), wts.as<float>(),
                                   ix.as<int32_t>(), pl.as<int32_t>(), f, dx.as<float>(), x.n_embd,
                                   urgent ? xq.data() : nullptr, nullptr, &*cold).ok());
      } else {
        REQUIRE(Route(ra, logits.as<float>(), n_tok, sel.as<int32_t>(), wts.as<float>(), nullptr).ok());
        REQUIRE(GroupByExpert(sel.as<int32_t>(), n_tok, k, n_expert, ix.as<int32_t>(), pl.as<int32_t>(), nullptr).ok());
        if (urgent) REQUIRE(QuantizeActivationsQ8(f, dx.as<float>(), n_tok, x.n_embd, xq.data(), nullptr).ok());
        REQUIRE(PlanColdCopies(from, st, pl.as<int32_t>(), n_max, nullptr, mb, 5, urgent, nullptr).ok());
      }
      if (!urgent) {  // a prediction's request is waited for by the layer's own plan, here none
        const ExpertStage none = stage_of(slots, 0, to_tab);
        REQUIRE(PlanColdCopies(StagedExperts(from, st), none, pl.as<int32_t>(), n_max, nullptr, mb, 5, true,
                               nullptr).ok());
      }
      REQUIRE(WaitColdCopies(mb, nullptr).ok());
      REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
      REQUIRE((*copier)->status().ok());
      std::vector<int32_t> plan_all = Download<int32_t>(pl, 2 + 2 * n_max);
      std::vector<int32_t> plan_set(plan_all.begin(), plan_all.begin() + 1 + plan_all[0]);  // count, experts
      for (int g = 0; g <= plan_all[0]; ++g) plan_set.push_back(plan_all[1 + n_max + g]);  // first rows
      std::vector<uint64_t> tab;
      const auto lo = reinterpret_cast<uintptr_t>(slots.data()), hi = lo + n_slots * expert_bytes;
      for (const void *e : Download<const void *>(to_tab, 3 * n_expert)) {
        const auto a = reinterpret_cast<uintptr_t>(e);
        tab.push_back(a >= lo && a < hi ? (a - lo) | (uint64_t{1} << 63) : a);
      }
      return Way{Download<int32_t>(sel, n), Download<int32_t>(ix, 2 * n), plan_set, Download<float>(wts, n),
                 tab, Download<uint8_t>(slots, n_slots * expert_bytes),
                 urgent ? Download<uint8_t>(xq, xq_bytes) : std::vector<uint8_t>{},
                 Download<unsigned long long>(counts, 4), (*copier)->served() - served_before,
                 (*copier)->experts_copied() - copied_before};
    };
    const Way three = run(false), one = run(true);
    REQUIRE(three.counts[0] >= 1);  // the routing reached cold experts: there is a plan to compare
    CHECK(one.sel == three.sel);
    CHECK(std::memcmp(one.wts.data(), three.wts.data(), n * sizeof(float)) == 0);
    CHECK(one.idx == three.idx);
    CHECK(one.plan == three.plan);
    CHECK(one.xq == three.xq);
    CHECK(one.tab == three.tab);
    CHECK(std::count_if(one.tab.begin(), one.tab.end(), [](uint64_t e) { return e >> 63 != 0; }) ==
          3 * static_cast<int64_t>(one.counts[0]));
    CHECK(one.counts == three.counts);
    CHECK(one.served == three.served);
    CHECK(one.copied == three.copied);
    CHECK(one.slots == three.slots);
  }
  // A request naming memory outside the arena is refused by the copier (nothing copied), and the
  // device's wait still ends.
  {
    auto small = ColdCopier::Create(arena->as<uint8_t>(), static_cast<const uint8_t *>(arena_dev), expert_bytes,
                                    copy_stream.get());
    REQUIRE(small.ok());
    DeviceBuffer slots = DeviceBuffer::Allocate(n_cold_groups * expert_bytes).value();
    std::vector<const void *> poison(3 * n_expert, reinterpret_cast<const void *>(uintptr_t{0xdead0}));
    DeviceBuffer to_tab = Upload(poison);
    const ExpertStage st = stage_of(slots, n_cold_groups, to_tab);
    REQUIRE(PlanColdCopies(from, st, plan.as<int32_t>(), n_max, nullptr, (*small)->mailbox(), 0, true, nullptr).ok());
    REQUIRE(WaitColdCopies((*small)->mailbox(), nullptr).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(StatusToMoe((*small)->status()) == MOE_ERR_INTERNAL);
  }
  // A wait for a request never posted gives up after its timeout and says so; once one has given
  // up, the next wait that would wait returns at once (a step fails in one timeout, not one a layer).
  {
    auto lone = ColdCopier::Create(arena->as<uint8_t>(), static_cast<const uint8_t *>(arena_dev), expert_bytes,
                                   copy_stream.get());
    REQUIRE(lone.ok());
    ColdMailbox mb = (*lone)->mailbox();
    const uint32_t never = 1000;
    REQUIRE(cudaMemcpy(mb.want, &never, sizeof(never), cudaMemcpyHostToDevice) == cudaSuccess);
    mb.timeout_ns = 20000000;  // 20 ms
    const auto t0 = std::chrono::steady_clock::now();
    REQUIRE(WaitColdCopies(mb, nullptr).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const auto t1 = std::chrono::steady_clock::now();
    CHECK(t1 - t0 >= std::chrono::milliseconds(20));
    CHECK(StatusToMoe((*lone)->status()) == MOE_ERR_INTERNAL);
    mb.timeout_ns = 30000000000;  // 30 s: not waited
    for (int i = 0; i < 4; ++i) REQUIRE(WaitColdCopies(mb, nullptr).ok());
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::seconds(2));
  }

  // Refusals: slots too small for an expert or unaligned, a negative count, a null plan or table, more
  // groups than experts.
  const auto invalid = [](const absl::Status &s) { return StatusToMoe(s) == MOE_ERR_INVALID_ARGUMENT; };
  ExpertStage bad;
  std::vector<const void *> none(3 * n_expert, nullptr);
  DeviceBuffer bad_tab = Upload(none), bad_slots = DeviceBuffer::Allocate(2 * expert_bytes).value();
  bad.gate = bad_tab.as<const void *>();
  bad.up = bad.gate + n_expert;
  bad.down = bad.up + n_expert;
  bad.slots = bad_slots.as<uint8_t>();
  bad.n_slots = 1;
  bad.slot_bytes = expert_bytes - 256;
  CHECK(invalid(StageColdExperts(from, bad, plan.as<int32_t>(), n_max, nullptr, nullptr)));
  CHECK(invalid(CheckExpertStage(from, bad)));  // what the backend asks before taking the path
  bad.slot_bytes = expert_bytes;
  bad.slots = bad_slots.as<uint8_t>() + 16;
  CHECK(invalid(StageColdExperts(from, bad, plan.as<int32_t>(), n_max, nullptr, nullptr)));
  bad.slots = bad_slots.as<uint8_t>();
  CHECK(invalid(StageColdExperts(from, bad, nullptr, n_max, nullptr, nullptr)));
  CHECK(invalid(StageColdExperts(from, bad, plan.as<int32_t>(), n_expert + 1, nullptr, nullptr)));
  bad.n_slots = -1;
  CHECK(invalid(StageColdExperts(from, bad, plan.as<int32_t>(), n_max, nullptr, nullptr)));
  bad.n_slots = 1;
  bad.gate = nullptr;
  CHECK(invalid(StageColdExperts(from, bad, plan.as<int32_t>(), n_max, nullptr, nullptr)));
  bad.gate = bad_tab.as<const void *>();
  CHECK(StageColdExperts(from, bad, plan.as<int32_t>(), 0, nullptr, nullptr).ok());  // no groups: nothing to do
  CHECK(invalid(PlanColdCopies(from, bad, plan.as<int32_t>(), n_max, nullptr, ColdMailbox{}, 0, true, nullptr)));
  CHECK(invalid(WaitColdCopies(ColdMailbox{}, nullptr)));
  bad.slot_bytes = expert_bytes - 256;
  CHECK(invalid(PlanColdCopies(from, bad, plan.as<int32_t>(), n_max, nullptr, (*copier)->mailbox(), 0, true, nullptr)));
}

// The stream's own write of a request's number (ColdCopier) lands only after the copies queued
// before it: a device wait on another stream for the number, then a read of the last bytes copied,
// sees the copied bytes and never the poison (64 MiB take ~1.2 ms over the link, far longer than
// a write that did not wait). Fresh random bytes and a fresh number each run.
TEST_CASE("StreamWriteValue32 writes after the stream's copies before it", "[gpu][grouped]") {
  if (!HaveGpu()) return;
  std::mt19937 rng = test::Rng();
  const size_t bytes = size_t{64} << 20, tail = 4096;
  PinnedBuffer host = PinnedBuffer::Allocate(bytes).value();
  for (size_t i = 0; i < bytes; i += 4) {
    const uint32_t v = rng();
    std::memcpy(host.as<uint8_t>() + i, &v, 4);
  }
  DeviceBuffer dev = DeviceBuffer::Allocate(bytes).value(), counters = DeviceBuffer::Allocate(12).value();
  PinnedBuffer flags = PinnedBuffer::Allocate(3 * sizeof(uint32_t), cudaHostAllocMapped).value();
  std::memset(flags.data(), 0, 3 * sizeof(uint32_t));
  PinnedBuffer seen = PinnedBuffer::Allocate(tail).value();
  std::memset(seen.data(), 0, tail);
  const uint32_t number = 1 + rng() % 1000000;
  ColdMailbox mb;
  mb.next = counters.as<uint32_t>();
  mb.done = mb.next + 1;
  mb.want = mb.next + 2;
  mb.timed_out = flags.device<uint32_t>().value();
  mb.timeout_ns = 5000000000;
  REQUIRE(cudaMemset(counters.data(), 0, 12) == cudaSuccess);
  REQUIRE(cudaMemcpy(mb.want, &number, sizeof(number), cudaMemcpyHostToDevice) == cudaSuccess);
  // Created one after the other, so the driver gives them different hardware queues (cold_copier.h).
  Stream watch = Stream::Create().value(), copies = Stream::Create().value();
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    REQUIRE(cudaMemset(dev.data(), 0xab, bytes) == cudaSuccess);
    REQUIRE(cudaMemset(counters.as<uint32_t>() + 1, 0, sizeof(uint32_t)) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    REQUIRE(WaitColdCopies(mb, watch.get()).ok());
    REQUIRE(cudaMemcpyAsync(seen.data(), dev.as<uint8_t>() + bytes - tail, tail, cudaMemcpyDeviceToHost,
                            watch.get()) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(dev.data(), host.data(), bytes, cudaMemcpyHostToDevice, copies.get()) == cudaSuccess);
    REQUIRE(StreamWriteValue32(counters.as<uint32_t>() + 1, number, copies.get()));
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(static_cast<volatile uint32_t *>(flags.as<uint32_t>())[0] == 0);  // the wait did not give up
    CHECK(std::memcmp(seen.data(), host.as<uint8_t>() + bytes - tail, tail) == 0);
    uint32_t done = 0;
    REQUIRE(cudaMemcpy(&done, mb.done, sizeof(done), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(done == number);
  }
}

TEST_CASE("The grouped launches' grid covers the groups expected of uniform routing", "[gpu][grouped]") {
  CHECK(GroupGridGroups(1, 8, 128) == 8);      // one token: every selection its own group
  CHECK(GroupGridGroups(0, 8, 128) == 0);
  CHECK(GroupGridGroups(16, 8, 128) == 87);  // 128 (1 - (120/128)^16) = 82.4 expected, 5% more
  CHECK(GroupGridGroups(64, 8, 128) == 128);  // 125.9 expected, 5% more: every possible group
  CHECK(GroupGridGroups(4, 2, 8) == 6);       // 8 (1 - (3/4)^4) = 5.5
  // Chunks by the groups' expected size: 1 token, 1.6 (16 sessions), 4.1 (64), Mixtral's 4.0.
  CHECK(GroupChunkTokens(1, 8, 128) == 1);
  CHECK(GroupChunkTokens(16, 8, 128) == 2);
  CHECK(GroupChunkTokens(64, 8, 128) == 4);
  CHECK(GroupChunkTokens(16, 2, 8) == 4);
  CHECK(GroupChunkTokens(3, 2, 8) == 2);
}

TEST_CASE("Grouped launchers refuse bad arguments with a Status", "[gpu][grouped]") {
  // Validation reads no device memory and launches nothing, so this runs without a GPU too.
  const auto invalid = [](const absl::Status &s) { return StatusToMoe(s) == MOE_ERR_INVALID_ARGUMENT; };
  const void *const *tab = reinterpret_cast<const void *const *>(uintptr_t{4096});
  const int32_t *ptr32 = reinterpret_cast<const int32_t *>(uintptr_t{4096});
  int32_t *out32 = reinterpret_cast<int32_t *>(uintptr_t{8192});
  const float *xf = reinterpret_cast<const float *>(uintptr_t{4096});
  float *yf = reinterpret_cast<float *>(uintptr_t{8192});

  CHECK(invalid(GroupByExpert(ptr32, 4, 8, 0, out32, out32, nullptr)));
  CHECK(invalid(GroupByExpert(ptr32, 4, 8, kRouteMaxExperts + 1, out32, out32, nullptr)));
  CHECK(invalid(GroupByExpert(ptr32, 4, 0, 128, out32, out32, nullptr)));
  CHECK(invalid(GroupByExpert(ptr32, -1, 8, 128, out32, out32, nullptr)));
  CHECK(invalid(GroupByExpert(ptr32, int64_t{1} << 28, 8, 128, out32, out32, nullptr)));  // 2^31 selections
  CHECK(invalid(GroupByExpert(nullptr, 4, 8, 128, out32, out32, nullptr)));
  CHECK(GroupByExpert(nullptr, 0, 8, 128, nullptr, nullptr, nullptr).ok());  // no tokens: nothing to do
  CHECK(GroupMaxGroups(1, 8, 128) == 8);
  CHECK(GroupMaxGroups(16, 8, 128) == 128);
  CHECK(GroupMaxGroups(0, 8, 128) == 0);
  CHECK(GroupPlanInts(16, 8, 128) == 258);

  GroupedExperts ge;
  ge.gate = ge.up = ge.down = tab;
  ge.gate_shape = ge.up_shape = {TypeId::kQ4_K, nullptr, 768, 2048, 1152};
  ge.down_shape = {TypeId::kQ6_K, nullptr, 2048, 768, 630};
  ge.n_expert = 128;
  REQUIRE(CheckGroupedExperts(ge).ok());
  {
    GroupedExperts b = ge;
    b.up_shape.type = TypeId::kQ8_0;  // not fusable with a Q4_K gate
    b.up_shape.row_bytes = 2176;
    CHECK(invalid(CheckGroupedExperts(b)));
  }
  {
    GroupedExperts b = ge;
    b.down_shape = {TypeId::kQ6_K, nullptr, 768, 2048, 1680};  // down must be (n_embd, n_ff)
    CHECK(invalid(CheckGroupedExperts(b)));
  }
  {
    GroupedExperts b = ge;
    b.gate_shape.type = b.up_shape.type = TypeId::kQ8_K;  // a GGUF type lib/quant does not decode
    b.gate_shape.row_bytes = b.up_shape.row_bytes = 2336;
    CHECK(StatusToMoe(CheckGroupedExperts(b)) == MOE_ERR_UNSUPPORTED_TYPE);
  }
  {
    GroupedExperts b = ge;
    b.gate_shape.row_bytes = b.up_shape.row_bytes = 1156;  // Q4_K rows must stay 8-byte aligned
    CHECK(invalid(CheckGroupedExperts(b)));
  }
  {
    GroupedExperts b = ge;
    b.down = nullptr;
    CHECK(invalid(CheckGroupedExperts(b)));
    b = ge;
    b.n_expert = 0;
    CHECK(invalid(CheckGroupedExperts(b)));
  }
  CHECK(invalid(GroupedSwiGlu(ge, ptr32, 129, xf, yf, nullptr)));    // more groups than experts
  CHECK(invalid(GroupedSwiGlu(ge, ptr32, -1, xf, yf, nullptr)));
  CHECK(invalid(GroupedSwiGlu(ge, nullptr, 8, xf, yf, nullptr)));
  CHECK(invalid(GroupedSwiGlu(ge, ptr32, 8, xf + 1, yf, nullptr)));  // input not 16-byte aligned
  CHECK(invalid(GroupedSwiGlu(ge, ptr32, 8, xf, nullptr, nullptr)));
  CHECK(GroupedSwiGlu(ge, nullptr, 0, nullptr, nullptr, nullptr).ok());  // no groups: nothing to do
  CHECK(invalid(GroupedGemv(nullptr, ge.down_shape, ptr32, 8, xf, yf, nullptr)));
  CHECK(invalid(GroupedGemv(tab, ge.down_shape, ptr32, 70000, xf, yf, nullptr)));
  CHECK(invalid(GroupedGemv(tab, {TypeId::kQ6_K, nullptr, 2048, 700, 630}, ptr32, 8, xf, yf, nullptr)));
}

}  // namespace
}  // namespace strata::cuda
