"""The real engine: lossless against plain greedy decoding for every chain policy, teacher forcing equals
the simulator's acceptance, the shared scheduler's steps, profile -> simulator round trip, validate --quick.

The default run uses the 2-layer random-weight test architecture (models/llms/qwen3-tiny.json) on the CPU:
the same code path as SmolLM2 or an 8B model, at a size CI affords. The real-weight check is in the slow set.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from real.validation.workload import Workload, run_real
from sim.infra.errors import ConfigError
from sim.core.policies import list_policies  # noqa: F401  (imported for its side effect: registry ready)

ROOT = Path(__file__).resolve().parents[1]
CHAIN_POLICIES = ["none", "model-fixed:7", "ngram-fixed:32", "adaptive", "ngram-first", "ngram-threshold", "hybrid",
                  "hybrid-price", "oracle", "hybrid:runcal=64:table=step", "adaptive:table=step"]


@pytest.fixture(scope="module")
def greedy_wl():
    """20 prompts from both bundled traces, outputs = the tiny random model's own greedy decoding."""
    a = Workload.build("traces/codeedit.jsonl", "qwen3-tiny", True, "cpu", limit=10, sample=None, seed=0,
                       max_tokens=24, max_prompt=400, teacher=False)
    b = Workload.build("traces/chat.jsonl", "qwen3-tiny", True, "cpu", limit=10, sample=None, seed=0,
                       max_tokens=24, max_prompt=400, teacher=False)
    return [a, b]


@pytest.mark.parametrize("policy", CHAIN_POLICIES)
def test_every_policy_is_lossless_against_plain_greedy(greedy_wl, policy):
    for wl in greedy_wl:
        for bs in (1, 5):
            res = run_real(wl, None, policy, bs, cost=None)
            assert res.lossless, (policy, bs, res.violation)
            for out, req in zip(res.outputs, wl.requests):
                assert out == [int(x) for x in req.output_ids], (policy, bs, req.id)


def test_speculation_accepts_tokens_and_tree_policies_are_refused(greedy_wl):
    wl = greedy_wl[0]
    none = run_real(wl, None, "none", 4, cost=None)
    ng = run_real(wl, None, "ngram-fixed:32", 4, cost=None)
    assert ng.steps["accepted_ngram"].sum() > 0
    assert ng.requests["decode_steps"].sum() < none.requests["decode_steps"].sum()
    with pytest.raises(ConfigError, match="tree"):
        run_real(wl, None, "hybrid-tree", 4, cost=None)


def test_teacher_forcing_reproduces_the_simulators_steps():
    """Teacher forced, the real engine's acceptance is the trace's: with the same decision costs it takes
    exactly the simulator's steps, drafts and tokens (the shared scheduler and step, a real forward)."""
    from sim.engine.engine import Engine, EngineConfig
    from sim.engine.policies import sim_policy
    from real.validation.workload import provisional_cost

    wl = Workload.build("traces/codeedit.jsonl", "qwen3-tiny", True, "cpu", limit=6, sample=None, seed=0,
                        max_tokens=40, max_prompt=400)
    model = wl.model(max_slots=4)
    cost = provisional_cost(model)
    from real.engine.model import SHORT_QUERY_MAX
    from real.validation.workload import provisional_table
    from sim.core.cost.padded import SHAPE_COLUMNS
    from sim.core.cost.profiled import ProfiledCost, cost_table_from_dict

    padded_cost = ProfiledCost(cost_table_from_dict(
        {**provisional_table(model.args.name, model.args.vocab_size), "short_query_max": SHORT_QUERY_MAX}), fallback=None)
    seen = set()
    for policy in ("adaptive", "hybrid-price", "ngram-fixed:32", "hybrid"):
        real = run_real(wl, model, policy, 4, cost=cost)
        cfg = EngineConfig(batch_size=4, max_num_batched_tokens=512, async_scheduling=False, kv_capacity_tokens=10**9)
        sim = Engine(wl.tables, np.zeros(len(wl.requests)), sim_policy(policy), cost, cfg).run()
        assert real.lossless and sim.lossless
        for col in ("num_decode", "prefill_tokens", "verified_model", "verified_ngram", "accepted_model",
                    "accepted_ngram", "emitted", "tokens", "kv_tokens"):
            assert np.array_equal(real.steps[col], sim.steps[col]), (policy, col)
        # a padded table (sim/core/cost/padded.py): the same steps, each charged at the padded shape of the forward
        # the real engine ran (its recorded q_lens and cache_lens), computed by the simulator from its own state
        padded = Engine(wl.tables, np.zeros(len(wl.requests)), sim_policy(policy), padded_cost, cfg).run()
        assert np.array_equal(padded.steps["tokens"], real.steps["tokens"]), policy
        for col in SHAPE_COLUMNS:
            assert np.array_equal(real.steps[col], padded.steps[col]), (policy, col)
        seen.update(c for c in SHAPE_COLUMNS if real.steps[c].sum() > 0)
    assert seen == set(SHAPE_COLUMNS)  # every kind of attention work happened somewhere


