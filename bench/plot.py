#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""plot.py: te-bench JSON lines to a bandwidth and latency plot (SVG or PNG).

Reads the rows `te-bench --json` prints (files, or stdin when none or "-"), and draws two
panels over block size (log scale): GB/s, and the p50 (solid) and p99 (dashed) batch
latency in microseconds (log scale). One series per op, threads, batch (as asked, before
te-bench reduced it to fit), depth and, when the rows have several, transport.

With matplotlib installed it draws with matplotlib (SVG or PNG, by the --out extension);
without it, it writes the SVG itself (a plain line chart with axes and a legend; PNG then
needs matplotlib). --backend picks one explicitly. Python standard library otherwise.

  te-bench --loopback --op both --sizes 4K-16M --json -O rows.json
  bench/plot.py rows.json --out te-bench.svg

Rows marked failed or interrupted are left out (a note on stderr says so); te-bench --core
rows have no latency and appear in the bandwidth panel only. Exit status: 0, or 2 for bad
input (the message names the file and line) or a bad option.
"""

import argparse
import json
import math
import sys
from xml.sax.saxutils import escape, quoteattr

# matplotlib's tab10, so both backends colour the series alike.
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf"]


class InputError(Exception):
    pass


def size_str(v):
    """4096 -> 4K, 1048576 -> 1M: te-bench's spelling of a block size."""
    for unit, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if v >= mult and v % mult == 0:
            return f"{v // mult}{unit}"
    return str(int(v))


def read_rows(paths):
    """JSON objects of te-bench --json, one a line; blank lines and '#' comments skipped."""
    rows = []
    for path in paths or ["-"]:
        name = "<stdin>" if path == "-" else path
        try:
            f = sys.stdin if path == "-" else open(path, encoding="utf-8")
        except OSError as e:
            raise InputError(f"{name}: {e.strerror}") from e
        with f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise InputError(f"{name}:{n}: not a JSON object ({e}); plot.py reads "
                                     "te-bench --json output") from e
                if not isinstance(row, dict):
                    raise InputError(f"{name}:{n}: not a JSON object")
                for key in ("op", "block_size", "gbps"):
                    if key not in row:
                        raise InputError(f"{name}:{n}: the row has no '{key}': is it "
                                         "te-bench --json output?")
                row["_where"] = f"{name}:{n}"
                rows.append(row)
    return rows


def build_series(rows):
    """{label: {"bw": [(block, gbps)], "p50": [...], "p99": [...]}} in first-seen order."""
    transports = {r.get("transport", "") for r in rows}
    series = {}
    skipped = 0
    for r in rows:
        if r.get("failed") or r.get("interrupted"):
            skipped += 1
            continue
        batch = r.get("batch_requested", r.get("batch", "?"))
        label = f"{r['op']} thr {r.get('threads', 1)} batch {batch}"
        if r.get("depth", 1) != 1:
            label += f" depth {r['depth']}"
        if r.get("mode") == "core":
            label = "core " + label
        if len(transports) > 1:
            label += f" {r.get('transport') or '-'}"
        s = series.setdefault(label, {"bw": {}, "p50": {}, "p99": {}})
        block = int(r["block_size"])
        if block <= 0:
            raise InputError(f"{r['_where']}: block_size {block} is not positive")
        s["bw"].setdefault(block, []).append(float(r["gbps"]))
        for key, field in (("p50", "lat_us_p50"), ("p99", "lat_us_p99")):
            v = r.get(field)
            if isinstance(v, (int, float)) and v > 0:
                s[key].setdefault(block, []).append(float(v))
    if skipped:
        print(f"plot.py: note: left out {skipped} failed or interrupted row(s)", file=sys.stderr)
    # Several rows of one series at one size (files appended to): their mean.
    return {label: {k: sorted((b, sum(v) / len(v)) for b, v in pts.items())
                    for k, pts in s.items()}
            for label, s in series.items()}


def subtitle(rows):
    parts = []
    for key in ("transport", "device", "version"):
        vals = sorted({str(r[key]) for r in rows if r.get(key)})
        if vals:
            parts.append(f"{key} {', '.join(vals[:3])}{' ...' if len(vals) > 3 else ''}")
    return "; ".join(parts)


# --- matplotlib -------------------------------------------------------------------------------

