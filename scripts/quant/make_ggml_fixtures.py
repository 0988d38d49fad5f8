#!/usr/bin/env python3
"""Writes tests/quant/fixtures/ggml_*.bin: quantized bytes from ggml itself, with and without
importance weights, for the quantizers Strata must reproduce byte for byte (every type ggml can
quantize except the float ones, the lattice i-quants included).

The oracle is ggml's public C API, `ggml_quantize_chunk(type, src, dst, start, nrows, n_per_row,
imatrix)`, called through ctypes on a libggml-base.so given on the command line. This script builds
nothing. The library the committed fixtures came from was built from the PyPI source distribution of
llama-cpp-python 0.3.36 (its vendor/llama.cpp), for the CPU only and without native tuning, so the C
quantizers are compiled with the distribution's own flags (Release, no -ffast-math, no -march):

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36
    cmake -S vendor/llama.cpp -B /tmp/ggml-build -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \\
        -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_CURL=OFF
    cmake --build /tmp/ggml-build --target ggml -j2
    python3 scripts/quant/make_ggml_fixtures.py /tmp/ggml-build/bin/libggml-base.so

Needs numpy and gguf (build/venv from cmake/install_deps.sh has both). Deterministic (fixed seeds):
rerun after changing it and commit the .bin files.

Inputs (ggml_inputs.bin), little-endian:
  char magic[4] = "SQGI"; u32 version = 1; u32 n_cases;
  per case: char name[24] (NUL-padded); u32 n_rows; u32 n_per_row;
            f32 x[n_rows * n_per_row]; f32 weights[n_per_row]   (the imatrix: one weight per column)
Expected bytes (ggml_<TYPE>.bin), per type:
  char magic[4] = "SQGQ"; u32 version = 1; u32 type_id; u32 n_cases; u32 block_elems; u32 block_bytes;
  per case (same order as the inputs): u32 n_rows; u32 n_per_row;
            u8 plain[n_rows * row_bytes]      ggml_quantize_chunk(..., imatrix = NULL); absent
                                              (no bytes) for the types ggml refuses to quantize
                                              without weights (ggml_quantize_requires_imatrix:
                                              IQ2_XXS, IQ2_XS, IQ1_S)
            u8 weighted[n_rows * row_bytes]   ggml_quantize_chunk(..., imatrix = weights)
"""
import argparse
import ctypes
import pathlib
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

VERSION = 1
ROOT = pathlib.Path(__file__).resolve().parents[2]
DEMO_MODEL = ROOT / "examples/models/austen-moe-q4_k.gguf"

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
         T.IQ4_NL, T.IQ4_XS, T.TQ1_0, T.TQ2_0, T.MXFP4,
         T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]


def load_ggml(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.restype = None
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
    lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
    return lib


def quantize(lib, qtype: T, x: np.ndarray, weights) -> bytes:
    n_rows, n_per_row = x.shape
    row_bytes = lib.ggml_row_size(int(qtype), n_per_row)
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    assert row_bytes == n_per_row // block_elems * block_bytes
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.full(n_rows * row_bytes, 0xA5, dtype=np.uint8)
    w_ptr = None
    if weights is not None:
        weights = np.ascontiguousarray(weights, dtype=np.float32)
        w_ptr = weights.ctypes.data
    lib.ggml_quantize_init(int(qtype))
    got = lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0, n_rows, n_per_row, w_ptr)
    assert got == n_rows * row_bytes, (qtype.name, got)
    return out.tobytes()


