/*
 * strata/moe.h — the stable C ABI of Strata, an engine for Mixture-of-Experts language models whose
 * weights do not fit in GPU memory or RAM. This header is the specification: anything not declared
 * here is not API. It is C99; C++ hosts may prefer <strata/moe.hpp> (RAII wrappers over this ABI).
 *
 * Conventions
 *  - Handles are opaque. `*_close(NULL)` is a no-op.
 *  - Every fallible call returns a moe_status (0 = MOE_OK). On failure, moe_last_error() returns a
 *    thread-local message naming what went wrong; out-params are left untouched unless stated.
 *  - Params structs start with `uint32_t struct_size`; initialise them with the static inline
 *    `*_init()` functions below, which stamp sizeof and fill defaults. Fields are only appended (in
 *    groups marked "Since"): the library reads just the fields the caller's struct_size covers, so
 *    old hosts keep working. A struct_size must be one a header had (the end of a "Since" group,
 *    padded as the compiler pads the struct, or today's sizeof); any other size, in or out, is
 *    refused with MOE_ERR_INVALID_ARGUMENT naming the struct and the size, and nothing is read or
 *    written through it. The *_fill_defaults functions write nothing for such a size.
 *  - moe_last_error() is one line of valid UTF-8: control bytes, NUL and invalid UTF-8 that a
 *    message quotes (from a file or an argument) are written as \xNN.
 *  - No C++ exception, abort or exit ever crosses this ABI.
 *  - The library writes nothing to stdout, and to stderr only its log lines (warnings, traces a
 *    tunable turns on), which moe_log_set sends to the host instead.
 *  - Thread safety is stated per function. A context may be used from several threads; a session is
 *    used by one thread at a time.
 */
#ifndef STRATA_MOE_H_
#define STRATA_MOE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MOE_BUILDING_LIBRARY)
#define MOE_API __attribute__((visibility("default")))
#else
#define MOE_API
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */
#define MOE_VERSION_MAJOR 0
#define MOE_VERSION_MINOR 9
#define MOE_VERSION_PATCH 0
#define MOE_VERSION_NUMBER (MOE_VERSION_MAJOR * 10000 + MOE_VERSION_MINOR * 100 + MOE_VERSION_PATCH)

/* The version of the library actually loaded (MOE_VERSION_NUMBER of its build). Since: 0.1. */
MOE_API int32_t moe_version_number(void);
/* "MAJOR.MINOR.PATCH" of the loaded library; static storage. Since: 0.1. */
MOE_API const char *moe_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status codes. The low byte is the category; extended codes add detail above it (SQLite style),
 * so `MOE_STATUS_CATEGORY(st) == MOE_ERR_FORMAT` holds for every malformed-file code. Values are
 * pinned forever and never reused.
 * ------------------------------------------------------------------------------------------- */
typedef int32_t moe_status;

#define MOE_STATUS_CATEGORY(st) ((moe_status)((st)&0xff))

#define MOE_OK 0
#define MOE_ERR_INVALID_ARGUMENT 1 /* a NULL pointer, a size out of range, a bad flag */
#define MOE_ERR_IO 2               /* the operating system failed a read, open or write */
#define MOE_ERR_FORMAT 3           /* a model (or snapshot) file is malformed */
#define MOE_ERR_UNSUPPORTED 4      /* well-formed, but not something this build can run */
#define MOE_ERR_NO_MEMORY 5        /* an allocation failed or would exceed a budget */
#define MOE_ERR_STATE 6            /* the call is not valid in the object's current state */
#define MOE_ERR_BACKEND 7          /* a compute backend (e.g. CUDA) failed */
#define MOE_ERR_INTERNAL 8         /* a bug in Strata; please report it */
#define MOE_ERR_LIMIT 9            /* a fixed limit was reached (context length, sessions) */
#define MOE_ERR_CANCELLED 10       /* the host asked to stop (a load callback returned 0). Since: 0.7. */

#define MOE_ERR_IO_READ (MOE_ERR_IO | (1 << 8))          /* read failed (EIO, ...) */
#define MOE_ERR_IO_OPEN (MOE_ERR_IO | (2 << 8))          /* file or directory cannot be opened */
#define MOE_ERR_IO_CHANGED (MOE_ERR_IO | (3 << 8))       /* the file was replaced or resized */
#define MOE_ERR_IO_WRITE (MOE_ERR_IO | (4 << 8))         /* write, fsync or rename failed */
#define MOE_ERR_FORMAT_TRUNCATED (MOE_ERR_FORMAT | (1 << 8)) /* data ends before it should */
#define MOE_ERR_FORMAT_HEADER (MOE_ERR_FORMAT | (2 << 8))    /* bad magic, version or header size */
#define MOE_ERR_FORMAT_METADATA (MOE_ERR_FORMAT | (3 << 8))  /* bad key/value: count, length, type, duplicate */
#define MOE_ERR_FORMAT_TENSOR (MOE_ERR_FORMAT | (4 << 8))    /* bad tensor entry: dims, type, offset, extent, name */
#define MOE_ERR_FORMAT_HPARAMS (MOE_ERR_FORMAT | (5 << 8))   /* hyper-parameters missing or disagreeing with shapes */
#define MOE_ERR_FORMAT_CONFIG (MOE_ERR_FORMAT | (6 << 8))    /* HF config.json / index malformed */
#define MOE_ERR_FORMAT_CHECKSUM (MOE_ERR_FORMAT | (7 << 8))  /* a snapshot's checksum does not match its bytes */
#define MOE_ERR_FORMAT_FOREIGN (MOE_ERR_FORMAT | (8 << 8))   /* a snapshot written for another model */
#define MOE_ERR_UNSUPPORTED_ARCH (MOE_ERR_UNSUPPORTED | (1 << 8)) /* architecture not implemented */
#define MOE_ERR_UNSUPPORTED_TYPE (MOE_ERR_UNSUPPORTED | (2 << 8)) /* tensor type / codec not implemented */
#define MOE_ERR_UNSUPPORTED_BACKEND (MOE_ERR_UNSUPPORTED | (3 << 8)) /* backend not built in or no device */
#define MOE_ERR_LIMIT_CONTEXT (MOE_ERR_LIMIT | (1 << 8)) /* session context (n_ctx) is full */
#define MOE_ERR_LIMIT_KV (MOE_ERR_LIMIT | (2 << 8))      /* the context's KV budget is used up */
#define MOE_ERR_ABORTED (MOE_ERR_CANCELLED | (1 << 8))   /* a step stopped by moe_ctx_abort. Since: 0.7. */

/* The name of a status ("MOE_ERR_FORMAT_TENSOR"), or "MOE_ERR_UNKNOWN"; static storage.
 * Thread-safety: safe. Since: 0.1. */
MOE_API const char *moe_status_string(moe_status st);

/* The message of the last failing call on this thread ("" if none). Owned by the library, valid
 * until the next failing call on the same thread. Thread-safety: thread-local. Since: 0.1. */
MOE_API const char *moe_last_error(void);

/* ---------------------------------------------------------------------------------------------
 * Logging. The library writes a few lines of its own outside returned statuses: warnings (a
 * tunable's environment variable it cannot read, an optional GPU path it turns off) and the traces
 * that tunables switch on (STRATA_*_TRACE, STRATA_CUDA_PROFILE). By default they go to stderr.
 * ------------------------------------------------------------------------------------------- */
#define MOE_LOG_ERROR 0
#define MOE_LOG_WARN 1
#define MOE_LOG_INFO 2
#define MOE_LOG_DEBUG 3 /* traces a tunable turned on */

