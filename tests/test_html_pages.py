"""Every HTML page the project writes or commits renders offline and says what it shows (sim/infra/html_page.py).

Static checks (default run): no page loads anything from the network (no src/href to a remote address: plotly.js is
inlined once per page, or, written with --plotly shared, loaded from the one plotly-VERSION.min.js beside it: the
committed reports/ pages share one copy; or with --plotly cached, from the cache's copy by a
file:// address), every figure has a title and sits under a heading whose policy names it plots, ratio
colour scales are white at 1 within the data's own bounds, and a run report's own content stays under 1 MB with
its time series split per policy and cut to html_page.MAX_POINTS points a line.

`python -m pytest -m browser tests/test_html_pages.py` (needs Debian's `chromium`) renders every committed page in
headless Chromium with the network cut off and checks each figure was drawn.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from sim.infra.errors import ConfigError
from sim.infra.html_page import MAX_POINTS, content_bytes, downsample, figures_in

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"
COMMITTED = sorted((ROOT / "reports").glob("*.html"))
URL_ATTRS = ("src", "href", "data", "poster", "srcset", "action", "background")
INLINED = re.compile(r"\* plotly\.js v\d")  # the banner at the top of plotly.js: one per copy of it
SHARED = re.compile(r"<script type='text/javascript' src='(plotly-[0-9A-Za-z.+_-]+\.min\.js)'></script>")
CACHED = re.compile(r"<script type='text/javascript' src='(file:///[^']+/plotly-[0-9A-Za-z.+_-]+\.min\.js)'></script>")


class _Scan(HTMLParser):
    """The page's remote references and, in order, its headings and figure divs."""

    def __init__(self):
        super().__init__()
        self.remote: list[str] = []
        self.order: list[tuple[str, str]] = []  # ("h", text) or ("fig", div id)
        self._h = None

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k in URL_ATTRS and v and re.match(r"^\s*(https?:|//|ftp:)", v, re.I):
                self.remote.append(f"<{tag} {k}={v}>")
            if k == "style" and v and "url(" in v and re.search(r"url\(\s*['\"]?(https?:|//)", v):
                self.remote.append(f"<{tag} style={v}>")
        if re.fullmatch(r"h[1-3]", tag):
            self._h = ""
        ident = dict(attrs).get("id")
        if tag == "div" and ident:
            self.order.append(("div", ident))

    def handle_data(self, data):
        if self._h is not None:
            self._h += data

    def handle_endtag(self, tag):
        if re.fullmatch(r"h[1-3]", tag) and self._h is not None:
            self.order.append(("h", self._h.strip()))
            self._h = None


def _policy_families() -> set[str]:
    from sim.core.policies import list_policies

    return {u.split(":")[0].split("[")[0] for u in list_policies()}


def _policies_named(text: str, families: set[str]) -> set[str]:
    return {t for t in re.findall(r"[a-z][a-z0-9-]*", str(text).lower()) if t in families}


def _figure_text(data: list, layout: dict) -> str:
    """Every piece of text a figure shows: its title, trace names, colour-bar and axis titles, annotations."""
    parts = [((layout.get("title") or {}).get("text") or "")]
    parts += [str(a.get("text", "")) for a in layout.get("annotations", [])]
    for k, v in layout.items():
        if k.startswith(("xaxis", "yaxis")) and isinstance(v, dict):
            parts.append(str((v.get("title") or {}).get("text", "")))
    for tr in data:
        parts.append(str(tr.get("name", "")))
        parts.append(str(((tr.get("colorbar") or {}).get("title") or {}).get("text", "")))
    return " ".join(parts)


