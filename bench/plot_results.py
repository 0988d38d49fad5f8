#!/usr/bin/env python3
"""Draws bench/README.md's plots other than README's decode picture (bench/plot_decode.py), from the
result files in bench/results/, as SVG (no plotting library needed).

  python3 bench/plot_results.py [--results bench/results] [--out bench/plots]

Writes:
  tiers.svg      tiers_bench: decode tok/s of each (backend, RAM, VRAM) configuration beside the
                 roofline its file and link bytes allow, skewed and spread routing.
  streaming.svg  streaming_bench: decode tok/s of Strata and llama.cpp (mmap) under the same free
                 RAM, beside Strata's disk roofline.
  prompts.svg    gpu_bench, everything resident: prefill and decode tok/s of Strata and llama.cpp
                 CUDA by prompt length.
"""
import argparse
import json
import math
import os

COLORS = ("#1f77b4", "#ff7f0e", "#9a9a9a", "#2ca02c")


def load(results, name):
    with open(os.path.join(results, name)) as f:
        return json.load(f)


def nice_top(v):
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def bars(panels, series, ylabel, out):
    """panels: [(title, [(group label, [value or None per series])])]."""
    w_group, h, pad, top = 92, 240, 56, 54
    widths = [max(1, len(groups)) * w_group for _, groups in panels]
    width = pad + sum(w + pad for w in widths)
    height = h + top + 64
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
         % (width, height), '<rect width="100%" height="100%" fill="white"/>']
    x0 = pad
    for (title, groups), w_panel in zip(panels, widths):
        y0 = top + h
        peak = nice_top(max(v for _, vals in groups for v in vals if v is not None) * 1.08)
        o.append('<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>' % (x0, top - 22, title))
        for k in range(6):
            t = peak * k / 5
            y = y0 - h * k / 5
            o.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (x0, x0 + w_panel, y, y))
            o.append('<text x="%d" y="%.1f" text-anchor="end" font-size="10">%g</text>' % (x0 - 4, y + 4, round(t, 2)))
        for g, (label, vals) in enumerate(groups):
            n = len(vals)
            bw = min(22, (w_group - 12) / n)
            left = x0 + g * w_group + (w_group - bw * n) / 2
            for j, v in enumerate(vals):
                if v is None:
                    continue
                bh = h * v / peak
                bx = left + j * bw
                o.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>'
                         % (bx, y0 - bh, bw - 2, bh, COLORS[j % len(COLORS)]))
                o.append('<text x="%.1f" y="%.1f" text-anchor="middle" font-size="9">%s</text>'
                         % (bx + bw / 2 - 1, y0 - bh - 3, ("%.0f" % v) if v >= 10 else ("%.2g" % v)))
            for li, part in enumerate(label.split("\n")):
                o.append('<text x="%.1f" y="%d" text-anchor="middle" font-size="11">%s</text>'
                         % (x0 + g * w_group + w_group / 2, y0 + 16 + 13 * li, part))
        x0 += w_panel + pad
    o.append('<text transform="translate(14,%d) rotate(-90)" text-anchor="middle">%s</text>' % (top + h / 2, ylabel))
    lx = pad
    for j, name in enumerate(series):
        o.append('<rect x="%d" y="8" width="12" height="12" fill="%s"/><text x="%d" y="19">%s</text>'
                 % (lx, COLORS[j % len(COLORS)], lx + 16, name))
        lx += 24 + 7 * len(name)
    o.append("</svg>")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")
    print("wrote", out)


def tiers_row(results, name, config):
    for r in load(results, name)["rows"]:
        if r["config"] == config:
            return r
    raise SystemExit("%s has no row %s" % (name, config))


def label(config):
    parts = config.split(":")
    if parts[0] == "cpu":
        return "CPU\nRAM " + parts[1]
    return "RAM %s\n+ VRAM %s" % (parts[1], parts[2])


def tiers(results, out):
    # (config, file): the current figure of each configuration at the defaults (bench/README.md, tiers_bench).
    rows = {
        "skewed routing": [
            ("cpu:6G", "tiers_skewed_cpu_6G_h200_2026-12-02.json"),
            ("cuda:6G:8G", "tiers_skewed_h200_2026-12-02d.json"),
            ("cuda:12G:8G", "tiers_skewed_h200_2026-12-02_own_tier.json"),
            ("cuda:60G:8G", "tiers_skewed_h200_2026-12-02_own_tier.json"),
        ],
        "spread routing": [
            ("cpu:6G", "tiers_spread_cpu_6G_h200_2026-12-02.json"),
            ("cuda:6G:8G", "tiers_spread_h200_2026-12-02d.json"),
            ("cuda:12G:8G", "tiers_spread_h200_2026-12-02e.json"),
            ("cuda:60G:8G", "tiers_spread_h200_2026-12-02e.json"),
        ],
    }
    panels = []
    for title, configs in rows.items():
        groups = []
        for config, name in configs:
            r = tiers_row(results, name, config)
            groups.append((label(config), [r["decode_tok_s"], r["roofline_tok_s"]]))
        panels.append(("Qwen3-30B-A3B shape, " + title, groups))
    bars(panels, ("Strata decode", "roofline (file and link bytes)"), "decode tok/s", out)


def streaming(results, out):
    files = [
        ("OLMoE-1B-7B\nspread", "streaming_bench_olmoe_spread_final_2026-11-30.json"),
        ("Qwen3-30B-A3B\nspread", "streaming_bench_qwen3-30b_spread_2026-11-30.json"),
        ("OLMoE-1B-7B\nconcentrated", "streaming_bench_olmoe_2026-11-30.json"),
        ("Qwen3-30B-A3B\nconcentrated", "streaming_bench_qwen3-30b_2026-11-30.json"),
    ]
    panels = []
    for lbl, name in files:
        runs = load(results, name)["runs"]
        s = runs["random/strata"]
        panels.append((lbl.replace("\n", ", "),
                       [("", [s["decode_tok_s"], runs["random/llama_cpp"]["decode_tok_s"], s["roofline_tok_s"]])]))
    bars(panels, ("Strata (8-bit activations)", "llama.cpp (mmap)", "disk roofline"), "decode tok/s", out)


def prompts(results, out):
    files = [
        ("512", "gpu_bench_h200_2026-12-01h_spread.json"),
        ("4,096", "gpu_bench_h200_2026-12-02_prompt4k_flash.json"),
        ("32,768", "gpu_bench_h200_2026-12-02_prompt32k_flash.json"),
    ]
    pre, dec = [], []
    for lbl, name in files:
        run = next(r for r in load(results, name)["runs"] if str(r["budget"]) == "0")
        mode = run["modes"].get("auto") or run["modes"].get("off")
        s, l = mode["strata"], run["llama"]
        pre.append((lbl + " tokens", [s["prefill_tok_s"], l["prefill_tok_s"]]))
        dec.append((lbl + " tokens", [s["decode_tok_s"], l["decode_tok_s"]]))
    bars([("prefill tok/s by prompt length", pre), ("decode tok/s after the prompt", dec)],
         ("Strata", "llama.cpp CUDA"), "tok/s", out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="bench/results")
    ap.add_argument("--out", default="bench/plots")
    a = ap.parse_args()
    tiers(a.results, os.path.join(a.out, "tiers.svg"))
    streaming(a.results, os.path.join(a.out, "streaming.svg"))
    prompts(a.results, os.path.join(a.out, "prompts.svg"))


if __name__ == "__main__":
    main()
