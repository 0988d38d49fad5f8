// GgufWriter: what it writes parses back (ParseGguf) to the same metadata, tensor table and bytes;
// offsets honour general.alignment and per-tensor file alignment; failures leave no file behind.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "lib/format/gguf_writer.h"
#include "lib/quant/codec.h"
#include "tests/format/format_test_util.h"

namespace {

using namespace strata::format;
using strata::format::testing::TempDir;

GgufValue Scalar(GgufType t, int64_t i, uint64_t u, double f) {
  GgufValue v;
  v.type = t;
  v.i = i;
  v.u = u;
  v.f = f;
  return v;
}

void CheckSameValue(const std::string &key, const GgufValue &a, const GgufValue &b) {
  INFO("key " << key);
  REQUIRE(a.type == b.type);
  CHECK(a.i == b.i);
  CHECK(a.u == b.u);
  CHECK(a.f == b.f);
  CHECK(a.s == b.s);
  if (a.type == GgufType::kArray) {
    CHECK(a.elem_type == b.elem_type);
    CHECK(a.arr_len == b.arr_len);
    CHECK(a.arr_raw == b.arr_raw);
    CHECK(a.Ints() == b.Ints());
    CHECK(a.Floats() == b.Floats());
    CHECK(a.arr_str == b.arr_str);
  }
}

std::vector<uint8_t> Pattern(uint64_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

std::vector<std::string> Entries(const std::string &dir) {
  std::vector<std::string> out;
  for (const auto &e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("gguf writer round trip: metadata of every type, tensors, bytes", "[pack][gguf_writer]") {
  TempDir dir;
  const std::string path = dir.File("m.gguf");
  std::vector<std::pair<std::string, GgufValue>> kv = {
      {"general.architecture", GgufString("qwen3moe")},
      {"t.u8", Scalar(GgufType::kUint8, 0, 200, 0)},
      {"t.i8", Scalar(GgufType::kInt8, -100, 0, 0)},
      {"t.u16", Scalar(GgufType::kUint16, 0, 60000, 0)},
      {"t.i16", Scalar(GgufType::kInt16, -30000, 0, 0)},
      {"t.u32", GgufUint32(4000000000u)},
      {"t.i32", GgufInt32(-2000000000)},
      {"t.u64", GgufUint64(~uint64_t{0} - 5)},
      {"t.i64", Scalar(GgufType::kInt64, INT64_MIN + 3, 0, 0)},
      {"t.f32", GgufFloat32(1.5e-6f)},
      {"t.f64", Scalar(GgufType::kFloat64, 0, 0, 3.141592653589793)},
      {"t.bool", GgufBool(true)},
      {"t.empty_string", GgufString("")},
      {"t.arr_str", GgufStringArray({"a", "", "ünïcödé", std::string(300, 'x')})},
      {"t.arr_u8", GgufIntArray(GgufType::kUint8, {0, 1, 255})},
      {"t.arr_i16", GgufIntArray(GgufType::kInt16, {-32768, 0, 32767})},
      {"t.arr_u32", GgufIntArray(GgufType::kUint32, {1, 2, 4000000000})},
      {"t.arr_i64", GgufIntArray(GgufType::kInt64, {INT64_MIN, -1, INT64_MAX})},
      {"t.arr_u64", GgufIntArray(GgufType::kUint64, {-1, 0, 7})},  // -1 is 2^64-1
      {"t.arr_bool", GgufIntArray(GgufType::kBool, {1, 0, 1})},
      {"t.arr_f32", GgufFloatArray(GgufType::kFloat32, {0.5, -2.25, 1e10})},
      {"t.arr_f64", GgufFloatArray(GgufType::kFloat64, {1.0 / 3, -0.0})},
      {"t.arr_empty", GgufIntArray(GgufType::kInt32, {})},
  };
  struct T {
    const char *name;
    uint32_t type;
    int n_dims;
    int64_t ne[4];
    uint64_t align;
  };
  const T ts[] = {
      {"a.f32", 0, 1, {3, 1, 1, 1}, 0},           // 12 bytes: the next tensor needs padding
      {"b.q8_0", 8, 2, {64, 3, 1, 1}, 0},         // 3 rows x 2 blocks x 34 = 204 bytes
      {"c.f16.aligned", 1, 3, {32, 2, 2, 1}, 4096},
      {"d.f32.4d", 0, 4, {2, 2, 2, 2}, 0},
  };
  {
    GgufWriter w(path);
    for (const auto &[k, v] : kv) w.SetValue(k, v);
    for (const T &t : ts) REQUIRE(w.AddTensor(t.name, t.type, t.n_dims, t.ne, t.align).ok());
    REQUIRE(w.Begin().ok());
    // Feed the data in odd chunk sizes across tensor boundaries.
    std::vector<uint8_t> all;
    for (size_t i = 0; i < w.tensors().size(); ++i) {
      auto p = Pattern(w.tensors()[i].nbytes, static_cast<uint8_t>(i * 31));
      all.insert(all.end(), p.begin(), p.end());
    }
    for (size_t at = 0; at < all.size(); at += 37) {
      REQUIRE(w.Write(all.data() + at, std::min<size_t>(37, all.size() - at)).ok());
    }
    CHECK(w.Write(all.data(), 1).code() != absl::StatusCode::kOk);  // beyond the last tensor
    auto st = w.Finish();
    INFO(st.message());
    REQUIRE(st.ok());
  }
  CHECK(Entries(dir.path()) == std::vector<std::string>{"m.gguf"});

  auto file = File::Open(path);
  REQUIRE(file.ok());
  auto g = ParseGguf(**file);
  INFO(g.status().message());
  REQUIRE(g.ok());
  CHECK(g->version == 3);
  CHECK(g->alignment == 32);
  REQUIRE(g->kv.size() == kv.size() + 1);
  CHECK(g->kv[0].first == "general.alignment");
  CHECK(g->kv[0].second.u == 32);
  for (size_t i = 0; i < kv.size(); ++i) {
    CHECK(g->kv[i + 1].first == kv[i].first);
    CheckSameValue(kv[i].first, g->kv[i + 1].second, kv[i].second);
  }
  REQUIRE(g->tensors.size() == std::size(ts));
  for (size_t i = 0; i < std::size(ts); ++i) {
    const GgufTensorInfo &t = g->tensors[i];
    INFO(t.name);
    CHECK(t.name == ts[i].name);
    CHECK(t.type == ts[i].type);
    CHECK(t.n_dims == ts[i].n_dims);
    for (int d = 0; d < 4; ++d) CHECK(t.ne[d] == ts[i].ne[d]);
    CHECK((t.offset - g->data_offset) % 32 == 0);
    if (ts[i].align) CHECK(t.offset % ts[i].align == 0);
    std::vector<uint8_t> got(t.nbytes);
    REQUIRE((*file)->ReadAt(t.offset, got.data(), got.size()).ok());
    CHECK(got == Pattern(t.nbytes, static_cast<uint8_t>(i * 31)));
  }
  CHECK(g->file_size % 32 == 0);
}

TEST_CASE("gguf writer: zero tensors, and an unfinished writer leaves nothing", "[pack][gguf_writer]") {
  TempDir dir;
  {
    GgufWriter w(dir.File("empty.gguf"));
    w.SetValue("general.architecture", GgufString("x"));
    REQUIRE(w.Begin().ok());
    REQUIRE(w.Finish().ok());
  }
  auto file = File::Open(dir.File("empty.gguf"));
  REQUIRE(file.ok());
  auto g = ParseGguf(**file);
  REQUIRE(g.ok());
  CHECK(g->tensors.empty());
  {
    GgufWriter w(dir.File("partial.gguf"));
    const int64_t ne[4] = {4, 1, 1, 1};
    REQUIRE(w.AddTensor("t", 0, 1, ne).ok());
    REQUIRE(w.Begin().ok());
    CHECK(std::filesystem::exists(w.temp_path()));
    REQUIRE(w.Write("abcd", 4).ok());
    auto st = w.Finish();  // 4 of 16 bytes
    CHECK(strata::StatusToMoe(st) == MOE_ERR_STATE);
  }
  CHECK(Entries(dir.path()) == std::vector<std::string>{"empty.gguf"});
}

TEST_CASE("gguf writer rejects bad tensors", "[pack][gguf_writer]") {
  TempDir dir;
  GgufWriter w(dir.File("x.gguf"));
  const int64_t ok[4] = {32, 2, 1, 1}, odd[4] = {33, 1, 1, 1}, zero[4] = {0, 1, 1, 1};
  REQUIRE(w.AddTensor("a", 8, 2, ok).ok());
  CHECK(strata::StatusToMoe(w.AddTensor("a", 8, 2, ok).status()) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(strata::StatusToMoe(w.AddTensor("b", 8, 1, odd).status()) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(strata::StatusToMoe(w.AddTensor("c", 0, 1, zero).status()) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(strata::StatusToMoe(w.AddTensor("d", 0, 5, ok).status()) == MOE_ERR_INVALID_ARGUMENT);
  CHECK(strata::StatusToMoe(w.AddTensor("e", 0, 1, ok, 48).status()) == MOE_ERR_INVALID_ARGUMENT);
}

TEST_CASE("gguf writer: write failures are MOE_ERR_IO_WRITE naming the file, temp removed", "[pack][gguf_writer]") {
  TempDir dir;
  SECTION("directory does not exist") {
    const std::string path = dir.File("missing/m.gguf");
    GgufWriter w(path);
    auto st = w.Begin();
    CHECK(strata::StatusToMoe(st) == MOE_ERR_IO_WRITE);
    CHECK(std::string(st.message()).find(path) != std::string::npos);
  }
  SECTION("file size limit (stands in for ENOSPC)") {
    const std::string path = dir.File("big.gguf");
    struct rlimit old;
    REQUIRE(getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 64 * 1024;
    REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
    absl::Status st;
    {
      GgufWriter w(path);
      const int64_t ne[4] = {1 << 20, 1, 1, 1};  // 4 MiB of F32
      REQUIRE(w.AddTensor("t", 0, 1, ne).ok());
      st = w.Begin();
      std::vector<uint8_t> data(4 << 20, 1);
      if (st.ok()) st = w.Write(data.data(), data.size());
      if (st.ok()) st = w.Finish();
    }
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    CHECK(strata::StatusToMoe(st) == MOE_ERR_IO_WRITE);
    CHECK(std::string(st.message()).find(path) != std::string::npos);
  }
  CHECK(Entries(dir.path()).empty());
}
