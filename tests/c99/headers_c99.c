/* Compiles every public C header as strict C99 (-std=c99 -pedantic -Werror). */
#include <strata/moe.h>

int strata_c99_header_check(void) {
  moe_params p;
  moe_session_params sp;
  moe_cache_plan plan;
  moe_params_init(&p);
  moe_session_params_init(&sp);
  moe_cache_plan_init(&plan);
  return (int)(p.struct_size + sp.struct_size + plan.struct_size);
}
