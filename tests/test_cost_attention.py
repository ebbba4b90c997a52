"""Issue 30's cost-model fixes: the profiled table's attention term for query rows beyond one per sequence
(sim/core/cost/profiled.py, fitted by real/validation/profile.py), the draft table priced from the steps whose model pass ran,
and the offline re-pricing of a recorded validation (real/validation/reprice.py)."""
import json

import numpy as np
import pandas as pd
import pytest

from real.validation.reprice import main as reprice_main, reprice
from real.validation.profile import fit_step_parts, fit_verify
from sim.core.cost import CostTable, ProfiledCost, load_cost_table, write_cost_table
from sim.core.cost.profiled import cost_table_from_dict
from sim.infra.errors import ConfigError


def table(**kw) -> CostTable:
    args = dict(llm="smollm2-135m", gpu="cpu", verify_tokens=[1, 8, 64, 512], verify_ms=[20.0, 30.0, 60.0, 300.0],
                draft_reqs=[1, 4], draft_ms=[5.0, 9.0], kv_ms_per_token=0.01, seq_ms=2.0, logits_ms_per_row=0.25,
                attn_ms_per_row_kv=1e-3, ngram=([1], [0.5]), alloc={"*": ([1], [0.2])}, sample=([1], [0.1]),
                cpu={"base_ms": 1.0, "per_req_ms": 0.0, "per_token_ms": 0.0}, kv_capacity_tokens=10**9,
                vocab_size=49152)
    args.update(kw)
    return CostTable(**args)


def test_attention_term_prices_rows_beyond_one_per_sequence():
    c = ProfiledCost(table(), fallback=None)
    base = ProfiledCost(table(attn_ms_per_row_kv=0.0), fallback=None)
    # one-token decodes (T = S): nothing added, whatever the context
    assert c.verify_ms(4, 2000, 4) == base.verify_ms(4, 2000, 4)
    # one request verifying 7 drafts at 500 cached entries: 7 extra rows x 500 entries x 1e-3 ms
    assert c.verify_ms(8, 500, 1) == pytest.approx(base.verify_ms(8, 500, 1) + 7 * 500 * 1e-3)
    # four requests, 20 rows, 1200 entries in all: (20 - 4) rows x 300 entries (the mean sequence) x 1e-3 ms
    assert c.verify_ms(20, 1200, 4, logit_rows=3) == pytest.approx(base.verify_ms(20, 1200, 4, logit_rows=3) + 16 * 300e-3)
    # a prefill chunk of 256 tokens on its own: its rows beyond the first, over its 256 entries
    assert c.verify_ms(256, 256, 1) == pytest.approx(base.verify_ms(256, 256, 1) + 255 * 256e-3)
    assert c.verify_ms(0, 500, 1) == 0.0 and c.verify_ms(3, 500, 0) == base.verify_ms(3, 500, 0)
    # the vector path, the table the policies decide with and the scalar path agree
    ts = np.arange(0, 40)
    np.testing.assert_allclose(c.verify_ms(ts, 900, 3), [c.verify_ms(int(t), 900, 3) for t in ts], rtol=1e-12)
    np.testing.assert_allclose(c.verify_table(39, 900, 3), [c.verify_ms(int(t), 900, 3) for t in ts], rtol=1e-12)
    # monotone in tokens and in context
    assert np.all(np.diff(c.verify_table(64, 900, 3)) >= 0)
    assert c.verify_ms(8, 600, 1) > c.verify_ms(8, 500, 1)


