// Soak test of many sessions on one context (not part of CI: it runs for --minutes). Each epoch
// gives every session a scripted conversation (user turns of random ids, sampled replies fed back),
// runs all sessions interleaved at random on a tiny RAM budget and a small KV budget with a spill
// directory, with random time-budgeted steps, snapshots, evictions and cancellations (a cancelled
// session is closed and reopened from its last snapshot, its script rewound to that point), and
// checks every session's generated tokens against the same script run alone on an all-resident
// context. Memory (RSS) and open file descriptors are sampled per epoch: growth after the first
// epoch beyond a small allowance is reported as a leak. Uses only the C ABI.
//
// usage: soak_bench [--model PATH] [--minutes M] [--sessions N] [--rounds R] [--seed S]
//                   [--ram-budget BYTES] [--dir DIR]
// Exit status 0 when every epoch matched and nothing leaked; 1 otherwise.
#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "include/strata/moe.h"

namespace {

[[noreturn]] void Fail(const std::string &what) {
  std::fprintf(stderr, "soak: FAIL: %s\n", what.c_str());
  std::exit(1);
}

void Check(moe_status st, const std::string &what) {
  if (st != MOE_OK) Fail(what + ": " + moe_status_string(st) + ": " + moe_last_error());
}

long RssKib() {
  long pages = 0, rss = 0;
  if (FILE *f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    std::fclose(f);
  }
  return rss * (sysconf(_SC_PAGESIZE) / 1024);
}

int OpenFds() {
  int n = 0;
  if (DIR *d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
  }
  return n;
}

// One turn of a script: the user's ids, then `reply` sampled tokens, each fed back.
struct Turn {
  std::vector<int32_t> user;
  int reply = 0;
};

// Where a session stands in its script: turn index, whether the user's ids went in, and how many
// reply tokens have been sampled in this turn.
struct Cursor {
  size_t turn = 0;
  bool fed = false;
  int sampled = 0;
  bool done(const std::vector<Turn> &s) const { return turn >= s.size(); }
};

moe_session_params SessionParams(uint64_t seed) {
  moe_session_params p;
  moe_session_params_init(&p);
  p.seed = seed;
  p.temperature = 0.9f;
  p.top_k = 40;
  p.repeat_penalty = 1.1f;
  p.stop_at_eos = 0;
  return p;
}

// Advances one session by one action: feed the user's ids, or (when its input is processed)
// sample a reply token and feed it. Returns false when the script is finished.
bool Advance(moe_session *s, const std::vector<Turn> &script, Cursor *c, std::vector<int32_t> *out) {
  if (c->done(script)) return false;
  const Turn &t = script[c->turn];
  if (!c->fed) {
    Check(moe_session_feed(s, t.user.data(), t.user.size()), "feed");
    c->fed = true;
    return true;
  }
  if (moe_session_n_pending(s) > 0) return true;  // waiting for a step
  int32_t tok = 0;
  Check(moe_session_sample(s, &tok), "sample");
  out->push_back(tok);
  Check(moe_session_feed(s, &tok, 1), "feed reply");
  if (++c->sampled == t.reply) {
    ++c->turn;
    c->fed = false;
    c->sampled = 0;
  }
  return true;
}

std::vector<int32_t> RunAlone(moe_ctx *ctx, const std::vector<Turn> &script, uint64_t seed) {
  moe_session_params sp = SessionParams(seed);
  moe_session *s = nullptr;
  Check(moe_session_open(ctx, &sp, &s), "open reference session");
  std::vector<int32_t> out;
  Cursor c;
  while (Advance(s, script, &c, &out)) {
    uint32_t pending = 1;
    while (pending > 0) Check(moe_ctx_step(ctx, &pending), "reference step");
  }
  moe_session_close(s);
  return out;
}

struct Live {
  moe_session *s = nullptr;
  Cursor cur;
  std::vector<int32_t> out;
  bool saved = false;
  Cursor saved_cur;
  size_t saved_out = 0;
};

}  // namespace

