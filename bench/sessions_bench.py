#!/usr/bin/env python3
"""Continuous batching and prefill modes, measured with `strata bench --json`.

sessions: aggregate decode tokens/s and expert bytes read per decoded token for N sessions decoding
  together (one batch per step, every session one token per step) at a fixed RAM budget.
prefill: prefill tokens/s of one session for each prefill mode forced through the scheduler flags
  (token by token; selected experts, batched; layer-major, batched with whole next layers read
  ahead), per prompt length, and the fastest mode per length: the cut-offs to use.

usage: bench/sessions_bench.py --strata build/examples/strata --model F.gguf [--ram-budget 2G]
       [--sessions 1,4,16,64] [-n 3 | --decode-tokens 11,22,33] [--prompt-tokens 4] [--prefill-lengths 1,2,4,8,16,32,64]
       [--only sessions|prefill] [--q8-activations] [--threads 2] [--json OUT]
"""
import argparse
import json
import subprocess
import sys

MODES = {  # name -> (prefill_token_max, prefill_layer_min)
    "token-by-token": (1 << 20, 1 << 20),
    "selected": (1, 1 << 20),
    "layer-major": (1, 1),
}


def bench(args, extra):
    cmd = [args.strata, "bench", "--json", "--model", args.model, "--ram-budget", args.ram_budget,
           "--threads", str(args.threads), "--n-ctx", str(args.n_ctx)] + extra
    if args.q8_activations:
        cmd.append("--q8-activations")
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


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
    ap.add_argument("--json")
    args = ap.parse_args()
    results = {"sessions": [], "prefill": []}

    if args.only != "prefill":
        print("| sessions | decode tokens | aggregate decode tok/s | vs 1 session | MiB read / token | hit rate |")
        print("|---|---|---|---|---|---|")
        base = None
        for n in [int(x) for x in args.sessions.split(",")]:
            extra = ["--decode-tokens", args.decode_tokens] if args.decode_tokens else ["-n", str(args.n)]
            r = bench(args, ["--sessions", str(n), "--prompt-tokens", str(args.prompt_tokens)] + extra)
            results["sessions"].append(r)
            base = base or r["decode_tok_s"]
            print(f"| {n} | {r['decode_tokens']} | {r['decode_tok_s']:.2f} | {r['decode_tok_s'] / base:.2f}x | "
                  f"{r['decode_bytes_read_per_token'] / 1048576:.1f} | {100 * r['decode_hit_rate']:.1f}% |", flush=True)

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
