"""The one input layer (sim/infra/inputs.py, issue 46) and the readers routed through it: a hostile input of each
family is refused with exactly one line `error: ...`, exit 2, no traceback, within 30 s and 1 GiB more address
space -- a FIFO or a link to /dev/zero (never read), a file over its cap, truncated or wrongly typed JSON, NaN or
1e400 where a finite number is required, a recorded run with no cell, a malformed anchors.json or checkpoint
config, a config asking for more memory than its weights hold, a vLLM speculative config of the wrong type, a
policy option given twice, a negative seed, a non-physical cost, a suffix drafter that would not fit, a sweep grid
value of the wrong type. Each family also has a control that is accepted, so that a refusal is the case's own."""
from __future__ import annotations

import copy
import json
import math
import os
import time
from pathlib import Path

import pytest
from conftest import run_cli_inprocess
from hostile_cases import fidelity_doc
from test_hostile_suite import _TookTooLong, guarded

from sim.infra.errors import ConfigError
from sim.infra import inputs

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"
LENGTHS = ROOT / "tests" / "fixtures" / "trace" / "lengths.jsonl"
COST_TABLE = ROOT / "models" / "cost_tables" / "h100-sxm_qwen3-8b.json"
TIME_LIMIT_S = 30
MEMORY_HEADROOM = 2**30


def refused(module: str, *args, cwd: Path, env: dict | None = None, says: str = "") -> str:
    """Run `python -m module args` in this process under a 30 s alarm and 1 GiB of address space beyond what it
    holds now; assert exit 2, one stderr line `error: ...` containing `says`, no traceback; return that line."""
    t0 = time.monotonic()
    try:
        with guarded(TIME_LIMIT_S, MEMORY_HEADROOM):
            r = run_cli_inprocess(module, *args, cwd=cwd, env=env)
    except _TookTooLong:
        pytest.fail(f"{module} {args}: still running after {TIME_LIMIT_S} s")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1 and lines[0].startswith("error: "), \
        f"exit {r.returncode}, stderr:\n{r.stderr}"
    assert "out of memory" not in lines[0] and "internal error" not in lines[0], lines[0]
    assert says in lines[0], lines[0]
    assert time.monotonic() - t0 < TIME_LIMIT_S
    return lines[0]


@pytest.fixture(scope="module", autouse=True)
def _imported():
    """Import the commands once, outside the guards (torch and friends take seconds on a busy machine)."""
    import importlib

    for m in ("sim.api.run", "sim.api.sweep", "sim.api.report", "sim.api.suffix_report", "sim.api.drafter_axis",
              "real.validation.report", "real.validation.reprice", "real.validation.vllm_slots",
              "real.drafter.export_vllm", "real.drafter.train_v_job", "real.validation.vllm_cpu.make_models"):
        importlib.import_module(m)


# ------------------------------------------------------------------------------------------ the layer itself
def test_a_fifo_and_a_link_to_dev_zero_are_refused_without_being_read(tmp_path):
    fifo = tmp_path / "f.json"
    os.mkfifo(fifo)  # no writer: a blocking open or read would hang forever
    link = tmp_path / "z.json"
    link.symlink_to("/dev/zero")
    t0 = time.monotonic()
    for p, what in ((fifo, "a pipe (FIFO)"), (link, "a device"), (tmp_path, "a folder")):
        with pytest.raises(ConfigError, match=r"not a regular file") as e:
            inputs.read_json(p, inputs.RECORD)
        assert what in str(e.value) and str(p) in str(e.value)
    with pytest.raises(ConfigError, match="file not found"):
        inputs.read_bytes(tmp_path / "none.json")
    assert time.monotonic() - t0 < 5


def test_the_cap_is_named_and_can_be_raised(tmp_path, monkeypatch):
    f = tmp_path / "big.json"
    f.write_text(json.dumps({"x": "y" * 5000}))
    monkeypatch.setenv(inputs.CAP_ENV, "0.001")  # 1 KiB
    with pytest.raises(ConfigError, match=r"over the 1048 bytes a config file may hold \(set HYBRIDSPEC_MAX_INPUT_MB"):
        inputs.read_json(f)
    monkeypatch.setenv(inputs.CAP_ENV, "1")
    assert inputs.read_json(f)["x"] == "y" * 5000


