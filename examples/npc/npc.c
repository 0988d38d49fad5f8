/* Eight NPCs talking through one model at once: a C99 game loop over Strata's C ABI only.
 * Each NPC is a session with its own persona (a system message rendered by the model's chat
 * template); every frame the loop gives the model a time budget (moe_ctx_step_for), then polls each
 * NPC (moe_session_ready) and draws whatever text it produced, printing an NPC's line when it ends.
 * All NPCs share one context, one expert cache and one batch per step.
 *   usage: strata_example_npc [MODEL] [max_tokens_per_line] [frame_budget_us] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <strata/moe.h>

#ifndef NPC_DEFAULT_MODEL
#define NPC_DEFAULT_MODEL "examples/models/austen-moe-q4_k.gguf"
#endif

#define N_NPC 8
#define LINE_CAP 4096

typedef struct npc {
  const char *name;
  const char *persona;
  const char *greeting; /* what the player says to this NPC */
  moe_session *session;
  char line[LINE_CAP];  /* the line being spoken, drawn as it grows */
  size_t line_len;
  int n_tokens;
  int done;
} npc;

static int check(moe_status st, const char *what) {
  if (st != MOE_OK) {
    fprintf(stderr, "npc: %s failed: %s (%s)\n", what, moe_last_error(), moe_status_string(st));
    return 1;
  }
  return 0;
}

static void append(npc *n, const char *text, size_t len) {
  size_t room = LINE_CAP - 1 - n->line_len;
  size_t i;
  if (len > room) len = room;
  for (i = 0; i < len; ++i) n->line[n->line_len++] = text[i] == '\n' ? ' ' : text[i];
  n->line[n->line_len] = '\0';
}

/* Renders the NPC's persona and the player's greeting with the model's chat template, tokenizes
 * it (the player's text never becomes a control token) and feeds it to the NPC's session. */
static int start_npc(moe_ctx *ctx, npc *n) {
  moe_chat_message msgs[2];
  int32_t *ids = NULL;
  size_t n_ids = 0;
  int rc = 1;
  moe_status st;
  msgs[0].role = "system";
  msgs[0].content = n->persona;
  msgs[1].role = "user";
  msgs[1].content = n->greeting;
  st = moe_chat_tokenize(ctx, NULL, msgs, 2, 1, NULL, 0, &n_ids);
  if (st != MOE_OK && st != MOE_ERR_LIMIT) return check(st, "moe_chat_tokenize");
  ids = (int32_t *)malloc((n_ids ? n_ids : 1) * sizeof *ids);
  if (ids == NULL) goto out;
  if (check(moe_chat_tokenize(ctx, NULL, msgs, 2, 1, ids, n_ids, &n_ids), "moe_chat_tokenize")) goto out;
  if (check(moe_session_feed(n->session, ids, n_ids), "moe_session_feed")) goto out;
  rc = 0;
out:
  free(ids);
  return rc;
}

int main(int argc, char **argv) {
  npc npcs[N_NPC] = {
      {"Innkeeper", "You are Martha, the cheerful innkeeper of the Prancing Goose. You gossip about travellers.",
       "Any news from the road today?", NULL, {0}, 0, 0, 0},
      {"Blacksmith", "You are Bram, a gruff blacksmith who speaks in short sentences and loves his anvil.",
       "Can you mend my sword?", NULL, {0}, 0, 0, 0},
      {"Guard", "You are a weary city guard at the north gate, suspicious of strangers.",
       "May I pass through the gate?", NULL, {0}, 0, 0, 0},
      {"Scholar", "You are Elinor, a scholar of old maps who answers with long, careful explanations.",
       "What lies beyond the eastern hills?", NULL, {0}, 0, 0, 0},
      {"Merchant", "You are Tobias, a merchant who always tries to sell something.",
       "What do you have for sale?", NULL, {0}, 0, 0, 0},
      {"Child", "You are Pip, a curious child who asks many questions.", "Hello there, little one.", NULL, {0}, 0,
       0, 0},
      {"Priest", "You are Father Anselm, a kind priest who speaks of hope and patience.",
       "I have lost my way.", NULL, {0}, 0, 0, 0},
      {"Bard", "You are Lysa, a bard who answers in a cheerful, poetic manner.", "Sing me something!", NULL, {0},
       0, 0, 0},
  };
  const char *model = argc > 1 ? argv[1] : NPC_DEFAULT_MODEL;
  const int max_tokens = argc > 2 ? atoi(argv[2]) : 40;
  const uint64_t frame_us = argc > 3 ? (uint64_t)strtoull(argv[3], NULL, 10) : 16000u; /* ~60 frames/s */
  moe_params params;
  moe_session_params sp;
  moe_ctx *ctx = NULL;
  int i, frame, active = N_NPC, rc = 1;

  if (max_tokens <= 0) {
    fprintf(stderr, "usage: %s [MODEL] [max_tokens_per_line > 0] [frame_budget_us]\n", argv[0]);
    return 2;
  }
  moe_params_init(&params);
  params.model_path = model;
  params.max_sessions = N_NPC;
  params.n_ctx = 1024;
  if (check(moe_ctx_open(&params, &ctx), "moe_ctx_open")) return 1;
  for (i = 0; i < N_NPC; ++i) {
    moe_session_params_init(&sp);
    sp.seed = 1000u + (uint64_t)i; /* each NPC its own voice */
    sp.temperature = 0.8f;
    sp.top_k = 40;
    if (check(moe_session_open(ctx, &sp, &npcs[i].session), "moe_session_open")) goto done;
    if (start_npc(ctx, &npcs[i])) goto done;
  }
  printf("%d NPCs, one context; %llu us per frame\n", N_NPC, (unsigned long long)frame_us);
  /* The game loop: a budget of model time per frame, then draw what is ready. */
  for (frame = 0; active > 0; ++frame) {
    uint32_t pending = 0, steps = 0;
    if (check(moe_ctx_step_for(ctx, frame_us, &pending, &steps), "moe_ctx_step_for")) goto done;
    for (i = 0; i < N_NPC; ++i) {
      npc *n = &npcs[i];
      int32_t token, stop = MOE_STOP_NONE;
      const char *text;
      size_t len;
      if (n->done || moe_session_ready(n->session) != 1) continue;
      if (check(moe_session_sample_text(n->session, &token, &text, &len, &stop), "moe_session_sample_text")) {
        goto done;
      }
      append(n, text, len);
      ++n->n_tokens;
      if (stop == MOE_STOP_NONE && n->n_tokens >= max_tokens) {
        if (check(moe_session_text_end(n->session, &text, &len), "moe_session_text_end")) goto done;
        append(n, text, len);
        stop = MOE_STOP_TOKEN;
      }
      if (stop != MOE_STOP_NONE) {
        printf("[frame %4d] %-10s: %s\n", frame, n->name, n->line);
        fflush(stdout);
        n->done = 1;
        --active;
        continue;
      }
      /* The token goes back in; the next frames compute the one after it. */
      if (check(moe_session_feed(n->session, &token, 1), "moe_session_feed")) goto done;
    }
  }
  rc = 0;
done:
  for (i = 0; i < N_NPC; ++i) moe_session_close(npcs[i].session);
  moe_ctx_close(ctx);
  return rc;
}
