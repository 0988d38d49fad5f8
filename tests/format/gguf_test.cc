// GGUF parser tests: a valid file round-trips (values, tensors, offsets, strides); every prefix of a
// valid file fails cleanly; each malformed case, written to disk and opened through File, fails with
// its exact status and a message naming the problem; the header is read in small chunks.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>

#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "tests/format/format_test_util.h"
#include "tests/util/alloc_hook.h"

namespace strata::format {
namespace {

using testing::Bytes;
using testing::GgufWriter;
using testing::TempDir;

// Parses `bytes` twice, from a file on disk through File and from memory, and checks both agree.
absl::StatusOr<GgufFile> ParseBytes(const std::string &bytes, const GgufLimits &limits = {}) {
  TempDir dir;
  std::string path = dir.File("model.gguf");
  testing::WriteFile(path, bytes);
  auto file = File::Open(path);
  REQUIRE(file.ok());
  absl::StatusOr<GgufFile> from_file = ParseGguf(**file, limits);
  MemorySource mem(bytes.data(), bytes.size(), path);
  absl::StatusOr<GgufFile> from_mem = ParseGguf(mem, limits);
  CHECK(StatusToMoe(from_file.status()) == StatusToMoe(from_mem.status()));
  CHECK(from_file.status().message() == from_mem.status().message());
  return from_file;
}

void ExpectError(const std::string &bytes, moe_status code, const std::string &word,
                 const GgufLimits &limits = {}) {
  absl::StatusOr<GgufFile> r = ParseBytes(bytes, limits);
  REQUIRE_FALSE(r.ok());
  INFO("message: " << r.status().message());
  CHECK(StatusToMoe(r.status()) == code);
  CHECK(std::string(r.status().message()).find(word) != std::string::npos);
  // Every error names the file it is about.
  CHECK(std::string(r.status().message()).find("model.gguf") != std::string::npos);
}

// A small valid file: scalars of every type, arrays, and three tensors of three types.
GgufWriter ValidWriter() {
  GgufWriter w;
  w.KvStr("general.architecture", "qwen3moe")
      .KvU32("test.u32", 7)
      .KvI32("test.neg", -5)
      .KvF32("test.f32", 0.5f)
      .KvBool("test.bool", true)
      .KvU64("test.u64", 1ull << 40)
      .KvRaw("test.u8", testing::kU8, Bytes().U8(200).b)
      .KvRaw("test.i8", testing::kI8, Bytes().U8(0xff).b)
      .KvRaw("test.u16", testing::kU16, Bytes().U16(60000).b)
      .KvRaw("test.i16", testing::kI16, Bytes().U16(0x8000).b)
      .KvRaw("test.i64", testing::kI64, Bytes().I64(-(1ll << 50)).b)
      .KvRaw("test.f64", testing::kF64v, Bytes().F64(2.25).b)
      .KvStrArr("tokenizer.ggml.tokens", {"a", "bc", ""})
      .KvI32Arr("test.i32_arr", {1, -2, 3})
      .KvF32Arr("test.f32_arr", {0.25f, 1.5f});
  w.AddTensor("tok_embd", {4, 3}, testing::kTF32);
  w.AddTensor("blk.0.ffn_up_exps", {64, 2, 3}, testing::kTQ8_0);
  w.AddTensor("norm", {8}, testing::kTF16);
  return w;
}

TEST_CASE("gguf: a valid v3 file parses with its values, tensors and offsets", "[format][gguf]") {
  GgufWriter w = ValidWriter();
  std::string bytes = w.Build();
  TempDir dir;
  testing::WriteFile(dir.File("m.gguf"), bytes);
  auto file = File::Open(dir.File("m.gguf"));
  REQUIRE(file.ok());
  auto r = ParseGguf(**file);
  REQUIRE(r.ok());
  const GgufFile &g = *r;
  CHECK(g.version == 3);
  CHECK(g.alignment == 32);
  CHECK(g.file_size == bytes.size());
  CHECK(g.data_offset == (w.header_bytes + 31) / 32 * 32);
  REQUIRE(g.kv.size() == 15);
  CHECK(g.kv[0].first == "general.architecture");
  CHECK(*g.GetString("general.architecture") == "qwen3moe");
  CHECK(*g.GetUint("test.u32") == 7);
  CHECK(g.Find("test.neg")->i == -5);
  CHECK(*g.GetFloat("test.neg") == -5.0);
  CHECK(*g.GetFloat("test.f32") == 0.5);
  CHECK(*g.GetBool("test.bool") == true);
  CHECK(*g.GetUint("test.u64") == (1ull << 40));
  CHECK(*g.GetUint("test.u8") == 200);
  CHECK(g.Find("test.i8")->i == -1);
  CHECK(*g.GetUint("test.u16") == 60000);
  CHECK(g.Find("test.i16")->i == -32768);
  CHECK(g.Find("test.i64")->i == -(1ll << 50));
  CHECK(*g.GetFloat("test.f64") == 2.25);

  const GgufValue *tokens = g.Find("tokenizer.ggml.tokens");
  REQUIRE(tokens != nullptr);
  CHECK(tokens->type == GgufType::kArray);
  CHECK(tokens->elem_type == GgufType::kString);
  CHECK(tokens->arr_len == 3);
  CHECK(tokens->arr_str == std::vector<std::string>{"a", "bc", ""});
  const GgufValue *ints = g.Find("test.i32_arr");
  CHECK(ints->IsIntArray());
  CHECK_FALSE(ints->IsFloatArray());
  CHECK(ints->Ints() == std::vector<int64_t>{1, -2, 3});
  CHECK(ints->Floats() == std::vector<double>{1, -2, 3});
  CHECK(ints->arr_raw.size() == 3 * 4);  // int32 elements at their own width
  const GgufValue *floats = g.Find("test.f32_arr");
  CHECK(floats->IsFloatArray());
  CHECK_FALSE(floats->IsIntArray());
  CHECK(floats->Floats() == std::vector<double>{0.25, 1.5});
  CHECK(floats->Ints().empty());

  REQUIRE(g.tensors.size() == 3);
  const GgufTensorInfo *emb = g.FindTensor("tok_embd");
  REQUIRE(emb != nullptr);
  CHECK(emb->n_dims == 2);
  CHECK(emb->ne[0] == 4);
  CHECK(emb->ne[1] == 3);
  CHECK(emb->ne[2] == 1);
  CHECK(emb->nbytes == 48);
  CHECK(emb->nb[0] == 4);
  CHECK(emb->nb[1] == 16);
  CHECK(emb->offset == g.data_offset);

  const GgufTensorInfo *exps = g.FindTensor("blk.0.ffn_up_exps");
  REQUIRE(exps != nullptr);
  CHECK(exps->type == 8);
  CHECK(exps->n_dims == 3);
  CHECK(exps->nb[0] == 34);
  CHECK(exps->nb[1] == 68);
  CHECK(exps->nb[2] == 136);
  CHECK(exps->nb[3] == 408);
  CHECK(exps->nbytes == 408);
  CHECK(exps->offset == g.data_offset + 64);

  const GgufTensorInfo *norm = g.FindTensor("norm");
  CHECK(norm->nbytes == 16);
  CHECK(norm->offset == g.data_offset + 480);
  CHECK(g.FindTensor("missing") == nullptr);
  CHECK(g.Find("missing") == nullptr);

  // The offsets point at the bytes the writer put there.
  uint8_t first = 0;
  REQUIRE((*file)->ReadAt(exps->offset, &first, 1).ok());
  CHECK(first == static_cast<uint8_t>(64 * 7 + 1));
}

TEST_CASE("gguf: v2 with general.alignment parses and honours the alignment", "[format][gguf]") {
  GgufWriter w;
  w.version = 2;
  w.alignment = 256;
  w.KvU32("general.alignment", 256);
  w.AddTensor("a", {10}, testing::kTF32);
  w.AddTensor("b", {256}, testing::kTQ4_K);
  auto r = ParseBytes(w.Build());
  REQUIRE(r.ok());
  CHECK(r->version == 2);
  CHECK(r->alignment == 256);
  CHECK(r->data_offset % 256 == 0);
  CHECK(r->FindTensor("b")->offset == r->data_offset + 256);
  CHECK(r->FindTensor("b")->nbytes == 144);
}

TEST_CASE("gguf: a file without tensors or keys parses", "[format][gguf]") {
  GgufWriter w;
  auto r = ParseBytes(w.Build());
  REQUIRE(r.ok());
  CHECK(r->kv.empty());
  CHECK(r->tensors.empty());
}

TEST_CASE("gguf: typed getters convert what fits and refuse the rest", "[format][gguf]") {
  GgufWriter w;
  w.KvI32("neg", -1).KvI32("pos", 12).KvStr("s", "x").KvF32("f", 1.5f).KvBool("b", false);
  auto r = ParseBytes(w.Build());
  REQUIRE(r.ok());
  CHECK(*r->GetUint("pos") == 12);
  CHECK(StatusToMoe(r->GetUint("neg").status()) == MOE_ERR_FORMAT_HPARAMS);
  CHECK(StatusToMoe(r->GetUint("s").status()) == MOE_ERR_FORMAT_HPARAMS);
  CHECK(StatusToMoe(r->GetUint("f").status()) == MOE_ERR_FORMAT_HPARAMS);
  CHECK(StatusToMoe(r->GetUint("absent").status()) == MOE_ERR_FORMAT_HPARAMS);
  CHECK(std::string(r->GetUint("absent").status().message()).find("absent") != std::string::npos);
  CHECK(StatusToMoe(r->GetFloat("s").status()) == MOE_ERR_FORMAT_HPARAMS);
  CHECK(*r->GetFloat("pos") == 12.0);
  CHECK(StatusToMoe(r->GetString("pos").status()) == MOE_ERR_FORMAT_HPARAMS);
  CHECK(*r->GetBool("b") == false);
  CHECK(StatusToMoe(r->GetBool("pos").status()) == MOE_ERR_FORMAT_HPARAMS);
}

TEST_CASE("gguf: every prefix of a valid file fails as truncated, never crashes",
          "[format][gguf]") {
  GgufWriter w = ValidWriter();
  w.Build();
  // Cut the padding after the last tensor so every strict prefix misses some needed byte.
  w.data_bytes = w.offsets.back() + 16;
  std::string bytes = w.Build();
  REQUIRE(ParseBytes(bytes).ok());
  TempDir dir;
  for (size_t len = 0; len < bytes.size(); ++len) {
    MemorySource mem(bytes.data(), len, "prefix");
    auto r = ParseGguf(mem);
    INFO("prefix length " << len << ": " << r.status().message());
    REQUIRE_FALSE(r.ok());
    CHECK(StatusToMoe(r.status()) == MOE_ERR_FORMAT_TRUNCATED);
    // Through the file layer too, for a sample of lengths.
    if (len % 37 == 0) {
      std::string path = dir.File("prefix.gguf");
      testing::WriteFile(path, bytes.substr(0, len));
      auto file = File::Open(path);
      REQUIRE(file.ok());
      CHECK(StatusToMoe(ParseGguf(**file).status()) == MOE_ERR_FORMAT_TRUNCATED);
    }
  }
}

TEST_CASE("gguf: malformed headers", "[format][gguf]") {
  SECTION("bad magic") {
    GgufWriter w;
    w.magic = "GGML";
    ExpectError(w.Build(), MOE_ERR_FORMAT_HEADER, "magic");
  }
  SECTION("version 1") {
    GgufWriter w;
    w.version = 1;
    ExpectError(w.Build(), MOE_ERR_FORMAT_HEADER, "version 1");
  }
  SECTION("version 4") {
    GgufWriter w;
    w.version = 4;
    ExpectError(w.Build(), MOE_ERR_FORMAT_HEADER, "version 4");
  }
  SECTION("empty file") { ExpectError("", MOE_ERR_FORMAT_TRUNCATED, "magic"); }
  SECTION("huge kv count") {
    GgufWriter w;
    w.n_kv = 1ull << 40;
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "key/value count");
  }
  SECTION("kv count under the cap but more than the file can hold") {
    GgufWriter w;
    w.KvU32("a", 1);
    w.n_kv = 1000;
    ExpectError(w.Build(), MOE_ERR_FORMAT_TRUNCATED, "1000 key/value pairs");
  }
  SECTION("huge tensor count") {
    GgufWriter w;
    w.n_tensors = ~0ull;
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "tensor count");
  }
  SECTION("tensor count under the cap but more than the file can hold") {
    GgufWriter w;
    w.AddTensor("a", {4}, testing::kTF32);
    w.n_tensors = 5000;
    ExpectError(w.Build(), MOE_ERR_FORMAT_TRUNCATED, "5000 tensor entries");
  }
  SECTION("kv count over a caller's limit") {
    GgufWriter w;
    w.KvU32("a", 1).KvU32("b", 2).KvU32("c", 3);
    GgufLimits limits;
    limits.max_kv = 2;
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "key/value count 3", limits);
  }
}

