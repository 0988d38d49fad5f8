// File layer tests: open errors name the path, reads past the end are truncations, a file that
// shrinks or is replaced underneath is reported as changed, and small-file reads honour their cap.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>

#include "lib/format/file.h"
#include "tests/format/format_test_util.h"

namespace strata::format {
namespace {

using testing::TempDir;

bool Contains(const absl::Status &st, const std::string &word) {
  return std::string(st.message()).find(word) != std::string::npos;
}

TEST_CASE("file: opens, reads exact ranges, and is close-on-exec", "[format][file]") {
  TempDir dir;
  std::string path = dir.File("data.bin");
  testing::WriteFile(path, "0123456789");
  auto f = File::Open(path);
  REQUIRE(f.ok());
  CHECK((*f)->size() == 10);
  CHECK((*f)->name() == path);
  CHECK((fcntl((*f)->fd(), F_GETFD) & FD_CLOEXEC) != 0);
  char buf[10];
  REQUIRE((*f)->ReadAt(3, buf, 4).ok());
  CHECK(std::string(buf, 4) == "3456");
  REQUIRE((*f)->ReadAt(0, buf, 10).ok());
  CHECK(std::string(buf, 10) == "0123456789");
  CHECK((*f)->ReadAt(10, buf, 0).ok());
}

TEST_CASE("file: reads past the end are truncations and read nothing", "[format][file]") {
  TempDir dir;
  std::string path = dir.File("data.bin");
  testing::WriteFile(path, "0123456789");
  auto f = File::Open(path);
  REQUIRE(f.ok());
  char buf[16] = {'x'};
  absl::Status st = (*f)->ReadAt(8, buf, 4);
  CHECK(StatusToMoe(st) == MOE_ERR_FORMAT_TRUNCATED);
  CHECK(Contains(st, "data.bin"));
  CHECK(Contains(st, "offset 8"));
  CHECK(buf[0] == 'x');
  // offset + n wrapping around 2^64 must not pass the check.
  st = (*f)->ReadAt(~0ull - 1, buf, 4);
  CHECK(StatusToMoe(st) == MOE_ERR_FORMAT_TRUNCATED);
  CHECK(buf[0] == 'x');
}

TEST_CASE("file: open errors name the path and the reason", "[format][file]") {
  TempDir dir;
  auto missing = File::Open(dir.File("absent.gguf"));
  REQUIRE_FALSE(missing.ok());
  CHECK(StatusToMoe(missing.status()) == MOE_ERR_IO_OPEN);
  CHECK(Contains(missing.status(), "absent.gguf"));
  CHECK(Contains(missing.status(), "No such file"));

  auto is_dir = File::Open(dir.path());
  REQUIRE_FALSE(is_dir.ok());
  CHECK(StatusToMoe(is_dir.status()) == MOE_ERR_IO_OPEN);
  CHECK(Contains(is_dir.status(), "not a regular file"));
}

TEST_CASE("file: a file that shrinks after open reports a change, not garbage", "[format][file]") {
  TempDir dir;
  std::string path = dir.File("data.bin");
  testing::WriteFile(path, std::string(1000, 'a'));
  auto f = File::Open(path);
  REQUIRE(f.ok());
  REQUIRE(::truncate(path.c_str(), 100) == 0);
  std::string buf(500, '\0');
  absl::Status st = (*f)->ReadAt(0, buf.data(), 500);
  CHECK(StatusToMoe(st) == MOE_ERR_IO_CHANGED);
  CHECK(Contains(st, "data.bin"));
  CHECK(StatusToMoe((*f)->CheckUnchanged()) == MOE_ERR_IO_CHANGED);
}

TEST_CASE("file: CheckUnchanged detects replacement, resize, modification and removal",
          "[format][file]") {
  TempDir dir;
  std::string path = dir.File("model.bin");
  testing::WriteFile(path, "abcdef");
  auto f = File::Open(path);
  REQUIRE(f.ok());
  CHECK((*f)->CheckUnchanged().ok());

  SECTION("replaced by rename") {
    testing::WriteFile(dir.File("other.bin"), "abcdef");
    REQUIRE(std::rename(dir.File("other.bin").c_str(), path.c_str()) == 0);
    absl::Status st = (*f)->CheckUnchanged();
    CHECK(StatusToMoe(st) == MOE_ERR_IO_CHANGED);
    CHECK(Contains(st, "replaced"));
  }
  SECTION("resized") {
    REQUIRE(::truncate(path.c_str(), 3) == 0);
    absl::Status st = (*f)->CheckUnchanged();
    CHECK(StatusToMoe(st) == MOE_ERR_IO_CHANGED);
    CHECK(Contains(st, "size"));
  }
  SECTION("modified in place with the same size") {
    struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
    REQUIRE(::utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
    absl::Status st = (*f)->CheckUnchanged();
    CHECK(StatusToMoe(st) == MOE_ERR_IO_CHANGED);
    CHECK(Contains(st, "modified"));
  }
  SECTION("removed") {
    REQUIRE(::unlink(path.c_str()) == 0);
    absl::Status st = (*f)->CheckUnchanged();
    CHECK(StatusToMoe(st) == MOE_ERR_IO_CHANGED);
    CHECK(Contains(st, "model.bin"));
  }
}

TEST_CASE("file: MemorySource checks ranges like File", "[format][file]") {
  const char data[] = "hello";
  MemorySource mem(data, 5, "mem");
  char buf[5];
  REQUIRE(mem.ReadAt(1, buf, 4).ok());
  CHECK(std::string(buf, 4) == "ello");
  CHECK(StatusToMoe(mem.ReadAt(2, buf, 4)) == MOE_ERR_FORMAT_TRUNCATED);
  CHECK(StatusToMoe(mem.ReadAt(~0ull, buf, 2)) == MOE_ERR_FORMAT_TRUNCATED);
  CHECK(mem.ReadAt(5, buf, 0).ok());
}

TEST_CASE("file: ReadSmallFile reads whole files under its cap", "[format][file]") {
  TempDir dir;
  testing::WriteFile(dir.File("config.json"), "{\"a\": 1}");
  auto s = ReadSmallFile(dir.File("config.json"), 100);
  REQUIRE(s.ok());
  CHECK(*s == "{\"a\": 1}");
  auto big = ReadSmallFile(dir.File("config.json"), 4);
  REQUIRE_FALSE(big.ok());
  CHECK(StatusToMoe(big.status()) == MOE_ERR_LIMIT);
  CHECK(Contains(big.status(), "config.json"));
  auto missing = ReadSmallFile(dir.File("nope.json"), 100);
  CHECK(StatusToMoe(missing.status()) == MOE_ERR_IO_OPEN);
  testing::WriteFile(dir.File("empty.json"), "");
  auto empty = ReadSmallFile(dir.File("empty.json"), 100);
  REQUIRE(empty.ok());
  CHECK(empty->empty());
}

}  // namespace
}  // namespace strata::format
