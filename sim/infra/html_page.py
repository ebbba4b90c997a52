"""The one way every HTML page of the project is built (sim.api.run's report.html, sim.api.report's index.html,
sim.api.sensitivity's sensitivity.html, real/validate's fidelity.html, real.fidelity_report's pages): plotly.js
once in the page's head, each figure a div after it, so a page renders with no network (no CDN, no MathJax,
nothing fetched), and each figure's heading is made from what the figure plots (`heading`).

Where plotly.js comes from is the `--plotly` flag of every command that writes a page (`add_plotly_flag`):
- `inline` (the default): plotly.js (4.7 MB) inlined in the page: one file that renders anywhere, offline.
- `cached`: the page loads the copy under the cache folder (sim.infra.fsio.cache_root()/plotly/, written once,
  whole, the first time; a `file://` address: offline, on this machine): a small page that renders only
  here. A page whose copy is gone (`python -m sim.cache --prune`, another machine) says so at its
  top; any page written cached puts the copy back. With caching off (HYBRIDSPEC_CACHE_DIR=off): inline.
- `shared`: the page loads `plotly-<version>.min.js` from its own folder (`<script src=...>`, a relative path:
  still offline), and `write_page` writes that file there once, whole, the first time; a page written later
  into the same folder reuses it. A file of that name that is not byte for byte the installed plotly package's
  plotly.js is never replaced: the command stops with one line naming it (`check_asset`, called before any
  work). The committed reports/ are written shared, so its pages carry one copy between them.
`to_shared` turns an inlined page into exactly the shared page the same command would have written.

Every string a page shows is escaped here, once: a page's body is a list of `Markup` (what this module's builders
return: `heading`, `para`, `nav`, `figure_div`, each escaping the text it is given with `text`), and `page` escapes
any body part that is a plain string (it shows as a paragraph of text, never as markup). A writer therefore cannot
put a command-line argument, a file name or a value read from a results table into a page as live markup.
Figures' own strings travel as JSON that plotly escapes (`<` as \\u003c), drawn by plotly.js as text.

A page's own content (its figures' data and layout, plotly.js aside) is what `content_bytes` measures; long
series are cut to at most MAX_POINTS points per line before they reach a figure (`downsample`).
"""
from __future__ import annotations

import functools
import html as _html
import re
from pathlib import Path

import numpy as np

from sim.infra.cli import write_whole
from sim.infra.errors import ConfigError

MAX_POINTS = 400  # points per line of a time series: enough to read its shape, small enough to keep a page light
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px} p.note{color:#444;max-width:1100px} "
         "nav a{margin-right:1.2em}")


class Markup(str):
    """Page markup made by this module's builders, the only strings `page` puts into a page unescaped."""


def text(value) -> str:
    """`value` as text a page shows: `str(value)` with &, <, >, " and ' escaped (safe in content and attributes)."""
    return _html.escape(str(value), quote=True)


def para(value, cls: str | None = None, italic: bool = False) -> Markup:
    """A <p> paragraph showing `value` as text (escaped), of class `cls`; `italic` sets it in <i>."""
    inner = f"<i>{text(value)}</i>" if italic else text(value)
    attr = f" class='{text(cls)}'" if cls else ""
    return Markup(f"<p{attr}>{inner}</p>")


def nav(links: list[tuple[str, str]]) -> Markup:
    """A <nav> of in-page links: (anchor id, label) pairs, both escaped."""
    return Markup("<nav>" + "".join(f"<a href='#{text(a)}'>{text(label)}</a>" for a, label in links) + "</nav>")


PLOTLY_MODES = ("inline", "shared", "cached")
PLOTLY_HELP = ("where the HTML page gets plotly.js (4.7 MB) from: inline puts it in the page, one file that renders "
               "anywhere offline (to mail around); shared writes it once beside the page as plotly-VERSION.min.js "
               "and the page loads that file (still offline, no CDN; keep the two together; pages written into the "
               "same folder share it; an existing file of that name that is not this plotly.js is refused, never "
               "replaced); cached loads one copy kept in the cache folder (offline, this machine only; python -m "
               "sim.cache). The committed reports/ are written with shared")


