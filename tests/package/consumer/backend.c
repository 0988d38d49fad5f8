/* A host's view of the CUDA backend through the installed package: whether it can run here and
 * why not, a model opened with MOE_BACKEND_AUTO (the CPU when CUDA cannot run), and CUDA asked for
 * by name. One line each. */
#include <stdio.h>

#include <strata/moe.h>

int main(int argc, char **argv) {
  moe_params p;
  moe_ctx *ctx = NULL;
  moe_status st;
  if (argc < 2) return 2;
  if (moe_backend_available(MOE_BACKEND_CUDA) == 1) {
    printf("cuda: available\n");
  } else {
    printf("cuda: unavailable: %s\n", moe_last_error());
  }
  moe_params_init(&p);
  p.model_path = argv[1];
  st = moe_ctx_open(&p, &ctx);
  if (st != MOE_OK) {
    printf("auto: %s: %s\n", moe_status_string(st), moe_last_error());
    return 1;
  }
  printf("auto: vocab %d\n", moe_ctx_vocab_size(ctx));
  moe_ctx_close(ctx);
  ctx = NULL;
  p.backend = MOE_BACKEND_CUDA;
  st = moe_ctx_open(&p, &ctx);
  if (st == MOE_OK) {
    printf("cuda: opened\n");
    moe_ctx_close(ctx);
  } else {
    printf("cuda: %s: %s\n", moe_status_string(st), moe_last_error());
  }
  return 0;
}
