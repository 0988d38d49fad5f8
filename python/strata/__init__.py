"""Strata from Python: Mixture-of-Experts models from GGUF files or Hugging Face checkpoint
directories, through the library's C ABI (ctypes; the GIL is released during each call).

    import strata
    m = strata.Model("model.gguf", ram_budget="8G")
    print(m.generate("Mr. Darcy", max_tokens=32, temperature=0))
    for piece in m.generate("Emma", max_tokens=32, stream=True):
        print(piece, end="")
    s = m.session()
    logits = s.eval(m.tokenize("Hello"))   # float32, shape (vocab_size,)

Failures raise strata.Error with the library's message; using a closed model or session raises
strata.Error too, never crashes. A Model may be shared by threads; a Session is used by one thread
at a time.
"""
import ctypes
import threading
import weakref

import numpy as np

from . import _capi

__all__ = ["Error", "Model", "Session", "version"]


class Error(Exception):
    """A failure of the library (status: its moe_status code, status_name its name) or a misuse."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status
        self.status_name = _capi.lib.moe_status_string(status).decode() if status is not None else None


def _check(st, what=""):
    if st != _capi.OK:
        msg = (_capi.lib.moe_last_error() or b"").decode("utf-8", "replace")
        name = _capi.lib.moe_status_string(st).decode()
        lead = what + ": " if what and not msg.startswith(what) else ""  # the library may lead with it
        raise Error("%s%s (%s)" % (lead, msg, name), st)


def version():
    return _capi.lib.moe_version_string().decode()


_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(v, name):
    """A byte count: an int, or a string such as "512M" or "8G"; None for the library's default."""
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise TypeError("%s must be an int or a size string like '8G', not %s" % (name, type(v).__name__))
    if isinstance(v, str):
        s = v.strip().upper().removesuffix("IB").removesuffix("B")
        unit = s[-1:] if s[-1:] in _SUFFIX else ""
        digits = s[: len(s) - len(unit)]
        if not digits.isdigit():
            raise Error("%s: %r is not a size like 512M, 8G or a byte count" % (name, v))
        v = int(digits) * _SUFFIX[unit]
    if v < 0 or v >= 1 << 64:
        raise Error("%s: %d is out of range" % (name, v))
    return v


def _int(v, name, lo, hi):
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("%s must be an int, not %s" % (name, type(v).__name__))
    if not lo <= v <= hi:
        raise Error("%s must be in [%d, %d], got %d" % (name, lo, hi, v))
    return v


