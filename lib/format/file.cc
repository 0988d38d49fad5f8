// File access: the one way paths are opened, the pread-backed File, the in-memory source for tests
// and fuzzers, and small-file reads. Invariants: no open waits on a FIFO and no special file is read;
// a read either fills all `n` bytes or fails; a range past the end fails before any byte is read;
// every error names the file.
#include "lib/format/file.h"

#include <atomic>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace strata::format {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

int64_t MtimeNs(const struct stat &st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// The common range check of every Source: `offset + n` must not wrap and must stay inside `size`.
absl::Status CheckRange(const std::string &name, uint64_t size, uint64_t offset, uint64_t n) {
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, n, &end) || end > size) {
    return Errorf(MOE_ERR_FORMAT_TRUNCATED,
                  "%s: reading %u bytes at offset %u goes past the end of the file (%u bytes)", name,
                  n, offset, size);
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// What a non-regular file is, for a message: "a FIFO", "a character device", ...
const char *KindOf(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

absl::Status NotRegular(const std::string &path, mode_t mode) {
  return Errorf(MOE_ERR_IO_OPEN, "cannot open '%s': it is %s, not a regular file", path, KindOf(mode));
}

}  // namespace

void UniqueFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

// OpenRegularFile, also giving open(2)'s errno when that call failed (0 otherwise).
absl::StatusOr<UniqueFd> OpenRegularFileImpl(const std::string &path, const OpenOptions &options,
                                             struct stat *st_out, int *open_errno) {
  *open_errno = 0;
  // O_NONBLOCK: open(2) of a FIFO would otherwise wait for a writer (or a reader) forever.
  const int flags = options.flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  int fd;
  do {
    fd = ::open(path.c_str(), flags, options.mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    *open_errno = err;
    struct stat st;
    // ENXIO: a FIFO opened for writing with no reader, or a socket; EEXIST (O_EXCL) or ELOOP
    // (O_NOFOLLOW): something already there. Name what it is when it is not a regular file.
    if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode);
    if ((err == EEXIST || (err == ELOOP && (options.flags & O_NOFOLLOW) != 0)) && ::lstat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      return NotRegular(path, st.st_mode);
    }
    return Errorf(MOE_ERR_IO_OPEN, "cannot open '%s': %s", path, ErrnoText(err));
  }
  UniqueFd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return Errorf(MOE_ERR_IO_OPEN, "cannot stat '%s': %s", path, ErrnoText(errno));
  }
  if (!S_ISREG(st.st_mode) && !(options.allow_block_device && S_ISBLK(st.st_mode))) {
    return NotRegular(path, st.st_mode);
  }
  // Reads of a regular file never block anyway; the flag goes so the descriptor behaves as usual.
  const int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0 || ::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
    return Errorf(MOE_ERR_IO_OPEN, "cannot clear O_NONBLOCK on '%s': %s", path, ErrnoText(errno));
  }
  if (st_out != nullptr) *st_out = st;
  return owned;
}

}  // namespace

absl::StatusOr<UniqueFd> OpenRegularFile(const std::string &path, const OpenOptions &options, struct stat *st_out) {
  int open_errno = 0;
  return OpenRegularFileImpl(path, options, st_out, &open_errno);
}

absl::StatusOr<std::unique_ptr<File>> File::Open(const std::string &path) {
  int open_errno = 0;
  return Open(path, &open_errno);
}

absl::StatusOr<std::unique_ptr<File>> File::Open(const std::string &path, int *open_errno) {
  OpenOptions o;
  o.allow_block_device = true;
  struct stat st;
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenRegularFileImpl(path, o, &st, open_errno));
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (S_ISBLK(st.st_mode)) {
    off_t end = ::lseek(fd.get(), 0, SEEK_END);
    if (end < 0) {
      return Errorf(MOE_ERR_IO_OPEN, "cannot size block device '%s': %s", path, ErrnoText(errno));
    }
    size = static_cast<uint64_t>(end);
  }
  return std::unique_ptr<File>(new File(path, fd.Release(), size, static_cast<uint64_t>(st.st_dev),
                                        static_cast<uint64_t>(st.st_ino), MtimeNs(st)));
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {
std::atomic<PreadFn> g_pread{nullptr};
}  // namespace

PreadFn SetPreadForTesting(PreadFn fn) { return g_pread.exchange(fn); }
PreadFn PreadForTesting() { return g_pread.load(std::memory_order_relaxed); }

namespace {
std::atomic<WriteFn> g_write{nullptr};
std::atomic<FsyncFn> g_fsync{nullptr};
}  // namespace

WriteFn SetWriteForTesting(WriteFn fn) { return g_write.exchange(fn); }
FsyncFn SetFsyncForTesting(FsyncFn fn) { return g_fsync.exchange(fn); }

