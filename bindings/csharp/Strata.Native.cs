// P/Invoke declarations of Strata's C ABI (include/strata/moe.h, version 0.9) for C# hosts (Unity,
// Godot .NET, any .NET runtime). Names, structs, delegates and constants mirror moe.h one for one;
// tests/capi/pinvoke_test.cc parses this file and moe.h and fails when they disagree, so update
// both together. Conventions:
//  - handles (moe_ctx *, moe_session *, moe_expert_table *) are IntPtr; a NULL result is IntPtr.Zero;
//  - strings passed in are marshalled as UTF-8; strings the library returns (moe_last_error,
//    moe_status_string, ...) are IntPtr: read them with Marshal.PtrToStringUTF8, never free them;
//  - params structs are filled with their *_init helpers below before use, as in C;
//  - a delegate given to moe_log_set must be kept alive (a static field) while it is set.
using System;
using System.Runtime.InteropServices;

namespace Strata
{
    public static class Native
    {
        public const string Lib = "strata";

        // ---- constants (#define MOE_* in moe.h) ----
        public const int MOE_VERSION_MAJOR = 0;
        public const int MOE_VERSION_MINOR = 9;
        public const int MOE_VERSION_PATCH = 0;
        public const int MOE_VERSION_NUMBER = (MOE_VERSION_MAJOR * 10000 + MOE_VERSION_MINOR * 100 + MOE_VERSION_PATCH);
        public const int MOE_OK = 0;
        public const int MOE_ERR_INVALID_ARGUMENT = 1;
        public const int MOE_ERR_IO = 2;
        public const int MOE_ERR_FORMAT = 3;
        public const int MOE_ERR_UNSUPPORTED = 4;
        public const int MOE_ERR_NO_MEMORY = 5;
        public const int MOE_ERR_STATE = 6;
        public const int MOE_ERR_BACKEND = 7;
        public const int MOE_ERR_INTERNAL = 8;
        public const int MOE_ERR_LIMIT = 9;
        public const int MOE_ERR_CANCELLED = 10;
        public const int MOE_ERR_IO_READ = (MOE_ERR_IO | (1 << 8));
        public const int MOE_ERR_IO_OPEN = (MOE_ERR_IO | (2 << 8));
        public const int MOE_ERR_IO_CHANGED = (MOE_ERR_IO | (3 << 8));
        public const int MOE_ERR_IO_WRITE = (MOE_ERR_IO | (4 << 8));
        public const int MOE_ERR_FORMAT_TRUNCATED = (MOE_ERR_FORMAT | (1 << 8));
        public const int MOE_ERR_FORMAT_HEADER = (MOE_ERR_FORMAT | (2 << 8));
        public const int MOE_ERR_FORMAT_METADATA = (MOE_ERR_FORMAT | (3 << 8));
        public const int MOE_ERR_FORMAT_TENSOR = (MOE_ERR_FORMAT | (4 << 8));
        public const int MOE_ERR_FORMAT_HPARAMS = (MOE_ERR_FORMAT | (5 << 8));
        public const int MOE_ERR_FORMAT_CONFIG = (MOE_ERR_FORMAT | (6 << 8));
        public const int MOE_ERR_FORMAT_CHECKSUM = (MOE_ERR_FORMAT | (7 << 8));
        public const int MOE_ERR_FORMAT_FOREIGN = (MOE_ERR_FORMAT | (8 << 8));
        public const int MOE_ERR_UNSUPPORTED_ARCH = (MOE_ERR_UNSUPPORTED | (1 << 8));
        public const int MOE_ERR_UNSUPPORTED_TYPE = (MOE_ERR_UNSUPPORTED | (2 << 8));
        public const int MOE_ERR_UNSUPPORTED_BACKEND = (MOE_ERR_UNSUPPORTED | (3 << 8));
        public const int MOE_ERR_LIMIT_CONTEXT = (MOE_ERR_LIMIT | (1 << 8));
        public const int MOE_ERR_LIMIT_KV = (MOE_ERR_LIMIT | (2 << 8));
        public const int MOE_ERR_ABORTED = (MOE_ERR_CANCELLED | (1 << 8));
        public const int MOE_LOG_ERROR = 0;
        public const int MOE_LOG_WARN = 1;
        public const int MOE_LOG_INFO = 2;
        public const int MOE_LOG_DEBUG = 3;
        public const int MOE_STOP_NONE = 0;
        public const int MOE_STOP_TOKEN = 1;
        public const int MOE_STOP_STRING = 2;
        public const int MOE_TOKENIZE_PARSE_SPECIAL = 1;
        public const int MOE_TOKENIZE_ADD_BOS = 2;

