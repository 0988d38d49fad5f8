#!/usr/bin/env python3
"""Writes the codec oracle fixtures tests/quant/fixtures/*.bin from the gguf Python package.

Each fixture pairs raw GGUF blocks with floats computed by gguf.quants (the reference Strata's CPU
codecs must match bit for bit). Deterministic (fixed seeds); rerun after changing it and commit the
.bin files. Needs numpy and gguf (python3 -m pip install gguf numpy).

File layout (little-endian):
  char magic[4] = "SQFX"; u32 version = 1; u32 type_id; u32 kind; u32 n_blocks;
  u32 block_elems; u32 block_bytes;
  u8 blocks[n_blocks * block_bytes]; f32 values[n_blocks * block_elems]
kind 0 (dequant_<TYPE>.bin): values = gguf.quants.dequantize(blocks), blocks are random payloads
  with chosen scale fields.
kind 1 (quant_<TYPE>.bin): blocks = gguf.quants.quantize(values), values are chosen floats.
"""
import argparse
import pathlib
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

MAGIC = b"SQFX"
VERSION = 1
KIND_DEQUANT = 0
KIND_QUANT = 1
N_BLOCKS = 64

# Byte offsets of the f16 scale fields ("d", "dmin"/"m") inside one block, per format.
F16_SCALE_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
    T.IQ2_XXS: [0], T.IQ2_XS: [0], T.IQ2_S: [0], T.IQ3_XXS: [0], T.IQ3_S: [0], T.IQ1_S: [0],
    T.IQ1_M: [],  # its f16 d lies in the top nibbles of its four u16 scales (set below)
    T.TQ1_0: [52], T.TQ2_0: [64],
}
DEQUANT_TYPES = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K,
                 T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4,
                 T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M, T.TQ1_0, T.TQ2_0]
QUANT_TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def write_fixture(path: pathlib.Path, qtype: T, kind: int, blocks: np.ndarray, values: np.ndarray):
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(-1)
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    n_blocks = blocks.size // block_bytes
    assert blocks.size == n_blocks * block_bytes and values.size == n_blocks * block_elems
    header = struct.pack("<4s6I", MAGIC, VERSION, int(qtype), kind, n_blocks, block_elems, block_bytes)
    path.write_bytes(header + blocks.tobytes() + values.astype("<f4").tobytes())


def f16_bits(x) -> np.uint16:
    return np.array(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def scale_halves(rng: np.random.Generator, kind: int) -> int:
    """One f16 bit pattern, never inf or NaN, from one of several regimes."""
    sign = 0x8000 if rng.random() < 0.3 else 0
    if kind == 0:    # ordinary magnitudes
        return int(f16_bits(abs(rng.normal(0.0, 0.05)) + 1e-4)) | sign
    if kind == 1:    # huge: products overflow float16 range but not float32
        return int(f16_bits(rng.choice([60000.0, 65504.0, 32768.0, 40000.0]))) | sign
    if kind == 2:    # subnormal halves
        return int(rng.integers(1, 0x400)) | sign
    if kind == 3:    # zeros
        return sign
    # any finite bit pattern
    while True:
        h = int(rng.integers(0, 0x10000))
        if (h & 0x7C00) != 0x7C00:
            return h


def dequant_blocks(qtype: T, rng: np.random.Generator) -> np.ndarray:
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    if qtype in (T.F32, T.F16, T.BF16):
        n = 2048
        if qtype == T.F32:
            v = rng.normal(0, 10, n).astype(np.float32)
            v[:16] = np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 1e-40, 3.4028235e38,
                               -3.4028235e38, 1.1754944e-38, 1.0, -1.0, 65504.0, 2**-24, 0.5, 7.0],
                              dtype=np.float32)
            return v.view(np.uint8)
        bits = rng.integers(0, 0x10000, n, dtype=np.uint32).astype(np.uint16)
        if qtype == T.F16:
            nan = (bits & 0x7C00) == 0x7C00
            bits[nan] &= np.uint16(0xFC00)   # NaN -> +-inf: fixtures stay NaN-free
            bits[:8] = [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00]
        else:
            nan = (bits & 0x7F80) == 0x7F80
            bits[nan] &= np.uint16(0xFF80)
            bits[:8] = [0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x7F7F, 0x7F80, 0xFF80]
        return bits.view(np.uint8)
    blocks = rng.integers(0, 256, (N_BLOCKS, block_bytes), dtype=np.uint16).astype(np.uint8)
    for i in range(N_BLOCKS):
        regime = i % 6
        if regime == 5:
            # all-equal payload bytes (every element of a sub-block decodes to the same code)
            blocks[i, :] = rng.choice([0x00, 0xFF, 0x88, 0x55])
            regime = 0
        if qtype == T.MXFP4:
            blocks[i, 0] = [rng.integers(100, 150), rng.choice([253, 254, 255]), rng.choice([0, 1, 2]),
                            127, rng.integers(0, 256)][regime % 5]
            continue
        for off in F16_SCALE_FIELDS[qtype]:
            h = scale_halves(rng, regime)
            blocks[i, off:off + 2] = np.array([h], dtype=np.uint16).view(np.uint8)
        if qtype == T.IQ1_M:
            h = scale_halves(rng, regime)
            sc = blocks[i, 48:56].copy().view(np.uint16)
            for k in range(4):
                sc[k] = (int(sc[k]) & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12)
            blocks[i, 48:56] = sc.view(np.uint8)
    return blocks


