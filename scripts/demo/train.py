#!/usr/bin/env python3
"""Trains the demo Qwen3-MoE on the Austen token arrays from prepare_data.py.

Runs on a GPU (bf16 autocast, f32 master weights) or, slowly, on the CPU for a smoke test.
The learning-rate schedule (linear warm-up, cosine decay to 10%) runs over --epochs of the train
tokens, or, without --epochs, over --minutes of wall time (a run then ends on time on any machine).

Model selection: the validation split (Northanger Abbey's last two chapters) is evaluated every
--eval-every seconds; the weights with the lowest validation loss are kept (bf16) and written,
split into --parts files, to --out as weights-N.pt, with log.jsonl (train / val / test loss, aux
loss, tokens, time). The test split (Persuasion's last two chapters) is only logged, never used
to choose.

Resuming: --ckpt DIR keeps a full checkpoint (f32 weights, optimizer, step, elapsed time) every
--ckpt-every seconds and resumes from it when present; --init DIR starts from weights-*.pt parts
(e.g. a previous run's output) with a fresh optimizer.

Regularisation (the corpus is ~0.94M tokens, so a 30M-parameter model overfits in a few
epochs): dropout --dropout on the embeddings and on each attention / MoE block output (forward
hooks; the HF module itself has none there), AdamW weight decay 0.1, tied embeddings.
"""
import argparse, glob, json, math, os, sys, time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_config import make_config  # noqa: E402


def load_bin(path):
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))


def chunks(ids, T):
    n = (ids.numel() - 1) // T
    x = ids[: n * T].view(n, T)
    y = ids[1 : n * T + 1].view(n, T)
    return x, y


def build_model(experts_impl, device):
    from transformers import Qwen3MoeForCausalLM
    cfg = make_config(output_router_logits=True)
    if experts_impl:
        cfg._experts_implementation = experts_impl
    torch.manual_seed(0)
    m = Qwen3MoeForCausalLM(cfg)
    return m.to(device)


def add_dropout(model, p):
    def hook(mod, inp, out):
        if not mod.training or p == 0:
            return out
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, True),) + tuple(out[1:])
        return F.dropout(out, p, True)
    model.model.embed_tokens.register_forward_hook(hook)
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(hook)
        layer.mlp.register_forward_hook(hook)


