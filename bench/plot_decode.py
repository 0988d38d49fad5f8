#!/usr/bin/env python3
"""Draws README's picture: decode tok/s of Strata and llama.cpp (both on the GPU) by VRAM budget,
from gpu_bench.py results, as an SVG (no plotting library needed).

  python3 bench/plot_decode.py [--out bench/plots/decode_by_budget.svg] RESULT.json[:TITLE] ...

Each result file is one panel: its runs' budgets on the x axis (0 = everything resident, drawn
last as "all"), Strata's default mode and llama.cpp as bars.
"""
import argparse
import json
import os


def size(b):
    return float("inf") if b in ("0", 0) else float(str(b).rstrip("G"))


def panel(path):
    d = json.load(open(path))
    rows = []
    for r in d["runs"]:
        modes = r.get("modes", {})
        mode = modes.get("auto") or next(iter(modes.values()), {})
        s = (mode.get("strata") or {}).get("decode_tok_s")
        l = (r.get("llama") or {}).get("decode_tok_s")
        if s is None or l is None:
            continue
        rows.append((str(r["budget"]), s, l))
    rows.sort(key=lambda x: size(x[0]))
    return rows


def svg(panels, out):
    w_panel, h, pad, top = 360, 260, 46, 40
    width = pad + len(panels) * (w_panel + pad)
    height = h + top + 70
    peak = max(max(s, l) for _, rows in panels for _, s, l in rows)
    peak = (int(peak / 50) + 1) * 50
    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
         % (width, height), '<rect width="100%" height="100%" fill="white"/>']
    for i, (title, rows) in enumerate(panels):
        x0 = pad + i * (w_panel + pad)
        y0 = top + h
        o.append('<text x="%d" y="%d" font-size="14" font-weight="bold">%s</text>' % (x0, top - 16, title))
        for t in range(0, peak + 1, 50):
            y = y0 - h * t / peak
            o.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (x0, x0 + w_panel, y, y))
            o.append('<text x="%d" y="%.1f" text-anchor="end">%d</text>' % (x0 - 4, y + 4, t))
        slot = w_panel / max(1, len(rows))
        for k, (budget, s, l) in enumerate(rows):
            cx = x0 + slot * k + slot / 2
            for j, (v, color) in enumerate(((s, "#1f77b4"), (l, "#ff7f0e"))):
                bx = cx - 26 + j * 27
                bh = h * v / peak
                o.append('<rect x="%.1f" y="%.1f" width="25" height="%.1f" fill="%s"/>' % (bx, y0 - bh, bh, color))
                o.append('<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10">%.0f</text>'
                         % (bx + 12.5, y0 - bh - 3, v))
            label = "all resident" if budget == "0" else budget + "iB"
            o.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (cx, y0 + 16, label))
            o.append('<text x="%.1f" y="%d" text-anchor="middle" font-size="10" fill="#555">%.2fx</text>'
                     % (cx, y0 + 30, s / l))
        o.append('<text x="%d" y="%d" text-anchor="middle">VRAM budget (the rest in RAM)</text>'
                 % (x0 + w_panel / 2, y0 + 48))
    o.append('<text transform="translate(12,%d) rotate(-90)" text-anchor="middle">decode tok/s</text>' % (top + h / 2))
    lx = width - 250
    o.append('<rect x="%d" y="8" width="12" height="12" fill="#1f77b4"/><text x="%d" y="19">Strata</text>'
             % (lx, lx + 16))
    o.append('<rect x="%d" y="8" width="12" height="12" fill="#ff7f0e"/><text x="%d" y="19">llama.cpp CUDA</text>'
             % (lx + 70, lx + 86))
    o.append("</svg>")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="bench/plots/decode_by_budget.svg")
    ap.add_argument("results", nargs="+", help="gpu_bench.py JSON[:panel title]")
    a = ap.parse_args()
    panels = []
    for spec in a.results:
        path, _, title = spec.partition(":")
        panels.append((title or os.path.basename(path), panel(path)))
    svg(panels, a.out)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
