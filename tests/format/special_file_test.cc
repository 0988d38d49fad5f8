// Special files at every path Strata opens (the model, a shard named by an index, tokenizer.json,
// tokenizer_config.json, chat_template.jinja, a session snapshot, a hotlist): a FIFO or a device is
// refused at once with MOE_ERR_IO_OPEN and a message naming the path and what it is. Each case runs
// in a forked child with a deadline, so a blocking open() or an endless read fails the check.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/format/safetensors.h"
#include "lib/model/hparams.h"
#include "lib/model/pack.h"
#include "lib/text/tokenizer.h"
#include "lib/util/status.h"
#include "tests/format/format_test_util.h"
#include "tests/util/child_process_util.h"

namespace strata::format {
namespace {

using strata::testing::ChildOutcome;
using strata::testing::RunInChild;
using testing::TempDir;
using testing::WriteFile;

const std::string kHf = std::string(STRATA_SOURCE_DIR) + "/tests/golden/qwen3moe_f32/hf";
const std::string kTok = std::string(STRATA_SOURCE_DIR) + "/tests/text/fixtures/qwen2";
const std::string kDemo = std::string(STRATA_SOURCE_DIR) + "/examples/models/austen-moe-q4_k.gguf";
constexpr double kDeadline = 3.0;

// Where a special file is put: `path` becomes a FIFO, or a symlink to a character device.
enum class Special { kFifo, kZero, kNull };

const char *What(Special s) { return s == Special::kFifo ? "FIFO" : "character device"; }

// /dev/null reads as empty (where a size matters); some sandboxes replace it with a plain file,
// and then /dev/full stands in.
std::string DevicePath(Special s) {
  if (s == Special::kZero) return "/dev/zero";
  struct stat st;
  return stat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode) ? "/dev/null" : "/dev/full";
}

void MakeSpecial(const std::string &path, Special s) {
  if (s == Special::kFifo) {
    REQUIRE(mkfifo(path.c_str(), 0600) == 0);
  } else {
    REQUIRE(symlink(DevicePath(s).c_str(), path.c_str()) == 0);
  }
}

Special AnySpecial() {
  std::mt19937 rng(std::random_device{}());
  return static_cast<Special>(rng() % 3);
}

void ExpectRefused(const ChildOutcome &r, const std::string &path, Special s) {
  INFO(r.Describe());
  REQUIRE(r.finished);
  CHECK(r.code == MOE_ERR_IO_OPEN);
  CHECK(r.message.find(path) != std::string::npos);
  CHECK(r.message.find(What(s)) != std::string::npos);
}

int32_t Report(const absl::Status &st, std::string *m) {
  *m = std::string(st.message());
  return StatusToMoe(st);
}

int32_t CtxOpen(const std::string &model, std::string *m, const char *hotlist = nullptr) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.hotlist_path = hotlist;
  moe_ctx *ctx = nullptr;
  moe_status st = moe_ctx_open(&p, &ctx);
  *m = st == MOE_OK ? "" : moe_last_error();
  moe_ctx_close(ctx);
  return st;
}

void LinkGolden(const TempDir &dir) {
  REQUIRE(symlink((kHf + "/model.safetensors").c_str(), dir.File("model.safetensors").c_str()) == 0);
  REQUIRE(symlink((kHf + "/config.json").c_str(), dir.File("config.json").c_str()) == 0);
}

TEST_CASE("special files: the model path", "[format][file][special]") {
  for (Special s : {Special::kFifo, Special::kZero, Special::kNull}) {
    TempDir dir;
    const std::string path = dir.File("model.gguf");
    MakeSpecial(path, s);
    ExpectRefused(RunInChild([&](std::string *m) { return CtxOpen(path, m); }, kDeadline), path, s);
    ExpectRefused(RunInChild([&](std::string *m) { return Report(File::Open(path).status(), m); }, kDeadline),
                  path, s);
  }
  // The device itself, not through a link.
  ExpectRefused(RunInChild([&](std::string *m) { return CtxOpen("/dev/zero", m); }, kDeadline), "/dev/zero",
                Special::kZero);
}

