// The expert table's slot layout under a view alignment: over a checkpoint whose expert tensors start
// anywhere (a safetensors header of any length, odd tensors between them) every part lands 32-byte
// aligned and within its slot, a RAM tier over it serves aligned views holding the file's bytes,
// moved parts through the page cache and the rest past it; GGUF files are laid out as with no
// alignment asked, which keeps each part's place in its 4 KiB block.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "lib/model/model_file.h"
#include "lib/model/pack.h"
#include "lib/runtime/context.h"
#include "lib/store/expert_cache.h"
#include "lib/store/expert_table.h"
#include "tests/format/format_test_util.h"
#include "tests/model/golden_util.h"

namespace {

using strata::runtime::Context;
using strata::store::CacheOptions;
using strata::store::ExpertCache;
using strata::store::ExpertEntry;
using strata::store::ExpertPart;
using strata::store::ExpertTable;
using strata::store::kDirectBlock;
using strata::testing::kGolden;

constexpr uint64_t kAlign = 32;  // the CUDA backend's host_view_alignment

uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

// How an expert's three tensors lie in the checkpoint, by expert index modulo 5. Residues are
// modulo 32 unless said; "r" is a random nonzero multiple of 4.
enum Scheme {
  kAdjacentUnaligned = 0,  // gate at r, up and down right after it: one read at any alignment
  kAdjacentGap = 1,        // gate at 0, up at r, down right after: one read only with no alignment
  kApartMixed = 2,         // down at r, gate at 0, up at r': part by part, gate past the page cache
  kApartAligned = 3,       // down, gate, up at 0: part by part, all past the page cache
  kAdjacentBlock = 4,      // gate on a 4 KiB boundary, up and down right after: one direct read
};
Scheme SchemeOf(int expert) { return static_cast<Scheme>(expert % 5); }

// A copy of the golden Qwen3-MoE checkpoint with fresh random values, its experts laid out by
// SchemeOf between small padding tensors the model does not use, the data section starting on a
// 4 KiB boundary (the header padded with spaces) so residues are those chosen.
struct UnalignedCheckpoint {
  strata::format::testing::TempDir tmp;
  std::string dir;
  std::map<std::string, uint64_t> offset;  // tensor name -> absolute offset in model.safetensors
  uint32_t seed = 0;