/* Receives one line (UTF-8, NUL-terminated, no trailing newline; valid during the call) at a level
 * MOE_LOG_*. Called on whatever thread logs, one call at a time; it must not call into Strata.
 * Since: 0.7. */
typedef void (*moe_log_fn)(int32_t level, const char *msg, void *user);

/* Sends every line the library logs to fn (with `user`) instead of stderr: once set, the library
 * writes nothing to stderr (progress bars of the library's own tools stay off). fn NULL restores
 * stderr. Process-wide. Once it returns, the previous callback is not running and is never called
 * again, so its user data may be freed.
 * Thread-safety: safe; must not be called from inside a log callback. Since: 0.7. */
MOE_API void moe_log_set(moe_log_fn fn, void *user);

/* ---------------------------------------------------------------------------------------------
 * Handles
 * ------------------------------------------------------------------------------------------- */
typedef struct moe_ctx moe_ctx;                   /* model + tiers + backends + sessions */
typedef struct moe_session moe_session;           /* one conversation (e.g. one NPC) */
typedef struct moe_expert_table moe_expert_table; /* read-only view of the routed experts */

/* ---------------------------------------------------------------------------------------------
 * Context parameters
 * ------------------------------------------------------------------------------------------- */
typedef enum moe_backend_kind {
  MOE_BACKEND_AUTO = 0, /* CUDA when its plugin loads and a device is present, else CPU */
  MOE_BACKEND_CPU = 1,
  MOE_BACKEND_CUDA = 2
} moe_backend_kind;

/* Whether a context could run on backend `kind` here: built into this library and, for a device
 * backend, a device present. MOE_BACKEND_AUTO is always available (it falls back to the CPU).
 * The CUDA backend is a plugin, libstrata-cuda.so, which the library opens (dlopen) the first time
 * CUDA is asked for or queried here, and keeps for the process: the file the tuning variable
 * STRATA_CUDA_PLUGIN names, else the one beside this library, beside the executable, or on the
 * dynamic loader's search path. A host without a GPU needs neither the plugin nor CUDA's libraries.
 * @return 1 when available; 0 when not, and then the thread's moe_last_error() says why ("the CUDA
 *   backend is not available in this build"; its plugin not found, with the places tried; the
 *   plugin found but not loaded, with dlopen's error or the plugin's refusal of a library of
 *   another build; no device found; an unknown kind); moe_last_error() is left as it was on 1.
 * Thread-safety: safe. Since: 0.6 (the plugin since 0.8). */
MOE_API int32_t moe_backend_available(int32_t kind);

/* Progress of a load: bytes read so far of the total, and the user pointer given with the callback.
 * Since: 0.5. */
typedef void (*moe_load_progress_fn)(uint64_t done_bytes, uint64_t total_bytes, void *user);

/* Asked during a load whether to go on: nonzero continues, 0 cancels moe_ctx_open, which then
 * returns MOE_ERR_CANCELLED having freed everything it had allocated. Since: 0.7. */
typedef int32_t (*moe_load_continue_fn)(uint64_t done_bytes, uint64_t total_bytes, void *user);

typedef struct moe_params {
  uint32_t struct_size;
  const char *model_path;     /* GGUF file or Hugging Face checkpoint directory (required) */
  int32_t backend;            /* moe_backend_kind; default MOE_BACKEND_AUTO */
  uint64_t vram_budget_bytes; /* 0 = auto */
  uint64_t ram_budget_bytes;  /* 0 = auto (80% of usable memory for the model) */
  int32_t n_threads;          /* CPU threads for compute; 0 = one per core; at most 1024
                                 (MOE_ERR_INVALID_ARGUMENT above); threads the host refuses fail
                                 moe_ctx_open with MOE_ERR_NO_MEMORY */
  uint32_t n_ctx;             /* default context length per session; 0 = min(model's, 4096) */
  uint32_t max_sessions;      /* sessions the KV budget is sized for (x n_ctx, in 128-token blocks);
                                 default 1. Sessions beyond it may open: they share the budget */
  /* Since 0.1: the expert cache (used when the RAM budget cannot hold every routed expert). */
  int32_t cache_policy;       /* moe_cache_policy; default MOE_CACHE_HOTNESS */
  int32_t prefetch_distance;  /* layers ahead whose experts are predicted and prefetched; default 1 */
  int32_t n_io_threads;       /* threads reading experts from the model file; default 2, at most 1024 */
  const char *hotlist_path;   /* a hotlist (`strata profile`): its top experts are loaded into the
                                 cache in the background at open, and with a VRAM tier they take its
                                 slots first when it is filled at open; NULL = none */
  uint32_t hotlist_max_experts; /* cap on those; 0 = as many as the cache (the tier) holds */
  uint32_t direct_io;         /* 1 (default): read experts past the page cache (O_DIRECT, io_uring)
                                 where the file keeps them 4 KiB-aligned, as `strata pack` does */
  uint32_t cpu_q8_activations; /* 1: CPU matmuls quantize activations to 8-bit blocks and use integer
                                 dot products (faster, error bound in tests/cpu); 0 (default): float
                                 activations, the numbers the golden tests hold to transformers' */
  /* Since 0.1 (appended): continuous batching and prefill modes (0 = the defaults stated). */
  uint32_t max_batch_tokens;  /* tokens of all sessions per forward pass (per moe_ctx_step); default 512.
                                 Sessions with input share it round-robin: each gets a chunk */
  uint32_t prefill_token_max; /* an input of at most this many tokens runs token by token (decode-like
                                 passes); default 1: batched prefill was faster from 2 tokens up on the
                                 CPU backend (measured, bench/README.md) */
  uint32_t prefill_layer_min; /* a pass of at least this many tokens streams whole layers ahead
                                 (layer-major prefill); fewer load only the selected experts; default
                                 4 n_expert / n_expert_used (64 for Qwen3-30B-A3B): where an evenly
                                 routed pass touches ~98% of a layer's experts (measured, bench/README.md) */
  /* Since 0.1 (appended): the KV cache. Sessions hold their keys and values in blocks of 128 tokens,
   * allocated as they grow (never more than their n_ctx). All sessions of a context share one KV
   * budget; a step runs the sessions whose queued input fits it (evicting idle sessions to
   * kv_spill_dir when one is given) and leaves the others for later (see moe_ctx_step). */
  uint64_t kv_budget_bytes;   /* the shared KV budget; 0 (default) = the cache plan's KV line:
                                 max_sessions x n_ctx positions, rounded up to whole blocks */
  const char *kv_spill_dir;   /* a directory for evicted sessions' KV (unlinked files, gone at exit);
                                 NULL (default) = no eviction to disk */
  /* Since 0.4 (appended): hybrid placement on the CUDA backend with a VRAM tier. */
  int32_t cpu_experts;        /* moe_cpu_experts; default MOE_CPU_EXPERTS_AUTO */
  uint32_t gpu_q8_activations; /* 1: the CUDA backend's products see activations quantized to 8-bit blocks
                                 as cpu_q8_activations does (the same numbers up to float summation order):
                                 integer dot products over Q8_0 and Q4_K weights on the GEMV path (faster,
                                 most for batches of sessions), the rounded activations for every other
                                 block codec; 0 (default): float activations */
  /* Since 0.5 (appended): progress of moe_ctx_open while it reads the weights it keeps in memory
   * (everything but the routed experts the RAM budget leaves to stream; where the VRAM and RAM
   * budgets hold every routed expert between them, those too: they are read at open). */
  moe_load_progress_fn load_progress; /* NULL (default) = none. Called on the thread in moe_ctx_open,
                                 at most every 0.1 s while reading and once with done == total at
                                 the end; it must not call into Strata */
  void *load_progress_user;   /* passed back to load_progress */
  /* Since 0.6 (appended): choices that were environment variables alone. Each default (0) follows
   * the tunable named: its environment variable when set, else its default (`strata --list-tunables`
   * prints them); a value set here wins over the environment. moe_ctx_open fails with
   * MOE_ERR_INVALID_ARGUMENT on a value outside the ones listed. */
  int32_t cuda_graphs;        /* moe_switch: decode steps recorded as CUDA graphs and replayed
                                 (STRATA_CUDA_GRAPHS, on by default); off runs every step eagerly */
  int32_t cuda_cold_copies;   /* the CUDA backend's copy engines move a layer's cold experts into
                                 VRAM slots of their own: N in [1, 256] slots a set, -1 off, 0
                                 (default) = STRATA_CUDA_COLD_COPIES, else sized from the VRAM budget */
  int32_t huge_pages;         /* moe_switch: the weights' host memory advised into transparent huge
                                 pages where the host has them (STRATA_HUGEPAGES, on by default) */
  int32_t cuda_streaming;     /* moe_switch: --backend cuda over a streaming context, the GPU reading
                                 experts where the RAM cache holds them (STRATA_CUDA_STREAMING, on by
                                 default); off refuses that with MOE_ERR_UNSUPPORTED_BACKEND */
  /* Since 0.7 (appended): a load the host can cancel. */
  moe_load_continue_fn load_continue; /* NULL (default) = never cancel. Called on the thread in
                                 moe_ctx_open with load_progress_user: once with done == 0 before
                                 the weights are read, then where load_progress is called (at most
                                 every 0.1 s while reading, and once with done == total); returning 0
                                 stops the open with MOE_ERR_CANCELLED and nothing left allocated.
                                 It must not call into Strata */
  /* Since 0.8 (appended): how the KV cache stores keys and values (llama.cpp's --cache-type-k /
   * --cache-type-v and its context params' type_k / type_v; the values are ggml_type's). */
  int32_t type_k;             /* moe_kv_type of the keys; default MOE_KV_F32. Another value fails
                                 moe_ctx_open and moe_plan with MOE_ERR_INVALID_ARGUMENT. Every
                                 backend holds all three types (the CUDA backend since 0.9; before,
                                 a type other than f32 on it failed with MOE_ERR_UNSUPPORTED) */
  int32_t type_v;             /* moe_kv_type of the values; default MOE_KV_F32 */
} moe_params;