def add_plotly_flag(parser, help_prefix: str = "", default: str = "inline") -> None:
    """The `--plotly inline|shared|cached` flag on an argparse parser or argument group. A bad value is argparse's
    one-line error and exit 2 (sim.infra.cli.ArgumentParser)."""
    parser.add_argument("--plotly", choices=PLOTLY_MODES, default=default,
                        help=f"{help_prefix}{PLOTLY_HELP} (default: {default})")


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """plotly.js as shipped inside the installed plotly package (no download)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


@functools.lru_cache(maxsize=1)
def plotly_version() -> str:
    """The version of plotly_js() (plotly.js's, not the Python package's), as a file name may hold it."""
    from plotly.offline import get_plotlyjs_version

    return re.sub(r"[^0-9A-Za-z.+-]", "_", str(get_plotlyjs_version()))


def asset_name() -> str:
    """The shared copy's file name, `plotly-<plotly.js version>.min.js`: another version gets another file, so
    pages written by an older plotly keep the copy they were written with."""
    return f"plotly-{plotly_version()}.min.js"


def _inline_script() -> str:
    return f"<script type='text/javascript'>{plotly_js()}</script>"


def _shared_script() -> str:
    return f"<script type='text/javascript' src='{_html.escape(asset_name())}'></script>"


def cached_asset() -> Path | None:
    """The cached copy of plotly.js (the `cached` mode's), written whole the first time, and rewritten when it is
    not this plotly's byte for byte (it is a cache); None when caching is off."""
    from sim.infra.fsio import cache_root

    root = cache_root()
    if root is None:
        return None
    from sim.infra.fsio import private_dir

    folder = private_dir(root / "plotly")  # code a browser loads: a folder only this user can write
    path = folder / asset_name()
    want = plotly_js().encode()
    try:
        same = not path.is_symlink() and path.is_file() and path.stat().st_size == len(want) and path.read_bytes() == want
    except OSError:
        same = False
    if not same:
        if path.is_symlink():  # never written through: the link goes, a file of our own takes its place
            path.unlink()
        write_whole(path, want, overwrite=True)
    return path


_MISSING = ("<script>window.addEventListener('DOMContentLoaded',function(){{if(typeof Plotly==='undefined'){{"
            "var p=document.createElement('p');p.className='note';p.textContent={msg};"
            "document.body.insertBefore(p,document.body.firstChild);}}}});</script>")


def _cached_script() -> str:
    import json

    path = cached_asset()
    if path is None:  # caching off: the page carries plotly.js itself
        return _inline_script()
    msg = (f"The figures need plotly.js, which this page loads from {path} (the cache, python -m sim.cache): it is "
           "not there (pruned, or the page was moved to another machine). Write the page again, or with "
           "--plotly inline to carry plotly.js in it.")
    return (f"<script type='text/javascript' src='{_html.escape(path.as_uri())}'></script>"
            + _MISSING.format(msg=json.dumps(msg).replace("</", "<\\/")))  # a JS string that cannot end the script


def _script(plotly: str) -> str:
    if plotly == "inline":
        return _inline_script()
    if plotly == "shared":
        return _shared_script()
    if plotly == "cached":
        return _cached_script()
    raise ConfigError(f"--plotly must be one of {', '.join(PLOTLY_MODES)}, got {str(plotly)[:40]!r}")


def figure_div(fig, div_id: str) -> Markup:
    """A figure as a div and the script that draws it; plotly.js is not included (`page` adds it once).
    A fixed div_id keeps a rerun byte-identical."""
    return Markup(fig.to_html(full_html=False, include_plotlyjs=False, include_mathjax=False, div_id=text(div_id),
                              config={"displaylogo": False}))


def page(title: str, body: list[str], plotly: str = "inline") -> str:
    """A whole HTML page: `title`, plotly.js once in the head (plotly: `inline`, the default, inlines it;
    `shared` loads asset_name() from the page's folder: write it with `write_page`; `cached` loads the cache's
    copy, cached_asset), then the `body` parts: Markup as it is, any other string as an escaped paragraph."""
    head = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{text(title)}</title>"
            f"<style>{STYLE}</style>{_script(plotly)}</head><body>")
    return "\n".join([head, *(b if isinstance(b, Markup) else para(b) for b in body), "</body></html>"])


