"""Inline SVG plots for the report: no script, no external file, readable in any browser and in
a mail attachment. Each function returns one ``<svg>`` element as text."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 900, 260, 64, 16, 14, 34


def _fmt(v: float) -> str:
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def _axes(x0: float, x1: float, y0: float, y1: float, xlabel: str, ylabel: str, log_y: bool = False) -> list[str]:
    """Axes with five ticks each; ``y0``/``y1`` are log10 values when ``log_y``."""
    out = [f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" stroke="#999"/>',
           f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" stroke="#999"/>']
    for i in range(5):
        fx, fy = x0 + (x1 - x0) * i / 4, y0 + (y1 - y0) * i / 4
        fy = 10**fy if log_y else fy
        px, py = PAD_L + (W - PAD_L - PAD_R) * i / 4, H - PAD_B - (H - PAD_T - PAD_B) * i / 4
        out.append(f'<text x="{px:.1f}" y="{H - PAD_B + 14}" font-size="11" text-anchor="middle">{_fmt(fx)}</text>')
        out.append(f'<text x="{PAD_L - 6}" y="{py + 4:.1f}" font-size="11" text-anchor="end">{_fmt(fy)}</text>')
        out.append(f'<line x1="{PAD_L}" y1="{py:.1f}" x2="{W - PAD_R}" y2="{py:.1f}" stroke="#eee"/>')
    out.append(f'<text x="{(W + PAD_L) / 2}" y="{H - 4}" font-size="12" text-anchor="middle">{escape(xlabel)}</text>')
    out.append(f'<text x="12" y="{PAD_T + 8}" font-size="12">{escape(ylabel)}</text>')
    return out


def _scale(lo: float, hi: float, out_lo: float, out_hi: float):
    span = (hi - lo) or 1.0
    return lambda v: out_lo + (v - lo) / span * (out_hi - out_lo)


def line_chart(points: Sequence[tuple[float, float]], *, xlabel: str, ylabel: str, color: str = "#1f77b4",
               bands: Sequence[tuple[float, float, str, str]] = (), log_y: bool = False) -> str:
    """A line over (x, y) points (y None or non-finite leaves a gap), with shaded x-ranges
    ``bands`` (x0, x1, colour, label: an incident's steps)."""
    pts = [(x, y) for x, y in points if y is not None and math.isfinite(y) and (y > 0 or not log_y)]
    if not pts:
        return f'<svg class="plot" width="{W}" height="60"><text x="10" y="30">no data</text></svg>'
    f = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    xs, ys = [x for x, _ in pts], [f(y) for _, y in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if y1 - y0 < 1e-9:  # a flat line: give it room
        y0, y1 = y0 - 0.5 * (abs(y0) or 1.0), y1 + 0.5 * (abs(y1) or 1.0)
    sx, sy = _scale(x0, x1, PAD_L, W - PAD_R), _scale(y0, y1, H - PAD_B, PAD_T)
    out = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">']
    for a, b, col, label in bands:
        xa, xb = sx(max(a, x0)), sx(min(b, x1))
        out.append(f'<rect x="{xa:.1f}" y="{PAD_T}" width="{max(2.0, xb - xa):.1f}" height="{H - PAD_T - PAD_B}" '
                   f'fill="{col}" opacity="0.22"><title>{escape(label)}</title></rect>')
    out += _axes(x0, x1, y0, y1, xlabel, ylabel, log_y)
    path = " ".join(f"{'M' if i == 0 else 'L'}{sx(x):.1f},{sy(f(y)):.1f}" for i, (x, y) in enumerate(pts))
    out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="1.4"/>')
    out.append("</svg>")
    return "".join(out)


def stacked_area(times: Sequence[float], series: Sequence[tuple[str, str, Sequence[float]]], *,
                 xlabel: str = "seconds since the first start", ylabel: str = "seconds") -> str:
    """Cumulative seconds per bucket over time, stacked (``series``: label, colour, values)."""
    shown = [(lab, col, vals) for lab, col, vals in series if any(v > 0 for v in vals)]
    if len(times) < 2 or not shown:
        return f'<svg class="plot" width="{W}" height="60"><text x="10" y="30">not enough points yet</text></svg>'
    totals = [sum(vals[i] for _, _, vals in shown) for i in range(len(times))]
    sx, sy = _scale(times[0], times[-1], PAD_L, W - PAD_R), _scale(0.0, max(totals) or 1.0, H - PAD_B, PAD_T)
    out = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">']
    out += _axes(times[0], times[-1], 0.0, max(totals) or 1.0, xlabel, ylabel)
    base = [0.0] * len(times)
    for label, color, vals in shown:
        top = [b + v for b, v in zip(base, vals, strict=True)]
        upper = " ".join(f"{sx(t):.1f},{sy(y):.1f}" for t, y in zip(times, top, strict=True))
        lower = " ".join(f"{sx(t):.1f},{sy(y):.1f}" for t, y in zip(reversed(times), reversed(base), strict=True))
        out.append(f'<polygon points="{upper} {lower}" fill="{color}" opacity="0.9"><title>{escape(label)}</title>'
                   "</polygon>")
        base = top
    out.append("</svg>")
    return "".join(out)


def share_bar(items: Sequence[tuple[str, float, str]]) -> str:
    """One horizontal bar split by share (label, seconds, colour), with a legend under it."""
    total = sum(v for _, v, _ in items) or 1.0
    out = [f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{40 + 18 * len(items)}">']
    x = float(PAD_L)
    span = W - PAD_L - PAD_R
    for label, v, color in items:
        w = span * v / total
        if w > 0:
            out.append(f'<rect x="{x:.1f}" y="6" width="{w:.1f}" height="24" fill="{color}">'
                       f"<title>{escape(label)}: {v:.1f} s</title></rect>")
        x += w
    for i, (label, v, color) in enumerate(items):
        y = 48 + 18 * i
        out.append(f'<rect x="{PAD_L}" y="{y - 10}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{PAD_L + 18}" y="{y}" font-size="12">{escape(label)}: {v:,.1f} s '
                   f"({100 * v / total:.1f} %)</text>")
    out.append("</svg>")
    return "".join(out)