  UnalignedCheckpoint() : dir(tmp.path()) {
    namespace fs = std::filesystem;
    const std::string golden = kGolden + "qwen3moe_f32/hf";
    fs::copy_file(golden + "/config.json", dir + "/config.json");
    auto mf = strata::model::ModelFile::Open(golden);
    REQUIRE(mf.ok());
    seed = std::random_device{}();
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    std::uniform_int_distribution<uint64_t> residue(1, 7);  // x 4 bytes

    struct Placed {
      std::string name;
      std::vector<int64_t> shape;
      uint64_t begin, bytes;
    };
    std::vector<Placed> placed;
    uint64_t at = 0;  // in the data section
    int n_pads = 0;
    // Places `name` at the next offset that is `want` modulo `modulus`, after a padding tensor.
    auto place = [&](const strata::model::TensorRef &t, uint64_t want, uint64_t modulus) {
      REQUIRE(t.type == 0);  // F32: every offset stays a multiple of 4
      const uint64_t pad = (want + modulus - at % modulus) % modulus;
      if (pad > 0) {
        placed.push_back({"strata_test.pad." + std::to_string(n_pads++), {static_cast<int64_t>(pad / 4)}, at, pad});
        at += pad;
      }
      std::vector<int64_t> shape(t.ne, t.ne + t.n_dims);
      std::reverse(shape.begin(), shape.end());  // safetensors: outermost first
      placed.push_back({t.name, shape, at, t.nbytes});
      at += t.nbytes;
    };
    auto next = [&](const strata::model::TensorRef &t) { place(t, at % kAlign, kAlign); };
    auto unaligned = [&] { return 4 * residue(rng); };

    const int n_layers = (*mf)->config()["num_hidden_layers"].get<int>();
    const int n_experts = (*mf)->config()["num_local_experts"].get<int>();
    auto part = [&](int l, int e, const char *p) -> const strata::model::TensorRef & {
      const auto *t = (*mf)->Find("model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + "." + p +
                                  "_proj.weight");
      REQUIRE(t != nullptr);
      return *t;
    };
    for (const auto &t : (*mf)->tensors()) {
      if (t.name.find(".mlp.experts.") == std::string::npos) next(t);
    }
    for (int l = 0; l < n_layers; ++l) {
      for (int e = 0; e < n_experts; ++e) {
        const auto &g = part(l, e, "gate"), &u = part(l, e, "up"), &d = part(l, e, "down");
        switch (SchemeOf(e)) {
          case kAdjacentUnaligned:
            place(g, unaligned(), kAlign);
            next(u);
            next(d);
            break;
          case kAdjacentGap:
            place(g, 0, kAlign);
            place(u, unaligned(), kAlign);
            next(d);
            break;
          case kApartMixed:
            place(d, unaligned(), kAlign);
            place(g, 0, kAlign);
            place(u, unaligned(), kAlign);
            break;
          case kApartAligned:
            place(d, 0, kAlign);
            place(g, 0, kAlign);
            place(u, 0, kAlign);
            break;
          case kAdjacentBlock:
            place(g, 0, kDirectBlock);
            next(u);
            next(d);
            break;
        }
      }
    }

    std::vector<strata::format::testing::StTensor> st;
    for (const Placed &p : placed) st.push_back({p.name, "F32", p.shape, p.begin, p.begin + p.bytes});
    std::string header = strata::format::testing::SafetensorsHeader(st);
    header.resize(RoundUp(8 + header.size(), kDirectBlock) - 8, ' ');
    const uint64_t data_start = 8 + header.size();
    std::string bytes = strata::format::testing::Bytes().U64(header.size()).Raw(header).b;
    bytes.resize(data_start + at);
    for (uint64_t i = data_start; i < bytes.size(); i += 4) {
      const float v = value(rng);
      std::memcpy(&bytes[i], &v, 4);
    }
    strata::format::testing::WriteFile(dir + "/model.safetensors", bytes);
    for (const Placed &p : placed) offset[p.name] = data_start + p.begin;
  }
};

// Every part lies inside its slot, apart from the others, its region covering its direct read; a
// part past the page cache keeps its file offset's place in a 4 KiB block.
void CheckFitsSlots(const ExpertTable &t) {
  for (int l = 0; l < t.n_layers(); ++l) {
    CHECK(t.layer_slot_bytes(l) <= t.slot_bytes());
    for (int e = 0; e < t.n_experts(); ++e) {
      const ExpertEntry &en = t.entry(l, e);
      if (en.weights == nullptr) continue;
      INFO("layer " << l << " expert " << e);
      CHECK(en.slot_bytes <= t.layer_slot_bytes(l));
      CHECK(en.bytes == en.part[0].bytes + en.part[1].bytes + en.part[2].bytes);
      if (en.single_read && en.part[0].direct_ok) CHECK(RoundUp(en.slot_bytes, kDirectBlock) <= t.slot_bytes());
      for (int p = 0; p < 3; ++p) {
        const ExpertPart &a = en.part[p];
        CHECK(a.slot_offset % t.view_alignment() == 0);
        CHECK(a.slot_offset + a.bytes <= en.slot_bytes);
        if (a.direct_ok) {
          CHECK(a.slot_offset % kDirectBlock == a.file_offset % kDirectBlock);
          if (!en.single_read) {
            const uint64_t head = a.file_offset % kDirectBlock;
            CHECK(a.slot_offset - head + RoundUp(head + a.bytes, kDirectBlock) <= en.slot_bytes);
          }
        }
        if (en.single_read) CHECK(a.direct_ok == en.part[0].direct_ok);
        for (int q = p + 1; q < 3; ++q) {
          const ExpertPart &b = en.part[q];
          CHECK((a.slot_offset + a.bytes <= b.slot_offset || b.slot_offset + b.bytes <= a.slot_offset));
        }
      }
    }
  }
}

// The layout with no view alignment, written out from the file offsets: read as one (in order, in
// one file, gaps of padding), each part at its offset from the gate's, direct when the gate starts
// on a 4 KiB boundary; else each part in a 4 KiB region of its own at its place in a 4 KiB block.
void CheckUnalignedLayout(const ExpertTable &t) {
  CHECK(t.view_alignment() == 1);
  for (int l = 0; l < t.n_layers(); ++l) {
    for (int e = 0; e < t.n_experts(); ++e) {
      const ExpertEntry &en = t.entry(l, e);
      if (en.weights == nullptr) continue;
      INFO("layer " << l << " expert " << e);
      const ExpertPart &g = en.part[0], &u = en.part[1], &d = en.part[2];
      const bool one = g.file_index == u.file_index && u.file_index == d.file_index &&
                       g.file_offset + g.bytes <= u.file_offset && u.file_offset + u.bytes <= d.file_offset &&
                       d.file_offset + d.bytes - g.file_offset <= en.bytes + 3 * 4096;
      REQUIRE(en.single_read == one);
      uint64_t packed = 0;
      for (const ExpertPart &p : en.part) {
        if (one) {
          CHECK(p.slot_offset == p.file_offset - g.file_offset);
          CHECK(p.direct_ok == (g.file_offset % kDirectBlock == 0));
        } else {
          CHECK(p.slot_offset == packed + p.file_offset % kDirectBlock);
          CHECK(p.direct_ok);
          packed += RoundUp(p.file_offset % kDirectBlock + p.bytes, kDirectBlock);
        }
      }
      CHECK(en.slot_bytes == (one ? d.file_offset + d.bytes - g.file_offset : packed));
      if (one) CHECK(en.read_offset == g.file_offset);
    }
  }
}

bool SameLayout(const ExpertTable &a, const ExpertTable &b) {
  if (a.n_layers() != b.n_layers() || a.n_experts() != b.n_experts() || a.slot_bytes() != b.slot_bytes()) return false;
  for (int l = 0; l < a.n_layers(); ++l) {
    if (a.layer_slot_bytes(l) != b.layer_slot_bytes(l)) return false;
    for (int e = 0; e < a.n_experts(); ++e) {
      const ExpertEntry &x = a.entry(l, e), &y = b.entry(l, e);
      if (x.single_read != y.single_read || x.read_offset != y.read_offset || x.slot_bytes != y.slot_bytes ||
          x.bytes != y.bytes) {
        return false;
      }
      for (int p = 0; p < 3; ++p) {
        const ExpertPart &s = x.part[p], &r = y.part[p];
        if (s.file_index != r.file_index || s.file_offset != r.file_offset || s.bytes != r.bytes ||
            s.slot_offset != r.slot_offset || s.direct_ok != r.direct_ok) {
          return false;
        }
      }
    }
  }
  return true;
}

Context::Described Describe(const std::string &path) {
  auto d = Context::Describe(path);
  INFO(path << ": " << d.status().ToString());
  REQUIRE(d.ok());
  return std::move(*d);
}

}  // namespace