def uses_shared(text: str) -> bool:
    """Whether a page loads the shared plotly.js beside it (a page written with plotly="shared")."""
    return _shared_script() in text


def to_shared(text: str) -> str:
    """An inlined page as the shared page the same command writes with --plotly shared: the one inlined
    plotly.js script replaced by the reference, every other byte kept. ConfigError unless inlined exactly once."""
    n = text.count(_inline_script())
    if n != 1:
        raise ConfigError(f"expected a page with this plotly's plotly.js inlined once, found {n} copies")
    return text.replace(_inline_script(), _shared_script(), 1)


def check_asset(folder) -> Path:
    """Before any work of a command writing a shared page into `folder`: a `plotly-<version>.min.js` already
    there must be this plotly's plotly.js byte for byte (a page would load whatever it holds, and it is never
    replaced); ConfigError naming it otherwise. Returns its path (which may not exist yet)."""
    path = Path(folder) / asset_name()
    if not (path.exists() or path.is_symlink()):
        return path
    if not path.is_file():
        raise ConfigError(f"{path}: expected plotly.js (the shared copy the pages beside it load), found "
                          f"{'a broken link' if path.is_symlink() else 'a folder or a device'}; remove it or choose "
                          "another output folder")
    want = plotly_js().encode()
    try:
        same = path.stat().st_size == len(want) and path.read_bytes() == want
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the shared plotly.js ({(exc.strerror or type(exc).__name__).lower()})") from None
    if not same:
        raise ConfigError(f"{path}: not the plotly.js {plotly_version()} of the installed plotly package (edited, "
                          "cut or from another install), and the pages beside it load it; it is never replaced "
                          "silently: remove it (the next page written with --plotly shared writes it afresh) or "
                          "choose another output folder")
    return path


def write_asset(folder) -> Path:
    """The shared plotly.js in `folder`: checked and reused when there (check_asset), else written whole (a
    temporary file renamed into place: a reader never sees half of it). Returns its path."""
    path = check_asset(folder)
    if not path.exists():
        try:
            write_whole(path, plotly_js().encode(), overwrite=False)  # bytes: UTF-8 whatever the locale
        except ConfigError:  # another writer put it there in between: it must be the same file
            pass
        check_asset(folder)
    return path


def write_page(path, text: str, overwrite: bool = False, hint: str = "pass --force to replace it") -> Path:
    """Write the page `text` to `path` whole (sim.infra.cli.write_whole); a page that loads the shared
    plotly.js (`uses_shared`) gets it beside it first (`write_asset`), so it never points at a missing file."""
    path = Path(path)
    if uses_shared(text):
        write_asset(path.parent)
    return write_whole(path, text, overwrite=overwrite, hint=hint)


def content_bytes(text: str) -> int:
    """Size of a page without the inlined plotly.js: its own data, layout and text."""
    return len(text.encode()) - len(plotly_js().encode()) if plotly_js() in text else len(text.encode())


def heading(level: int, text: str, anchor: str | None = None) -> Markup:
    """An <hN> heading (escaped), with an id to link to."""
    ident = f" id='{_html.escape(anchor)}'" if anchor else ""
    return Markup(f"<h{int(level)}{ident}>{_html.escape(str(text))}</h{int(level)}>")


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


def rewrap(text: str, title: str, plotly: str = "inline") -> str:
    """The page `text`'s figures, unchanged, re-rendered as a `page` (plotly.js inlined, or shared: see `page`;
    a page that loaded it from a CDN renders offline after this), each figure under a heading that is its own title."""
    import plotly.graph_objects as go

    body = []
    for div_id, data, layout in figures_in(text):
        fig = go.Figure({"data": data, "layout": layout}, skip_invalid=True)
        body += [heading(1 if not body else 2, fig.layout.title.text or div_id), figure_div(fig, div_id)]
    return page(title, body, plotly)
