// Session snapshots through the C ABI: save -> load -> continue equals the uninterrupted session
// bit for bit (sampling with temperature and penalties, pending input included); corruption in
// every region, truncation, a foreign model (also one with the same tensors and other weights), an
// older or newer version and non-snapshots are refused with their statuses and no session opened;
// SIGKILL during saves always leaves one complete snapshot.
#include <catch2/catch.hpp>

#include <glob.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"
#include "lib/format/file.h"
#include "lib/format/gguf.h"
#include "lib/util/crc32c.h"

namespace {

const std::string kGolden = std::string(STRATA_SOURCE_DIR) + "/tests/golden/";
const std::string kModel = kGolden + "qwen3moe_f32/model-q8_0.gguf";
constexpr int kVocab = 256;

moe_ctx *Open(const std::string &model = kModel) {
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.n_threads = 2;
  p.max_sessions = 4;
  moe_ctx *c = nullptr;
  REQUIRE(moe_ctx_open(&p, &c) == MOE_OK);
  return c;
}

moe_session_params SamplingParams() {
  moe_session_params sp;
  moe_session_params_init(&sp);
  sp.temperature = 1.1f;
  sp.top_p = 0.95f;
  sp.repeat_penalty = 1.4f;
  sp.presence_penalty = 0.3f;
  sp.frequency_penalty = 3.f;  // large: a session loaded without it samples other tokens
  sp.penalty_last_n = 16;
  sp.seed = 4242;
  sp.attn_window = 100;
  static const int32_t blocked[] = {7};
  sp.blocked_tokens = blocked;
  sp.n_blocked_tokens = 1;
  return sp;
}

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + 11) % kVocab;
  return t;
}

// Steps, samples and feeds n tokens; records tokens and logits.
void Generate(moe_ctx *ctx, moe_session *s, int n, std::vector<int32_t> *toks, std::vector<float> *logits) {
  for (int i = 0; i < n; ++i) {
    REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);
    const float *l = nullptr;
    REQUIRE(moe_session_logits(s, &l, nullptr) == MOE_OK);
    logits->insert(logits->end(), l, l + kVocab);
    int32_t t = 0;
    REQUIRE(moe_session_sample(s, &t) == MOE_OK);
    toks->push_back(t);
    REQUIRE(moe_session_feed(s, &t, 1) == MOE_OK);
  }
}

// Files in one scratch directory, removed with it when the tests exit.
std::string TempPath(const char *name) {
  static std::string dir;
  if (dir.empty()) {
    char tmpl[] = "/tmp/strata-snap-test-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    std::atexit([] { std::system(("rm -rf '" + dir + "'").c_str()); });
  }
  return dir + "/" + name;
}

std::vector<char> ReadAll(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}

void WriteAll(const std::string &path, const std::vector<char> &b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

// A snapshot of a session with `n` prompt tokens processed and one sampled token pending.
std::string SavedSession(moe_ctx *ctx, const char *name, int n) {
  const moe_session_params sp = SamplingParams();
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
  const std::vector<int32_t> p = Prompt(n);
  REQUIRE(moe_session_feed(s, p.data(), p.size()) == MOE_OK);
  std::vector<int32_t> toks;
  std::vector<float> logits;
  Generate(ctx, s, 1, &toks, &logits);
  const std::string path = TempPath(name);
  REQUIRE(moe_session_save(s, path.c_str()) == MOE_OK);
  moe_session_close(s);
  return path;
}

}  // namespace

