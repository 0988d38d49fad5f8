"""The C ABI (include/strata/moe.h) through ctypes: the library, its structs mirrored field by field,
and each function's signature. ctypes releases the GIL during every call, so stepping does not hold
other Python threads. The structs carry struct_size; the library refuses a size no moe.h gave, so a
mirror that drifts from the header fails loudly instead of reading the wrong fields."""
import ctypes
import glob
import os

c_size_t = ctypes.c_size_t
c_int32_p = ctypes.POINTER(ctypes.c_int32)
LOAD_PROGRESS = ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p)
LOAD_CONTINUE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p)


class Params(ctypes.Structure):  # moe_params
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("model_path", ctypes.c_char_p),
        ("backend", ctypes.c_int32),
        ("vram_budget_bytes", ctypes.c_uint64),
        ("ram_budget_bytes", ctypes.c_uint64),
        ("n_threads", ctypes.c_int32),
        ("n_ctx", ctypes.c_uint32),
        ("max_sessions", ctypes.c_uint32),
        ("cache_policy", ctypes.c_int32),
        ("prefetch_distance", ctypes.c_int32),
        ("n_io_threads", ctypes.c_int32),
        ("hotlist_path", ctypes.c_char_p),
        ("hotlist_max_experts", ctypes.c_uint32),
        ("direct_io", ctypes.c_uint32),
        ("cpu_q8_activations", ctypes.c_uint32),
        ("max_batch_tokens", ctypes.c_uint32),
        ("prefill_token_max", ctypes.c_uint32),
        ("prefill_layer_min", ctypes.c_uint32),
        ("kv_budget_bytes", ctypes.c_uint64),
        ("kv_spill_dir", ctypes.c_char_p),
        ("cpu_experts", ctypes.c_int32),
        ("gpu_q8_activations", ctypes.c_uint32),
        ("load_progress", LOAD_PROGRESS),
        ("load_progress_user", ctypes.c_void_p),
        ("cuda_graphs", ctypes.c_int32),
        ("cuda_cold_copies", ctypes.c_int32),
        ("huge_pages", ctypes.c_int32),
        ("cuda_streaming", ctypes.c_int32),
        ("load_continue", LOAD_CONTINUE),  # since 0.7 (called with load_progress_user)
        ("type_k", ctypes.c_int32),  # since 0.8: moe_kv_type
        ("type_v", ctypes.c_int32),
    ]


class SessionParams(ctypes.Structure):  # moe_session_params
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("n_ctx", ctypes.c_uint32),
        ("seed", ctypes.c_uint64),
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("logits_all", ctypes.c_uint32),
        ("min_p", ctypes.c_float),
        ("repeat_penalty", ctypes.c_float),
        ("presence_penalty", ctypes.c_float),
        ("penalty_last_n", ctypes.c_int32),
        ("stop_at_eos", ctypes.c_uint32),
        ("stop_tokens", c_int32_p),
        ("n_stop_tokens", c_size_t),
        ("stop_strings", ctypes.POINTER(ctypes.c_char_p)),
        ("n_stop_strings", c_size_t),
        ("attn_window", ctypes.c_uint32),
        ("blocked_tokens", c_int32_p),
        ("n_blocked_tokens", c_size_t),
        ("frequency_penalty", ctypes.c_float),
        ("ctx_shift", ctypes.c_uint32),  # since 0.9: context shift, llama.cpp's --context-shift / --keep
        ("n_keep", ctypes.c_int32),
    ]


class Stats(ctypes.Structure):  # moe_stats
    _fields_ = [
        ("struct_size", ctypes.c_uint32),
        ("streaming", ctypes.c_uint32),
        ("expert_hits", ctypes.c_uint64),
        ("expert_misses", ctypes.c_uint64),
        ("prefetch_issued", ctypes.c_uint64),
        ("prefetch_useful", ctypes.c_uint64),
        ("evictions", ctypes.c_uint64),
        ("bytes_read", ctypes.c_uint64),
        ("io_wait_s", ctypes.c_double),
        ("cache_slots", ctypes.c_uint32),
        ("memory_locked", ctypes.c_uint32),
        ("cache_slot_bytes", ctypes.c_uint64),
        ("load_errors", ctypes.c_uint64),
        ("direct_reads", ctypes.c_uint64),
        ("prefetch_skipped", ctypes.c_uint64),
        ("prefetch_precision", ctypes.c_double),
        ("vram_expert_slots", ctypes.c_uint32),
        ("vram_device_layers", ctypes.c_uint32),
        ("vram_fills", ctypes.c_uint64),
        ("vram_fill_bytes", ctypes.c_uint64),
        ("vram_zero_copy", ctypes.c_uint64),
        ("vram_promotions", ctypes.c_uint64),
        ("gpu_graph_captures", ctypes.c_uint64),
        ("gpu_graph_replays", ctypes.c_uint64),
        ("numa_node", ctypes.c_int32),
        ("vram_cpu_layers", ctypes.c_uint32),
        ("vram_cpu_experts", ctypes.c_uint64),
        ("vram_replans", ctypes.c_uint64),
        ("vram_hits", ctypes.c_uint64),
        ("vram_demotions", ctypes.c_uint64),
        ("locked_bytes", ctypes.c_uint64),
    ]


