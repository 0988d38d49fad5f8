// Session snapshots: writing (streamed through a CRC-32C into a temporary file that is fsynced and
// renamed over the target, then the directory fsynced) and reading (whole file, checked in the
// order magic -> version -> size -> checksum -> model -> sections, every field range-checked) for
// Context::SaveSession / LoadSession. A load either opens a complete session or changes nothing.
#include "lib/util/str_format.h"
#include "lib/runtime/snapshot.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lib/format/file.h"
#include "lib/runtime/context.h"
#include "lib/util/crc32c.h"

namespace strata::runtime {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "snapshots are written little-endian as in memory");

// Section tags (four ASCII letters, little-endian).
constexpr uint32_t Tag(const char (&s)[5]) {
  return static_cast<uint32_t>(s[0]) | static_cast<uint32_t>(s[1]) << 8 | static_cast<uint32_t>(s[2]) << 16 |
         static_cast<uint32_t>(s[3]) << 24;
}
constexpr uint32_t kTagOptions = Tag("OPTS");
constexpr uint32_t kTagState = Tag("STAT");
constexpr uint32_t kTagHistory = Tag("HIST");
constexpr uint32_t kTagPending = Tag("PEND");
constexpr uint32_t kTagLogits = Tag("LOGT");
constexpr uint32_t kTagKv = Tag("KVRW");
constexpr int kArchBytes = 24;
constexpr int kNumHparams = 10;

