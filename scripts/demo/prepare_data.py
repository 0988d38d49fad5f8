#!/usr/bin/env python3
"""Recreates the demo model's corpus, tokenizer and token arrays (nothing here is committed).

Source: Jane Austen's six novels, public domain, as shipped by the Debian package
r-cran-janeaustenr (`apt-get install -y r-cran-janeaustenr`). Its data are an R lazy-load
database, so they are dumped with Rscript (installed with the package) to plain text.

Splits (by novel position, before tokenization):
  test  : Persuasion, chapters 23-24 (the last two)        -- the held-out perplexity set
  val   : Northanger Abbey, chapters 30-31 (the last two)  -- early stopping / model selection
  train : everything else (the other four novels whole, the rest of those two)

Text: Project Gutenberg line wrapping is undone (a paragraph becomes one line, paragraphs are
separated by a blank line), `_emphasis_` underscores are dropped, runs of spaces become one.
Novels are separated by <|endoftext|> (id 0) in the token stream.

Tokenizer: byte-level BPE (HF `tokenizers`), Qwen2 pre-tokenizer (the exact tokenizer.json
form Strata recognises as "qwen2"), vocabulary 4096 including <|endoftext|>, trained on the
train split only.

Output (default out/demo/data, ignored by git): raw/*.txt, {train,val,test}.txt,
tokenizer.json, tokenizer_config.json, {train,val,test}.bin (uint16 token ids), meta.json.
Usage: python3 scripts/demo/prepare_data.py [--out out/demo/data] [--vocab 4096]
"""
import argparse, json, os, re, subprocess, sys

import numpy as np

NOVELS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma", "northangerabbey", "persuasion"]
TITLES = {"sensesensibility": "Sense and Sensibility", "prideprejudice": "Pride and Prejudice",
          "mansfieldpark": "Mansfield Park", "emma": "Emma", "northangerabbey": "Northanger Abbey",
          "persuasion": "Persuasion"}
HOLD = {"persuasion": ("test", 2), "northangerabbey": ("val", 2)}  # novel -> (split, last N chapters)
EOT = "<|endoftext|>"
# The Qwen2 split regex exactly as Strata's tokenizer.cc (kReQwen2) expects it.
QWEN2_RE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
CHAPTER = re.compile(r"^\s*chapter\s+([0-9]+|[ivxlc]+)\s*$", re.I)


def dump_raw(raw_dir):
    os.makedirs(raw_dir, exist_ok=True)
    if all(os.path.exists(os.path.join(raw_dir, n + ".txt")) for n in NOVELS):
        return
    r = "library(janeaustenr); for (n in c(%s)) writeLines(get(n), file.path('%s', paste0(n, '.txt')), useBytes=TRUE)" % (
        ",".join("'%s'" % n for n in NOVELS), raw_dir)
    try:
        subprocess.run(["Rscript", "-e", r], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit("prepare_data: Rscript could not dump janeaustenr (apt-get install -y r-cran-janeaustenr): %s" % e)


def paragraphs(lines):
    out, cur = [], []
    for ln in lines:
        if ln.strip():
            cur.append(ln.strip())
        elif cur:
            out.append(cur); cur = []
    if cur:
        out.append(cur)
    res = []
    for p in out:
        t = " ".join(p).replace("_", "")
        t = re.sub(r"[ \t]+", " ", t).strip()
        if t:
            res.append(t)
    return res


def split_novel(name, lines):
    """Returns (kept_lines, held_lines) where held is the last N chapters for held-out novels."""
    if name not in HOLD:
        return lines, []
    starts = [i for i, l in enumerate(lines) if CHAPTER.match(l)]
    n = HOLD[name][1]
    cut = starts[-n]
    return lines[:cut], lines[cut:]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out/demo/data")
    ap.add_argument("--vocab", type=int, default=4096)
    a = ap.parse_args()
    raw = os.path.join(a.out, "raw")
    dump_raw(raw)
    train_docs, held = [], {"val": [], "test": []}
    stats = {}
    for n in NOVELS:
        with open(os.path.join(raw, n + ".txt"), encoding="utf-8") as f:
            lines = f.read().split("\n")
        keep, hold = split_novel(n, lines)
        train_docs.append("\n\n".join(paragraphs(keep)))
        if hold:
            held[HOLD[n][0]].append("\n\n".join(paragraphs(hold)))
        stats[n] = {"lines": len(lines), "held_lines": len(hold)}
    texts = {"train": ("\n\n" + EOT).join(train_docs), "val": held["val"][0], "test": held["test"][0]}
    for k, v in texts.items():
        with open(os.path.join(a.out, k + ".txt"), "w", encoding="utf-8") as f:
            f.write(v)

    from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(train_docs, trainer=trainer)
    assert tok.token_to_id(EOT) == 0
    tok.save(os.path.join(a.out, "tokenizer.json"))
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": EOT,
                   "pad_token": EOT, "add_bos_token": False, "model_max_length": 2048}, f, indent=1)

    meta = {"vocab_size": tok.get_vocab_size(), "eot_id": 0, "novels": stats, "splits": {}}
    for k, v in texts.items():
        if k == "train":
            ids = []
            for i, d in enumerate(train_docs):
                if i:
                    ids.append(0)
                ids.extend(tok.encode(d).ids)
        else:
            ids = tok.encode(v).ids
        arr = np.asarray(ids, dtype=np.uint16)
        arr.tofile(os.path.join(a.out, k + ".bin"))
        meta["splits"][k] = {"chars": len(v), "words": len(v.split()), "tokens": int(arr.size)}
        # round trip check
        assert tok.decode(ids[:2000]) == (v[:len(tok.decode(ids[:2000]))]).replace(EOT, ""), k
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta["splits"], indent=1))


if __name__ == "__main__":
    main()