/* A KV cache type (moe_params.type_k / type_v), numbered as ggml_type. Since: 0.8. */
typedef enum moe_kv_type {
  MOE_KV_F32 = 0,  /* float32: the numbers the golden tests hold to transformers' */
  MOE_KV_F16 = 1,  /* IEEE half: half the bytes */
  MOE_KV_Q8_0 = 8  /* ggml's q8_0 (32 values: an f16 scale and 32 int8): 17/64 of f32's bytes */
} moe_kv_type;

/* A choice whose default is a tunable (moe_params.cuda_graphs, huge_pages, cuda_streaming). Since: 0.6. */
typedef enum moe_switch {
  MOE_SWITCH_DEFAULT = 0, /* the tunable's value: its environment variable when set, else its default */
  MOE_SWITCH_ON = 1,
  MOE_SWITCH_OFF = 2
} moe_switch;

/* Who runs a routed expert the VRAM tier does not hold, during decode (CUDA backend). */
typedef enum moe_cpu_experts {
  MOE_CPU_EXPERTS_AUTO = 0,  /* a cost model fed by the measured link and CPU rates splits each layer's
                                cold experts between the GPU (reading them over the link) and the CPU
                                (computing them from host RAM with n_threads - 2 threads and cpu_q8_activations),
                                in layers where that saves more than the host round trip costs; where the
                                copy engines also move cold experts into VRAM, the two ways are timed over a
                                few decode steps of each batch size and the faster kept for that size, the
                                CPU's share where they are within 3% (timed again after 1024 steps) */
  MOE_CPU_EXPERTS_OFF = 1,   /* always the GPU: results are bit-identical at any VRAM budget */
  MOE_CPU_EXPERTS_ALWAYS = 2 /* every cold expert on the CPU (for tests and measurements) */
} moe_cpu_experts;

typedef enum moe_cache_policy {
  MOE_CACHE_LRU = 0,     /* evict the least recently used expert */
  MOE_CACHE_LFU = 1,     /* evict the least frequently used expert */
  MOE_CACHE_HOTNESS = 2  /* route hotness: selections counted, halved every 16 decode tokens,
                            reset at a new prompt (the cache stays warm) */
} moe_cache_policy;

/* Fills `p` (whose struct_size is already set) with defaults, for the fields that size covers.
 * Call through moe_params_init. Since: 0.1. */
MOE_API void moe_params_fill_defaults(moe_params *p);
static inline void moe_params_init(moe_params *p) {
  p->struct_size = (uint32_t)sizeof(moe_params);
  moe_params_fill_defaults(p);
}

/* ---------------------------------------------------------------------------------------------
 * Cache plan: where the model's bytes go. A value the host can read and print as a ledger.
 * ------------------------------------------------------------------------------------------- */
typedef struct moe_cache_plan {
  uint32_t struct_size;
  uint64_t ram_budget_bytes;        /* the budget the plan was made for (after clamping) */
  uint64_t vram_budget_bytes;
  uint64_t non_routed_bytes;        /* embeddings, attention, norms, routers, shared experts, output */
  uint64_t routed_expert_bytes;     /* all routed experts of the model */
  uint64_t kv_bytes;                /* the KV budget all sessions share (see moe_params.kv_budget_bytes) */
  uint64_t workspace_bytes;         /* activations and scratch */
  uint64_t expert_slot_bytes;       /* bytes of the largest routed expert (gate|up|down) */
  uint32_t n_layers;
  uint32_t n_routed_experts;        /* routed experts in the whole model (layers x experts) */
  uint32_t ram_expert_slots;        /* routed experts that fit in the RAM tier */
  uint32_t vram_expert_slots;       /* routed experts that fit in the VRAM tier */
  uint32_t clamped;                 /* 1 if the requested budget was below the minimum and raised */
  uint32_t n_ctx;
  uint32_t max_sessions;
  /* Since 0.1 (appended): the block-wise KV cache. */
  uint64_t kv_bytes_per_token;      /* one position of one session, all layers */
  uint32_t kv_block_tokens;         /* positions per KV block (128) */
  uint32_t kv_max_blocks;           /* blocks the KV budget holds */
  /* Since 0.6: the three tiers. A budget of fixed + k x expert_slot_bytes gives k slots in its tier;
   * while experts stream, VRAM and RAM hold distinct experts. */
  uint64_t ram_fixed_bytes;         /* what the RAM budget spends before expert slots: the non-routed
                                       weights, and the KV cache and workspace unless the backend holds
                                       them in device memory (CUDA) */
  uint64_t vram_fixed_bytes;        /* what the VRAM budget spends before expert slots: the device's
                                       non-routed weights, KV cache and workspace (0: no device tier) */
  uint32_t streamed_experts;        /* routed experts neither tier holds: routed - VRAM - RAM, at least 0 */
} moe_cache_plan;

