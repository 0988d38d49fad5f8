#!/usr/bin/env python3
"""Strata on the CPU beside llama.cpp, every expert resident: a prompt and the decode after it, same
GGUF, same ids, same threads and KV cache type, for each model given.

Engines in one run: Strata in each of --modes (`default`: what `strata run` does; `q8`:
--q8-activations) and llama.cpp once per --llama LABEL=DIR (a directory holding a libllama.so build,
say one for AVX2 and one for AVX-512). Rounds alternate the engines' order; the table gives the
median of the rounds, the load average, decode against the memory roofline (the host's read
bandwidth, measured by quant_bench's MemRead with the same threads, over the bytes a decode token
reads: every non-routed weight but the embedding table, and experts_used experts a layer), and each
rate as a ratio to the fastest llama.cpp build.

    python3 bench/cpu_bench.py --strata build/examples/strata --quant-bench build/bench/quant_bench \\
        --models olmoe-q4_k.gguf,olmoe-q8_0.gguf --prompt 512 --decode 32 --rounds 3 --threads 2 \\
        --llama avx2=LLAMA_AVX2/bin --llama avx512=LLAMA_AVX512/bin --json-out out.json
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import context_bench  # noqa: E402
from llama_peer import run_child  # noqa: E402


def mem_read_gbs(quant_bench, threads):
    """The host's read bandwidth with `threads` threads (quant_bench's best of its probes), GB/s."""
    p = subprocess.run([quant_bench, "--benchmark_filter=^MemRead/%d/" % threads, "--benchmark_format=json"],
                       capture_output=True, text=True, check=True)
    rows = json.loads(p.stdout)["benchmarks"]
    return max(r["best_GBps"] for r in rows)


def decode_bytes(strata, model):
    """Bytes one decode token reads with every expert resident: the non-routed weights but the
    embedding table (a row of it), and experts_used routed experts in every MoE layer."""
    plan = json.loads(subprocess.run([strata, "plan", "--model", model, "--json"], capture_output=True, text=True,
                                     check=True).stdout.strip().splitlines()[-1])
    info = subprocess.run([strata, "inspect", model], capture_output=True, text=True, check=True).stdout
    used = int(re.search(r"experts \d+ \((\d+) used per token\)", info).group(1))
    embd = re.search(r"^token_embd\.weight\s+\S+\s+.*?(\d+)\s*$", info, re.M)
    embd_bytes = int(embd.group(1)) if embd else 0
    per_expert = plan["routed_expert_bytes"] / max(1, plan["routed_experts"])
    return plan["non_routed_bytes"] - embd_bytes + plan["n_layers"] * used * per_expert


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--quant-bench", default="", help="quant_bench, for the memory roofline (none: no roofline)")
    ap.add_argument("--models", required=True, help="GGUF files, comma-separated")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--modes", default="default,q8", help="Strata's activation modes: default, q8")
    ap.add_argument("--cache-type", choices=sorted(context_bench.GGML_TYPES), default="f16")
    ap.add_argument("--llama", action="append", default=[], help="LABEL=DIR of a libllama.so build; repeatable")
    ap.add_argument("--json-out", default="")
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    if any(m not in ("default", "q8") for m in modes):
        ap.error("--modes takes default and q8")
    llamas = []
    for spec in a.llama:
        label, _, lib = spec.partition("=")
        if not label or not lib:
            ap.error("--llama takes LABEL=DIR")
        llamas.append((label, lib))
    bw = mem_read_gbs(a.quant_bench, a.threads) if a.quant_bench else 0.0
    if bw:
        print("memory read: %.1f GB/s with %d threads" % (bw, a.threads))
    print("| model | engine | prefill tok/s | decode tok/s | decode of roofline | prefill vs llama.cpp | decode vs "
          "llama.cpp | load avg |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for model in a.models.split(","):
        base = dict(strata=a.strata, model=model, backend="cpu", decode=a.decode, threads=a.threads,
                    ram_budget="1000G", cache_type=a.cache_type, llama_lib="",
                    vocab=context_bench.vocab_size(a.strata, model))
        engines = []
        for m in modes:
            ns = argparse.Namespace(**base, q8_activations=(m == "q8"))
            engines.append(("strata " + m, lambda ns=ns: context_bench.run_strata(ns, a.prompt)))
        for label, lib in llamas:
            payload = dict(base, llama_lib=lib, q8_activations=False)
            engines.append(("llama.cpp " + label,
                            lambda p=payload: run_child(context_bench.__file__, [p, a.prompt])))
        runs = {name: [] for name, _ in engines}
        for r in range(a.rounds):
            order = engines if r % 2 == 0 else list(reversed(engines))
            for name, fn in order:
                res = fn()
                res["load_avg"] = context_bench.load_avg()
                runs[name].append(res)
        bytes_tok = decode_bytes(a.strata, model)
        med = {name: {k: statistics.median(x[k] for x in rs) for k in ("prefill_tok_s", "decode_tok_s")}
               for name, rs in runs.items()}
        peer = [med[n] for n in med if n.startswith("llama.cpp")]
        best_pre = max((p["prefill_tok_s"] for p in peer), default=0.0)
        best_dec = max((p["decode_tok_s"] for p in peer), default=0.0)
        for name, rs in runs.items():
            m = med[name]
            roof = bw * 1e9 / bytes_tok if bw else 0.0
            row = {"model": model, "engine": name, "prefill_tok_s": m["prefill_tok_s"],
                   "decode_tok_s": m["decode_tok_s"], "decode_bytes_per_token": bytes_tok,
                   "roofline_tok_s": roof, "load_avg": max(x["load_avg"] for x in rs), "rounds": rs}
            rows.append(row)
            cell = lambda x, d: ("%.2fx" % (x / d)) if d else "-"  # noqa: E731
            print("| %s | %s | %.1f | %.2f | %s | %s | %s | %.2f |" % (
                os.path.basename(model), name, m["prefill_tok_s"], m["decode_tok_s"],
                ("%.0f%%" % (100 * m["decode_tok_s"] / roof)) if roof else "-", cell(m["prefill_tok_s"], best_pre),
                cell(m["decode_tok_s"], best_dec), row["load_avg"]), flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"threads": a.threads, "prompt": a.prompt, "decode": a.decode, "cache_type": a.cache_type,
                       "memory_read_gbs": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
