#!/usr/bin/env python3
"""Three tiers at once: decode speed at (RAM, VRAM) budget pairs, against the physical limit.

Runs `strata bench --json` on one model for each configuration given as BACKEND:RAM[:VRAM]
(e.g. cpu:6G cuda:6G:8G cuda:12G:8G cuda:60G:8G), in the same run, and prints one row each:
decode tok/s, the hit rate of each tier, what a decode token moved (bytes read from the file,
bytes over the link: experts the GPU read from RAM in place plus the tiers' moves), and the
roofline those bytes allow at the disk's and the link's measured rates. The disk rate is measured
here by O_DIRECT reads of expert-sized blocks at random offsets of the model file (--io-threads
readers), and taken as the best of that and what any configuration of the run read from it; the
link rate is given (--link-gbs, pinned host to device).

The roofline takes the slower of the two streams a token needs (file bytes / disk rate, link bytes /
link rate), as if they overlapped perfectly: the fastest any engine could decode those bytes.

--free-gib X locks all but X GiB of the host's available RAM for the whole run (streaming_bench.py's
hog), so every engine meets the same free memory and the page cache cannot hold the file. With
--llama-lib DIR (libllama.so built for CUDA from the llama-cpp-python source distribution) a
llama.cpp row follows: every layer offloaded, the routed experts of the first --llama-cpu-moe layers
in host RAM computed by the CPU (its --n-cpu-moe), weights read through its mmap; prompt and decode
ids as gpu_bench.py feeds it (a prompt of --prefill ids, then --decode one-token steps).

  python3 bench/tiers_bench.py --strata build/examples/strata --model q30k.gguf \
      --configs cpu:6G cuda:6G:8G cuda:12G:8G cuda:60G:8G --prefill 512 --decode 64 --threads 16 --json out.json
"""
import argparse
import json
import mmap
import os
import random
import subprocess
import sys
import threading
import time


