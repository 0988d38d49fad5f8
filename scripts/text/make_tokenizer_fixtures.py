#!/usr/bin/env python3
# Oracle for tests/text/tokenizer_test.cc: trains small tokenizers with Hugging Face `tokenizers`, one
# per pre-tokenizer variant plus a SentencePiece-style BPE with byte fallback, saves each as
# tokenizer.json and as a GGUF (tokenizer.ggml.* keys), and records HF's ids for every string of
# tests/text/corpus.json. Deterministic for a given tokenizers version.
# Usage: /opt/torchenv/bin/python scripts/text/make_tokenizer_fixtures.py
import json
import os
import random

import gguf
import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
import tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "text", "fixtures")
CORPUS = json.load(open(os.path.join(ROOT, "tests", "text", "corpus.json"), encoding="utf-8"))

GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
O200K = (r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
         r"""|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"""
         r"""|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
DSV3 = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""]

ENGLISH = """The quick brown fox jumps over the lazy dog. It's a truth universally acknowledged that a
single man in possession of a good fortune must be in want of a wife. We'll see; they'd said they're
coming, but I'm not sure. Don't worry: you've done nothing wrong! Numbers like 2024, 3.14159 and
1,000,000 appear in text. def main(argv):\n    for i in range(10):\n        print(i * 2)\n
The tokenizer splits words, numbers and punctuation; whitespace   runs and\ttabs\r\nand newlines.
Machine learning models read tokens. Mixture of experts routes each token to a few experts.
Hello world, hello World, HELLO WORLD. camelCase PascalCase snake_case kebab-case SCREAMING_CASE.
Привет, как дела? Ελληνικά γράμματα. 你好，世界。我们今天学习中文。日本語の文章です。한국어 문장입니다.
مرحبا كيف حالك שלום מה שלומך नमस्ते आप कैसे हैं Ünïcödé café naïve jalapeño façade.
"""


def training_text():
    rng = random.Random(1234)
    lines = [l for l in ENGLISH.split("\n") if l] + [s for s in CORPUS if s]
    out = []
    for _ in range(40):
        rng.shuffle(lines)
        out.extend(lines)
    return out


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<think>", "</think>"]  # added, not special: always matched


def train_byte_level(pre_tok, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in USER_DEFINED])
    if ignore_merges:  # the trainer does not carry the flag through
        j = json.loads(tok.to_str())
        j["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(j))
    return tok


def split_seq(patterns):
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated") for p in patterns] +
        [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def train_spm():
    # Llama-2 style: normalizer prepends U+2581 and replaces spaces, no pre-tokenizer at encode
    # time, BPE with byte fallback; <0xXX> tokens live in the vocab but are not added tokens.
    byte_toks = ["<0x%02X>" % b for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="never", split=True)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2,
                                  special_tokens=["<unk>", "<s>", "</s>"] + byte_toks,
                                  limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = None
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] not in byte_toks]
    return Tokenizer.from_str(json.dumps(j))


def vocab_list(tok):
    v = tok.get_vocab(with_added_tokens=True)
    toks = [None] * (max(v.values()) + 1)
    for t, i in v.items():
        toks[i] = t
    assert all(t is not None for t in toks)
    return toks


def write_gguf(path, tok, model, pre, bos=None, eos=None, add_bos=None):
    j = json.loads(tok.to_str())
    toks = vocab_list(tok)
    added = {a["content"]: a for a in j["added_tokens"]}
    types = []
    for t in toks:
        if t in added:
            a = added[t]
            types.append((2 if t == "<unk>" else 3) if a["special"] else 4)
        elif model == "llama" and t.startswith("<0x") and len(t) == 6:
            types.append(6)
        else:
            types.append(1)
    merges = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(toks)
    w.add_token_types(types)
    if model == "llama":
        # sentencepiece semantics: a merged piece's score ranks it (higher merges first).
        rank = {}
        for r, m in enumerate(merges):
            a, b = m.split(" ")
            rank.setdefault(a + b, r)
        w.add_token_scores([float(-rank[t]) if t in rank else -1e9 for t in toks])
    # For llama too: with merges Strata reproduces HF's rank order exactly (scores only approximate
    # it for a BPE trained by HF rather than by sentencepiece); the tests also drop them.
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_tensor("dummy", np.zeros((1,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Random strings over characters chosen to stress the pre-tokenizers' edge cases: every letter
# category (Lu Ll Lt Lm Lo), marks, non-ASCII digits, punctuation vs symbols, the \s set,
# apostrophes and contraction letters, CJK and kana (DeepSeek-V3's split), '/', emoji, specials.
POOL = (list("aAsStTrReEvVmMlLdD'' /\r\n\t.,!?-_#{}()0123456789") +
        ["\u01c5", "\u02b0", "\u00aa", "\u0301", "\u0903", "\u0663", "\u00bd", "\u2167", "\u00a0", "\u3000",
         "\u2028", "\u000b", "\u0085", "\u4e2d", "\u6587", "\u3042", "\u30ab", "\u3400", "\u00e9", "\u00c9",
         "\u0416", "\u0436", "\u05d0", "\u0628", "\u20ac", "\u00a9", "\u2192", "\U0001F600", "\u200d",
         "\U0001F3FD", "\u00df", "\u017f", "\u212a", "\u0001", "\ufeff", "<|im_start|>", "<think>", "<s>"])


def random_strings(n, seed=7):
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 24))) for _ in range(n)]


def expected(tok):
    cases = []
    for s in CORPUS + random_strings(300):
        tok.encode_special_tokens = False
        with_special = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        plain = tok.encode(s, add_special_tokens=False).ids
        cases.append({"text": s, "ids_special": with_special, "ids_plain": plain})
    tok.encode_special_tokens = False
    return cases


def main():
    variants = [
        # name, tokenizer, ggml model, ggml pre, bos, eos, add_bos
        ("gpt2", train_byte_level(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)),
         "gpt2", "gpt-2", None, "<|endoftext|>", None),
        ("llama3", train_byte_level(split_seq([LLAMA3]), ignore_merges=True),
         "gpt2", "llama-bpe", "<|im_start|>", "<|endoftext|>", True),
        ("qwen2", train_byte_level(split_seq([QWEN2])), "gpt2", "qwen2", None, "<|im_end|>", False),
        ("deepseek_v3", train_byte_level(split_seq(DSV3)), "gpt2", "deepseek-v3", "<|im_start|>",
         "<|endoftext|>", True),
        ("gpt4o", train_byte_level(split_seq([O200K])), "gpt2", "gpt-4o", None, "<|endoftext|>", None),
        ("spm", train_spm(), "llama", None, "<s>", "</s>", True),
    ]
    index = []
    for name, tok, model, pre, bos, eos, add_bos in variants:
        d = os.path.join(OUT, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
        v = tok.get_vocab(with_added_tokens=True)
        cfg = {}
        if bos is not None:
            cfg["bos_token"] = bos
        if eos is not None:
            cfg["eos_token"] = eos
        if add_bos is not None:
            cfg["add_bos_token"] = add_bos
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=1)
        write_gguf(os.path.join(d, "tokenizer.gguf"), tok, model, pre,
                   v[bos] if bos else None, v[eos] if eos else None, add_bos)
        exp = {"tokenizers_version": tokenizers.__version__, "variant": name,
               "vocab_size": tok.get_vocab_size(with_added_tokens=True),
               "bos": v[bos] if bos else -1, "eos": v[eos] if eos else -1,
               "add_bos": bool(add_bos), "cases": expected(tok)}
        with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
            json.dump(exp, f, ensure_ascii=False, separators=(",", ":"))
        index.append(name)
        print(name, exp["vocab_size"], "tokens")


if __name__ == "__main__":
    main()