uint64_t Fnv(uint64_t h, const void *data, size_t n) {
  const auto *p = static_cast<const uint8_t *>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// The hyper-parameters a header records, in order, with their names for messages.
struct HparamList {
  int32_t v[kNumHparams];
};
constexpr const char *kHparamNames[kNumHparams] = {"n_layer", "n_embd", "n_head", "n_head_kv", "head_dim",
                                                   "n_vocab", "n_expert", "n_expert_used", "KV key width",
                                                   "KV value width"};
HparamList HparamsOf(const model::HParams &hp) {
  const model::KvCache::Widths w = model::KvCache::WidthsFor(hp);
  return HparamList{{hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim, hp.n_vocab, hp.n_expert,
                     hp.n_expert_used, w.k, w.v}};
}

// Bytes appended in memory (small sections) before they are streamed out.
class Buf {
 public:
  template <typename T>
  void Put(const T &v) {
    const auto *p = reinterpret_cast<const char *>(&v);
    b_.insert(b_.end(), p, p + sizeof v);
  }
  void PutBytes(const void *p, size_t n) {
    b_.insert(b_.end(), static_cast<const char *>(p), static_cast<const char *>(p) + n);
  }
  template <typename T>
  void PutVec(const std::vector<T> &v) {
    Put(static_cast<uint64_t>(v.size()));
    PutBytes(v.data(), v.size() * sizeof(T));
  }
  const std::vector<char> &bytes() const { return b_; }

 private:
  std::vector<char> b_;
};

// Bytes written through a buffer to a sink (a file, or the host's memory), with a running CRC-32C
// of everything written.
class Writer {
 public:
  using Sink = std::function<absl::Status(const char *, size_t)>;
  explicit Writer(Sink sink) : sink_(std::move(sink)) { buf_.reserve(kCap); }
  absl::Status Write(const void *p, size_t n) {
    crc_ = Crc32c(crc_, p, n);
    const char *c = static_cast<const char *>(p);
    while (n > 0) {
      const size_t k = std::min(n, kCap - buf_.size());
      buf_.insert(buf_.end(), c, c + k);
      c += k;
      n -= k;
      if (buf_.size() == kCap) STRATA_RETURN_IF_ERROR(Flush());
    }
    return absl::OkStatus();
  }
  absl::Status Flush() {
    STRATA_RETURN_IF_ERROR(sink_(buf_.data(), buf_.size()));
    buf_.clear();
    return absl::OkStatus();
  }
  uint32_t crc() const { return crc_; }

 private:
  static constexpr size_t kCap = 1 << 20;
  Sink sink_;
  std::vector<char> buf_;
  uint32_t crc_ = 0;
};

// Bounds-checked reads from the snapshot bytes; a read past the section fails with a message
// naming what was being read.
class Reader {
 public:
  Reader(const uint8_t *p, uint64_t n, std::string what) : p_(p), n_(n), what_(std::move(what)) {}
  template <typename T>
  absl::Status Get(T *v, const char *field) {
    if (n_ - at_ < sizeof(T)) return Short(field);
    std::memcpy(v, p_ + at_, sizeof(T));
    at_ += sizeof(T);
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status GetVec(std::vector<T> *v, const char *field, uint64_t max_count) {
    uint64_t count = 0;
    STRATA_RETURN_IF_ERROR(Get(&count, field));
    if (count > max_count) {
      return Errorf(MOE_ERR_FORMAT_METADATA, "snapshot %s: %s has %u entries, more than the %u allowed", what_, field,
                    count, max_count);
    }
    if ((n_ - at_) / sizeof(T) < count) return Short(field);
    v->resize(count);
    if (count > 0) std::memcpy(v->data(), p_ + at_, count * sizeof(T));
    at_ += count * sizeof(T);
    return absl::OkStatus();
  }
  absl::Status GetString(std::string *s, const char *field) {
    std::vector<char> c;
    STRATA_RETURN_IF_ERROR(GetVec(&c, field, 1 << 20));
    s->assign(c.begin(), c.end());
    return absl::OkStatus();
  }
  absl::Status Done() const {
    if (at_ != n_) {
      return Errorf(MOE_ERR_FORMAT_METADATA, "snapshot %s section has %u bytes after its last field", what_, n_ - at_);
    }
    return absl::OkStatus();
  }
  const uint8_t *here() const { return p_ + at_; }
  uint64_t left() const { return n_ - at_; }

 private:
  absl::Status Short(const char *field) const {
    return Errorf(MOE_ERR_FORMAT_METADATA, "snapshot %s section ends inside %s", what_, field);
  }
  const uint8_t *p_;
  uint64_t n_;
  uint64_t at_ = 0;
  std::string what_;
};

void PutOptions(Buf &b, const SessionOptions &o, int n_ctx) {
  b.Put(static_cast<int32_t>(n_ctx));
  b.Put(o.seed);
  b.Put(o.sampler.temperature);
  b.Put(o.sampler.top_k);
  b.Put(o.sampler.top_p);
  b.Put(o.sampler.min_p);
  b.Put(o.sampler.repeat_penalty);
  b.Put(o.sampler.presence_penalty);
  b.Put(o.sampler.penalty_last_n);
  b.Put(static_cast<uint8_t>(o.logits_all));
  b.Put(static_cast<uint8_t>(o.stop_at_eos));
  b.Put(static_cast<int32_t>(o.window));
  b.PutVec(o.stop_tokens);
  b.PutVec(o.blocked_tokens);
  b.Put(static_cast<uint64_t>(o.stop_strings.size()));
  for (const auto &s : o.stop_strings) b.PutVec(std::vector<char>(s.begin(), s.end()));
  b.Put(o.sampler.frequency_penalty);  // since version 3
  b.Put(static_cast<uint8_t>(o.ctx_shift));  // since version 4
  b.Put(static_cast<int32_t>(o.n_keep));
}

// `version`: the snapshot's; fields appended in later versions keep their defaults in older files.
absl::Status GetOptions(Reader &r, uint32_t version, SessionOptions *o) {
  int32_t n_ctx = 0, window = 0;
  uint8_t logits_all = 0, stop_at_eos = 0;
  STRATA_RETURN_IF_ERROR(r.Get(&n_ctx, "n_ctx"));
  STRATA_RETURN_IF_ERROR(r.Get(&o->seed, "seed"));
  STRATA_RETURN_IF_ERROR(r.Get(&o->sampler.temperature, "temperature"));
  STRATA_RETURN_IF_ERROR(r.Get(&o->sampler.top_k, "top_k"));
  STRATA_RETURN_IF_ERROR(r.Get(&o->sampler.top_p, "top_p"));
  STRATA_RETURN_IF_ERROR(r.Get(&o->sampler.min_p, "min_p"));
  STRATA_RETURN_IF_ERROR(r.Get(&o->sampler.repeat_penalty, "repeat_penalty"));
  STRATA_RETURN_IF_ERROR(r.Get(&o->sampler.presence_penalty, "presence_penalty"));
  STRATA_RETURN_IF_ERROR(r.Get(&o->sampler.penalty_last_n, "penalty_last_n"));
  STRATA_RETURN_IF_ERROR(r.Get(&logits_all, "logits_all"));
  STRATA_RETURN_IF_ERROR(r.Get(&stop_at_eos, "stop_at_eos"));
  STRATA_RETURN_IF_ERROR(r.Get(&window, "window"));
  STRATA_RETURN_IF_ERROR(r.GetVec(&o->stop_tokens, "stop tokens", 1 << 20));
  STRATA_RETURN_IF_ERROR(r.GetVec(&o->blocked_tokens, "blocked tokens", 1 << 24));
  uint64_t n_strings = 0;
  STRATA_RETURN_IF_ERROR(r.Get(&n_strings, "stop string count"));
  if (n_strings > (1 << 20)) return Errorf(MOE_ERR_FORMAT_METADATA, "snapshot has %u stop strings", n_strings);
  o->stop_strings.resize(n_strings);
  for (auto &s : o->stop_strings) STRATA_RETURN_IF_ERROR(r.GetString(&s, "stop string"));
  if (version >= 3) STRATA_RETURN_IF_ERROR(r.Get(&o->sampler.frequency_penalty, "frequency_penalty"));
  uint8_t ctx_shift = 0;
  int32_t n_keep = 0;
  if (version >= 4) {
    STRATA_RETURN_IF_ERROR(r.Get(&ctx_shift, "ctx_shift"));
    STRATA_RETURN_IF_ERROR(r.Get(&n_keep, "n_keep"));
  }
  if (logits_all > 1 || stop_at_eos > 1 || ctx_shift > 1) {
    return Errorf(MOE_ERR_FORMAT_METADATA, "snapshot options: flags %u, %u, %u are not 0 or 1", logits_all,
                  stop_at_eos, ctx_shift);
  }
  o->ctx_shift = ctx_shift != 0;
  o->n_keep = n_keep;  // checked with the other params when the session opens
  o->n_ctx = n_ctx;
  o->window = window;
  o->logits_all = logits_all != 0;
  o->stop_at_eos = stop_at_eos != 0;
  return r.Done();
}

// Removes a temporary file unless released (the snapshot was renamed into place).
struct TempFile {
  std::string path;
  int fd = -1;
  ~TempFile() {
    if (fd >= 0) close(fd);
    if (!path.empty()) unlink(path.c_str());
  }
};

std::string DirOf(const std::string &path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

uint64_t ModelIdentity(const model::HParams &hp, const model::ModelFile &mf) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = Fnv(h, hp.arch_name.data(), hp.arch_name.size());
  const HparamList l = HparamsOf(hp);
  h = Fnv(h, l.v, sizeof l.v);
  for (const auto &t : mf.tensors()) {
    h = Fnv(h, t.name.data(), t.name.size() + 0);
    h = Fnv(h, &t.type, sizeof t.type);
    h = Fnv(h, &t.n_dims, sizeof t.n_dims);
    h = Fnv(h, t.ne, sizeof t.ne);
  }
  return h;
}

absl::StatusOr<uint64_t> WeightsDigest(const model::ModelFile &mf) {
  const auto &tensors = mf.tensors();
  const uint64_t n = tensors.size();
  // Pieces per sampled tensor, and the stride between sampled tensors, within the budget.
  const uint64_t per_tensor = n == 0 ? 4 : std::clamp<uint64_t>(kWeightsDigestMaxPieces / n, 1, 4);
  const uint64_t stride = (n + kWeightsDigestMaxPieces - 1) / kWeightsDigestMaxPieces;  // 1 up to the budget
  constexpr uint64_t kPiece = kWeightsDigestPieceBytes;
  std::vector<uint8_t> buf(4 * kPiece);
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t i = 0; i < n; ++i) {
    const model::TensorRef &t = tensors[i];
    h = Fnv(h, t.name.data(), t.name.size());
    h = Fnv(h, &t.type, sizeof t.type);
    h = Fnv(h, &t.n_dims, sizeof t.n_dims);
    h = Fnv(h, t.ne, sizeof t.ne);
    h = Fnv(h, &t.file_index, sizeof t.file_index);
    h = Fnv(h, &t.offset, sizeof t.offset);
    h = Fnv(h, &t.nbytes, sizeof t.nbytes);
    if (i % stride != 0 || t.nbytes == 0) continue;
    // Piece starts: the first, the last, and the rest evenly spaced between; whole when small.
    const format::File &f = mf.file(t.file_index);
    uint32_t crc = 0;
    auto read = [&](uint64_t at, uint64_t len) -> absl::Status {
      STRATA_RETURN_IF_ERROR(f.ReadAt(t.offset + at, buf.data(), len));
      crc = Crc32c(crc, buf.data(), len);
      return absl::OkStatus();
    };
    if (t.nbytes <= per_tensor * kPiece) {
      for (uint64_t at = 0; at < t.nbytes; at += kPiece) {
        STRATA_RETURN_IF_ERROR(read(at, std::min(kPiece, t.nbytes - at)));
      }
    } else {
      const uint64_t last = t.nbytes - kPiece;
      for (uint64_t k = 0; k < per_tensor; ++k) {
        const uint64_t at = per_tensor == 1 ? 0 : last * k / (per_tensor - 1);
        STRATA_RETURN_IF_ERROR(read(at, kPiece));
      }
    }
    h = Fnv(h, &crc, sizeof crc);
  }
  return h;
}

absl::Status Context::WriteSnapshotLocked(Session *s, const std::function<absl::Status(uint64_t)> &begin,
                                          const std::function<absl::Status(const char *, size_t)> &sink) {
  const model::KvCache::Widths w = s->kv_.widths();
  const int n = s->n_past_;
  // The small sections first, in memory.
  Buf opts, state, hist, pend, logits;
  PutOptions(opts, s->opts_, s->n_ctx_);
  uint64_t rng[4];
  s->rng_.GetState(rng);
  state.Put(static_cast<int32_t>(n));
  state.Put(s->n_logit_rows_);
  state.PutBytes(rng, sizeof rng);
  hist.PutVec(s->history_);
  pend.PutVec(s->pending_);
  logits.PutVec(s->logits_);
  const uint64_t kv_bytes =
      static_cast<uint64_t>(hp_.n_layer) * static_cast<uint64_t>(n) * (w.k + w.v) * sizeof(float) + 8;
  const Buf *small[] = {&opts, &state, &hist, &pend, &logits};
  const uint32_t tags[] = {kTagOptions, kTagState, kTagHistory, kTagPending, kTagLogits};
  uint64_t total = kSnapshotHeaderBytes + 16 + kv_bytes + 4;
  for (const Buf *b : small) total += 16 + b->bytes().size();

  Buf header;
  header.PutBytes(kSnapshotMagic, sizeof kSnapshotMagic);
  header.Put(kSnapshotVersion);
  header.Put(kSnapshotHeaderBytes);
  header.Put(total);
  header.Put(model_id_);
  header.Put(weights_digest_);
  char arch[kArchBytes] = {};
  std::memcpy(arch, hp_.arch_name.data(), std::min<size_t>(hp_.arch_name.size(), kArchBytes - 1));
  header.PutBytes(arch, sizeof arch);
  const HparamList hl = HparamsOf(hp_);
  header.PutBytes(hl.v, sizeof hl.v);
  header.Put(static_cast<uint32_t>(6));  // sections
  header.Put(static_cast<uint32_t>(0));
  if (header.bytes().size() != kSnapshotHeaderBytes) {
    return Errorf(MOE_ERR_INTERNAL, "snapshot header is %u bytes", header.bytes().size());
  }
  STRATA_RETURN_IF_ERROR(begin(total));
  Writer out(sink);
  absl::Status st = out.Write(header.bytes().data(), header.bytes().size());
  for (int i = 0; i < 5 && st.ok(); ++i) {
    const uint32_t tag = tags[i], zero = 0;
    const uint64_t len = small[i]->bytes().size();
    st.Update(out.Write(&tag, 4));
    st.Update(out.Write(&zero, 4));
    st.Update(out.Write(&len, 8));
    st.Update(out.Write(small[i]->bytes().data(), len));
  }
  STRATA_RETURN_IF_ERROR(st);
  {
    const uint32_t tag = kTagKv, zero = 0;
    const uint64_t len = kv_bytes;
    const int32_t widths[2] = {w.k, w.v};
    st.Update(out.Write(&tag, 4));
    st.Update(out.Write(&zero, 4));
    st.Update(out.Write(&len, 8));
    st.Update(out.Write(widths, 8));
    std::vector<float> rows;
    for (int l = 0; l < hp_.n_layer && st.ok(); ++l) {
      for (bool values : {false, true}) {
        const int width = values ? w.v : w.k;
        rows.resize(static_cast<size_t>(n) * width);
        st.Update(s->kv_.ReadRows(l, values, n, rows.data()));
        if (st.ok()) st.Update(out.Write(rows.data(), rows.size() * sizeof(float)));
      }
    }
  }
  STRATA_RETURN_IF_ERROR(st);
  const uint32_t crc = out.crc();
  st.Update(out.Write(&crc, 4));
  st.Update(out.Flush());
  return st;
}

absl::Status Context::SaveSession(Session *s, const std::string &path) {
  if (path.empty()) return Errorf(MOE_ERR_INVALID_ARGUMENT, "empty snapshot path");
  std::lock_guard<std::mutex> lk(mu_);  // no step changes the session while it is written
  std::lock_guard<std::mutex> slk(s->mu_);
  TempFile tmp;
  auto fail = [&](const absl::Status &st) { return Annotate(st, strata::StrFormat("saving session to '%s'", path)); };
  // The temporary file is made once the snapshot's size is known, next to `path`.
  auto begin = [&](uint64_t) -> absl::Status {
    tmp.path = path + ".tmp-XXXXXX";
    tmp.fd = mkstemp(tmp.path.data());
    if (tmp.fd < 0) {
      tmp.path.clear();
      return Errorf(MOE_ERR_IO_OPEN, "cannot create a temporary file next to '%s': %s", path, std::strerror(errno));
    }
    return absl::OkStatus();
  };
  auto sink = [&](const char *p, size_t n) { return format::WriteAll(tmp.fd, p, n, tmp.path); };
  if (absl::Status st = WriteSnapshotLocked(s, begin, sink); !st.ok()) {
    // A temporary file that could not be made is named in the message already.
    return tmp.fd < 0 ? st : fail(st);
  }
  if (absl::Status sync = format::SyncFile(tmp.fd, tmp.path); !sync.ok()) return fail(sync);
  if (close(tmp.fd) != 0) {
    tmp.fd = -1;
    return fail(Errorf(MOE_ERR_IO_WRITE, "close: %s", std::strerror(errno)));
  }
  tmp.fd = -1;
  if (rename(tmp.path.c_str(), path.c_str()) != 0) {
    return fail(Errorf(MOE_ERR_IO_WRITE, "rename: %s", std::strerror(errno)));
  }
  tmp.path.clear();  // renamed: nothing to remove
  // The rename itself reaches the disk only when the directory does.
  const std::string dir = DirOf(path);
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return fail(Errorf(MOE_ERR_IO_WRITE, "opening directory '%s': %s", dir, std::strerror(errno)));
  const absl::Status sync = format::SyncFile(dfd, dir);
  close(dfd);
  if (!sync.ok()) return fail(sync);
  return absl::OkStatus();
}

absl::Status Context::SaveSessionBuffer(Session *s, void *buf, size_t cap, size_t *n_written) {
  std::lock_guard<std::mutex> lk(mu_);
  std::lock_guard<std::mutex> slk(s->mu_);
  size_t at = 0, total = 0;
  auto begin = [&](uint64_t bytes) -> absl::Status {
    if (bytes > SIZE_MAX) return Errorf(MOE_ERR_LIMIT, "the snapshot of %u bytes does not fit this address space", bytes);
    total = static_cast<size_t>(bytes);
    *n_written = total;
    if (buf == nullptr || cap < total) {
      return Errorf(MOE_ERR_LIMIT, "the session's snapshot takes %u bytes; the buffer %s", total,
                    buf == nullptr ? std::string("is NULL") : strata::StrFormat("holds %u", cap));
    }
    return absl::OkStatus();
  };
  auto sink = [&](const char *p, size_t n) -> absl::Status {
    if (n > total - at) return Errorf(MOE_ERR_INTERNAL, "the snapshot ran past the %u bytes it announced", total);
    std::memcpy(static_cast<char *>(buf) + at, p, n);
    at += n;
    return absl::OkStatus();
  };
  STRATA_RETURN_IF_ERROR(WriteSnapshotLocked(s, begin, sink));
  if (at != total) return Errorf(MOE_ERR_INTERNAL, "the snapshot wrote %u of the %u bytes it announced", at, total);
  return absl::OkStatus();
}

namespace {

// A snapshot's header, read and checked against the size of the bytes it heads.
struct SnapshotHeader {
  uint32_t version = 0;
  uint64_t model_id = 0, weights_digest = 0;
  char arch[kArchBytes] = {};
  HparamList hl;
  uint32_t n_sections = 0;
};

// Checks, in order, the magic, the version, the header size and the total size against `size`,
// the snapshot's real size; `head` holds its first kSnapshotHeaderBytes (size permitting).
absl::StatusOr<SnapshotHeader> ParseSnapshotHeader(const uint8_t *head, uint64_t size, const std::string &name) {
  auto err = [&](moe_status code, const std::string &what) {
    return MakeError(code, strata::StrFormat("session snapshot '%s': %s", name, what));
  };
  if (size < kSnapshotHeaderBytes) {
    return err(MOE_ERR_FORMAT_TRUNCATED,
               strata::StrFormat("%u bytes, shorter than the %u-byte header", size, kSnapshotHeaderBytes));
  }
  if (std::memcmp(head, kSnapshotMagic, sizeof kSnapshotMagic) != 0) {
    return err(MOE_ERR_FORMAT_HEADER, "not a Strata session snapshot (bad magic)");
  }
  Reader h(head + 8, kSnapshotHeaderBytes - 8, "header");
  SnapshotHeader out;
  uint32_t version = 0, header_bytes = 0, reserved = 0;
  uint64_t total = 0;
  STRATA_RETURN_IF_ERROR(h.Get(&version, "version"));
  if (version == 1) {
    // Version 1 did not record the weights, so it cannot be told from a session of a fine-tune.
    return err(MOE_ERR_UNSUPPORTED,
               strata::StrFormat("format version 1 predates the weights digest this library (version %u) checks: "
                               "it cannot be verified against this model; save the session again",
                               kSnapshotVersion));
  }
  STRATA_RETURN_IF_ERROR(h.Get(&header_bytes, "header size"));
  STRATA_RETURN_IF_ERROR(h.Get(&total, "total size"));
  STRATA_RETURN_IF_ERROR(h.Get(&out.model_id, "model id"));
  STRATA_RETURN_IF_ERROR(h.Get(&out.weights_digest, "weights digest"));
  STRATA_RETURN_IF_ERROR(h.Get(&out.arch, "architecture"));
  STRATA_RETURN_IF_ERROR(h.Get(&out.hl.v, "hyper-parameters"));
  STRATA_RETURN_IF_ERROR(h.Get(&out.n_sections, "section count"));
  STRATA_RETURN_IF_ERROR(h.Get(&reserved, "reserved"));
  if (version > kSnapshotVersion) {
    return err(MOE_ERR_UNSUPPORTED, strata::StrFormat("format version %u is newer than this library reads (%u)",
                                                    version, kSnapshotVersion));
  }
  if (version == 0 || header_bytes != kSnapshotHeaderBytes || reserved != 0) {
    return err(MOE_ERR_FORMAT_HEADER, strata::StrFormat("bad header: version %u, header size %u, reserved %u", version,
                                                      header_bytes, reserved));
  }
  if (total > size) {
    return err(MOE_ERR_FORMAT_TRUNCATED,
               strata::StrFormat("%u bytes, but its header says %u: the file was cut short", size, total));
  }
  if (total < size) {
    return err(MOE_ERR_FORMAT_HEADER, strata::StrFormat("%u bytes, but its header says %u", size, total));
  }
  if (total < kSnapshotHeaderBytes + 4) return err(MOE_ERR_FORMAT_HEADER, "too short to hold a checksum");
  out.arch[kArchBytes - 1] = 0;
  out.version = version;
  return out;
}

}  // namespace

absl::StatusOr<Session *> Context::LoadSession(const std::string &path, const SessionOptions *override_opts) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<format::File> f, format::File::Open(path));
  const uint64_t size = f->size();
  // The header first, so a file that is not a snapshot (or disagrees with its own size) is refused
  // before the rest is read.
  std::vector<uint8_t> head(kSnapshotHeaderBytes);
  if (size >= kSnapshotHeaderBytes) STRATA_RETURN_IF_ERROR(f->ReadAt(0, head.data(), head.size()));
  STRATA_RETURN_IF_ERROR(ParseSnapshotHeader(head.data(), size, path).status());
  std::vector<uint8_t> data(size);
  STRATA_RETURN_IF_ERROR(f->ReadAt(0, data.data(), size));
  return LoadSessionBytes(data.data(), size, path, override_opts);
}

