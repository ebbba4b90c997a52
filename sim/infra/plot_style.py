"""One plot style for every HTML page (the run's report.html, the sweep's index.html, sensitivity.html and
real/validate's fidelity.html): a colour fixed per policy, per step-time part and per named series, and one
plotly template. Every trace gets its colour explicitly, so a legend entry and the bars or lines it names
have the same colour in every panel (plotly's automatic colours restart per trace index, not per name).
"""
from __future__ import annotations

import colorsys

TEMPLATE = "plotly_white"

# policy family (the name before ':') -> colour; the baseline is blue, the hybrids warm, the oracle grey
POLICY_COLORS = {
    "adaptive": "#1f77b4",
    "hybrid": "#d62728",
    "hybrid-price": "#ff7f0e",
    "hybrid-tree": "#9467bd",
    "ngram-fixed": "#2ca02c",
    "model-fixed": "#17becf",
    "ngram-first": "#8c564b",
    "ngram-threshold": "#e377c2",
    "oracle": "#7f7f7f",
    "none": "#bcbd22",
}
# the bundled defaults: they get their family's colour when other settings of the family share a page
CANONICAL = {"ngram-fixed": "ngram-fixed:32", "model-fixed": "model-fixed:7"}
_FALLBACK = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354"]

# step-time parts (sim.core.metrics.BREAKDOWN without _ms)
PART_COLORS = {
    "draft": "#4c78a8",
    "ngram": "#72b7b2",
    "alloc": "#eeca3b",
    "verify": "#f58518",
    "sample": "#b279a2",
    "cpu": "#9d755d",
    "bubble": "#bab0ac",
}

# named series that are not policies
SERIES_COLORS = {
    "best single": "#2f4b7c",  # the best single-drafter policy (sensitivity)
    "real": "#1f77b4",  # real/validate: measured
    "predicted (replayed drafts)": "#ff7f0e",
    "predicted (synthetic drafter)": "#2ca02c",
}


def family(policy: str) -> str:
    return str(policy).split(":", 1)[0]


