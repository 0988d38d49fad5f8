#!/usr/bin/env python3
"""Decode and prefill on the GPU: Strata's CUDA backend at several VRAM budgets against llama.cpp
built for CUDA, in the same run, on the same GGUF.

For each VRAM budget:
  1. `strata bench --backend cuda --vram-budget B --json`: prefill of --prefill tokens, then
     --decode teacher-forced one-token steps; the VRAM tier holds what the budget leaves for
     experts, the rest is read from page-locked RAM (see backends/cuda/cuda_backend.h).
  2. llama.cpp (the `llama_cpp` package built for CUDA from the llama-cpp-python source
     distribution), every layer offloaded, with the routed experts of the first N layers kept in
     host RAM and computed by the CPU (llama.cpp's --n-cpu-moe N: the buffer-type override
     `blk.<i>.ffn_(up|down|gate)_exps` -> CPU for i < N). N is chosen so llama.cpp keeps about the
     same number of experts in VRAM as Strata's tier holds at that budget.
  3. The roofline of a decode token: the expert bytes missing from VRAM (those that crossed the
     link, and those the CPU computed in host RAM under --cpu-experts auto) over the measured
     pinned host-to-device bandwidth, plus the bytes read in VRAM (weights a token touches) over
     the measured device copy bandwidth. With CPU experts a run can pass 100% of it: the CPU is a
     second path to the cold experts besides the link; the "+CPU" roofline gives the cold bytes
     both paths at once, the link and the host's cores reading RAM at their measured rates (the
     bound for llama.cpp's --n-cpu-moe too); with --host-share-bench, at most what the host's RAM
     gives the two together (bench/host_share_bench: they share it).
  4. Decode speed twice for both engines: the average over the run, and the steady rate of the
     median step (a long generation's rate; a short run's average carries its first steps).
     --warmup N: both engines first run a round of other ids with N decode steps (a warm context,
     as in a later conversation): a context's one-time costs (Strata's graphs recorded and the
     CPU share timed, llama.cpp's own first steps) then stay out of the timed round.

--cpu-experts auto,off runs Strata once per mode at each budget (hybrid placement on and off).

Run on the GPU machine (torch measures the two bandwidths):
    python3 bench/gpu_bench.py --strata build/examples/strata --model /tmp/q30.gguf \
        --budgets 4G,8G,16G,0 --prefill 512 --decode 64 [--llama-lib DIR] [--json-out F]
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


def size_of(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def bandwidths():
    """Pinned host->device and device->device copy rates in bytes/s (torch, median of 10)."""
    import torch

    n = 1 << 30
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev2 = torch.empty(n, dtype=torch.uint8, device="cuda")

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        return sorted(ts)[len(ts) // 2]

    h2d = n / timed(lambda: dev.copy_(host, non_blocking=True))
    d2d = 2 * n / timed(lambda: dev2.copy_(dev))  # bytes read and written
    del host, dev, dev2
    torch.cuda.empty_cache()
    return h2d, d2d


def host_read_rate(threads, n=1 << 30):
    """Bytes/s the host's cores read from RAM together: `threads` numpy sums over slices of a buffer
    beyond the LLC (numpy releases the GIL in them), best of 5 passes."""
    import concurrent.futures
    import numpy as np

    buf = np.ones(n // 8, dtype=np.float64)
    parts = np.array_split(buf, max(1, threads))
    best = 0.0
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(parts)) as pool:
        for _ in range(5):
            t0 = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = max(best, n / (time.perf_counter() - t0))
    return best


def host_shared_rate(bench, threads):
    """Bytes/s the copy engines and `threads` cores read from page-locked RAM together, from
    bench/host_share_bench's table (its "both: sum" column): on the H200's host ~105-115 GB/s, where
    the two alone give ~55 and ~93. None without the binary."""
    if not bench:
        return None
    out = subprocess.run([bench, str(threads)], check=True, capture_output=True, text=True).stdout
    return parse_host_share(out, threads)


def parse_host_share(out, threads):
    """The "both: sum" of the row for `threads` in host_share_bench's output, in bytes/s (None if
    the row is missing)."""
    for line in out.splitlines():
        f = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(f) == 7 and f[0] == str(threads):
            return float(f[5]) * 1e9
    return None


def model_bytes(strata, model):
    """(bytes a decode token reads outside the routed experts, bytes of one routed expert, layers,
    experts per layer, experts per token) from `strata inspect`."""
    out = subprocess.run([strata, "inspect", model], check=True, capture_output=True, text=True).stdout
    m = re.search(r"experts (\d+) \((\d+) used per token\)", out)
    n_expert, k = int(m.group(1)), int(m.group(2))
    n_layer = int(re.search(r"layers (\d+)", out).group(1))
    other = 0
    expert = 0
    embd_row = 0
    for line in out.splitlines():
        f = line.split()
        if len(f) < 3 or not f[-1].isdigit() or "." not in f[0]:
            continue
        name, b = f[0], int(f[-1])
        if "_exps." in name:
            expert += b // n_expert
        elif name.startswith("token_embd"):
            rows = int(line.split("x")[-1].split()[0]) if "x" in line else 1
            embd_row = b // max(rows, 1)  # a token reads one row
        else:
            other += b
    expert //= n_layer  # the sum over layers of gate + up + down per expert -> one expert
    return other + embd_row, expert, n_layer, n_expert, k


# The ids both engines are fed: prompt i, decode step i (within every shape's vocabulary).
def prompt_id(i, base=1000):
    return (base + 37 * i) % 100000


def decode_id(i, base=2000):
    return (base + 53 * i) % 100000


# A prompt longer than this goes to Strata as --prompt-tokens (its own seeded ids): a single
# command-line argument is capped at 128 KiB.
LONG_PROMPT = 16384


def run_strata(strata, model, budget, prefill, decode, ram_budget, cpu_experts, threads, warmup=0):
    forced = ",".join(str(decode_id(i)) for i in range(decode))
    n_ctx = prefill + max(decode, warmup) + 16
    prompt = (["--prompt-tokens", str(prefill)] if prefill > LONG_PROMPT else
              ["--tokens", ",".join(str(prompt_id(i)) for i in range(prefill))])
    cmd = [strata, "bench", "--model", model, "--backend", "cuda", "--ram-budget", ram_budget, "--vram-budget",
           str(budget)] + prompt + ["--decode-tokens", forced, "--n-ctx", str(n_ctx), "--json",
           "--cpu-experts", cpu_experts, "--threads", str(threads), "--q8-activations", "--warmup", str(warmup)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_llama(lib_dir, model, n_cpu_moe, prefill, decode, threads, warmup=0):
    t0 = time.time()
    L, mdl = load_llama(model, lib_dir, n_gpu_layers=999, n_cpu_moe=n_cpu_moe)
    cp = L.llama_context_default_params()
    cp.n_ctx = prefill + max(decode, warmup) + 16
    cp.n_batch = max(prefill, 1)
    cp.n_ubatch = min(512, max(prefill, 1))
    cp.n_threads = threads
    cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(mdl, cp)
    load_s = time.time() - t0
    one = (L.llama_token * 1)()
    if warmup > 0:
        # As strata bench --warmup: a round of other ids first, then the KV cache emptied.
        warm = (L.llama_token * prefill)(*[prompt_id(i, 1001) for i in range(prefill)])
        if L.llama_decode(ctx, L.llama_batch_get_one(warm, prefill)) != 0:
            raise RuntimeError("llama_decode failed on the warm-up prompt")
        for i in range(warmup):
            one[0] = decode_id(i, 2001)
            if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
                raise RuntimeError("llama_decode failed at warm-up step %d" % i)
        L.llama_synchronize(ctx)
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
    toks = (L.llama_token * prefill)(*[prompt_id(i) for i in range(prefill)])
    t1 = time.time()
    if L.llama_decode(ctx, L.llama_batch_get_one(toks, prefill)) != 0:
        raise RuntimeError("llama_decode failed on the prompt")
    L.llama_synchronize(ctx)
    t2 = time.time()
    step_ms = []
    for i in range(decode):
        one[0] = decode_id(i)
        ts = time.perf_counter()
        if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
            raise RuntimeError("llama_decode failed at step %d" % i)
        L.llama_synchronize(ctx)
        step_ms.append(1e3 * (time.perf_counter() - ts))
    t3 = time.time()
    L.llama_free(ctx)
    L.llama_model_free(mdl)
    p50 = statistics.median(step_ms) if step_ms else 0.0
    return {"load_s": load_s, "prefill_tok_s": prefill / (t2 - t1), "decode_tok_s": decode / (t3 - t2),
            "decode_step_ms_p50": p50, "decode_steady_tok_s": 1e3 / p50 if p50 > 0 else 0.0,
            "decode_step_ms": [round(x, 3) for x in step_ms], "n_cpu_moe": n_cpu_moe, "warmup_steps": warmup}


def run_llama_apart(lib_dir, model, n_cpu_moe, prefill, decode, threads, warmup=0):
    """run_llama in a process of its own (llama_peer.run_child; measured on the H200: llama.cpp 0.3.36
    loaded after torch's bandwidth probe crashed the whole run)."""
    return run_child(__file__, [lib_dir, model, n_cpu_moe, prefill, decode, threads, warmup])


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--llama-child":
        print(json.dumps(run_llama(*json.loads(sys.argv[2]))), flush=True)
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--budgets", default="4G,8G,16G,0", help="VRAM budgets; 0 = unlimited")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=0,
                    help="both engines first run a round of other ids with this many decode steps, then the "
                         "timed one (a warm context: its first steps' one-time costs fall in the warm-up)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each Strata mode, alternating their order; the median run is reported")
    ap.add_argument("--ram-budget", default="60G")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--llama-lib", default="", help="directory of libllama.so (default: the package's)")
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--cpu-experts", default="auto", help="Strata's modes to run, comma-separated: auto, off, always")
    ap.add_argument("--host-share-bench", default="",
                    help="build/bench/host_share_bench: the +CPU roofline then takes the copy engines' and the "
                         "cores' reads of host RAM together at their measured shared rate")
    ap.add_argument("--json-out", default="")
    a = ap.parse_args()

    h2d, d2d = bandwidths()
    host = host_read_rate(a.threads)
    shared = host_shared_rate(a.host_share_bench, a.threads)
    # Both paths read the host's RAM: together they get what its memory gives, not the sum.
    both = min(h2d + host, shared) if shared else h2d + host
    other, expert, n_layer, n_expert, k = model_bytes(a.strata, a.model)
    res = {"model": a.model, "warmup_steps": a.warmup, "rounds": a.rounds, "h2d_bytes_s": h2d, "d2d_bytes_s": d2d, "host_read_bytes_s": host,
           "host_shared_bytes_s": shared, "expert_bytes": expert, "token_bytes": other + n_layer * k * expert,
           "runs": []}
    shared_text = f", both at once {shared / 1e9:.1f}" if shared else ""
    print(f"link {h2d / 1e9:.1f} GB/s, device copy {d2d / 1e12:.2f} TB/s, host read {host / 1e9:.1f} GB/s "
          f"({a.threads} threads{shared_text}); a decode token reads "
          f"{res['token_bytes'] / 2**20:.0f} MiB ({n_layer} layers x {k} experts of {expert / 2**20:.2f} MiB)",
          flush=True)
    for b in a.budgets.split(","):
        budget = size_of(b)
        run = {"budget": b, "modes": {}}
        modes = a.cpu_experts.split(",")
        # --rounds N: the modes alternate N times (a machine's first runs can be slower, and one mode
        # must not always take them); each mode reports its median run, with every run's rate.
        runs = {mode: [] for mode in modes}
        for r in range(a.rounds):
            for mode in (modes if r % 2 == 0 else list(reversed(modes))):
                runs[mode].append(run_strata(a.strata, a.model, budget, a.prefill, a.decode, a.ram_budget, mode,
                                             a.threads, a.warmup))
        for mode in modes:
            ordered = sorted(runs[mode], key=lambda x: x["decode_tok_s"])
            s = ordered[(len(ordered) - 1) // 2]
            s["rounds_decode_tok_s"] = [x["decode_tok_s"] for x in runs[mode]]
            st = s["stats"]
            link = s["decode_link_bytes_per_token"]
            cpu_bytes = st.get("vram_cpu_experts", 0) * expert / max(1, a.decode)
            zero_copy_bytes = st["vram_zero_copy"] * expert / max(1, a.decode)
            missed = link + cpu_bytes
            resident_s = max(0.0, res["token_bytes"] - zero_copy_bytes - cpu_bytes) / d2d
            roof_s = missed / h2d + resident_s
            # With the CPU computing cold experts beside the link, both paths at their full rates
            # at once (the host's read rate measured above, capped by the two's shared rate where
            # measured): a bound no split can pass.
            roof_cpu_s = missed / both + resident_s
            run["modes"][mode] = {"strata": s, "link_bytes_per_token": link, "cpu_bytes_per_token": cpu_bytes,
                                  "roofline_tok_s": 1.0 / roof_s, "roofline_with_cpu_tok_s": 1.0 / roof_cpu_s}
            run["vram_expert_slots"] = st["vram_expert_slots"] or n_layer * n_expert
        if not a.skip_llama:
            n_cpu = n_layer - min(n_layer, run["vram_expert_slots"] // n_expert)
            try:
                run["llama"] = run_llama_apart(a.llama_lib, a.model, n_cpu, a.prefill, a.decode, a.threads,
                                               a.warmup)
            except Exception as e:  # report and go on: the Strata figures stand on their own
                run["llama_error"] = str(e)
        res["runs"].append(run)
        print(json.dumps(run), flush=True)

    print()
    print(f"{'VRAM':>6} {'experts in VRAM':>16} {'CPU experts':>11} {'prefill tok/s':>14} {'decode tok/s':>13} "
          f"{'link MiB/tok':>13} {'CPU MiB/tok':>12} {'roofline':>9} {'of roof':>8} {'+CPU roof':>10} "
          f"{'of it':>6} {'llama.cpp':>10} "
          f"{'n-cpu-moe':>9} {'llama pre':>10} {'vs llama':>9} {'steady':>8} {'llama steady':>13} {'vs llama':>9}")
    for r in res["runs"]:
        l = r.get("llama")
        for mode, m in r["modes"].items():
            s = m["strata"]
            vs = f"{s['decode_tok_s'] / l['decode_tok_s']:.2f}x" if l else "-"
            # Steady: the median step (a long generation's rate), first steps left out of the average.
            steady = s.get("decode_steady_tok_s", float("nan"))
            l_steady = l.get("decode_steady_tok_s", float("nan")) if l else float("nan")
            vs_steady = f"{steady / l_steady:.2f}x" if l and l_steady > 0 else "-"
            print(f"{r['budget']:>6} {r['vram_expert_slots']:>16} {mode:>11} {s['prefill_tok_s']:>14.1f} "
                  f"{s['decode_tok_s']:>13.2f} {m['link_bytes_per_token'] / 2**20:>13.1f} "
                  f"{m['cpu_bytes_per_token'] / 2**20:>12.1f} {m['roofline_tok_s']:>9.1f} "
                  f"{100 * s['decode_tok_s'] / m['roofline_tok_s']:>7.0f}% "
                  f"{m['roofline_with_cpu_tok_s']:>10.1f} {100 * s['decode_tok_s'] / m['roofline_with_cpu_tok_s']:>5.0f}% "
                  f"{(l['decode_tok_s'] if l else float('nan')):>10.2f} {(l['n_cpu_moe'] if l else -1):>9} "
                  f"{(l['prefill_tok_s'] if l else float('nan')):>10.1f} {vs:>9} {steady:>8.1f} {l_steady:>13.1f} "
                  f"{vs_steady:>9}")
    if a.rounds > 1:
        for r in res["runs"]:
            for mode, m in r["modes"].items():
                rates = " / ".join(f"{x:.1f}" for x in m["strata"]["rounds_decode_tok_s"])
                print(f"{r['budget']} {mode}: decode tok/s of the {a.rounds} rounds {rates} (the median reported)")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