static inline void moe_cache_plan_init(moe_cache_plan *p) {
  unsigned char *b = (unsigned char *)p;
  size_t i;
  for (i = 0; i < sizeof(*p); ++i) b[i] = 0;
  p->struct_size = (uint32_t)sizeof(moe_cache_plan);
}

/* Makes the cache plan for `p` without loading weights (reads the model's header only).
 * `out` must be initialised with moe_cache_plan_init.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT; MOE_ERR_IO_*; MOE_ERR_FORMAT_*; MOE_ERR_UNSUPPORTED_*.
 * Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_plan(const moe_params *p, moe_cache_plan *out);

/* ---------------------------------------------------------------------------------------------
 * Context
 * ------------------------------------------------------------------------------------------- */

/* Opens the model at p->model_path, validates the whole file (header, tensor table, shapes
 * against hyper-parameters, data extents) and makes the context ready to run.
 * @return MOE_OK and *out set; on failure *out is untouched and nothing is leaked:
 *   MOE_ERR_INVALID_ARGUMENT (NULL, bad struct_size, bad backend), MOE_ERR_IO_* (open/read),
 *   MOE_ERR_FORMAT_* (malformed file), MOE_ERR_UNSUPPORTED_* (architecture, tensor type, backend:
 *   a backend asked for by name that cannot run here is MOE_ERR_UNSUPPORTED_BACKEND before the file
 *   is read, with moe_backend_available's reason; MOE_BACKEND_AUTO falls back to the CPU),
 *   MOE_ERR_NO_MEMORY (also when the host refuses a thread: a process or thread limit).
 * Thread-safety: safe (contexts are independent). Since: 0.1. */
MOE_API moe_status moe_ctx_open(const moe_params *p, moe_ctx **out);

/* Closes the context and every session still open on it. NULL is a no-op. The host must not use
 * the context or its sessions concurrently with close. Since: 0.1. */
MOE_API void moe_ctx_close(moe_ctx *ctx);

/* Vocabulary size of the model (the length of a logits row); -1 if ctx is NULL.
 * Thread-safety: safe. Since: 0.1. */
MOE_API int32_t moe_ctx_vocab_size(const moe_ctx *ctx);

/* The cache plan the context runs with. Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_ctx_plan(const moe_ctx *ctx, moe_cache_plan *out);

/* The context's routed-expert table (valid until moe_ctx_close); NULL if ctx is NULL.
 * Thread-safety: safe. Since: 0.1. */
MOE_API const moe_expert_table *moe_ctx_experts(const moe_ctx *ctx);

/* Layers with routed experts, and routed experts per layer, of the table; 0 for NULL. Since: 0.1. */
MOE_API uint32_t moe_expert_table_n_layers(const moe_expert_table *t);
MOE_API uint32_t moe_expert_table_n_experts(const moe_expert_table *t);

/* One routed expert: where its three projections lie in the model files. */
typedef struct moe_expert_info {
  uint32_t struct_size;
  uint32_t file_index[3];   /* gate, up, down: which model file (shard) */
  uint64_t file_offset[3];  /* absolute byte offsets */
  uint64_t bytes[3];
  uint32_t codec[3];        /* GGUF tensor type ids */
  uint32_t rows[3];         /* gate/up: n_ff, down: n_embd */
  uint32_t cols[3];         /* gate/up: n_embd, down: n_ff */
  uint64_t total_bytes;     /* gate + up + down */
  uint64_t slot_bytes;      /* bytes of the cache slot it occupies (one contiguous read when packed) */
  uint32_t single_read;     /* 1 when the three projections are read with one read */
} moe_expert_info;

static inline void moe_expert_info_init(moe_expert_info *p) {
  unsigned char *b = (unsigned char *)p;
  size_t i;
  for (i = 0; i < sizeof(*p); ++i) b[i] = 0;
  p->struct_size = (uint32_t)sizeof(moe_expert_info);
}

/* Fills `out` (initialised with moe_expert_info_init) for routed expert `expert` of `layer`.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL, layer or expert out of range, bad struct_size).
 * Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_expert_table_get(const moe_expert_table *t, uint32_t layer, uint32_t expert,
                                        moe_expert_info *out);

/* ---------------------------------------------------------------------------------------------
 * Statistics of the expert tiers
 * ------------------------------------------------------------------------------------------- */
typedef struct moe_stats {
  uint32_t struct_size;
  uint32_t streaming;          /* 1 when routed experts stream from the file through the RAM cache */
  uint64_t expert_hits;        /* expert uses served from RAM (resident, cached or already loading) */
  uint64_t expert_misses;      /* expert uses that waited for a read from the model file */
  uint64_t prefetch_issued;    /* predicted experts loaded ahead of use */
  uint64_t prefetch_useful;    /* of those, used before being evicted */
  uint64_t evictions;
  uint64_t bytes_read;         /* expert bytes read from the model files */
  double io_wait_s;            /* time compute waited for expert reads */
  uint32_t cache_slots;        /* experts the RAM tier holds */
  uint32_t memory_locked;      /* 1 when the cache slab is locked in RAM (mlock) */
  uint64_t cache_slot_bytes;
  uint64_t load_errors;
  uint64_t direct_reads;       /* expert loads that bypassed the page cache */
  /* Since 0.2: predictions not loaded because too few recent predictions were used, and the
   * measured share of predictions of non-resident experts that their layer then selected. */
  uint64_t prefetch_skipped;
  double prefetch_precision;
  /* Since 0.3: the CUDA backend's VRAM expert tier. */
  uint32_t vram_expert_slots;  /* experts the VRAM slots hold (0: every routed expert in VRAM, or no GPU) */
  uint32_t vram_device_layers; /* MoE layers routed and grouped on the GPU (no host wait per layer) */
  uint64_t vram_fills;         /* experts copied into VRAM slots */
  uint64_t vram_fill_bytes;
  uint64_t vram_zero_copy;     /* expert uses the GPU read from page-locked RAM over the link */
  uint64_t vram_promotions;    /* fills started by route hotness */
  /* Since 0.3: decode steps the CUDA backend recorded as graphs, and steps replayed from one. */
  uint64_t gpu_graph_captures;
  uint64_t gpu_graph_replays;
  /* Since 0.3: on a host of several NUMA nodes, the node the weights and the GPU's pinned buffers
   * were placed on (the GPU's); -1 when nothing was placed (one node, no GPU, or the node unknown). */
  int32_t numa_node;
  /* Since 0.4: hybrid placement (moe_params.cpu_experts). vram_zero_copy excludes these uses. */
  uint32_t vram_cpu_layers;    /* MoE layers now splitting their cold experts with the CPU */
  uint64_t vram_cpu_experts;   /* expert uses the CPU computed from host RAM instead of the GPU */
  uint64_t vram_replans;       /* times a prompt's route hotness re-planned the VRAM slots */
  /* Since 0.6: the VRAM tier stacked over a streamed RAM tier (the two hold distinct experts; the
   * hits of each tier and the file's reads add up to the expert uses). There vram_expert_slots,
   * vram_fills, vram_fill_bytes and vram_promotions count that tier's slots and moves up (vram_fills
   * and vram_fill_bytes also a prompt's experts copied up from RAM for its products). */
  uint64_t vram_hits;          /* expert uses served from a VRAM slot */
  uint64_t vram_demotions;     /* VRAM residents moved down into RAM to make room */
  /* Since 0.6: the part of the RAM tier's slab locked in RAM, from its start (memory_locked is 1
   * only when this is all of it: cache_slots x cache_slot_bytes); the rest may be paged out. */
  uint64_t locked_bytes;
} moe_stats;