TEST_CASE("gguf: malformed key/value pairs", "[format][gguf]") {
  SECTION("huge key length") {
    std::string bytes =
        Bytes().Raw("GGUF").U32(3).U64(0).U64(1).U64(1ull << 62).U32(testing::kU8).U8(0).U64(0).b;
    ExpectError(bytes, MOE_ERR_FORMAT_METADATA, "string length 4611686018427387904");
  }
  SECTION("huge string value length") {
    GgufWriter w;
    w.KvRaw("general.name", testing::kStr, Bytes().U64(~0ull).Raw("abc").b);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "general.name");
  }
  SECTION("string length under the cap but past the end of the file") {
    GgufWriter w;
    w.KvRaw("general.name", testing::kStr, Bytes().U64(5000).Raw("abc").b);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TRUNCATED, "general.name");
  }
  SECTION("huge array length") {
    GgufWriter w;
    w.KvRaw("tokenizer.ggml.scores", testing::kArr, Bytes().U32(testing::kF32v).U64(1ull << 60).b);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "array length");
  }
  SECTION("array length under the cap but past the end of the file") {
    GgufWriter w;
    w.KvRaw("tokenizer.ggml.scores", testing::kArr,
            Bytes().U32(testing::kF32v).U64(1000).F32(1).F32(2).b);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TRUNCATED, "tokenizer.ggml.scores");
  }
  SECTION("array of strings longer than 8 bytes per element allows") {
    GgufWriter w;
    w.KvRaw("tokenizer.ggml.tokens", testing::kArr,
            Bytes().U32(testing::kStr).U64(100).Str("a").Str("b").b);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TRUNCATED, "100 string values");
  }
  SECTION("nested array") {
    GgufWriter w;
    w.KvRaw("test.nested", testing::kArr,
            Bytes().U32(testing::kArr).U64(1).U32(testing::kU8).U64(1).U8(0).b);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "nested array");
  }
  SECTION("unknown value type") {
    GgufWriter w;
    w.KvRaw("test.bad", 13, Bytes().U32(0).b);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "unknown value type 13");
  }
  SECTION("unknown array element type") {
    GgufWriter w;
    w.KvRaw("test.bad", testing::kArr, Bytes().U32(99).U64(0).b);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "unknown value type 99");
  }
  SECTION("duplicate key") {
    GgufWriter w;
    w.KvStr("general.name", "a").KvU32("x", 1).KvStr("general.name", "b");
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "duplicate key 'general.name'");
  }
  SECTION("empty key") {
    GgufWriter w;
    w.KvU32("", 1);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "empty key");
  }
  SECTION("bool that is neither 0 nor 1") {
    GgufWriter w;
    w.KvRaw("test.flag", testing::kBool, Bytes().U8(2).b);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "test.flag");
  }
  SECTION("alignment 0") {
    GgufWriter w;
    w.KvU32("general.alignment", 0);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "general.alignment");
  }
  SECTION("alignment 3") {
    GgufWriter w;
    w.KvU32("general.alignment", 3);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "power of two");
  }
  SECTION("alignment of type uint64") {
    GgufWriter w;
    w.KvU64("general.alignment", 32);
    ExpectError(w.Build(), MOE_ERR_FORMAT_METADATA, "uint32");
  }
}