def _shade(hex_color: str, step: int) -> str:
    """The colour made lighter (odd steps) or darker (even steps), further with each step."""
    r, g, b = (int(hex_color[i:i + 2], 16) / 255 for i in (1, 3, 5))
    h, light, s = colorsys.rgb_to_hls(r, g, b)
    d = 0.12 * ((step + 1) // 2)
    light = min(0.85, light + d) if step % 2 else max(0.15, light - d)
    r, g, b = colorsys.hls_to_rgb(h, light, s)
    return "#" + "".join(f"{round(x * 255):02x}" for x in (r, g, b))


def policy_color(policy: str) -> str:
    """The fixed colour of a policy's family (an unknown family: a fixed colour from its name)."""
    fam = family(policy)
    if fam in POLICY_COLORS:
        return POLICY_COLORS[fam]
    return _FALLBACK[sum(fam.encode()) % len(_FALLBACK)]


def policy_colors(policies) -> dict[str, str]:
    """Colour of each policy on one page: its family's; when several settings of one family share the page,
    the bundled default (or the plain family name, or else the first in sorted order) keeps the family
    colour and the others get lighter/darker shades of it, in sorted order."""
    names = list(dict.fromkeys(str(p) for p in policies))
    out: dict[str, str] = {}
    by_family: dict[str, list[str]] = {}
    for p in names:
        by_family.setdefault(family(p), []).append(p)
    for fam, group in by_family.items():
        base = policy_color(fam)
        group = sorted(group)
        lead = next((p for p in group if p in (fam, CANONICAL.get(fam))), group[0])
        out[lead] = base
        for i, p in enumerate((p for p in group if p != lead), start=1):
            out[p] = _shade(base, i)
    return out


def part_color(part: str) -> str:
    return PART_COLORS[part.removesuffix("_ms")]


def series_color(name: str) -> str:
    if name in SERIES_COLORS:
        return SERIES_COLORS[name]
    return policy_color(name)


def style(fig, **layout):
    """The shared layout: template, font, legend title size; `layout` passed on to update_layout."""
    fig.update_layout(template=TEMPLATE, font=dict(family="sans-serif", size=13), **layout)
    return fig


RATIO_LOW, RATIO_ONE, RATIO_HIGH = "#b2182b", "#f7f7f7", "#2166ac"  # below 1 red, 1 white, above 1 blue


def ratio_colors(values) -> dict:
    """Heatmap colour settings for a ratio (a speed over a baseline's): white exactly at 1, red below, blue above,
    and bounds that are the data's own range widened only to take in 1 (`zmin`, `zmax`). Never a symmetric range
    made up around 1, which for ratios of 0.9-3 would run the colour bar from -1 (a ratio is never negative)."""
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    lo, hi = (min(float(v.min()), 1.0), max(float(v.max()), 1.0)) if len(v) else (1.0, 1.0)
    if hi - lo < 1e-9:  # every cell at 1: a narrow band around it
        lo, hi = 1.0 - 1e-3, 1.0 + 1e-3
    mid = (1.0 - lo) / (hi - lo)
    if mid <= 0:  # every ratio >= 1
        scale = [[0.0, RATIO_ONE], [1.0, RATIO_HIGH]]
    elif mid >= 1:  # every ratio <= 1
        scale = [[0.0, RATIO_LOW], [1.0, RATIO_ONE]]
    else:
        scale = [[0.0, RATIO_LOW], [mid, RATIO_ONE], [1.0, RATIO_HIGH]]
    return dict(zmin=lo, zmax=hi, colorscale=scale)


def line_chart_svg(xs, series: dict, title: str, x_label: str, y_label: str, log_x: bool = False,
                   hline: float | None = None, width: int = 640, height: int = 360) -> str:
    """A static line chart as SVG text (for pages and notebooks read without JavaScript): `series` maps a name
    to y values over `xs`; each line in its policy_color (or series colour), with markers and a legend."""
    import math

    names = list(series)
    others = iter(_FALLBACK)
    pol = policy_colors([n for n in names if family(n) in POLICY_COLORS])
    colors = {n: SERIES_COLORS.get(n) or pol.get(n) or next(others) for n in names}
    fx = (lambda v: math.log(v)) if log_x else float
    ys = [float(v) for n in names for v in series[n] if v is not None and math.isfinite(float(v))]
    if hline is not None:
        ys.append(hline)
    x0, x1 = min(fx(x) for x in xs), max(fx(x) for x in xs)
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.08 or 0.01
    y0, y1 = y0 - pad, y1 + pad
    left, right, top, bottom = 70, 150, 40, 50
    pw, ph = width - left - right, height - top - bottom

    def px(x):
        return left + (fx(x) - x0) / ((x1 - x0) or 1) * pw

    def py(y):
        return top + (1 - (y - y0) / ((y1 - y0) or 1)) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
           f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#444"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#444"/>',
           f'<text x="{left + pw / 2}" y="{height - 12}" text-anchor="middle">{x_label}</text>',
           f'<text x="16" y="{top + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {top + ph / 2})">{y_label}</text>']
    for x in xs:
        out.append(f'<text x="{px(x):.1f}" y="{top + ph + 16}" text-anchor="middle">{x:g}</text>')
    for i in range(5):
        y = y0 + (y1 - y0) * i / 4
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.3f}</text>')
        out.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + pw}" y2="{py(y):.1f}" stroke="#eee"/>')
    if hline is not None:
        out.append(f'<line x1="{left}" y1="{py(hline):.1f}" x2="{left + pw}" y2="{py(hline):.1f}" stroke="gray" '
                   'stroke-dasharray="4 3"/>')
    for k, n in enumerate(names):
        pts = [(px(x), py(float(v))) for x, v in zip(xs, series[n]) if v is not None and math.isfinite(float(v))]
        c = colors[n]
        out.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
            c, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
        out += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.5" fill="{c}"/>' for a, b in pts]
        ly = top + 10 + 18 * k
        out.append(f'<line x1="{left + pw + 12}" y1="{ly}" x2="{left + pw + 32}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{left + pw + 38}" y="{ly + 4}">{n}</text>')
    out.append("</svg>")
    return "\n".join(out)