static inline void moe_stats_init(moe_stats *p) {
  unsigned char *b = (unsigned char *)p;
  size_t i;
  for (i = 0; i < sizeof(*p); ++i) b[i] = 0;
  p->struct_size = (uint32_t)sizeof(moe_stats);
}

/* The context's counters since open or the last moe_ctx_reset_stats. Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_ctx_stats(const moe_ctx *ctx, moe_stats *out);
/* Hits and misses of one layer's experts. Since: 0.1. */
MOE_API moe_status moe_ctx_layer_stats(const moe_ctx *ctx, uint32_t layer, uint64_t *hits, uint64_t *misses);
/* Routing selections per routed expert since open or the last reset: counts[layer * n_experts +
 * expert]. *n receives layers x experts, also on MOE_ERR_LIMIT (capacity too small: nothing written).
 * Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_ctx_expert_counts(const moe_ctx *ctx, uint64_t *counts, size_t capacity, size_t *n);
/* Waits until the background expert loads (hotlist preload at open, prefetch) have finished, so a
 * host can start with a warm cache. Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_ctx_wait_loads(moe_ctx *ctx);
/* Zeroes the counters (the cache keeps its contents). Since: 0.1. */
MOE_API void moe_ctx_reset_stats(moe_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Sessions
 * ------------------------------------------------------------------------------------------- */
typedef struct moe_session_params {
  uint32_t struct_size;
  uint32_t n_ctx;       /* context length of this session; 0 = the context's default */
  uint64_t seed;        /* sampling seed */
  float temperature;    /* 0 = greedy */
  int32_t top_k;        /* 0 = off */
  float top_p;          /* 1 = off */
  uint32_t logits_all;  /* 1: keep the logits of every token of the last step, not only the last */
  /* Since 0.1 (appended): min-p, penalties and stop conditions. The penalties look at a window:
   * the last penalty_last_n tokens the session has processed (prompt and generated alike). */
  float min_p;                     /* keep tokens with p >= min_p * p(most likely), after top-p; 0 = off */
  float repeat_penalty;            /* a windowed token's logit l becomes l / r if l > 0, else l * r; 1 = off */
  float presence_penalty;          /* subtracted once from each windowed token's logit; 0 = off */
  int32_t penalty_last_n;          /* the window; default 64; 0 = no penalties */
  uint32_t stop_at_eos;            /* 1 (default): the model's EOS is a stop token */
  const int32_t *stop_tokens;      /* more stop tokens (copied at open); may be NULL when n is 0 */
  size_t n_stop_tokens;
  const char *const *stop_strings; /* NUL-terminated stop strings (copied at open); "" entries ignored */
  size_t n_stop_strings;
  /* Since 0.1 (appended): attention masks, applied in every layer.
   * - attn_window W > 0: the token at position p attends only to positions p-W+1 .. p (a sliding
   *   window; a model's own per-layer window, if smaller, still applies). 0 (default) = no window.
   * - blocked_tokens: a position holding one of these ids is never a key for any other position's
   *   query: later tokens see the sequence as if that position were absent (positions are not
   *   renumbered: RoPE still counts it). The blocked token itself attends normally (to the earlier
   *   unblocked positions and to itself), so its own logits stay defined. Copied at open. */
  uint32_t attn_window;
  const int32_t *blocked_tokens;   /* may be NULL when n_blocked_tokens is 0 */
  size_t n_blocked_tokens;
  /* Since 0.7 (appended): OpenAI's frequency penalty, over the same window as the other penalties. */
  float frequency_penalty;         /* subtracted from a windowed token's logit once per occurrence in the
                                      window (after presence_penalty); 0 = off; must be finite */
  /* Since 0.9 (appended): context shift, llama.cpp's --context-shift and --keep N. Off, input that
   * would take the session past n_ctx positions is refused (moe_session_feed: MOE_ERR_LIMIT_CONTEXT).
   * On, any input is taken: when the session holds n_ctx tokens and more input is queued, the step
   * first drops n_discard = (n_ctx - n_keep) / 2 tokens (at least 1) after the first n_keep, as
   * llama.cpp's main and server do (n_discard = (n_past - n_keep) / 2), exactly as
   * moe_session_shift(s, n_keep, n_discard) would, then runs the input that fits; the context fills
   * and shifts as often as the input needs. Where the shifts fall depends only on the tokens, not on
   * how they are fed or stepped. The tokens after the dropped ones keep the keys and values computed
   * when they saw the dropped ones (llama.cpp's approximation), at their new positions. */
  uint32_t ctx_shift;              /* 1: shift; 0 (default): refuse input past n_ctx */
  int32_t n_keep;                  /* tokens at the start never dropped (a system prompt, a persona;
                                      llama.cpp's --keep counts BOS among them); default 0. Negative,
                                      or with ctx_shift at least the session's n_ctx, fails the open
                                      with MOE_ERR_INVALID_ARGUMENT */
} moe_session_params;

MOE_API void moe_session_params_fill_defaults(moe_session_params *p);
static inline void moe_session_params_init(moe_session_params *p) {
  p->struct_size = (uint32_t)sizeof(moe_session_params);
  moe_session_params_fill_defaults(p);
}

/* Opens a session (one conversation with its own KV cache) on ctx; p may be NULL for defaults.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT; MOE_ERR_NO_MEMORY; MOE_ERR_LIMIT.
 * Thread-safety: safe against other session calls on the same context. Since: 0.1. */
MOE_API moe_status moe_session_open(moe_ctx *ctx, const moe_session_params *p, moe_session **out);

/* Closes a session; NULL is a no-op. Its queued input is dropped and its KV blocks go back to the
 * context's budget, but for those a fork still shares (an evicted session's spill file is removed).
 * Thread-safety: may run while another thread steps the context (it waits for that step to end);
 * no other call on this session may run concurrently or follow. Since: 0.1. */
MOE_API void moe_session_close(moe_session *s);

/* Queues n tokens as input of the session; they are processed by the next steps (moe_ctx_step,
 * moe_ctx_step_for), which may take a long input in several chunks.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL with n > 0, token id outside the vocabulary:
 *   nothing is queued); MOE_ERR_LIMIT_CONTEXT (the tokens would not fit in n_ctx: nothing queued;
 *   never with moe_session_params.ctx_shift, where the steps shift the context to make room).
 * Thread-safety: one thread per session at a time; safe while another thread runs moe_ctx_step or
 *   moe_ctx_step_for on the context. Since: 0.1. */
MOE_API moe_status moe_session_feed(moe_session *s, const int32_t *tokens, size_t n);

/* Runs one batch over all sessions with pending input (continuous batching): up to
 * max_batch_tokens tokens, shared round-robin so that every session with input gets a chunk (a
 * decode token is never held back by another session's long prefill while the cap allows one token
 * per session; beyond that, the sessions left out go first next time). Routing and experts run over
 * all tokens of the batch together, attention per session; each token's logits are bit-identical
 * to running its session alone. An input of at most prefill_token_max tokens runs token by token
 * (a few passes within the step). A session whose input is all processed has logits to sample.
 * KV: in turn, each session with input gets the blocks for all its queued input from the
 * context's KV budget (an evicted session's KV comes back first). When the budget is short, idle
 * sessions, then the sessions after it in the turn, are evicted to kv_spill_dir if one is given;
 * a session that still does not fit sits this step out and goes first in the next one (with a
 * spill directory every session advances in turn). n_pending (nullable) receives the number of sessions still with queued input
 * afterwards.
 * A session with ctx_shift that holds n_ctx tokens shifts first (see moe_session_params.ctx_shift)
 * and then takes only the input that fits, the rest in later steps.
 * @return MOE_OK; MOE_ERR_IO_* or MOE_ERR_BACKEND if weights could not be read or computed;
 *   MOE_ERR_LIMIT_KV when a session's queued input needs more than the whole KV budget, or when no
 *   session with input fits beside the KV the others hold (no spill directory: close or evict
 *   some); the message's numbers are those of moe_ctx_kv_usage after the failure. After any
 *   failure every session keeps its queued input and its state before the step, but for a context
 *   shift the step made (the same one the next step would make, so the numbers do not change).
 * Thread-safety: safe; steps on one context are serialised internally, and session calls on other
 *   threads may run meanwhile (see each). Since: 0.1. */
MOE_API moe_status moe_ctx_step(moe_ctx *ctx, uint32_t *n_pending);

/* A step for game loops: runs batches (as moe_ctx_step) while there is input and the next batch is
 * expected to end within budget_us microseconds of the call, then returns with the progress made.
 * Each batch is sized from the measured time per token, so the call ends close to the budget; the
 * first batch always runs (at least one token), so a budget smaller than one token still progresses.
 * Sessions whose input is finished are ready (moe_session_ready) and can be sampled at once.
 * n_pending (nullable): sessions still with queued input; n_steps (nullable): batches run.
 * @return as moe_ctx_step; MOE_ERR_INVALID_ARGUMENT (NULL ctx). After a failure, the batches that
 *   completed before it stay done; the failed one leaves its sessions as they were.
 * Thread-safety: as moe_ctx_step. Since: 0.1. */
MOE_API moe_status moe_ctx_step_for(moe_ctx *ctx, uint64_t budget_us, uint32_t *n_pending, uint32_t *n_steps);

/* Asks the step running on ctx (moe_ctx_step or moe_ctx_step_for on another thread) to stop: it
 * stops at its next layer boundary and returns MOE_ERR_ABORTED (a decode step the CUDA backend
 * replays as one recorded graph has no boundary inside: it completes, and the request stops the
 * next step). An aborted step is undone as any failed step is: every session it
 * ran keeps its queued input, its KV position and its logits as before the step, so the next step
 * gives the logits it would have given had the aborted one never run; moe_ctx_step_for keeps the
 * batches that completed before the abort. One request stops one step call: when no step is
 * running, the next one to start returns MOE_ERR_ABORTED before computing anything (so an abort
 * that races with the step's end is never lost), and the request is then spent.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL).
 * Thread-safety: safe from any thread, also while another thread steps the context (that is its
 *   purpose); not concurrently with moe_ctx_close. Since: 0.7. */
MOE_API moe_status moe_ctx_abort(moe_ctx *ctx);

/* Polling: 1 when every token fed to the session has been processed and its logits can be sampled,
 * 0 while input is queued or before any input; -1 for NULL.
 * Thread-safety: safe, also while another thread steps the context. Since: 0.1. */
MOE_API int32_t moe_session_ready(const moe_session *s);

/* Tokens queued in the session and not yet processed; -1 for NULL.
 * Thread-safety: safe, also while another thread steps the context. Since: 0.1. */
MOE_API int32_t moe_session_n_pending(const moe_session *s);

/* The logits after the last processed token: *logits points to n_vocab floats owned by the session,
 * valid until a step processes more of this session's input (so until the host feeds it again and
 * a step runs) or moe_session_close.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT; MOE_ERR_STATE if no token has been processed.
 * Thread-safety: one thread per session; safe while another thread steps the context. Since: 0.1. */
MOE_API moe_status moe_session_logits(const moe_session *s, const float **logits, int32_t *n_vocab);

/* With logits_all set: the logits of every token of the session's last input, row-major
 * [*n_tokens][*n_vocab] — all of the tokens fed since the session was last ready, also when the steps
 * took them in several chunks (while input is still queued: the rows so far); same lifetime as
 * moe_session_logits.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT; MOE_ERR_STATE (no step yet, or logits_all not set).
 * Thread-safety: as moe_session_logits. Since: 0.1. */
MOE_API moe_status moe_session_logits_all(const moe_session *s, const float **logits,
                                          int32_t *n_tokens, int32_t *n_vocab);

/* Samples the next token from the last logits with the session's sampler: the repetition, presence
 * and frequency penalties over the window first; then greedy when temperature is 0, else top-k, softmax
 * with temperature, top-p, min-p and one draw from the session's seeded generator (the same seed
 * and inputs give the same tokens on every run and platform). Does not feed it.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT; MOE_ERR_STATE if no logits yet.
 * Thread-safety: one thread per session; safe while another thread steps the context. Since: 0.1. */
MOE_API moe_status moe_session_sample(moe_session *s, int32_t *token);

/* Number of tokens in the session's KV cache (its position). -1 for NULL.
 * Thread-safety: safe, also while another thread steps the context. Since: 0.1. */
MOE_API int32_t moe_session_n_past(const moe_session *s);

/* ---------------------------------------------------------------------------------------------
 * KV cache residency and session snapshots
 * ------------------------------------------------------------------------------------------- */

/* Bytes of KV blocks the session holds in RAM (0 while evicted, or for NULL); blocks it shares with
 * a fork (moe_session_fork) count in each of them.
 * Thread-safety: one thread per session; not concurrently with moe_ctx_step. Since: 0.1. */
MOE_API uint64_t moe_session_kv_bytes(const moe_session *s);

/* KV bytes all sessions of the context hold in RAM (*used; a block forks share counts once) and the
 * budget they share (*budget);
 * either may be NULL. @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (ctx NULL). Thread-safety: safe.
 * Since: 0.1. */
MOE_API moe_status moe_ctx_kv_usage(const moe_ctx *ctx, uint64_t *used, uint64_t *budget);

/* Evicts the session's KV cache to an unlinked file in moe_params.kv_spill_dir, freeing its RAM
 * and budget. The next step that runs the session reads it back transparently (moe_session_save
 * reads it from the file as it is); the numbers are bit-identical to never having evicted. Evicting an evicted
 * session does nothing.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL); MOE_ERR_STATE (the context has no spill
 *   directory); MOE_ERR_IO_OPEN / MOE_ERR_IO_WRITE (the file could not be written: the session is
 *   unchanged and keeps its KV in RAM).
 * Thread-safety: one thread per session; serialised with moe_ctx_step internally. Since: 0.1. */
MOE_API moe_status moe_session_evict(moe_session *s);

/* Saves the session to `path`: its KV rows, position, token history, pending input, logits, the
 * sampler's generator state and its params (sampling, penalties, stop conditions, masks), with a
 * header naming the model (architecture, hyper-parameters, a hash of the tensor table), a format
 * version and a CRC-32C over every byte. The file is written to a temporary file in the same
 * directory, fsynced, renamed over `path` and the directory fsynced: a crash or kill at any moment
 * leaves either the previous file at `path` or the new one, never a torn one (a temporary
 * `path.tmp-XXXXXX` may remain after a crash). The text in progress of moe_session_sample_text
 * (held-back bytes) is not saved: a loaded session starts a new text.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL or empty path); MOE_ERR_IO_OPEN, MOE_ERR_IO_WRITE,
 *   MOE_ERR_IO_READ (an evicted session's spill file): `path` is untouched and the session unchanged.
 * Thread-safety: one thread per session; serialised with moe_ctx_step internally. Since: 0.1. */
MOE_API moe_status moe_session_save(moe_session *s, const char *path);

/* Opens a new session on ctx from a snapshot written by moe_session_save for the same model.
 * p NULL: the saved params; else p's params instead (e.g. other sampling settings; its n_ctx, or
 * the context's default when 0, must hold the saved tokens) — the generator state, history,
 * pending input, logits and KV rows always come from the snapshot, so continuing gives the tokens
 * and logits of the uninterrupted session bit for bit.
 * @return MOE_OK and *out set; on failure *out is untouched and no session is opened:
 *   MOE_ERR_INVALID_ARGUMENT (NULL, bad params); MOE_ERR_IO_OPEN / MOE_ERR_IO_READ;
 *   MOE_ERR_FORMAT_HEADER (not a snapshot, bad header), MOE_ERR_FORMAT_TRUNCATED (cut short),
 *   MOE_ERR_FORMAT_CHECKSUM (corrupt), MOE_ERR_FORMAT_FOREIGN (written for another model, the
 *   message names what differs: architecture, hyper-parameters, tensor table, or the weights
 *   themselves, a sampled digest that tells a fine-tune or another quantization of the same shape
 *   apart), MOE_ERR_FORMAT_METADATA (inconsistent contents), MOE_ERR_UNSUPPORTED (a newer format
 *   version, or version 1, which predates the weights digest: save such a session again),
 *   MOE_ERR_LIMIT_CONTEXT (n_ctx too small for the saved tokens, or without ctx_shift for them and
 *   the queued input), MOE_ERR_LIMIT_KV (the context's KV budget cannot hold
 *   it), MOE_ERR_NO_MEMORY.
 * Thread-safety: safe against other session calls on the same context. Since: 0.1. */
MOE_API moe_status moe_session_load(moe_ctx *ctx, const char *path, const moe_session_params *p,
                                    moe_session **out);

/* moe_session_save into memory: the same bytes moe_session_save writes to a file (format, header
 * naming the model, CRC-32C), for a host's own save system. With buf NULL or cap smaller than the
 * snapshot, nothing is written, *n_written receives the bytes needed and the call returns
 * MOE_ERR_LIMIT (a size query); else the snapshot is written to buf[0, *n_written).
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (s or n_written NULL); MOE_ERR_LIMIT (as above);
 *   MOE_ERR_IO_READ (an evicted session's spill file). The session is unchanged either way.
 * Thread-safety: one thread per session; serialised with moe_ctx_step internally. Since: 0.7. */
MOE_API moe_status moe_session_save_buffer(moe_session *s, void *buf, size_t cap, size_t *n_written);

/* moe_session_load from n bytes in memory written by moe_session_save_buffer or moe_session_save,
 * with the same checks, params rule and errors (MOE_ERR_FORMAT_HEADER, _TRUNCATED, _CHECKSUM,
 * _FOREIGN for another model, MOE_ERR_UNSUPPORTED for another format version, ...). The bytes are
 * only read during the call. On failure *out is untouched and no session is opened.
 * @return as moe_session_load, without the MOE_ERR_IO_* codes; MOE_ERR_INVALID_ARGUMENT (ctx, out
 *   or buf NULL). Thread-safety: as moe_session_load. Since: 0.7. */
MOE_API moe_status moe_session_load_buffer(moe_ctx *ctx, const void *buf, size_t n, const moe_session_params *p,
                                           moe_session **out);

/* Opens a copy of the session on its context: the same params, processed tokens, queued input,
 * logits and sampler state, so it samples and continues exactly as the original would. The copy
 * shares the original's KV blocks (128 positions each) copy-on-write: a shared block is copied only
 * when one of the two writes into it, so a fork costs next to no KV memory until it diverges (NPCs
 * that share a persona prompt). Writes to one never change the other; either may be closed first.
 * moe_ctx_kv_usage counts a shared block once; moe_session_kv_bytes counts it in each session. The
 * text in progress of moe_session_sample_text is not copied: the fork starts a new text. An evicted
 * session's KV is read back first.
 * @return MOE_OK and *out set; MOE_ERR_INVALID_ARGUMENT (NULL); MOE_ERR_NO_MEMORY; MOE_ERR_LIMIT_KV /
 *   MOE_ERR_IO_READ (an evicted original that cannot come back). On failure *out is untouched.
 * Thread-safety: one thread per session; serialised with moe_ctx_step internally. Since: 0.7. */
MOE_API moe_status moe_session_fork(moe_session *s, moe_session **out);

/* Forgets the last n_tokens processed tokens (dialogue trees, retries): the position goes back by
 * n_tokens, the token history loses them and the KV blocks no position uses any more are freed, so
 * feeding the same tokens again gives bit-identical logits. The logits go with them: until a step
 * processes new input, moe_session_logits answers MOE_ERR_STATE (n_tokens 0 changes nothing). The
 * sampler's generator state is kept; the text in progress of moe_session_sample_text starts anew.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL, n_tokens negative or more than moe_session_n_past:
 *   nothing changes); MOE_ERR_STATE (input is queued: step or rewind after it is processed).
 * Thread-safety: one thread per session; serialised with moe_ctx_step internally. Since: 0.7. */
MOE_API moe_status moe_session_rewind(moe_session *s, int32_t n_tokens);

/* Drops n_discard processed tokens after the first n_keep, as llama.cpp's llama_memory_seq_rm over
 * [n_keep, n_keep + n_discard) then llama_memory_seq_add of -n_discard over the rest: the tokens
 * after them move down by n_discard positions, their cached keys rotated by -n_discard positions
 * with the model's RoPE (its theta, pairing, YaRN frequencies; for multi-head latent attention the
 * shared RoPE key alone; values and latents as they are; f16 and q8_0 rows decoded, rotated and
 * encoded again), so each is the key a fresh pass would give it at its new position up to rounding.
 * The position goes back by n_discard and the token history loses those tokens (moe_session_save
 * writes the shifted session). The tokens kept after the dropped ones keep what they computed
 * while they saw them. Queued input stays queued and goes after the new position; the logits stay
 * those of the last step. Any session may call it, with or without ctx_shift (which calls it by
 * itself when the context is full). An evicted session's KV is read back first. n_discard 0
 * changes nothing.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL, n_keep or n_discard negative, n_keep + n_discard
 *   more than moe_session_n_past: nothing changes); MOE_ERR_LIMIT_KV (KV blocks shared with a fork
 *   must be copied first and the budget cannot hold them), MOE_ERR_IO_READ (an evicted session that
 *   cannot come back): the session is unchanged; MOE_ERR_BACKEND (the device failed while rows
 *   moved: close the session).
 * Thread-safety: one thread per session; serialised with moe_ctx_step internally. Since: 0.9. */
MOE_API moe_status moe_session_shift(moe_session *s, int32_t n_keep, int32_t n_discard);

/* Why moe_session_sample_text ended the text. */
#define MOE_STOP_NONE 0   /* not ended: feed the token and continue */
#define MOE_STOP_TOKEN 1  /* a stop token (EOS by default, or one of stop_tokens) was sampled */
#define MOE_STOP_STRING 2 /* the text reached one of stop_strings; the string itself is not returned */

/* Samples the next token like moe_session_sample (penalties included) and turns it into text with
 * the session's stop conditions. *text receives the bytes that became final with this token:
 * complete UTF-8 characters, holding back any tail that might begin a stop string (so a stop
 * string split across tokens never shows); it points to memory owned by the session, valid until
 * the next call on the session, and is not NUL-terminated. *stop (nullable) receives MOE_STOP_*: on a
 * stop, *text is the rest of the text before the stop (a stop token's own text is not included),
 * and the next call starts a new text. Does not feed the token: on MOE_STOP_NONE the host feeds it.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL); MOE_ERR_STATE (no logits yet); MOE_ERR_UNSUPPORTED
 *   (the model carries no tokenizer). On failure nothing is sampled.
 * Thread-safety: one thread per session. Since: 0.1. */
MOE_API moe_status moe_session_sample_text(moe_session *s, int32_t *token, const char **text, size_t *n_bytes,
                                           int32_t *stop);

/* Ends the text in progress without a stop (e.g. when the host's token limit is reached): *text
 * receives the held-back bytes (an unfinished UTF-8 character as U+FFFD), with the lifetime above.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT. Thread-safety: one thread per session. Since: 0.1. */
MOE_API moe_status moe_session_text_end(moe_session *s, const char **text, size_t *n_bytes);

/* ---------------------------------------------------------------------------------------------
 * Text: the model's own tokenizer (GGUF tokenizer.ggml.* metadata, or tokenizer.json in a
 * checkpoint directory). Models without one answer MOE_ERR_UNSUPPORTED.
 * ------------------------------------------------------------------------------------------- */
#define MOE_TOKENIZE_PARSE_SPECIAL 1u /* special tokens written in the text become those tokens: never
                                         use it on text a user wrote (see moe_chat_tokenize) */
#define MOE_TOKENIZE_ADD_BOS 2u       /* prepend BOS when the model's metadata asks for it */

/* Tokenizes text_len bytes of `text` (any bytes; need not be NUL-terminated) into at most
 * `capacity` ids. *n_tokens receives the number of ids the text needs, also on MOE_ERR_LIMIT.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT; MOE_ERR_UNSUPPORTED (no tokenizer); MOE_ERR_LIMIT
 *   (capacity too small: nothing written). Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_tokenize(const moe_ctx *ctx, const char *text, size_t text_len, uint32_t flags,
                                int32_t *tokens, size_t capacity, size_t *n_tokens);

/* The raw bytes of one token (not NUL-terminated; may be part of a UTF-8 character). *n_bytes
 * receives the length needed, also on MOE_ERR_LIMIT.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (bad id); MOE_ERR_UNSUPPORTED; MOE_ERR_LIMIT.
 * Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_token_to_piece(const moe_ctx *ctx, int32_t token, char *buf, size_t capacity,
                                      size_t *n_bytes);

/* The text of n tokens (as the model's decoder renders it), like moe_token_to_piece for a sequence.
 * Since: 0.1. */
MOE_API moe_status moe_detokenize(const moe_ctx *ctx, const int32_t *tokens, size_t n, char *buf,
                                  size_t capacity, size_t *n_bytes);

/* Begin- and end-of-sequence token ids, or -1 when the model has none (or no tokenizer). Since: 0.1. */
MOE_API int32_t moe_ctx_token_bos(const moe_ctx *ctx);
MOE_API int32_t moe_ctx_token_eos(const moe_ctx *ctx);

/* ---------------------------------------------------------------------------------------------
 * Chat templates: a conversation rendered as the prompt text the model was trained on,
 * byte-identical to transformers' apply_chat_template. The model's own template (GGUF
 * tokenizer.chat_template; chat_template in tokenizer_config.json or chat_template.jinja) runs on
 * Strata's Jinja engine (name "jinja"); ten families also have built-in renderers, selectable by
 * name: "chatml", "qwen2", "qwen2.5", "qwen3", "mistral-v1" (Mixtral-8x7B-Instruct-v0.1),
 * "mistral-v3" (Mistral-7B-Instruct-v0.3), "llama3", "deepseek-v2", "deepseek-v3", "gpt-oss"; a
 * model's template recognised as one of them uses that renderer where it renders the same text. A
 * model without a template falls back to its architecture's usual one. A template the engine
 * cannot parse is reported (MOE_ERR_UNSUPPORTED, naming its line), never guessed: pass a name
 * instead. The engine passes messages (role, content), add_generation_prompt, bos_token and
 * eos_token; tools and documents are None.
 * Feed a conversation with moe_chat_tokenize: message contents never become special tokens.
 * ------------------------------------------------------------------------------------------- */
typedef struct moe_chat_message {
  const char *role;    /* "system", "user", "assistant" (gpt-oss: also "developer"); NUL-terminated */
  const char *content; /* NUL-terminated UTF-8 */
} moe_chat_message;

/* The name of the template the model's metadata selects (static storage): "jinja" for the model's
 * own source on the Jinja engine, else a built-in family's name.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL); MOE_ERR_UNSUPPORTED (the model's template cannot
 *   be parsed, or it has none and its architecture settles none; the message says which).
 * Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_ctx_chat_template_name(const moe_ctx *ctx, const char **name);

/* Renders n messages with the template `template_name` (NULL: the model's, as above; "jinja": the
 * model's own source on the engine even where a built-in renderer would be used), writing the
 * text, not NUL-terminated, to buf when it fits; *n_bytes receives the length needed, also on
 * MOE_ERR_LIMIT. With add_generation_prompt != 0 the text ends where the assistant's reply begins.
 * The text contains the template's special tokens (BOS included where the template writes it).
 * To feed a conversation, use moe_chat_tokenize, not moe_tokenize on this text: with
 * MOE_TOKENIZE_PARSE_SPECIAL a message that spells a special token ("<|im_end|>") would become that
 * control token, letting a user forge turns; without it the template's own markers would not.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL, no messages, a role or order the template refuses:
 *   Mistral's need user/assistant alternating after an optional system message; a Jinja template's
 *   raise_exception message or runtime fault, with its line); MOE_ERR_UNSUPPORTED (unknown template
 *   name, model template that cannot be parsed, no tokenizer); MOE_ERR_LIMIT (capacity too small:
 *   nothing written; or a Jinja template passed the engine's bounds on steps, depth or output).
 *   Thread-safety: safe. Since: 0.1. */
MOE_API moe_status moe_chat_render(const moe_ctx *ctx, const char *template_name, const moe_chat_message *msgs,
                                   size_t n, int32_t add_generation_prompt, char *buf, size_t capacity,
                                   size_t *n_bytes);

/* Renders n messages like moe_chat_render and tokenizes the text safely: the special tokens the
 * template writes itself (role markers, BOS/EOS) become their control ids, while the messages'
 * roles and contents are never parsed for special tokens ("<|im_end|>" in a message is ordinary
 * text). Between control tokens the text is tokenized whole, so for contents that spell no special
 * token the ids equal moe_tokenize(render, MOE_TOKENIZE_PARSE_SPECIAL). No BOS is added beyond
 * what the template writes. This is the recommended way to turn a conversation into tokens:
 * moe_session_feed the ids as they are. At most `capacity` ids are written to `tokens`;
 * *n_tokens receives the number needed, also on MOE_ERR_LIMIT.
 * @return MOE_OK; MOE_ERR_INVALID_ARGUMENT (NULL, no messages, a role or order the template
 *   refuses); MOE_ERR_UNSUPPORTED (unknown template name, model template that cannot be parsed, no
 *   tokenizer); MOE_ERR_LIMIT (capacity too small: nothing written; or the engine's bounds, as
 *   moe_chat_render). On failure `tokens` is untouched.
 * Thread-safety: safe. Since: 0.6. */
MOE_API moe_status moe_chat_tokenize(const moe_ctx *ctx, const char *template_name, const moe_chat_message *msgs,
                                     size_t n, int32_t add_generation_prompt, int32_t *tokens, size_t capacity,
                                     size_t *n_tokens);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRATA_MOE_H_ */