def test_attention_term_round_trips_and_bad_values_are_one_line(tmp_path):
    p = write_cost_table(table(attn_ms_per_row_kv=1.5e-4), tmp_path / "t.json")
    assert load_cost_table(p).attn_ms_per_row_kv == pytest.approx(1.5e-4)
    assert "attn_ms_per_row_kv" not in write_cost_table(table(attn_ms_per_row_kv=0.0), tmp_path / "z.json").read_text()
    assert load_cost_table(tmp_path / "z.json").attn_ms_per_row_kv == 0.0       # absent: 0, the old tables
    for bad in (-1e-4, "1e-4", float("nan")):
        d = json.loads(p.read_text())
        d["attn_ms_per_row_kv"] = bad
        q = tmp_path / "bad.json"
        q.write_text(json.dumps(d))
        with pytest.raises(ConfigError, match="'attn_ms_per_row_kv'") as e:
            load_cost_table(q)
        assert "\n" not in str(e.value)
    c = tmp_path / "t.csv"
    c.write_text("# llm: smollm2-135m\n# gpu: cpu\n# attn_ms_per_row_kv: 0.1\ntable,x,ms\nverify,1,5\n")
    with pytest.raises(ConfigError, match="attn_ms_per_row_kv.*JSON"):
        load_cost_table(c)


def _steps(rng, n, attn, spec: bool) -> dict:
    """Synthetic steps whose verify time follows the profiled form exactly, with a planted attention cost."""
    S = rng.integers(1, 6, n)
    q = rng.integers(2, 9, n) if spec else np.ones(n, dtype=np.int64)
    T = S * q
    K = S * rng.integers(20, 600, n)
    M = T
    f = np.interp(T, [1, 2, 4, 8, 16, 32, 64], [20, 21, 23, 27, 33, 40, 55])
    y = f + 0.01 * K + 2.0 * S + 0.25 * M + attn * (T - S) * K / S
    z = np.zeros(n)
    return {"tokens": T, "kv_tokens": K, "num_seqs": S, "logit_rows": M, "verify_ms": y, "num_decode": S,
            "draft_ms": z, "ngram_ms": z, "alloc_ms": z, "sample_ms": z + 0.1, "cpu_ms": z + 1.0, "policy": "x"}


def test_fit_verify_recovers_a_planted_attention_cost():
    rng = np.random.default_rng(0)
    steps = [_steps(rng, 400, 2e-3, spec=True), _steps(rng, 400, 2e-3, spec=False)]
    fit = fit_verify(steps, logits_ms_per_row=0.25, kv_ms_per_token=0.01)
    assert fit["attn_ms_per_row_kv"] == pytest.approx(2e-3, rel=0.02)
    assert fit["seq_ms"] == pytest.approx(2.0, rel=0.05)
    none = fit_verify([_steps(rng, 400, 0.0, spec=True)], logits_ms_per_row=0.25, kv_ms_per_token=0.01)
    assert none["attn_ms_per_row_kv"] < 1e-5   # nothing planted, nothing found


def test_draft_table_is_priced_from_the_steps_whose_pass_ran():
    """Steps without the model pass (hybrid skipping it) carry only the drafter's context upkeep: averaged in,
    they priced the pass low."""
    n = 100
    R = np.ones(n, dtype=np.int64)
    ran = np.arange(n) % 2 == 0
    draft = np.where(ran, 6.0, 1.0)   # pass + upkeep on half the steps, upkeep alone on the others
    z = np.zeros(n)
    st = {"num_decode": R, "draft_ms": draft, "ngram_ms": z + 0.5, "alloc_ms": z + 0.2, "sample_ms": z + 0.1,
          "cpu_ms": z + 1.0, "logit_rows": R, "tokens": R * 8, "policy": "hybrid"}
    assert fit_step_parts([dict(st, draft_pass=ran.astype(np.int64))], ["hybrid"])["draft"]["ms"] == [6.0]
    assert fit_step_parts([st], ["hybrid"])["draft"]["ms"] == [3.5]   # without the column: the old mean