def _ids(ids, n_vocab):
    """A list of token ids as a ctypes int32 array (each checked against the vocabulary)."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__len__"):
        raise TypeError("token ids must be a sequence of ints")
    arr = (ctypes.c_int32 * len(ids))()
    for i, t in enumerate(ids):
        if isinstance(t, (bool, float)) or not isinstance(t, (int, np.integer)):
            raise TypeError("token ids must be ints, got %s" % type(t).__name__)
        if not 0 <= int(t) < n_vocab:
            raise Error("token id %d is outside the vocabulary [0, %d)" % (int(t), n_vocab))
        arr[i] = int(t)
    return arr


class Model:
    """A model and its expert tiers (a moe_ctx). path: a GGUF file or an HF checkpoint directory."""

    def __init__(self, path, *, ram_budget=None, vram_budget=None, backend="auto", n_ctx=0, threads=0,
                 max_sessions=1, cache_type_k="f32", cache_type_v="f32"):
        if not isinstance(path, str):
            raise TypeError("path must be a str, not %s" % type(path).__name__)
        if backend not in _capi.BACKENDS:
            raise Error("backend must be one of auto, cpu, cuda, not %r" % (backend,))
        p = _capi.params()
        self._path = path.encode()
        p.model_path = self._path
        p.backend = _capi.BACKENDS[backend]
        p.ram_budget_bytes = _size(ram_budget, "ram_budget")
        p.vram_budget_bytes = _size(vram_budget, "vram_budget")
        p.n_ctx = _int(n_ctx, "n_ctx", 0, 1 << 24)
        p.n_threads = _int(threads, "threads", 0, 1024)
        p.max_sessions = _int(max_sessions, "max_sessions", 1, 1 << 20)
        for name, v in (("cache_type_k", cache_type_k), ("cache_type_v", cache_type_v)):
            if v not in _capi.KV_TYPES:
                raise Error("%s must be one of %s, not %r" % (name, ", ".join(_capi.KV_TYPES), v))
        p.type_k = _capi.KV_TYPES[cache_type_k]
        p.type_v = _capi.KV_TYPES[cache_type_v]
        ctx = ctypes.c_void_p()
        _check(_capi.lib.moe_ctx_open(ctypes.byref(p), ctypes.byref(ctx)), "cannot open '%s'" % path)
        self._ctx = ctx
        self._lock = threading.Lock()  # open/close of sessions against close of the model
        self._sessions = weakref.WeakSet()
        self.vocab_size = _capi.lib.moe_ctx_vocab_size(ctx)

    def _handle(self):
        if self._ctx is None:
            raise Error("the model is closed")
        return self._ctx

    def close(self):
        """Closes the model and every session still open on it. Closing twice does nothing."""
        with self._lock:
            if self._ctx is None:
                return
            for s in list(self._sessions):
                s._s = None  # closed with the context
            _capi.lib.moe_ctx_close(self._ctx)
            self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def tokenize(self, text, special=False, add_bos=False):
        """The token ids of text. special=True turns special tokens written in the text into their ids:
        never on text a user wrote."""
        if not isinstance(text, str):
            raise TypeError("text must be a str, not %s" % type(text).__name__)
        raw = text.encode("utf-8", "surrogatepass")
        flags = (_capi.TOKENIZE_PARSE_SPECIAL if special else 0) | (_capi.TOKENIZE_ADD_BOS if add_bos else 0)
        n = ctypes.c_size_t()
        ctx = self._handle()
        st = _capi.lib.moe_tokenize(ctx, raw, len(raw), flags, None, 0, ctypes.byref(n))
        if st not in (_capi.OK, _capi.ERR_LIMIT):
            _check(st, "tokenize")
        out = (ctypes.c_int32 * n.value)()
        if n.value:
            _check(_capi.lib.moe_tokenize(ctx, raw, len(raw), flags, out, n.value, ctypes.byref(n)), "tokenize")
        return list(out)

    def detokenize(self, ids):
        """The text of token ids (bytes that are not UTF-8 become U+FFFD)."""
        arr = _ids(ids, self.vocab_size)
        n = ctypes.c_size_t()
        ctx = self._handle()
        st = _capi.lib.moe_detokenize(ctx, arr, len(arr), None, 0, ctypes.byref(n))
        if st not in (_capi.OK, _capi.ERR_LIMIT):
            _check(st, "detokenize")
        buf = ctypes.create_string_buffer(n.value)
        if n.value:
            _check(_capi.lib.moe_detokenize(ctx, arr, len(arr), buf, n.value, ctypes.byref(n)), "detokenize")
        return buf.raw[: n.value].decode("utf-8", "replace")

    def session(self, *, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0x5EED, n_ctx=0,
                repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, penalty_last_n=64, stop=None,
                context_shift=False, n_keep=0):
        """A new session (one conversation with its own KV cache) with these sampling settings.
        context_shift=True: input past n_ctx is taken, the context shifting as llama.cpp's
        --context-shift does (half of the tokens after the first n_keep dropped when it is full)."""
        sp = _session_params(temperature, top_k, top_p, min_p, seed, n_ctx, repeat_penalty, presence_penalty,
                             frequency_penalty, penalty_last_n, stop)
        if not isinstance(context_shift, bool):
            raise TypeError("context_shift must be a bool, not %s" % type(context_shift).__name__)
        sp.ctx_shift = 1 if context_shift else 0
        sp.n_keep = _int(n_keep, "n_keep", 0, (1 << 31) - 1)
        return Session._open(self, sp)

    def load_session(self, path):
        """A session restored from a file written by Session.save for this model."""
        if not isinstance(path, str):
            raise TypeError("path must be a str, not %s" % type(path).__name__)
        with self._lock:
            s = ctypes.c_void_p()
            _check(_capi.lib.moe_session_load(self._handle(), path.encode(), None, ctypes.byref(s)),
                   "cannot load the session '%s'" % path)
            return Session._adopt(self, s, None)

    def load_session_bytes(self, data):
        """A session restored from bytes of Session.save_bytes (or a file of Session.save) for this model."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError("data must be bytes, not %s" % type(data).__name__)
        buf = bytes(data)
        with self._lock:
            s = ctypes.c_void_p()
            _check(_capi.lib.moe_session_load_buffer(self._handle(), buf, len(buf), None, ctypes.byref(s)),
                   "cannot load the session from %d bytes" % len(buf))
            return Session._adopt(self, s, None)

    def abort(self):
        """Stops the step another thread is running (or, when none runs, the next one) with
        MOE_ERR_ABORTED; the sessions stay as before that step. One request stops one step: the steps
        after it run. Safe from any thread."""
        _check(_capi.lib.moe_ctx_abort(self._handle()), "abort")

    def generate(self, prompt, max_tokens=32, temperature=0.8, seed=42, top_k=40, top_p=0.95, min_p=0.0,
                 repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, stop=None, stream=False):
        """The text the model writes after prompt (a str, tokenized with BOS where the model asks for it,
        as `strata run` does), up to max_tokens tokens or a stop (EOS or one of the stop strings, which
        are not returned). The defaults are `strata run`'s. stream=True returns an iterator of pieces."""
        if not isinstance(prompt, str):
            raise TypeError("prompt must be a str, not %s" % type(prompt).__name__)
        _int(max_tokens, "max_tokens", 0, 1 << 24)
        ids = self.tokenize(prompt, add_bos=True)
        if not ids:
            raise Error("the prompt has no tokens")
        s = self.session(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                         repeat_penalty=repeat_penalty, presence_penalty=presence_penalty,
                         frequency_penalty=frequency_penalty, stop=stop)
        pieces = s._generate(ids, max_tokens)
        if stream:
            return pieces
        return "".join(pieces)

    def stats(self):
        """The context's counters (moe_stats) as a dict: expert_hits, expert_misses, bytes_read, ..."""
        st = _capi.Stats()
        st.struct_size = ctypes.sizeof(_capi.Stats)
        _check(_capi.lib.moe_ctx_stats(self._handle(), ctypes.byref(st)), "stats")
        return {name: getattr(st, name) for name, _ in _capi.Stats._fields_ if name != "struct_size"}


