// NPCs the way a game engine hosts them, in C++17 over <strata/moe.hpp>: the game thread runs frames
// and draws the lines that are ready, while one worker thread owns the model and spends a fixed
// budget of each frame on it (Context::step_for), sampling every NPC that is ready. The NPCs share
// one persona prompt: it is prefilled once and each NPC is a fork of it (moe_session_fork shares its
// KV blocks), then hears its own greeting. The library's log lines go to the game's log, a finished
// NPC is saved into memory (moe_session_save_buffer) as a save system would, and quitting aborts the
// step in flight (moe_ctx_abort) instead of waiting for it.
//   usage: strata_example_npc_worker [MODEL] [max_tokens_per_line] [frame_budget_us]
#include <strata/moe.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifndef NPC_DEFAULT_MODEL
#define NPC_DEFAULT_MODEL "examples/models/austen-moe-q4_k.gguf"
#endif

namespace {

const char *kPersona = "You live in the village of Brookhollow. Answer the traveller briefly and in character.";

struct Npc {
  const char *name = nullptr;
  const char *greeting = nullptr;
  strata::Session session;
  std::string line;
  int n_tokens = 0;
  bool done = false;
};

// What the worker hands the game thread, under `mu`.
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  int frames_granted = 0;  // frames the game thread has started; the worker runs one budget each
  bool quit = false;
  std::vector<std::string> lines;  // finished lines, to draw
  size_t saved_bytes = 0;          // the last NPC saved into memory
  std::string error;
};

// The tokens of the persona alone, and of persona + greeting up to the reply; the first is a prefix
// of the second for the templates Strata knows, so the persona's KV can be shared.
std::vector<int32_t> ChatTokens(const strata::Context &ctx, const char *greeting) {
  moe_chat_message msgs[2] = {{"system", kPersona}, {"user", greeting}};
  const size_t n_msgs = greeting != nullptr ? 2 : 1;
  size_t n = 0;
  moe_status st = moe_chat_tokenize(ctx.get(), nullptr, msgs, n_msgs, greeting != nullptr, nullptr, 0, &n);
  if (st != MOE_OK && st != MOE_ERR_LIMIT) throw strata::Error(st, moe_last_error());
  std::vector<int32_t> ids(n);
  st = moe_chat_tokenize(ctx.get(), nullptr, msgs, n_msgs, greeting != nullptr, ids.data(), ids.size(), &n);
  if (st != MOE_OK) throw strata::Error(st, moe_last_error());
  ids.resize(n);
  return ids;
}

// The worker: one step_for budget per frame, then a token for every NPC that is ready.
void Worker(strata::Context &ctx, std::vector<Npc> &npcs, int max_tokens, std::chrono::microseconds budget,
            Mailbox &box) {
  try {
    int frames_run = 0;
    for (size_t active = npcs.size(); active > 0;) {
      {
        std::unique_lock<std::mutex> lk(box.mu);
        box.cv.wait(lk, [&] { return box.quit || box.frames_granted > frames_run; });
        if (box.quit) return;
        ++frames_run;
      }
      try {
        ctx.step_for(budget);
      } catch (const strata::Error &e) {
        if (e.status() == MOE_ERR_ABORTED) return;  // the game is quitting: every session is intact
        throw;
      }
      for (Npc &n : npcs) {
        if (n.done || !n.session.ready()) continue;
        const strata::TextPiece piece = n.session.sample_text();
        n.line += std::string(piece.text);
        bool end = piece.stop != MOE_STOP_NONE;
        if (!end && ++n.n_tokens >= max_tokens) {
          n.line += std::string(n.session.text_end());
          end = true;
        }
        if (!end) {
          n.session.feed({piece.token});
          continue;
        }
        for (char &c : n.line) c = c == '\n' ? ' ' : c;
        const std::vector<uint8_t> save = n.session.save();  // the save system's bytes
        std::lock_guard<std::mutex> lk(box.mu);
        box.lines.push_back(std::string(n.name) + ": " + n.line);
        box.saved_bytes = save.size();
        n.done = true;
        --active;
      }
    }
  } catch (const std::exception &e) {
    std::lock_guard<std::mutex> lk(box.mu);
    box.error = e.what();
  }
}

}  // namespace

