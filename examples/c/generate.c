/* A C99 host driving Strata through its C ABI only: open a model, open a session, feed a prompt of
 * token ids, and sample a continuation.   usage: strata_example_c MODEL [n_tokens] */
#include <stdio.h>
#include <stdlib.h>

#include <strata/moe.h>

static int check(moe_status st, const char *what) {
  if (st != MOE_OK) {
    fprintf(stderr, "%s failed: %s (%s)\n", what, moe_last_error(), moe_status_string(st));
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  moe_params params;
  moe_session_params sparams;
  moe_ctx *ctx = NULL;
  moe_session *session = NULL;
  int32_t prompt[4] = {1, 2, 3, 4};
  int n_predict = argc > 2 ? atoi(argv[2]) : 8;
  int i, rc = 1;

  if (argc < 2) {
    fprintf(stderr, "usage: %s MODEL [n_tokens]\n", argv[0]);
    return 2;
  }
  moe_params_init(&params);
  params.model_path = argv[1];
  params.backend = MOE_BACKEND_CPU;
  if (check(moe_ctx_open(&params, &ctx), "moe_ctx_open")) goto done;

  moe_session_params_init(&sparams);
  sparams.temperature = 0.0f; /* greedy */
  if (check(moe_session_open(ctx, &sparams, &session), "moe_session_open")) goto done;
  if (check(moe_session_feed(session, prompt, 4), "moe_session_feed")) goto done;

  printf("strata %s, vocabulary %d\n", moe_version_string(), moe_ctx_vocab_size(ctx));
  for (i = 0; i < n_predict; ++i) {
    int32_t token;
    if (check(moe_ctx_step(ctx, NULL), "moe_ctx_step")) goto done;
    if (check(moe_session_sample(session, &token), "moe_session_sample")) goto done;
    printf("%d%s", token, i + 1 < n_predict ? " " : "\n");
    if (check(moe_session_feed(session, &token, 1), "moe_session_feed")) goto done;
  }
  rc = 0;
done:
  moe_session_close(session);
  moe_ctx_close(ctx);
  return rc;
}