TEST_CASE("snapshot: save, load, continue equals the uninterrupted session bit for bit", "[snapshot]") {
  const moe_session_params sp = SamplingParams();
  const std::vector<int32_t> prompt = Prompt(150);
  std::vector<int32_t> ref_toks;
  std::vector<float> ref_logits;
  {
    moe_ctx *ctx = Open();
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
    REQUIRE(moe_session_feed(s, prompt.data(), prompt.size()) == MOE_OK);
    Generate(ctx, s, 40, &ref_toks, &ref_logits);
    moe_ctx_close(ctx);
  }
  const std::string path = TempPath("continue.snap");
  std::vector<int32_t> toks;
  std::vector<float> logits;
  {
    moe_ctx *ctx = Open();
    moe_session *s = nullptr;
    REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
    REQUIRE(moe_session_feed(s, prompt.data(), prompt.size()) == MOE_OK);
    Generate(ctx, s, 15, &toks, &logits);  // the 15th sampled token is pending input now
    REQUIRE(moe_session_save(s, path.c_str()) == MOE_OK);
    moe_ctx_close(ctx);
  }
  {
    moe_ctx *ctx = Open();  // a new context: nothing survives but the file
    moe_session *s = nullptr;
    REQUIRE(moe_session_load(ctx, path.c_str(), nullptr, &s) == MOE_OK);
    CHECK(moe_session_n_past(s) == 150 + 14);
    const float *l = nullptr;
    REQUIRE(moe_session_logits(s, &l, nullptr) == MOE_OK);  // the saved logits
    CHECK(std::memcmp(l, logits.data() + 14 * kVocab, kVocab * sizeof(float)) == 0);
    Generate(ctx, s, 25, &toks, &logits);
    moe_ctx_close(ctx);
  }
  CHECK(toks == ref_toks);
  CHECK(logits == ref_logits);
  // The saved params came back too: the same session loaded with other params (greedy) differs.
  moe_ctx *ctx = Open();
  moe_session_params greedy;
  moe_session_params_init(&greedy);
  moe_session *s = nullptr;
  REQUIRE(moe_session_load(ctx, path.c_str(), &greedy, &s) == MOE_OK);
  std::vector<int32_t> gt;
  std::vector<float> gl;
  Generate(ctx, s, 25, &gt, &gl);
  CHECK(gt != std::vector<int32_t>(ref_toks.begin() + 15, ref_toks.end()));
  // n_ctx too small for the saved tokens.
  greedy.n_ctx = 100;
  moe_session *t = reinterpret_cast<moe_session *>(0x1);
  CHECK(moe_session_load(ctx, path.c_str(), &greedy, &t) == MOE_ERR_LIMIT_CONTEXT);
  CHECK(t == reinterpret_cast<moe_session *>(0x1));
  moe_ctx_close(ctx);
}