def quant_values(qtype: T, rng: np.random.Generator) -> np.ndarray:
    block_elems, _ = GGML_QUANT_SIZES[qtype]
    n_blocks = N_BLOCKS if block_elems > 1 else 2048 // 32
    x = rng.normal(0, 1, (n_blocks, 32)).astype(np.float32)
    for i in range(n_blocks):
        regime = i % 8
        if regime == 1:
            x[i] *= np.float32(10.0 ** rng.uniform(-6, 4))     # wide range of block scales
        elif regime == 2:
            x[i] = 0.0                                          # d == 0 path
        elif regime == 3:
            x[i] = np.float32(rng.normal())                     # all-equal block
        elif regime == 4:
            x[i, rng.integers(0, 32)] = np.float32(rng.choice([-1, 1]) * 1e3)   # one outlier
        elif regime == 5:
            # values on the rounding grid of the block maximum (ties for round-half-away)
            x[i] = (rng.integers(-254, 255, 32) / 2.0).astype(np.float32)
            x[i, 0] = 127.0
        elif regime == 6:
            # tiny but normal: d = amax / 127 must stay normal, else 1 / d is inf and gguf's
            # result depends on how the platform casts NaN to integers
            x[i] *= np.float32(1e-30)
        elif regime == 7:
            x[i] *= np.float32(3e4)                             # scales near f16 overflow
    if qtype == T.F16:
        x[0, :8] = [65504.0, 65519.996, 65520.0, 2**-25, 2**-25 * 1.0000001, -(2**-24) * 1.5,
                    1.0 + 2**-11, 1.0 + 3 * 2**-11]
    if qtype == T.BF16:
        x[0, :4] = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00008000],
                            dtype=np.uint32).view(np.float32)
    return x.reshape(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parents[2] / "tests/quant/fixtures"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for qtype in DEQUANT_TYPES:
        rng = np.random.default_rng(1000 + int(qtype))
        blocks = dequant_blocks(qtype, rng)
        values = gguf.quants.dequantize(blocks, qtype)
        write_fixture(out / f"dequant_{qtype.name}.bin", qtype, KIND_DEQUANT, blocks, values)
    for qtype in QUANT_TYPES:
        rng = np.random.default_rng(2000 + int(qtype))
        values = quant_values(qtype, rng)
        with np.errstate(over="ignore"):
            blocks = gguf.quants.quantize(values, qtype)
        write_fixture(out / f"quant_{qtype.name}.bin", qtype, KIND_QUANT, blocks.view(np.uint8), values)
    total = sum(p.stat().st_size for p in out.glob("*.bin"))
    print(f"wrote {len(DEQUANT_TYPES) + len(QUANT_TYPES)} fixtures, {total} bytes, to {out}")


if __name__ == "__main__":
    main()
