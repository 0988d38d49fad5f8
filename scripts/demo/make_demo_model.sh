#!/usr/bin/env bash
# Rebuilds examples/models/austen-moe-q4_k.gguf and its model card figures, step by step.
#   scripts/demo/make_demo_model.sh data            # corpus, tokenizer, token arrays -> out/demo/data
#   (GPU) scripts/demo/device_train.sh OUTDIR        # 4-run sweep on one GPU; best run's weights -> OUTDIR
#   scripts/demo/make_demo_model.sh pack RUN_DIR    # HF checkpoint, GGUF with tokenizer, q4_k/q8_0 pack
#   scripts/demo/make_demo_model.sh eval            # perplexities (PyTorch and Strata), figures
# Needs: r-cran-janeaustenr (Rscript), Python with torch, transformers (5.17-5.24), tokenizers,
# gguf, numpy, matplotlib (PY, default python3); a built build/examples/strata (STRATA).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
STRATA=${STRATA:-build/examples/strata}
MODEL=examples/models/austen-moe-q4_k.gguf
case "${1:-}" in
  data) $PY scripts/demo/prepare_data.py --out out/demo/data ;;
  pack)
    RUN=${2:?RUN_DIR with weights-*.pt}
    rm -rf out/demo/hf out/demo/pack; mkdir -p out/demo/pack
    $PY scripts/demo/export.py --weights "$RUN" --data out/demo/data --out out/demo/hf
    # strata pack from an HF directory writes no tokenizer.ggml.* keys yet: pack to float32,
    # add them, and pack that GGUF (pack copies a GGUF input's metadata) to the final codecs.
    "$STRATA" pack out/demo/hf out/demo/pack/f32.gguf --experts f32 --attention f32
    $PY scripts/demo/gguf_add_tokenizer.py out/demo/pack/f32.gguf out/demo/hf out/demo/pack/f32tok.gguf \
      --pre qwen2 --name austen-moe
    "$STRATA" pack out/demo/pack/f32tok.gguf "$MODEL" --experts q4_k --attention q8_0
    "$STRATA" tokenize --model "$MODEL" --text "It is a truth universally acknowledged"
    ;;
  eval)
    $PY scripts/demo/evaluate.py --hf out/demo/hf --gguf "$MODEL" --strata "$STRATA" --data out/demo/data \
      --run "${2:-out/demo/run}" --figs examples/models --json out/demo/eval.json
    "$STRATA" run --model "$MODEL" -n 60 --seed 1
    ;;
  *) sed -n 2,8p "$0"; exit 2 ;;
esac
