/* A stand-in for a CUDA plugin of another Strata build (backends/cuda_plugin.h), for the tests of
 * the library's loader: it exports the entry with its fixed C signature and nothing else.
 *  - FAKE_PLUGIN_REFUSING: a plugin that checks the versions it is handed, as every plugin does, and
 *    refuses this library: it claims ABI 9999.
 *  - FAKE_PLUGIN_CARELESS: one that checks nothing and hands back a table of another build (its
 *    three leading fields say ABI 9999); the library must refuse it before any call. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FAKE_ABI 9999u

#if defined(FAKE_PLUGIN_CARELESS)
static const struct {
  uint32_t struct_size, abi_version, library_version;
  void *functions[5];
} kTable = {sizeof kTable, FAKE_ABI, 9999u, {NULL, NULL, NULL, NULL, NULL}};
#endif

__attribute__((visibility("default"))) int32_t strata_cuda_plugin_open(uint32_t abi_version, uint32_t library_version,
                                                                      const void *host, const void **table, char *why,
                                                                      size_t why_size) {
  (void)host;
#if defined(FAKE_PLUGIN_REFUSING)
  (void)table;
  if (abi_version != FAKE_ABI) {
    snprintf(why, why_size, "the CUDA plugin is built for plugin ABI %u, the library loading it is ABI %u (%u)",
             FAKE_ABI, (unsigned)abi_version, (unsigned)library_version);
    return 1;
  }
  return 1;
#else
  (void)abi_version;
  (void)library_version;
  (void)why;
  (void)why_size;
  *table = &kTable;
  return 0;
#endif
}