TEST_CASE("snapshot: corruption, truncation, foreign models and newer versions are refused", "[snapshot]") {
  moe_ctx *ctx = Open();
  const std::string good = SavedSession(ctx, "good.snap", 20);
  const std::vector<char> bytes = ReadAll(good);
  REQUIRE(bytes.size() > 1000);
  const std::string bad = TempPath("bad.snap");
  uint64_t used_before = 0;
  REQUIRE(moe_ctx_kv_usage(ctx, &used_before, nullptr) == MOE_OK);
  auto refused = [&](moe_status *st) {
    moe_session *s = reinterpret_cast<moe_session *>(0x1);
    *st = moe_session_load(ctx, bad.c_str(), nullptr, &s);
    uint64_t used = 0;
    REQUIRE(moe_ctx_kv_usage(ctx, &used, nullptr) == MOE_OK);
    return *st != MOE_OK && s == reinterpret_cast<moe_session *>(0x1) && used == used_before &&
           std::strlen(moe_last_error()) > 0;
  };
  SECTION("a flipped byte anywhere") {
    // Every byte of the header, the section headers and small sections, a stride through the KV
    // rows, and the checksum itself.
    std::vector<size_t> at;
    for (size_t i = 0; i < 2048 && i < bytes.size(); ++i) at.push_back(i);
    for (size_t i = 2048; i < bytes.size(); i += 97) at.push_back(i);
    for (size_t i = bytes.size() - 64; i < bytes.size(); ++i) at.push_back(i);
    int checksum = 0;
    for (size_t i : at) {
      std::vector<char> b = bytes;
      b[i] ^= 0x5a;
      WriteAll(bad, b);
      moe_status st = MOE_OK;
      INFO("byte " << i);
      REQUIRE(refused(&st));
      if (i < 8) CHECK(st == MOE_ERR_FORMAT_HEADER);
      // Version, sizes and the reserved word are checked before the checksum; the rest by it.
      const bool header_field = (i >= 8 && i < 24) || (i >= 108 && i < 112);
      if (i >= 8 && !header_field) CHECK(st == MOE_ERR_FORMAT_CHECKSUM);
      if (header_field) {
        const bool header_class = st == MOE_ERR_FORMAT_HEADER || st == MOE_ERR_FORMAT_TRUNCATED ||
                                  st == MOE_ERR_UNSUPPORTED || st == MOE_ERR_FORMAT_CHECKSUM;
        CHECK(header_class);
      }
      checksum += st == MOE_ERR_FORMAT_CHECKSUM;
    }
    CHECK(checksum > 1000);
  }
  SECTION("cut short at any length") {
    for (size_t n : {size_t{0}, size_t{7}, size_t{50}, size_t{104}, size_t{111}, size_t{112}, size_t{500},
                     bytes.size() / 2,
                     bytes.size() - 4, bytes.size() - 1}) {
      WriteAll(bad, std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n)));
      moe_status st = MOE_OK;
      INFO("length " << n);
      REQUIRE(refused(&st));
      CHECK(st == MOE_ERR_FORMAT_TRUNCATED);
    }
    std::vector<char> longer = bytes;
    longer.push_back(0);
    WriteAll(bad, longer);
    moe_status st = MOE_OK;
    REQUIRE(refused(&st));
    CHECK(st == MOE_ERR_FORMAT_HEADER);
  }
  SECTION("a newer format version, with a valid checksum") {
    std::vector<char> b = bytes;
    const uint32_t v5 = 5;
    std::memcpy(b.data() + 8, &v5, 4);
    const uint32_t crc = strata::Crc32c(0, b.data(), b.size() - 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    WriteAll(bad, b);
    moe_status st = MOE_OK;
    REQUIRE(refused(&st));
    CHECK(st == MOE_ERR_UNSUPPORTED);
    CHECK(std::string(moe_last_error()).find("version 5") != std::string::npos);
  }
  SECTION("version 2, whose options end before frequency_penalty, loads with it 0") {
    // The options section comes first, after the 112-byte header: its length at 120, its payload
    // from 128, ending with frequency_penalty (4 bytes), then ctx_shift (1) and n_keep (4) since
    // version 4. Cut the three, and fix the version, total and length.
    std::vector<char> b = bytes;
    uint64_t opts_len = 0, total = 0;
    std::memcpy(&opts_len, b.data() + 120, 8);
    std::memcpy(&total, b.data() + 16, 8);
    float saved = 0.f;
    std::memcpy(&saved, b.data() + 128 + opts_len - 9, 4);
    REQUIRE(saved == SamplingParams().frequency_penalty);
    b.erase(b.begin() + static_cast<std::ptrdiff_t>(128 + opts_len - 9), b.begin() + static_cast<std::ptrdiff_t>(128 + opts_len));
    const uint32_t v2 = 2;
    opts_len -= 9;
    total -= 9;
    std::memcpy(b.data() + 8, &v2, 4);
    std::memcpy(b.data() + 16, &total, 8);
    std::memcpy(b.data() + 120, &opts_len, 8);
    const uint32_t crc = strata::Crc32c(0, b.data(), b.size() - 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    WriteAll(bad, b);
    // It continues as the version-3 file does with the same params but no frequency penalty.
    moe_session_params none = SamplingParams();
    none.frequency_penalty = 0.f;
    std::vector<int32_t> want, got, with;
    std::vector<float> wl, gl, hl;
    moe_session *s = nullptr;
    REQUIRE(moe_session_load(ctx, good.c_str(), &none, &s) == MOE_OK);
    Generate(ctx, s, 12, &want, &wl);
    moe_session_close(s);
    REQUIRE(moe_session_load(ctx, bad.c_str(), nullptr, &s) == MOE_OK);
    Generate(ctx, s, 12, &got, &gl);
    moe_session_close(s);
    CHECK(got == want);
    REQUIRE(moe_session_load(ctx, good.c_str(), nullptr, &s) == MOE_OK);  // the penalty itself came back
    Generate(ctx, s, 12, &with, &hl);
    moe_session_close(s);
    CHECK(with != want);
  }
  SECTION("version 1, which recorded no weights digest, with a valid checksum") {
    std::vector<char> b = bytes;
    const uint32_t v1 = 1;
    std::memcpy(b.data() + 8, &v1, 4);
    const uint32_t crc = strata::Crc32c(0, b.data(), b.size() - 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    WriteAll(bad, b);
    moe_status st = MOE_OK;
    REQUIRE(refused(&st));
    CHECK(st == MOE_ERR_UNSUPPORTED);
    const std::string msg = moe_last_error();
    CHECK(msg.find("version 1") != std::string::npos);
    CHECK(msg.find("save the session again") != std::string::npos);
  }
  SECTION("a session of another model") {
    for (const char *other : {"qwen3moe_f32/model-f32.gguf", "mixtral_f32/model-f32.gguf"}) {
      moe_ctx *c2 = Open(kGolden + other);
      moe_session *s = reinterpret_cast<moe_session *>(0x1);
      INFO(other);
      CHECK(moe_session_load(c2, good.c_str(), nullptr, &s) == MOE_ERR_FORMAT_FOREIGN);
      CHECK(s == reinterpret_cast<moe_session *>(0x1));
      CHECK(std::string(moe_last_error()).find("written for") != std::string::npos);
      moe_ctx_close(c2);
    }
  }
  SECTION("not a snapshot, no file, bad arguments") {
    moe_session *s = nullptr;
    CHECK(moe_session_load(ctx, kModel.c_str(), nullptr, &s) == MOE_ERR_FORMAT_HEADER);
    CHECK(moe_session_load(ctx, "/nonexistent/x.snap", nullptr, &s) == MOE_ERR_IO_OPEN);
    CHECK(moe_session_load(nullptr, good.c_str(), nullptr, &s) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(moe_session_load(ctx, nullptr, nullptr, &s) == MOE_ERR_INVALID_ARGUMENT);
    CHECK(moe_session_save(nullptr, good.c_str()) == MOE_ERR_INVALID_ARGUMENT);
    REQUIRE(moe_session_load(ctx, good.c_str(), nullptr, &s) == MOE_OK);
    CHECK(moe_session_save(s, "/nonexistent/dir/x.snap") == MOE_ERR_IO_OPEN);
    CHECK(moe_session_save(s, "") == MOE_ERR_INVALID_ARGUMENT);
  }
  std::remove(bad.c_str());
  moe_ctx_close(ctx);
}

// A copy of the golden model with a few quantized weights changed (a stand-in for a fine-tune:
// the same tensor table, other bytes): random Q8_0 tensors, a random quant byte (never a block's
// f16 scale, so every value stays finite) in a random block of their first 4 KiB or last 4 KiB.
std::string FineTunedCopy(const char *name, uint32_t seed) {
  auto file = strata::format::File::Open(kModel);
  REQUIRE(file.ok());
  auto gguf = strata::format::ParseGguf(**file);
  REQUIRE(gguf.ok());
  std::vector<char> bytes = ReadAll(kModel);
  std::vector<const strata::format::GgufTensorInfo *> q8;
  for (const auto &t : gguf->tensors)
    if (t.type == 8 && t.nbytes >= 2 * 4096) q8.push_back(&t);  // GGML_TYPE_Q8_0
  REQUIRE(q8.size() >= 3);
  std::mt19937 rng(seed);
  for (int k = 0; k < 3; ++k) {
    const auto *t = q8[rng() % q8.size()];
    const uint64_t block = rng() % (4096 / 34);
    const uint64_t base = rng() % 2 ? t->offset : t->offset + t->nbytes - 34 * (4096 / 34);
    const uint64_t at = base + block * 34 + 2 + rng() % 32;
    REQUIRE(at < bytes.size());
    bytes[at] = static_cast<char>(bytes[at] ^ (1 + rng() % 127));
  }
  const std::string path = TempPath(name);
  WriteAll(path, bytes);
  return path;
}

TEST_CASE("snapshot: a session of a model with the same tensors but other weights is refused", "[snapshot]") {
  const uint32_t seed = std::random_device{}();
  INFO("seed " << seed);
  moe_ctx *ctx = Open();
  const std::string snap = SavedSession(ctx, "tuned-src.snap", 12);
  const std::string tuned = FineTunedCopy("tuned.gguf", seed);
  moe_ctx *c2 = Open(tuned);
  moe_session *s = reinterpret_cast<moe_session *>(0x1);
  CHECK(moe_session_load(c2, snap.c_str(), nullptr, &s) == MOE_ERR_FORMAT_FOREIGN);
  CHECK(s == reinterpret_cast<moe_session *>(0x1));
  const std::string msg = moe_last_error();
  INFO(msg);
  CHECK(msg.find("saved from another model") != std::string::npos);
  CHECK(msg.find("weights") != std::string::npos);
  // The other direction too: a session of the tuned copy is refused by the original.
  const std::string snap2 = SavedSession(c2, "tuned.snap", 12);
  CHECK(moe_session_load(ctx, snap2.c_str(), nullptr, &s) == MOE_ERR_FORMAT_FOREIGN);
  // An identical copy of the model is the same model: its sessions load and continue bit for bit.
  const std::string same = TempPath("same.gguf");
  WriteAll(same, ReadAll(kModel));
  moe_ctx *c3 = Open(same);
  const moe_session_params sp = SamplingParams();
  moe_session *ref = nullptr, *loaded = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &ref) == MOE_OK);
  const std::vector<int32_t> p = Prompt(12);
  REQUIRE(moe_session_feed(ref, p.data(), p.size()) == MOE_OK);
  std::vector<int32_t> ref_toks;
  std::vector<float> ref_logits;
  Generate(ctx, ref, 1, &ref_toks, &ref_logits);
  REQUIRE(moe_session_load(c3, snap.c_str(), nullptr, &loaded) == MOE_OK);
  std::vector<int32_t> toks[2];
  std::vector<float> logits[2];
  Generate(ctx, ref, 6, &toks[0], &logits[0]);
  Generate(c3, loaded, 6, &toks[1], &logits[1]);
  CHECK(toks[0] == toks[1]);
  CHECK(std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * sizeof(float)) == 0);
  moe_session_close(ref);
  moe_session_close(loaded);
  moe_ctx_close(c3);
  moe_ctx_close(c2);
  moe_ctx_close(ctx);
}

