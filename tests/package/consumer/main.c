/* Consumer of the installed package: opens a model through the C ABI and prints its vocabulary. */
#include <stdio.h>

#include <strata/moe.h>

int main(int argc, char **argv) {
  moe_params p;
  moe_ctx *ctx = NULL;
  moe_status st;
  if (argc < 2) return 2;
  moe_params_init(&p);
  p.model_path = argv[1];
  st = moe_ctx_open(&p, &ctx);
  if (st != MOE_OK) {
    fprintf(stderr, "%s: %s\n", moe_status_string(st), moe_last_error());
    return 1;
  }
  printf("strata %s: vocab %d\n", moe_version_string(), moe_ctx_vocab_size(ctx));
  moe_ctx_close(ctx);
  return 0;
}
