// The one file layer every read and write goes through. A Source is something with a size that can
// be read at an offset; File is the pread-backed one (EINTR retried, short reads continued, EOF
// reported as a truncation, never an over-read); MemorySource serves tests and fuzzers. Every path
// Strata opens goes through OpenRegularFile, which never blocks on a FIFO and refuses devices; every
// write through WriteAll and SyncFile. Tests inject faults at these seams (Set*ForTesting).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "lib/util/status.h"

namespace strata::format {

// A file descriptor owned: closed when this goes.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd &&o) noexcept : fd_(o.Release()) {}
  UniqueFd &operator=(UniqueFd &&o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  UniqueFd(const UniqueFd &) = delete;
  UniqueFd &operator=(const UniqueFd &) = delete;
  ~UniqueFd() { Reset(); }
  int get() const { return fd_; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct OpenOptions {
  int flags = O_RDONLY;  // access mode and creation flags; O_NONBLOCK, O_CLOEXEC, O_NOCTTY are added
  mode_t mode = 0644;    // for O_CREAT
  // A block device has a fixed size and opens without waiting: a model may live on one.
  bool allow_block_device = false;
};

// Opens `path` the one way Strata opens paths: O_NONBLOCK so a FIFO cannot hold open(2) forever
// (cleared again once open), O_CLOEXEC, O_NOCTTY; then anything but a regular file (or an allowed
// block device) is refused with MOE_ERR_IO_OPEN "cannot open 'PATH': it is a FIFO, not a regular
// file" (a character device, a directory, a socket). `st` (nullable) receives the file's fstat.
absl::StatusOr<UniqueFd> OpenRegularFile(const std::string &path, const OpenOptions &options = {},
                                         struct stat *st = nullptr);

class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly `n` bytes at `offset` into `dst`. A range past the end is MOE_ERR_FORMAT_TRUNCATED
  // (nothing is read); an OS failure is MOE_ERR_IO_READ naming the file.
  virtual absl::Status ReadAt(uint64_t offset, void *dst, uint64_t n) const = 0;
  virtual const std::string &name() const = 0;
};

class File final : public Source {
 public:
  // Opens `path` read-only through OpenRegularFile (a regular file or a block device).
  // MOE_ERR_IO_OPEN naming the path and what is wrong on failure.
  static absl::StatusOr<std::unique_ptr<File>> Open(const std::string &path);
  // The same, also giving open(2)'s errno when that call failed (0 otherwise), so a caller can
  // tell "nothing there" (ENOENT) from a failure with one open and no check before it.
  static absl::StatusOr<std::unique_ptr<File>> Open(const std::string &path, int *open_errno);
  ~File() override;
  File(const File &) = delete;
  File &operator=(const File &) = delete;

  uint64_t size() const override { return size_; }
  absl::Status ReadAt(uint64_t offset, void *dst, uint64_t n) const override;
  const std::string &name() const override { return path_; }
  int fd() const { return fd_; }
  // Device and inode at open, so a replaced file can be detected (MOE_ERR_IO_CHANGED).
  absl::Status CheckUnchanged() const;

 private:
  File(std::string path, int fd, uint64_t size, uint64_t dev, uint64_t ino, int64_t mtime_ns)
      : path_(std::move(path)), fd_(fd), size_(size), dev_(dev), ino_(ino), mtime_ns_(mtime_ns) {}
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t dev_ = 0, ino_ = 0;
  int64_t mtime_ns_ = 0;
};

class MemorySource final : public Source {
 public:
  MemorySource(const void *data, uint64_t size, std::string name = "<memory>")
      : data_(static_cast<const uint8_t *>(data)), size_(size), name_(std::move(name)) {}
  uint64_t size() const override { return size_; }
  absl::Status ReadAt(uint64_t offset, void *dst, uint64_t n) const override;
  const std::string &name() const override { return name_; }

 private:
  const uint8_t *data_;
  uint64_t size_;
  std::string name_;
};

// Fault injection for tests: every File::ReadAt calls `fn` instead of pread(2) while it is set
// (nullptr restores pread). Returns the previous function. Not for production use.
using PreadFn = ssize_t (*)(int fd, void *buf, size_t count, off_t offset);
PreadFn SetPreadForTesting(PreadFn fn);
// The function set by SetPreadForTesting, or nullptr: readers past File (O_DIRECT) call it too.
PreadFn PreadForTesting();

// Fault injection for tests, as SetPreadForTesting: while set, WriteAll calls `fn` instead of
// write(2) and SyncFile `fn` instead of fsync(2). Each returns the previous function.
using WriteFn = ssize_t (*)(int fd, const void *buf, size_t count);
using FsyncFn = int (*)(int fd);
WriteFn SetWriteForTesting(WriteFn fn);
FsyncFn SetFsyncForTesting(FsyncFn fn);

// The one way Strata writes files: all `n` bytes to `fd`, EINTR retried and short writes
// continued. A failure (ENOSPC, EIO, a write that makes no progress) is MOE_ERR_IO_WRITE
// "writing N bytes to 'NAME': why".
absl::Status WriteAll(int fd, const void *data, size_t n, const std::string &name);
// fsync(2) of `fd`, EINTR retried; MOE_ERR_IO_WRITE "fsync of 'NAME': why".
absl::Status SyncFile(int fd, const std::string &name);

// Reads a whole (small) file into a string: config.json, index files. Refuses files over max_bytes
// (MOE_ERR_LIMIT) and special files (MOE_ERR_IO_OPEN).
absl::StatusOr<std::string> ReadSmallFile(const std::string &path, uint64_t max_bytes);
// ReadSmallFile for a file that may be absent: nullopt when nothing is at `path`; anything that is
// there (a FIFO, a directory, an unreadable file, a dangling symlink) is read or refused as by
// ReadSmallFile. The path is opened once: no check-then-open race.
absl::StatusOr<std::optional<std::string>> ReadOptionalSmallFile(const std::string &path, uint64_t max_bytes);

}  // namespace strata::format
