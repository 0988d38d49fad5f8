#!/usr/bin/env python3
"""Copies a GGUF, adding llama.cpp's tokenizer.ggml.* keys built from a Hugging Face tokenizer.json.

Needed because `strata pack` from a Hugging Face directory writes no tokenizer metadata yet. The
demo build runs it on an intermediate float32 GGUF (`strata pack HF F32.gguf --experts f32
--attention f32`) and then packs that GGUF again to q4_k / q8_0: `strata pack` from a GGUF input
copies every metadata key (tokenizer.* included) and quantizes from the same float values, so
the final file is Strata's own writer's output (4 KiB-aligned experts, strata.pack.* keys).

Only byte-level BPE tokenizer.json files (model BPE, ByteLevel decoder) are handled; --pre names
llama.cpp's pre-tokenizer (the demo tokenizer uses the Qwen2 split regex: "qwen2").
Usage: gguf_add_tokenizer.py IN.gguf TOKENIZER_DIR OUT.gguf [--pre qwen2] [--name NAME]
"""
import argparse, json, os

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("inp"); ap.add_argument("tokdir"); ap.add_argument("out")
    ap.add_argument("--pre", default="qwen2")
    ap.add_argument("--name", default="")
    a = ap.parse_args()
    import gguf
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    tj = json.load(open(os.path.join(a.tokdir, "tokenizer.json"), encoding="utf-8"))
    cfg_path = os.path.join(a.tokdir, "tokenizer_config.json")
    tc = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    m = tj["model"]
    assert m["type"] == "BPE" and tj["decoder"]["type"] == "ByteLevel", "byte-level BPE only"
    vocab = dict(m["vocab"])
    special = set()
    for t in tj.get("added_tokens", []):
        vocab[t["content"]] = t["id"]
        if t.get("special"):
            special.add(t["id"])
    n = max(vocab.values()) + 1
    tokens = [""] * n
    for s, i in vocab.items():
        tokens[i] = s
    assert all(tokens), "vocabulary ids are not dense"
    types = [int(gguf.TokenType.CONTROL) if i in special else int(gguf.TokenType.NORMAL) for i in range(n)]
    merges = [" ".join(x) if isinstance(x, list) else x for x in m["merges"]]

    def tok_id(key):
        v = tc.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return vocab.get(v) if v else None

    r = GGUFReader(a.inp)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(a.out, arch)
    skip = {"general.architecture", "general.alignment"}
    for key, f in r.fields.items():
        if key.startswith(("GGUF.", "tokenizer.", "strata.pack.")) or key in skip:  # pack rewrites strata.pack.*
            continue
        vt = f.types[0]
        val = f.contents()
        if key == "general.name" and a.name:
            val = a.name
        if vt == GGUFValueType.ARRAY:
            w.add_key_value(key, val, vt, sub_type=f.types[-1] if len(f.types) > 1 else None)
        else:
            w.add_key_value(key, val, vt)
    if a.name and "general.name" not in r.fields:
        w.add_name(a.name)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(a.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = tok_id("eos_token")
    bos = tok_id("bos_token")
    pad = tok_id("pad_token")
    if eos is not None:
        w.add_eos_token_id(eos)
    w.add_bos_token_id(bos if bos is not None else (eos if eos is not None else 0))
    if pad is not None:
        w.add_pad_token_id(pad)
    w.add_add_bos_token(bool(tc.get("add_bos_token", False)))
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]  # numpy order (outermost first)
        data = np.asarray(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            w.add_tensor(t.name, data.reshape(shape).astype(np.float32))
        else:
            w.add_tensor(t.name, data, raw_shape=shape, raw_dtype=t.tensor_type)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    print("wrote %s: %d tokens, %d merges, pre %s, eos %s" % (a.out, n, len(merges), a.pre, eos))


if __name__ == "__main__":
    main()