@pytest.mark.parametrize("text,says", [
    ('{"a": NaN}', "NaN is not a finite number"), ('{"a": Infinity}', "Infinity is not a finite number"),
    ('{"a": 1e400}', "1e400 is not a finite number"), ('{"a": 1', "not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"), ('{"a": "\\ud800"}', "lone surrogate"),
    ('{"a": ' + "9" * 5000 + "}", "not valid JSON"), (b'{"a": "\xff"}', "not UTF-8"),
])
def test_json_is_parsed_strictly(text, says):
    with pytest.raises(ConfigError, match=says):
        inputs.parse_json(text, "f.json")


def test_nan_is_kept_where_the_caller_allows_it_and_the_schema_then_decides():
    data = inputs.parse_json('{"median": NaN, "rate": NaN}', "f.json", finite=False)
    schema = inputs.Obj({"median": inputs.Num(nan=True), "rate": inputs.Num(lo=0)})
    with pytest.raises(ConfigError, match=r"f.json: field 'rate': expected a finite number >= 0, got NaN"):
        schema.check(data, "", "f.json")
    assert math.isnan(schema.check({"median": float("nan"), "rate": 1.5}, "", "f.json")["median"])


@pytest.mark.parametrize("value,says", [
    ({"cells": []}, "field 'cells': expected a non-empty list, got a list of 0"),
    ({"cells": [{"bs": float("inf")}]}, "field 'cells[0].bs': expected an integer in 1..1048576, got Infinity"),
    ({"cells": [{"bs": True}]}, "got true"),
    ({"cells": [{"bs": 7.0}]}, "got 7.0"),
    ({"cells": [{}]}, "field 'cells[0].bs' is missing (an integer in 1..1048576)"),
    ({"cells": [{"bs": 2, "x": 1}]}, "unknown field 'cells[0].x'"),
    ([], "the document: expected an object, got a list of 0"),
])
def test_the_schema_names_the_field_and_what_it_expected(value, says):
    schema = inputs.Obj({"cells": inputs.List(inputs.Obj({"bs": inputs.Int(1, 2**20)}, extra=False), lo=1)})
    with pytest.raises(ConfigError) as e:
        schema.check(value, "", "run/fidelity.json")
    assert str(e.value).startswith("run/fidelity.json: ") and says in str(e.value), str(e.value)


def test_integer_bounds_are_printed_as_integers():
    assert "<= 1000000000" in inputs.Int(hi=10**9).expected
    from sim.core.config import check

    with pytest.raises(ConfigError, match=r"--limit must be <= 1000000000, got 10000000000$"):
        check("limit", 10**10)


# ------------------------------------------------------------------------------------------ fidelity reports
def _text(fn):
    """A mutation of the file's text rather than of the document."""
    fn.on_text = True
    return fn


def _set(path: str, value):
    def mut(d):
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value
    return mut


def _drop(path: str):
    def mut(d):
        keys = [int(k) if k.isdigit() else k for k in path.split(".")]
        for k in keys[:-1]:
            d = d[k]
        del d[keys[-1]]
    return mut


