#!/usr/bin/env python3
"""Decode speed of a model bigger than the RAM left to it: Strata's expert cache against llama.cpp
reading the same GGUF through mmap, under the same free memory, next to the disk roofline.

Steps, all in one run:
  1. the routed-expert bytes of the model (from `strata plan`);
  2. the file's read bandwidth with O_DIRECT (the disk, not the page cache): the best of 1, 2 and 4
     parallel sequential streams;
  3. a helper process locks RAM so that only --free-gib stays available (page cache held down);
  4. Strata: `strata bench` at a RAM budget of --budget-frac of the routed expert bytes;
  5. llama.cpp (the `llama_cpp` package, built from the llama-cpp-python source distribution):
     the same prompt tokens and decode length, same threads, its weights read through the mmap
     (its CPU repacking, which copies the weights into anonymous memory, off unless --llama-repack);
  6. a table: tokens/s of each, the ratio, and the roofline = read bandwidth / expert bytes Strata
     missed per token (experts that were not resident when the token needed them: demand misses plus
     the prefetched loads that were used; wasted prefetches do not lower the roofline).
Decode input, --decode: `generated` feeds each engine its own greedy/sampled tokens (a random-weight
model tends to repeat a few tokens, so consecutive steps select the same experts); `random` feeds both
engines the same uniformly drawn token ids one per step (no repetition: the cold-cache case); `both`
(default) runs each.
Page caches are dropped before each engine when the kernel allows it. The run stops if the locked
memory's process dies (the OOM killer takes the largest process when an engine outgrows the free RAM).

usage: bench/streaming_bench.py --strata build/examples/strata --model F.gguf [--free-gib 3]
       [--budget-frac 0.25] [--prompt-tokens 8] [-n 32] [--threads 2] [--decode both|generated|random]
       [--json OUT]
"""
import argparse
import ctypes
import json
import mmap
import multiprocessing
import os
import random
import re
import subprocess
import sys
import time


def drop_caches():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable")