def _session_params(temperature, top_k, top_p, min_p, seed, n_ctx, repeat_penalty, presence_penalty,
                    frequency_penalty, penalty_last_n, stop):
    sp = _capi.session_params()
    for name, v in (("temperature", temperature), ("top_p", top_p), ("min_p", min_p),
                    ("repeat_penalty", repeat_penalty), ("presence_penalty", presence_penalty),
                    ("frequency_penalty", frequency_penalty)):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError("%s must be a number, not %s" % (name, type(v).__name__))
        setattr(sp, name, float(v))
    sp.top_k = _int(top_k, "top_k", 0, 1 << 30)
    sp.seed = _int(seed, "seed", 0, (1 << 64) - 1)
    sp.n_ctx = _int(n_ctx, "n_ctx", 0, 1 << 24)
    sp.penalty_last_n = _int(penalty_last_n, "penalty_last_n", 0, 1 << 30)
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    for x in stops:
        if not isinstance(x, str):
            raise TypeError("stop must be a str or a list of str")
    keep = [x.encode() for x in stops]
    arr = (ctypes.c_char_p * max(1, len(keep)))(*keep)
    sp.stop_strings = ctypes.cast(arr, ctypes.POINTER(ctypes.c_char_p))
    sp.n_stop_strings = len(keep)
    sp._keep = (keep, arr)  # alive until the session opens (the library copies them)
    return sp