absl::Status WriteAll(int fd, const void *data, size_t n, const std::string &name) {
  const auto *p = static_cast<const uint8_t *>(data);
  size_t done = 0;
  while (done < n) {
    const size_t want = std::min<size_t>(n - done, size_t{1} << 30);
    WriteFn hook = g_write.load(std::memory_order_relaxed);
    const ssize_t w = hook ? hook(fd, p + done, want) : ::write(fd, p + done, want);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      return Errorf(MOE_ERR_IO_WRITE, "writing %u bytes to '%s': %s", n - done, name,
                    w < 0 ? ErrnoText(errno) : std::string("no progress (the device took nothing)"));
    }
    done += static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status SyncFile(int fd, const std::string &name) {
  for (;;) {
    FsyncFn hook = g_fsync.load(std::memory_order_relaxed);
    if ((hook ? hook(fd) : ::fsync(fd)) == 0) return absl::OkStatus();
    if (errno != EINTR) return Errorf(MOE_ERR_IO_WRITE, "fsync of '%s': %s", name, ErrnoText(errno));
  }
}

absl::Status File::ReadAt(uint64_t offset, void *dst, uint64_t n) const {
  STRATA_RETURN_IF_ERROR(CheckRange(path_, size_, offset, n));
  auto *out = static_cast<uint8_t *>(dst);
  uint64_t done = 0;
  while (done < n) {
    // pread's count is capped so the ssize_t result cannot overflow; Linux moves at most ~2 GiB
    // per call anyway.
    size_t want = static_cast<size_t>(std::min<uint64_t>(n - done, 1u << 30));
    PreadFn hook = g_pread.load(std::memory_order_relaxed);
    ssize_t got = hook ? hook(fd_, out + done, want, static_cast<off_t>(offset + done))
                       : ::pread(fd_, out + done, want, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return Errorf(MOE_ERR_IO_READ, "reading %u bytes at offset %u of '%s': %s", want,
                    offset + done, path_, ErrnoText(errno));
    }
    if (got == 0) {
      // The size was checked at open, so an early EOF means the file shrank underneath us.
      return Errorf(MOE_ERR_IO_CHANGED,
                    "'%s' ended at offset %u, before the %u bytes it had when opened", path_,
                    offset + done, size_);
    }
    done += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::Status File::CheckUnchanged() const {
  struct stat st;
  if (::stat(path_.c_str(), &st) != 0) {
    return Errorf(MOE_ERR_IO_CHANGED, "'%s' is gone since it was opened: %s", path_,
                  ErrnoText(errno));
  }
  if (static_cast<uint64_t>(st.st_dev) != dev_ || static_cast<uint64_t>(st.st_ino) != ino_) {
    return Errorf(MOE_ERR_IO_CHANGED, "'%s' was replaced by another file since it was opened",
                  path_);
  }
  if (S_ISREG(st.st_mode) && static_cast<uint64_t>(st.st_size) != size_) {
    return Errorf(MOE_ERR_IO_CHANGED, "'%s' changed size since it was opened (%u -> %d bytes)",
                  path_, size_, static_cast<int64_t>(st.st_size));
  }
  if (MtimeNs(st) != mtime_ns_) {
    return Errorf(MOE_ERR_IO_CHANGED, "'%s' was modified since it was opened", path_);
  }
  return absl::OkStatus();
}

absl::Status MemorySource::ReadAt(uint64_t offset, void *dst, uint64_t n) const {
  STRATA_RETURN_IF_ERROR(CheckRange(name_, size_, offset, n));
  if (n > 0) std::memcpy(dst, data_ + offset, static_cast<size_t>(n));
  return absl::OkStatus();
}

namespace {

absl::StatusOr<std::string> ReadWhole(const File &file, uint64_t max_bytes) {
  if (file.size() > max_bytes) {
    return Errorf(MOE_ERR_LIMIT, "'%s' is %u bytes, over the %u-byte limit for this kind of file",
                  file.name(), file.size(), max_bytes);
  }
  std::string out(static_cast<size_t>(file.size()), '\0');
  STRATA_RETURN_IF_ERROR(file.ReadAt(0, out.data(), out.size()));
  return out;
}

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string &path, uint64_t max_bytes) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<File> file, File::Open(path));
  return ReadWhole(*file, max_bytes);
}

absl::StatusOr<std::optional<std::string>> ReadOptionalSmallFile(const std::string &path, uint64_t max_bytes) {
  // One open: nothing there (ENOENT) is "absent"; anything else that fails is reported. A
  // dangling symlink also fails with ENOENT, but it is something there, so it is an error.
  int open_errno = 0;
  absl::StatusOr<std::unique_ptr<File>> file = File::Open(path, &open_errno);
  if (!file.ok()) {
    struct stat st;
    if (open_errno == ENOENT && ::lstat(path.c_str(), &st) != 0) return std::nullopt;
    if (open_errno == ENOENT) {
      return Errorf(MOE_ERR_IO_OPEN, "cannot open '%s': it is a symbolic link to nothing", path);
    }
    return file.status();
  }
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadWhole(**file, max_bytes));
  return text;
}

}  // namespace strata::format