def demo_rows(rng: np.random.Generator):
    """Real rows, (name, rows) per tensor: weights of the bundled demo model, dequantized by gguf (F32
    router, Q8_0 attention and embedding, Q4_K experts)."""
    reader = gguf.GGUFReader(str(DEMO_MODEL))
    by_name = {t.name: t for t in reader.tensors}
    picks = [("blk.0.ffn_gate_inp.weight", 2), ("blk.1.attn_q.weight", 2), ("token_embd.weight", 2),
             ("blk.2.ffn_down.3.weight", 2), ("blk.0.ffn_gate.0.weight", 1)]
    rows = []
    for name, count in picks:
        t = by_name[name]
        n_per_row = int(t.shape[0])
        data = np.asarray(t.data)
        if t.tensor_type == T.F32:
            vals = data.astype(np.float32).reshape(-1, n_per_row)
        else:
            vals = gguf.quants.dequantize(data, t.tensor_type).astype(np.float32).reshape(-1, n_per_row)
        idx = rng.choice(vals.shape[0], size=count, replace=False)
        rows.append((name, vals[np.sort(idx)]))
    return rows


def imatrix_like(rng: np.random.Generator, n: int) -> np.ndarray:
    """Positive per-column weights shaped like an imatrix (mean squared activations): log-normal,
    a few columns far heavier than the rest."""
    w = np.exp(rng.normal(0.0, 1.0, n)).astype(np.float32)
    hot = rng.choice(n, size=max(1, n // 64), replace=False)
    w[hot] *= np.float32(30.0)
    return w


def make_cases():
    rng = np.random.default_rng(4900)
    cases = []

    def add(name, x):
        x = np.asarray(x, dtype=np.float32)
        cases.append((name, x, imatrix_like(rng, x.shape[1])))

    add("gauss", rng.normal(0.0, 1.0, (2, 512)))
    add("gauss_wide_row", rng.normal(0.0, 0.02, (1, 4096)))
    add("heavy_tailed", rng.standard_t(2.0, (2, 512)) * 0.05)
    out = rng.normal(0.0, 0.1, (2, 512))
    for r in range(out.shape[0]):
        spots = rng.choice(512, size=6, replace=False)
        out[r, spots] = rng.choice([-1.0, 1.0], size=6) * rng.uniform(5.0, 40.0, size=6)
    add("outliers", out)
    add("all_equal", np.array([[0.3125] * 256, [-1.75] * 256]))
    add("all_positive", np.abs(rng.normal(0.0, 1.0, (1, 512))) + 0.5)
    mixed = rng.normal(0.0, 1.0, (1, 1024))
    for b in range(0, 1024, 32):   # every 32-element block its own magnitude, one block all zero
        mixed[0, b:b + 32] *= 10.0 ** rng.uniform(-4.0, 3.0)
    mixed[0, 288:320] = 0.0
    add("mixed_scales", mixed)
    add("tiny", rng.normal(0.0, 1.0, (2, 256)) * 1e-7)
    add("tinier", rng.normal(0.0, 1.0, (1, 256)) * 1e-12)
    for name, rows in demo_rows(rng):
        add(name.replace(".weight", ""), rows)
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("libggml", help="path of libggml-base.so (or libggml.so) built as described above")
    ap.add_argument("--out", default=str(ROOT / "tests/quant/fixtures"))
    args = ap.parse_args()
    lib = load_ggml(args.libggml)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = make_cases()

    blob = bytearray(struct.pack("<4s2I", b"SQGI", VERSION, len(cases)))
    for name, x, w in cases:
        blob += struct.pack("<24s2I", name.encode(), x.shape[0], x.shape[1])
        blob += x.astype("<f4").tobytes() + w.astype("<f4").tobytes()
    (out / "ggml_inputs.bin").write_bytes(bytes(blob))
    total = len(blob)

    for qtype in TYPES:
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        blob = bytearray(struct.pack("<4s5I", b"SQGQ", VERSION, int(qtype), len(cases), block_elems, block_bytes))
        needs_weights = lib.ggml_quantize_requires_imatrix(int(qtype))
        for _, x, w in cases:
            blob += struct.pack("<2I", x.shape[0], x.shape[1])
            if not needs_weights:   # ggml aborts on these without weights
                blob += quantize(lib, qtype, x, None)
            blob += quantize(lib, qtype, x, w)
        (out / f"ggml_{qtype.name}.bin").write_bytes(bytes(blob))
        total += len(blob)
    print(f"wrote {len(TYPES) + 1} fixtures, {total} bytes, to {out}")


if __name__ == "__main__":
    main()
