"""The padded verify form (sim/core/cost/padded.py): a step's padded attention shape, the table's price of it, the
simulator charging it step by step, and real/validation/profile.py fitting it from recorded shapes."""
import json

import numpy as np
import pytest

from real.validation.profile import fit_verify
from sim.core.cost import CostTable, ProfiledCost, load_cost_table, write_cost_table
from sim.core.cost.padded import AttentionShape, padded_shape
from sim.infra.errors import ConfigError


def table(**kw) -> CostTable:
    args = dict(llm="smollm2-135m", gpu="cpu", verify_tokens=[1, 8, 64, 512], verify_ms=[20.0, 30.0, 60.0, 300.0],
                draft_reqs=[1, 4], draft_ms=[5.0, 9.0], kv_ms_per_token=0.01, seq_ms=2.0, logits_ms_per_row=0.25,
                attn_ms_per_row_kv=1e-3, ngram=([1], [0.5]), alloc={"*": ([1], [0.2])}, sample=([1], [0.1]),
                cpu={"base_ms": 1.0, "per_req_ms": 0.0, "per_token_ms": 0.0}, kv_capacity_tokens=10**9,
                vocab_size=49152, short_query_max=32, kv_view_ms_per_token=0.002)
    args.update(kw)
    return CostTable(**args)


def test_padded_shape_follows_the_engines_layout():
    # three decodes: gathered and padded to the longest (3 x 500), not the sum (800)
    assert padded_shape([1, 1, 1], [100, 200, 500], 32) == AttentionShape(1500, 0, 0)
    # a lone decode is read in place
    assert padded_shape([1], [300], 32) == AttentionShape(0, 300, 0)
    # drafts pad every short query to the longest: 2 x (8 - 1) rows x 300 keys
    assert padded_shape([8, 1], [300, 100], 32) == AttentionShape(600, 0, 2 * 7 * 300)
    # a prefill chunk (longer than short_max) gets its own call: read in place, its rows beyond the first
    assert padded_shape([100, 1, 1], [100, 50, 60], 32) == AttentionShape(120, 100, 99 * 100)
    assert padded_shape([], [], 32) == AttentionShape(0, 0, 0)
    # equal contexts and queries: the aggregate form's K and (T - S) K / S
    s = padded_shape([4, 4, 4], [200, 200, 200], 32)
    assert s.kv_gather == 600 and s.attn_rows_kv == (12 - 3) * 600 / 3


def test_padded_table_prices_the_shape_and_round_trips(tmp_path):
    c = ProfiledCost(table(), fallback=None)
    assert c.padded
    agg = c.verify_ms(3, 800, 3, logit_rows=3)
    shp = AttentionShape(1500, 0, 0)
    # padded: 1500 gathered entries, not 800 summed ones
    assert c.verify_ms(3, 800, 3, logit_rows=3, shape=shp) == pytest.approx(agg + 0.01 * (1500 - 800))
    assert c.verify_ms(1, 300, 1, shape=AttentionShape(0, 300, 0)) == pytest.approx(
        c.verify_ms(1, 300, 1) - 0.01 * 300 + 0.002 * 300)
    assert c.verify_ms(0, 300, 1, shape=shp) == 0.0
    # an unpadded table ignores the shape
    u = ProfiledCost(table(short_query_max=0), fallback=None)
    assert not u.padded and u.verify_ms(3, 800, 3, shape=shp) == u.verify_ms(3, 800, 3)
    p = write_cost_table(table(), tmp_path / "t.json")
    t = load_cost_table(p)
    assert t.short_query_max == 32 and t.kv_view_ms_per_token == pytest.approx(0.002)
    assert "short_query_max" not in write_cost_table(table(short_query_max=0), tmp_path / "u.json").read_text()
    d = json.loads(p.read_text())
    d["short_query_max"] = 1.5
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="short_query_max"):
        load_cost_table(tmp_path / "bad.json")


def _shaped_steps(rng, n, kv_gather_ms, kv_view_ms, attn_ms):
    """Profile-like steps with known padded costs: decodes of uneven contexts at batch 1 and 8, prefills."""
    rows = []
    for _ in range(n):
        kind = rng.integers(3)
        if kind == 0:    # one request, maybe with drafts
            q = int(rng.integers(1, 9))
            k = int(rng.integers(50, 600))
            qs, ks = [q], [k]
        elif kind == 1:  # 8 requests of uneven contexts
            qs = rng.integers(1, 9, 8).tolist()
            ks = rng.integers(50, 600, 8).tolist()
        else:            # a prefill chunk
            q = int(rng.integers(40, 500))
            qs, ks = [q], [q]
        sh = padded_shape(qs, ks, 32)
        T, S, K = sum(qs), len(qs), sum(ks)
        y = 20.0 + 0.5 * T + 2.0 * S + kv_gather_ms * sh.kv_gather + kv_view_ms * sh.kv_view + attn_ms * sh.attn_rows_kv
        rows.append(dict(tokens=T, num_seqs=S, kv_tokens=K, logit_rows=T, verify_ms=y + 0.25 * T, **sh._asdict()))
    return [{c: np.array([r[c] for r in rows]) for c in rows[0]}]


