"""The mechanisms behind issue 60, each on its own (the hostile suite, tests/hostile_cases.py, runs the commands):
the output layer's own names (a tag only it gives), the input layer's strict JSON and environment sizes, bounded
Hugging Face configs and the valid edges they still accept, capped reads of the commands' caches and a hub cache's
refs/main, and a report's `-o r.md` in the working folder."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_cli_inprocess

from sim.infra import fsio
from sim.infra.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DEAD = 2**22 + 999  # no live process has it


# ------------------------------------------------------------------------------------------ the output layer's names
def test_only_the_layers_own_tagged_names_are_internal():
    for kind in ("tmp", "old", "part", "jtmp", "commit", "lock", "swap"):
        own = fsio.own_name("out", kind, DEAD if kind not in ("lock", "swap") else None)
        assert fsio.is_internal(own), own
        forged = own.replace(own.split(".")[-2], "0" * 12)  # the same shape with another tag: a user's
        assert not fsio.is_internal(forged), forged
    for name in (".out.lock", f".out.{DEAD}.tmp", ".out.swap", f".unit.{DEAD}.commit", ".report.2023.old", "poetry.lock"):
        assert not fsio.is_internal(name), name


def test_clean_leftovers_removes_its_own_dead_temporaries_only(tmp_path):
    own_dir, own_file = tmp_path / fsio.own_name("o", "tmp", DEAD), tmp_path / fsio.own_name("o", "old", DEAD)
    own_dir.mkdir()
    own_file.write_text("x")
    users = [tmp_path / f".o.{DEAD}.tmp", tmp_path / f".o.{DEAD}.old", tmp_path / ".o.lock"]
    users[0].mkdir()
    (users[0] / "mine").write_text("mine")
    for u in users[1:]:
        u.write_text("mine")
    live = tmp_path / fsio.own_name("o", "tmp", os.getpid())  # a writer still running: kept
    live.mkdir()
    gone = fsio.clean_leftovers(tmp_path / "o")
    assert set(gone) == {own_dir, own_file}
    assert all(u.exists() for u in users) and (users[0] / "mine").read_text() == "mine" and live.exists()


def test_recover_never_acts_on_a_journal_it_did_not_name(tmp_path):
    """A user's `.x.commit` holding a journal's JSON, with a file it names: neither moved nor removed."""
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / f".notes.txt.{DEAD}.part").write_text("not mine to move")
    journal = tmp_path / f".unit.{DEAD}.commit"
    journal.write_text(json.dumps({"files": {"notes.txt": f".notes.txt.{DEAD}.part"}}))
    fsio.recover(tmp_path)
    fsio.clean_dead(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine" and journal.exists()
    assert (tmp_path / f".notes.txt.{DEAD}.part").exists()


def test_a_journal_naming_a_file_that_is_not_its_temporary_is_skipped(tmp_path):
    (tmp_path / "a.csv").write_text("old")
    (tmp_path / "other").write_text("a file of the user's")
    journal = tmp_path / fsio.own_name("unit", "commit", DEAD)
    journal.write_text(json.dumps({"files": {"a.csv": "other"}}))  # ours by name, but naming a user's file
    fsio.recover(tmp_path)
    assert (tmp_path / "other").read_text() == "a file of the user's" and (tmp_path / "a.csv").read_text() == "old"


def test_atomic_dir_refuses_a_user_folder_at_a_written_name_and_carries_every_folder(tmp_path):
    out = tmp_path / "o"
    (out / "report.html").mkdir(parents=True)
    (out / "report.html" / "mine").write_text("mine")
    with pytest.raises(ConfigError, match="is a folder this command does not write"):
        with fsio.atomic_dir(out) as tmp:
            (tmp / "report.html").write_text("<html>")
    assert (out / "report.html" / "mine").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if fsio.is_internal(p.name)]  # the temporary went
    (out / "report.html" / "mine").unlink()
    (out / "report.html").rmdir()
    (out / "steps.csv").mkdir()
    (out / "steps.csv" / "mine").write_text("mine")
    with fsio.atomic_dir(out, keep=lambda n: n != "steps.csv") as tmp:  # dropped as a file, kept as a folder
        (tmp / "summary.json").write_text("{}")
    assert (out / "steps.csv" / "mine").read_text() == "mine" and (out / "summary.json").is_file()


# ------------------------------------------------------------------------------------------ the cache's mark
def test_cache_root_marks_only_a_folder_it_creates(tmp_path, monkeypatch):
    monkeypatch.setenv(fsio.ENV, str(tmp_path / "new" / "cache"))
    root = fsio.cache_root()
    assert fsio.is_marked_cache(root)
    assert fsio.cache_root(create=False) == root
    monkeypatch.setenv(fsio.ENV, str(tmp_path / "later"))
    assert not (tmp_path / "later").exists() and fsio.cache_root(create=False) == tmp_path / "later"
    assert not (tmp_path / "later").exists()  # listing or pruning never makes a cache folder
    (tmp_path / "mine").mkdir()
    monkeypatch.setenv(fsio.ENV, str(tmp_path / "mine"))
    fsio.cache_root()
    assert not fsio.is_marked_cache(tmp_path / "mine")


def test_a_mark_that_is_a_link_or_holds_other_text_is_no_mark(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / fsio.CACHE_MARK).write_text("something else\n")
    assert not fsio.is_marked_cache(tmp_path / "a")
    (tmp_path / "b").mkdir()
    (tmp_path / "real-mark").write_text(fsio.CACHE_MARK_TEXT)
    (tmp_path / "b" / fsio.CACHE_MARK).symlink_to(tmp_path / "real-mark")
    assert not fsio.is_marked_cache(tmp_path / "b")


# ------------------------------------------------------------------------------------------ strict inputs
@pytest.mark.parametrize("data,match", [
    (b'{"a": 1, "a": 2}', "given twice"), (b'{"x": {"b": 1, "b": 1}}', "given twice"),
    ('{"a": 1}'.encode("utf-16"), "not UTF-8"), ('{"a": 1}'.encode("utf-32"), "not UTF-8"),
])
def test_parse_json_refuses_duplicate_keys_and_other_encodings(data, match):
    from sim.infra.inputs import parse_json

    with pytest.raises(ConfigError, match=match):
        parse_json(data, "f.json")
    assert parse_json(b'\xef\xbb\xbf{"a": [{"a": 1}]}', "f.json") == {"a": [{"a": 1}]}  # a BOM and a key per object


@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf", "-inf", "1e400", "lots", "0x10", "1e300"])
def test_env_sizes_are_parsed_strictly(monkeypatch, value):
    from sim.infra.inputs import env_size

    monkeypatch.setenv("HYBRIDSPEC_TEST_SIZE", value)
    with pytest.raises(ConfigError, match="not a valid size"):
        env_size("HYBRIDSPEC_TEST_SIZE", "GiB")
    monkeypatch.setenv("HYBRIDSPEC_TEST_SIZE", "1.5")
    assert env_size("HYBRIDSPEC_TEST_SIZE", "GiB") == 1.5
    monkeypatch.delenv("HYBRIDSPEC_TEST_SIZE")
    assert env_size("HYBRIDSPEC_TEST_SIZE", "GiB") is None


def test_the_suffix_memory_guard_reads_the_env_strictly(monkeypatch):
    from sim.core.drafters.suffix import MEMORY_ENV, SuffixConfig, check_memory

    monkeypatch.setenv(MEMORY_ENV, "nan")
    with pytest.raises(ConfigError, match="not a valid size"):
        check_memory(SuffixConfig(), [10], [10], 1)
    monkeypatch.setenv(MEMORY_ENV, "1e-12")  # a real (tiny) limit still refuses what is over it
    with pytest.raises(ConfigError, match=f"over {MEMORY_ENV}"):
        check_memory(SuffixConfig(), [100_000], [1000], 4)


def test_iter_lines_caps_each_line_and_refuses_a_pipe(tmp_path, monkeypatch):
    from sim.infra.inputs import CAP_ENV, REQUEST, iter_lines

    f = tmp_path / "r.jsonl"
    f.write_bytes(b'{"a": 1}\n' + b"x" * (2 * 2**20) + b"\n")
    assert list(iter_lines(f, REQUEST, limit=1)) == ['{"a": 1}\n']  # only what is asked for is read
    monkeypatch.setenv(CAP_ENV, "1")
    with pytest.raises(ConfigError, match=r"r.jsonl:2: a line over the 1 MiB"):
        list(iter_lines(f, REQUEST))
    os.mkfifo(tmp_path / "p")
    with pytest.raises(ConfigError, match="pipe"):
        list(iter_lines(tmp_path / "p", REQUEST))


# ------------------------------------------------------------------------------------------ Hugging Face configs
def _spec(tmp_path: Path, **fields):
    from hostile_cases import HF_BASE

    from sim.core.models import get_llm

    d = tmp_path / f"m{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**HF_BASE, **fields}))
    return get_llm(str(d))


def test_a_qwen_moe_without_a_shared_expert_is_accepted(tmp_path):
    moe = {"num_experts": 4, "moe_intermediate_size": 32, "num_experts_per_tok": 2}
    zero = _spec(tmp_path, **moe, shared_expert_intermediate_size=0)
    absent = _spec(tmp_path, **moe)
    assert zero.num_params == absent.num_params and zero.num_experts == 4  # 0 is "no shared expert", as absent
    assert _spec(tmp_path, **moe, shared_expert_intermediate_size=16).num_params > zero.num_params


def test_config_integers_are_bounded_per_field_and_the_largest_real_shapes_pass(tmp_path):
    big = _spec(tmp_path, num_hidden_layers=126, hidden_size=16384, num_attention_heads=128, num_key_value_heads=8,
                vocab_size=256_000, intermediate_size=53248, max_position_embeddings=131072)
    assert big.num_layers == 126 and big.max_model_len == 131072  # Llama-3.1-405B's shape
    from sim.core import hf_config

    for key, most in hf_config._MAX.items():
        with pytest.raises(ConfigError, match=f"'{key}'"):
            hf_config._int({key: most + 1}, key, "c.json")
        assert hf_config._int({key: most}, key, "c.json") == most


def test_a_fifo_config_is_named_a_pipe(tmp_path):
    from sim.core.models import get_llm

    d = tmp_path / "m"
    d.mkdir()
    os.mkfifo(d / "config.json")
    with pytest.raises(ConfigError, match="pipe"):
        get_llm(str(d))


# ------------------------------------------------------------------------------------------ capped reads
def test_a_hub_refs_main_that_is_not_a_commit_id_names_no_snapshot(tmp_path, monkeypatch):
    from sim.core.trace.tokenizer import cached_hf_file

    hub = tmp_path / "hub"
    folder = hub / "models--org--name"
    (folder / "refs").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "tokenizer.json").write_text("{}")
    (folder / "snapshots").mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    for ref in ("../../../outside", str(tmp_path / "outside"), "x" * 5000):
        (folder / "refs" / "main").write_text(ref)
        assert cached_hf_file("org/name") is None, ref
    sha = "a" * 40
    (folder / "snapshots" / sha).mkdir()
    (folder / "snapshots" / sha / "tokenizer.json").write_text("{}")
    (folder / "refs" / "main").write_text(sha + "\n")
    assert cached_hf_file("org/name") == folder / "snapshots" / sha / "tokenizer.json"


def test_an_oversized_sweep_cell_is_not_read_and_is_recomputed(tmp_path):
    from sim.api.sweep import load_cell

    cell = tmp_path / "c.json"
    with open(cell, "wb") as f:
        f.truncate(2**31)  # a hole: 2 GiB that takes no disk
    got, why = load_cell(cell, "c")
    assert got is None and "unreadable" in why


def test_a_huge_checksum_sidecar_is_refused_before_it_is_read(tmp_path):
    from real.drafter.model import load_drafter

    w = tmp_path / "w.pt"
    w.write_bytes(b"weights")
    with open(tmp_path / "w.pt.sha256", "wb") as f:
        f.truncate(2**31)
    with pytest.raises(ConfigError, match="checksum file"):
        load_drafter(w)


def test_drafter_v_report_writes_into_the_working_folder(tmp_path):
    """`-o r.md` names a file in the working folder: accepted as such (the folder is never replaced); what stops
    this run is the drafter it was given, not the output path."""
    (tmp_path / "d.pt").write_bytes(b"not a drafter")
    r = run_cli_inprocess("real.validation.drafter_v_report", "--drafter", "d.pt", "-o", "r.md", cwd=tmp_path)
    assert r.returncode == 2 and "current folder" not in r.stderr and "d.pt" in r.stderr, r.stderr