TEST_CASE("snapshot: SIGKILL during saves leaves the previous or the new snapshot, never a torn one", "[snapshot]") {
  // A child saves two different sessions to one path in turn, as fast as it can; the parent kills
  // it at random moments. After each kill the path loads, and it is exactly one of the two.
  moe_ctx *ctx = Open();
  const moe_session_params sp = SamplingParams();
  moe_session *a = nullptr, *b = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &a) == MOE_OK);
  REQUIRE(moe_session_open(ctx, &sp, &b) == MOE_OK);
  const std::vector<int32_t> pa = Prompt(400), pb = Prompt(300);
  REQUIRE(moe_session_feed(a, pa.data(), pa.size()) == MOE_OK);
  REQUIRE(moe_session_feed(b, pb.data(), pb.size()) == MOE_OK);
  for (uint32_t pending = 1; pending > 0;) REQUIRE(moe_ctx_step(ctx, &pending) == MOE_OK);
  const std::string path = TempPath("killed.snap");
  REQUIRE(moe_session_save(a, path.c_str()) == MOE_OK);
  std::mt19937 rng(12345);
  int saw_a = 0, saw_b = 0;
  for (int round = 0; round < 24; ++round) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (uint64_t i = 0;; ++i) {
        if (moe_session_save(i % 2 ? a : b, path.c_str()) != MOE_OK) _exit(3);
      }
    }
    usleep(std::uniform_int_distribution<int>(200, 30000)(rng));
    REQUIRE(kill(pid, SIGKILL) == 0);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFSIGNALED(status));  // it was still saving, not failed
    moe_session *s = nullptr;
    INFO("round " << round);
    REQUIRE(moe_session_load(ctx, path.c_str(), nullptr, &s) == MOE_OK);
    const int n = moe_session_n_past(s);
    CHECK((n == 400 || n == 300));
    const float *got = nullptr, *want = nullptr;
    REQUIRE(moe_session_logits(s, &got, nullptr) == MOE_OK);
    REQUIRE(moe_session_logits(n == 400 ? a : b, &want, nullptr) == MOE_OK);
    CHECK(std::memcmp(got, want, kVocab * sizeof(float)) == 0);
    (n == 400 ? saw_a : saw_b)++;
    moe_session_close(s);
  }
  CHECK(saw_a + saw_b == 24);
  CHECK(saw_a > 0);
  CHECK(saw_b > 0);
  // Each kill that landed inside a save left its temporary file next to the path: some did, so
  // the loads above really followed interrupted saves. Remove them.
  glob_t g;
  int torn = 0;
  if (glob((path + ".tmp-*").c_str(), 0, nullptr, &g) == 0) {
    torn = static_cast<int>(g.gl_pathc);
    for (size_t i = 0; i < g.gl_pathc; ++i) std::remove(g.gl_pathv[i]);
    globfree(&g);
  }
  CHECK(torn > 0);
  std::remove(path.c_str());
  moe_ctx_close(ctx);
}

