"""The Python package `strata` (python/strata, ctypes over the C ABI) against oracles nobody here
wrote: transformers' logits of the golden HF checkpoints (tests/golden), and the CLI's text for
greedy generation. Run by CTest with STRATA_LIBRARY (a built libstrata.so), STRATA_CLI and
PYTHONPATH=python; prompts are drawn fresh each run (the seed is in the test's output)."""
import json
import os
import random
import subprocess
import threading

import numpy as np
import pytest

import strata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "examples", "models", "austen-moe-q4_k.gguf")
GOLDEN = os.path.join(ROOT, "tests", "golden")
CLI = os.environ.get("STRATA_CLI", os.path.join(ROOT, "build", "examples", "strata"))
WORDS = ("Mr. Darcy", "Elizabeth", "Emma", "the letter", "Bath", "a ball", "her sister", "Pemberley",
         "was", "had been", "could not", "said", "in the", "never")


@pytest.fixture(scope="module")
def demo():
    with strata.Model(DEMO) as m:
        yield m


@pytest.fixture
def rng():
    seed = random.SystemRandom().randrange(1 << 30)
    print("seed", seed)
    return random.Random(seed)


def cli_text(prompt, n, *more):
    out = subprocess.run([CLI, "run", "--prompt", prompt, "-n", str(n), "--temp", "0", *more], capture_output=True,
                         check=True).stdout.decode()
    assert out.startswith(prompt) and out.endswith("\n")
    return out[len(prompt):-1]


def test_generate_greedy_equals_the_cli(demo, rng):
    for _ in range(3):
        prompt = " ".join(rng.sample(WORDS, rng.randint(1, 4)))
        n = rng.randint(4, 40)
        want = cli_text(prompt, n)
        assert demo.generate(prompt, max_tokens=n, temperature=0) == want
        pieces = list(demo.generate(prompt, max_tokens=n, temperature=0, stream=True))
        assert "".join(pieces) == want and len(pieces) > 1
    # The CLI's default sampling (temperature 0.8, top-k 40, top-p 0.95, seed 42) is generate's default.
    prompt = " ".join(rng.sample(WORDS, 2))
    out = subprocess.run([CLI, "run", "--prompt", prompt, "-n", "24"], capture_output=True, check=True).stdout.decode()
    assert demo.generate(prompt, max_tokens=24) == out[len(prompt):-1]


@pytest.mark.parametrize("case", ["qwen3moe_f32", "mixtral_f32"])
def test_hf_checkpoint_logits_equal_transformers(case):
    folder = os.path.join(GOLDEN, case)
    tokens = np.fromfile(os.path.join(folder, "tokens.bin"), dtype="<i4").tolist()
    with strata.Model(os.path.join(folder, "hf"), backend="cpu") as m:
        want = np.fromfile(os.path.join(folder, "logits.bin"), dtype="<f4").reshape(len(tokens), m.vocab_size)
        s = m.session()
        first = s.eval(tokens[:5])  # a prefill, then one token at a time
        assert first.dtype == np.float32 and first.shape == (m.vocab_size,)
        assert np.max(np.abs(first - want[4])) <= 1e-3
        for t in range(5, len(tokens)):
            got = s.eval([tokens[t]])
            assert np.max(np.abs(got - want[t])) <= 1e-3, t
        assert s.n_past == len(tokens)


def test_tokenize_detokenize(demo, rng):
    text = " ".join(rng.choice(WORDS) for _ in range(12)) + " é ✓"
    ids = demo.tokenize(text)
    assert ids and all(0 <= i < demo.vocab_size for i in ids)
    assert demo.detokenize(ids) == text
    assert demo.tokenize("<|endoftext|>", special=True) == [0]
    assert len(demo.tokenize("<|endoftext|>")) > 1  # a user's text never becomes a control token
    cli = subprocess.run([CLI, "tokenize", "--model", DEMO, "--text", text], capture_output=True,
                         check=True).stdout.decode().split()
    assert ids == [int(x) for x in cli]