int main(int argc, char **argv) {
  std::string model = "examples/models/austen-moe-q4_k.gguf", dir = "/tmp/strata-soak";
  double minutes = 60;
  int n_sessions = 64, rounds = 2;
  uint64_t seed = 1, ram_budget = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Fail(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") model = value();
    else if (a == "--minutes") minutes = std::atof(value().c_str());
    else if (a == "--sessions") n_sessions = std::atoi(value().c_str());
    else if (a == "--rounds") rounds = std::atoi(value().c_str());
    else if (a == "--seed") seed = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--ram-budget") ram_budget = std::strtoull(value().c_str(), nullptr, 10);
    else if (a == "--dir") dir = value();
    else Fail("unknown option " + a);
  }
  if (n_sessions < 1 || rounds < 1 || minutes <= 0) Fail("bad --sessions, --rounds or --minutes");
  if (std::system(("mkdir -p '" + dir + "'").c_str()) != 0) Fail("cannot create " + dir);

  // The reference: all experts resident, one session at a time.
  moe_params rp;
  moe_params_init(&rp);
  rp.model_path = model.c_str();
  rp.n_threads = 1;
  moe_ctx *ref = nullptr;
  Check(moe_ctx_open(&rp, &ref), "open reference context");
  const int32_t n_vocab = moe_ctx_vocab_size(ref);

  // The soak context: the minimum RAM budget (experts stream), KV for a quarter of the sessions,
  // the rest evicted to the spill directory as needed.
  moe_params p;
  moe_params_init(&p);
  p.model_path = model.c_str();
  p.ram_budget_bytes = ram_budget;
  p.n_threads = 1;
  p.n_ctx = 512;
  p.max_sessions = static_cast<uint32_t>(std::max(1, n_sessions / 4));
  const std::string spill = dir + "/spill";
  if (std::system(("mkdir -p '" + spill + "'").c_str()) != 0) Fail("cannot create " + spill);
  p.kv_spill_dir = spill.c_str();
  moe_ctx *ctx = nullptr;
  Check(moe_ctx_open(&p, &ctx), "open soak context");

  std::mt19937_64 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const auto t_end = std::chrono::steady_clock::now() + std::chrono::duration<double>(minutes * 60);
  long rss_base = 0;
  int fds_base = 0;
  uint64_t total_tokens = 0, saves = 0, cancels = 0, evictions = 0;
  for (int epoch = 0; std::chrono::steady_clock::now() < t_end; ++epoch) {
    // Scripts and references for this epoch.
    std::vector<std::vector<Turn>> scripts(n_sessions);
    std::vector<uint64_t> seeds(n_sessions);
    std::vector<std::vector<int32_t>> want(n_sessions);
    for (int i = 0; i < n_sessions; ++i) {
      seeds[i] = rng();
      for (int r = 0; r < rounds; ++r) {
        Turn t;
        t.user.resize(uni(1, 24));
        for (auto &id : t.user) id = uni(0, n_vocab - 1);
        t.reply = uni(1, 16);
        scripts[i].push_back(std::move(t));
      }
      want[i] = RunAlone(ref, scripts[i], seeds[i]);
    }

    std::vector<Live> live(n_sessions);
    moe_session_params sp;
    for (int i = 0; i < n_sessions; ++i) {
      sp = SessionParams(seeds[i]);
      Check(moe_session_open(ctx, &sp, &live[i].s), "open session");
    }
    const std::string snap_prefix = dir + "/s" + std::to_string(epoch % 2) + "-";
    for (int remaining = n_sessions; remaining > 0;) {
      // A random subset acts; then one time-budgeted step.
      for (int i = 0; i < n_sessions; ++i) {
        Live &L = live[i];
        if (L.cur.done(scripts[i]) || uni(0, 3) == 0) continue;
        Advance(L.s, scripts[i], &L.cur, &L.out);
        const int dice = uni(0, 99);
        const std::string path = snap_prefix + std::to_string(i);
        if (dice < 3) {  // snapshot
          Check(moe_session_save(L.s, path.c_str()), "save");
          L.saved = true;
          L.saved_cur = L.cur;
          L.saved_out = L.out.size();
          ++saves;
        } else if (dice < 5) {  // cancel: back to the last snapshot (or the start)
          moe_session_close(L.s);
          L.s = nullptr;
          if (L.saved) {
            Check(moe_session_load(ctx, path.c_str(), nullptr, &L.s), "load");
            L.cur = L.saved_cur;
            L.out.resize(L.saved_out);
          } else {
            sp = SessionParams(seeds[i]);
            Check(moe_session_open(ctx, &sp, &L.s), "reopen");
            L.cur = Cursor();
            L.out.clear();
          }
          ++cancels;
        } else if (dice < 7) {
          if (moe_session_evict(L.s) == MOE_OK) ++evictions;
        }
      }
      uint32_t pending = 0, steps = 0;
      Check(moe_ctx_step_for(ctx, static_cast<uint64_t>(uni(200, 20000)), &pending, &steps), "step_for");
      remaining = 0;
      for (int i = 0; i < n_sessions; ++i) {
        if (!live[i].cur.done(scripts[i]) || moe_session_n_pending(live[i].s) > 0) ++remaining;
      }
    }
    for (int i = 0; i < n_sessions; ++i) {
      if (live[i].out != want[i]) {
        Fail("epoch " + std::to_string(epoch) + " session " + std::to_string(i) + ": " +
             std::to_string(live[i].out.size()) + " tokens differ from the reference's " +
             std::to_string(want[i].size()));
      }
      total_tokens += live[i].out.size();
      moe_session_close(live[i].s);
    }
    const long rss = RssKib();
    const int fds = OpenFds();
    if (epoch == 0) {
      rss_base = rss;
      fds_base = fds;
    }
    std::printf("epoch %d: %d sessions match; %" PRIu64 " reply tokens, %" PRIu64 " saves, %" PRIu64
                " cancels, %" PRIu64 " evictions so far; RSS %ld KiB, %d fds\n",
                epoch, n_sessions, total_tokens, saves, cancels, evictions, rss, fds);
    std::fflush(stdout);
    if (fds > fds_base) Fail("open file descriptors grew from " + std::to_string(fds_base) + " to " + std::to_string(fds));
    if (rss > rss_base + std::max(65536L, rss_base / 10)) {
      Fail("RSS grew from " + std::to_string(rss_base) + " KiB to " + std::to_string(rss) + " KiB");
    }
  }
  moe_ctx_close(ctx);
  moe_ctx_close(ref);
  std::printf("soak: PASS: %" PRIu64 " reply tokens, %" PRIu64 " saves, %" PRIu64 " cancels, %" PRIu64
              " evictions\n", total_tokens, saves, cancels, evictions);
  return 0;
}