TEST_CASE("snapshot: an evicted session saves from its spill file and continues identically", "[snapshot][kv]") {
  char tmpl[] = "/tmp/strata-snap-spill-XXXXXX";
  REQUIRE(mkdtemp(tmpl) != nullptr);
  const std::string spill = tmpl;
  moe_params p;
  moe_params_init(&p);
  p.model_path = kModel.c_str();
  p.n_threads = 2;
  p.max_sessions = 2;
  p.kv_spill_dir = spill.c_str();
  moe_ctx *ctx = nullptr;
  REQUIRE(moe_ctx_open(&p, &ctx) == MOE_OK);
  const moe_session_params sp = SamplingParams();
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
  const std::vector<int32_t> prompt = Prompt(260);
  REQUIRE(moe_session_feed(s, prompt.data(), prompt.size()) == MOE_OK);
  std::vector<int32_t> toks;
  std::vector<float> logits;
  Generate(ctx, s, 5, &toks, &logits);
  REQUIRE(moe_session_evict(s) == MOE_OK);
  REQUIRE(moe_session_kv_bytes(s) == 0);
  const std::string path = TempPath("evicted.snap");
  REQUIRE(moe_session_save(s, path.c_str()) == MOE_OK);
  CHECK(moe_session_kv_bytes(s) == 0);  // saving did not bring it back
  moe_session *t = nullptr;
  REQUIRE(moe_session_load(ctx, path.c_str(), nullptr, &t) == MOE_OK);
  std::vector<int32_t> ts = toks, tt = toks;
  std::vector<float> ls, lt;
  Generate(ctx, s, 10, &ts, &ls);  // the evicted original comes back on its step
  Generate(ctx, t, 10, &tt, &lt);
  CHECK(ts == tt);
  CHECK(ls == lt);
  moe_ctx_close(ctx);
  rmdir(spill.c_str());
}