def hog(nbytes, ready):
    """Locks nbytes of anonymous memory until killed."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    if libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes)) != 0:
        print("hog: mlock failed:", os.strerror(ctypes.get_errno()), file=sys.stderr)
    ready.set()
    while True:
        time.sleep(3600)


def read_stream(path, start, nbytes, out, i):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, 4 << 20)
    done = 0
    while done < nbytes:
        got = os.preadv(fd, [buf], start + done)
        if got <= 0:
            break
        done += got
    os.close(fd)
    out[i] = done


def read_bandwidth(path, nbytes=1 << 30):
    """The file's O_DIRECT read rate in GB/s from its middle: the best of 1, 2 and 4 streams over
    neighbouring parts (a disk serving reads in parallel can be faster than one stream shows, and an
    engine with several I/O threads can use that)."""
    import threading
    size = os.path.getsize(path)
    start = (size // 2 - nbytes // 2) & ~((4 << 20) - 1)
    nbytes = min(nbytes, size - start) & ~((16 << 20) - 1)
    best = 0.0
    for n in (1, 2, 4):
        drop_caches()
        part = nbytes // n
        out = [0] * n
        threads = [threading.Thread(target=read_stream, args=(path, start + i * part, part, out, i)) for i in range(n)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        best = max(best, sum(out) / (time.perf_counter() - t0) / 1e9)
    return best


def hog_alive(p, after):
    """The locked memory must outlive every engine's run: the kernel's OOM killer picks the largest
    process, the hog, when an engine allocates beyond what is free, and the runs after it would
    then see all of RAM."""
    if not p.is_alive():
        sys.exit(f"the memory hog died during {after} (killed for memory: see dmesg); that engine needed "
                 "more than the free RAM, and later runs would no longer be held down")


def routed_expert_bytes(strata, model):
    out = subprocess.run([strata, "plan", "--model", model], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"\nrouted experts \(all\) +(\d+) ", out).group(1))


def ids(tokens):
    return ",".join(str(t) for t in tokens)


def run_strata(strata, model, budget, prompt, forced, n, threads, extra):
    cmd = [strata, "bench", "--model", model, "--ram-budget", str(budget), "--tokens", ids(prompt),
           "-n", str(n), "--threads", str(threads), "--json"] + extra
    if forced:
        cmd += ["--decode-tokens", ids(forced)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    st = r["stats"]
    # Bytes a perfect prefetcher would still have had to read: needed experts that were not resident.
    r["decode_missed_bytes_per_token"] = ((st["expert_misses"] + st["prefetch_useful"]) * st["cache_slot_bytes"]
                                          / max(1, r["decode_tokens"]))
    return r


def last_argmax(llm, lc):
    """The greedy token after llama.cpp's last evaluation, read from the context's own logits.

    Llama.eval fills Llama.scores only with logits_all; without it the last position's logits are
    still in the context (llama_get_logits_ith(ctx, -1)).
    """
    import numpy as np
    ptr = lc.llama_get_logits_ith(llm._ctx.ctx, -1)
    if not ptr:
        raise RuntimeError("llama.cpp kept no logits for the last position")
    return int(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).argmax())


def run_llama(model, prompt, forced, n, threads, seed=42, repack=False):
    import llama_cpp.llama_cpp as lc  # built from the llama-cpp-python sdist
    from llama_cpp import Llama
    # llama.cpp's CPU backend by default copies every weight it can into a repacked layout in
    # anonymous memory at load ("extra buffer types"): a second copy of the model that never reads
    # through the mmap and needs more RAM than the run leaves. Off: weights stay in the mmap. The
    # binding reads its defaults from this function, so it is wrapped once and asked each time.
    if not hasattr(lc, "strata_default_params"):
        lc.strata_default_params = lc.llama_model_default_params
        lc.strata_repack = True

        def default_params():
            p = lc.strata_default_params()
            p.use_extra_bufts = lc.strata_repack
            return p

        lc.llama_model_default_params = default_params
    lc.strata_repack = repack
    t0 = time.perf_counter()
    llm = Llama(model_path=model, n_ctx=len(prompt) + n + 16, n_threads=threads, n_threads_batch=threads,
                use_mmap=True, use_mlock=False, n_gpu_layers=0, verbose=False, seed=seed)
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    llm.eval(prompt)
    t2 = time.perf_counter()
    for i in range(n):
        tok = forced[i] if forced else last_argmax(llm, lc)
        llm.eval([tok])
    t3 = time.perf_counter()
    with open("/proc/self/status") as f:
        rss = {k: int(v.split()[0]) * 1024 for k, v in (l.split(":", 1) for l in f) if k in ("RssAnon", "RssFile")}
    return {"load_s": load_s, "prefill_tok_s": len(prompt) / (t2 - t1), "decode_tok_s": n / (t3 - t2),
            "repack": repack, "rss_anon_bytes": rss.get("RssAnon"), "rss_file_bytes": rss.get("RssFile")}


def vocab_size(strata, model):
    out = subprocess.run([strata, "inspect", model], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"vocab (\d+)", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--free-gib", type=float, default=3.0)
    ap.add_argument("--budget-frac", type=float, default=0.25)
    ap.add_argument("--prompt-tokens", type=int, default=8)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--llama-repack", action="store_true",
                    help="let llama.cpp copy weights into its repacked CPU layout (a second copy in RAM)")
    ap.add_argument("--decode", choices=("both", "generated", "random"), default="both")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--strata-args", default="", help="extra options for strata bench, e.g. '--prefetch 2'")
    ap.add_argument("--json")
    a = ap.parse_args()

    routed = routed_expert_bytes(a.strata, a.model)
    budget_experts = int(routed * a.budget_frac)
    plan = subprocess.run([a.strata, "plan", "--model", a.model, "--ram-budget", "1", "--n-ctx", "256"],
                          capture_output=True, text=True).stdout
    fixed = int(re.search(r"\nfixed +(\d+) ", plan).group(1))
    budget = fixed + budget_experts
    file_bytes = os.path.getsize(a.model)
    dropped = drop_caches()
    bw = read_bandwidth(a.model)

    ready = multiprocessing.Event()
    lock_bytes = max(0, mem_available() - int(a.free_gib * (1 << 30)))
    p = multiprocessing.Process(target=hog, args=(lock_bytes, ready), daemon=True)
    p.start()
    ready.wait()
    results = {"model": a.model, "file_bytes": file_bytes, "routed_expert_bytes": routed, "ram_budget": budget,
               "budget_expert_bytes": budget_experts, "locked_bytes": lock_bytes,
               "free_bytes": mem_available(), "seq_read_GBps": bw, "caches_dropped": dropped, "runs": {}}
    rng = random.Random(a.seed)
    n_vocab = vocab_size(a.strata, a.model)
    prompt = [rng.randrange(n_vocab) for _ in range(a.prompt_tokens)]
    modes = ("generated", "random") if a.decode == "both" else (a.decode,)
    try:
        for mode in modes:
            forced = [rng.randrange(n_vocab) for _ in range(a.n)] if mode == "random" else []
            engines = (("strata", ["--q8-activations"]), ("strata_exact", []))
            for name, extra in engines:
                drop_caches()
                results["runs"][f"{mode}/{name}"] = run_strata(a.strata, a.model, budget, prompt, forced, a.n,
                                                               a.threads,
                                                               extra + ["--n-ctx", "256"] + a.strata_args.split())
                hog_alive(p, f"{mode}/{name}")
            if not a.skip_llama:
                drop_caches()
                results["runs"][f"{mode}/llama_cpp"] = run_llama(a.model, prompt, forced, a.n, a.threads, a.seed,
                                                                 a.llama_repack)
                hog_alive(p, f"{mode}/llama_cpp")
    finally:
        p.kill()

    print(f"model {a.model}: {file_bytes / 2**30:.2f} GiB, routed experts {routed / 2**30:.2f} GiB")
    print(f"RAM budget {budget / 2**30:.2f} GiB ({a.budget_frac:.0%} of expert bytes + {fixed / 2**30:.2f} GiB fixed), "
          f"free RAM during runs {results['free_bytes'] / 2**30:.2f} GiB, sequential read {bw:.2f} GB/s")
    print(f"{'decode input':<12}{'engine':<16}{'tok/s':>8}{'hit rate':>10}{'MiB read/tok':>14}{'MiB missed/tok':>16}"
          f"{'roofline':>10}{'of roof':>9}{'vs llama':>10}")
    for mode in modes:
        llama = results["runs"].get(f"{mode}/llama_cpp")
        for name in ("strata", "strata_exact"):
            r = results["runs"][f"{mode}/{name}"]
            missed = r["decode_missed_bytes_per_token"]
            roof = bw * 1e9 / missed if missed > 0 else float("inf")
            r["roofline_tok_s"] = roof
            ratio = f"{r['decode_tok_s'] / llama['decode_tok_s']:.2f}x" if llama else ""
            print(f"{mode:<12}{name:<16}{r['decode_tok_s']:>8.2f}{r['decode_hit_rate']:>10.3f}"
                  f"{r['decode_bytes_read_per_token'] / 2**20:>14.1f}{missed / 2**20:>16.1f}"
                  f"{roof:>10.2f}{r['decode_tok_s'] / roof:>9.0%}{ratio:>10}")
        if llama:
            print(f"{mode:<12}{'llama.cpp mmap':<16}{llama['decode_tok_s']:>8.2f}   (resident: "
                  f"{(llama['rss_anon_bytes'] or 0) / 2**30:.2f} GiB anonymous, "
                  f"{(llama['rss_file_bytes'] or 0) / 2**30:.2f} GiB of the file)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
