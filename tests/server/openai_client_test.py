#!/usr/bin/env python3
"""`strata serve` driven by the official `openai` client (PyPI), on the bundled demo model.

Checks, against `strata run` (the CLI is the oracle for greedy text, `strata tokenize` for token
counts): the model list; greedy completions equal to `strata run --temp 0`; streamed chunks that
join to the same text; 8 requests at once (greedy and seeded sampling, completions and chat) with
the texts they get one at a time; logprobs whose greedy token is the most likely; OpenAI error
objects with 4xx for malformed requests, after which the server still answers; the API key; a
client that disconnects cancels its session; a full server answers 503.

Prompts are drawn fresh each run (the seed is printed). Usage:
  openai_client_test.py --strata build/examples/strata
"""
import argparse
import concurrent.futures
import http.client
import json
import random
import re
import socket
import subprocess
import sys
import tempfile
import time

import openai

WORDS = ("Mr. Darcy", "Elizabeth", "Emma", "Mrs. Bennet", "Captain Wentworth", "Anne", "the letter", "Bath",
         "a ball", "Mr. Knightley", "her sister", "the carriage", "Fanny", "Pemberley", "the morning", "Marianne",
         "was", "had been", "could not", "said", "with great", "in the", "of her", "and the", "never")

API_KEY = "sk-strata-test"
failures = []
passed = 0


def check(name, cond, detail=""):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(name)
        print(f"FAIL {name}: {detail}", flush=True)