def _find_library():
    """STRATA_LIBRARY when set (a build tree's libstrata.so), else the copy installed in this package."""
    path = os.environ.get("STRATA_LIBRARY")
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    found = sorted(glob.glob(os.path.join(here, "libstrata.so*")))
    if not found:
        raise ImportError("strata: libstrata.so is not in %s (install with `pip install .`, or set "
                          "STRATA_LIBRARY to a built libstrata.so)" % here)
    return found[0]


lib = ctypes.CDLL(_find_library())


def _sig(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)


_status = ctypes.c_int32
_ctx = ctypes.c_void_p
_sess = ctypes.c_void_p
_sig("moe_status_string", ctypes.c_char_p, _status)
_sig("moe_last_error", ctypes.c_char_p)
_sig("moe_version_string", ctypes.c_char_p)
_sig("moe_params_fill_defaults", None, ctypes.POINTER(Params))
_sig("moe_session_params_fill_defaults", None, ctypes.POINTER(SessionParams))
_sig("moe_ctx_open", _status, ctypes.POINTER(Params), ctypes.POINTER(_ctx))
_sig("moe_ctx_close", None, _ctx)
_sig("moe_ctx_vocab_size", ctypes.c_int32, _ctx)
_sig("moe_ctx_stats", _status, _ctx, ctypes.POINTER(Stats))
_sig("moe_ctx_step", _status, _ctx, ctypes.POINTER(ctypes.c_uint32))
_sig("moe_session_open", _status, _ctx, ctypes.POINTER(SessionParams), ctypes.POINTER(_sess))
_sig("moe_session_close", None, _sess)
_sig("moe_session_feed", _status, _sess, c_int32_p, c_size_t)
_sig("moe_session_logits", _status, _sess, ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
     ctypes.POINTER(ctypes.c_int32))
_sig("moe_session_sample", _status, _sess, c_int32_p)
_sig("moe_session_sample_text", _status, _sess, c_int32_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(c_size_t),
     c_int32_p)
_sig("moe_session_text_end", _status, _sess, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(c_size_t))
_sig("moe_session_n_past", ctypes.c_int32, _sess)
_sig("moe_session_save", _status, _sess, ctypes.c_char_p)
_sig("moe_session_load", _status, _ctx, ctypes.c_char_p, ctypes.POINTER(SessionParams), ctypes.POINTER(_sess))
_sig("moe_session_save_buffer", _status, _sess, ctypes.c_void_p, c_size_t, ctypes.POINTER(c_size_t))
_sig("moe_session_load_buffer", _status, _ctx, ctypes.c_void_p, c_size_t, ctypes.POINTER(SessionParams),
     ctypes.POINTER(_sess))
_sig("moe_session_fork", _status, _sess, ctypes.POINTER(_sess))
_sig("moe_session_rewind", _status, _sess, ctypes.c_int32)
_sig("moe_session_shift", _status, _sess, ctypes.c_int32, ctypes.c_int32)
_sig("moe_ctx_abort", _status, _ctx)
_sig("moe_tokenize", _status, _ctx, ctypes.c_char_p, c_size_t, ctypes.c_uint32, c_int32_p, c_size_t,
     ctypes.POINTER(c_size_t))
_sig("moe_detokenize", _status, _ctx, c_int32_p, c_size_t, ctypes.c_char_p, c_size_t, ctypes.POINTER(c_size_t))

OK = 0
ERR_LIMIT = 9
ERR_LIMIT_CONTEXT = 9 | (1 << 8)
STOP_NONE = 0
TOKENIZE_PARSE_SPECIAL = 1
TOKENIZE_ADD_BOS = 2
BACKENDS = {"auto": 0, "cpu": 1, "cuda": 2}
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}  # moe_kv_type: ggml_type's numbers, llama.cpp's names


def params():
    p = Params()
    p.struct_size = ctypes.sizeof(Params)
    lib.moe_params_fill_defaults(ctypes.byref(p))
    return p


def session_params():
    p = SessionParams()
    p.struct_size = ctypes.sizeof(SessionParams)
    lib.moe_session_params_fill_defaults(ctypes.byref(p))
    return p
