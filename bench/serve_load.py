#!/usr/bin/env python3
"""Load test of an OpenAI-compatible server on this machine: C concurrent streaming clients send R
requests in all (a fixed count), each a /v1/completions stream; reports time to first token (p50,
p99), aggregate generated tokens per second, and whether every answer is the one its request gets
alone (no request lost or mixed up).

Each request is one of P distinct prompts with its own sampling (greedy, or a seeded temperature
0.8): first every distinct request runs alone, one at a time, for its reference text; then the
load, whose answers must equal those references. Python's standard library only.

  bench/serve_load.py --strata build/examples/strata               # starts strata serve itself
  bench/serve_load.py --url http://127.0.0.1:8080                  # any running server (llama-server)
  options: --clients 64 --requests 256 --max-tokens 64 --prompts 16 --parallel 64 [--model PATH]
           [--serve-arg=--threads --serve-arg=2] [--json]

Loopback only: --url must name 127.0.0.1, ::1 or localhost.
"""
import argparse
import http.client
import json
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

WORDS = ("Mr. Darcy", "Elizabeth", "Emma", "Mrs. Bennet", "Captain Wentworth", "Anne", "the letter", "Bath",
         "a ball", "Mr. Knightley", "her sister", "the carriage", "Fanny", "Pemberley", "the morning", "Marianne")


def percentile(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return xs[k]


def stream_completion(host, port, model, req, timeout=600):
    """One streamed completion: (text, completion tokens, seconds to first token, seconds in all)."""
    body = dict(model=model, prompt=req["prompt"], max_tokens=req["max_tokens"], stream=True,
                stream_options={"include_usage": True}, **req["sampling"])
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    text, ttft, tokens, chunks = [], None, None, 0
    for raw in r:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            break
        ev = json.loads(data)
        if "error" in ev:
            raise RuntimeError(f"stream error: {ev['error']}")
        for ch in ev.get("choices") or []:
            if ch.get("text"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text.append(ch["text"])
            chunks += 1
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
    total = time.perf_counter() - t0
    c.close()
    return "".join(text), tokens if tokens is not None else chunks, ttft if ttft is not None else total, total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strata", help="start this strata binary's server")
    ap.add_argument("--url", help="use a running server at this loopback URL instead")
    ap.add_argument("--model", default="", help="--model for strata serve (default: the demo model)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=64, help="strata serve --parallel")
    ap.add_argument("--serve-arg", action="append", default=[], help="more strata serve flags")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if bool(a.strata) == bool(a.url):
        sys.exit("serve_load: give --strata BINARY or --url URL")

    proc = log = None
    if a.strata:
        log = tempfile.TemporaryFile("w+")
        cmd = [a.strata, "serve", "--port", "0", "--parallel", str(a.parallel), "--queue", str(a.clients)]
        cmd += (["--model", a.model] if a.model else []) + a.serve_arg
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
        port, deadline = None, time.time() + 600
        while port is None:
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                sys.exit("serve_load: strata serve did not start:\n" + log.read())
            time.sleep(0.05)
            log.seek(0)
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", log.read())
            port = int(m.group(1)) if m else None
        host = "127.0.0.1"
    else:
        u = urllib.parse.urlparse(a.url)
        if u.hostname not in ("127.0.0.1", "::1", "localhost"):
            sys.exit("serve_load: loopback only (127.0.0.1, ::1, localhost)")
        host, port = u.hostname, u.port or 80
    try:
        c = http.client.HTTPConnection(host, port, timeout=60)
        c.request("GET", "/v1/models")
        model = json.loads(c.getresponse().read())["data"][0]["id"]
        c.close()

        rng = random.Random(a.seed)
        distinct = []
        for i in range(a.prompts):
            sampling = {"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": rng.randrange(1 << 30)}
            distinct.append({"prompt": " ".join(rng.sample(WORDS, rng.randint(1, 4))), "max_tokens": a.max_tokens,
                             "sampling": sampling})
        reference = [stream_completion(host, port, model, r)[0] for r in distinct]

        results = [None] * a.requests
        next_i = [0]
        lock = threading.Lock()

        def client():
            while True:
                with lock:
                    i = next_i[0]
                    if i >= a.requests:
                        return
                    next_i[0] += 1
                try:
                    results[i] = stream_completion(host, port, model, distinct[i % a.prompts])
                except Exception as e:  # reported as a lost request
                    results[i] = e

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)

    ok = [r for r in results if isinstance(r, tuple)]
    errors = [r for r in results if not isinstance(r, tuple)]
    mixed = sum(1 for i, r in enumerate(results) if isinstance(r, tuple) and r[0] != reference[i % a.prompts])
    tokens = sum(r[1] for r in ok)
    ttfts = [r[2] for r in ok]
    out = {
        "server": a.url or "strata serve --parallel %d" % a.parallel,
        "model": model,
        "clients": a.clients,
        "requests": a.requests,
        "max_tokens": a.max_tokens,
        "answered": len(ok),
        "lost": len(errors),
        "differ_from_alone": mixed,
        "ttft_p50_s": round(percentile(ttfts, 50), 4),
        "ttft_p99_s": round(percentile(ttfts, 99), 4),
        "generated_tokens": tokens,
        "wall_s": round(wall, 3),
        "aggregate_tok_s": round(tokens / wall, 1),
    }
    if a.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>18}: {v}")
        for e in errors[:3]:
            print(f"error: {e}", file=sys.stderr)
    return 0 if not errors and not mixed else 1


if __name__ == "__main__":
    sys.exit(main())
