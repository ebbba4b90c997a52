"""The one way every HTML page of the project is built (sim.api.run's report.html, sim.api.report's index.html,
sim.api.sensitivity's sensitivity.html, real/validate's fidelity.html): plotly.js inlined once in the page's head,
each figure a div after it, so a page renders with no network (no CDN, no MathJax, nothing fetched), and
each figure's heading is made from what the figure plots (`heading`).

A page's own content (its figures' data and layout, plotly.js aside) is what `content_bytes` measures; long
series are cut to at most MAX_POINTS points per line before they reach a figure (`downsample`).
"""
from __future__ import annotations

import functools
import html as _html
import re

import numpy as np

MAX_POINTS = 400  # points per line of a time series: enough to read its shape, small enough to keep a page light
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px} p.note{color:#444;max-width:1100px} "
         "nav a{margin-right:1.2em}")


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js as shipped inside the installed plotly package (no download)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def figure_div(fig, div_id: str) -> str:
    """A figure as a div and the script that draws it; plotly.js is not included (`page` inlines it once).
    A fixed div_id keeps a rerun byte-identical."""
    return fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False, div_id=div_id,
                       config={"displaylogo": False})


def page(title: str, body: list[str]) -> str:
    """A whole HTML page: `title`, plotly.js inlined once in the head, then the `body` parts (HTML strings)."""
    head = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_html.escape(title)}</title>"
            f"<style>{STYLE}</style><script type='text/javascript'>{plotly_js()}</script></head><body>")
    return "\n".join([head, *body, "</body></html>"])


def content_bytes(text: str) -> int:
    """Size of a page without the inlined plotly.js: its own data, layout and text."""
    return len(text.encode()) - len(plotly_js().encode()) if plotly_js() in text else len(text.encode())


def heading(level: int, text: str, anchor: str | None = None) -> str:
    """An <hN> heading (escaped), with an id to link to."""
    ident = f" id='{_html.escape(anchor)}'" if anchor else ""
    return f"<h{level}{ident}>{_html.escape(text)}</h{level}>"


def downsample(x: np.ndarray, y: np.ndarray, max_points: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most max_points of a series: the mean of y over equal runs of consecutive points (x: each run's
    first), so a spike is averaged in, not skipped as a stride would skip it. The last point is kept."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = len(x)
    if n <= max_points:
        return x, y
    edges = np.linspace(0, n, max_points + 1).astype(np.int64)
    sums = np.add.reduceat(y, edges[:-1])
    return x[edges[:-1]], sums / np.diff(edges)


def figures_in(text: str) -> list[tuple[str, list, dict]]:
    """(div id, data, layout) of every plotly figure drawn on a page (its `Plotly.newPlot(id, data, layout, ...)`
    calls): what the page's tests read, and what `rewrap` re-renders."""
    import json

    dec = json.JSONDecoder()
    out = []
    for m in re.finditer(r"Plotly\.newPlot\(\s*", text):
        pos = m.end()
        args = []
        for _ in range(3):
            val, pos = dec.raw_decode(text, pos)
            args.append(val)
            pos = text.index(",", pos) + 1 if len(args) < 3 else pos
            while text[pos].isspace():
                pos += 1
        out.append((args[0], args[1], args[2]))
    return out


def rewrap(text: str, title: str) -> str:
    """The page `text`'s figures, unchanged, re-rendered as a `page`: plotly.js inlined (a page that loaded it
    from a CDN renders offline after this), each figure under a heading that is its own title."""
    import plotly.graph_objects as go

    body = []
    for div_id, data, layout in figures_in(text):
        fig = go.Figure({"data": data, "layout": layout}, skip_invalid=True)
        body += [heading(1 if not body else 2, fig.layout.title.text or div_id), figure_div(fig, div_id)]
    return page(title, body)
