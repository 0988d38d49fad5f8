#!/usr/bin/env python3
"""Writes tests/quant/fixtures/kv_rows.bin: KV cache rows and their f16 and q8_0 bytes as the gguf
Python package quantizes them (the oracle for Strata's KV cache types, tests/model/kv_types_test.cc).

Deterministic (fixed seed); rerun after changing it and commit the .bin file. Needs numpy and gguf
(python3 -m pip install gguf numpy).

File layout (little-endian):
  char magic[4] = "SKVF"; u32 version = 1; u32 n_rows; u32 width;
  f32 rows[n_rows * width]
  u8 f16[n_rows * width * 2]           gguf.quants.quantize(rows, F16)
  u8 q8_0[n_rows * width / 32 * 34]    gguf.quants.quantize(rows, Q8_0)
The rows look like keys and values: per-row scales over four decades, a few outliers, exact zeros
in one row, and values on q8_0's rounding ties.
"""
import argparse
import pathlib
import struct

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

N_ROWS = 160  # more than one 128-position KV block
WIDTH = 128


def make_rows(rng: np.random.Generator) -> np.ndarray:
    rows = rng.standard_normal((N_ROWS, WIDTH)).astype(np.float32)
    rows *= (10.0 ** rng.uniform(-2, 2, size=(N_ROWS, 1))).astype(np.float32)
    outliers = rng.integers(0, N_ROWS * WIDTH, size=40)
    rows.reshape(-1)[outliers] *= 30
    rows[7, :] = 0
    # Ties of q8_0's rounding: in a block whose amax is 127, x * (1/d) lands on k + 0.5.
    rows[11, :32] = np.arange(32, dtype=np.float32) + 0.5
    rows[11, 31] = 127
    return rows.astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parents[2] / "tests/quant/fixtures"))
    args = ap.parse_args()
    rows = make_rows(np.random.default_rng(20261202))
    f16 = np.asarray(gguf.quants.quantize(rows, T.F16)).view(np.uint8).reshape(-1)
    q8 = np.asarray(gguf.quants.quantize(rows, T.Q8_0)).view(np.uint8).reshape(-1)
    assert f16.size == N_ROWS * WIDTH * 2 and q8.size == N_ROWS * WIDTH // 32 * 34
    path = pathlib.Path(args.out) / "kv_rows.bin"
    with open(path, "wb") as f:
        f.write(b"SKVF" + struct.pack("<III", 1, N_ROWS, WIDTH))
        f.write(rows.tobytes())
        f.write(f16.tobytes())
        f.write(q8.tobytes())
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