def plot_matplotlib(series, title, sub, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, (bw, lat) = plt.subplots(2, 1, sharex=True, figsize=(10, 8))
    fig.suptitle(title + (f"\n{sub}" if sub else ""))
    for i, (label, s) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        if s["bw"]:
            xs, ys = zip(*s["bw"])
            bw.plot(xs, ys, marker="o", color=color, label=label)
        for key, style in (("p50", "-"), ("p99", "--")):
            if s[key]:
                xs, ys = zip(*s[key])
                lat.plot(xs, ys, style, marker="o", color=color, label=f"{label} {key}")
    bw.set_xscale("log", base=2)
    bw.set_ylabel("GB/s (10^9 bytes/s)")
    bw.set_ylim(bottom=0)
    bw.grid(True, alpha=0.3)
    bw.legend(fontsize="small")
    lat.set_yscale("log")
    lat.set_ylabel("batch latency (us): p50 solid, p99 dashed")
    lat.set_xlabel("block size (bytes)")
    lat.xaxis.set_major_formatter(FuncFormatter(lambda v, _: size_str(v) if v >= 1 else ""))
    lat.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)


# --- SVG by hand ------------------------------------------------------------------------------

WIDTH, HEIGHT = 1000, 760
LEFT, RIGHT = 80, 280  # plot area margins; the legend lives in the right one
PANELS = ((60, 340), (420, 700))  # top and bottom y of the bandwidth and latency plot areas


def nice_step(span, ticks=5):
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt_num(v):
    return f"{v:g}" if abs(v) < 1e6 else f"{v:.3g}"


class Svg:
    def __init__(self):
        self.out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
                    f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
                    'font-family="sans-serif" font-size="12">',
                    f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>']

    def add(self, s):
        self.out.append(s)

    def text(self, x, y, s, anchor="start", size=12, extra=""):
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" font-size="{size}"'
                 f'{extra}>{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke="black", extra=""):
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                 f'stroke="{stroke}"{extra}/>')

    def done(self):
        return "\n".join(self.out + ["</svg>"]) + "\n"


