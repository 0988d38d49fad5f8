#!/usr/bin/env python3
"""Held-out perplexity (PyTorch and Strata), expert-usage histogram and loss curve of the demo model.

  python3 scripts/demo/evaluate.py --hf out/demo/hf --gguf examples/models/austen-moe-q4_k.gguf \
      --strata build/examples/strata --run out/demo/run --figs examples/models --json out/demo/eval.json

Perplexity: the test split (Persuasion, last two chapters; never trained on, never used to select)
cut into non-overlapping 512-token windows (the tail shorter than a window is dropped); within each
window every position but the first is predicted from the tokens before it; ppl = exp(mean NLL).
  torch : transformers Qwen3MoeForCausalLM on the unpacked checkpoint, float32
  strata: `strata logits` (teacher-forced logits of every position) on the unpacked checkpoint
          directory (bf16 safetensors) and on the packed GGUF, NLL computed here from its float32 rows
"""
import argparse, json, os, subprocess, sys, tempfile, time

import numpy as np
import torch
import torch.nn.functional as F


def windows(ids, T):
    n = len(ids) // T
    return [ids[i * T:(i + 1) * T] for i in range(n)]


def nll_from_logits(logits, win):
    lg = torch.as_tensor(logits, dtype=torch.float64)[:-1]
    tgt = torch.as_tensor(np.asarray(win[1:], dtype=np.int64))
    return F.cross_entropy(lg, tgt, reduction="sum").item(), len(win) - 1


def torch_eval(hf, wins, n_experts):
    from transformers import Qwen3MoeForCausalLM
    m = Qwen3MoeForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    tot, n = 0.0, 0
    counts = np.zeros((m.config.num_hidden_layers, n_experts), dtype=np.int64)
    with torch.no_grad():
        for w in wins:
            out = m(input_ids=torch.tensor([w]), output_router_logits=True)
            a, b = nll_from_logits(out.logits[0], w)
            tot += a; n += b
            for L, rl in enumerate(out.router_logits):
                top = torch.topk(rl.float(), m.config.num_experts_per_tok, dim=-1).indices.reshape(-1)
                counts[L] += np.bincount(top.numpy(), minlength=n_experts)
    return tot, n, counts


def strata_eval(strata, model, wins, vocab):
    tot, n = 0.0, 0
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        for i, w in enumerate(wins):
            f = os.path.join(d, "l.f32")
            subprocess.run([strata, "logits", "--model", model, "--tokens", ",".join(map(str, w)), "--out", f],
                           check=True, stdout=subprocess.DEVNULL)
            lg = np.fromfile(f, dtype=np.float32).reshape(len(w), vocab)
            a, b = nll_from_logits(lg, w)
            tot += a; n += b
    return tot, n, time.time() - t0