        public static int MOE_STATUS_CATEGORY(int st) { return st & 0xff; }

        // moe_backend_kind
        public const int MOE_BACKEND_AUTO = 0;
        public const int MOE_BACKEND_CPU = 1;
        public const int MOE_BACKEND_CUDA = 2;
        // moe_switch
        public const int MOE_SWITCH_DEFAULT = 0;
        public const int MOE_SWITCH_ON = 1;
        public const int MOE_SWITCH_OFF = 2;
        // moe_cpu_experts
        public const int MOE_CPU_EXPERTS_AUTO = 0;
        public const int MOE_CPU_EXPERTS_OFF = 1;
        public const int MOE_CPU_EXPERTS_ALWAYS = 2;
        // moe_kv_type
        public const int MOE_KV_F32 = 0;
        public const int MOE_KV_F16 = 1;
        public const int MOE_KV_Q8_0 = 8;
        // moe_cache_policy
        public const int MOE_CACHE_LRU = 0;
        public const int MOE_CACHE_LFU = 1;
        public const int MOE_CACHE_HOTNESS = 2;

        // ---- callbacks ----
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        public delegate void moe_log_fn(int level, IntPtr msg, IntPtr user);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        public delegate void moe_load_progress_fn(ulong done_bytes, ulong total_bytes, IntPtr user);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        public delegate int moe_load_continue_fn(ulong done_bytes, ulong total_bytes, IntPtr user);