absl::StatusOr<Session *> Context::LoadSessionBytes(const uint8_t *data, uint64_t size, const std::string &path,
                                                    const SessionOptions *override_opts) {
  auto err = [&](moe_status code, const std::string &what) {
    return MakeError(code, strata::StrFormat("session snapshot '%s': %s", path, what));
  };
  STRATA_ASSIGN_OR_RETURN(const SnapshotHeader head, ParseSnapshotHeader(data, size, path));
  uint32_t stored_crc;
  std::memcpy(&stored_crc, data + size - 4, 4);
  const uint32_t crc = Crc32c(0, data, size - 4);
  if (crc != stored_crc) {
    return err(MOE_ERR_FORMAT_CHECKSUM,
               strata::StrFormat("checksum %08x does not match the stored %08x: the file is corrupt", crc, stored_crc));
  }
  const char *arch = head.arch;
  const HparamList &hl = head.hl;
  const uint64_t model_id = head.model_id, weights_digest = head.weights_digest;
  const uint32_t n_sections = head.n_sections;
  // The model: architecture and hyper-parameters by name, then the tensor table.
  if (std::string(arch) != hp_.arch_name) {
    return err(MOE_ERR_FORMAT_FOREIGN, strata::StrFormat("written for a '%s' model; this context runs '%s'", arch,
                                                       hp_.arch_name));
  }
  const HparamList mine = HparamsOf(hp_);
  for (int i = 0; i < kNumHparams; ++i) {
    if (hl.v[i] != mine.v[i]) {
      return err(MOE_ERR_FORMAT_FOREIGN, strata::StrFormat("written for a model with %s %d; this model has %d",
                                                         kHparamNames[i], hl.v[i], mine.v[i]));
    }
  }
  if (model_id != model_id_) {
    return err(MOE_ERR_FORMAT_FOREIGN,
               strata::StrFormat("written for another model of the same shape (model id %016x, this model %016x)",
                               model_id, model_id_));
  }
  if (weights_digest != weights_digest_) {
    return err(MOE_ERR_FORMAT_FOREIGN,
               strata::StrFormat("saved from another model: the tensors are the same but the weights differ (a "
                               "fine-tune or another quantization?); weights digest %016x, this model's %016x",
                               weights_digest, weights_digest_));
  }
  // Sections. Their readers' messages name the field; the snapshot is named once, here.
  SessionOptions o;
  int32_t n_past = -1, n_rows = 0;
  uint64_t rng[4] = {0, 0, 0, 0};
  std::vector<int32_t> history, pending;
  std::vector<float> logits;
  const uint8_t *kv = nullptr;
  uint64_t kv_len = 0;
  const absl::Status sections = [&]() -> absl::Status {
    Reader body(data + kSnapshotHeaderBytes, size - kSnapshotHeaderBytes - 4, "body");
    uint32_t seen = 0;
    for (uint32_t i = 0; i < n_sections; ++i) {
      uint32_t tag = 0, zero = 0;
      uint64_t len = 0;
      STRATA_RETURN_IF_ERROR(body.Get(&tag, "section tag"));
      STRATA_RETURN_IF_ERROR(body.Get(&zero, "section tag"));
      STRATA_RETURN_IF_ERROR(body.Get(&len, "section length"));
      if (len > body.left()) {
        return Errorf(MOE_ERR_FORMAT_METADATA, "section %u claims %u bytes; %u remain", i, len, body.left());
      }
      Reader r(body.here(), len, std::string(reinterpret_cast<const char *>(&tag), 4));
      uint32_t bit = 0;
      if (tag == kTagOptions) {
        STRATA_RETURN_IF_ERROR(GetOptions(r, head.version, &o));
        bit = 1;
      } else if (tag == kTagState) {
        STRATA_RETURN_IF_ERROR(r.Get(&n_past, "n_past"));
        STRATA_RETURN_IF_ERROR(r.Get(&n_rows, "logit rows"));
        STRATA_RETURN_IF_ERROR(r.Get(&rng, "generator state"));
        STRATA_RETURN_IF_ERROR(r.Done());
        bit = 2;
      } else if (tag == kTagHistory) {
        STRATA_RETURN_IF_ERROR(r.GetVec(&history, "token history", len / 4));
        STRATA_RETURN_IF_ERROR(r.Done());
        bit = 4;
      } else if (tag == kTagPending) {
        STRATA_RETURN_IF_ERROR(r.GetVec(&pending, "pending input", len / 4));
        STRATA_RETURN_IF_ERROR(r.Done());
        bit = 8;
      } else if (tag == kTagLogits) {
        STRATA_RETURN_IF_ERROR(r.GetVec(&logits, "logits", len / 4));
        STRATA_RETURN_IF_ERROR(r.Done());
        bit = 16;
      } else if (tag == kTagKv) {
        kv = body.here();
        kv_len = len;
        bit = 32;
      }  // an unknown section (a later minor addition) is skipped
      if (seen & bit) return Errorf(MOE_ERR_FORMAT_METADATA, "section %u repeats an earlier one", i);
      seen |= bit;
      body = Reader(body.here() + len, body.left() - len, "body");
    }
    if (seen != 63) return Errorf(MOE_ERR_FORMAT_METADATA, "a required section is missing");
    return body.Done();
  }();
  if (!sections.ok()) return Annotate(sections, strata::StrFormat("session snapshot '%s'", path));
  // The state must be one a session could have reached.
  if (override_opts != nullptr) o = *override_opts;
  const model::KvCache::Widths w = model::KvCache::WidthsFor(hp_);
  const int n_ctx = o.n_ctx > 0 ? o.n_ctx : n_ctx_;
  if (n_past < 0 || static_cast<uint64_t>(n_past) != history.size()) {
    return err(MOE_ERR_FORMAT_METADATA,
               strata::StrFormat("n_past %d disagrees with a history of %u tokens", n_past, history.size()));
  }
  // With a context shift the queued input may run past n_ctx (the steps make room); the tokens
  // processed must fit either way.
  if (n_past > n_ctx ||
      (!o.ctx_shift && static_cast<uint64_t>(n_past) + pending.size() > static_cast<uint64_t>(n_ctx))) {
    return MakeError(MOE_ERR_LIMIT_CONTEXT,
                     strata::StrFormat("session snapshot '%s' holds %d tokens and %u pending; the session's n_ctx is %d",
                                     path, n_past, pending.size(), n_ctx));
  }
  for (const auto *v : {&history, &pending}) {
    for (int32_t t : *v) {
      if (t < 0 || t >= hp_.n_vocab) {
        return err(MOE_ERR_FORMAT_METADATA, strata::StrFormat("token %d is outside the vocabulary", t));
      }
    }
  }
  if (n_rows < 0 || logits.size() != static_cast<uint64_t>(n_rows) * hp_.n_vocab || (n_rows == 0) != (n_past == 0)) {
    return err(MOE_ERR_FORMAT_METADATA,
               strata::StrFormat("%u logits for %d rows of %d with %d tokens", logits.size(), n_rows, hp_.n_vocab, n_past));
  }
  if ((rng[0] | rng[1] | rng[2] | rng[3]) == 0) return err(MOE_ERR_FORMAT_METADATA, "the generator state is zero");
  int32_t kw = -1, vw = -1;
  if (kv_len >= 8) {
    std::memcpy(&kw, kv, 4);
    std::memcpy(&vw, kv + 4, 4);
  }
  const uint64_t want = static_cast<uint64_t>(hp_.n_layer) * static_cast<uint64_t>(n_past) * (w.k + w.v) * 4 + 8;
  if (kw != w.k || vw != w.v || kv_len != want) {
    return err(MOE_ERR_FORMAT_METADATA,
               strata::StrFormat("KV section of %u bytes (widths %d, %d) does not hold %d positions", kv_len, kw, vw,
                               n_past));
  }
  // Open the session through the usual checks, then fill it; on failure it is closed again.
  o.n_ctx = n_ctx;
  absl::StatusOr<Session *> opened = OpenSession(o);
  if (!opened.ok()) {
    // Saved params that a session refuses mean a malformed file; the host's own params stay its error.
    if (override_opts == nullptr && StatusToMoe(opened.status()) == MOE_ERR_INVALID_ARGUMENT) {
      return err(MOE_ERR_FORMAT_METADATA, absl::StrCat("its session params are invalid: ", opened.status().message()));
    }
    return opened.status();
  }
  Session *s = *opened;
  absl::Status st = [&]() -> absl::Status {
    std::lock_guard<std::mutex> lk(mu_);
    std::unique_lock<std::mutex> slk(s->mu_);
    STRATA_RETURN_IF_ERROR(WithKvRoom(s, [&]() { return s->kv_.Prepare(0, history.data(), n_past); }));
    std::vector<float> rows;
    const uint8_t *p = kv + 8;
    for (int l = 0; l < hp_.n_layer && n_past > 0; ++l) {  // an empty session has no rows
      for (bool values : {false, true}) {
        const int width = values ? w.v : w.k;
        rows.resize(static_cast<size_t>(n_past) * width);
        std::memcpy(rows.data(), p, rows.size() * sizeof(float));
        p += rows.size() * sizeof(float);
        s->kv_.WriteRows(l, values, n_past, rows.data());
      }
    }
    s->n_past_ = n_past;
    s->history_ = std::move(history);
    s->pending_ = std::move(pending);
    s->logits_ = std::move(logits);
    s->n_logit_rows_ = n_rows;
    s->rng_.SetState(rng);
    s->last_step_ = step_count_;
    return absl::OkStatus();
  }();
  if (!st.ok()) {
    CloseSession(s);
    return Annotate(st, strata::StrFormat("loading session snapshot '%s'", path));
  }
  return s;
}

}  // namespace strata::runtime