def test_session_sample_save_and_load(demo, rng, tmp_path):
    prompt = demo.tokenize(" ".join(rng.sample(WORDS, 3)))
    s = demo.session(temperature=0.9, top_k=40, seed=rng.randrange(1 << 40))
    s.eval(prompt)
    first = s.sample()
    path = str(tmp_path / "s.snap")
    s.save(path)
    ref = []
    tok = first
    for _ in range(10):
        s.eval([tok])
        tok = s.sample()
        ref.append(tok)
    t = demo.load_session(path)
    assert t.n_past == len(prompt)
    got = []
    tok = first
    for _ in range(10):
        t.eval([tok])
        tok = t.sample()
        got.append(tok)
    assert got == ref
    s.close()
    t.close()


def test_stats(demo):
    demo.generate("Emma", max_tokens=3, temperature=0)
    st = demo.stats()
    assert st["expert_hits"] > 0 and "bytes_read" in st and "io_wait_s" in st


def test_threads_share_a_model(demo, rng):
    prompts = [" ".join(rng.sample(WORDS, 2)) for _ in range(4)]
    alone = [demo.generate(p, max_tokens=12, temperature=0) for p in prompts]
    out = [None] * 4

    def work(i):
        out[i] = demo.generate(prompts[i], max_tokens=12, temperature=0)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert out == alone


def test_errors_never_crash(tmp_path):
    with pytest.raises(strata.Error) as e:
        strata.Model(str(tmp_path / "missing.gguf"))
    assert e.value.status_name == "MOE_ERR_IO_OPEN" and "missing.gguf" in str(e.value)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(64))
    with pytest.raises(strata.Error):
        strata.Model(str(bad))
    with pytest.raises(strata.Error):
        strata.Model(DEMO, backend="tpu")
    with pytest.raises(strata.Error):
        strata.Model(DEMO, ram_budget="lots")
    with pytest.raises(TypeError):
        strata.Model(42)
    m = strata.Model(DEMO)
    s = m.session()
    with pytest.raises(strata.Error):
        s.eval([m.vocab_size])  # outside the vocabulary
    with pytest.raises(strata.Error):
        s.sample()  # no logits yet
    with pytest.raises(TypeError):
        s.eval("Emma")
    with pytest.raises(TypeError):
        m.tokenize(b"bytes")
    with pytest.raises(strata.Error):
        m.session(temperature=-1.0)
    with pytest.raises(strata.Error):
        m.load_session(str(bad))
    with pytest.raises(strata.Error):
        m.generate("", max_tokens=4)
    m.close()
    m.close()
    with pytest.raises(strata.Error):
        s.eval([1])
    with pytest.raises(strata.Error):
        m.generate("Emma")
    with pytest.raises(strata.Error):
        m.session()
    with pytest.raises(strata.Error):
        m.stats()
    s.close()