        // ---- structs (fields only appended: struct_size says which a caller has) ----
        [StructLayout(LayoutKind.Sequential)]
        public struct moe_params
        {
            public uint struct_size;
            public IntPtr model_path;
            public int backend;
            public ulong vram_budget_bytes;
            public ulong ram_budget_bytes;
            public int n_threads;
            public uint n_ctx;
            public uint max_sessions;
            public int cache_policy;
            public int prefetch_distance;
            public int n_io_threads;
            public IntPtr hotlist_path;
            public uint hotlist_max_experts;
            public uint direct_io;
            public uint cpu_q8_activations;
            public uint max_batch_tokens;
            public uint prefill_token_max;
            public uint prefill_layer_min;
            public ulong kv_budget_bytes;
            public IntPtr kv_spill_dir;
            public int cpu_experts;
            public uint gpu_q8_activations;
            public IntPtr load_progress;
            public IntPtr load_progress_user;
            public int cuda_graphs;
            public int cuda_cold_copies;
            public int huge_pages;
            public int cuda_streaming;
            public IntPtr load_continue;
            public int type_k;
            public int type_v;
        }
        [StructLayout(LayoutKind.Sequential)]
        public struct moe_cache_plan
        {
            public uint struct_size;
            public ulong ram_budget_bytes;
            public ulong vram_budget_bytes;
            public ulong non_routed_bytes;
            public ulong routed_expert_bytes;
            public ulong kv_bytes;
            public ulong workspace_bytes;
            public ulong expert_slot_bytes;
            public uint n_layers;
            public uint n_routed_experts;
            public uint ram_expert_slots;
            public uint vram_expert_slots;
            public uint clamped;
            public uint n_ctx;
            public uint max_sessions;
            public ulong kv_bytes_per_token;
            public uint kv_block_tokens;
            public uint kv_max_blocks;
            public ulong ram_fixed_bytes;
            public ulong vram_fixed_bytes;
            public uint streamed_experts;
        }
        [StructLayout(LayoutKind.Sequential)]
        public struct moe_expert_info
        {
            public uint struct_size;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 3)] public uint[] file_index;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 3)] public ulong[] file_offset;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 3)] public ulong[] bytes;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 3)] public uint[] codec;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 3)] public uint[] rows;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 3)] public uint[] cols;
            public ulong total_bytes;
            public ulong slot_bytes;
            public uint single_read;
        }
        [StructLayout(LayoutKind.Sequential)]
        public struct moe_stats
        {
            public uint struct_size;
            public uint streaming;
            public ulong expert_hits;
            public ulong expert_misses;
            public ulong prefetch_issued;
            public ulong prefetch_useful;
            public ulong evictions;
            public ulong bytes_read;
            public double io_wait_s;
            public uint cache_slots;
            public uint memory_locked;
            public ulong cache_slot_bytes;
            public ulong load_errors;
            public ulong direct_reads;
            public ulong prefetch_skipped;
            public double prefetch_precision;
            public uint vram_expert_slots;
            public uint vram_device_layers;
            public ulong vram_fills;
            public ulong vram_fill_bytes;
            public ulong vram_zero_copy;
            public ulong vram_promotions;
            public ulong gpu_graph_captures;
            public ulong gpu_graph_replays;
            public int numa_node;
            public uint vram_cpu_layers;
            public ulong vram_cpu_experts;
            public ulong vram_replans;
            public ulong vram_hits;
            public ulong vram_demotions;
            public ulong locked_bytes;
        }
        [StructLayout(LayoutKind.Sequential)]
        public struct moe_session_params
        {
            public uint struct_size;
            public uint n_ctx;
            public ulong seed;
            public float temperature;
            public int top_k;
            public float top_p;
            public uint logits_all;
            public float min_p;
            public float repeat_penalty;
            public float presence_penalty;
            public int penalty_last_n;
            public uint stop_at_eos;
            public IntPtr stop_tokens;
            public UIntPtr n_stop_tokens;
            public IntPtr stop_strings;
            public UIntPtr n_stop_strings;
            public uint attn_window;
            public IntPtr blocked_tokens;
            public UIntPtr n_blocked_tokens;
            public float frequency_penalty;
            public uint ctx_shift;
            public int n_keep;
        }
        [StructLayout(LayoutKind.Sequential)]
        public struct moe_chat_message
        {
            [MarshalAs(UnmanagedType.LPUTF8Str)] public string role;
            [MarshalAs(UnmanagedType.LPUTF8Str)] public string content;
        }

        // ---- functions (every MOE_API of moe.h) ----
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_version_number();
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr moe_version_string();
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr moe_status_string(int st);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr moe_last_error();
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern void moe_log_set(moe_log_fn fn, IntPtr user);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_backend_available(int kind);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern void moe_params_fill_defaults(ref moe_params p);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_plan(ref moe_params p, ref moe_cache_plan @out);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_open(ref moe_params p, out IntPtr @out);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern void moe_ctx_close(IntPtr ctx);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_vocab_size(IntPtr ctx);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_plan(IntPtr ctx, ref moe_cache_plan @out);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern IntPtr moe_ctx_experts(IntPtr ctx);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern uint moe_expert_table_n_layers(IntPtr t);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern uint moe_expert_table_n_experts(IntPtr t);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_expert_table_get(IntPtr t, uint layer, uint expert, ref moe_expert_info @out);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_stats(IntPtr ctx, ref moe_stats @out);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_layer_stats(IntPtr ctx, uint layer, out ulong hits, out ulong misses);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_expert_counts(IntPtr ctx, ulong[] counts, UIntPtr capacity, out UIntPtr n);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_wait_loads(IntPtr ctx);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern void moe_ctx_reset_stats(IntPtr ctx);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern void moe_session_params_fill_defaults(ref moe_session_params p);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_open(IntPtr ctx, ref moe_session_params p, out IntPtr @out);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern void moe_session_close(IntPtr s);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_feed(IntPtr s, int[] tokens, UIntPtr n);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_step(IntPtr ctx, out uint n_pending);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_step_for(IntPtr ctx, ulong budget_us, out uint n_pending, out uint n_steps);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_abort(IntPtr ctx);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_ready(IntPtr s);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_n_pending(IntPtr s);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_logits(IntPtr s, out IntPtr logits, out int n_vocab);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_logits_all(IntPtr s, out IntPtr logits, out int n_tokens, out int n_vocab);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_sample(IntPtr s, out int token);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_n_past(IntPtr s);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern ulong moe_session_kv_bytes(IntPtr s);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_kv_usage(IntPtr ctx, out ulong used, out ulong budget);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_evict(IntPtr s);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_save(IntPtr s, [MarshalAs(UnmanagedType.LPUTF8Str)] string path);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_load(IntPtr ctx, [MarshalAs(UnmanagedType.LPUTF8Str)] string path, ref moe_session_params p, out IntPtr @out);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_save_buffer(IntPtr s, byte[] buf, UIntPtr cap, out UIntPtr n_written);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_load_buffer(IntPtr ctx, byte[] buf, UIntPtr n, ref moe_session_params p, out IntPtr @out);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_fork(IntPtr s, out IntPtr @out);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_rewind(IntPtr s, int n_tokens);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_shift(IntPtr s, int n_keep, int n_discard);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_sample_text(IntPtr s, out int token, out IntPtr text, out UIntPtr n_bytes, out int stop);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_session_text_end(IntPtr s, out IntPtr text, out UIntPtr n_bytes);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_tokenize(IntPtr ctx, [MarshalAs(UnmanagedType.LPUTF8Str)] string text, UIntPtr text_len, uint flags, int[] tokens, UIntPtr capacity, out UIntPtr n_tokens);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_token_to_piece(IntPtr ctx, int token, byte[] buf, UIntPtr capacity, out UIntPtr n_bytes);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_detokenize(IntPtr ctx, int[] tokens, UIntPtr n, byte[] buf, UIntPtr capacity, out UIntPtr n_bytes);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_token_bos(IntPtr ctx);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_token_eos(IntPtr ctx);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_ctx_chat_template_name(IntPtr ctx, out IntPtr name);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_chat_render(IntPtr ctx, [MarshalAs(UnmanagedType.LPUTF8Str)] string template_name, moe_chat_message[] msgs, UIntPtr n, int add_generation_prompt, byte[] buf, UIntPtr capacity, out UIntPtr n_bytes);
        [DllImport(Lib, CallingConvention = CallingConvention.Cdecl)]
        public static extern int moe_chat_tokenize(IntPtr ctx, [MarshalAs(UnmanagedType.LPUTF8Str)] string template_name, moe_chat_message[] msgs, UIntPtr n, int add_generation_prompt, int[] tokens, UIntPtr capacity, out UIntPtr n_tokens);

        // ---- the static inline *_init helpers of moe.h ----
        public static void moe_params_init(ref moe_params p)
        {
            p = new moe_params();
            p.struct_size = (uint)Marshal.SizeOf<moe_params>();
            moe_params_fill_defaults(ref p);
        }

        public static void moe_session_params_init(ref moe_session_params p)
        {
            p = new moe_session_params();
            p.struct_size = (uint)Marshal.SizeOf<moe_session_params>();
            moe_session_params_fill_defaults(ref p);
        }

        public static void moe_cache_plan_init(ref moe_cache_plan p)
        {
            p = new moe_cache_plan();
            p.struct_size = (uint)Marshal.SizeOf<moe_cache_plan>();
        }

        public static void moe_stats_init(ref moe_stats p)
        {
            p = new moe_stats();
            p.struct_size = (uint)Marshal.SizeOf<moe_stats>();
        }

        public static void moe_expert_info_init(ref moe_expert_info p)
        {
            p = new moe_expert_info();
            p.struct_size = (uint)Marshal.SizeOf<moe_expert_info>();
        }

        // moe_last_error() as a string.
        public static string LastError() { return Marshal.PtrToStringUTF8(moe_last_error()) ?? ""; }
    }
}