int main(int argc, char **argv) {
  const char *model = argc > 1 ? argv[1] : NPC_DEFAULT_MODEL;
  const int max_tokens = argc > 2 ? std::atoi(argv[2]) : 40;
  const auto budget = std::chrono::microseconds(argc > 3 ? std::strtoll(argv[3], nullptr, 10) : 4000);
  if (max_tokens <= 0) {
    std::fprintf(stderr, "usage: %s [MODEL] [max_tokens_per_line > 0] [frame_budget_us]\n", argv[0]);
    return 2;
  }
  // The library's warnings and traces into the game's log, not the console.
  strata::set_log([](int32_t level, const char *msg, void *) { std::printf("[log %d] %s\n", level, msg); });
  try {
    moe_params p;
    moe_params_init(&p);
    p.model_path = model;
    p.max_sessions = 8;
    p.n_ctx = 1024;
    strata::Context ctx(p);
    const std::pair<const char *, const char *> cast[] = {
        {"Innkeeper", "Any news from the road today?"}, {"Blacksmith", "Can you mend my sword?"},
        {"Guard", "May I pass through the gate?"},      {"Scholar", "What lies beyond the hills?"},
        {"Merchant", "What do you have for sale?"},     {"Child", "Hello there, little one."}};
    std::vector<Npc> npcs(std::size(cast));
    for (size_t i = 0; i < npcs.size(); ++i) {
      npcs[i].name = cast[i].first;
      npcs[i].greeting = cast[i].second;
    }
    // The shared persona, prefilled once; every NPC forks it and hears its own greeting.
    const std::vector<int32_t> persona = ChatTokens(ctx, nullptr);
    moe_session_params sp;
    moe_session_params_init(&sp);
    sp.temperature = 0.8f;
    sp.top_k = 40;
    strata::Session base = ctx.session(sp);
    base.feed(persona);
    while (ctx.step() > 0) {
    }
    for (Npc &n : npcs) {
      const std::vector<int32_t> ids = ChatTokens(ctx, n.greeting);
      const bool shared = ids.size() >= persona.size() && std::equal(persona.begin(), persona.end(), ids.begin());
      if (shared) {
        n.session = base.fork();
        n.session.feed(strata::Span<const int32_t>(ids.data() + persona.size(), ids.size() - persona.size()));
      } else {
        n.session = ctx.session(sp);
        n.session.feed(ids);
      }
    }
    std::printf("%zu NPCs forked from one %zu-token persona (KV in use: %llu bytes); %lld us of model time a frame\n",
                npcs.size(), persona.size(), static_cast<unsigned long long>(ctx.kv_usage().first),
                static_cast<long long>(budget.count()));
    Mailbox box;
    std::thread worker(Worker, std::ref(ctx), std::ref(npcs), max_tokens, budget, std::ref(box));
    // The game thread: ~60 frames a second; draws the lines the worker finished.
    size_t drawn = 0;
    for (int frame = 0; drawn < npcs.size(); ++frame) {
      {
        std::lock_guard<std::mutex> lk(box.mu);
        ++box.frames_granted;
        for (; drawn < box.lines.size(); ++drawn) std::printf("[frame %4d] %s\n", frame, box.lines[drawn].c_str());
        if (!box.error.empty()) break;
      }
      box.cv.notify_one();
      std::this_thread::sleep_for(std::chrono::milliseconds(16));
    }
    {
      std::lock_guard<std::mutex> lk(box.mu);
      box.quit = true;
    }
    box.cv.notify_one();
    ctx.abort();  // a step still running stops at its next layer
    worker.join();
    if (!box.error.empty()) {
      std::fprintf(stderr, "npc_worker: %s\n", box.error.c_str());
      return 1;
    }
    std::printf("saved an NPC into %zu bytes\n", box.saved_bytes);
  } catch (const strata::Error &e) {
    std::fprintf(stderr, "npc_worker: %s (%s)\n", e.what(), e.status_name());
    return 1;
  }
  strata::set_log(nullptr);
  return 0;
}