TEST_CASE("special files: a safetensors shard named by the index", "[format][file][special]") {
  const Special s = AnySpecial();
  TempDir dir;
  REQUIRE(symlink((kHf + "/config.json").c_str(), dir.File("config.json").c_str()) == 0);
  const std::string shard = dir.File("model-00001-of-00001.safetensors");
  MakeSpecial(shard, s);
  WriteFile(dir.File("model.safetensors.index.json"),
            R"({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00001.safetensors"}})");
  ExpectRefused(RunInChild([&](std::string *m) { return Report(OpenHfCheckpoint(dir.path()).status(), m); },
                           kDeadline),
                shard, s);
}

TEST_CASE("special files: config.json, the index and unindexed shards of a checkpoint",
          "[format][file][special]") {
  const Special s = AnySpecial();
  TempDir dir;
  SECTION("config.json") {
    REQUIRE(symlink((kHf + "/model.safetensors").c_str(), dir.File("model.safetensors").c_str()) == 0);
    MakeSpecial(dir.File("config.json"), s);
    ExpectRefused(RunInChild([&](std::string *m) { return CtxOpen(dir.path(), m); }, kDeadline),
                  dir.File("config.json"), s);
  }
  SECTION("model.safetensors.index.json") {
    LinkGolden(dir);
    MakeSpecial(dir.File("model.safetensors.index.json"), s);
    ExpectRefused(RunInChild([&](std::string *m) { return Report(OpenHfCheckpoint(dir.path()).status(), m); },
                             kDeadline),
                  dir.File("model.safetensors.index.json"), s);
  }
  SECTION("a second *.safetensors file without an index") {
    LinkGolden(dir);
    MakeSpecial(dir.File("model-extra.safetensors"), s);
    ExpectRefused(RunInChild([&](std::string *m) { return Report(OpenHfCheckpoint(dir.path()).status(), m); },
                             kDeadline),
                  dir.File("model-extra.safetensors"), s);
  }
}

TEST_CASE("special files: tokenizer.json, tokenizer_config.json and the chat template",
          "[format][file][special]") {
  SECTION("tokenizer.json of a checkpoint") {
    const Special s = AnySpecial();
    TempDir dir;
    LinkGolden(dir);
    MakeSpecial(dir.File("tokenizer.json"), s);
    ExpectRefused(RunInChild([&](std::string *m) { return CtxOpen(dir.path(), m); }, kDeadline),
                  dir.File("tokenizer.json"), s);
  }
  SECTION("tokenizer.json of a checkpoint, a symlink to nothing") {
    // Once taken for "no tokenizer" (an existence check before the open); now opened once and
    // refused, naming the path.
    TempDir dir;
    LinkGolden(dir);
    REQUIRE(symlink(dir.File("gone.json").c_str(), dir.File("tokenizer.json").c_str()) == 0);
    std::string m;
    CHECK(CtxOpen(dir.path(), &m) == MOE_ERR_IO_OPEN);
    CHECK(m.find(dir.File("tokenizer.json")) != std::string::npos);
  }
  SECTION("tokenizer_config.json beside a tokenizer.json") {
    const Special s = AnySpecial();
    TempDir dir;
    REQUIRE(symlink((kTok + "/tokenizer.json").c_str(), dir.File("tokenizer.json").c_str()) == 0);
    MakeSpecial(dir.File("tokenizer_config.json"), s);
    ExpectRefused(RunInChild([&](std::string *m) {
                    return Report(text::Tokenizer::FromHfFile(dir.File("tokenizer.json")).status(), m);
                  }, kDeadline),
                  dir.File("tokenizer_config.json"), s);
  }
  SECTION("tokenizer_config.json read for the chat template") {
    const Special s = AnySpecial();
    TempDir dir;
    LinkGolden(dir);
    MakeSpecial(dir.File("tokenizer_config.json"), s);
    ExpectRefused(RunInChild([&](std::string *m) { return CtxOpen(dir.path(), m); }, kDeadline),
                  dir.File("tokenizer_config.json"), s);
  }
  SECTION("chat_template.jinja") {
    for (Special s : {Special::kFifo, Special::kZero}) {
      TempDir dir;
      LinkGolden(dir);
      MakeSpecial(dir.File("chat_template.jinja"), s);
      ExpectRefused(RunInChild([&](std::string *m) { return CtxOpen(dir.path(), m); }, kDeadline),
                    dir.File("chat_template.jinja"), s);
    }
  }
}