def test_fit_verify_recovers_the_padded_terms():
    steps = _shaped_steps(np.random.default_rng(0), 600, 0.008, 0.002, 2e-4)
    v = fit_verify(steps, 0.25, 0.008, short_query_max=32)
    assert v["short_query_max"] == 32
    assert v["kv_view_ms_per_token"] == pytest.approx(0.002, rel=0.05)
    assert v["attn_ms_per_row_kv"] == pytest.approx(2e-4, rel=0.05)
    assert v["seq_ms"] == pytest.approx(2.0, rel=0.1)
    assert v["fit_median_abs_rel_error"] < 1e-3
    # without the shape columns (or without short_query_max): the aggregate form, no padded fields
    agg = fit_verify([{k: a for k, a in steps[0].items() if k not in ("kv_gather", "kv_view", "attn_rows_kv")}],
                     0.25, 0.008)
    assert "short_query_max" not in agg and "kv_view_ms_per_token" not in agg
    assert "short_query_max" not in fit_verify(steps, 0.25, 0.008)


def test_reprice_reads_recorded_shapes_and_refuses_half_a_rebuild(tmp_path):
    import pandas as pd

    from real.validation.reprice import main as reprice_main, profile_steps

    rows = []
    for run, pol in enumerate(("none", "none", "adaptive")):
        for i in range(3):
            rows.append({"t_start_ms": 10.0 * i, "step_ms": 10.0, "policy": pol, "num_decode": 1, "draft_ms": 0.0,
                         "num_seqs": 2, "tokens": 2, "kv_gather": 200 + run, "kv_view": 0, "attn_rows_kv": 0})
    f = tmp_path / "steps.csv"
    pd.DataFrame(rows).to_csv(f, index=False)
    runs = profile_steps(f, ("adaptive",))
    assert [r["policy"] for r in runs] == ["none", "none", "adaptive"]  # one dict per run, split at t_start_ms 0
    assert [int(r["kv_gather"][0]) for r in runs] == [200, 201, 202]  # recorded shapes kept as they are
    assert list(runs[2]["draft_pass"]) == [1, 1, 1] and list(runs[0]["draft_pass"]) == [0, 0, 0]
    with pytest.raises(ConfigError, match="go together"):
        reprice_main([str(tmp_path), "--profile-reference", str(f)])
    with pytest.raises(SystemExit) as e:  # refused by the flag's own type, one line and exit 2
        reprice_main([str(tmp_path), "--profile-max-seqs", "0"])
    assert e.value.code == 2
    cell = {"trace": "traces/codeedit.jsonl", "policy": "none", "batch_size": 1, "output_tokens": 8,
            "repeats": [{"tok_per_s": 10.0}], "verdict": {"predicted": 10.0}}
    (tmp_path / "fidelity.json").write_text(json.dumps({"meta": {}, "cells": [cell]}))
    with pytest.raises(ConfigError, match="nowhere.json: not found.*--cost-table"):
        reprice_main([str(tmp_path), "--cost-table", str(tmp_path / "nowhere.json")])


def test_reprice_can_refit_from_the_steps_of_fewer_sequences():
    """--profile-max-seqs: each run keeps only its steps with at most N sequences, every column alike; a run with
    none left is dropped (what a profile that never verified more together would have fitted)."""
    from real.validation.reprice import steps_up_to

    runs = [{"policy": "none", "num_seqs": np.array([1, 12, 4]), "step_ms": np.array([1.0, 2.0, 3.0])},
            {"policy": "adaptive", "num_seqs": np.array([16, 11]), "step_ms": np.array([4.0, 5.0])}]
    kept = steps_up_to(runs, 10)
    assert len(kept) == 1 and kept[0]["policy"] == "none"
    assert list(kept[0]["num_seqs"]) == [1, 4] and list(kept[0]["step_ms"]) == [1.0, 3.0]
    assert len(steps_up_to(runs, 16)) == 2