def check_page(text: str, where: str, folder: Path | None = None) -> None:
    """The static rules every page keeps (module docstring). folder: where the page lies, to check the shared
    plotly.js it loads is there."""
    scan = _Scan()
    scan.feed(text)
    assert not scan.remote, f"{where} loads from the network: {scan.remote[:3]}"
    assert "@import" not in "".join(re.findall(r"<style[^>]*>(.*?)</style>", text, re.S)), where
    figs = figures_in(text)
    assert figs, f"{where}: no figure"
    inlined, shared, cached = len(INLINED.findall(text)), SHARED.findall(text), CACHED.findall(text)
    assert (inlined, len(shared), len(cached)) in ((1, 0, 0), (0, 1, 0), (0, 0, 1)), \
        f"{where}: plotly.js must be inlined exactly once or loaded once from beside the page or the cache " \
        f"({inlined} inlined, {shared}, {cached})"
    if cached:
        from urllib.parse import unquote, urlparse

        asset = Path(unquote(urlparse(cached[0]).path))
        assert asset.is_file() and INLINED.findall(asset.read_text()[:400]), f"{where}: {asset} is not plotly.js"
    if shared and folder is not None:
        asset = folder / shared[0]
        assert asset.is_file(), f"{where}: loads {shared[0]}, which is not beside it"
        version = shared[0].removeprefix("plotly-").removesuffix(".min.js")
        assert INLINED.findall(asset.read_text()[:400]) and f"plotly.js v{version}" in asset.read_text()[:400], \
            f"{where}: {asset} is not plotly.js {version}"
    families = _policy_families()
    by_id = {fid: (data, layout) for fid, data, layout in figs}
    head = None
    for kind, val in scan.order:
        if kind == "h":
            head = val
        elif val in by_id:
            data, layout = by_id[val]
            shown = _figure_text(data, layout)
            assert ((layout.get("title") or {}).get("text") or "").strip(), f"{where}: figure {val} has no title"
            assert head is not None, f"{where}: figure {val} has no heading above it"
            missing = _policies_named(head, families) - _policies_named(shown, families)
            assert not missing, f"{where}: heading {head!r} names {sorted(missing)}, which figure {val} does not plot"
            for tr in data:
                if tr.get("type") == "heatmap" and "/" in _figure_text([tr], {}):
                    check_ratio_scale(tr, f"{where}: {val}")
    assert {v for k, v in scan.order if k == "div"} >= set(by_id), where


def check_ratio_scale(tr: dict, where: str) -> None:
    """A ratio heatmap: white at 1, bounds within the cells' own range widened only to 1 (no made-up symmetric
    span: a ratio is never negative)."""
    z = np.asarray([[np.nan if v is None else v for v in row] for row in _z(tr)], dtype=float)
    lo, hi = float(np.nanmin(z)), float(np.nanmax(z))
    assert tr["zmin"] >= min(lo, 1.0) - 1e-9 and tr["zmax"] <= max(hi, 1.0) + 1e-9, (where, tr["zmin"], tr["zmax"], lo, hi)
    assert tr["zmin"] > 0, where
    scale = tr["colorscale"]
    mid = (1.0 - tr["zmin"]) / (tr["zmax"] - tr["zmin"])
    white = [c for pos, c in scale if abs(pos - mid) < 1e-9]
    assert white, f"{where}: the colour scale is not pinned at 1 ({scale})"


def _z(tr: dict):
    """A trace's z (or any array) as plotly wrote it: a list, or its typed-array form {dtype, bdata, shape}."""
    z = tr["z"]
    if isinstance(z, dict) and "bdata" in z:
        import base64

        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"]))
        shape = z.get("shape", len(arr))
        return arr.reshape([int(x) for x in str(shape).strip("[]").split(",")])
    return z


