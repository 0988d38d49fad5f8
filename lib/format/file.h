// The one file layer every read goes through. A Source is something with a size that can be read
// at an offset; File is the pread-backed one (EINTR retried, short reads continued, EOF reported as a
// truncation, never an over-read); MemorySource serves tests and fuzzers.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "lib/util/status.h"

namespace strata::format {

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
  // Opens `path` read-only. MOE_ERR_IO_OPEN naming the path and errno text on failure.
  static absl::StatusOr<std::unique_ptr<File>> Open(const std::string &path);
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

// Reads a whole (small) file into a string: config.json, index files. Refuses files over max_bytes.
absl::StatusOr<std::string> ReadSmallFile(const std::string &path, uint64_t max_bytes);

}  // namespace strata::format