TEST_CASE("gguf: malformed tensor entries", "[format][gguf]") {
  SECTION("duplicate tensor name") {
    GgufWriter w;
    w.AddTensor("blk.0.attn_q", {4}, testing::kTF32).AddTensor("blk.0.attn_q", {4}, testing::kTF32);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "duplicate tensor name 'blk.0.attn_q'");
  }
  SECTION("empty tensor name") {
    GgufWriter w;
    w.AddTensor("", {4}, testing::kTF32);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "empty tensor name");
  }
  SECTION("n_dims 0") {
    GgufWriter w;
    w.AddTensor("t0", {}, testing::kTF32);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "n_dims 0");
  }
  SECTION("n_dims 5") {
    GgufWriter w;
    w.AddTensor("t5", {1, 1, 1, 1, 1}, testing::kTF32);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "n_dims 5");
  }
  SECTION("a dim of 0") {
    GgufWriter w;
    w.AddTensor("zero", {4, 0}, testing::kTF32);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "dim 1 is 0");
  }
  SECTION("a dim over 2^63") {
    GgufWriter w;
    w.AddTensor("big", {1ull << 63}, testing::kTF32);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "'big'");
  }
  SECTION("dims whose product overflows") {
    GgufWriter w;
    w.AddTensor("huge", {1ull << 32, 1ull << 32}, testing::kTF32, 0);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "element count");
  }
  SECTION("element count fits but byte count overflows") {
    GgufWriter w;
    w.AddTensor("wide", {1ull << 62}, testing::kTF32, 0);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "byte size overflows");
  }
  SECTION("unknown type id") {
    GgufWriter w;
    w.AddTensor("odd", {4}, 99, 0);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "unknown type id 99");
  }
  SECTION("removed type id") {
    GgufWriter w;
    w.AddTensor("old", {32}, 4, 0);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "Q4_2");
  }
  SECTION("ne[0] not divisible by the Q8_0 block") {
    GgufWriter w;
    w.AddTensor("blk.0.ffn_down", {48, 2}, testing::kTQ8_0, 0);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "divisible");
  }
  SECTION("misaligned offset") {
    GgufWriter w;
    w.AddTensor("a", {4}, testing::kTF32, 0).AddTensor("b", {4}, testing::kTF32, 16);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "'b': offset 16");
  }
  SECTION("extent past the end of the file") {
    GgufWriter w;
    w.AddTensor("output", {64, 4}, testing::kTF32);
    w.data_bytes = 512;
    ExpectError(w.Build(), MOE_ERR_FORMAT_TRUNCATED, "'output'");
  }
  SECTION("offset + size overflows") {
    GgufWriter w;
    w.AddTensor("wrap", {64}, testing::kTF32, ~0ull - 31);
    w.data_bytes = 0;
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "overflows");
  }
  SECTION("data offset + offset + size overflows") {
    GgufWriter w;
    w.AddTensor("wrap2", {8}, testing::kTF32, ~0ull - 63);
    w.data_bytes = 0;
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "wrap2");
  }
  SECTION("overlapping tensors") {
    GgufWriter w;
    w.AddTensor("first", {16}, testing::kTF32, 0)
        .AddTensor("second", {64}, testing::kTF32, 64)
        .AddTensor("third", {8}, testing::kTF32, 32);
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "overlap");
  }
  SECTION("tensor count over a caller's limit") {
    GgufWriter w;
    w.AddTensor("a", {4}, testing::kTF32).AddTensor("b", {4}, testing::kTF32);
    GgufLimits limits;
    limits.max_tensors = 1;
    ExpectError(w.Build(), MOE_ERR_FORMAT_TENSOR, "tensor count 2", limits);
  }
}