class Server:
    """A `strata serve` process on a free port; its stderr goes to a file."""

    def __init__(self, strata, *args):
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([strata, "serve", "--port", "0", *args], stdout=subprocess.DEVNULL,
                                     stderr=self.log, text=True)
        deadline = time.time() + 60
        self.port = None
        while self.port is None:
            if time.time() > deadline or self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError("strata serve did not start:\n" + self.log.read())
            time.sleep(0.05)
            self.log.seek(0)
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", self.log.read())
            if m:
                self.port = int(m.group(1))

    def raw(self, method, path, body=None, headers=None, timeout=60):
        """(status, parsed JSON or text) of one request over a fresh connection."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data.decode("utf-8", "replace")

    def metric(self, name):
        _, text = self.raw("GET", "/metrics")
        m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
        return float(m.group(1)) if m else None

    def stop(self):
        self.proc.terminate()
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = "killed"
        self.log.seek(0)
        return rc, self.log.read()


def run_cli(strata, prompt, n, *more):
    """The text `strata run --temp 0` generates after the prompt."""
    out = subprocess.run([strata, "run", "--prompt", prompt, "-n", str(n), "--temp", "0", *more], capture_output=True,
                         check=True).stdout.decode()
    assert out.startswith(prompt) and out.endswith("\n"), out
    return out[len(prompt):-1]


def n_tokens(strata, model, text):
    out = subprocess.run([strata, "tokenize", "--model", model, "--text", text], capture_output=True,
                         check=True).stdout.decode()
    return len(out.split())


def is_error_object(body):
    return (isinstance(body, dict) and isinstance(body.get("error"), dict) and
            isinstance(body["error"].get("message"), str) and body["error"]["message"] and
            "type" in body["error"] and "code" in body["error"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--model", required=True, help="the demo model (for strata tokenize)")
    ap.add_argument("--seed", type=int, default=random.SystemRandom().randrange(1 << 30))
    args = ap.parse_args()
    print(f"seed {args.seed}", flush=True)
    rng = random.Random(args.seed)
    prompts = [" ".join(rng.sample(WORDS, rng.randint(1, 4))) for _ in range(8)]
    lengths = [rng.randint(8, 24) for _ in prompts]

    srv = Server(args.strata, "--parallel", "8", "--api-key", API_KEY)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key=API_KEY, max_retries=0,
                               timeout=60)
        models = client.models.list().data
        check("models", len(models) == 1 and models[0].id == "austen-moe-q4_k", models)
        model = models[0].id
        check("model retrieve", client.models.retrieve(model).id == model)

        # Greedy text equals the CLI's; the usage counts the CLI's tokens.
        expected = [run_cli(args.strata, p, n) for p, n in zip(prompts[:3], lengths[:3])]
        for p, n, want in zip(prompts[:3], lengths[:3], expected):
            r = client.completions.create(model=model, prompt=p, max_tokens=n, temperature=0)
            check("greedy equals strata run", r.choices[0].text == want, f"{p!r}: {r.choices[0].text!r} != {want!r}")
            check("usage", r.usage.prompt_tokens == n_tokens(args.strata, args.model, p) and
                  r.usage.completion_tokens <= n and
                  (r.choices[0].finish_reason != "length" or r.usage.completion_tokens == n), r.usage)
            chunks = list(client.completions.create(model=model, prompt=p, max_tokens=n, temperature=0, stream=True,
                                                    stream_options={"include_usage": True}))
            joined = "".join(c.choices[0].text for c in chunks if c.choices)
            check("stream joins to the text", joined == want, f"{joined!r} != {want!r}")
            check("stream ends with a finish reason", chunks[-2].choices[0].finish_reason in ("stop", "length"))
            check("stream's usage chunk", not chunks[-1].choices and chunks[-1].usage is not None and
                  chunks[-1].usage.completion_tokens == r.usage.completion_tokens, chunks[-1])

        # Penalties as the CLI applies them (a window of the last 64 tokens, prompt included).
        p, n = prompts[3], 24
        want = run_cli(args.strata, p, n, "--frequency-penalty", "1.5", "--presence-penalty", "0.5")
        r = client.completions.create(model=model, prompt=p, max_tokens=n, temperature=0, frequency_penalty=1.5,
                                      presence_penalty=0.5)
        check("penalties equal strata run's", r.choices[0].text == want, f"{r.choices[0].text!r} != {want!r}")
        check("penalties change the text", want != run_cli(args.strata, p, n), want)

        # Logprobs: at temperature 0 the sampled token is the most likely one.
        r = client.completions.create(model=model, prompt=prompts[0], max_tokens=5, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        check("logprobs count", len(lp.token_logprobs) == r.usage.completion_tokens == len(lp.top_logprobs))
        check("greedy token is the most likely",
              all(abs(v - max(t.values())) < 1e-6 and v < 0 for v, t in zip(lp.token_logprobs, lp.top_logprobs)), lp)

        # 8 at once: the texts they get alone. Half greedy, half sampled with a seed; chat too.
        def request(i):
            p, n = prompts[i], lengths[i]
            sampled = dict(temperature=0.9, seed=rng_seeds[i], top_p=0.95) if i % 2 else dict(temperature=0)
            if i % 4 == 3:
                r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}],
                                                   max_tokens=n, **sampled)
                return r.choices[0].message.content
            return client.completions.create(model=model, prompt=p, max_tokens=n, **sampled).choices[0].text

        rng_seeds = [rng.randrange(1 << 40) for _ in prompts]
        alone = [request(i) for i in range(8)]
        steps, stepped = srv.metric("strata_steps_total"), srv.metric("strata_step_sessions_total")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            together = list(pool.map(request, range(8)))
        batch = (srv.metric("strata_step_sessions_total") - stepped) / (srv.metric("strata_steps_total") - steps)
        print(f"mean batch {batch:.2f} sessions per step", flush=True)
        check("concurrent requests decode together", batch > 1.5, f"{batch:.2f} sessions per step")
        for i in range(8):
            check("8 at once equal one at a time", together[i] == alone[i], f"{i}: {together[i]!r} != {alone[i]!r}")
        check("sampled texts differ from greedy", any(alone[i] != alone[i - 1] for i in range(1, 8, 2)))

        # Chat: the stream joins to the whole answer.
        msgs = [{"role": "system", "content": "You are Miss Austen."}, {"role": "user", "content": prompts[4]}]
        whole = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0)
        parts = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0, stream=True)
        text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
        check("chat stream joins to the answer", text == whole.choices[0].message.content, f"{text!r}")

        # Bad requests: OpenAI's error object with a 4xx, through the client and raw.
        for kwargs, status in ((dict(max_tokens=-1), 400), (dict(max_tokens=0), 400), (dict(max_tokens=10 ** 9), 400),
                               (dict(temperature=-1), 400), (dict(model="gpt-nope"), 404),
                               (dict(extra_body={"n": 1000}), 400), (dict(extra_body={"top_k": "many"}), 400)):
            call = dict(model=model, prompt="Emma", max_tokens=4)
            call.update(kwargs)
            try:
                client.completions.create(**call)
                check("bad request refused", False, f"{kwargs} was answered")
            except openai.APIStatusError as e:
                check("bad request status", e.status_code == status and e.message, f"{kwargs}: {e.status_code} {e}")
        bad_bodies = [b"{not json", b"[1, 2]", b'{"prompt": "\xff\xfe", "max_tokens": 3}',
                      b'{"prompt": 5}', b'{"prompt": "Emma", "max_tokens": "5"}', b'{"prompt": [5000000]}',
                      b'{"prompt": "Emma", "stop": [1, 2]}', b'{"prompt": "' + b"Emma " * 5000 + b'"}',
                      b'{"prompt": "' + b"x" * (3 << 20) + b'"}']
        for body in bad_bodies:
            status, reply = srv.raw("POST", "/v1/completions", body)
            check("malformed request gets a 4xx error object", 400 <= status < 500 and is_error_object(reply),
                  f"{body[:40]!r}: {status} {str(reply)[:200]}")
        user = b'[{"role": "user", "content": "Emma"}]'
        for body in (b'{"messages": [{"role": "user"}]}', b'{"messages": []}', b'{"messages": "Emma"}',
                     b'{"messages": [{"role": "tool", "content": "x"}]}', b'{"messages": [{"role": 7, "content": "x"}]}',
                     b'{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}',
                     b'{"messages": ' + user + b', "n": 9}', b'{"messages": ' + user + b', "top_logprobs": 2}',
                     b'{"messages": ' + user + b', "stop": ["a", "b", "c", "d", "e"]}',
                     b'{"messages": ' + user + b', "tools": [{"type": "function"}]}',
                     b'{"messages": ' + user + b', "stream_options": {"include_usage": true}}',
                     b'{"messages": ' + user + b', "max_completion_tokens": 0}'):
            status, reply = srv.raw("POST", "/v1/chat/completions", body)
            check("malformed chat request gets a 4xx error object", 400 <= status < 500 and is_error_object(reply),
                  f"{body[:60]!r}: {status} {str(reply)[:200]}")
        status, reply = srv.raw("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        check("a wrong API key gets 401", status == 401 and is_error_object(reply), reply)
        status, _ = srv.raw("GET", "/health", headers={"Authorization": ""})
        check("health needs no key", status == 200)

        # Still serving, and still the same text.
        r = client.completions.create(model=model, prompt=prompts[0], max_tokens=lengths[0], temperature=0)
        check("answers after bad requests", r.choices[0].text == expected[0], r.choices[0].text)

        # A client that goes away: its session is cancelled, the server stays free.
        s = socket.create_connection(("127.0.0.1", srv.port))
        body = json.dumps({"prompt": prompts[1], "max_tokens": 2000, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b"data: ") < 2:
            got += s.recv(4096)
        s.close()
        deadline = time.time() + 10
        while time.time() < deadline and not (srv.metric("strata_requests_cancelled_total") == 1 and
                                                srv.metric("strata_sessions_running") == 0):
            time.sleep(0.05)
        check("disconnect cancels", srv.metric("strata_requests_cancelled_total") == 1 and
              srv.metric("strata_sessions_running") == 0, srv.raw("GET", "/metrics")[1])
        generated = srv.metric("strata_generated_tokens_total")
        time.sleep(0.3)
        check("nothing generates after the cancel", srv.metric("strata_generated_tokens_total") == generated)
    finally:
        rc, log = srv.stop()
    check("stops cleanly on SIGTERM", rc == 0, log)

    # A full server: one session, one queued; the third request at once gets 503.
    small = Server(args.strata, "--parallel", "1", "--queue", "1")
    try:
        socks = []
        for i in range(2):
            s = socket.create_connection(("127.0.0.1", small.port))
            body = json.dumps({"prompt": prompts[i], "max_tokens": 2000, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            socks.append(s)
        deadline = time.time() + 10
        while time.time() < deadline and small.metric("strata_requests_queued") != 1:
            time.sleep(0.02)
        status, reply = small.raw("POST", "/v1/completions", json.dumps({"prompt": "Emma", "max_tokens": 2}))
        check("full server answers 503", status == 503 and is_error_object(reply) and
              reply["error"]["code"] == "server_busy", f"{status} {reply}")
        for s in socks:
            s.close()
        # Both go: the running one at its next step, the queued one from the queue.
        deadline = time.time() + 10
        while time.time() < deadline and (small.metric("strata_requests_cancelled_total") != 2 or
                                          small.metric("strata_requests_queued") != 0 or
                                          small.metric("strata_sessions_running") != 0):
            time.sleep(0.02)
        check("running and queued requests cancelled", small.metric("strata_requests_cancelled_total") == 2 and
              small.metric("strata_requests_queued") == 0 and small.metric("strata_sessions_running") == 0,
              small.raw("GET", "/metrics")[1])
    finally:
        small.stop()

    # --context-shift: a reply longer than the context goes on, as strata run's with the same flags;
    # without it such a max_tokens is refused.
    shift_flags = ["-c", "64", "--context-shift", "--keep", "-1"]
    shifting = Server(args.strata, *shift_flags)
    try:
        p = prompts[0]
        want = run_cli(args.strata, p, 200, *shift_flags)
        status, reply = shifting.raw("POST", "/v1/completions",
                                     json.dumps({"prompt": p, "max_tokens": 200, "temperature": 0}))
        check("context shift: text equals strata run's", status == 200 and reply["choices"][0]["text"] == want,
              f"{status} {reply}")
        check("context shift: past n_ctx", status == 200 and reply["usage"]["completion_tokens"] > 64, reply)
    finally:
        shifting.stop()
    bounded = Server(args.strata, "-c", "64")
    try:
        status, reply = bounded.raw("POST", "/v1/completions", json.dumps({"prompt": "Emma", "max_tokens": 200}))
        check("no context shift: max_tokens past n_ctx refused", status == 400 and is_error_object(reply) and
              "context holds 64" in reply["error"]["message"], f"{status} {reply}")
    finally:
        bounded.stop()

    print(f"{passed} passed, {len(failures)} failed", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