def test_profile_table_round_trips_into_the_simulator(tmp_path):
    from real.validation.profile import main as profile_main
    from sim.core.cost import make_cost_model

    out = tmp_path / "t.json"
    assert profile_main(["--model", "qwen3-tiny", "--random-weights", "--quick", "--policy", "none",
                         "--policy", "hybrid-price", "--batch-size", "1", "--batch-size", "2", "--out", str(out)]) == 0
    cost = make_cost_model("profiled", llm="qwen3-tiny", gpu=str(out))
    t = json.loads(out.read_text())
    assert t["machine"]["model"] == "qwen3-tiny" and t["machine"]["device"] == "cpu"
    # the simulator reads back what was measured
    x = t["verify"]["num_tokens"][2]
    want = (t["verify"]["ms"][2] + t["logits_ms_per_row"] * x + t["kv_ms_per_token"] * 100 + t.get("seq_ms", 0.0) * 1
            + t.get("attn_ms_per_row_kv", 0.0) * max(x - 1, 0) * 100 / 1)  # the attention term, when fitted above 0
    assert cost.verify_ms(x, 100, 1) == pytest.approx(want)
    assert cost.alloc_ms(1, policy="hybrid-price") == pytest.approx(t["alloc"]["hybrid-price"]["ms"][0])
    with pytest.raises(ConfigError):  # never overwrites
        profile_main(["--model", "qwen3-tiny", "--random-weights", "--quick", "--out", str(out)])


def test_profile_slice_reaches_the_largest_batch():
    """The profile's steps must reach every batch it prices: a 16-request batch on a 10-request slice left the
    verify fit extrapolating in the step's sequences (docs/real.md, "The runs so far")."""
    from real.validation.profile import PROFILE_REQUESTS, profile_slice

    assert profile_slice(False, [1, 4, 16])["limit"] == 16
    assert profile_slice(False, [1, 4])["limit"] == PROFILE_REQUESTS == profile_slice(False)["limit"]
    assert profile_slice(True, [1, 4, 16])["limit"] == 6  # --quick checks the pipeline, at its own size