# (case, mutation of the document or the bytes of the file, what the line says); the issue counted 14 such cases
FIDELITY_CASES = [
    ("truncated", _text(lambda text: text[: len(text) // 2]), "not valid JSON"),
    ("a_list", _text(lambda text: "[1, 2]"), "expected a real/validate.py fidelity.json"),
    ("no_cells", _set("cells", []), "field 'cells': expected a non-empty list"),
    ("cells_a_string", _set("cells", "x"), "field 'cells': expected a non-empty list"),
    ("cell_a_number", _set("cells.0", 5), "field 'cells[0]': expected an object"),
    ("batch_1e400", _text(lambda text: text.replace('"batch_size": 1,', '"batch_size": 1e400,', 1)),
     "field 'cells[0].batch_size': expected an integer in 1..1048576, got Infinity"),
    ("batch_a_word", _set("cells.0.batch_size", "one"), "field 'cells[0].batch_size': expected an integer"),
    ("throughput_nan", _set("cells.1.real.tok_per_s", float("nan")), "cells[1].real.tok_per_s': expected a finite"),
    ("throughput_a_word", _set("cells.0.real.tok_per_s", "fast"), "cells[0].real.tok_per_s"),
    ("real_missing", _drop("cells.0.real"), "field 'cells[0].real' is missing"),
    ("meta_a_list", _set("meta", [1]), "field 'meta': expected an object"),
    ("verdict_a_word", _set("cells.0.verdict", "agrees"), "field 'cells[0].verdict': expected an object"),
    ("repeats_a_word", _set("cells.0.repeats", "x"), "field 'cells[0].repeats': expected a list"),
    ("summary_a_list", _set("aggregate.verdicts", [1]), "field 'aggregate.verdicts'"),
    ("margin_a_word", _set("meta.margin", "x"), "field 'meta.margin'"),
    ("wall_a_word", _set("meta.wall_minutes", "long"), "field 'meta.wall_minutes'"),
]


def write_run(d: Path, doc: dict | None = None, mutate=None) -> Path:
    """A run directory holding fidelity.json (mutated: a function of the document, or of its text)."""
    d.mkdir(parents=True, exist_ok=True)
    doc = copy.deepcopy(doc or fidelity_doc())
    if mutate is not None and getattr(mutate, "on_text", False):
        text = mutate(json.dumps(doc))
    else:
        if mutate is not None:
            mutate(doc)
        text = json.dumps(doc)
    (d / "fidelity.json").write_text(text)
    return d


def test_the_fixture_run_is_accepted(tmp_path):
    run = write_run(tmp_path / "run")
    r = run_cli_inprocess("real.validation.report", run, "--out", tmp_path / "r.md", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "| codeedit | hybrid | 1 | 2 | 14.0 |" in (tmp_path / "r.md").read_text()


@pytest.mark.parametrize("case,mutate,says", FIDELITY_CASES, ids=[c[0] for c in FIDELITY_CASES])
def test_fidelity_report_refuses_a_damaged_run(tmp_path, case, mutate, says):
    run = write_run(tmp_path / "run", mutate=mutate)
    line = refused("real.validation.report", run, "--out", tmp_path / "r.md", cwd=tmp_path, says=says)
    assert str(run / "fidelity.json") in line
    assert not (tmp_path / "r.md").exists() and not (tmp_path / "r.html").exists()


# re-pricing reads meta.margin/model and each cell's name, output tokens, repeats and verdict (reprice.REPRICE_SCHEMA):
# a damaged field it does not read is not its business (the cases below that mutate only those are left out)
NOT_READ_BY_REPRICE = {"throughput_nan", "throughput_a_word", "real_missing", "summary_a_list", "wall_a_word"}
REPRICE_CASES = [c for c in FIDELITY_CASES if c[0] not in NOT_READ_BY_REPRICE]


@pytest.mark.parametrize("case,mutate,says", REPRICE_CASES, ids=[c[0] for c in REPRICE_CASES])
def test_fidelity_reprice_refuses_a_damaged_run(tmp_path, case, mutate, says):
    run = write_run(tmp_path / "run", mutate=mutate)
    refused("real.validation.reprice", run, cwd=tmp_path, says=says)


def test_a_run_whose_cells_were_not_repeated_is_not_repriced(tmp_path):
    doc = fidelity_doc()
    for c in doc["cells"]:
        del c["verdict"], c["repeats"]
    run = write_run(tmp_path / "run", doc)
    refused("real.validation.reprice", run, cwd=tmp_path, says="has no repeats or verdict")


@pytest.mark.parametrize("module", ["real.validation.report", "real.validation.reprice"])
@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_fidelity_json_that_is_a_pipe_or_dev_zero_is_refused_at_once(tmp_path, module, kind):
    run = tmp_path / "run"
    run.mkdir()
    if kind == "fifo":
        os.mkfifo(run / "fidelity.json")
    else:
        (run / "fidelity.json").symlink_to("/dev/zero")
    args = [run, "--out", tmp_path / "r.md"] if module.endswith("report") else [run]
    refused(module, *args, cwd=tmp_path, says="not a regular file")


def test_a_fidelity_json_over_its_cap_is_refused(tmp_path):
    run = write_run(tmp_path / "run")
    refused("real.validation.report", run, "--out", tmp_path / "r.md", cwd=tmp_path,
            env={inputs.CAP_ENV: "0.001"}, says="a recorded run file may hold")


def test_reprice_refuses_a_cost_table_that_is_a_pipe(tmp_path):
    run = write_run(tmp_path / "run")
    os.mkfifo(run / "cost_table.json")
    (run / "cost_table.json.steps.csv").write_text("policy,step_ms\n")
    refused("real.validation.reprice", run, cwd=tmp_path, says="a pipe (FIFO)")


# ------------------------------------------------------------------------------------------ cost tables
def test_a_cost_table_with_a_verify_time_of_1e308_is_refused(tmp_path):
    t = json.loads(COST_TABLE.read_text())
    t["verify"]["ms"] = [1e308] * len(t["verify"]["ms"])
    (tmp_path / "t.json").write_text(json.dumps(t))
    refused("sim.api.run", "--trace", TINY, "--limit", "4", "--batch-size", "2", "--policy", "adaptive",
            "--no-progress", "--workers", "1", "--cost", "profiled", "--gpu", tmp_path / "t.json", cwd=tmp_path,
            says="is not a measurement (at most 3.6e+06 ms, an hour)")
    t = json.loads(COST_TABLE.read_text())
    t["kv_ms_per_token"] = 1e300
    (tmp_path / "t.json").write_text(json.dumps(t))
    refused("sim.api.run", "--trace", TINY, "--limit", "4", "--batch-size", "2", "--policy", "adaptive",
            "--no-progress", "--workers", "1", "--cost", "profiled", "--gpu", tmp_path / "t.json", cwd=tmp_path,
            says="field 'kv_ms_per_token' must be a number in 0..3.6e+06")


@pytest.mark.parametrize("flag", ["--gpu", "--calibrator", "--drafter"])
def test_a_data_file_given_as_a_pipe_is_named_a_pipe_not_missing(tmp_path, flag):
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)
    extra = {"--gpu": ["--cost", "profiled"], "--calibrator": ["--policy", "hybrid"], "--drafter": []}[flag]
    refused("sim.api.run", "--trace", TINY, "--limit", "4", "--batch-size", "2", "--no-progress", "--workers", "1",
            *extra, flag, fifo, cwd=tmp_path, says="a pipe (FIFO), not a regular file")


# ------------------------------------------------------------------------------------------ sim.report's anchors
@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sweep")
    r = run_cli_inprocess("sim.api.sweep", "--trace", TINY, "--limit", "4", "--policy", "adaptive", "--batch-size", "2",
                          "--workers", "1", "--no-progress", "--out", d / "sw", cwd=d)
    assert r.returncode == 0, r.stderr
    return d / "sw"


ANCHOR = {"anchor": "pr24344-blazedit:tiny", "metric": "share of steps with an n-gram draft", "published": 0.5,
          "simulated": 0.6, "error": 0.2, "tolerance": 0.1, "within": False, "tolerance_kind": "absolute"}


@pytest.mark.parametrize("data,says", [
    ("[1, 2]", "field '[0]': expected an object, got 1"),
    ('{"x": 1}', "the document: expected a list"),
    ('[{"anchor": "pr32374:x"}]', "field '[0].metric' is missing"),
    (json.dumps([dict(ANCHOR, simulated="x")]), "field '[0].simulated': expected a finite number, got 'x'"),
    (json.dumps([ANCHOR]).replace("0.6", "NaN"), "NaN is not a finite number"),
    (json.dumps([ANCHOR])[:40], "not valid JSON"),
], ids=["ints", "object", "missing", "a_word", "nan", "truncated"])
def test_sim_report_refuses_a_malformed_anchors_json(tmp_path, sweep_dir, data, says):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "anchors.json").write_text(data)
    line = refused("sim.api.report", sweep_dir, "-o", out, cwd=tmp_path, says=says)
    assert "rerun python -m sim.anchors" in line and not (out / "index.html").exists()


def test_sim_report_shows_well_formed_anchors(tmp_path, sweep_dir):
    out = tmp_path / "rep"
    out.mkdir()
    (out / "anchors.json").write_text(json.dumps([ANCHOR]))
    r = run_cli_inprocess("sim.api.report", sweep_dir, "-o", out, cwd=tmp_path)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------------------------------------------------ vllm_slots
def _checkpoint(d: Path, config, side=None) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if side is not None:
        (d / "hybridspec.json").write_text(side)
    return d


@pytest.mark.parametrize("config,side,says", [
    ("[1]", None, "expected a model's config.json (a JSON object), got a list of 1"),
    ({"architectures": ["Qwen3DSparkModel"], "block_size": "7"}, None, "field 'block_size': expected an integer"),
    ({"architectures": 5, "block_size": 7}, None, "field 'architectures'"),
    ({"architectures": ["Qwen3DSparkModel"], "block_size": 10**12}, None, "field 'block_size'"),
    ({"architectures": ["Qwen3DSparkModel"], "block_size": 7, "num_hidden_layers": 1}, "[1]", "hybridspec.json"),
    ({"architectures": ["Qwen3DSparkModel"], "block_size": 7}, '{"source": NaN}', "NaN is not a finite number"),
    ({"architectures": ["Llama"], "block_size": 7}, None, "not a DSpark checkpoint"),
], ids=["a_list", "block_a_word", "architectures_a_number", "block_huge", "side_a_list", "side_nan", "not_dspark"])
def test_slots_run_refuses_a_malformed_checkpoint_before_vllm_is_needed(tmp_path, config, side, says):
    d = _checkpoint(tmp_path / "ckpt", config, side)
    refused("real.validation.vllm_slots", "--vllm-device", "cpu", "--drafter", d, "--cached-only",
            "--out", tmp_path / "s", cwd=tmp_path, says=says)


def test_slots_run_refuses_a_config_json_that_is_a_pipe(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    os.mkfifo(d / "config.json")
    refused("real.validation.vllm_slots", "--vllm-device", "cpu", "--drafter", d, "--cached-only",
            "--out", tmp_path / "s", cwd=tmp_path, says="a pipe (FIFO)")


@pytest.mark.parametrize("flag,value,says", [("--slots", "-3", "must be >= 1"), ("--slots", "65", "must be <= 64"),
                                             ("--batch-size", "0", "must be >= 1"), ("--limit", "0", "must be >= 1"),
                                             ("--max-tokens", "nan", "expected an integer"),
                                             ("--max-num-batched-tokens", "0", "must be >= 1"),
                                             ("--seed", "-1", "must be >= 0")])
def test_slots_run_checks_its_numbers_before_any_work(tmp_path, flag, value, says):
    refused("real.validation.vllm_slots", "--vllm-device", "cpu", "--cached-only", "--out", tmp_path / "s",
            flag, value, cwd=tmp_path, says=says)
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------------------ command-line JSON, policies, seeds
RUN = ("sim.api.run", "--trace", TINY, "--limit", "4", "--batch-size", "2", "--no-progress", "--workers", "1")


@pytest.mark.parametrize("config,says", [
    ('{"method": ["ngram"]}', "field 'method': expected a string, got a list of 1"),
    ('{"method": {"a": 1}}', "field 'method': expected a string, got an object"),
    ('{"method": 7}', "field 'method': expected a string, got 7"),
    ("{}", "'method' is required"),
    ('{"method": "ngram", "num_speculative_tokens": NaN}', "NaN is not a finite number"),
    ("[1]", "expected a JSON object such as"),
])
@pytest.mark.parametrize("module", ["sim.api.run", "sim.api.sweep"])
def test_a_speculative_config_of_the_wrong_type_is_one_line(tmp_path, config, says, module):
    args = list(RUN[1:]) + ["--speculative-config", config]
    if module == "sim.api.sweep":
        args += ["--out", tmp_path / "sw"]
    refused(module, *args, cwd=tmp_path, says=says)


@pytest.mark.parametrize("spec", ["hybrid:table=step:table=startup", "hybrid:margin=0.1:margin=0.2",
                                  "hybrid-price:recal=2:recal=3"])
def test_a_policy_option_given_twice_is_refused(tmp_path, spec):
    refused(*RUN, "--policy", spec, cwd=tmp_path, says="is given twice")


@pytest.mark.parametrize("spec,says", [
    ("adaptive:nope", "variant must be one of early-stop, online, got 'nope'"),
    ("hybrid-tree:discount=1.5", "discount must be a finite number in 0..1, got 1.5"),
    ("ngram-mtp:b1=1", "b1 is a flag"), ("suffix:-1", "K must be an integer >= 0, got -1"),
])
def test_a_declared_policy_setting_out_of_its_range_is_one_line(tmp_path, spec, says):
    refused(*RUN, "--policy", spec, "--drafters", "dspark,ngram,suffix", cwd=tmp_path, says=says)


def test_a_bound_is_written_as_the_rule_is():
    from sim.core.policies import get_policy

    with pytest.raises(ConfigError, match=r"must be a finite number > 0, got -1"):
        get_policy("hybrid:recal=-1")


@pytest.mark.parametrize("module,args", [
    ("sim.api.suffix_report", ["--trace", TINY]), ("sim.api.drafter_axis", ["--trace", TINY, "--batch-size", "1"]),
    ("sim.api.suffix_calibrate", []), ("real.validation.vllm_slots", ["--vllm-device", "cpu", "--cached-only"]),
    ("real.drafter.train_v_job", ["--out", "x.pt"]),
])
@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_a_seed_out_of_range_is_refused_by_every_command(tmp_path, module, args, seed):
    refused(module, *args, "--seed", seed, cwd=tmp_path, says="argument --seed: must be")


# ------------------------------------------------------------------------------------------ suffix drafter
def test_suffix_report_refuses_a_length_only_trace_and_takes_a_small_trace_whole(tmp_path):
    refused("sim.api.suffix_report", "--trace", LENGTHS, cwd=tmp_path, says="a length-only trace")
    r = run_cli_inprocess("sim.api.suffix_report", "--trace", TINY, cwd=tmp_path)  # 12 requests: under the 40
    assert r.returncode == 0, r.stderr
    assert r.stdout.count(str(TINY)) == 3  # one row per drafter


def _long_trace(path: Path, n: int) -> Path:
    import numpy as np

    ids = np.random.default_rng(0).integers(0, 50_000, n + 8).tolist()
    path.write_text(json.dumps({"id": "long", "prompt_ids": ids[:n], "output_ids": ids[n:]}) + "\n")
    return path


def test_the_suffix_drafters_memory_is_estimated_and_refused_up_front(tmp_path):
    from sim.core.drafters.suffix import BYTES_PER_NODE, SuffixConfig, memory_bytes

    total, tree = memory_bytes(SuffixConfig(max_depth=256), [40_008], [8], 1)
    assert tree == 40_008 * 256 * BYTES_PER_NODE and total == tree + 8 * 256 * BYTES_PER_NODE
    trace = _long_trace(tmp_path / "long.jsonl", 40_000)  # 40k tokens at depth 256: about 2 GiB of tree
    args = ("sim.api.run", "--trace", trace, "--batch-size", "1", "--no-progress", "--workers", "1", "--drafters",
            "dspark,ngram,suffix", "--policy", "suffix", "--suffix-max-depth", "256")
    refused(*args, cwd=tmp_path, says="the suffix drafter's tree of one request of 40008 tokens at depth 256")
    refused("sim.api.suffix_report", "--trace", trace, cwd=tmp_path, env={"HYBRIDSPEC_SUFFIX_MEMORY_GB": "0.1"},
            says="the suffix drafter would take about 0.2 GiB (depth 24, batch 1)")  # the same check, its default depth
    refused(*RUN, "--drafters", "dspark,ngram,suffix", "--policy", "suffix", cwd=tmp_path,
            env={"HYBRIDSPEC_SUFFIX_MEMORY_GB": "0.0001"}, says="over HYBRIDSPEC_SUFFIX_MEMORY_GB=0.0001")


def test_suffix_settings_for_a_drafter_the_run_does_not_enable_are_refused(tmp_path):
    refused(*RUN, "--policy", "adaptive", "--suffix-max-depth", "30", cwd=tmp_path,
            says="settings for the suffix drafter, which this run does not enable")


# ------------------------------------------------------------------------------------------ checkpoints and configs
def _save_blob(path: Path, blob: dict) -> Path:
    import hashlib
    import io

    import torch

    buf = io.BytesIO()
    torch.save(blob, buf)
    path.write_bytes(buf.getvalue())
    Path(str(path) + ".sha256").write_text(f"{hashlib.sha256(buf.getvalue()).hexdigest()}  {path.name}\n")
    return path


def test_a_checkpoint_whose_config_asks_for_gigabytes_is_refused_before_the_model_is_built(tmp_path):
    from dataclasses import asdict

    from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig

    big = asdict(DSparkVConfig(hidden=24576, intermediate=65536, heads=48, kv_heads=8, head_dim=128))  # ~50 GB
    _save_blob(tmp_path / "big.pt", {"format": DSparkV.FORMAT, "config": big, "meta": {}, "state": {}})
    line = refused("real.drafter.export_vllm", "--drafter", tmp_path / "big.pt", "--out", tmp_path / "x",
                   cwd=tmp_path, says="config and weights do not match")
    assert "GB in float32" in line
    cfg = dict(asdict(DSparkVConfig()), hidden="wide")
    _save_blob(tmp_path / "t.pt", {"format": DSparkV.FORMAT, "config": cfg, "meta": {}, "state": {}})
    refused("real.drafter.export_vllm", "--drafter", tmp_path / "t.pt", "--out", tmp_path / "x", cwd=tmp_path,
            says="field 'config.hidden': expected an integer, got 'wide'")
    _save_blob(tmp_path / "s.pt", {"format": DSparkV.FORMAT, "config": asdict(DSparkVConfig()), "meta": {}, "state": [1]})
    refused("real.drafter.export_vllm", "--drafter", tmp_path / "s.pt", "--out", tmp_path / "x", cwd=tmp_path,
            says="its state is not a mapping of names to tensors")


def test_an_exported_directory_is_read_through_the_layer(tmp_path):
    import torch

    from real.drafter.export_vllm import export_vllm, read_vllm_dir
    from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig

    torch.manual_seed(0)
    cfg = DSparkVConfig(target_vocab=64, hidden=32, layers=(0, 1), num_layers=1, heads=2, kv_heads=1, head_dim=16,
                        intermediate=64, vocab=64, rank=8, mask_token_id=63, shared_k_norm=True)
    d = DSparkV(cfg)
    d.set_vocab(torch.arange(64))
    out = export_vllm(d, tmp_path / "ok")
    assert read_vllm_dir(out).cfg.hidden == 32  # the control
    text = (out / "config.json").read_text()
    c = json.loads(text)
    for bad, says in ((json.dumps(dict(c, hidden_size=24576, intermediate_size=65536)), "config and weights do not match"),
                      (json.dumps(dict(c, rope_theta="fast")), "field 'rope_theta': expected a finite number > 0"),
                      (json.dumps(dict(c, head_dim=7)).replace('"head_dim": 7', '"head_dim": 1e400'),
                       "1e400 is not a finite number"),
                      (text[: len(text) // 2], "not valid JSON")):
        (out / "config.json").write_text(bad)
        with pytest.raises(ConfigError, match=says):
            read_vllm_dir(out)
    (out / "config.json").write_text(json.dumps(c))
    (out / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00" + b'{"x": 1}' + b" " * 8)
    with pytest.raises(ConfigError, match="model.safetensors: field 'x'"):
        read_vllm_dir(out)


def test_vllm_cpu_without_safetensors_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "safetensors" else real(name, *a))
    refused("real.validation.vllm_cpu.make_models", "tiny-target", "--out", tmp_path / "t", cwd=tmp_path,
            says="needs safetensors, which this Python lacks: pip install safetensors")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("flag,value", [("--l1-weight", "nan"), ("--ce-weight", "-1"), ("--lr", "inf"),
                                        ("--steps", "0"), ("--vocab", "999999"), ("--threads", "0")])
def test_train_drafter_v_checks_its_flags_before_labelling(tmp_path, flag, value, monkeypatch):
    import real.drafter.train_v_job as job

    def no_labels(*a, **k):
        raise AssertionError("labelling started before the flags were checked")

    monkeypatch.setattr(job, "collect_labels", no_labels)
    refused("real.drafter.train_v_job", "--out", tmp_path / "x.pt", flag, value, cwd=tmp_path, says=flag)


# ------------------------------------------------------------------------------------------ sweep grids
@pytest.mark.parametrize("line,says", [
    ("drafter_config = {suffix = 5}", "grid key 'drafter_config': --suffix-config: expected a JSON object"),
    ("drafter_config = 5", "grid key 'drafter_config': bad value 5"),
    ('drafter_config = "{\\"suffix\\": {\\"max_depth\\": true}}"', "grid key 'drafter_config': --suffix-max-depth"),
    ("drafters = 5", "grid key 'drafters': bad value 5"),
    ('drafters = ["dspark,sufix"]', "unknown drafter 'sufix'"),
])
def test_a_sweep_grid_value_of_the_wrong_type_is_refused_up_front(tmp_path, line, says):
    g = tmp_path / "g.toml"
    g.write_text(f'trace = ["{TINY}"]\nlimit = 4\npolicy = ["adaptive"]\nbatch_size = [2]\n{line}\n')
    refused("sim.api.sweep", "--grid", g, "--workers", "1", "--no-progress", "--out", tmp_path / "sw", cwd=tmp_path,
            says=says)
    assert not (tmp_path / "sw" / "results.csv").exists()


def test_a_sweep_grid_table_of_drafter_settings_runs(tmp_path):
    g = tmp_path / "g.toml"
    g.write_text(f'trace = ["{TINY}"]\nlimit = 4\npolicy = ["suffix"]\nbatch_size = [2]\n'
                 'drafters = ["dspark,ngram,suffix"]\ndrafter_config = {suffix = {max_depth = 12}}\n')
    r = run_cli_inprocess("sim.api.sweep", "--grid", g, "--workers", "1", "--no-progress", "--out", tmp_path / "sw",
                          cwd=tmp_path)
    assert r.returncode == 0 and "0 failed" in r.stderr, r.stderr
    import pandas as pd

    df = pd.read_csv(tmp_path / "sw" / "results.csv")
    assert (df["status"] == "ok").all() and df["drafter_config"].str.contains('"max_depth": 12').all()


def test_a_boolean_is_no_number_for_any_suffix_setting():
    """Every suffix setting is typed once (sim/core/drafters/suffix.py SuffixConfig): true/false is refused for each,
    whether it comes as --suffix-config JSON, a sweep grid's table or vLLM's speculative config."""
    import dataclasses

    from sim.core.drafters.registry import parse_drafter_config
    from sim.core.drafters.suffix import SuffixConfig
    from sim.core.vllm import SUFFIX_FIELDS, speculative_config

    for f in dataclasses.fields(SuffixConfig):
        with pytest.raises(ConfigError, match=f"--suffix-{f.name.replace('_', '-')} must be"):
            parse_drafter_config({"suffix": {f.name: True}})
    for vllm_name in SUFFIX_FIELDS:
        with pytest.raises(ConfigError, match="must be"):
            speculative_config(json.dumps({"method": "suffix", vllm_name: False}), (2, 5), 7)