// Counts what a parser asks of its source.
class CountingSource final : public Source {
 public:
  explicit CountingSource(const Source &inner) : inner_(inner) {}
  uint64_t size() const override { return inner_.size(); }
  absl::Status ReadAt(uint64_t offset, void *dst, uint64_t n) const override {
    bytes_ += n;
    calls_ += 1;
    max_read_ = std::max(max_read_, n);
    return inner_.ReadAt(offset, dst, n);
  }
  const std::string &name() const override { return inner_.name(); }
  mutable uint64_t bytes_ = 0, calls_ = 0, max_read_ = 0;

 private:
  const Source &inner_;
};

TEST_CASE("gguf: the header is read in small chunks, not the whole file", "[format][gguf]") {
  GgufWriter w = ValidWriter();
  w.AddTensor("big", {4096, 4096}, testing::kTF32);  // 64 MiB
  w.data_bytes = 0;
  std::string header = w.Build();
  TempDir dir;
  std::string path = dir.File("sparse.gguf");
  testing::WriteFile(path, header);
  // Extend to the full size without writing: the data section is a hole.
  uint64_t full = header.size() + w.offsets.back() + (64ull << 20);
  REQUIRE(::truncate(path.c_str(), static_cast<off_t>(full)) == 0);
  auto file = File::Open(path);
  REQUIRE(file.ok());
  CountingSource counting(**file);
  auto r = ParseGguf(counting);
  REQUIRE(r.ok());
  CHECK(r->FindTensor("big")->nbytes == (64ull << 20));
  CHECK(counting.bytes_ <= 8192);
  CHECK(counting.max_read_ <= 4096);
}