TEST_CASE("snapshot: crafted contents with a valid checksum are refused or loaded, never crash", "[snapshot]") {
  // Every byte of the header fields and the small sections (options, state, history, pending input,
  // logits) and the KV section's header, set to values that stress lengths and counts, with the
  // checksum recomputed: the loader must answer with a status (or a session it can run).
  moe_ctx *ctx = Open();
  const std::string good = SavedSession(ctx, "crafted-src.snap", 3);
  const std::vector<char> bytes = ReadAll(good);
  const std::string bad = TempPath("crafted.snap");
  // 3 positions x 3 layers x (32 key + 32 value floats) of KV rows end the body.
  const size_t kv_header_end = bytes.size() - 4 - static_cast<size_t>(3) * 3 * 64 * sizeof(float);
  int loaded = 0, refused = 0;
  for (size_t i = 8; i < kv_header_end; ++i) {
    for (int v : {0x00, 0xff, bytes[i] ^ 0x01}) {
      std::vector<char> b = bytes;
      b[i] = static_cast<char>(v);
      const uint32_t crc = strata::Crc32c(0, b.data(), b.size() - 4);
      std::memcpy(b.data() + b.size() - 4, &crc, 4);
      WriteAll(bad, b);
      moe_session *s = nullptr;
      const moe_status st = moe_session_load(ctx, bad.c_str(), nullptr, &s);
      INFO("byte " << i << " = " << v << ": " << moe_last_error());
      if (st == MOE_OK) {
        ++loaded;
        REQUIRE(moe_ctx_step(ctx, nullptr) == MOE_OK);  // a loaded session can run
        moe_session_close(s);
      } else {
        ++refused;
        const moe_status cat = MOE_STATUS_CATEGORY(st);
        REQUIRE((cat == MOE_ERR_FORMAT || cat == MOE_ERR_UNSUPPORTED || cat == MOE_ERR_LIMIT));
        REQUIRE(std::string(moe_last_error()).find("crafted.snap") != std::string::npos);  // names the file
      }
    }
  }
  CHECK(refused > 0);
  CHECK(loaded > 0);  // e.g. another sampling temperature or another history token
  moe_ctx_close(ctx);
}

