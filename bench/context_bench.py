#!/usr/bin/env python3
"""Long prompts beside llama.cpp: prefill of N tokens and the decode after it, same GGUF, same ids.

Runs `strata bench --json` on the chosen backend (every expert resident) and llama.cpp through its
`llama_cpp` package (bench/llama_peer.py) with n_batch = N and n_ubatch 512, as its tools do, each
engine with the same KV cache type, rounds alternating the engines. Prints one table row per
(context, engine) with the median of the rounds and writes them as JSON.

    python3 bench/context_bench.py --strata build/examples/strata --model olmoe.gguf --backend cpu \\
        --contexts 4096 --decode 32 --threads 2 --llama-lib LLAMA_BUILD/bin --json-out out.json
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_peer import load_llama, run_child  # noqa: E402

# ggml's type ids for the KV cache (ggml.h: GGML_TYPE_F32 0, F16 1, Q8_0 8).
GGML_TYPES = {"f32": 0, "f16": 1, "q8_0": 8}


def prompt_id(i, vocab, base=1000):
    return (base + 37 * i) % vocab


def decode_id(i, vocab, base=2000):
    return (base + 53 * i) % vocab


def vocab_size(strata, model):
    out = subprocess.run([strata, "inspect", model], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"vocab (\d+)", out).group(1))


def load_avg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def run_strata(a, n):
    forced = ",".join(str(decode_id(i, a.vocab)) for i in range(a.decode))
    ids = ",".join(str(prompt_id(i, a.vocab)) for i in range(n))
    cmd = [a.strata, "bench", "--model", a.model, "--backend", a.backend, "--ram-budget", a.ram_budget,
           "--tokens", ids, "--decode-tokens", forced, "--n-ctx", str(n + a.decode + 16), "--threads",
           str(a.threads), "--cache-type-k", a.cache_type, "--cache-type-v", a.cache_type, "--json"]
    if a.q8_activations:
        cmd.append("--q8-activations")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("strata bench exited with status %d: %s" % (p.returncode, p.stderr.strip()[-400:]))
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"prefill_tok_s": r["prefill_tok_s"], "decode_tok_s": r["decode_tok_s"], "load_s": r["load_s"]}


def run_llama(a, n):
    L, mdl = load_llama(a.model, a.llama_lib, n_gpu_layers=999 if a.backend == "cuda" else 0)
    cp = L.llama_context_default_params()
    cp.n_ctx = n + a.decode + 16
    cp.n_batch = n
    cp.n_ubatch = min(512, n)
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    cp.type_k = GGML_TYPES[a.cache_type]
    cp.type_v = GGML_TYPES[a.cache_type]
    ctx = L.llama_init_from_model(mdl, cp)
    if not ctx:
        raise RuntimeError("llama.cpp could not make a context of %d tokens" % cp.n_ctx)
    toks = (L.llama_token * n)(*[prompt_id(i, a.vocab) for i in range(n)])
    t1 = time.time()
    if L.llama_decode(ctx, L.llama_batch_get_one(toks, n)) != 0:
        raise RuntimeError("llama_decode failed on the prompt")
    L.llama_synchronize(ctx)
    t2 = time.time()
    one = (L.llama_token * 1)()
    for i in range(a.decode):
        one[0] = decode_id(i, a.vocab)
        if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
            raise RuntimeError("llama_decode failed at step %d" % i)
    L.llama_synchronize(ctx)
    t3 = time.time()
    L.llama_free(ctx)
    L.llama_model_free(mdl)
    return {"prefill_tok_s": n / (t2 - t1), "decode_tok_s": a.decode / (t3 - t2)}


def run_llama_apart(a, n):
    return run_child(__file__, [vars(a), n])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--llama-child":
        args, n = json.loads(sys.argv[2])
        print(json.dumps(run_llama(argparse.Namespace(**args), n)))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--contexts", default="4096", help="prompt lengths, comma-separated")
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--ram-budget", default="60G")
    ap.add_argument("--cache-type", choices=sorted(GGML_TYPES), default="f16",
                    help="both engines' K and V cache type")
    ap.add_argument("--q8-activations", action="store_true", help="Strata's 8-bit activations")
    ap.add_argument("--llama-lib", default="", help="directory of libllama.so (default: the package's)")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--json-out", default="")
    a = ap.parse_args()
    a.vocab = vocab_size(a.strata, a.model)
    rows = []
    print("| context | engine | prefill tok/s | decode tok/s | load avg |")
    print("|---:|---|---:|---:|---:|")
    for n in (int(c) for c in a.contexts.split(",")):
        runs = {"strata": [], "llama.cpp": []}
        for r in range(a.rounds):
            engines = [("strata", run_strata)] + ([] if a.skip_llama else [("llama.cpp", run_llama_apart)])
            if r % 2 == 1:
                engines.reverse()  # alternate who goes first
            for name, fn in engines:
                res = fn(a, n)
                res["load_avg"] = load_avg()
                runs[name].append(res)
        for name, rs in runs.items():
            if not rs:
                continue
            row = {"context": n, "engine": name, "backend": a.backend, "cache_type": a.cache_type,
                   "prefill_tok_s": statistics.median(x["prefill_tok_s"] for x in rs),
                   "decode_tok_s": statistics.median(x["decode_tok_s"] for x in rs),
                   "load_avg": max(x["load_avg"] for x in rs), "rounds": rs}
            rows.append(row)
            print("| %d | %s | %.1f | %.2f | %.2f |" % (n, name, row["prefill_tok_s"], row["decode_tok_s"],
                                                        row["load_avg"]), flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"model": a.model, "threads": a.threads, "q8_activations": a.q8_activations, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