TEST_CASE("special files: a session snapshot", "[format][file][special]") {
  const Special s = AnySpecial();
  TempDir dir;
  const std::string path = dir.File("npc.session");
  MakeSpecial(path, s);
  ChildOutcome r = RunInChild([&](std::string *m) -> int32_t {
    moe_params p;
    moe_params_init(&p);
    p.model_path = kDemo.c_str();
    moe_ctx *ctx = nullptr;
    if (moe_ctx_open(&p, &ctx) != MOE_OK) {
      *m = std::string("the demo model did not open: ") + moe_last_error();
      return -1;
    }
    moe_session *session = nullptr;
    moe_status st = moe_session_load(ctx, path.c_str(), nullptr, &session);
    *m = st == MOE_OK ? "" : moe_last_error();
    moe_session_close(session);
    moe_ctx_close(ctx);
    return st;
  }, kDeadline);
  ExpectRefused(r, path, s);
}

TEST_CASE("special files: a hotlist", "[format][file][special]") {
  const Special s = AnySpecial();
  TempDir dir;
  const std::string path = dir.File("experts.hotlist");
  MakeSpecial(path, s);
  ExpectRefused(RunInChild([&](std::string *m) { return Report(model::ReadHotlist(path, model::HParams()).status(), m); },
                           kDeadline),
                path, s);
  ExpectRefused(RunInChild([&](std::string *m) { return CtxOpen(kDemo, m, path.c_str()); }, kDeadline), path, s);
}

TEST_CASE("special files: small-file reads refuse them too", "[format][file][special]") {
  const Special s = AnySpecial();
  TempDir dir;
  const std::string path = dir.File("config.json");
  MakeSpecial(path, s);
  ExpectRefused(RunInChild([&](std::string *m) { return Report(ReadSmallFile(path, 1 << 20).status(), m); },
                           kDeadline),
                path, s);
}

TEST_CASE("special files: OpenRegularFile opens files plainly and names what it refuses",
          "[format][file][special]") {
  TempDir dir;
  std::mt19937 rng(std::random_device{}());
  const std::string body(1 + rng() % 4096, static_cast<char>('a' + rng() % 26));
  WriteFile(dir.File("plain"), body);
  struct stat st;
  auto fd = OpenRegularFile(dir.File("plain"), {}, &st);
  REQUIRE(fd.ok());
  CHECK(st.st_size == static_cast<off_t>(body.size()));
  const int fl = fcntl(fd->get(), F_GETFL);
  CHECK((fl & O_NONBLOCK) == 0);  // cleared once open
  CHECK((fcntl(fd->get(), F_GETFD) & FD_CLOEXEC) != 0);
  auto d = OpenRegularFile(dir.path());
  REQUIRE_FALSE(d.ok());
  CHECK(StatusToMoe(d.status()) == MOE_ERR_IO_OPEN);
  CHECK(std::string(d.status().message()).find("a directory") != std::string::npos);
  // Opening a FIFO for writing with no reader fails at once (ENXIO) and still says what it is.
  const std::string fifo = dir.File("out.fifo");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  OpenOptions w;
  w.flags = O_WRONLY | O_CREAT | O_TRUNC;
  ChildOutcome r = RunInChild([&](std::string *m) { return Report(OpenRegularFile(fifo, w).status(), m); }, kDeadline);
  ExpectRefused(r, fifo, Special::kFifo);
}

}  // namespace
}  // namespace strata::format