@torch.no_grad()
def eval_loss(model, x, y, bs, device, amp):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, x.shape[0], bs):
        xb, yb = x[i : i + bs].to(device), y[i : i + bs].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(input_ids=xb).logits
        tot += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), yb.reshape(-1), reduction="sum").item()
        n += yb.numel()
    model.train()
    return tot / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="out/demo/data")
    ap.add_argument("--out", default="out/demo/run")
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (smoke tests)")
    ap.add_argument("--epochs", type=float, default=0.0,
                    help="when > 0 the schedule runs over this many epochs of train tokens (--minutes is then a cap)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--eval-every", type=float, default=10.0, help="seconds")
    ap.add_argument("--experts-impl", default="grouped_mm", help="transformers experts implementation ('' = default)")
    ap.add_argument("--ckpt", default="", help="full checkpoint directory (resume when present)")
    ap.add_argument("--ckpt-every", type=float, default=120.0)
    ap.add_argument("--init", default="", help="directory with weights-*.pt to start from")
    ap.add_argument("--parts", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    device = torch.device(a.device)
    amp = device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    train = load_bin(os.path.join(a.data, "train.bin"))
    vx, vy = chunks(load_bin(os.path.join(a.data, "val.bin")), a.seq)
    tx, ty = chunks(load_bin(os.path.join(a.data, "test.bin")), a.seq)

    impl = a.experts_impl
    model = None
    for cand in ([impl, ""] if impl else [""]):
        try:
            model = build_model(cand, device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                out = model(input_ids=train[: 2 * 64].view(2, 64).to(device), labels=train[: 2 * 64].view(2, 64).to(device))
            out.loss.backward()
            model.zero_grad(set_to_none=True)
            impl = cand
            break
        except Exception as e:  # noqa: BLE001
            print("experts implementation %r failed (%s: %s); falling back" % (cand, type(e).__name__, e), flush=True)
            model = None
    print("experts implementation:", impl or "default", flush=True)
    nparam = sum(p.numel() for p in model.parameters())
    print("parameters: %.2fM" % (nparam / 1e6), flush=True)

    if a.init:
        sd = {}
        for f in sorted(glob.glob(os.path.join(a.init, "weights-*.pt"))):
            sd.update(torch.load(f, map_location="cpu"))
        missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        print("init from", a.init, "missing", missing, "unexpected", unexpected, flush=True)
    add_dropout(model, a.dropout)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=(device.type == "cuda"))
    step, elapsed0, tokens = 0, 0.0, 0
    best = {"val": float("inf")}
    best_sd = None
    log_path = os.path.join(a.out, "log.jsonl")
    if a.ckpt and os.path.exists(os.path.join(a.ckpt, "state.pt")):
        st = torch.load(os.path.join(a.ckpt, "state.pt"), map_location="cpu")
        model.load_state_dict(st["model"]); opt.load_state_dict(st["opt"])
        step, elapsed0, tokens, best = st["step"], st["elapsed"], st["tokens"], st["best"]
        best_sd = st.get("best_sd")
        print("resumed at step", step, "elapsed %.0fs" % elapsed0, flush=True)
    logf = open(log_path, "a")

    budget = a.minutes * 60.0
    g = torch.Generator().manual_seed(a.seed + step)
    t0 = time.time() - elapsed0
    last_eval, last_ckpt = -1e9, time.time()
    ema = None
    model.train()
    while True:
        el = time.time() - t0
        total_tokens = a.epochs * train.numel()
        done = el >= budget or (a.max_steps and step >= a.max_steps) or (a.epochs > 0 and tokens >= total_tokens)
        if done or el - last_eval >= a.eval_every:
            vl = eval_loss(model, vx, vy, 16, device, amp)
            tl = eval_loss(model, tx, ty, 16, device, amp)
            rec = {"step": step, "time": round(el, 1), "tokens": tokens, "epochs": round(tokens / train.numel(), 2),
                   "train": ema, "val": vl, "test": tl, "lr": opt.param_groups[0]["lr"]}
            if vl < best["val"]:
                best = dict(rec)
                best_sd = {k: v.detach().to("cpu", torch.bfloat16).clone() for k, v in model.state_dict().items()
                           if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
            logf.write(json.dumps(rec) + "\n"); logf.flush()
            print(json.dumps(rec), flush=True)
            last_eval = el
        if done:
            break
        # schedule over wall time
        frac = min(tokens / total_tokens if a.epochs > 0 else el / budget, 1.0)
        lr = a.lr * min(1.0, (step + 1) / a.warmup)
        lr *= a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * frac))
        for pg in opt.param_groups:
            pg["lr"] = lr
        ix = torch.randint(0, train.numel() - a.seq - 1, (a.batch,), generator=g)
        xb = torch.stack([train[i : i + a.seq] for i in ix]).to(device, non_blocking=True)
        yb = torch.stack([train[i + 1 : i + 1 + a.seq] for i in ix]).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(input_ids=xb)
            logits = out.logits
            lm = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), yb.reshape(-1))
            aux = out.aux_loss if out.aux_loss is not None else torch.zeros((), device=device)
            loss = lm + model.config.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += xb.numel()
        l = lm.item() if step % 10 == 0 or step < 10 else None
        if l is not None:
            ema = l if ema is None else 0.8 * ema + 0.2 * l
            if step % 50 == 0:
                logf.write(json.dumps({"step": step, "time": round(time.time() - t0, 1), "tokens": tokens,
                                       "lm": l, "aux": float(aux.item()), "lr": lr}) + "\n")
        if a.ckpt and time.time() - last_ckpt >= a.ckpt_every:
            os.makedirs(a.ckpt, exist_ok=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "tokens": tokens,
                        "elapsed": time.time() - t0, "best": best, "best_sd": best_sd},
                       os.path.join(a.ckpt, "state.pt.tmp"))
            os.replace(os.path.join(a.ckpt, "state.pt.tmp"), os.path.join(a.ckpt, "state.pt"))
            last_ckpt = time.time()

    # write the best weights in parts (largest tensor first into the lightest part: each part stays
    # well under the device's 16 MiB-per-file limit)
    bins = [dict() for _ in range(a.parts)]
    load = [0] * a.parts
    for k in sorted(best_sd, key=lambda k: -best_sd[k].numel()):
        i = load.index(min(load))
        bins[i][k] = best_sd[k]
        load[i] += best_sd[k].numel() * 2
    for i, p in enumerate(bins):
        torch.save(p, os.path.join(a.out, "weights-%d.pt" % i))
    print("parts (MiB):", [round(x / 2**20, 1) for x in load], flush=True)
    summary = {"best": best, "steps": step, "tokens": tokens, "time_s": round(time.time() - t0, 1),
               "params": nparam, "experts_impl": impl or "default", "args": vars(a),
               "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "torch": torch.__version__}
    import transformers
    summary["transformers"] = transformers.__version__
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