def test_fork_rewind_and_bytes(demo, rng):
    prompt = demo.tokenize(" ".join(rng.sample(WORDS, 3)), add_bos=True)
    more = demo.tokenize(" " + rng.choice(WORDS))
    a = demo.session(temperature=0.9, seed=rng.randrange(1 << 30))
    a.eval(prompt)
    b = a.fork()
    data = a.save_bytes()
    assert isinstance(data, bytes) and len(data) > 112
    c = demo.load_session_bytes(data)
    want = a.eval(more)
    assert np.array_equal(b.eval(more), want)
    assert np.array_equal(c.eval(more), want)
    assert a.sample() == b.sample() == c.sample()
    a.rewind(len(more))
    assert a.n_past == len(prompt)
    assert np.array_equal(a.eval(more), want)
    with pytest.raises(strata.Error) as e:
        a.rewind(a.n_past + 1)
    assert e.value.status_name == "MOE_ERR_INVALID_ARGUMENT"
    with pytest.raises(strata.Error) as e:
        demo.load_session_bytes(data[: len(data) // 2])
    assert e.value.status_name.startswith("MOE_ERR_FORMAT")
    with pytest.raises(TypeError):
        demo.load_session_bytes("not bytes")
    for s in (a, b, c):
        s.close()
    with pytest.raises(strata.Error):
        b.fork()  # closed


def within(seconds, fn):
    """fn() on a worker thread: its result (or its exception), or a failure when it has not returned
    within `seconds`, so a step that never ends fails the test instead of hanging the run."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "did not return within %s s" % seconds
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_abort_from_another_thread(demo, rng):
    ids = demo.tokenize(" ".join(rng.choice(WORDS) for _ in range(40)), add_bos=True)
    want = within(120, lambda: demo.session().eval(ids))
    s = demo.session()
    t = threading.Thread(target=demo.abort)  # no step runs: the request stops the next one
    t.start()
    t.join()
    with pytest.raises(strata.Error) as e:
        within(30, lambda: s.eval(ids))
    assert e.value.status_name == "MOE_ERR_ABORTED"
    assert s.n_past == 0
    assert np.array_equal(within(120, lambda: s.eval([])), want)  # the input stayed queued; this step runs it
    s.close()
    # The request was spent by the step it stopped: the shared context evaluates as before.
    assert np.array_equal(within(120, lambda: demo.session().eval(ids)), want)


def test_pending_abort_stops_one_eval_then_is_spent(rng):
    """moe_ctx_abort with no step running stops the next step at once with MOE_ERR_ABORTED, and that
    spends the request (moe.h: one request stops one step call): every eval after it runs to the
    end, on a fresh session and on the aborted one, with the logits of a context never aborted."""
    with strata.Model(DEMO) as m:
        ids = [rng.randrange(m.vocab_size) for _ in range(rng.randint(2, 48))]
        more = [rng.randrange(m.vocab_size) for _ in range(rng.randint(1, 8))]
        ref = strata.Model(DEMO)
        want = within(120, lambda: ref.session().eval(ids))
        r = ref.session()
        within(120, lambda: r.eval(ids))
        want_more = within(120, lambda: r.eval(more))
        ref.close()
        for _ in range(3):
            s = m.session()
            m.abort()
            with pytest.raises(strata.Error) as e:
                within(30, lambda: s.eval(ids))
            assert e.value.status_name == "MOE_ERR_ABORTED"
            assert s.n_past == 0
            # Spent: a fresh session's eval runs (its step also runs the input s kept queued).
            assert np.array_equal(within(120, lambda: m.session().eval(ids)), want)
            assert s.n_past == len(ids)
            assert np.array_equal(within(120, lambda: s.eval(more)), want_more)
            s.close()


def test_kv_cache_types(rng):
    """The KV cache types reach the library: q8_0 and f16 keys and values give logits near f32's (the
    demo model's), different from them (the rows really are stored in the type), and a name the
    library does not know is refused."""
    with strata.Model(DEMO) as m:  # its own context: the shared one may hold another test's abort
        ids = [rng.randrange(m.vocab_size) for _ in range(24)]
        ref = m.session().eval(ids)
    for k, v, tol in (("q8_0", "q8_0", 0.5), ("f16", "f32", 0.05)):
        with strata.Model(DEMO, cache_type_k=k, cache_type_v=v) as m:
            got = m.session().eval(ids)
        err = float(np.max(np.abs(got - ref)))
        assert 0 < err <= tol * max(1.0, float(np.max(np.abs(ref)))), (k, v, err)
    with pytest.raises(strata.Error):
        strata.Model(DEMO, cache_type_k="q4_k")


def test_context_shift(rng):
    """context_shift reaches the library: a session fed past its n_ctx goes on (llama.cpp's rule for its
    position), a manual shift by the same amount gives the same logits bit for bit, bad values raise."""
    with strata.Model(DEMO) as m:
        n_ctx, keep = 64, rng.randrange(1, 20)
        ids = [rng.randrange(m.vocab_size) for _ in range(n_ctx + 10)]
        auto = m.session(n_ctx=n_ctx, context_shift=True, n_keep=keep)
        by_hand = m.session(n_ctx=n_ctx)
        got = auto.eval(ids)
        assert auto.n_past == n_ctx - (n_ctx - keep) // 2 + 10
        by_hand.eval(ids[:n_ctx])
        with pytest.raises(strata.Error) as e:
            by_hand.eval(ids[n_ctx:])
        assert e.value.status_name == "MOE_ERR_LIMIT_CONTEXT"
        by_hand.shift(keep, (n_ctx - keep) // 2)
        assert np.array_equal(by_hand.eval(ids[n_ctx:]), got)  # the refused input was not queued
        with pytest.raises(strata.Error) as e:
            m.session(n_ctx=n_ctx, context_shift=True, n_keep=n_ctx)
        assert e.value.status_name == "MOE_ERR_INVALID_ARGUMENT"
        with pytest.raises(strata.Error):
            by_hand.shift(0, by_hand.n_past + 1)
        with pytest.raises(TypeError):
            m.session(context_shift=1)