@pytest.mark.parametrize("page", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_page_is_offline_and_headed(page):
    check_page(page.read_text(), str(page.relative_to(ROOT)), page.parent)


def test_committed_pages_share_one_plotly():
    """reports/ keeps one plotly.js for all its pages (the issue: reports/ <= 10 MB, plotly.js at most once)."""
    assert COMMITTED
    for page in COMMITTED:
        text = page.read_text()
        assert not INLINED.findall(text) and SHARED.findall(text), f"{page.name}: not written with --plotly shared"
        assert len(text.encode()) < 1_000_000, page.name
    assets = sorted((ROOT / "reports").glob("plotly-*.min.js"))
    assert len(assets) == 1 and {SHARED.findall(p.read_text())[0] for p in COMMITTED} == {assets[0].name}


def test_a_cdn_page_and_a_mislabelled_heading_are_caught():
    """The checks themselves fail on what the issue found: plotly from a CDN, a heading naming another policy."""
    import plotly.graph_objects as go

    from sim.infra.html_page import figure_div, heading, page

    fig = go.Figure(go.Bar(name="hybrid", x=[1], y=[1]))
    fig.update_layout(title="hybrid over adaptive")
    cdn = fig.to_html(include_plotlyjs="cdn", full_html=True)
    with pytest.raises(AssertionError, match="network"):
        check_page(cdn, "cdn")
    wrong = page("t", [heading(2, "Hybrid-price over adaptive by context length"), figure_div(fig, "f")])
    with pytest.raises(AssertionError, match="hybrid-price"):
        check_page(wrong, "wrong")
    check_page(page("t", [heading(2, "hybrid over adaptive"), figure_div(fig, "f")]), "right")
    heat = go.Figure(go.Heatmap(z=[[0.9, 3.0]], colorscale="RdBu", zmin=-1.0, zmax=3.0,
                                colorbar=dict(title="hybrid / adaptive")))
    heat.update_layout(title="hybrid over adaptive")
    with pytest.raises(AssertionError):
        check_page(page("t", [heading(2, "hybrid over adaptive"), figure_div(heat, "h")]), "heat")


def test_run_report_is_light_split_and_offline(tmp_path):
    """A long run: every time-series line cut to MAX_POINTS, one panel per policy, own content under 1 MB."""
    from sim.api.report import write_run_report
    from sim.core.result import BREAKDOWN

    rng = np.random.default_rng(0)
    pols = ["none", "adaptive", "hybrid", "hybrid-price", "hybrid-tree", "oracle", "ngram-fixed:32", "model-fixed:7",
            "ngram-first", "ngram-threshold"]
    rows, steps = [], []
    n = 200_000
    for b in (4, 128):
        for p in pols:
            row = {"policy": p, "batch_size": b, "trace": "t.jsonl", "model": "m", "gpu": "g", "cost": "roofline",
                   "drafter": "d", "ngram_k": 32, "seed": 0, "requests": 10, "output_tokens": 10,
                   "output_throughput_tok_s": 1.0, "speedup_vs_baseline": 1.0, "mean_step_ms": 1.0,
                   **{"share_" + k.removesuffix("_ms"): 1 / len(BREAKDOWN) for k in BREAKDOWN}}
            rows.append(row)
            steps.append((row, {"t_start_ms": np.cumsum(rng.random(n)), "emitted": rng.integers(1, 9, n),
                                "step_ms": rng.random(n) + 0.5}))
    out = tmp_path / "report.html"
    write_run_report(rows, steps, out)
    text = out.read_text()
    check_page(text, "run report")
    assert content_bytes(text) < 1_000_000, content_bytes(text)
    (_, data, layout), = [f for f in figures_in(text) if "simulated time" in f[2]["title"]["text"]]
    axes = {}
    for tr in data:
        assert len(_z({"z": tr["x"]}) if isinstance(tr["x"], dict) else tr["x"]) <= MAX_POINTS
        axes.setdefault(tr.get("xaxis", "x"), []).append(tr)
    assert len(axes) == len(pols) and all(len(v) == 2 for v in axes.values())  # a panel per policy, a line per batch


def test_run_report_of_a_real_run_and_no_baseline(tmp_path):
    from conftest import run_cli_inprocess

    env = {"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "cache")}
    p = run_cli_inprocess("sim.api.run", "--trace", TINY, "--policy", "hybrid", "--batch-size", "2", "--workers", "1",
                          "--no-progress", "--out", tmp_path / "o", cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    check_page((tmp_path / "o" / "report.html").read_text(), "run report")
    p = run_cli_inprocess("sim.api.run", "--trace", TINY, "--policy", "hybrid", "--batch-size", "2", "--workers", "1",
                          "--no-progress", "--no-baseline", "--out", tmp_path / "n", cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "n" / "report.html").read_text()
    check_page(text, "run report, no baseline")
    assert "over adaptive" not in text.split("* plotly.js")[0] + text.split("</script>", 1)[-1]


def test_downsample_keeps_spikes_in_the_mean():
    x = np.arange(10_000, dtype=float)
    y = np.zeros(10_000)
    y[5_001] = 1e6
    xs, ys = downsample(x, y, 100)
    assert len(xs) == 100 and ys.max() > 0 and np.isclose(ys.sum() * 100, y.sum())


# ------------------------------------------------------------------------------------------ --plotly inline|shared
def _fig_page(plotly: str, title: str = "t") -> str:
    import plotly.graph_objects as go

    from sim.infra.html_page import figure_div, heading, page

    fig = go.Figure(go.Bar(name="hybrid", x=[1], y=[1]))
    fig.update_layout(title="hybrid over adaptive")
    return page(title, [heading(2, "hybrid over adaptive"), figure_div(fig, "f")], plotly)


def test_inline_default_inlines_plotly_once():
    from sim.infra.html_page import page, plotly_js, uses_shared

    text = _fig_page("inline")
    assert text == _fig_page(page.__defaults__[0])  # inline is the default
    assert text.count(plotly_js()) == 1 and len(INLINED.findall(text)) == 1 and not SHARED.findall(text)
    assert not uses_shared(text)
    check_page(text, "inline")


def test_shared_pages_reference_one_asset_written_once(tmp_path):
    """Written shared: the page loads plotly-VERSION.min.js from its folder and carries none of plotly.js; the
    first page writes the file whole, a second page in the same folder reuses it (not rewritten)."""
    from sim.infra.html_page import asset_name, content_bytes, plotly_js, to_shared, write_page

    text = _fig_page("shared")
    assert plotly_js()[:2000] not in text and not INLINED.findall(text) and len(text) < 20_000
    assert SHARED.findall(text) == [asset_name()] and content_bytes(text) == len(text.encode())
    assert to_shared(_fig_page("inline")) == text  # a transformed inlined page is exactly what `shared` writes
    p1 = write_page(tmp_path / "a.html", text)
    asset = tmp_path / asset_name()
    assert asset.read_bytes() == plotly_js().encode() and p1.read_text() == text
    check_page(p1.read_text(), "shared", tmp_path)
    first = asset.stat()
    write_page(tmp_path / "b.html", _fig_page("shared", "second"))
    assert (asset.stat().st_ino, asset.stat().st_mtime_ns) == (first.st_ino, first.st_mtime_ns)  # reused
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(["a.html", "b.html", asset_name()])  # no temporaries
    write_page(tmp_path / "c.html", _fig_page("inline"))  # an inlined page needs no asset, and leaves it alone
    assert asset.stat().st_mtime_ns == first.st_mtime_ns
    with pytest.raises(ConfigError, match="--plotly must be one of inline, shared"):
        _fig_page("cdn")
    with pytest.raises(ConfigError, match="inlined once, found 0"):
        to_shared(text)


@pytest.mark.parametrize("damage", ["edited", "cut", "folder"])
def test_a_differing_asset_is_refused_never_replaced(tmp_path, damage):
    from sim.infra.html_page import asset_name, check_asset, plotly_js, write_page

    asset = tmp_path / asset_name()
    if damage == "folder":
        asset.mkdir()
    else:
        js = plotly_js()
        asset.write_text(js.replace("plotly", "PLOTLY", 1) if damage == "edited" else js[:1000])
        before = asset.read_bytes()
    with pytest.raises(ConfigError, match=re.escape(str(asset))):
        check_asset(tmp_path)
    with pytest.raises(ConfigError, match="never replaced silently|expected plotly.js"):
        write_page(tmp_path / "p.html", _fig_page("shared"))
    assert not (tmp_path / "p.html").exists()  # no page pointing at the wrong plotly.js
    if damage != "folder":
        assert asset.read_bytes() == before


def test_every_html_command_has_the_plotly_flag(capsys):
    """Each command that writes a page takes --plotly inline|shared|cached (default inline), with help."""
    import importlib

    parsers = {"sim.api.run": "parse_args", "real.validation.validate": "parse_args",
               "real.validation.gpu_check": "parse_args", "sim.api.report": "main", "sim.api.sensitivity": "main",
               "real.validation.report": "main"}
    for module, fn in parsers.items():
        with pytest.raises(SystemExit):
            getattr(importlib.import_module(module), fn)(["--help"])
        flat = " ".join(capsys.readouterr().out.split())
        default = "inline"  # sim.run's too (issue 62): a copied run folder keeps its charts
        assert "--plotly {inline,shared,cached}" in flat and f"(default: {default})" in flat, module
        assert "(default: None)" not in flat, module


@pytest.mark.parametrize("module,args", [("sim.api.sensitivity", ["--html-from", "reports/sensitivity.csv"]),
                                         ("sim.api.report", ["nowhere"]), ("real.validation.report", ["nowhere"])])
def test_a_bad_plotly_value_is_one_line(module, args, tmp_path):
    from conftest import run_cli_inprocess

    p = run_cli_inprocess(module, *args, "--out", tmp_path / "o.md", "--plotly", "cdn", cwd=ROOT)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("error: ") and "invalid choice: 'cdn'" in p.stderr
    assert "'inline', 'shared'" in p.stderr and not (tmp_path / "o.md").exists()


def test_sensitivity_page_shared_then_reused_and_a_tampered_asset_stops_it(tmp_path):
    """The command end to end: --plotly shared writes the page and the asset; a rerun reuses the asset; a
    tampered asset is one error line, exit 2, before any page is written, and is left as it was."""
    from conftest import run_cli_inprocess

    from sim.infra.html_page import asset_name, plotly_js

    out = tmp_path / "o"
    args = ["--html-from", ROOT / "reports" / "sensitivity.csv", "--out", out, "--plotly", "shared"]
    p = run_cli_inprocess("sim.api.sensitivity", *args, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    page_, asset = out / "sensitivity.html", out / asset_name()
    check_page(page_.read_text(), "sensitivity shared", out)
    assert asset.read_bytes() == plotly_js().encode() and page_.stat().st_size < 200_000
    ino = asset.stat().st_ino
    assert run_cli_inprocess("sim.api.sensitivity", *args, "--force", cwd=ROOT).returncode == 0
    assert asset.stat().st_ino == ino
    page_.unlink()
    asset.write_text("alert('not plotly')")
    p = run_cli_inprocess("sim.api.sensitivity", *args, cwd=ROOT)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and str(asset) in p.stderr, p.stderr
    assert asset.read_text() == "alert('not plotly')" and not page_.exists()
    p = run_cli_inprocess("sim.api.sensitivity", *args[:-2], cwd=ROOT)  # the default: inline, asset untouched
    assert p.returncode == 0, p.stderr
    assert len(INLINED.findall(page_.read_text())) == 1 and asset.read_text() == "alert('not plotly')"


def test_run_report_shared(tmp_path):
    from conftest import run_cli_inprocess

    from sim.infra.html_page import asset_name

    p = run_cli_inprocess("sim.api.run", "--trace", TINY, "--policy", "hybrid", "--batch-size", "2", "--workers", "1",
                          "--no-progress", "--plotly", "shared", "--out", tmp_path / "o", cwd=ROOT,
                          env={"HYBRIDSPEC_CACHE_DIR": str(tmp_path / "cache")})
    assert p.returncode == 0, p.stderr
    check_page((tmp_path / "o" / "report.html").read_text(), "run report, shared", tmp_path / "o")
    assert (tmp_path / "o" / asset_name()).is_file()


def test_sensitivity_and_fidelity_pages(tmp_path):
    from real.validation.fidelity import format_html
    from sim.api.sensitivity import sensitivity_html
    import pandas as pd

    summ = pd.read_csv(ROOT / "reports" / "sensitivity.csv", dtype={"value": str})
    check_page(sensitivity_html(summ), "sensitivity")
    cell = {"trace": "traces/codeedit.jsonl", "policy": "hybrid-price", "batch_size": 4,
            **{k: {"tok_per_s": 10.0} for k in ("real", "predicted", "synthetic")}}
    check_page(format_html([cell], {"median_error": 0.05}, {}), "fidelity")


def test_sweep_page_headings_follow_the_plotted_policy(tmp_path):
    """The context-length section names the hybrid its heatmaps show (hybrid here, hybrid-price absent)."""
    import sim.api.sweep as sw
    from sim.api.report import load_sweep, write_sweep_report

    cells = sw.expand({"trace": [str(TINY)], "policy": ["adaptive", "hybrid"], "batch_size": [2, 8]})
    sw.run_sweep(cells, tmp_path / "s", workers=1, progress=False)
    df, req = load_sweep(tmp_path / "s")
    write_sweep_report(df, req, tmp_path / "r")
    text = (tmp_path / "r" / "index.html").read_text()
    check_page(text, "sweep index")
    assert "<h2 id='sec1'>hybrid over adaptive by context length</h2>" in text


# ------------------------------------------------------------------------------------------ browser (marked)
def _chromium() -> str | None:
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.mark.browser
@pytest.mark.parametrize("page", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_page_renders_offline_in_chromium(page, tmp_path):
    """Headless Chromium, network cut off (a proxy that refuses every connection), scripts run: every figure
    div ends up holding plotly's drawn SVG. A page that needed a CDN would stay blank."""
    exe = _chromium()
    if exe is None:
        pytest.fail("no chromium: apt-get update && apt-get install -y chromium")
    n_figs = len(figures_in(page.read_text()))
    proc = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--proxy-server=127.0.0.1:9",
                           "--proxy-bypass-list=<-loopback>", f"--user-data-dir={tmp_path / 'profile'}",
                           "--virtual-time-budget=20000", "--dump-dom", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=180)
    dom = proc.stdout
    assert proc.returncode == 0 and dom, proc.stderr[-2000:]
    drawn = dom.count('class="main-svg"')
    assert drawn >= n_figs, f"{page.name}: {drawn} drawn SVGs for {n_figs} figures (blank page?)"