TEST_CASE("expert table: unaligned safetensors experts land view-aligned in their slots", "[store][table]") {
  UnalignedCheckpoint ck;
  CAPTURE(ck.seed);
  const Context::Described d = Describe(ck.dir);
  const ExpertTable t(d.weights, kAlign), t1(d.weights);
  REQUIRE(t.view_alignment() == kAlign);
  REQUIRE(t.n_experts() == 8);
  CheckFitsSlots(t);
  CheckFitsSlots(t1);
  CheckUnalignedLayout(t1);
  for (int l = 0; l < t.n_layers(); ++l) {
    for (int e = 0; e < t.n_experts(); ++e) {
      INFO("layer " << l << " expert " << e << " scheme " << SchemeOf(e));
      const ExpertEntry &en = t.entry(l, e), &en1 = t1.entry(l, e);
      // The table's file offsets are the ones written.
      const char *names[3] = {"gate", "up", "down"};
      for (int p = 0; p < 3; ++p) {
        CHECK(en.part[p].file_offset == ck.offset.at("model.layers." + std::to_string(l) + ".mlp.experts." +
                                                     std::to_string(e) + "." + names[p] + "_proj.weight"));
      }
      const bool gate_direct = en.part[0].direct_ok, up_direct = en.part[1].direct_ok,
                 down_direct = en.part[2].direct_ok;
      switch (SchemeOf(e)) {
        case kAdjacentUnaligned:
          CHECK(en.single_read);
          CHECK(en.part[0].file_offset % kAlign != 0);
          CHECK_FALSE((gate_direct || up_direct || down_direct));
          break;
        case kAdjacentGap:
          CHECK(en1.single_read);
          CHECK_FALSE(en.single_read);
          CHECK(gate_direct);
          CHECK_FALSE((up_direct || down_direct));
          break;
        case kApartMixed:
          CHECK_FALSE(en.single_read);
          CHECK(gate_direct);
          CHECK_FALSE((up_direct || down_direct));
          break;
        case kApartAligned:
          CHECK_FALSE(en.single_read);
          CHECK((gate_direct && up_direct && down_direct));
          break;
        case kAdjacentBlock:
          CHECK(en.single_read);
          CHECK(en.read_offset % kDirectBlock == 0);
          CHECK((gate_direct && up_direct && down_direct));
          break;
      }
      // Parts already aligned, and single reads kept, are laid out as with no alignment asked.
      if (en.single_read) {
        CHECK(en.slot_bytes == en1.slot_bytes);
        for (int p = 0; p < 3; ++p) CHECK(en.part[p].slot_offset == en1.part[p].slot_offset);
      }
      for (int p = 0; p < 3; ++p) {
        if (en.part[p].direct_ok && !en1.single_read) {
          CHECK(en.part[p].slot_offset % kDirectBlock == en1.part[p].slot_offset % kDirectBlock);
        }
      }
    }
  }
}

