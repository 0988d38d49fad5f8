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

TEST_CASE("file: ReadOptionalSmallFile opens once: absent, present, or an error naming the path",
          "[format][file]") {
  TempDir dir;
  auto absent = ReadOptionalSmallFile(dir.File("tokenizer.json"), 100);
  REQUIRE(absent.ok());
  CHECK_FALSE(absent->has_value());
  testing::WriteFile(dir.File("tokenizer.json"), "{\"v\": 2}");
  auto present = ReadOptionalSmallFile(dir.File("tokenizer.json"), 100);
  REQUIRE(present.ok());
  CHECK(present->value() == "{\"v\": 2}");
  // A dangling symlink is something there, not nothing: its open fails with ENOENT all the same.
  REQUIRE(symlink(dir.File("gone.json").c_str(), dir.File("link.json").c_str()) == 0);
  auto dangling = ReadOptionalSmallFile(dir.File("link.json"), 100);
  REQUIRE_FALSE(dangling.ok());
  CHECK(StatusToMoe(dangling.status()) == MOE_ERR_IO_OPEN);
  CHECK(Contains(dangling.status(), dir.File("link.json")));
  CHECK(Contains(dangling.status(), "symbolic link"));
  // A directory where a file should be.
  REQUIRE(mkdir(dir.File("sub.json").c_str(), 0700) == 0);
  auto directory = ReadOptionalSmallFile(dir.File("sub.json"), 100);
  REQUIRE_FALSE(directory.ok());
  CHECK(Contains(directory.status(), dir.File("sub.json")));
}

TEST_CASE("file: creating with O_EXCL | O_NOFOLLOW names what is already at the path", "[format][file]") {
  TempDir dir;
  OpenOptions o;
  o.flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW;
  const std::string fifo = dir.File("out.tmp");
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  auto r = OpenRegularFile(fifo, o);
  REQUIRE_FALSE(r.ok());
  CHECK(StatusToMoe(r.status()) == MOE_ERR_IO_OPEN);
  CHECK(Contains(r.status(), fifo));
  CHECK(Contains(r.status(), "FIFO"));
  const std::string link = dir.File("link.tmp");
  REQUIRE(symlink(dir.File("victim").c_str(), link.c_str()) == 0);
  auto l = OpenRegularFile(link, o);
  REQUIRE_FALSE(l.ok());
  CHECK(Contains(l.status(), "symbolic link"));
  CHECK(access(dir.File("victim").c_str(), F_OK) != 0);  // nothing created through the link
  // Without O_EXCL a symlink is followed as usual (reads of a linked model keep working).
  testing::WriteFile(dir.File("victim"), "x");
  OpenOptions read;
  CHECK(OpenRegularFile(link, read).ok());
}

}  // namespace
}  // namespace strata::format