def plot_svg(series, title, sub, out):
    blocks = sorted({b for s in series.values() for b, _ in s["bw"]})
    lo2, hi2 = math.log2(blocks[0]), math.log2(blocks[-1])
    if hi2 - lo2 < 1:
        lo2, hi2 = lo2 - 0.5, hi2 + 0.5
    x0, x1 = LEFT, WIDTH - RIGHT

    def xpos(b):
        return x0 + (math.log2(b) - lo2) / (hi2 - lo2) * (x1 - x0)

    svg = Svg()
    svg.text(WIDTH / 2, 22, title, "middle", 16, ' font-weight="bold"')
    if sub:
        svg.text(WIDTH / 2, 40, sub, "middle", 11)

    def x_axis(top, bottom):
        svg.line(x0, bottom, x1, bottom)
        first, last = math.ceil(lo2), math.floor(hi2)
        every = max(1, math.ceil((last - first + 1) / 12))
        for e in range(first, last + 1):
            x = xpos(2 ** e)
            svg.line(x, top, x, bottom, "#dddddd")
            if (e - first) % every == 0:
                svg.line(x, bottom, x, bottom + 5)
                svg.text(x, bottom + 18, size_str(2 ** e), "middle")
        svg.text((x0 + x1) / 2, bottom + 36, "block size (bytes, log scale)", "middle")

    def y_label(top, bottom, s):
        cy = (top + bottom) / 2
        svg.text(22, cy, s, "middle", 12, f' transform="rotate(-90 22 {cy:.1f})"')

    def draw(pts, ypos, color, cls, label, dash=""):
        d = " ".join(f"{'M' if i == 0 else 'L'}{xpos(b):.1f},{ypos(v):.1f}"
                     for i, (b, v) in enumerate(pts))
        svg.add(f'<path class="series {cls}" data-series={quoteattr(label)} d="{d}" '
                f'fill="none" stroke="{color}" stroke-width="2"{dash}/>')
        for b, v in pts:
            svg.add(f'<circle class="marker {cls}" cx="{xpos(b):.1f}" cy="{ypos(v):.1f}" '
                    f'r="3" fill="{color}"/>')

    def legend(top, entries):
        y = top + 8
        for color, label, dash in entries:
            svg.line(x1 + 20, y, x1 + 50, y, color, f' stroke-width="2"{dash}')
            svg.text(x1 + 56, y + 4, label, size=11)
            y += 18

    # Bandwidth: linear GB/s from 0.
    top, bottom = PANELS[0]
    peak = max((v for s in series.values() for _, v in s["bw"]), default=0) or 1.0
    step = nice_step(peak)
    ymax = step * math.ceil(peak / step)

    def ybw(v):
        return bottom - v / ymax * (bottom - top)

    svg.add('<g class="panel bandwidth">')
    for k in range(int(round(ymax / step)) + 1):
        v = k * step
        svg.line(x0, ybw(v), x1, ybw(v), "#dddddd")
        svg.text(x0 - 6, ybw(v) + 4, fmt_num(v), "end")
    svg.line(x0, top, x0, bottom)
    x_axis(top, bottom)
    y_label(top, bottom, "GB/s (10^9 bytes/s)")
    entries = []
    for i, (label, s) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        if s["bw"]:
            draw(s["bw"], ybw, color, "bandwidth", label)
        entries.append((color, label, ""))
    legend(top, entries)
    svg.add("</g>")

    # Latency: p50 solid, p99 dashed, log10 microseconds.
    top, bottom = PANELS[1]
    lats = [v for s in series.values() for k in ("p50", "p99") for _, v in s[k]]
    svg.add('<g class="panel latency">')
    if lats:
        lo10 = math.floor(math.log10(min(lats)))
        hi10 = max(math.ceil(math.log10(max(lats))), lo10 + 1)

        def ylat(v):
            return bottom - (math.log10(v) - lo10) / (hi10 - lo10) * (bottom - top)

        for e in range(lo10, hi10 + 1):
            svg.line(x0, ylat(10 ** e), x1, ylat(10 ** e), "#dddddd")
            svg.text(x0 - 6, ylat(10 ** e) + 4, fmt_num(10.0 ** e), "end")
        for i, (label, s) in enumerate(series.items()):
            color = PALETTE[i % len(PALETTE)]
            if s["p50"]:
                draw(s["p50"], ylat, color, "p50", label)
            if s["p99"]:
                draw(s["p99"], ylat, color, "p99", label, ' stroke-dasharray="6,4"')
        legend(top, [("black", "p50", ""), ("black", "p99", ' stroke-dasharray="6,4"')])
    else:
        svg.text((x0 + x1) / 2, (top + bottom) / 2, "no latency in these rows", "middle")
    svg.line(x0, top, x0, bottom)
    x_axis(top, bottom)
    y_label(top, bottom, "batch latency (us, log scale)")
    svg.add("</g>")

    with open(out, "w", encoding="utf-8") as f:
        f.write(svg.done())


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Turn te-bench --json rows into a bandwidth and latency plot.")
    ap.add_argument("files", nargs="*", metavar="FILE",
                    help="te-bench --json output (default, or '-': stdin)")
    ap.add_argument("--out", "-o", default="te-bench.svg", metavar="FILE.svg|FILE.png",
                    help="where to write the plot; the extension picks the format "
                    "[te-bench.svg]")
    ap.add_argument("--title", default="te-bench: bandwidth and latency by block size")
    ap.add_argument("--backend", choices=("auto", "matplotlib", "builtin"), default="auto",
                    help="auto: matplotlib when installed, else the built-in SVG writer")
    args = ap.parse_args(argv)

    fmt = args.out.rsplit(".", 1)[-1].lower() if "." in args.out else ""
    if fmt not in ("svg", "png"):
        ap.error(f"--out {args.out}: name a .svg or .png file")
    backend = args.backend
    if backend == "auto":
        backend = "matplotlib" if have_matplotlib() else "builtin"
    if backend == "matplotlib" and not have_matplotlib():
        ap.error("--backend matplotlib: matplotlib is not installed (pip install matplotlib)")
    if backend == "builtin" and fmt != "svg":
        ap.error(f"--out {args.out}: PNG needs matplotlib (pip install matplotlib); "
                 "write an .svg instead")
    try:
        rows = read_rows(args.files)
        series = build_series(rows)
        if not any(s["bw"] for s in series.values()):
            raise InputError("no rows to plot (every row failed, or the input is empty)")
        draw = plot_matplotlib if backend == "matplotlib" else plot_svg
        draw(series, args.title, subtitle(rows), args.out)
    except InputError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"plot.py: {args.out}: {e.strerror}", file=sys.stderr)
        return 2
    print(f"plot.py: wrote {args.out} ({len(series)} series, {backend})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