def _run_dir(tmp_path):
    """A recorded validation in miniature: a table, its profile steps, one cell with aligned predicted steps."""
    d = tmp_path / "run"
    (d / "codeedit" / "cells" / "codeedit__hybrid__bs1").mkdir(parents=True)
    t = table(attn_ms_per_row_kv=0.0)
    write_cost_table(t, d / "cost_table.json")
    rng = np.random.default_rng(1)
    frames = []
    for pol, spec in (("none", False), ("adaptive", True)):
        s = _steps(rng, 300, 2e-3, spec=spec)
        s["draft_ms"] = np.where(s["num_decode"] > 0, 7.0, 0.0) if pol == "adaptive" else s["draft_ms"]
        s["verified_model"] = s["tokens"] - s["num_seqs"]
        s["prefill_tokens"] = np.zeros(300, dtype=np.int64)
        frames.append(pd.DataFrame({k: v for k, v in s.items() if k != "policy"}).assign(policy=pol))
    pd.concat(frames).to_csv(d / "cost_table.json.steps.csv", index=False)
    cost = ProfiledCost(t, fallback=None)
    T, K, S = np.array([8, 8, 1]), np.array([500, 508, 516]), np.array([1, 1, 1])
    verify = np.array([cost.verify_ms(int(a), int(b), int(c)) for a, b, c in zip(T, K, S)])
    draft = np.array([5.0, 5.0, 0.0])
    pred = pd.DataFrame({"tokens": T, "kv_tokens": K, "num_seqs": S, "logit_rows": T, "num_decode": S,
                         "verify_ms": verify, "draft_ms": draft, "step_ms": verify + draft + 1.0})
    pred.to_csv(d / "codeedit" / "cells" / "codeedit__hybrid__bs1" / "steps_predicted.csv", index=False)
    t_old = pred["step_ms"].sum() / 1000
    cell = {"trace": "traces/codeedit.jsonl", "policy": "hybrid", "batch_size": 1, "output_tokens": 12,
            "repeats": [{"tok_per_s": x} for x in (20.0, 20.2, 19.9)], "loaded": False,
            "verdict": {"predicted": 12 / t_old, "error": 12 / t_old / 20.0 - 1, "verdict": "disagrees"}}
    (d / "fidelity.json").write_text(json.dumps({"meta": {"margin": 0.03}, "cells": [cell]}))
    return d, pred


def test_reprice_refits_the_recorded_profile_and_reprices_the_aligned_steps(tmp_path, capsys):
    d, pred = _run_dir(tmp_path)
    res = reprice(d)
    t = res["table"]
    assert t["attn_ms_per_row_kv"] == pytest.approx(2e-3, rel=0.05)      # found in the recorded profile steps
    assert t["draft"]["ms"][0] == pytest.approx(7.0)                      # the pass, from the steps that ran it
    cost = ProfiledCost(load_cost_table(d / "cost_table.json"), fallback=None)
    new = ProfiledCost(cost_table_from_dict(t), fallback=None)
    want = sum(new.verify_ms(int(a), int(b), int(c), logit_rows=int(a)) for a, b, c in
               zip(pred.tokens, pred.kv_tokens, pred.num_seqs)) + 7.0 * 2 + 3 * 1.0
    cell = res["cells"][0]
    assert cell["predicted"] == pytest.approx(12 / (want / 1000))
    assert cell["predicted"] < cell["predicted_recorded"]                 # dearer steps, slower prediction
    assert cell["error"] == pytest.approx(cell["predicted"] / 20.0 - 1)
    assert cost.table.attn_ms_per_row_kv == 0.0                           # the recorded table is left as it was
    assert res["pred_sd"] == 0.0 and res["pred_df"] == 0                  # no run boundaries recorded: no u_p
    assert reprice_main([str(d)]) == 0
    out = capsys.readouterr().out
    assert "repriced      :" in out and "recorded_today:" in out


def test_reprice_bad_input_is_one_error(tmp_path):
    with pytest.raises(ConfigError, match="not a directory"):
        reprice_main([str(tmp_path / "nope")])
    with pytest.raises(ConfigError, match="fidelity.json: (file )?not found"):
        reprice_main([str(tmp_path)])
