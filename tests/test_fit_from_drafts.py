"""python -m sim.fit_profile --from-drafts: fit the synthetic DSpark profile to recorded drafts.

The recorded drafts here are the bundled profile's own chains (seed 1) on the first 40 requests of
general.jsonl, written as a sidecar the way real/validation/validate.py's _write_drafts does; the fit draws its
synthetic chains with seed 0, so recovery is checked against independent draws, not the same ones."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sim.infra.cli import run_cli
from sim.api import fit_profile as fp
from sim.core.drafters import model as model_mod
from sim.core.drafters.model import load_drafter_profile
from sim.api.run import SimSetup, prepare, run_one

REPO = Path(__file__).resolve().parents[1]
TRACE = str(REPO / "traces" / "general.jsonl")
BASE = "dspark-qwen3-b7"
N = 40


def _write_sidecar(path: Path, prep, ids, rows=None) -> None:
    tb = prep.tables
    lines = []
    for i, rid in enumerate(ids):
        a, b = int(tb.offsets[i]), int(tb.offsets[i] + tb.out_len[i])
        conf = np.round(tb.m_conf[a:b].astype(np.float64), 6)
        lines.append(json.dumps({"id": rid, "model_conf": (conf if rows is None else conf[:, :rows]).tolist(),
                                 "model_acc": np.minimum(tb.m_acc[a:b], rows or 99).astype(int).tolist()}))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """The sidecar, its request ids and the simulated tau of the profile that drew it (seed 1)."""
    from sim.core.trace import load_trace

    d = tmp_path_factory.mktemp("drafts")
    prep = prepare(SimSetup(trace=TRACE, limit=N, seed=1))
    ids = [r.id for r in load_trace(TRACE, limit=N).requests]
    path = d / "gen40.jsonl"
    _write_sidecar(path, prep, ids)
    tau = run_one(prep, "model-fixed:7", 4)[0]["mean_tokens_per_step"]
    return {"path": path, "ids": ids, "prep": prep, "tau": tau, "dir": d}


@pytest.fixture(scope="module")
def fitted(recorded):
    out = recorded["dir"] / "fitted.json"
    return fp.from_drafts(str(recorded["path"]), TRACE, BASE, None, N, out, "fitted-gen40", False)


def test_recovers_depth1_acceptance_of_both_classes(fitted):
    """q1[c] is the share of class-c positions whose first drafted token is accepted. Each position's depth-1
    slot sits on its own token (its own Z_t, E_i1), so these outcomes are independent Bernoulli(q1[c]) and the
    estimate's standard error is sqrt(q1 (1 - q1) / n): about 0.005 (normal, ~8900 positions) and 0.007
    (copied, ~1700). 4 standard errors: a wrong fit fails, sampling noise does not."""
    true = load_drafter_profile(BASE)
    n = fitted["fit"]["n"][:, 0]
    assert n[0] > 5000 and n[1] > 1000
    for c in (0, 1):
        q, got = true.q1[c], fitted["fitted"].q1[c]
        assert abs(got - q) < 4 * np.sqrt(q * (1 - q) / n[c]), (c, got, q)
    # decay and sigma are noisier (depths 2..7 of fewer chains; the AUC of ~10k positions): loose checks
    assert abs(fitted["fitted"].decay[0] - true.decay[0]) < 0.01
    assert abs(fitted["fitted"].decay[1] - true.decay[1]) < 0.01
    assert abs(fitted["fitted"].sigma - true.sigma) < 0.1


def test_fitted_tau_and_auc_match_the_recorded(fitted, recorded):
    """tau over ~3100 request-steps has a sampling error of about 1.2% (per-step tokens sd ~2.3), so two
    independent draws differ by about 1.7% (1 sd); 5% is ~3 sd. The AUC is what sigma was bisected on."""
    m = fitted["measured"]
    assert m["recorded"]["tau"] == pytest.approx(recorded["tau"], rel=1e-12)  # the replay is exact
    assert abs(m["fitted"]["tau"] / m["recorded"]["tau"] - 1) < 0.05
    assert abs(m["fitted"]["auc"] - m["recorded"]["auc"]) < 0.01


def test_written_profile_loads_by_path_and_says_where_it_came_from(fitted, recorded):
    path = fitted["path"]
    p = load_drafter_profile(str(path))
    assert p == fitted["fitted"] and p.name == "fitted-gen40" and p.block == 7
    base = load_drafter_profile(BASE)
    assert (p.rho, p.copy_min_ext, p.temp_scale, p.conf_temperature) == \
        (base.rho, base.copy_min_ext, base.temp_scale, base.conf_temperature)
    assert "--from-drafts" in p.source and str(recorded["path"]) in p.source and "kept from the base profile" in p.source
    assert len(p.copy_prior) == len(p.copy_prior_edges) + 1
    raw = json.loads(path.read_text())
    assert set(raw) == set(json.loads((REPO / "models" / "drafters" / f"{BASE}.json").read_text()))


def _cli(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        run_cli(fp.main, argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_cli_default_name_loads_by_name(recorded, tmp_path, monkeypatch, capsys):
    """Without --out the profile goes to models/drafters/fitted-<sidecar stem>.json (here a stand-in folder)."""
    shutil.copy(REPO / "models" / "drafters" / f"{BASE}.json", tmp_path)
    monkeypatch.setattr(model_mod, "MODELS_DIR", tmp_path)
    code, out, err = _cli(["--from-drafts", str(recorded["path"]), "--trace", TRACE, "--limit", str(N)], capsys)
    assert code == 0, err
    assert (tmp_path / "fitted-gen40.json").exists()
    assert load_drafter_profile("fitted-gen40").name == "fitted-gen40"
    assert "--drafter fitted-gen40" in out and "recorded drafts" in out and "fitted profile" in out


def _error(argv, capsys) -> str:
    code, _, err = _cli(argv, capsys)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    return err


def test_existing_out_is_refused_before_any_work(recorded, tmp_path, capsys):
    out = tmp_path / "x.json"
    out.write_text("keep me\n")
    # the sidecar does not even exist: the --out check comes first
    err = _error(["--from-drafts", str(tmp_path / "missing.jsonl"), "--trace", TRACE, "--out", str(out)], capsys)
    assert "already exists" in err and "--force" in err
    assert out.read_text() == "keep me\n"


def test_bad_sidecars_are_one_line_errors(recorded, tmp_path, capsys):
    out = tmp_path / "p.json"
    base = ["--trace", TRACE, "--limit", str(N), "--out", str(out)]
    lines = recorded["path"].read_text().splitlines()

    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(lines[0] + "\n" + lines[1].replace(recorded["ids"][1], "no-such-request", 1) + "\n")
    assert "no-such-request" in _error(["--from-drafts", str(unknown), *base], capsys)

    beyond = tmp_path / "beyond.jsonl"  # an id of the trace but past --limit
    beyond.write_text(lines[5] + "\n")
    assert "--limit" in _error(["--from-drafts", str(beyond), *base[:2], "--limit", "3", *base[4:]], capsys)

    k5 = tmp_path / "k5.jsonl"
    _write_sidecar(k5, recorded["prep"], recorded["ids"][:3], rows=5)
    assert "--block" in _error(["--from-drafts", str(k5), *base], capsys)
    assert "--block" in _error(["--from-drafts", str(recorded["path"]), *base, "--block", "5"], capsys)

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert "empty" in _error(["--from-drafts", str(empty), *base], capsys)

    assert "file not found" in _error(["--from-drafts", str(tmp_path / "missing.jsonl"), *base], capsys)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert "bad.jsonl:1" in _error(["--from-drafts", str(bad), *base], capsys)

    short = tmp_path / "short.jsonl"
    row = json.loads(lines[0])
    short.write_text(json.dumps({**row, "model_conf": row["model_conf"][:-1], "model_acc": row["model_acc"][:-1]}) + "\n")
    assert "positions" in _error(["--from-drafts", str(short), *base], capsys)

    assert "--trace" in _error(["--from-drafts", str(recorded["path"]), "--out", str(out)], capsys)
    assert "--from-drafts" in _error(["--out", str(out)], capsys)
    assert not out.exists()