class Session:
    """One conversation: its KV cache, position and sampler. Use it from one thread at a time."""

    def __init__(self):
        raise TypeError("open a session with Model.session() or Model.load_session()")

    @classmethod
    def _open(cls, model, sp):
        with model._lock:
            s = ctypes.c_void_p()
            _check(_capi.lib.moe_session_open(model._handle(), ctypes.byref(sp), ctypes.byref(s)),
                   "cannot open a session")
            return cls._adopt(model, s, sp)

    @classmethod
    def _adopt(cls, model, handle, sp):
        self = object.__new__(cls)
        self._model = model
        self._s = handle
        model._sessions.add(self)
        return self

    def _handle(self):
        if self._s is None:
            raise Error("the session is closed (or its model is)")
        return self._s

    def close(self):
        with self._model._lock:
            if self._s is not None:
                _capi.lib.moe_session_close(self._s)
                self._s = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def n_past(self):
        """Tokens in the session's KV cache."""
        return _capi.lib.moe_session_n_past(self._handle())

    def _feed_and_step(self, ids):
        arr = _ids(ids, self._model.vocab_size)
        s = self._handle()
        _check(_capi.lib.moe_session_feed(s, arr, len(arr)), "feed")
        pending = ctypes.c_uint32(1)
        ctx = self._model._handle()
        while pending.value > 0:
            _check(_capi.lib.moe_ctx_step(ctx, ctypes.byref(pending)), "step")

    def eval(self, ids):
        """Feeds ids, steps, and returns the last position's logits (float32, shape (vocab_size,)). A step
        stopped by Model.abort (also one requested before this call) raises Error MOE_ERR_ABORTED at
        once and spends the request; the ids stay queued, and the next eval (eval([]) to add nothing)
        runs them."""
        self._feed_and_step(ids)
        ptr = ctypes.POINTER(ctypes.c_float)()
        n = ctypes.c_int32()
        _check(_capi.lib.moe_session_logits(self._handle(), ctypes.byref(ptr), ctypes.byref(n)), "logits")
        return np.ctypeslib.as_array(ptr, shape=(n.value,)).copy()

    def sample(self):
        """The next token from the last logits, with the session's sampler (not fed)."""
        tok = ctypes.c_int32()
        _check(_capi.lib.moe_session_sample(self._handle(), ctypes.byref(tok)), "sample")
        return tok.value

    def save(self, path):
        """Writes the session to path atomically (Model.load_session restores it)."""
        if not isinstance(path, str):
            raise TypeError("path must be a str, not %s" % type(path).__name__)
        _check(_capi.lib.moe_session_save(self._handle(), path.encode()), "cannot save the session to '%s'" % path)

    def save_bytes(self):
        """The session as bytes (the format of Session.save), for Model.load_session_bytes."""
        s = self._handle()
        need = ctypes.c_size_t()
        st = _capi.lib.moe_session_save_buffer(s, None, 0, ctypes.byref(need))
        if st != _capi.ERR_LIMIT:
            _check(st, "save")
        buf = ctypes.create_string_buffer(need.value)
        _check(_capi.lib.moe_session_save_buffer(s, buf, need.value, ctypes.byref(need)), "save")
        return buf.raw[: need.value]

    def fork(self):
        """A copy that continues as this session would, sharing its KV blocks until the two diverge."""
        with self._model._lock:
            f = ctypes.c_void_p()
            _check(_capi.lib.moe_session_fork(self._handle(), ctypes.byref(f)), "cannot fork the session")
            return Session._adopt(self._model, f, None)

    def rewind(self, n_tokens):
        """Forgets the last n_tokens processed tokens (their logits too, until the next eval)."""
        _check(_capi.lib.moe_session_rewind(self._handle(), _int(n_tokens, "n_tokens", 0, (1 << 31) - 1)), "rewind")

    def shift(self, n_keep, n_discard):
        """Drops n_discard processed tokens after the first n_keep; the later ones move down, their keys
        rotated to their new positions (moe_session_shift)."""
        _check(_capi.lib.moe_session_shift(self._handle(), _int(n_keep, "n_keep", 0, (1 << 31) - 1),
                                           _int(n_discard, "n_discard", 0, (1 << 31) - 1)), "shift")

    def _generate(self, ids, max_tokens):
        """Pieces of text after feeding ids: the session samples, turns tokens into text (holding back
        what may begin a stop string), feeds each token, and ends at a stop or max_tokens."""
        self._feed_and_step(ids)
        tok, n, stop = ctypes.c_int32(), ctypes.c_size_t(), ctypes.c_int32()
        text = ctypes.c_void_p()
        stopped = False
        try:
            for i in range(max_tokens):
                _check(_capi.lib.moe_session_sample_text(self._handle(), ctypes.byref(tok), ctypes.byref(text),
                                                         ctypes.byref(n), ctypes.byref(stop)), "sample")
                piece = ctypes.string_at(text, n.value).decode("utf-8", "replace") if n.value else ""
                if piece:
                    yield piece
                if stop.value != _capi.STOP_NONE:
                    stopped = True
                    return
                if i + 1 == max_tokens:
                    break
                st = _capi.lib.moe_session_feed(self._handle(), ctypes.byref(tok), 1)
                if st == _capi.ERR_LIMIT_CONTEXT:  # the context is full: the text ends here
                    break
                _check(st, "feed")
                pending = ctypes.c_uint32(1)
                while pending.value > 0:
                    _check(_capi.lib.moe_ctx_step(self._model._handle(), ctypes.byref(pending)), "step")
            if not stopped:
                _check(_capi.lib.moe_session_text_end(self._handle(), ctypes.byref(text), ctypes.byref(n)), "text")
                if n.value:
                    yield ctypes.string_at(text, n.value).decode("utf-8", "replace")
        finally:
            self.close()