def size(s):
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def disk_rate(path, block, readers, seconds):
    """Bytes/s of O_DIRECT reads of `block` bytes at random 4 KiB-aligned offsets of `path`."""
    block = (block + 4095) // 4096 * 4096
    total = os.path.getsize(path)
    if total < 2 * block:
        return 0.0
    done = [0] * readers
    stop = time.monotonic() + seconds

    def run(i):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
        rng = random.Random(i)
        try:
            while time.monotonic() < stop:
                off = rng.randrange(0, (total - block) // 4096) * 4096
                done[i] += os.preadv(fd, [buf], off)
        finally:
            os.close(fd)
            buf.close()

    t0 = time.monotonic()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(readers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(done) / (time.monotonic() - t0)


def run_config(args, cfg):
    parts = cfg.split(":")
    backend, ram = parts[0], parts[1]
    vram = parts[2] if len(parts) > 2 else None
    cmd = [args.strata, "bench", "--model", args.model, "--backend", backend, "--ram-budget", ram,
           "--threads", str(args.threads), "--prompt-tokens", str(args.prefill), "-n", str(args.decode), "--json"]
    if args.q8:
        cmd.append("--q8-activations")
    if vram:
        cmd += ["--vram-budget", vram]
    cmd += args.extra
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"config": cfg, "error": p.stderr.strip().splitlines()[-1:] or ["exit %d" % p.returncode]}
    line = [l for l in p.stdout.splitlines() if l.startswith("{")][-1]
    r = json.loads(line)
    r["config"] = cfg
    r["wall_s"] = time.monotonic() - t0
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--configs", nargs="+", required=True, help="BACKEND:RAM[:VRAM] each")
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--q8", action="store_true", default=True)
    ap.add_argument("--link-gbs", type=float, default=50.0, help="pinned host-to-device GB/s")
    ap.add_argument("--io-threads", type=int, default=4, help="readers for the disk measurement")
    ap.add_argument("--disk-seconds", type=float, default=3.0)
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("extra", nargs="*", help="more strata bench flags (after --)")
    ap.add_argument("--free-gib", type=float, default=0.0, help="lock all but this much available RAM (0: none)")
    ap.add_argument("--llama-lib", default="", help="directory of a CUDA libllama.so: adds a llama.cpp row")
    ap.add_argument("--llama-cpu-moe", type=int, default=0, help="llama.cpp's --n-cpu-moe for that row")
    args = ap.parse_args()

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    hog = None
    if args.free_gib > 0:
        import multiprocessing
        import streaming_bench as sb
        sb.drop_caches()
        lock = sb.mem_available() - int(args.free_gib * 2**30)
        if lock > 0:
            ready = multiprocessing.Event()
            hog = multiprocessing.Process(target=sb.hog, args=(lock, ready), daemon=True)
            hog.start()
            ready.wait()
        print("RAM lock: %.1f GiB locked, %.1f GiB available" % (max(lock, 0) / 2**30, sb.mem_available() / 2**30))
    try:
        rows = [run_config(args, c) for c in args.configs]
        if hog is not None:
            sb.hog_alive(hog, "the Strata rows")
        llama = None
        if args.llama_lib:
            import gpu_bench
            if hog is not None:
                sb.drop_caches()
            try:
                llama = gpu_bench.run_llama_apart(args.llama_lib, args.model, args.llama_cpu_moe, args.prefill,
                                                  args.decode, args.threads)
            except RuntimeError as e:
                llama = {"error": str(e)}
            llama["config"] = "llama.cpp cuda, n-cpu-moe %d" % args.llama_cpu_moe
            if hog is not None:
                sb.hog_alive(hog, "llama.cpp")
    finally:
        if hog is not None:
            hog.kill()
    report(args, rows, llama)


def report(args, rows, llama):
    slot = next((r["stats"]["cache_slot_bytes"] for r in rows if "stats" in r and r["stats"]["cache_slot_bytes"]), 0)
    probe = disk_rate(args.model, slot or (1 << 22), args.io_threads, args.disk_seconds)
    achieved = max([r["stats"]["bytes_read"] / max(1, r["decode_tokens"]) * r["decode_tok_s"]
                    for r in rows if "stats" in r] + [0.0])
    disk = max(probe, achieved)
    link = args.link_gbs * 1e9
    print("disk: %.2f GB/s (probe %.2f GB/s O_DIRECT, %d readers of %.2f MiB; best read in the run %.2f GB/s); "
          "link: %.1f GB/s (given)" % (disk / 1e9, probe / 1e9, args.io_threads, slot / 2**20, achieved / 1e9,
                                       link / 1e9))
    print("%-16s %9s %7s %7s %7s %10s %10s %10s %7s" %
          ("config", "decode", "VRAM%", "RAM%", "file%", "file MiB", "link MiB", "roofline", "share"))
    for r in rows:
        if "error" in r:
            print("%-16s failed: %s" % (r["config"], r["error"][0]))
            continue
        st = r["stats"]
        n = max(1, r["decode_tokens"])
        uses = st["vram_hits"] + st["expert_hits"] + st["expert_misses"]
        file_b = st["bytes_read"] / n
        # Experts the GPU computed from RAM read in place over the link, plus the tiers' moves.
        gpu = r["config"].startswith("cuda")
        link_b = 0.0
        if gpu:
            link_b = ((st["expert_hits"] + st["expert_misses"]) * st["cache_slot_bytes"] + st["vram_fill_bytes"] +
                      st["vram_demotions"] * st["cache_slot_bytes"]) / n
            if not st["streaming"]:
                link_b = r["decode_link_bytes_per_token"]
        t = max(file_b / disk if disk > 0 else 0.0, link_b / link if gpu else 0.0)
        roof = 1.0 / t if t > 0 else float("inf")
        r.update({"file_bytes_per_token": file_b, "link_bytes_per_token": link_b, "roofline_tok_s": roof,
                  "disk_bytes_s": disk, "disk_probe_bytes_s": probe, "link_bytes_s": link})
        pct = lambda x: 100.0 * x / uses if uses else 0.0
        print("%-16s %9.2f %6.1f%% %6.1f%% %6.1f%% %10.1f %10.1f %10.1f %6.1f%%" %
              (r["config"], r["decode_tok_s"], pct(st["vram_hits"]), pct(st["expert_hits"]), pct(st["expert_misses"]),
               file_b / 2**20, link_b / 2**20, roof, 100.0 * r["decode_tok_s"] / roof if roof != float("inf") else 0))
    if llama is not None:
        if "error" in llama:
            print("%-16s failed: %s" % (llama["config"], llama["error"]))
        else:
            print("%s: decode %.2f tok/s (steady %.2f), prefill %.1f tok/s" %
                  (llama["config"], llama["decode_tok_s"], llama["decode_steady_tok_s"], llama["prefill_tok_s"]))
            for r in rows:
                if "error" not in r:
                    print("  %-16s %.1fx llama.cpp" % (r["config"], r["decode_tok_s"] / max(llama["decode_tok_s"], 1e-9)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "free_gib": args.free_gib, "rows": rows, "llama": llama}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
