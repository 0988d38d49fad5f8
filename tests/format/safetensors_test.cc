// safetensors parser tests: a valid file parses with absolute offsets and ggml type ids; each
// malformed header, written to disk and opened through File, fails with its exact status and a
// message naming the tensor or the problem.
#include <catch2/catch.hpp>

#include "lib/format/file.h"
#include "lib/format/safetensors.h"
#include "tests/format/format_test_util.h"

namespace strata::format {
namespace {

using testing::SafetensorsBytes;
using testing::SafetensorsHeader;
using testing::StTensor;
using testing::TempDir;

absl::StatusOr<std::vector<SafetensorsTensor>> ParseBytes(const std::string &bytes,
                                                          const SafetensorsLimits &limits = {}) {
  TempDir dir;
  std::string path = dir.File("model.safetensors");
  testing::WriteFile(path, bytes);
  auto file = File::Open(path);
  REQUIRE(file.ok());
  auto from_file = ParseSafetensors(**file, limits);
  MemorySource mem(bytes.data(), bytes.size(), path);
  auto from_mem = ParseSafetensors(mem, limits);
  CHECK(StatusToMoe(from_file.status()) == StatusToMoe(from_mem.status()));
  return from_file;
}

void ExpectError(const std::string &bytes, moe_status code, const std::string &word,
                 const SafetensorsLimits &limits = {}) {
  auto r = ParseBytes(bytes, limits);
  REQUIRE_FALSE(r.ok());
  INFO("message: " << r.status().message());
  CHECK(StatusToMoe(r.status()) == code);
  CHECK(std::string(r.status().message()).find(word) != std::string::npos);
  CHECK(std::string(r.status().message()).find("model.safetensors") != std::string::npos);
}

// One tensor "w" of F32 [2, 2] (16 bytes) with the given offsets, over `data` bytes.
std::string OneTensor(uint64_t begin, uint64_t end, uint64_t data, const std::string &shape = "[2,2]",
                      const std::string &dtype = "F32") {
  std::string h = "{\"w\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
                  std::to_string(begin) + "," + std::to_string(end) + "]}}";
  return SafetensorsBytes(h, data);
}

TEST_CASE("safetensors: a valid file parses with its dtypes, shapes and offsets",
          "[format][safetensors]") {
  std::vector<StTensor> ts = {
      {"model.embed_tokens.weight", "F32", {2, 3}, 0, 24},
      {"model.norm.weight", "BF16", {4}, 24, 32},
      {"step", "I64", {}, 32, 40},
      {"empty", "U8", {0}, 40, 40},
      {"half", "F16", {2}, 40, 44},
      {"mask", "BOOL", {3}, 44, 47},
  };
  std::string header = SafetensorsHeader(ts, "{\"format\":\"pt\"}");
  std::string bytes = SafetensorsBytes(header, 47);
  auto r = ParseBytes(bytes);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 6);
  const uint64_t data_start = 8 + header.size();
  // Returned in offset order.
  const SafetensorsTensor &emb = (*r)[0];
  CHECK(emb.name == "model.embed_tokens.weight");
  CHECK(emb.dtype == "F32");
  CHECK(emb.type == 0);
  CHECK(emb.shape == std::vector<int64_t>{2, 3});
  CHECK(emb.offset == data_start);
  CHECK(emb.nbytes == 24);
  CHECK((*r)[1].name == "model.norm.weight");
  CHECK((*r)[1].type == 30);
  CHECK((*r)[1].offset == data_start + 24);
  CHECK((*r)[2].name == "step");
  CHECK((*r)[2].type == 27);
  CHECK((*r)[2].shape.empty());
  CHECK((*r)[2].nbytes == 8);
  CHECK((*r)[3].name == "empty");
  CHECK((*r)[3].nbytes == 0);
  CHECK((*r)[3].type == kUnsupportedDtype);
  CHECK((*r)[4].type == 1);
  CHECK((*r)[5].type == kUnsupportedDtype);
  CHECK((*r)[5].nbytes == 3);
}

TEST_CASE("safetensors: every dtype maps to its ggml id", "[format][safetensors]") {
  const std::vector<std::pair<std::string, uint32_t>> want = {
      {"F64", 28}, {"F32", 0}, {"F16", 1}, {"BF16", 30}, {"I64", 27}, {"I32", 26}, {"I16", 25},
      {"I8", 24}, {"U8", kUnsupportedDtype}, {"BOOL", kUnsupportedDtype},
      {"F8_E4M3", kUnsupportedDtype}, {"F8_E5M2", kUnsupportedDtype}};
  for (const auto &[dtype, id] : want) {
    auto r = ParseBytes(testing::PackedSafetensors({{"t", dtype, {3}, 0, 0}}));
    INFO(dtype);
    REQUIRE(r.ok());
    CHECK((*r)[0].type == id);
  }
}

TEST_CASE("safetensors: an empty header object with no data is valid", "[format][safetensors]") {
  auto r = ParseBytes(SafetensorsBytes("{}", 0));
  REQUIRE(r.ok());
  CHECK(r->empty());
  // Trailing spaces pad headers to alignment in files written by the reference library.
  r = ParseBytes(SafetensorsBytes("{\"__metadata__\":{}}     ", 0));
  REQUIRE(r.ok());
}

TEST_CASE("safetensors: malformed files", "[format][safetensors]") {
  SECTION("shorter than the header length") {
    ExpectError(std::string(5, '\0'), MOE_ERR_FORMAT_TRUNCATED, "header length");
  }
  SECTION("header length past the end of the file") {
    std::string bytes = OneTensor(0, 16, 16);
    bytes[0] = static_cast<char>(bytes[0] + 100);
    ExpectError(bytes, MOE_ERR_FORMAT_TRUNCATED, "header length");
  }
  SECTION("header length over the cap") {
    testing::Bytes b;
    b.U64(1ull << 40).Raw("{}");
    ExpectError(b.b, MOE_ERR_FORMAT_HEADER, "header length 1099511627776");
  }
  SECTION("header length over a caller's cap") {
    SafetensorsLimits limits;
    limits.max_header_bytes = 16;
    ExpectError(OneTensor(0, 16, 16), MOE_ERR_FORMAT_HEADER, "limit of 16", limits);
  }
  SECTION("header is not JSON") {
    ExpectError(SafetensorsBytes("{\"w\": nope}", 0), MOE_ERR_FORMAT_METADATA, "not valid JSON");
  }
  SECTION("header is cut short") {
    ExpectError(SafetensorsBytes("{\"w\": {\"dtype\"", 0), MOE_ERR_FORMAT_METADATA, "JSON");
  }
  SECTION("header is a JSON array") {
    ExpectError(SafetensorsBytes("[1, 2]", 0), MOE_ERR_FORMAT_METADATA, "array");
  }
  SECTION("unknown dtype") {
    ExpectError(OneTensor(0, 16, 16, "[2,2]", "F17"), MOE_ERR_FORMAT_TENSOR, "unknown dtype 'F17'");
  }
  SECTION("negative dim") {
    ExpectError(OneTensor(0, 16, 16, "[-2,-2]"), MOE_ERR_FORMAT_TENSOR, "negative");
  }
  SECTION("fractional dim") {
    ExpectError(OneTensor(0, 16, 16, "[2.5,2]"), MOE_ERR_FORMAT_TENSOR, "not an integer");
  }
  SECTION("shape x dtype size differs from the span") {
    ExpectError(OneTensor(0, 16, 16, "[2,3]"), MOE_ERR_FORMAT_TENSOR, "needs 24");
  }
  SECTION("shape whose element count overflows") {
    ExpectError(OneTensor(0, 16, 16, "[4294967296,4294967296]"), MOE_ERR_FORMAT_TENSOR,
                "overflows");
  }
  SECTION("shape whose byte count overflows") {
    ExpectError(OneTensor(0, 16, 16, "[4611686018427387904]"), MOE_ERR_FORMAT_TENSOR,
                "byte size");
  }
  SECTION("offsets past the end of the data") {
    ExpectError(OneTensor(0, 16, 8), MOE_ERR_FORMAT_TRUNCATED, "'w'");
  }
  SECTION("end before begin") {
    ExpectError(OneTensor(16, 0, 16), MOE_ERR_FORMAT_TENSOR, "end before");
  }
  SECTION("offsets that are not two integers") {
    std::string h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}";
    ExpectError(SafetensorsBytes(h, 4), MOE_ERR_FORMAT_TENSOR, "data_offsets");
  }
  SECTION("negative offset") {
    std::string h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}";
    ExpectError(SafetensorsBytes(h, 4), MOE_ERR_FORMAT_TENSOR, "data_offsets");
  }
  SECTION("overlapping tensors") {
    std::string h = SafetensorsHeader({{"a", "F32", {4}, 0, 16}, {"b", "F32", {4}, 8, 24}});
    ExpectError(SafetensorsBytes(h, 24), MOE_ERR_FORMAT_TENSOR, "overlap");
  }
  SECTION("gap between tensors") {
    std::string h = SafetensorsHeader({{"a", "F32", {2}, 0, 8}, {"b", "F32", {2}, 12, 20}});
    ExpectError(SafetensorsBytes(h, 20), MOE_ERR_FORMAT_TENSOR, "gap");
  }
  SECTION("first tensor not at the start of the data") {
    ExpectError(OneTensor(8, 24, 24), MOE_ERR_FORMAT_TENSOR, "before tensor 'w'");
  }
  SECTION("bytes after the last tensor") {
    ExpectError(OneTensor(0, 16, 20), MOE_ERR_FORMAT_TENSOR, "cover only 16");
  }
  SECTION("data but no tensors") {
    ExpectError(SafetensorsBytes("{}", 4), MOE_ERR_FORMAT_TENSOR, "cover only 0");
  }
  SECTION("duplicate tensor names") {
    std::string h = SafetensorsHeader({{"w", "F32", {2}, 0, 8}, {"w", "F32", {2}, 8, 16}});
    ExpectError(SafetensorsBytes(h, 16), MOE_ERR_FORMAT_METADATA, "duplicate key 'w'");
  }
  SECTION("duplicate field inside an entry") {
    std::string h = "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    ExpectError(SafetensorsBytes(h, 4), MOE_ERR_FORMAT_METADATA, "inside 'w'");
  }
  SECTION("entry is not an object") {
    ExpectError(SafetensorsBytes("{\"w\": [1]}", 0), MOE_ERR_FORMAT_TENSOR, "'w'");
  }
  SECTION("entry without data_offsets") {
    ExpectError(SafetensorsBytes("{\"w\":{\"dtype\":\"F32\",\"shape\":[0]}}", 0),
                MOE_ERR_FORMAT_TENSOR, "data_offsets");
  }
  SECTION("entry without dtype") {
    ExpectError(SafetensorsBytes("{\"w\":{\"shape\":[0],\"data_offsets\":[0,0]}}", 0),
                MOE_ERR_FORMAT_TENSOR, "dtype");
  }
  SECTION("entry with an unknown field") {
    std::string h =
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0],\"strides\":[1]}}";
    ExpectError(SafetensorsBytes(h, 0), MOE_ERR_FORMAT_TENSOR, "unknown field 'strides'");
  }
  SECTION("__metadata__ that is not an object of strings") {
    ExpectError(SafetensorsBytes("{\"__metadata__\":{\"format\":1}}", 0), MOE_ERR_FORMAT_METADATA,
                "__metadata__");
    ExpectError(SafetensorsBytes("{\"__metadata__\":\"pt\"}", 0), MOE_ERR_FORMAT_METADATA,
                "__metadata__");
  }
}

TEST_CASE("safetensors: every prefix of a valid file fails cleanly", "[format][safetensors]") {
  std::string bytes = testing::PackedSafetensors(
      {{"a", "F32", {2, 3}, 0, 0}, {"b", "BF16", {4}, 0, 0}, {"c", "I8", {5}, 0, 0}});
  REQUIRE(ParseBytes(bytes).ok());
  for (size_t len = 0; len < bytes.size(); ++len) {
    MemorySource mem(bytes.data(), len, "prefix");
    auto r = ParseSafetensors(mem);
    INFO("prefix length " << len << ": " << r.status().message());
    REQUIRE_FALSE(r.ok());
    CHECK(MOE_STATUS_CATEGORY(StatusToMoe(r.status())) == MOE_ERR_FORMAT);
  }
}

}  // namespace
}  // namespace strata::format
