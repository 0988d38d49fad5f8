#!/usr/bin/env bash
# One GPU session of demo-model training: a small sweep of 4 runs side by side on one GPU
# (the model is far too small to fill an H200), each with its own epoch budget (5 minutes at most); the run with the lowest
# validation loss is copied to OUT (weights-*.pt, log.jsonl, summary.json) with runs.json, a
# summary of all four. Usage: scripts/demo/device_train.sh OUT [DATA]
set -u
OUT=${1:?OUT}; DATA=${2:-out/demo/data}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
run() {  # name epochs dropout lr
  mkdir -p /tmp/demo_$1
  ${PY:-python3} scripts/demo/train.py --data "$DATA" --out /tmp/demo_$1 --minutes 5 --epochs $2 --dropout $3 --lr $4 ${DEMO_EXTRA:-} \
    --ckpt /tmp/demo_$1/ckpt > /tmp/demo_$1/stdout 2>&1
}
run r0 12 0.2 1e-3 & run r1 16 0.2 1e-3 & run r2 12 0.3 1.5e-3 & run r3 20 0.3 1e-3 &
wait
for r in r0 r1 r2 r3; do echo "== $r"; head -3 /tmp/demo_$r/stdout; tail -2 /tmp/demo_$r/stdout | cut -c1-600; done
${PY:-python3} - "$OUT" <<'PY'
import json, os, shutil, sys
out = sys.argv[1]; runs = {}
for r in ["r0", "r1", "r2", "r3"]:
    p = "/tmp/demo_%s/summary.json" % r
    if os.path.exists(p):
        runs[r] = json.load(open(p))
best = min(runs, key=lambda r: runs[r]["best"]["val"])
print("best run:", best, runs[best]["best"])
for f in os.listdir("/tmp/demo_" + best):
    if f.startswith("weights-") or f in ("log.jsonl", "summary.json"):
        shutil.copy(os.path.join("/tmp/demo_" + best, f), out)
json.dump({"chosen": best, "runs": runs}, open(os.path.join(out, "runs.json"), "w"), indent=1)
PY
ls -la "$OUT"