def plot_loss(run, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    recs = [json.loads(l) for l in open(os.path.join(run, "log.jsonl"))]
    ev = [r for r in recs if "val" in r]
    tr = [r for r in recs if "lm" in r]
    summ = json.load(open(os.path.join(run, "summary.json")))
    ntrain = summ["tokens"] / max(ev[-1]["epochs"], 1e-9) if ev[-1]["epochs"] else 1
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot([r["tokens"] / ntrain for r in tr], [r["lm"] for r in tr], lw=1, label="train (batch LM loss, dropout on)")
    ax.plot([r["epochs"] for r in ev], [r["val"] for r in ev], "o-", ms=3, label="validation (Northanger Abbey ch. 30-31)")
    ax.plot([r["epochs"] for r in ev], [r["test"] for r in ev], "s-", ms=3, label="test (Persuasion ch. 23-24)")
    b = summ["best"]
    ax.axvline(b["epochs"], color="gray", ls="--", lw=1)
    ax.annotate("kept: step %d, val %.3f" % (b["step"], b["val"]), (b["epochs"], b["val"]),
                textcoords="offset points", xytext=(-150, 40), arrowprops=dict(arrowstyle="->"))
    ax.set_xlabel("epochs over the 0.94M training tokens")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_ylim(2.5, 8.6)
    ax.set_title("austen-moe training (H200, %.0f s, %d steps of 32x512 tokens)" % (summ["time_s"], summ["steps"]))
    ax.grid(alpha=0.3); ax.legend()
    fig.tight_layout(); fig.savefig(path, dpi=110); plt.close(fig)


def plot_experts(counts, path, k):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    L, E = counts.shape
    fig, axs = plt.subplots(1, L, figsize=(3.2 * L, 3.2), sharey=True)
    for i in range(L):
        frac = counts[i] / counts[i].sum()
        axs[i].bar(range(E), frac * 100, color="C%d" % i)
        axs[i].axhline(100 / E, color="k", ls="--", lw=1)
        axs[i].set_title("layer %d: top-4 %.0f%%, %d unused" % (i, 100 * np.sort(frac)[-4:].sum(), (frac == 0).sum()))
        axs[i].set_xlabel("expert")
        axs[i].set_xticks(range(0, E, 3))
    axs[0].set_ylabel("%% of top-%d routing slots" % k)
    fig.suptitle("Expert usage on the held-out test text (dashed: uniform)", y=0.99)
    fig.tight_layout(); fig.savefig(path, dpi=110); plt.close(fig)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hf", default="out/demo/hf")
    ap.add_argument("--gguf", default="examples/models/austen-moe-q4_k.gguf")
    ap.add_argument("--strata", default="build/examples/strata")
    ap.add_argument("--data", default="out/demo/data")
    ap.add_argument("--run", default="out/demo/run")
    ap.add_argument("--figs", default="examples/models")
    ap.add_argument("--json", default="out/demo/eval.json")
    ap.add_argument("--seq", type=int, default=512)
    a = ap.parse_args()
    cfg = json.load(open(os.path.join(a.hf, "config.json")))
    V, E = cfg["vocab_size"], cfg.get("num_experts", cfg.get("num_local_experts"))
    ids = np.fromfile(os.path.join(a.data, "test.bin"), dtype=np.uint16).astype(np.int64).tolist()
    wins = windows(ids, a.seq)
    res = {"windows": len(wins), "window": a.seq}
    tot, n, counts = torch_eval(a.hf, wins, E)
    res["torch_f32"] = {"nll": tot / n, "ppl": float(np.exp(tot / n)), "tokens": n}
    print("torch  f32 (unpacked):", res["torch_f32"], flush=True)
    if a.strata and os.path.exists(a.strata):
        for name, model in (("strata_unpacked", a.hf), ("strata_packed", a.gguf)):
            if not os.path.exists(model):
                continue
            tot, n, secs = strata_eval(a.strata, model, wins, V)
            res[name] = {"nll": tot / n, "ppl": float(np.exp(tot / n)), "tokens": n, "seconds": round(secs, 1)}
            res[name]["ppl_rel_diff_vs_torch"] = res[name]["ppl"] / res["torch_f32"]["ppl"] - 1
            print(name, res[name], flush=True)
    res["expert_counts"] = counts.tolist()
    fr = counts / counts.sum(1, keepdims=True)
    res["expert_usage_unused"] = (counts == 0).sum(1).tolist()
    res["expert_usage_top4_share"] = np.sort(fr, 1)[:, ::-1][:, :4].sum(1).tolist()
    res["expert_usage_max_share"] = fr.max(1).tolist()
    res["expert_usage_cv"] = (fr.std(1) / fr.mean(1)).tolist()
    os.makedirs(a.figs, exist_ok=True)
    plot_experts(counts, os.path.join(a.figs, "expert_usage.png"), cfg["num_experts_per_tok"])
    plot_loss(a.run, os.path.join(a.figs, "loss_curve.png"))
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: v for k, v in res.items() if k != "expert_counts"}, indent=1))


if __name__ == "__main__":
    main()