TEST_CASE("gguf: a long string array is read in growing chunks", "[format][gguf]") {
  std::vector<std::string> tokens;
  for (int i = 0; i < 20000; ++i) tokens.push_back("token" + std::to_string(i));
  GgufWriter w;
  w.KvStrArr("tokenizer.ggml.tokens", tokens);
  std::string bytes = w.Build();
  MemorySource mem(bytes.data(), bytes.size());
  CountingSource counting(mem);
  auto r = ParseGguf(counting);
  REQUIRE(r.ok());
  CHECK(r->Find("tokenizer.ggml.tokens")->arr_str[19999] == "token19999");
  CHECK(counting.bytes_ <= bytes.size());
  CHECK(counting.calls_ < 20);
}

}  // namespace
}  // namespace strata::format

namespace strata::format {
namespace {

// A GGUF with one array of `n` elements of `elem_type`, each `esize` bytes, filled from `rng`; the
// element bytes are returned in *raw.
std::string OneArrayGguf(uint32_t elem_type, uint64_t n, uint64_t esize, std::mt19937_64 &rng, std::string *raw) {
  raw->resize(n * esize);
  for (auto &c : *raw) c = static_cast<char>(rng());
  if (elem_type == testing::kBool) {
    for (auto &c : *raw) c = static_cast<char>(c & 1);
  }
  GgufWriter w;
  w.KvRaw("test.big", testing::kArr, Bytes().U32(elem_type).U64(n).Raw(*raw).b);
  return w.Build();
}

TEST_CASE("gguf: uint8, int8 and bool arrays are held at one byte per element", "[format][gguf]") {
  std::mt19937_64 rng(std::random_device{}());
  const uint64_t n = (uint64_t{1} << 22) + (rng() % 4096);
  for (uint32_t type : {testing::kU8, testing::kI8, testing::kBool}) {
    INFO("element type " << type);
    std::string raw;
    const std::string bytes = OneArrayGguf(type, n, 1, rng, &raw);
    MemorySource mem(bytes.data(), bytes.size());
    const int64_t before = strata::testing::HeapBytesInUse();
    absl::StatusOr<GgufFile> r = ParseGguf(mem);
    REQUIRE(r.ok());
    // What the parsed file holds: the array's n bytes and small change (8 bytes an element before).
    const int64_t held = strata::testing::HeapBytesInUse() - before;
    CHECK(held >= static_cast<int64_t>(n));
    CHECK(held < static_cast<int64_t>(n + n / 4));
    const GgufValue *v = r->Find("test.big");
    REQUIRE(v != nullptr);
    REQUIRE(v->IsIntArray());
    REQUIRE(v->arr_len == n);
    for (uint64_t k = 0; k < n; k += 997) {
      const auto byte = static_cast<uint8_t>(raw[k]);
      CHECK(v->IntAt(k) == (type == testing::kI8 ? static_cast<int64_t>(static_cast<int8_t>(byte)) : byte));
    }
    CHECK(v->FloatAt(n - 1) == static_cast<double>(v->IntAt(n - 1)));
  }
}

TEST_CASE("gguf: numeric arrays of every width read back exactly through IntAt and FloatAt", "[format][gguf]") {
  std::mt19937_64 rng(std::random_device{}());
  struct Case { uint32_t type; uint64_t esize; };
  for (Case c : {Case{testing::kU16, 2}, Case{testing::kI16, 2}, Case{testing::kU32, 4}, Case{testing::kI32, 4},
                 Case{testing::kU64, 8}, Case{testing::kI64, 8}, Case{testing::kF32v, 4}, Case{testing::kF64v, 8}}) {
    INFO("element type " << c.type);
    const uint64_t n = 100 + rng() % 100;
    std::string raw;
    const std::string bytes = OneArrayGguf(c.type, n, c.esize, rng, &raw);
    MemorySource mem(bytes.data(), bytes.size());
    absl::StatusOr<GgufFile> r = ParseGguf(mem);
    REQUIRE(r.ok());
    const GgufValue *v = r->Find("test.big");
    REQUIRE(v->arr_len == n);
    CHECK(v->arr_raw.size() == n * c.esize);
    const bool is_float = c.type == testing::kF32v || c.type == testing::kF64v;
    CHECK(v->IsFloatArray() == is_float);
    CHECK(v->IsIntArray() == !is_float);
    for (uint64_t k = 0; k < n; ++k) {
      const char *p = raw.data() + k * c.esize;
      auto get = [&](auto x) { std::memcpy(&x, p, sizeof x); return x; };
      switch (c.type) {
        case testing::kU16: CHECK(v->IntAt(k) == get(uint16_t{})); break;
        case testing::kI16: CHECK(v->IntAt(k) == get(int16_t{})); break;
        case testing::kU32: CHECK(v->IntAt(k) == get(uint32_t{})); break;
        case testing::kI32: CHECK(v->IntAt(k) == get(int32_t{})); break;
        case testing::kU64: CHECK(static_cast<uint64_t>(v->IntAt(k)) == get(uint64_t{})); break;
        case testing::kI64: CHECK(v->IntAt(k) == get(int64_t{})); break;
        case testing::kF32v: {
          const float f = get(float{});
          CHECK((std::isnan(f) ? std::isnan(v->FloatAt(k)) : v->FloatAt(k) == f));
          break;
        }
        case testing::kF64v: {
          const double f = get(double{});
          CHECK((std::isnan(f) ? std::isnan(v->FloatAt(k)) : v->FloatAt(k) == f));
          break;
        }
      }
    }
  }
}

TEST_CASE("gguf: a bool array element other than 0 or 1 is refused, naming the element", "[format][gguf]") {
  GgufWriter w;
  w.KvRaw("test.flags", testing::kArr, Bytes().U32(testing::kBool).U64(4).U8(1).U8(0).U8(2).U8(1).b);
  const std::string bytes = w.Build();
  MemorySource mem(bytes.data(), bytes.size());
  absl::StatusOr<GgufFile> r = ParseGguf(mem);
  REQUIRE_FALSE(r.ok());
  CHECK(StatusToMoe(r.status()) == MOE_ERR_FORMAT_METADATA);
  const std::string msg(r.status().message());
  INFO(msg);
  CHECK(msg.find("test.flags") != std::string::npos);
  CHECK(msg.find("element 2") != std::string::npos);
}

}  // namespace
}  // namespace strata::format