TEST_CASE("expert cache: unaligned experts are served aligned, holding the file's bytes", "[store][table][direct]") {
  UnalignedCheckpoint ck;
  CAPTURE(ck.seed);
  const Context::Described d = Describe(ck.dir);
  const ExpertTable t(d.weights, kAlign);
  std::ifstream in(ck.dir + "/model.safetensors", std::ios::binary);
  const std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(!file.empty());
  // Whether the file's filesystem takes O_DIRECT (the cache falls back to the page cache if not).
  const int probe = ::open((ck.dir + "/model.safetensors").c_str(), O_RDONLY | O_DIRECT);
  const bool have_direct = probe >= 0;
  if (probe >= 0) ::close(probe);
  uint64_t all_direct = 0;  // experts the table reads past the page cache whole
  for (int l = 0; l < t.n_layers(); ++l) {
    for (int e = 0; e < t.n_experts(); ++e) {
      const ExpertEntry &en = t.entry(l, e);
      all_direct += en.part[0].direct_ok && en.part[1].direct_ok && en.part[2].direct_ok;
    }
  }
  REQUIRE(all_direct > 0);

  for (bool direct_io : {true, false}) {
    INFO("direct_io " << direct_io);
    CacheOptions co;
    co.n_slots = static_cast<uint32_t>(t.n_experts());  // one layer: each layer's loads reuse the slots
    co.prefetch_distance = 0;
    co.lock_memory = false;
    co.direct_io = direct_io;
    auto cache = ExpertCache::Create(t, *d.file, d.weights, nullptr, co);
    INFO(cache.status().ToString());
    REQUIRE(cache.ok());
    for (int l = 0; l < t.n_layers(); ++l) {
      std::vector<int32_t> experts(t.n_experts());
      for (int e = 0; e < t.n_experts(); ++e) experts[e] = e;
      std::vector<const strata::model::ExpertWeights *> out;
      REQUIRE((*cache)->Acquire(l, experts, &out).ok());
      REQUIRE(out.size() == experts.size());
      for (int e = 0; e < t.n_experts(); ++e) {
        const strata::model::Matrix *m[3] = {&out[e]->gate, &out[e]->up, &out[e]->down};
        for (int p = 0; p < 3; ++p) {
          INFO("layer " << l << " expert " << e << " part " << p << " scheme " << SchemeOf(e));
          CHECK(reinterpret_cast<uintptr_t>(m[p]->data) % kAlign == 0);
          const uint64_t at = ck.offset.at(m[p]->name), n = m[p]->nbytes();
          REQUIRE(at + n <= file.size());
          CHECK(std::memcmp(m[p]->data, file.data() + at, n) == 0);
        }
      }
      (*cache)->Release(l, experts);
    }
    const auto s = (*cache)->stats();
    CHECK(s.load_errors == 0);
    CHECK(s.direct_reads == (direct_io && have_direct ? all_direct : 0));
  }
}

TEST_CASE("expert table: a GGUF's layout is the same whatever the view alignment", "[store][table]") {
  SECTION("stacked expert tensors: part by part, each at its place in a 4 KiB block") {
    const Context::Described d = Describe(kGolden + "qwen3moe_f32/model-q8_0.gguf");
    const ExpertTable t(d.weights, kAlign), t1(d.weights);
    CheckUnalignedLayout(t1);
    CheckFitsSlots(t);
    CHECK(SameLayout(t, t1));
    CHECK_FALSE(t1.entry(1, 5).single_read);
  }
  SECTION("packed experts: one direct read each") {
    strata::format::testing::TempDir tmp;
    const std::string packed = tmp.File("packed.gguf");
    strata::model::PackOptions o;
    o.layout = strata::model::ExpertLayout::kExpertContiguous;
    o.experts = strata::quant::TypeId::kQ4_K;  // the mixed golden's rows are multiples of 256
    o.attention = strata::quant::TypeId::kQ8_0;
    REQUIRE(strata::model::Pack(kGolden + "qwen3moe_mixed/model-mixed.gguf", packed, o).ok());
    const Context::Described d = Describe(packed);
    const ExpertTable t(d.weights, kAlign), t1(d.weights);
    CheckUnalignedLayout(t1);
    CheckFitsSlots(t);
    CHECK(SameLayout(t, t1));
    CHECK(t1.entry(1, 5).single_read);
    CHECK(t1.entry(1, 5).part[0].direct_ok);
  }
  SECTION("an alignment that is not a power of two, or past a 4 KiB block") {
    const Context::Described d = Describe(kGolden + "qwen3moe_f32/model-q8_0.gguf");
    CHECK(ExpertTable(d.weights, 0).view_alignment() == 1);
    CHECK(ExpertTable(d.weights, 24).view_alignment() == 32);
    CHECK(ExpertTable(d.weights, 1 << 20).view_alignment() == kDirectBlock);
  }
}