TEST_CASE("snapshot: a session saved before its first step loads and continues as the unsaved one", "[snapshot]") {
  // No processed token means no KV rows: the load must not touch row memory (UBSan once caught a
  // null memcpy of zero rows here).
  moe_ctx *ctx = Open();
  std::mt19937 rng(std::random_device{}());
  const std::vector<int32_t> prompt = {static_cast<int32_t>(rng() % kVocab), static_cast<int32_t>(rng() % kVocab)};
  moe_session_params sp = SamplingParams();
  moe_session *s = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &s) == MOE_OK);
  REQUIRE(moe_session_feed(s, prompt.data(), prompt.size()) == MOE_OK);  // queued, not yet run
  const std::string path = TempPath("unstepped.snap");
  REQUIRE(moe_session_save(s, path.c_str()) == MOE_OK);
  moe_session_close(s);
  std::vector<int32_t> ta, tb;
  std::vector<float> la, lb;
  moe_session *loaded = nullptr;
  REQUIRE(moe_session_load(ctx, path.c_str(), nullptr, &loaded) == MOE_OK);
  CHECK(moe_session_n_past(loaded) == 0);
  Generate(ctx, loaded, 3, &ta, &la);
  moe_session_close(loaded);
  moe_session *fresh = nullptr;
  REQUIRE(moe_session_open(ctx, &sp, &fresh) == MOE_OK);
  REQUIRE(moe_session_feed(fresh, prompt.data(), prompt.size()) == MOE_OK);
  Generate(ctx, fresh, 3, &tb, &lb);
  moe_session_close(fresh);
  CHECK(ta == tb);
  CHECK(la == lb);
  moe_ctx_close(ctx);
}
