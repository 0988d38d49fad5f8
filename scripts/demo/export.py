#!/usr/bin/env python3
"""Turns train.py's weights-*.pt (bf16) into a Hugging Face checkpoint directory with the tokenizer.

Usage: python3 scripts/demo/export.py --weights RUN_DIR --data out/demo/data --out out/demo/hf
Writes config.json, model.safetensors (bf16, exactly the trained bf16 weights), generation_config.json,
tokenizer.json, tokenizer_config.json.
"""
import argparse, glob, os, shutil, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_config import make_config  # noqa: E402


def load_model(weights_dir, dtype=torch.float32):
    from transformers import Qwen3MoeForCausalLM
    sd = {}
    for f in sorted(glob.glob(os.path.join(weights_dir, "weights-*.pt"))):
        sd.update(torch.load(f, map_location="cpu"))
    if not sd:
        sys.exit("export: no weights-*.pt in " + weights_dir)
    m = Qwen3MoeForCausalLM(make_config())
    missing, unexpected = m.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    m.tie_weights()
    return m.to(dtype).eval()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--data", default="out/demo/data")
    ap.add_argument("--out", default="out/demo/hf")
    a = ap.parse_args()
    m = load_model(a.weights, torch.bfloat16)
    os.makedirs(a.out, exist_ok=True)
    m.save_pretrained(a.out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.data, f), os.path.join(a.out, f))
    print("wrote", a.out, sorted(os.listdir(a.out)))


if __name__ == "__main__":
    main()
