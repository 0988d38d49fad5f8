#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

gguf, safetensors: small valid files and a few malformed ones, each under 4 KiB, built here byte by
byte. The other targets start from the project's own real files, plus a few hand-made edge cases:
  hf_config      the golden checkpoints' config.json files (tests/golden/*/hf)
  tokenizer      each tokenizer fixture's tokenizer.json, NUL, tokenizer_config.json, NUL, a text
  chat_template  a selector byte, then NUL-separated: each template's Jinja source (its fixture, and
                 the Jinja engine's fixture templates and snippets), then
                 role / content pairs of a fixture conversation and of the injection cases
  hotlist        two bytes (the demo model's layers - 1 and experts - 1), then its hotlist
  imatrix        importance matrices in llama.cpp's GGUF and .dat layouts, built here
  http_body      a byte choosing the route (odd: chat), then a request body: OpenAI's documented
                 shapes, every field the server checks, and hostile ones (a prompt nested 100,000
                 deep, whose echo in an error once recursed past the stack)
  snapshot       sessions of the demo model saved by the CLI (needs --strata PATH/TO/strata; without
                 it the snapshot corpus is left as it is)
Usage: tests/fuzz/make_corpus.py [--strata build/examples/strata]"""
import glob
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DEMO = os.path.join(ROOT, "examples", "models", "austen-moe-q4_k.gguf")

# GGUF value types and ggml tensor types used below.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
T_F32, T_F16, T_Q8_0, T_Q4_K, T_BF16 = 0, 1, 8, 12, 30
BLOCK = {T_F32: (1, 4), T_F16: (1, 2), T_Q8_0: (32, 34), T_Q4_K: (256, 144), T_BF16: (1, 2)}


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload


def arr(etype, items, fmt=None):
    out = struct.pack("<IQ", etype, len(items))
    for x in items:
        out += gstr(x) if etype == STR else struct.pack(fmt, x)
    return out


def gguf(kvs, tensors, version=3, alignment=32, magic=b"GGUF", n_kv=None, n_tensors=None,
         cut=None):
    """tensors: (name, dims, type[, offset]); offsets default to packed and aligned."""
    h = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                            len(kvs) if n_kv is None else n_kv)
    h += b"".join(kvs)
    nxt = 0
    for t in tensors:
        name, dims, ttype = t[:3]
        off = t[3] if len(t) > 3 else nxt
        be, bb = BLOCK.get(ttype, (1, 1))
        nbytes = dims[0] // be * bb
        for d in dims[1:]:
            nbytes *= d
        nxt = max(nxt, (off + nbytes + alignment - 1) // alignment * alignment)
        h += gstr(name) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims)
        h += struct.pack("<IQ", ttype, off)
    h += b"\0" * (-len(h) % alignment)
    data = bytes((i * 7 + 1) & 0xff for i in range(nxt))
    out = h + data
    return out if cut is None else out[:cut]


def safetensors(entries, data_len, metadata=None, raw_header=None):
    if raw_header is None:
        hdr = {}
        if metadata is not None:
            hdr["__metadata__"] = metadata
        for name, dtype, shape, begin, end in entries:
            hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
        raw_header = json.dumps(hdr, separators=(",", ":"))
    hb = raw_header.encode()
    return struct.pack("<Q", len(hb)) + hb + bytes((i * 13 + 5) & 0xff for i in range(data_len))


def gguf_corpus():
    base_kvs = [
        kv("general.architecture", STR, gstr("qwen3moe")),
        kv("qwen3moe.block_count", U32, struct.pack("<I", 2)),
        kv("qwen3moe.rope.freq_base", F32, struct.pack("<f", 10000.0)),
        kv("general.flag", BOOL, b"\x01"),
        kv("test.i64", I64, struct.pack("<q", -3)),
        kv("tokenizer.ggml.tokens", ARR, arr(STR, ["<s>", "a", "bc"])),
        kv("tokenizer.ggml.scores", ARR, arr(F32, [0.0, -1.0, -2.5], "<f")),
        kv("tokenizer.ggml.token_type", ARR, arr(I32, [3, 1, 1], "<i")),
    ]
    base_tensors = [("token_embd.weight", [32, 3], T_F32),
                    ("blk.0.ffn_up_exps.weight", [64, 2, 4], T_Q8_0),
                    ("output_norm.weight", [32], T_F16)]
    valid = gguf(base_kvs, base_tensors)
    yield "valid_v3", valid
    yield "valid_v2_align64", gguf(
        base_kvs[:3] + [kv("general.alignment", U32, struct.pack("<I", 64))],
        [("a", [256, 1], T_Q4_K), ("b", [8], T_BF16)], version=2, alignment=64)
    yield "empty_v3", gguf([], [])
    yield "truncated_header", valid[:100]
    yield "truncated_data", valid[:-40]
    yield "bad_magic", gguf([], [], magic=b"GGML")
    yield "version1", gguf([], [], version=1)
    yield "huge_kv_count", gguf(base_kvs[:1], [], n_kv=1 << 40)
    yield "nested_array", gguf([kv("x", ARR, struct.pack("<IQ", ARR, 1) + arr(U8, [1], "<B"))], [])
    yield "bad_value_type", gguf([kv("x", 13, b"\0" * 8)], [])
    yield "duplicate_key", gguf([base_kvs[0], base_kvs[0]], [])
    yield "alignment_3", gguf([kv("general.alignment", U32, struct.pack("<I", 3))], [])
    yield "q8_row_48", gguf([], [("w", [48], T_Q8_0, 0)])
    yield "overlap", gguf([], [("a", [16], T_F32, 0), ("b", [16], T_F32, 32)])
    yield "misaligned", gguf([], [("a", [4], T_F32, 0), ("b", [4], T_F32, 16)])
    yield "dims_5", gguf([], [("a", [1, 1, 1, 1, 1], T_F32, 0)])


def safetensors_corpus():
    yield "valid", safetensors([("model.embed_tokens.weight", "F32", [2, 3], 0, 24),
                                ("model.norm.weight", "BF16", [4], 24, 32),
                                ("lm_head.weight", "F16", [2, 2], 32, 40)], 40, {"format": "pt"})
    yield "valid_all_dtypes", safetensors([("a", "F64", [1], 0, 8), ("b", "I64", [1], 8, 16),
                                           ("c", "I32", [1], 16, 20), ("d", "I16", [1], 20, 22),
                                           ("e", "I8", [1], 22, 23), ("f", "U8", [1], 23, 24),
                                           ("g", "BOOL", [1], 24, 25),
                                           ("h", "F8_E4M3", [1], 25, 26),
                                           ("i", "F8_E5M2", [1], 26, 27)], 27)
    yield "empty", safetensors([], 0)
    yield "scalar_and_zero", safetensors([("s", "F32", [], 0, 4), ("z", "F32", [0, 3], 4, 4)], 4)
    yield "not_json", safetensors(None, 4, raw_header='{"w": nope}')
    yield "array", safetensors(None, 0, raw_header="[1,2]")
    yield "duplicate", safetensors(None, 8, raw_header=(
        '{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
        '"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'))
    yield "bad_dtype", safetensors([("w", "F17", [1], 0, 4)], 4)
    yield "negative_shape", safetensors([("w", "F32", [-1], 0, 4)], 4)
    yield "gap", safetensors([("a", "F32", [1], 0, 4), ("b", "F32", [1], 8, 12)], 12)
    yield "overlap", safetensors([("a", "F32", [2], 0, 8), ("b", "F32", [2], 4, 12)], 12)
    yield "past_end", safetensors([("a", "F32", [4], 0, 16)], 8)
    yield "header_past_end", struct.pack("<Q", 1000) + b"{}"


def read(path):
    with open(path, "rb") as f:
        return f.read()


def hf_config_corpus():
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "golden", "*", "hf", "config.json"))):
        yield path.split(os.sep)[-3], read(path)
    base = json.loads(read(os.path.join(ROOT, "tests", "golden", "qwen3moe_f32", "hf", "config.json")))
    def variant(**changes):
        c = dict(base)
        c.update(changes)
        return json.dumps(c).encode()
    yield "huge_layers", variant(num_hidden_layers=1 << 40)
    yield "negative_heads", variant(num_attention_heads=-8)
    yield "float_experts", variant(num_experts=8.5)
    yield "string_theta", variant(rope_theta="1e4")
    yield "yarn_absurd", variant(rope_scaling={"rope_type": "yarn", "factor": 1e308})
    yield "nested_deep", b'{"model_type":' + b"[" * 200 + b"]" * 200 + b"}"
    yield "not_object", b"[1, 2, 3]"
    yield "duplicate_keys", b'{"model_type": "qwen3_moe", "model_type": "mixtral"}'


def tokenizer_corpus():
    probe = "Hello, world! <|im_end|> caf\u00e9 \u4f60\u597d \U0001F642\n\t  x".encode()
    for d in sorted(glob.glob(os.path.join(ROOT, "tests", "text", "fixtures", "*", "tokenizer.json"))):
        d = os.path.dirname(d)
        cfg = os.path.join(d, "tokenizer_config.json")
        yield os.path.basename(d), read(os.path.join(d, "tokenizer.json")) + b"\0" + (
            read(cfg) if os.path.exists(cfg) else b"") + b"\0" + probe
    small = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
             "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}}
    yield "small_bpe", json.dumps(small).encode() + b"\0\0ab ba"
    yield "small_bpe_config", json.dumps(small).encode() + b'\0{"bos_token": "a", "add_bos_token": true}\0ab'
    yield "wordpiece", b'{"model":{"type":"WordPiece","vocab":{"a":0}}}'
    yield "vocab_not_int", b'{"model":{"type":"BPE","vocab":{"a":"zero"}},"pre_tokenizer":{"type":"ByteLevel"}}'


def chat_template_corpus():
    fx = json.loads(read(os.path.join(ROOT, "tests", "text", "fixtures", "templates", "expected.json")))
    inj = json.loads(read(os.path.join(ROOT, "tests", "text", "fixtures", "templates", "injection.json")))
    names = list(fx["templates"].keys())
    def entry(selector, jinja, messages, add_generation_prompt):
        out = bytes([selector | (0x80 if add_generation_prompt else 0)]) + jinja.encode()
        for m in messages:
            out += b"\0" + m["role"].encode() + b"\0" + m["content"].encode()
        return out
    seen = set()
    for case in fx["cases"]:
        name = case["template"]
        if name in seen:
            continue
        seen.add(name)
        yield "fixture_" + name, entry(names.index(name), fx["templates"][name]["jinja"], case["messages"],
                                        case["add_generation_prompt"])
    for k, case in enumerate(inj["cases"][:6]):
        yield "injection_%d" % k, entry(names.index(case["template"]) if case["template"] in names else 0, "",
                                        case["messages"], case["add_generation_prompt"])
    for k, (label, jinja) in enumerate(sorted(fx["unrecognised"].items())[:3]):
        yield "unrecognised_%d" % k, entry(k, jinja, [{"role": "user", "content": "hi"}], True)
    yield "bad_role", entry(0, "", [{"role": "tool", "content": "x"}], False)
    # The Jinja engine: the model templates of its fixtures, and its small behaviour templates.
    jdir = os.path.join(ROOT, "tests", "text", "fixtures", "jinja")
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi <|im_end|>"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nhello"}, {"role": "user", "content": "again"}]
    for fn in sorted(glob.glob(os.path.join(jdir, "templates", "*.jinja"))):
        yield "jinja_" + os.path.basename(fn)[:-len(".jinja")], entry(0, read(fn).decode(), conv, True)
    jx = json.loads(read(os.path.join(jdir, "expected.json")))
    for k, snippet in enumerate(jx["snippets"]):
        yield "jinja_snippet_%02d" % k, entry(0, snippet["source"], [{"role": "user", "content": "hi"}], False)


def hotlist_corpus():
    # The demo model: 4 layers, 16 experts.
    text = read(os.path.join(ROOT, "examples", "models", "austen-moe.hotlist"))
    yield "demo", bytes([3, 15]) + text
    yield "out_of_range", bytes([3, 15]) + b"4 0 10\n"
    yield "twice", bytes([3, 15]) + b"1 2 3\n1 2 9\n"
    yield "signs_and_junk", bytes([3, 15]) + b"+1 2 3\n-1 2 3\n1 2\n1 2 3 4\n# only a comment\n\n"


def imatrix_corpus():
    """llama.cpp's importance-matrix files: GGUF (sums and counts per tensor) and the older .dat."""
    meta = [kv("general.type", STR, gstr("imatrix")), kv("imatrix.datasets", ARR, arr(STR, ["train.txt"])),
            kv("imatrix.chunk_count", U32, struct.pack("<I", 3)), kv("imatrix.chunk_size", U32, struct.pack("<I", 512))]

    def with_floats(blob, floats):
        # The data section (the last len(floats) * 4 bytes, tensors packed 32-aligned) set to floats.
        return blob[:len(blob) - 4 * len(floats)] + struct.pack("<%df" % len(floats), *floats)
    dense = [("blk.0.attn_q.weight.in_sum2", [8, 1], T_F32), ("blk.0.attn_q.weight.counts", [1, 1], T_F32, 32)]
    yield "dense.gguf", with_floats(gguf(meta, dense), [1.5, 2, 0, 4, 8, 16, 0.25, 3, 512] + [0] * 7)
    experts = [("blk.1.ffn_down_exps.weight.in_sum2", [4, 3], T_F32),
               ("blk.1.ffn_down_exps.weight.counts", [1, 3], T_F32, 64)]
    sums = [0.5 * i for i in range(12)]
    yield "experts.gguf", with_floats(gguf(meta, experts), sums + [0] * 4 + [7, 0, 30] + [0] * 5)
    yield "sums_only.gguf", gguf(meta, dense[:1])
    yield "no_metadata.gguf", gguf([], dense)
    yield "counts_not_dividing.gguf", gguf(meta, [("x.in_sum2", [5], T_F32), ("x.counts", [2], T_F32, 32)])
    name = b"blk.3.ffn_up.weight"
    dat = struct.pack("<i", 1) + struct.pack("<i", len(name)) + name + struct.pack("<ii", 10, 4)
    dat += struct.pack("<4f", 20, 0.5, 3, 100)
    yield "legacy.dat", dat + struct.pack("<ii", 10, 5) + b"x.txt"
    yield "legacy_bare.dat", dat
    yield "legacy_lies.dat", struct.pack("<iii", 1, 1 << 30, 0)


def http_body_corpus():
    def body(chat, obj):
        return bytes([1 if chat else 0]) + (obj if isinstance(obj, bytes) else json.dumps(obj).encode())
    yield "completion", body(False, {"model": "austen-moe-q4_k", "prompt": "It is a truth", "max_tokens": 8,
                                     "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["\n", "."]})
    yield "completion_ids", body(False, {"prompt": [[1, 2, 3], [4, 5]], "n": 2, "logprobs": 2, "stream": True,
                                         "stream_options": {"include_usage": True}})
    yield "chat", body(True, {"messages": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Hello<|im_end|>"}],
                              "max_completion_tokens": 5, "logprobs": True, "top_logprobs": 3,
                              "frequency_penalty": 0.5, "presence_penalty": -0.5, "top_k": 20, "min_p": 0.1})
    yield "chat_parts", body(True, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    yield "refused_fields", body(True, {"messages": [], "tools": [], "logit_bias": {"1": 2}, "n": 129})
    yield "wrong_types", body(False, {"prompt": 5, "max_tokens": "8", "temperature": None, "stop": [1]})
    yield "not_object", body(False, b"[1, 2]")
    yield "bad_utf8", body(True, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}')
    deep = 100000
    yield "deep_prompt", body(False, b'{"prompt": [1, ' + b"[" * deep + b"]" * deep + b"]}")


def snapshot_corpus(strata):
    """Sessions of the demo model saved by the CLI: none processed yet, a few tokens, a prompt."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in (("queued_only", ["--tokens", "7", "-n", "0"]),
                           ("three_tokens", ["--tokens", "7,8,9", "-n", "1"]),
                           ("prompt", ["--prompt", "It is a truth", "-n", "2"])):
            path = os.path.join(tmp, name)
            subprocess.run([strata, "run", "--model", DEMO, "--temp", "0", "--save-session", path] + args,
                           check=True, stdout=subprocess.DEVNULL)
            yield name, read(path)


def write_corpus(kind, items, ext):
    d = os.path.join(HERE, "corpus", kind)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    for name, data in items:
        with open(os.path.join(d, name + ext), "wb") as f:
            f.write(data)


def main():
    strata = None
    if len(sys.argv) == 3 and sys.argv[1] == "--strata":
        strata = sys.argv[2]
    elif len(sys.argv) != 1:
        sys.exit(__doc__)
    for kind, gen in (("gguf", gguf_corpus), ("safetensors", safetensors_corpus)):
        items = list(gen())
        for name, data in items:
            assert len(data) < 4096, (name, len(data))
        write_corpus(kind, items, "." + kind)
    write_corpus("hf_config", hf_config_corpus(), ".json")
    write_corpus("tokenizer", tokenizer_corpus(), "")
    write_corpus("chat_template", chat_template_corpus(), "")
    write_corpus("hotlist", hotlist_corpus(), "")
    write_corpus("imatrix", imatrix_corpus(), "")
    write_corpus("http_body", http_body_corpus(), "")
    if strata is not None:
        write_corpus("snapshot", list(snapshot_corpus(strata)), ".session")


if __name__ == "__main__":
    main()
