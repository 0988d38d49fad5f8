// Hugging Face checkpoint directory tests: single files, unindexed and indexed shards, and each way a
// directory can disagree with its index or its config, with the exact status and a named culprit.
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include "lib/format/safetensors.h"
#include "tests/format/format_test_util.h"

namespace strata::format {
namespace {

using testing::PackedSafetensors;
using testing::TempDir;
using testing::WriteFile;

constexpr char kConfig[] = R"({"model_type": "qwen3_moe", "num_experts": 4})";

void ExpectError(const std::string &dir, moe_status code, const std::string &word) {
  auto r = OpenHfCheckpoint(dir);
  REQUIRE_FALSE(r.ok());
  INFO("message: " << r.status().message());
  CHECK(StatusToMoe(r.status()) == code);
  CHECK(std::string(r.status().message()).find(word) != std::string::npos);
}

// Two shards: a, b in the first; c in the second.
void WriteShards(const TempDir &dir) {
  WriteFile(dir.File("model-00001-of-00002.safetensors"),
            PackedSafetensors({{"a", "F32", {2}, 0, 0}, {"b", "BF16", {4}, 0, 0}}));
  WriteFile(dir.File("model-00002-of-00002.safetensors"),
            PackedSafetensors({{"c", "F16", {3}, 0, 0}}));
}

std::string Index(const std::string &weight_map) {
  return R"({"metadata": {"total_size": 22}, "weight_map": )" + weight_map + "}";
}

constexpr char kGoodMap[] = R"({"a": "model-00001-of-00002.safetensors",
  "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})";

TEST_CASE("hf: a single-file checkpoint opens", "[format][hf]") {
  TempDir dir;
  WriteFile(dir.File("config.json"), kConfig);
  WriteFile(dir.File("model.safetensors"), PackedSafetensors({{"w", "F32", {2, 2}, 0, 0}}));
  CHECK(IsHfCheckpointDir(dir.path()));
  auto r = OpenHfCheckpoint(dir.path());
  REQUIRE(r.ok());
  CHECK(r->config["model_type"] == "qwen3_moe");
  REQUIRE(r->files.size() == 1);
  REQUIRE(r->tensors.size() == 1);
  const SafetensorsTensor *w = r->Find("w");
  REQUIRE(w != nullptr);
  CHECK(w->nbytes == 16);
  CHECK(w->file_index == 0);
  CHECK(r->Find("absent") == nullptr);
}

TEST_CASE("hf: unindexed shards are opened in name order", "[format][hf]") {
  TempDir dir;
  WriteFile(dir.File("config.json"), kConfig);
  WriteShards(dir);
  WriteFile(dir.File("notes.txt"), "not a shard");
  auto r = OpenHfCheckpoint(dir.path());
  REQUIRE(r.ok());
  REQUIRE(r->files.size() == 2);
  CHECK(r->files[0]->name().find("model-00001") != std::string::npos);
  CHECK(r->Find("a")->file_index == 0);
  CHECK(r->Find("c")->file_index == 1);
  CHECK(r->tensors.size() == 3);
}

TEST_CASE("hf: an indexed checkpoint opens", "[format][hf]") {
  TempDir dir;
  WriteFile(dir.File("config.json"), kConfig);
  WriteShards(dir);
  // A stray shard the index does not name is ignored.
  WriteFile(dir.File("extra.safetensors"), PackedSafetensors({{"a", "F32", {2}, 0, 0}}));
  WriteFile(dir.File("model.safetensors.index.json"), Index(kGoodMap));
  auto r = OpenHfCheckpoint(dir.path());
  REQUIRE(r.ok());
  CHECK(r->files.size() == 2);
  CHECK(r->tensors.size() == 3);
  CHECK(r->Find("b")->dtype == "BF16");
  CHECK(r->Find("c")->file_index == 1);
}

TEST_CASE("hf: malformed checkpoint directories", "[format][hf]") {
  TempDir dir;
  WriteFile(dir.File("config.json"), kConfig);
  WriteShards(dir);

  SECTION("directory missing") {
    ExpectError(dir.File("nope"), MOE_ERR_IO_OPEN, "nope");
    CHECK_FALSE(IsHfCheckpointDir(dir.File("nope")));
  }
  SECTION("config.json missing") {
    REQUIRE(::unlink(dir.File("config.json").c_str()) == 0);
    ExpectError(dir.path(), MOE_ERR_IO_OPEN, "config.json");
    CHECK_FALSE(IsHfCheckpointDir(dir.path()));
  }
  SECTION("config.json not JSON") {
    WriteFile(dir.File("config.json"), "{\"model_type\": ");
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "config.json");
  }
  SECTION("config.json an array") {
    WriteFile(dir.File("config.json"), "[]");
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "not an object");
  }
  SECTION("no safetensors files") {
    TempDir empty;
    WriteFile(empty.File("config.json"), kConfig);
    ExpectError(empty.path(), MOE_ERR_IO_OPEN, "safetensors");
  }
  SECTION("a tensor in two unindexed shards") {
    WriteFile(dir.File("model-00003-of-00003.safetensors"),
              PackedSafetensors({{"b", "F32", {1}, 0, 0}}));
    ExpectError(dir.path(), MOE_ERR_FORMAT_METADATA, "'b'");
  }
  SECTION("a malformed shard names the shard") {
    WriteFile(dir.File("model-00002-of-00002.safetensors"), "garbage!garbage!");
    ExpectError(dir.path(), MOE_ERR_FORMAT_HEADER, "model-00002-of-00002.safetensors");
  }
  SECTION("index naming a missing shard") {
    WriteFile(dir.File("model.safetensors.index.json"),
              Index(R"({"a": "model-00001-of-00002.safetensors",
                "b": "model-00001-of-00002.safetensors", "c": "model-00009.safetensors"})"));
    ExpectError(dir.path(), MOE_ERR_IO_OPEN, "model-00009.safetensors");
  }
  SECTION("index putting a tensor in the wrong shard") {
    WriteFile(dir.File("model.safetensors.index.json"),
              Index(R"({"a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})"));
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "'b'");
  }
  SECTION("index with a ../ shard name") {
    WriteFile(dir.File("model.safetensors.index.json"),
              Index(R"({"a": "../model-00001-of-00002.safetensors"})"));
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "not a plain file name");
  }
  SECTION("index with a '..' shard name") {
    WriteFile(dir.File("model.safetensors.index.json"), Index(R"({"a": ".."})"));
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "not a plain file name");
  }
  SECTION("index naming a tensor its shard lacks") {
    WriteFile(dir.File("model.safetensors.index.json"),
              Index(R"({"a": "model-00001-of-00002.safetensors",
                "b": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors",
                "ghost": "model-00002-of-00002.safetensors"})"));
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "'ghost'");
  }
  SECTION("a shard tensor missing from the index") {
    WriteFile(dir.File("model.safetensors.index.json"),
              Index(R"({"a": "model-00001-of-00002.safetensors",
                "c": "model-00002-of-00002.safetensors"})"));
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "'b'");
  }
  SECTION("index without a weight_map") {
    WriteFile(dir.File("model.safetensors.index.json"), R"({"metadata": {}})");
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "weight_map");
  }
  SECTION("index with a non-string shard") {
    WriteFile(dir.File("model.safetensors.index.json"), Index(R"({"a": 3})"));
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "'a'");
  }
  SECTION("index with a duplicate tensor") {
    WriteFile(dir.File("model.safetensors.index.json"),
              Index(R"({"a": "model-00001-of-00002.safetensors",
                "a": "model-00002-of-00002.safetensors"})"));
    ExpectError(dir.path(), MOE_ERR_FORMAT_CONFIG, "duplicate key 'a'");
  }
}

}  // namespace
}  // namespace strata::format