@pytest.mark.slow  # about 60 s: the validate CLI end to end (its parts are tested in the default run)
def test_validate_quick_cli(tmp_path):
    out = tmp_path / "v"
    cmd = [sys.executable, "real/validate.py", "--quick", "--model", "qwen3-tiny", "--random-weights",
           "--policy", "none", "--policy", "ngram-fixed:32", "--batch-size", "2", "--limit", "2", "--repeat", "2",
           "--out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "checks the pipeline, not fidelity" in r.stderr
    runs = [ln.split()[1] + " " + ln.split()[4] for ln in r.stderr.splitlines() if " repeat " in ln and " ran " in ln
            and not ln.startswith(("warning", "cached"))]
    assert runs == ["none 1/2", "ngram-fixed:32 1/2", "ngram-fixed:32 2/2", "none 2/2"]  # ABBA
    fid = json.loads((out / "fidelity.json").read_text())
    assert len(fid["cells"]) == 2 and fid["aggregate"]["all_lossless"]
    assert fid["aggregate"]["verdicts"]["cells"] == 2 and fid["meta"]["repeats"] == 2
    for c in fid["cells"]:
        assert c["steps_aligned"] and c["real"]["steps"] == c["predicted"]["steps"]
        assert c["real"]["tok_per_s"] > 0 and c["predicted"]["tok_per_s"] > 0
        assert len(c["repeats"]) == 2 and all("others_cores" in x["load"] for x in c["repeats"])
        assert c["verdict"]["verdict"] in ("agrees", "disagrees", "inconclusive")
    md = (out / "fidelity.md").read_text()
    assert md.startswith("# Fidelity") and "verdict: " in md.lower() and "checks the pipeline" in md
    # resumable: a second run reuses every repeat
    r2 = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0 and r2.stderr.count("cached  ") == 4
    # ... but never under other settings: another length cap recomputes every repeat and prediction
    r3 = subprocess.run(cmd + ["--max-tokens", "8"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r3.returncode == 0 and r3.stderr.count("cached with other settings (max_tokens)") == 6, r3.stderr[-2000:]


def test_cached_cells_are_served_only_under_their_settings(tmp_path, capsys):
    from real.validation.validate import load_cached_cell

    cf = tmp_path / "c.json"
    settings = {"drafter": "default", "max_tokens": 32, "cost_table_sha256": "ab"}
    assert load_cached_cell(cf, settings) is None  # nothing cached
    cf.write_text(json.dumps({"real": {"tok_per_s": 1.0}, "settings": settings}))
    assert load_cached_cell(cf, dict(settings))["real"]["tok_per_s"] == 1.0
    assert load_cached_cell(cf, dict(settings, drafter="none")) is None
    assert "other settings (drafter)" in capsys.readouterr().err
    cf.write_text(json.dumps({"real": {"tok_per_s": 1.0}}))  # cached before settings were recorded
    assert load_cached_cell(cf, settings) is None
    assert "none recorded" in capsys.readouterr().err
    cf.write_text('{"real": ')  # cut mid-write
    assert load_cached_cell(cf, settings) is None
    assert "unreadable cached cell" in capsys.readouterr().err


@pytest.mark.parametrize("argv,msg", [
    (["--model", "qwen3-8b"], "no real weights"),
    (["--device", "cuda", "--model", "qwen3-tiny", "--random-weights"], "CUDA"),
    (["--policy", "nope", "--model", "qwen3-tiny", "--random-weights"], "nope"),
    (["--engine", "vllm"], "vllm"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--engine", "vllm", "--repeat", "3"], "deterministic"),  # says why vLLM has no repeats yet
])
def test_validate_bad_input_is_one_line(tmp_path, argv, msg):
    from conftest import run_cli_inprocess

    if argv[:2] == ["--model", "qwen3-8b"]:  # one case through the script itself (`python real/validate.py`)
        r = subprocess.run([sys.executable, "real/validate.py", "--quick", "--out", str(tmp_path / "o"), *argv],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    else:
        r = run_cli_inprocess("real.validation.validate", "--quick", "--out", str(tmp_path / "o"), *argv, cwd=ROOT)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert msg.lower() in r.stderr.lower(), r.stderr


def test_prompt_longer_than_the_context_is_refused():
    with pytest.raises(ConfigError, match="context"):
        Workload.build("traces/codeedit.jsonl", "smollm2-135m", True, "cpu", limit=1, sample=None, seed=0,
                       max_tokens=10_000, max_prompt=10_000)


@pytest.mark.slow
def test_real_weights_lossless_on_the_bundled_traces():
    """SmolLM2-135M real weights: every chain policy equals plain greedy on 20 prompts."""
    pytest.importorskip("gguf")
    from real.engine.weights import find_smollm2_gguf

    try:
        find_smollm2_gguf()
    except ConfigError as exc:
        pytest.skip(str(exc))
    for trace in ("traces/codeedit.jsonl", "traces/chat.jsonl"):
        wl = Workload.build(trace, "smollm2-135m", False, "cpu", limit=10, sample=None, seed=0, max_tokens=32,
                            max_prompt=512)
        for policy in ("adaptive", "hybrid-price", "ngram-fixed:32", "hybrid"):
            res = run_real(wl, None, policy, 4, cost=None)
            assert res.lossless, (trace, policy, res.violation)


def test_preemption_recomputes_and_stays_lossless(greedy_wl):
    """A KV cache too small for every running request: the shared scheduler preempts, the real engine
    re-prefills prompt + generated tokens into a fresh slot, and the output still equals plain greedy."""
    from sim.engine.engine import EngineConfig
    from sim.engine.policies import sim_policy
    from real.engine.engine import RealEngine
    from real.validation.workload import provisional_cost

    wl = greedy_wl[1]
    model = wl.model(max_slots=4)
    need = int(max(r.prompt_len + r.output_len for r in wl.requests))
    cfg = EngineConfig(batch_size=4, max_num_batched_tokens=256, async_scheduling=False,
                       kv_capacity_tokens=need + 2 * 48 + 96)
    res = RealEngine(wl.tables, np.zeros(len(wl.requests)), sim_policy("hybrid-price"), provisional_cost(model), cfg,
                     model, wl.ngram_cfg).run()
    assert res.requests["preemptions"].sum() > 0
    assert res.lossless, res.violation
    assert all(o == [int(x) for x in r.output_ids] for o, r in zip(res.outputs, wl.requests))


def test_hybrid_skips_the_model_pass_for_real_and_is_not_charged_for_it(greedy_wl):
    """The step contract in the real engine: `hybrid` plans on the host before any drafter runs; on a step
    whose plan leaves the model drafter out, the engine does not run it (no proposal), admits nothing from it
    and charges no draft time; on the others it runs and is charged (issue: draft time charged on every step)."""
    from sim.engine.engine import EngineConfig
    from sim.engine.policies import sim_policy
    from real.engine.engine import RealEngine
    from real.validation.workload import provisional_cost

    from sim.core.cost.profiled import ProfiledCost

    class HeavyDrafter(ProfiledCost):
        """Decisions priced with a model pass as dear as a 64-token verify: skipping it pays on some steps."""

        def draft_ms(self, num_reqs, block):
            return 5.0

    class Probe(RealEngine):
        def _propose(self, reqs, rows, plan):
            self.proposed.append(plan.runs("dspark"))
            return super()._propose(reqs, rows, plan)

    skipped = ran = 0
    for wl in greedy_wl:
        model = wl.model(max_slots=4)
        heavy = HeavyDrafter(provisional_cost(model).table, fallback=None)
        cfg = EngineConfig(batch_size=4, max_num_batched_tokens=512, async_scheduling=False, kv_capacity_tokens=10**9)
        eng = Probe(wl.tables, np.zeros(len(wl.requests)), sim_policy("hybrid"), heavy, cfg, model, wl.ngram_cfg)
        eng.proposed = []
        res = eng.run()
        assert res.lossless, res.violation
        st = res.steps
        dec = st["num_decode"] > 0
        model_ran = np.asarray(eng.proposed)
        assert len(model_ran) == dec.sum()
        d_ms, v_m = st["draft_ms"][dec], st["verified_model"][dec]
        assert (d_ms[~model_ran] == 0).all() and (v_m[~model_ran] == 0).all()
        assert (d_ms[model_ran] > 0).all()
        # the step columns that say what draft_ms holds (real/validation/profile.py prices the pass from them)
        assert np.array_equal(st["draft_pass"][dec] > 0, model_ran) and not st["draft_pass"][~dec].any()
        assert (st["draft_upkeep_ms"] == 0).all()  # no live drafter here (random weights): no context upkeep
        skipped, ran = skipped + int((~model_ran).sum()), ran + int(model_ran.sum())
    assert skipped > 0 and ran > 0, (skipped, ran)  # both kinds of step occur on these traces


def test_suffix_drafter_runs_live_in_the_real_engine(greedy_wl):
    """The suffix drafter (a live drafter) in the torch engine: `suffix` and three-drafter `hybrid` stay lossless
    against plain greedy; suffix chains are chosen and verified by the target; the drafter's time is charged
    (its own step columns: suffix_ms, verified_suffix, accepted_suffix) only on steps whose plan ran it."""
    from sim.core.cost.profiled import ProfiledCost
    from sim.engine.engine import EngineConfig
    from sim.core.drafters.registry import live_drafters
    from sim.engine.policies import sim_policy
    from real.engine.engine import RealEngine
    from real.validation.workload import provisional_cost

    class DearHostLookup(ProfiledCost):
        """Decisions priced with a host lookup as dear as a 16-token verify: hybrid skips the suffix drafter on
        some steps and runs it on others."""

        def ngram_ms(self, num_reqs, on_gpu=True):
            return 0.0 if on_gpu else 1.0

    class Probe(RealEngine):
        def _charge(self, parts, plan, R, *args, **kw):
            out = super()._charge(parts, plan, R, *args, **kw)
            self.log.append((R > 0, "suffix" in self.live.ran, self._lap["live"].get("suffix", 0.0), out.ngram,
                             int(self.live.adm.get("suffix", np.zeros(1)).sum()) if R else 0))
            return out

    drafters = "dspark,ngram,suffix"
    seen = dict(chosen=0, accepted=0, ran=0, skipped=0)
    for policy in ("suffix", "hybrid"):
        for wl in greedy_wl:
            model = wl.model(max_slots=4)
            cost = DearHostLookup(provisional_cost(model).table, fallback=None)
            cfg = EngineConfig(batch_size=4, max_num_batched_tokens=512, async_scheduling=False,
                               kv_capacity_tokens=10**9)
            pol = sim_policy(policy, drafters)
            eng = Probe(wl.tables, np.zeros(len(wl.requests)), pol, cost, cfg, model, wl.ngram_cfg,
                        live=live_drafters(pol.uses_extra))
            eng.log = []
            res = eng.run()
            assert res.lossless, (policy, res.violation)
            assert all(o == [int(x) for x in r.output_ids] for o, r in zip(res.outputs, wl.requests)), policy
            log = np.asarray(eng.log, dtype=np.float64)
            assert len(log) == len(res.steps["step_ms"])
            dec, ran, lap, ngram_ms, adm = log.T
            ran = ran > 0
            assert (lap[ran] > 0).all() and (lap[~ran] == 0).all()  # proposed (and timed) only when planned
            st = res.steps  # the suffix drafter's own step columns: its measured time and slots, 0 where it did not run
            assert np.array_equal(st["suffix_ms"], np.where(ran, lap, 0.0)) and np.array_equal(st["verified_suffix"], adm)
            assert (st["accepted_suffix"] <= st["verified_suffix"]).all()
            if policy == "suffix":  # no n-gram drafter: nothing in its columns, the suffix drafter runs every decode step
                assert not ngram_ms.any() and not st["verified_ngram"].any() and (ran == (dec > 0)).all()
            assert (adm[~ran] == 0).all()
            seen["chosen"] += int(adm.sum())
            seen["accepted"] += int(st["accepted_suffix"].sum())
            seen["ran"] += int(ran.sum())
            seen["skipped"] += int(((dec > 0) & ~ran).sum()) if policy == "hybrid" else 0
    assert seen["chosen"] > 0 and seen["accepted"] > 0 and seen["ran"] > 0 and seen["skipped"] > 0, seen
