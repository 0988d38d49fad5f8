#!/usr/bin/env python3
"""Continuous batching and prefill modes, measured with `strata bench --json`.

sessions: aggregate decode tokens/s and expert bytes read per decoded token for N sessions decoding
  together (one batch per step, every session one token per step) at a fixed RAM budget. With
  --llama, llama.cpp (the `llama_cpp` package) decodes the same token ids as N parallel sequences
  of one context, one batch of N tokens a step, in the same run: the peer for the same job.
prefill: prefill tokens/s of one session for each prefill mode forced through the scheduler flags
  (token by token; selected experts, batched; layer-major, batched with whole next layers read
  ahead), per prompt length, and the fastest mode per length: the cut-offs to use.

usage: bench/sessions_bench.py --strata build/examples/strata --model F.gguf [--ram-budget 2G]
       [--sessions 1,4,16,64] [-n 3 | --decode-tokens 11,22,33] [--prompt-tokens 4 | --tokens 11,22,33,44]
       [--prefill-lengths 1,2,4,8,16,32,64] [--only sessions|prefill] [--q8-activations] [--threads 2]
       [--backend cpu|cuda] [--vram-budget SIZE] [--llama [--llama-lib DIR] [--n-gpu-layers N]] [--json OUT]
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_peer import load_llama  # noqa: E402

MODES = {  # name -> (prefill_token_max, prefill_layer_min)
    "token-by-token": (1 << 20, 1 << 20),
    "selected": (1, 1 << 20),
    "layer-major": (1, 1),
}


def bench(args, extra):
    cmd = [args.strata, "bench", "--json", "--model", args.model, "--ram-budget", args.ram_budget,
           "--threads", str(args.threads), "--n-ctx", str(args.n_ctx), "--backend", args.backend] + extra
    if args.vram_budget:
        cmd += ["--vram-budget", args.vram_budget]
    if args.q8_activations:
        cmd.append("--q8-activations")
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def rotated(ids, i, n_vocab):
    """Session i's copy of the ids, as `strata bench --sessions` forms it."""
    return [(t + 7919 * i) % n_vocab for t in ids]


def run_llama_sessions(args, n, prompt, forced):
    """llama.cpp decoding n sequences together: every sequence's prompt in one batch, then one batch
    of n tokens (one a sequence, logits for each) per step. Returns aggregate decode tok/s."""
    n_gpu = args.n_gpu_layers if args.n_gpu_layers >= 0 else (999 if args.backend == "cuda" else 0)
    L, mdl = load_llama(args.model, args.llama_lib, n_gpu_layers=n_gpu)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(mdl))
    per_seq = len(prompt) + len(forced) + 8
    cp = L.llama_context_default_params()
    cp.n_seq_max = n
    cp.n_ctx = n * per_seq
    cp.n_batch = max(n * len(prompt), n)
    cp.n_ubatch = min(512, cp.n_batch)
    cp.n_threads = args.threads
    cp.n_threads_batch = args.threads
    ctx = L.llama_init_from_model(mdl, cp)
    if not ctx:
        raise RuntimeError("llama.cpp could not make a context of %d sequences" % n)
    batch = L.llama_batch_init(cp.n_batch, 0, 1)

    def decode(items):  # items: (token, position, sequence)
        batch.n_tokens = len(items)
        for k, (tok, pos, seq) in enumerate(items):
            batch.token[k] = tok
            batch.pos[k] = pos
            batch.n_seq_id[k] = 1
            batch.seq_id[k][0] = seq
            batch.logits[k] = 1
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        L.llama_synchronize(ctx)

    decode([(t, p, i) for i in range(n) for p, t in enumerate(rotated(prompt, i, n_vocab))])
    t0 = time.time()
    for step, f in enumerate(forced):
        decode([((f + 7919 * i) % n_vocab, len(prompt) + step, i) for i in range(n)])
    secs = time.time() - t0
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(mdl)
    return n * len(forced) / secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--ram-budget", default="2G")
    ap.add_argument("--sessions", default="1,4,16,64")
    ap.add_argument("-n", type=int, default=3, help="decode steps per configuration")
    ap.add_argument("--prompt-tokens", type=int, default=4)
    ap.add_argument("--prefill-lengths", default="1,2,4,8,16,32,64")
    ap.add_argument("--only", choices=["sessions", "prefill"])
    ap.add_argument("--q8-activations", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=128)
    ap.add_argument("--decode-tokens", help="ids fed one per decode step (rotated per session) instead of sampling")
    ap.add_argument("--tokens", help="prompt ids (rotated per session) instead of --prompt-tokens random ones")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--vram-budget", default="")
    ap.add_argument("--llama", action="store_true", help="llama.cpp's parallel sequences in the same run "
                    "(needs --tokens and --decode-tokens)")
    ap.add_argument("--llama-lib", default="", help="directory of libllama.so (default: the package's)")
    ap.add_argument("--n-gpu-layers", type=int, default=-1, help="llama.cpp's offload (default: all with "
                    "--backend cuda, none otherwise)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.llama and not (args.tokens and args.decode_tokens):
        ap.error("--llama needs --tokens and --decode-tokens: both engines decode the same ids")
    results = {"sessions": [], "prefill": []}

    if args.only != "prefill":
        peer = " llama.cpp tok/s | llama.cpp vs 1 | Strata vs llama.cpp |" if args.llama else ""
        print("| sessions | decode tokens | aggregate decode tok/s | vs 1 session | MiB read / token | hit rate |" + peer)
        print("|---|---|---|---|---|---|" + ("---|---|---|" if args.llama else ""))
        base = llama_base = None
        ids = lambda s: [int(x) for x in s.split(",")]
        for n in [int(x) for x in args.sessions.split(",")]:
            extra = ["--decode-tokens", args.decode_tokens] if args.decode_tokens else ["-n", str(args.n)]
            extra += ["--tokens", args.tokens] if args.tokens else ["--prompt-tokens", str(args.prompt_tokens)]
            r = bench(args, ["--sessions", str(n)] + extra)
            base = base or r["decode_tok_s"]
            line = (f"| {n} | {r['decode_tokens']} | {r['decode_tok_s']:.2f} | {r['decode_tok_s'] / base:.2f}x | "
                    f"{r['decode_bytes_read_per_token'] / 1048576:.1f} | {100 * r['decode_hit_rate']:.1f}% |")
            if args.llama:
                r["llama_decode_tok_s"] = run_llama_sessions(args, n, ids(args.tokens), ids(args.decode_tokens))
                llama_base = llama_base or r["llama_decode_tok_s"]
                line += (f" {r['llama_decode_tok_s']:.2f} | {r['llama_decode_tok_s'] / llama_base:.2f}x | "
                         f"{r['decode_tok_s'] / r['llama_decode_tok_s']:.2f}x |")
            results["sessions"].append(r)
            print(line, flush=True)

    if args.only != "sessions":
        print()
        print("| prompt tokens | " + " | ".join(f"{m} tok/s" for m in MODES) + " | fastest |")
        print("|---|" + "---|" * (len(MODES) + 1))
        for length in [int(x) for x in args.prefill_lengths.split(",")]:
            row = {}
            for name, (tmax, lmin) in MODES.items():
                r = bench(args, ["-n", "0", "--prompt-tokens", str(length), "--prefill-token-max", str(tmax),
                                 "--prefill-layer-min", str(lmin)])
                r["mode"] = name
                results["prefill"].append(r)
                row[name] = r["prefill_tok_s"]
            best = max(row, key=row.get)
            print(f"| {length} | " + " | ".join(f"{row[m]:.2f}" for m in MODES) + f" | {best} |", flush=True)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
