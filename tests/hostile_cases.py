"""Generator of the hostile-input suite (issue 12): bad or odd inputs for every command, each of which must be
refused with one line `error: ...`, exit 2, no traceback, and no change to the files it was given.

A case is (id, class, module, build): `build(tmp)` writes whatever files the case needs under `tmp` and returns
the command line and the files that must come out unchanged (inputs, and outputs that already existed). The
cases are generated as products of *slots* (a command's input file, output path or number flag) and *kinds*
(what is wrong with it), plus hand-written type-confusion and data-loss cases. Classes, from the issue:
  parser  parser limits: deep nesting, huge integers, huge CSV fields, lone surrogates, invalid UTF-8, binary
  os      operating-system errors: missing, a folder, unreadable, output under a file / a file / read-only
  size    absurd sizes: token lengths of 1e11..1e30, /dev/zero, arrivals of 1e20, rates of 1e-308, 0 threads
  type    type confusion: floats for ints, booleans for numbers, one kind of file given for another
  loss    silent loss: existing outputs replaced, a results table cut mid-row, an output onto its input
  args    numbers out of range on the command line (nan, inf, negative, zero, thousands of digits)
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "tests" / "fixtures" / "sim" / "tiny.jsonl"
FIX = ROOT / "tests" / "fixtures" / "trace"
LLM_JSON = ROOT / "models" / "llms" / "qwen3-8b.json"
CALIBRATOR = ROOT / "models" / "calibrators" / "ngram-general.json"
DRAFTER_JSON = ROOT / "models" / "drafters" / "dspark-qwen3-b7.json"
COST_TABLE = ROOT / "models" / "cost_tables" / "h100-sxm_qwen3-8b.json"

Build = Callable[[Path], tuple[list[str], list[Path]]]


@dataclass(frozen=True)
class Case:
    id: str
    klass: str
    module: str
    build: Build

    def __repr__(self) -> str:
        return self.id


# ------------------------------------------------------------------------------------------ hostile files
DEEP = 100_000
HUGE_DIGITS = "9" * 5000  # more digits than Python converts by default (4300)


def _jsonl_line(**kw) -> str:
    return json.dumps(kw) + "\n"


# content kinds for a JSONL trace (one request per line); each is bytes written to the file
TRACE_KINDS: dict[str, tuple[str, bytes]] = {
    "empty": ("parser", b""),
    "blank_lines": ("parser", b"\n\n  \n"),
    "binary": ("parser", bytes(range(256)) * 8),
    "bad_utf8": ("parser", b'{"id": "a\xff\xfe", "prompt_len": 3, "output_len": 4}\n'),
    "deep_list": ("parser", b"[" * DEEP + b"]" * DEEP + b"\n"),
    "deep_field": ("parser", b'{"id": "a", "prompt_len": 3, "output_len": 4, "workload": ' + b"[" * DEEP + b"]" * DEEP + b"}\n"),
    "deep_object": ("parser", b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"\n"),
    "huge_int_len": ("parser", f'{{"id": "a", "prompt_len": {HUGE_DIGITS}, "output_len": 4}}\n'.encode()),
    "huge_int_arrival": ("parser", f'{{"id": "a", "prompt_len": 3, "output_len": 4, "arrival_s": {HUGE_DIGITS}}}\n'.encode()),
    "huge_float": ("parser", b'{"id": "a", "prompt_len": 3, "output_len": 4, "arrival_s": 1e999}\n'),
    "lone_surrogate": ("parser", b'{"id": "a", "prompt": "x\\ud800y", "output": "z\\udfff"}\n'),
    "surrogate_id": ("parser", b'{"id": "\\ud800", "prompt_len": 3, "output_len": 4}\n'),
    "nul_bytes": ("parser", b'{"id": "a", "prompt_len": 3,\x00 "output_len": 4}\n'),
    "cut_mid_line": ("loss", _jsonl_line(id="a", prompt_len=3, output_len=4).encode() + b'{"id": "b", "prompt_l'),
    "not_object": ("type", b"[1, 2, 3]\n"),
    "len_float": ("type", _jsonl_line(id="a", prompt_len=3.0, output_len=4).encode()),
    "len_bool": ("type", _jsonl_line(id="a", prompt_len=True, output_len=4).encode()),
    "len_string": ("type", _jsonl_line(id="a", prompt_len="3", output_len=4).encode()),
    "ids_float": ("type", _jsonl_line(id="a", prompt_ids=[1.0, 2.0], output_ids=[3]).encode()),
    "ids_negative": ("type", _jsonl_line(id="a", prompt_ids=[1, -2], output_ids=[3]).encode()),
    "arrival_string": ("type", _jsonl_line(id="a", prompt_len=3, output_len=4, arrival_s="soon").encode()),
    "temp_nan": ("type", b'{"id": "a", "prompt_len": 3, "output_len": 4, "temperature": NaN}\n'),
    "dup_id": ("type", (_jsonl_line(id="a", prompt_len=3, output_len=4) * 2).encode()),
    "len_1e11": ("size", _jsonl_line(id="a", prompt_len=10**11, output_len=4).encode()),
    "len_1e30": ("size", _jsonl_line(id="a", prompt_len=3, output_len=10**30).encode()),
    "len_zero": ("size", _jsonl_line(id="a", prompt_len=3, output_len=0).encode()),
    "arrival_1e20": ("size", (_jsonl_line(id="a", prompt_len=3, output_len=4, arrival_s=0)
                              + _jsonl_line(id="b", prompt_len=3, output_len=4, arrival_s=1e20)).encode()),
    "arrival_neg": ("size", _jsonl_line(id="a", prompt_len=3, output_len=4, arrival_s=-1).encode()),
    "ids_huge": ("size", _jsonl_line(id="a", prompt_ids=[2**40], output_ids=[3]).encode()),
    "huge_line": ("parser", _jsonl_line(id="a", prompt_len=3, output_len=4, pad="x" * (200 * 1024)).encode()[:-2] + b"\n"),
}

# which trace kinds a command that *simulates* or *streams* a trace must refuse (a stats-only reader may accept
# a long request; the simulator may not)
SIM_ONLY = {"len_1e11", "len_1e30", "arrival_1e20"}

JSON_KINDS: dict[str, tuple[str, bytes]] = {  # a single JSON document (calibrator, drafter profile, cost table)
    "empty": ("parser", b""),
    "binary": ("parser", bytes(range(256)) * 4),
    "bad_utf8": ("parser", b'{"name": "\xff"}'),
    "deep": ("parser", b"[" * DEEP + b"]" * DEEP),
    "deep_object": ("parser", b'{"a":' * DEEP + b"1" + b"}" * DEEP),
    "huge_int": ("parser", f'{{"n": {HUGE_DIGITS}}}'.encode()),
    "surrogate": ("parser", b'{"name": "\\ud800"}'),
    "truncated": ("loss", b'{"name": "x", "weights": [1, 2'),
    "list": ("type", b"[1, 2, 3]"),
    "string": ("type", b'"hello"'),
    "null": ("type", b"null"),
}

CSV_HEADERS = {"azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
               "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
               "vidur": "num_prefill_tokens,num_decode_tokens"}
CSV_ROWS = {"azure": ["2023-11-16 18:15:46.6805900,{p},{o}"], "burstgpt": ["5,GPT-4,{p},{o},500,Conversation log"],
            "vidur": ["{p},{o}"]}


def csv_kinds(fmt: str) -> dict[str, tuple[str, bytes]]:
    head = CSV_HEADERS[fmt]
    row = CSV_ROWS[fmt][0]

    def doc(*rows: str) -> bytes:
        return ("\n".join([head, *rows]) + "\n").encode()

    kinds = {
        "empty": ("parser", b""),
        "binary": ("parser", bytes(range(256)) * 4),
        "bad_utf8": ("parser", doc(row.format(p=3, o=4)) + b"\xff\xfe,1,2\n"),
        "header_only": ("parser", (head + "\n").encode()),
        "field_200k": ("parser", doc(row.format(p="1" * (200 * 1024), o=4))),
        "quote_200k": ("parser", doc(row.format(p=3, o=4)) + b'"' + b"x" * (200 * 1024) + b'",1,2\n'),
        "huge_int": ("parser", doc(row.format(p=HUGE_DIGITS, o=4))),
        "nul": ("parser", doc(row.format(p=3, o=4)).replace(b",", b",\x00", 1)),
        "wrong_header": ("type", b"a,b,c\n1,2,3\n"),
        "float_len": ("type", doc(row.format(p="3.5", o=4))),
        "bool_len": ("type", doc(row.format(p="true", o=4))),
        "nan_len": ("type", doc(row.format(p="nan", o=4))),
        "neg_len": ("size", doc(row.format(p=-5, o=4))),
        "out_1e20": ("size", doc(row.format(p=3, o=10**20))),
        "out_1e30_float": ("size", doc(row.format(p=3, o="1e30"))),
        "cut_mid_row": ("loss", doc(row.format(p=3, o=4)) + row.format(p=3, o=4).encode()[:6]),
    }
    if fmt == "vidur":  # Vidur raises counts below 1 to 1 (its rule), so negative/float lengths are its data
        for k in ("float_len", "neg_len", "cut_mid_row"):
            kinds.pop(k)
    if fmt == "azure":
        kinds["mixed_timestamps"] = ("type", doc("2023-11-16 18:15:46.6805900,3,4", "12.5,3,4"))
        kinds["bad_timestamp"] = ("type", doc("yesterday,3,4"))
        kinds["ts_1e20"] = ("size", doc("0,3,4", "1e20,3,4"))
    return kinds


TOML_KINDS: dict[str, tuple[str, bytes]] = {
    "empty_list": ("type", b"batch_size = []\n"),
    "bad_utf8": ("parser", b'policy = ["\xff"]\n'),
    "binary": ("parser", bytes(range(256)) * 2),
    "bool_batch": ("type", b"batch_size = true\n"),
    "bool_in_list": ("type", b"batch_size = [4, false]\n"),
    "float_batch": ("type", b"batch_size = 2.5\n"),
    "string_batch": ("type", b'batch_size = "four"\n'),
    "huge_batch": ("size", f"batch_size = {10**30}\n".encode()),
    "neg_batch": ("args", b"batch_size = -1\n"),
    "zero_batch": ("args", b"batch_size = 0\n"),
    "nan_rate": ("args", b"rate = nan\n"),
    "tiny_rate": ("size", b"rate = 1e-308\n"),
    "neg_seed": ("args", b"seed = -1\n"),
    "unknown_key": ("type", b"batchsize = [4]\n"),
    "table_value": ("type", b"[policy]\nx = 1\n"),
    "grid_not_tables": ("type", b"grid = [1, 2]\n"),
    "missing_trace": ("os", b'trace = ["no/such/trace.jsonl"]\n'),
    "deep_array": ("parser", b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n"),
    "bad_toml": ("parser", b"batch_size = [4,\n"),
    "date_value": ("type", b"seed = 1979-05-27\n"),
    "policy_number": ("type", b"policy = [3]\n"),
    "kv_zero": ("args", b"kv_capacity_tokens = 0\n"),
    "drafter_config_table": ("type", b"drafter_config = {suffix = 5}\n"),  # issue 46: refused up front, not per cell
    "drafter_config_int": ("type", b"drafter_config = 5\n"),
}

# values a number flag must refuse (beyond its own range cases)
NUM_KINDS = {"nan": "nan", "inf": "inf", "neg_inf": "-inf", "huge_digits": HUGE_DIGITS, "word": "lots",
             "empty": "", "hex": "0x10"}


def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _copy(src: Path, dst: Path) -> Path:
    return _write(dst, src.read_bytes())


# ------------------------------------------------------------------------------------------ command bases
def run_base(tmp: Path, trace: Path | None = None) -> list[str]:
    return ["sim.api.run", "--trace", str(trace or TINY), "--policy", "adaptive", "--batch-size", "2", "--limit", "4",
            "--no-progress", "--workers", "1"]


def sweep_base(tmp: Path, trace: Path | None = None) -> list[str]:
    return ["sim.api.sweep", "--trace", str(trace or TINY), "--policy", "adaptive", "--batch-size", "2", "--limit", "4",
            "--workers", "1", "--no-progress", "--out", str(tmp / "sweep")]


def sens_base(tmp: Path, trace: Path | None = None) -> list[str]:
    return ["sim.api.sensitivity", "--trace", str(trace or TINY), "--batch-size", "2", "--sample", "6", "--workers", "1",
            "--out", str(tmp / "sens")]


def calib_base(tmp: Path, trace: Path | None = None) -> list[str]:
    return ["sim.api.calibrate", "--general", str(trace or TINY), "--eval", "--out", str(tmp / "cal" / "c.json")]


def stats_base(tmp: Path, trace: Path | None = None) -> list[str]:
    return ["sim.core.trace", "stats", str(trace or TINY)]


def eval_drafter_base(tmp: Path, trace: Path | None = None) -> list[str]:
    return ["real.validation.eval_drafter", "--trace", str(trace or FIX / "text.jsonl"), "--limit", "1", "--max-tokens", "2",
            "--no-timing", "--no-progress"]


def validate_base(tmp: Path, trace: Path | None = None) -> list[str]:
    return ["real.validation.validate", "--quick", "--trace", str(trace or FIX / "text.jsonl"), "--out", str(tmp / "val")]


# the commands that read a JSONL trace, and whether they simulate it (then lengths past the context are refused)
TRACE_READERS: dict[str, tuple[Callable, bool]] = {
    "run": (run_base, True), "sweep": (sweep_base, True), "sensitivity": (sens_base, True),
    "calibrate": (calib_base, False), "stats": (stats_base, False), "eval_drafter": (eval_drafter_base, False),
}


# ------------------------------------------------------------------------------------------ generation
def _cases_trace_inputs() -> list[Case]:
    out = []
    for cmd, (base, simulates) in TRACE_READERS.items():
        for kind, (klass, data) in TRACE_KINDS.items():
            if kind in SIM_ONLY and not simulates:
                continue

            def build(tmp, base=base, data=data, kind=kind):
                t = _write(tmp / "in" / f"{kind}.jsonl", data)
                return base(tmp, t), [t]
            out.append(Case(f"{cmd}-trace-{kind}", klass, base(Path("/x"))[0], build))
        for kind, klass, path in (("missing", "os", None), ("dir", "os", "dir"), ("dev_zero", "size", "/dev/zero"),
                                  ("proc_mem", "os", "/proc/self/mem")):
            def build(tmp, base=base, kind=kind, path=path):
                if path == "dir":
                    (tmp / "in" / "d.jsonl").mkdir(parents=True)
                    return base(tmp, tmp / "in" / "d.jsonl"), []
                return base(tmp, Path(path) if path else tmp / "in" / "none.jsonl"), []
            out.append(Case(f"{cmd}-trace-{kind}", klass, base(Path("/x"))[0], build))
    return out


def _cases_trace_stats_limit() -> list[Case]:
    out = []
    for v in ("0", "-1", HUGE_DIGITS, "nan", "x"):
        out.append(Case(f"stats-limit-{v[:8]}", "args", "sim.core.trace",
                        lambda tmp, v=v: (["sim.core.trace", "stats", str(TINY), "--limit", v], [])))
    return out


def _cases_convert() -> list[Case]:
    out = []
    jsonl_fmts = {"vllm-custom": '{{"prompt": "hi there", "output_tokens": {o}}}',
                  "mooncake": '{{"timestamp": 0, "input_length": {p}, "output_length": {o}}}'}
    for fmt, tmpl in jsonl_fmts.items():
        kinds = {k: v for k, v in TRACE_KINDS.items() if k in (
            "empty", "blank_lines", "binary", "bad_utf8", "deep_list", "deep_field", "deep_object", "huge_int_len",
            "nul_bytes", "cut_mid_line", "not_object")}
        kinds["huge_int_out"] = ("parser", (tmpl.format(p=3, o=HUGE_DIGITS) + "\n").encode())
        kinds["out_bool"] = ("type", (tmpl.format(p=3, o="true") + "\n").encode())
        kinds["out_1e20"] = ("size", (tmpl.format(p=3, o=10**20) + "\n").encode())
        kinds["out_1e30_float"] = ("size", (tmpl.format(p=3, o="1e30") + "\n").encode())
        if fmt == "vllm-custom":
            kinds["surrogate"] = ("parser", b'{"prompt": "x\\ud800", "output_tokens": 4}\n')
        for kind, (klass, data) in kinds.items():
            def build(tmp, fmt=fmt, data=data, kind=kind):
                src = _write(tmp / "in" / f"{kind}.jsonl", data)
                extra = ["--custom-output-len", "-1"] if fmt == "vllm-custom" else []
                return ["sim.core.trace", "convert", "--from", fmt, str(src), "-o", str(tmp / "out.jsonl"), *extra], [src]
            out.append(Case(f"convert-{fmt}-{kind}", klass, "sim.core.trace", build))
    for fmt in ("azure", "burstgpt", "vidur"):
        for kind, (klass, data) in csv_kinds(fmt).items():
            def build(tmp, fmt=fmt, data=data, kind=kind):
                src = _write(tmp / "in" / f"{kind}_code.csv", data)
                return ["sim.core.trace", "convert", "--from", fmt, str(src), "-o", str(tmp / "out.jsonl")], [src]
            out.append(Case(f"convert-{fmt}-{kind}", klass, "sim.core.trace", build))
    share = {"empty": ("parser", b""), "deep": ("parser", b"[" * DEEP + b"]" * DEEP),
             "deep_elem": ("parser", b'[{"id": "a", "conversations": ' + b"[" * DEEP + b"]" * DEEP + b"}]"),
             "bad_utf8": ("parser", b'[{"id": "\xff", "conversations": []}]'),
             "binary": ("parser", bytes(range(256)) * 4), "truncated": ("loss", b'[{"id": "a", "conversations": [{"from"'),
             "surrogate": ("parser", b'[{"id": "a", "conversations": [{"from": "human", "value": "\\ud800 hi there you"},'
                                     b' {"from": "gpt", "value": "\\udc00 fine thanks and you"}]}]'),
             "not_list": ("type", b'{"id": "a"}'), "huge_int_id": ("parser", b'[{"id": ' + HUGE_DIGITS.encode() + b"}]")}
    for kind, (klass, data) in share.items():
        def build(tmp, data=data, kind=kind):
            src = _write(tmp / "in" / f"{kind}.json", data)
            return ["sim.core.trace", "convert", "--from", "sharegpt", str(src), "-o", str(tmp / "out.jsonl"),
                    "--no-length-filter"], [src]
        out.append(Case(f"convert-sharegpt-{kind}", klass, "sim.core.trace", build))
    for kind, klass, path in (("missing", "os", None), ("dir", "os", "dir"), ("dev_zero", "size", "/dev/zero")):
        for fmt in ("azure", "sharegpt", "mooncake"):
            def build(tmp, fmt=fmt, path=path):
                if path == "dir":
                    (tmp / "in_code").mkdir()
                    src = tmp / "in_code"
                else:
                    src = Path(path) if path else tmp / "missing_code.csv"
                return ["sim.core.trace", "convert", "--from", fmt, str(src), "-o", str(tmp / "out.jsonl"),
                        "--workload", "code"] if fmt == "azure" else [
                        "sim.core.trace", "convert", "--from", fmt, str(src), "-o", str(tmp / "out.jsonl")], []
            out.append(Case(f"convert-{fmt}-in-{kind}", klass, "sim.core.trace", build))
    # option numbers
    for flag_, vals in (("--custom-output-len", ("0", "-2", HUGE_DIGITS, "nan")),
                        ("--sharegpt-output-len", ("0", "-1", "x"))):
        for v in vals:
            fmt = "vllm-custom" if flag_ == "--custom-output-len" else "sharegpt"
            src = FIX / ("vllm_custom.jsonl" if fmt == "vllm-custom" else "sharegpt.json")
            out.append(Case(f"convert-{flag_[2:]}-{v[:6]}", "args", "sim.core.trace",
                            lambda tmp, fmt=fmt, src=src, flag_=flag_, v=v: (
                                ["sim.core.trace", "convert", "--from", fmt, str(src), "-o", str(tmp / "o.jsonl"), flag_, v], [])))
    out.append(Case("convert-unknown-format", "args", "sim.core.trace", lambda tmp: (
        ["sim.core.trace", "convert", "--from", "parquet", str(FIX / "azure.csv"), "-o", str(tmp / "o.jsonl")], [])))
    out.append(Case("convert-onto-input-via-symlink", "loss", "sim.core.trace", _convert_onto_symlink))
    out.append(Case("convert-onto-input-via-dotdot", "loss", "sim.core.trace", _convert_onto_dotdot))
    return out


def _convert_onto_symlink(tmp: Path):
    src = _copy(FIX / "mooncake.jsonl", tmp / "m.jsonl")
    (tmp / "link.jsonl").symlink_to(src)
    return ["sim.core.trace", "convert", "--from", "mooncake", str(src), "-o", str(tmp / "link.jsonl")], [src]


def _convert_onto_dotdot(tmp: Path):
    src = _copy(FIX / "mooncake.jsonl", tmp / "sub" / "m.jsonl")
    return ["sim.core.trace", "convert", "--from", "mooncake", str(src), "-o", str(tmp / "sub" / ".." / "sub" / "m.jsonl")], [src]


# ---- output slots: (id, module, build(tmp, out_path) -> argv, wants 'dir' or 'file', inputs to protect)
def _out_slots() -> list[tuple[str, str, Callable, str]]:
    return [
        ("run", "sim.api.run", lambda tmp, o: run_base(tmp) + ["--out", str(o)], "dir"),
        ("sweep", "sim.api.sweep", lambda tmp, o: sweep_base(tmp)[:-2] + ["--out", str(o)], "dir"),
        ("report", "sim.api.report", lambda tmp, o: ["sim.api.report", str(_fake_sweep(tmp)), "-o", str(o)], "dir"),
        ("calibrate", "sim.api.calibrate", lambda tmp, o: calib_base(tmp)[:-2] + ["--out", str(o)], "file"),
        ("convert", "sim.core.trace", lambda tmp, o: ["sim.core.trace", "convert", "--from", "mooncake",
                                                 str(FIX / "mooncake.jsonl"), "-o", str(o)], "file"),
        ("build", "sim.core.trace", lambda tmp, o: ["sim.core.trace", "build", "codeedit", "--out-dir", str(o), "--limit", "1",
                                               "--no-progress"], "dir"),
        ("sensitivity", "sim.api.sensitivity", lambda tmp, o: sens_base(tmp)[:-2] + ["--out", str(o)], "dir"),
        ("bench", "sim.api.bench", lambda tmp, o: ["sim.api.bench", "--against", "none", "--trace", str(TINY), "--policy",
                                               "adaptive", "--batch-size", "2", "--repeat", "1", "--json", str(o)], "file"),
        ("profile", "real.validation.profile", lambda tmp, o: ["real.validation.profile", "--quick", "--out", str(o)], "file"),
        ("train_drafter", "real.train_drafter", lambda tmp, o: ["real.train_drafter", "--num-prompts", "1",
                                                                "--max-tokens", "2", "--out", str(o), "--no-progress"], "file"),
        ("eval_drafts_out", "real.validation.eval_drafter", lambda tmp, o: eval_drafter_base(tmp) + ["--drafts-out", str(o)], "file"),
        ("eval_trace_out", "real.validation.eval_drafter", lambda tmp, o: eval_drafter_base(tmp) + ["--trace-out", str(o)], "file"),
        ("drafter_report", "real.validation.drafter_report", lambda tmp, o: ["real.validation.drafter_report", "-o", str(o), "--limit", "1",
                                                                  "--max-tokens", "2"], "file"),
        ("gpu_check", "real.validation.gpu_check", lambda tmp, o: ["real.validation.gpu_check", "--device", "cpu", "--model", "qwen3-tiny", "--quick", "--out", str(o)], "dir"),
        ("validate", "real.validation.validate", lambda tmp, o: validate_base(tmp)[:-2] + ["--out", str(o)], "dir"),
        ("export_drafter", "real.drafter.export_vllm", lambda tmp, o: ["real.drafter.export_vllm", "--drafter",
                                                                      str(_tiny_drafter(tmp)), "--out", str(o)], "dir"),
        ("vllm_cpu_tiny", "real.validation.vllm_cpu.make_models", lambda tmp, o: [
            "real.validation.vllm_cpu.make_models", "tiny-target", "--out", str(o)], "dir"),
        ("cost_tables", "sim.core.cost", None, "file"),
    ]


FORCE_SLOTS = {"calibrate", "convert", "bench", "profile", "train_drafter", "drafter_report"}
# folder outputs whose --force replaces earlier files: `.`, `..` and the working folder are refused even with it
FORCE_DIR_SLOTS = {"run", "sweep", "report", "build", "sensitivity", "gpu_check", "export_drafter", "vllm_cpu_tiny"}


def _tiny_drafter(tmp: Path) -> Path:
    """A vLLM-architecture drafter file small enough to export at once (its vocabulary is the target's)."""
    p = tmp / "in" / "drafter-v.pt"
    if not p.exists():
        import torch

        from real.drafter.model import save_drafter
        from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig

        torch.manual_seed(0)
        p.parent.mkdir(parents=True, exist_ok=True)
        save_drafter(DSparkV(DSparkVConfig(target="qwen3-tiny", target_vocab=256, hidden=32, layers=(0,), block=3,
                                           num_layers=1, heads=2, kv_heads=1, head_dim=16, intermediate=64, vocab=256,
                                           rank=4, mask_token_id=255)), p, {"note": "hostile suite"})
    return p


# the other columns sim.report reads of a results table (sim/api/report.py load_sweep), with plain values
_REPORT_NUMBERS = ("speedup_vs_baseline,mean_step_ms,share_draft,share_ngram,share_alloc,share_verify,share_sample,"
                   "share_cpu,share_bubble,seed,cost,drafter,ngram_k,requests,output_tokens,mean_tokens_per_step,"
                   "ngram_share_verified,ngram_share_accepted")
_REPORT_ROW = "1.0,10.0,0.1,0.1,0.1,0.5,0.1,0.05,0.05,0,roofline,dspark-qwen3-b7,32,2,64,2.0,0.5,0.5"

def _fake_sweep(tmp: Path) -> Path:
    """A minimal, well-formed sweep results folder (two cells) for the report's output cases."""
    d = tmp / "sw"
    if not d.exists():
        d.mkdir()
        head = "trace,policy,batch_size,model,gpu,status,error,cell_id,output_throughput_tok_s," + _REPORT_NUMBERS + "\n"
        (d / "results.csv").write_text(head + "traces/codeedit.jsonl,adaptive,4,qwen3-8b,h100-sxm,ok,,a,100.0," + _REPORT_ROW + "\n"
                                       + "traces/codeedit.jsonl,hybrid,4,qwen3-8b,h100-sxm,ok,,b,120.0," + _REPORT_ROW + "\n")
    return d


def _cases_outputs() -> list[Case]:
    out = []
    for name, module, argv, wants in _out_slots():
        if argv is None:
            continue
        kinds = ["is_file" if wants == "dir" else "is_dir", "under_file", "read_only", "existing"]
        if wants == "file":
            kinds.append("device")  # /dev/full: never replaced, even with --force
        else:
            kinds += ["dot", "dotdot", "cwd"]  # the working folder or its parent: refused, with --force too
        for kind in kinds:
            def build(tmp, argv=argv, kind=kind, wants=wants, name=name):
                protect = []
                if kind == "is_file":
                    o = _write(tmp / "o_file", b"precious\n")
                    protect.append(o)
                elif kind == "is_dir":
                    o = tmp / "o_dir"
                    o.mkdir()
                    protect.append(_write(o / "keep.txt", b"precious\n"))
                elif kind == "under_file":
                    f = _write(tmp / "a_file", b"precious\n")
                    protect.append(f)
                    o = f / "sub" / ("o" if wants == "dir" else "o.json")
                elif kind == "device":  # with --force where the command has one
                    return argv(tmp, Path("/dev/full")) + (["--force"] if name in FORCE_SLOTS else []), protect
                elif kind in ("dot", "dotdot", "cwd"):  # run from tmp, which holds the case's files
                    protect += [_write(tmp / "precious.txt", b"precious\n"), _write(tmp / "in" / "keep.txt", b"keep\n")]
                    o = {"dot": Path("."), "dotdot": Path(".."), "cwd": tmp}[kind]
                    return argv(tmp, o) + (["--force"] if name in FORCE_DIR_SLOTS else []), protect
                elif kind == "read_only":
                    o = Path("/proc/hybridspec-hostile") / ("o" if wants == "dir" else "o.json")
                else:  # an earlier result, replaced only with --force
                    if wants == "dir":
                        o = tmp / "earlier"
                        o.mkdir()
                        for n in ("summary.json", "results.csv", "index.html", "sensitivity.md", "cost_table.json",
                                  "report.md", "codeedit.jsonl"):
                            protect.append(_write(o / n, b"earlier result\n"))
                    else:
                        o = _write(tmp / "earlier.json", b"earlier result\n")
                        protect.append(o)
                return argv(tmp, o), protect
            klass = "loss" if kind in ("existing", "dot", "dotdot", "cwd") else "os"
            out.append(Case(f"{name}-out-{kind}", klass, module, build))
    # sim.core.cost --write-tables replaces a tracked file: refused without --force
    out.append(Case("cost-write-tables-tracked", "loss", "sim.core.cost",
                    lambda tmp: (["sim.core.cost", "--write-tables"], [COST_TABLE])))
    out.append(Case("calibrate-write-shipped", "loss", "sim.api.calibrate",
                    lambda tmp: (["sim.api.calibrate", "--general", str(TINY), "--eval", "--write"], [CALIBRATOR])))
    out.append(Case("report-onto-committed", "loss", "sim.api.report",
                    lambda tmp: (["sim.api.report", str(_fake_sweep(tmp)), "-o", str(ROOT / "reports")],
                                 [ROOT / "reports" / "paper.md", ROOT / "reports" / "tables.md", ROOT / "reports" / "index.html"])))
    return out


# ---- number flags: (id, module, argv(tmp) prefix, flag, bad values specific to it)
def _num_slots() -> list[tuple[str, Callable, str, tuple[str, ...]]]:
    run = lambda tmp: run_base(tmp)  # noqa: E731
    sweep = lambda tmp: sweep_base(tmp)  # noqa: E731
    sens = lambda tmp: sens_base(tmp)  # noqa: E731
    calib = lambda tmp: calib_base(tmp)  # noqa: E731
    bench = lambda tmp: ["sim.api.bench", "--against", "none", "--trace", str(TINY), "--policy", "adaptive"]  # noqa: E731
    cost = lambda tmp: ["sim.core.cost"]  # noqa: E731
    val = lambda tmp: validate_base(tmp)  # noqa: E731
    prof = lambda tmp: ["real.validation.profile", "--quick", "--out", str(tmp / "p.json")]  # noqa: E731
    train = lambda tmp: ["real.train_drafter", "--out", str(tmp / "d.pt"), "--no-progress"]  # noqa: E731
    ev = lambda tmp: eval_drafter_base(tmp)  # noqa: E731
    rep = lambda tmp: ["real.validation.drafter_report", "-o", str(tmp / "r.md")]  # noqa: E731
    gpu = lambda tmp: ["real.validation.gpu_check", "--device", "cpu", "--model", "qwen3-tiny", "--quick", "--out", str(tmp / "g")]  # noqa: E731
    noise = lambda tmp: ["real.validation.machine_noise", "--model", "qwen3-tiny", "--random-weights", "--minutes", "0.01",  # noqa: E731
                         "--out", str(tmp / "n.json")]
    return [
        ("run", run, "--batch-size", ("0", "-3", "1e30", "2.5")),
        ("run", run, "--seed", ("-1",)),
        ("run", run, "--rate", ("0", "-1", "1e-308")),
        ("run", run, "--temperature", ("-0.5",)),
        ("run", run, "--sample", ("0", "100000")),
        ("run", run, "--ngram-k", ("0", "-1")),
        ("run", run, "--kv-capacity-tokens", ("0", "3")),
        ("run", run, "--max-num-batched-tokens", ("0",)),
        ("run", run, "--max-model-len", ("0", "5")),
        ("run", run, "--workers", ("0",)),
        ("run", run, "--progress-every", ("-1", "0")),
        ("sweep", sweep, "--batch-size", ("0", "1e30")),
        ("sweep", sweep, "--seed", ("-1",)),
        ("sweep", sweep, "--rate", ("0", "1e-308")),
        ("sweep", sweep, "--ngram-k", ("0",)),
        ("sweep", sweep, "--workers", ("0",)),
        ("sweep", sweep, "--kv-capacity-tokens", ("3",)),
        ("sensitivity", sens, "--batch-size", ("0",)),
        ("sensitivity", sens, "--sample", ("0", "-1")),
        ("sensitivity", sens, "--workers", ("0",)),
        ("calibrate", calib, "--n-min", ("0", "-1", "9")),
        ("calibrate", calib, "--n-max", ("0",)),
        ("calibrate", calib, "--k", ("0", "-1")),
        ("cost", cost, "--context", ("-1", "-1000000", "1e30")),
        ("bench", bench, "--repeat", ("0", "-1")),
        ("cache", lambda tmp: ["sim.api.cache"], "--older-than", ("-1",)),  # without --prune: never the real cache
        ("bench", bench, "--scale", ("0", "-1")),
        ("bench", bench, "--batch-size", ("0",)),
        ("validate", val, "--batch-size", ("0",)),
        ("validate", val, "--limit", ("0",)),
        ("validate", val, "--max-tokens", ("0",)),
        ("validate", val, "--max-prompt", ("0",)),
        ("validate", val, "--max-error", ("-1",)),
        ("profile", prof, "--batch-size", ("0",)),
        ("train_drafter", train, "--threads", ("0", "-1")),
        ("train_drafter", train, "--num-prompts", ("0",)),
        ("train_drafter", train, "--max-tokens", ("0",)),
        ("train_drafter", train, "--epochs", ("0", "-1")),
        ("train_drafter", train, "--lr", ("0", "-1")),
        ("train_drafter", train, "--block", ("0",)),
        ("train_drafter", train, "--vocab", ("0",)),
        ("train_drafter", train, "--rank", ("0",)),
        ("train_drafter", train, "--subset", ("0", "1.5")),
        ("eval_drafter", ev, "--limit", ("0",)),
        ("eval_drafter", ev, "--max-tokens", ("-1",)),
        ("drafter_report", rep, "--limit", ("0",)),
        ("gpu_check", gpu, "--time-budget-s", ("0", "-1")),
        ("gpu_check", gpu, "--limit", ("0",)),
        ("gpu_check", gpu, "--requests-per-slot", ("-1",)),  # 0 is valid: --limit at every batch size
        ("gpu_check", gpu, "--batch-size", ("0",)),
        ("machine_noise", noise, "--minutes", ("0", "-1")),
        ("machine_noise", noise, "--repeats", ("0", "1")),
        ("machine_noise", noise, "--margin", ("0", "-3")),
        ("machine_noise", noise, "--cell-seconds", ("0", "-1")),
    ]


FLOAT_FLAGS = {"--rate", "--temperature", "--progress-every", "--scale", "--max-error", "--epochs", "--lr", "--older-than",
               "--subset", "--time-budget-s", "--minutes", "--margin", "--cell-seconds"}


def _cases_numbers() -> list[Case]:
    out = []
    for name, base, flag_, own in _num_slots():
        vals = dict((v, "args") for v in own)
        generic = ("nan", "inf", "huge_digits", "word") if flag_ in FLOAT_FLAGS else ("huge_digits", "word", "empty", "hex")
        for g in generic:
            if flag_ == "--rate" and g == "inf":  # --rate inf is vLLM's "all at time 0": valid
                continue
            vals[NUM_KINDS[g]] = "parser" if g == "huge_digits" else "args"
        for v, klass in vals.items():
            if v in ("1e30", "1e-308"):
                klass = "size"
            label = {HUGE_DIGITS: "9x5000", "": "empty"}.get(v, v)
            module = base(Path("/x"))[0]
            def build(tmp, base=base, flag_=flag_, v=v):
                argv = base(tmp)
                if flag_ == "--sample" and "--limit" in argv:  # --limit and --sample exclude each other
                    i = argv.index("--limit")
                    argv = argv[:i] + argv[i + 2:]
                return argv + [flag_, v], []
            out.append(Case(f"{name}-{flag_[2:]}-{label}", klass, module, build))
    return out


# ---- data files of other kinds: calibrator, drafter profile, cost table, drafts sidecar, grid, results
def _cases_data_files() -> list[Case]:
    out = []
    for kind, (klass, data) in JSON_KINDS.items():
        for slot, argv in (
                ("calibrator", lambda tmp, p: run_base(tmp) + ["--policy", "hybrid", "--calibrator", str(p)]),
                ("drafter", lambda tmp, p: run_base(tmp) + ["--policy", "model-fixed:7", "--drafter", str(p)]),
                ("cost_table", lambda tmp, p: run_base(tmp) + ["--cost", "profiled", "--gpu", str(p)]),
                ("validate_cost_table", lambda tmp, p: validate_base(tmp) + ["--cost-table", str(p)])):
            def build(tmp, data=data, argv=argv, kind=kind):
                p = _write(tmp / "in" / f"{kind}.json", data)
                return argv(tmp, p), [p]
            out.append(Case(f"{slot}-{kind}", klass, argv(Path("/x"), "p")[0], build))
    # drafts sidecar
    for kind in ("empty", "binary", "bad_utf8", "deep_list", "huge_int_len", "not_object", "cut_mid_line", "nul_bytes"):
        klass, data = TRACE_KINDS[kind]

        def build(tmp, data=data, kind=kind):
            p = _write(tmp / "in" / f"drafts_{kind}.jsonl", data)
            return run_base(tmp) + ["--policy", "model-fixed:7", "--drafts", str(p)], [p]
        out.append(Case(f"run-drafts-{kind}", klass, "sim.api.run", build))
    # sweep grid TOML
    for kind, (klass, data) in TOML_KINDS.items():
        def build(tmp, data=data, kind=kind):
            # a valid small grid around the hostile part (the command line would override the file's keys)
            base = {"trace": f'["{TINY}"]', "limit": "4", "policy": '["adaptive"]', "batch_size": "[2]"}
            text = data.decode("utf-8", "replace")
            head = "".join(f"{k} = {v}\n" for k, v in base.items() if k not in text)
            g = _write(tmp / "in" / f"{kind}.toml", head.encode() + data)
            return ["sim.api.sweep", "--grid", str(g), "--workers", "1", "--no-progress", "--out", str(tmp / "sw")], [g]
        out.append(Case(f"sweep-grid-{kind}", klass, "sim.api.sweep", build))
    out.append(Case("sweep-grid-missing", "os", "sim.api.sweep", lambda tmp: (
        ["sim.api.sweep", "--grid", str(tmp / "none.toml"), "--out", str(tmp / "sw")], [])))
    out.append(Case("sweep-grid-dir", "os", "sim.api.sweep", lambda tmp: (
        ["sim.api.sweep", "--grid", str(tmp), "--out", str(tmp / "sw")], [])))
    # report inputs
    good = _fake_results()
    lines = good.split("\n")
    reports = {
        "empty": ("parser", b""), "binary": ("parser", bytes(range(256)) * 4),
        "header_only": ("loss", (lines[0] + "\n").encode()),
        "cut_mid_row": ("loss", (good.rstrip("\n")[:-9]).encode()),
        "cut_mid_row_nl": ("loss", (good.rstrip("\n")[:-9] + "\n").encode()),
        "extra_field": ("loss", (good + "x,y,z,1,2,3,4,5,6,7,8\n").encode()),
        "bad_utf8": ("parser", good.encode() + b"\xff\xfe\n"),
        "wrong_columns": ("type", b"a,b\n1,2\n"),
        "text_throughput": ("type", good.replace("100.0", "fast").encode()),
        "field_200k": ("parser", good.replace("qwen3-8b", "q" * (200 * 1024), 1).encode()),
        "nul": ("parser", good.replace(",ok,", ",o\x00k,", 1).encode()),
        "trace_not_results": ("type", TINY.read_bytes()),
    }
    for kind, (klass, data) in reports.items():
        def build(tmp, data=data, kind=kind):
            d = tmp / "sw"
            f = _write(d / "results.csv", data)
            return ["sim.api.report", str(d), "-o", str(tmp / "rep")], [f]
        out.append(Case(f"report-csv-{kind}", klass, "sim.api.report", build))
    for kind, data in (("empty", b""), ("binary", bytes(range(256)) * 4), ("csv_named_parquet", good.encode()),
                       ("truncated_magic", b"PAR1\x00\x00\x00PAR1")):
        def build(tmp, data=data):
            d = tmp / "sw"
            f = _write(d / "results.parquet", data)
            c = _write(d / "results.csv", good.encode())
            return ["sim.api.report", str(d), "-o", str(tmp / "rep")], [f, c]
        out.append(Case(f"report-parquet-{kind}", "parser", "sim.api.report", build))
    for kind, data in (("binary", bytes(range(256)) * 4), ("cut_mid_row", b"cell_id,prompt_len,output_len,decode_s\na,1,2,0.5\nb,1")):
        def build(tmp, data=data):
            d = tmp / "sw"
            c = _write(d / "results.csv", good.encode())
            f = _write(d / "requests.csv", data)
            return ["sim.api.report", str(d), "-o", str(tmp / "rep")], [f, c]
        out.append(Case(f"report-requests-{kind}", "loss", "sim.api.report", build))
    out.append(Case("report-missing", "os", "sim.api.report", lambda tmp: (["sim.api.report", str(tmp / "nope")], [])))
    out.append(Case("report-empty-dir", "os", "sim.api.report", lambda tmp: (
        ["sim.api.report", str(tmp), "-o", str(tmp / "rep")], [])))
    out.append(Case("report-dev-zero", "size", "sim.api.report", lambda tmp: (
        ["sim.api.report", "/dev/zero", "-o", str(tmp / "rep")], [])))
    return out


def _fake_results() -> str:
    head = "trace,policy,batch_size,model,gpu,status,error,cell_id,output_throughput_tok_s," + _REPORT_NUMBERS + "\n"
    return (head + "traces/codeedit.jsonl,adaptive,4,qwen3-8b,h100-sxm,ok,,a,100.0," + _REPORT_ROW + "\n"
            + "traces/codeedit.jsonl,hybrid,4,qwen3-8b,h100-sxm,ok,,b,120.0," + _REPORT_ROW + "\n")


def _cases_type_confusion() -> list[Case]:
    out = []

    def mutant(src: Path, flag: str, policy: str, mut):
        """A case builder: sim.api.run with `flag` pointing at a copy of the JSON file `src` changed by `mut`."""
        def build(tmp):
            d = json.loads(src.read_text())
            mut(d)
            p = _write(tmp / src.name, json.dumps(d).encode())
            return run_base(tmp) + ["--policy", policy, flag, str(p)], [p]
        return build

    muts = {
        "n_min_float": lambda c: c["ngram"].__setitem__("n_min", 2.0),
        "n_max_bool": lambda c: c["ngram"].__setitem__("n_max", True),
        "n_min_gt_n_max": lambda c: c["ngram"].update(n_min=6, n_max=3),
        "n_min_huge": lambda c: c["ngram"].__setitem__("n_min", 10**30),
        "ngram_list": lambda c: c.__setitem__("ngram", [1, 2]),
        "weights_string": lambda c: c.__setitem__("weights", "w"),
        "weights_nan": lambda c: c.__setitem__("weights", [float("nan")] * len(c["weights"]) if isinstance(c.get("weights"), list) else "nan"),
        "weights_short": lambda c: c.__setitem__("weights", [0.0]),
        "missing_ngram": lambda c: c.pop("ngram", None),
    }
    for k, m in muts.items():
        out.append(Case(f"calibrator-{k}", "type", "sim.api.run", mutant(CALIBRATOR, "--calibrator", "hybrid", m)))

    dmuts = {"block_float": lambda d: d.__setitem__("block", 7.0), "block_bool": lambda d: d.__setitem__("block", True),
             "block_zero": lambda d: d.__setitem__("block", 0), "block_huge": lambda d: d.__setitem__("block", 10**12),
             "empty_object": lambda d: d.clear()}
    for k, m in dmuts.items():
        out.append(Case(f"drafter-{k}", "type", "sim.api.run", mutant(DRAFTER_JSON, "--drafter", "model-fixed:7", m)))
    out += [
        Case("drafter-is-llm-profile", "type", "sim.api.run", lambda tmp: (
            run_base(tmp) + ["--policy", "model-fixed:7", "--drafter", str(LLM_JSON)], [LLM_JSON])),
        Case("drafter-relative-llm", "type", "sim.api.run", lambda tmp: (
            run_base(tmp) + ["--policy", "model-fixed:7", "--drafter", "../llms/qwen3-8b"], [])),
        Case("calibrator-is-llm-profile", "type", "sim.api.run", lambda tmp: (
            run_base(tmp) + ["--policy", "hybrid", "--calibrator", str(LLM_JSON)], [LLM_JSON])),
        Case("calibrator-is-trace", "type", "sim.api.run", lambda tmp: (
            run_base(tmp) + ["--policy", "hybrid", "--calibrator", str(TINY)], [])),
        Case("gpu-is-llm-profile", "type", "sim.api.run", lambda tmp: (
            run_base(tmp) + ["--cost", "profiled", "--gpu", str(LLM_JSON)], [LLM_JSON])),
        Case("drafts-is-trace", "type", "sim.api.run", lambda tmp: (
            run_base(tmp) + ["--policy", "model-fixed:7", "--drafts", str(FIX / "lengths.jsonl")], [])),
        Case("trace-is-calibrator", "type", "sim.api.run", lambda tmp: (run_base(tmp, CALIBRATOR), [CALIBRATOR])),
        Case("trace-is-csv", "type", "sim.api.run", lambda tmp: (run_base(tmp, FIX / "azure.csv"), [])),
        Case("model-unknown", "type", "sim.api.run", lambda tmp: (run_base(tmp) + ["--model", "gpt-17"], [])),
        Case("model-path-escape", "type", "sim.api.run", lambda tmp: (run_base(tmp) + ["--model", "../gpus/h100-sxm"], [])),
        Case("gpu-path-escape", "type", "sim.api.run", lambda tmp: (run_base(tmp) + ["--gpu", "../llms/qwen3-8b"], [])),
        Case("policy-unknown", "type", "sim.api.run", lambda tmp: (run_base(tmp) + ["--policy", "warp-drive"], [])),
        Case("policy-bad-param", "type", "sim.api.run", lambda tmp: (run_base(tmp) + ["--policy", "hybrid:margin=nan"], [])),
        Case("policy-bad-k", "type", "sim.api.run", lambda tmp: (run_base(tmp) + ["--policy", "ngram-fixed:1e30"], [])),
        Case("policy-huge-k", "size", "sim.api.run", lambda tmp: (run_base(tmp) + ["--policy", "ngram-fixed:" + HUGE_DIGITS], [])),
        Case("spec-config-deep", "parser", "sim.api.run", lambda tmp: (
            run_base(tmp) + ["--speculative-config", "[" * DEEP + "]" * DEEP], [])),
        Case("spec-config-not-json", "type", "sim.api.run", lambda tmp: (
            run_base(tmp) + ["--speculative-config", "{method: ngram"], [])),
        Case("spec-config-huge-k", "parser", "sim.api.run", lambda tmp: (
            run_base(tmp) + ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": ' + HUGE_DIGITS + "}"], [])),
        Case("limit-and-sample", "args", "sim.api.run", lambda tmp: (run_base(tmp) + ["--sample", "2"], [])),
        Case("cost-llm-unknown", "type", "sim.core.cost", lambda tmp: (["sim.core.cost", "--llm", "gpt-17"], [])),
        Case("cost-llm-path", "type", "sim.core.cost", lambda tmp: (["sim.core.cost", "--llm", str(CALIBRATOR)], [])),
        Case("build-unknown", "args", "sim.core.trace", lambda tmp: (
            ["sim.core.trace", "build", "everything", "--out-dir", str(tmp / "b")], [])),
        Case("build-limit-zero", "args", "sim.core.trace", lambda tmp: (
            ["sim.core.trace", "build", "chat", "--out-dir", str(tmp / "b"), "--limit", "0"], [])),
        Case("build-into-bundled", "loss", "sim.core.trace", lambda tmp: (
            ["sim.core.trace", "build", "codeedit", "--out-dir", str(ROOT / "traces"), "--limit", "1", "--no-progress"],
            [ROOT / "traces" / "codeedit.jsonl"])),
        Case("stats-one-bad-of-two", "os", "sim.core.trace", lambda tmp: (
            ["sim.core.trace", "stats", str(TINY), str(tmp / "none.jsonl")], [])),
        Case("calibrate-length-only", "type", "sim.api.calibrate", lambda tmp: (
            calib_base(tmp, FIX / "lengths.jsonl"), [])),
        Case("calibrate-eval-missing", "os", "sim.api.calibrate", lambda tmp: (
            calib_base(tmp)[:-3] + ["--eval", str(tmp / "none.jsonl"), "--out", str(tmp / "c.json")], [])),
        Case("sensitivity-one-request", "size", "sim.api.sensitivity", lambda tmp: (
            ["sim.api.sensitivity", "--trace", str(_write(tmp / "one.jsonl", _jsonl_line(id="a", prompt_ids=[1, 2],
                                                                                    output_ids=[3]).encode())),
             "--batch-size", "2", "--workers", "1", "--out", str(tmp / "sens")], [])),
        Case("bench-trace-missing", "os", "sim.api.bench", lambda tmp: (
            ["sim.api.bench", "--against", "none", "--trace", str(tmp / "none.jsonl")], [])),
        Case("bench-against-unknown", "args", "sim.api.bench", lambda tmp: (
            ["sim.api.bench", "--against", "no-such-commit-xyz", "--trace", str(TINY), "--repeat", "1"], [])),
        Case("bench-instr-trace-missing", "os", "sim.api.bench_instr", lambda tmp: (
            ["sim.api.bench_instr", "--trace", str(tmp / "none.jsonl")], [])),
        Case("bench-instr-policy-unknown", "args", "sim.api.bench_instr", lambda tmp: (
            ["sim.api.bench_instr", "--trace", str(TINY), "--policy", "no-such-policy"], [])),
        Case("bench-instr-tree-not-a-tree", "args", "sim.api.bench_instr", lambda tmp: (
            ["sim.api.bench_instr", "--trace", str(TINY), "--tree", str(tmp)], [])),
        Case("validate-engine-unknown", "args", "real.validation.validate", lambda tmp: (validate_base(tmp) + ["--engine", "tpu"], [])),
        Case("validate-trace-missing", "os", "real.validation.validate", lambda tmp: (validate_base(tmp, tmp / "none.jsonl"), [])),
        Case("validate-cost-table-missing", "os", "real.validation.validate", lambda tmp: (
            validate_base(tmp) + ["--cost-table", str(tmp / "none.json")], [])),
        Case("profile-engine-unknown", "args", "real.validation.profile", lambda tmp: (
            ["real.validation.profile", "--engine", "tpu", "--out", str(tmp / "p.json")], [])),
        Case("profile-model-unknown", "type", "real.validation.profile", lambda tmp: (
            ["real.validation.profile", "--model", "gpt-17", "--quick", "--out", str(tmp / "p.json")], [])),
        Case("gpu-check-device-bogus", "args", "real.validation.gpu_check", lambda tmp: (
            ["real.validation.gpu_check", "--device", "tpu:9", "--quick", "--out", str(tmp / "g")], [])),
        Case("gpu-check-trace-missing", "os", "real.validation.gpu_check", lambda tmp: (
            ["real.validation.gpu_check", "--device", "cpu", "--model", "qwen3-tiny", "--quick", "--trace", str(tmp / "none.jsonl"), "--out", str(tmp / "g")], [])),
        Case("eval-drafter-weights-missing", "os", "real.validation.eval_drafter", lambda tmp: (
            eval_drafter_base(tmp) + ["--drafter", str(tmp / "none.pt")], [])),
        Case("eval-drafter-weights-garbage", "type", "real.validation.eval_drafter", lambda tmp: (
            eval_drafter_base(tmp) + ["--drafter", str(_write(tmp / "w.pt", b"not a torch file"))], [tmp / "w.pt"])),
        Case("eval-drafter-weights-is-llm", "type", "real.validation.eval_drafter", lambda tmp: (
            eval_drafter_base(tmp) + ["--drafter", str(LLM_JSON)], [LLM_JSON])),
        Case("eval-drafter-length-only", "type", "real.validation.eval_drafter", lambda tmp: (
            eval_drafter_base(tmp, FIX / "lengths.jsonl"), [])),
        Case("drafter-report-compare-missing", "os", "real.validation.drafter_report", lambda tmp: (
            ["real.validation.drafter_report", "-o", str(tmp / "r.md"), "--compare", str(tmp / "none.pt")], [])),
        Case("train-drafter-out-is-shipped", "loss", "real.train_drafter", lambda tmp: (
            ["real.train_drafter", "--no-progress", "--out", str(ROOT / "models" / "drafters" / "dspark-smollm2-135m-b7.pt")],
            [ROOT / "models" / "drafters" / "dspark-smollm2-135m-b7.pt"])),
    ]
    return out



# ---- the input layer (issue 46): recorded runs, anchors, checkpoint configs, command-line JSON, seeds, memory
def fidelity_doc() -> dict:
    """A small torch-engine fidelity.json that the reports accept (its aggregate from real/validation/fidelity.py)."""
    from real.validation.fidelity import aggregate

    def cell(policy: str, tps: float) -> dict:
        return {"trace": "traces/codeedit.jsonl", "policy": policy, "batch_size": 1, "requests": 2, "output_tokens": 32,
                "real": {"tok_per_s": tps, "steps": 32, "mean_latency_s": 1.5, "lossless": True,
                         "outputs_equal_reference": True, "tokens_per_engine_step": 1.0},
                "predicted": {"tok_per_s": tps * 1.02, "steps": 32, "mean_latency_s": 1.4},
                "synthetic": {"tok_per_s": tps * 1.01}, "predicted_error": 0.02, "synthetic_error": 0.01,
                "step_error_median": 0.03, "repeats": [{"tok_per_s": tps}, {"tok_per_s": tps * 1.01}],
                "verdict": {"repeats": 2, "real": tps, "real_min": tps, "real_max": tps * 1.01, "spread": 0.01,
                            "band": 0.05, "predicted": tps * 1.02, "error": 0.02, "margin": 0.03, "loaded": False,
                            "verdict": "inconclusive", "reason": "noise band wider than margin"}}

    cells = [cell("none", 10.0), cell("hybrid", 14.0)]
    meta = {"command": "python real/validate.py --quick", "machine": {"cpu": "test", "device": "cpu", "threads": 2},
            "model": "smollm2-135m", "mode": "real weights", "max_tokens": 16, "max_prompt": 512, "repeats": 2,
            "margin": 0.03, "wall_minutes": 1.0}
    return {"meta": meta, "aggregate": aggregate(cells), "cells": cells}


FIDELITY_KINDS: dict[str, tuple[str, Callable[[str], str]]] = {  # the text of a good fidelity.json -> a bad one
    "truncated": ("loss", lambda t: t[: len(t) // 2]),
    "a_list": ("type", lambda t: "[1, 2]"),
    "no_cells": ("type", lambda t: t[: t.index('"cells"')] + '"cells": []}'),
    "batch_1e400": ("size", lambda t: t.replace('"batch_size": 1,', '"batch_size": 1e400,', 1)),
    "throughput_nan": ("type", lambda t: t.replace('"tok_per_s": 10.0', '"tok_per_s": NaN', 1)),
    "throughput_word": ("type", lambda t: t.replace('"tok_per_s": 10.0', '"tok_per_s": "fast"', 1)),
    "verdict_word": ("type", lambda t: t.replace('"verdict": {', '"verdict": "agrees", "x": {', 1)),
}


def _run_dir(tmp: Path, kind: str) -> Path:
    d = tmp / "in" / "run"
    d.mkdir(parents=True, exist_ok=True)
    f = d / "fidelity.json"
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "dev_zero":
        f.symlink_to("/dev/zero")
    else:
        f.write_text(FIDELITY_KINDS[kind][1](json.dumps(fidelity_doc())))
    return d


def _checkpoint_dir(tmp: Path, config: str, side: str | None = None) -> Path:
    d = tmp / "in" / "ckpt"
    _write(d / "config.json", config.encode())
    if side is not None:
        _write(d / "hybridspec.json", side.encode())
    return d


def _long_trace(tmp: Path, n: int) -> Path:
    import random

    rng = random.Random(0)
    return _write(tmp / "in" / "long.jsonl", (json.dumps({"id": "long", "prompt_ids": [rng.randrange(50_000) for _ in
                                                                                         range(n)],
                                                         "output_ids": [1, 2, 3, 4]}) + "\n").encode())


def _big_checkpoint(tmp: Path) -> Path:
    """A drafter file whose config asks for ~50 GB of weights beside an empty state."""
    import hashlib
    import io
    from dataclasses import asdict

    import torch

    from real.drafter.qwen3_dspark import DSparkV, DSparkVConfig

    buf = io.BytesIO()
    cfg = asdict(DSparkVConfig(hidden=24576, intermediate=65536, heads=48, kv_heads=8, head_dim=128))
    torch.save({"format": DSparkV.FORMAT, "config": cfg, "meta": {}, "state": {}}, buf)
    p = _write(tmp / "in" / "big.pt", buf.getvalue())
    _write(tmp / "in" / "big.pt.sha256", f"{hashlib.sha256(buf.getvalue()).hexdigest()}  big.pt\n".encode())
    return p


def _cases_input_layer() -> list[Case]:
    out = []
    for module, extra in (("real.validation.report", lambda tmp: ["--out", str(tmp / "r.md")]),
                          ("real.validation.reprice", lambda tmp: [])):
        name = module.rsplit(".", 1)[1]
        kinds = {k: v[0] for k, v in FIDELITY_KINDS.items()} | {"fifo": "os", "dev_zero": "size"}
        for kind, klass in kinds.items():
            out.append(Case(f"fidelity-{name}-{kind}", klass, module, lambda tmp, module=module, extra=extra, kind=kind: (
                [module, str(_run_dir(tmp, kind)), *extra(tmp)],
                [] if kind in ("fifo", "dev_zero") else [tmp / "in" / "run" / "fidelity.json"])))
    anchors = {"ints": ("type", "[1, 2]"), "object": ("type", '{"x": 1}'), "nan": ("type", '[{"simulated": NaN}]'),
               "missing": ("type", '[{"anchor": "pr32374:x"}]'), "truncated": ("loss", '[{"anchor": "pr3')}
    for kind, (klass, data) in anchors.items():
        def build(tmp, data=data):
            a = _write(tmp / "rep" / "anchors.json", data.encode())
            return ["sim.api.report", str(_fake_sweep(tmp)), "-o", str(tmp / "rep")], [a]
        out.append(Case(f"report-anchors-{kind}", klass, "sim.api.report", build))
    slots = ["real.validation.vllm_slots", "--vllm-device", "cpu", "--cached-only"]
    ckpts = {"config_list": ("type", "[1]", None), "block_word": ("type", '{"architectures": ["Qwen3DSparkModel"], '
                                                                   '"block_size": "7"}', None),
             "block_huge": ("size", '{"architectures": ["Qwen3DSparkModel"], "block_size": 1000000000000}', None),
             "side_list": ("type", '{"architectures": ["Qwen3DSparkModel"], "block_size": 7}', "[1]")}
    for kind, (klass, cfg, side) in ckpts.items():
        out.append(Case(f"slots-drafter-{kind}", klass, "real.validation.vllm_slots",
                        lambda tmp, cfg=cfg, side=side: (slots + ["--drafter", str(_checkpoint_dir(tmp, cfg, side)),
                                                                   "--out", str(tmp / "s")], [])))
    for flag, v in (("--slots", "0"), ("--slots", "65"), ("--batch-size", "0"), ("--max-tokens", "-1")):
        out.append(Case(f"slots-{flag[2:]}-{v}", "args", "real.validation.vllm_slots",
                        lambda tmp, flag=flag, v=v: (slots + ["--out", str(tmp / "s"), flag, v], [])))
    for kind, text in (("list", '{"method": ["ngram"]}'), ("object", '{"method": {"a": 1}}'), ("empty", "{}"),
                       ("nan", '{"method": "ngram", "num_speculative_tokens": NaN}')):
        out.append(Case(f"run-spec-config-{kind}", "type", "sim.api.run",
                        lambda tmp, text=text: (run_base(tmp) + ["--speculative-config", text], [])))
        out.append(Case(f"sweep-spec-config-{kind}", "type", "sim.api.sweep",
                        lambda tmp, text=text: (sweep_base(tmp) + ["--speculative-config", text], [])))
    out.append(Case("policy-option-twice", "type", "sim.api.run", lambda tmp: (
        run_base(tmp) + ["--policy", "hybrid:table=step:table=startup"], [])))
    for module, base in (("sim.api.suffix_report", ["--trace", str(TINY)]),
                         ("sim.api.drafter_axis", ["--trace", str(TINY), "--batch-size", "1"])):
        for v in ("-1", str(2**64)):
            out.append(Case(f"{module.rsplit('.', 1)[1]}-seed-{v[:3]}", "args", module,
                            lambda tmp, module=module, base=base, v=v: ([module, *base, "--seed", v], [])))
    out.append(Case("suffix-report-length-only", "type", "sim.api.suffix_report", lambda tmp: (
        ["sim.api.suffix_report", "--trace", str(FIX / "lengths.jsonl")], [])))
    out.append(Case("run-suffix-memory", "size", "sim.api.run", lambda tmp: (
        ["sim.api.run", "--trace", str(_long_trace(tmp, 40_000)), "--batch-size", "1", "--no-progress", "--workers", "1",
         "--drafters", "dspark,ngram,suffix", "--policy", "suffix", "--suffix-max-depth", "256"], [])))
    out.append(Case("run-suffix-settings-unused", "type", "sim.api.run", lambda tmp: (
        run_base(tmp) + ["--suffix-max-depth", "30"], [])))
    out.append(Case("export-config-50gb", "size", "real.drafter.export_vllm", lambda tmp: (
        ["real.drafter.export_vllm", "--drafter", str(_big_checkpoint(tmp)), "--out", str(tmp / "x")], [])))
    return out

# ---- issue 60: what the project owns (its cache folder, its output names), bounded numbers, capped reads
HF_BASE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000, "intermediate_size": 128}
_QMOE = {"num_experts": 4, "moe_intermediate_size": 32, "num_experts_per_tok": 2}
HF_KINDS: dict[str, tuple[str, dict]] = {  # a config.json's fields over HF_BASE (None: the field removed)
    "hidden_401_digits": ("size", {"hidden_size": int("9" * 401)}),
    "layers_1e300": ("size", {"num_hidden_layers": 10**300}),
    "mixtral_experts_1e400": ("size", {"num_local_experts": 10**400, "num_experts_per_tok": 2}),
    "vocab_1e20": ("size", {"vocab_size": 10**20}),
    "heads_2e9": ("size", {"num_attention_heads": 2 * 10**9, "head_dim": 16}),
    "head_dim_1e12": ("size", {"head_dim": 10**12}),
    "intermediate_2e40": ("size", {"intermediate_size": 2**40}),
    "qwen_moe_experts_1e30": ("size", {**_QMOE, "num_experts": 10**30}),
    "qwen_moe_width_1e30": ("size", {**_QMOE, "moe_intermediate_size": 10**30}),
    "qwen_moe_shared_1e30": ("size", {**_QMOE, "shared_expert_intermediate_size": 10**30}),
    "qwen_moe_shared_negative": ("type", {**_QMOE, "shared_expert_intermediate_size": -1}),
    "sparse_step_1e30": ("size", {**_QMOE, "decoder_sparse_step": 10**30}),
    "context_1e30": ("size", {"max_position_embeddings": 10**30}),
    "mtp_1e9": ("size", {"num_nextn_predict_layers": 10**9}),
    "quant_string": ("type", {"quantization_config": "fp8"}),
    "quant_list": ("type", {"quantization_config": [{"quant_method": "fp8"}]}),
    "quant_number": ("type", {"quantization_config": 8}),
    "quant_true": ("type", {"quantization_config": True}),
    "mlp_only_bools": ("type", {**_QMOE, "mlp_only_layers": [True]}),
}
ENCODED_KINDS: dict[str, tuple[str, Callable[[str], bytes]]] = {  # the same JSON text, bytes of another kind
    "utf16_bom": ("parser", lambda t: t.encode("utf-16")),
    "utf16_le": ("parser", lambda t: t.encode("utf-16-le")),
    "utf32": ("parser", lambda t: t.encode("utf-32")),
    "dup_key": ("type", lambda t: t[:-1].encode() + b', "hidden_size": 4096}'),
    "dup_key_nested": ("type", lambda t: t[:-1].encode() + b', "quantization_config": {"quant_method": "fp8", '
                                                           b'"quant_method": "awq"}}'),
    "dup_key_same_value": ("type", lambda t: t[:-1].encode() + b', "vocab_size": 1000}'),
}


def _hf_dir(tmp: Path, fields: dict | None = None, data: bytes | None = None) -> Path:
    d = tmp / "in" / "model"
    cfg = {k: v for k, v in {**HF_BASE, **(fields or {})}.items() if v is not None}
    _write(d / "config.json", data if data is not None else json.dumps(cfg).encode())
    return d


def _sparse(p: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk (a hole): what a 2 GiB input costs to plant."""
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "wb") as f:
        f.truncate(size)
    return p


def _cache_env(root: Path) -> dict:
    return {"HYBRIDSPEC_CACHE_DIR": str(root)}


def _root_with(tmp: Path, files: dict[str, bytes], mark: bool = False) -> Path:
    """A folder HYBRIDSPEC_CACHE_DIR names, holding `files` (relative path -> bytes), with the project's mark or not."""
    root = tmp / "root"
    root.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        _write(root / rel, data)
    if mark:
        from sim.infra.fsio import CACHE_MARK, CACHE_MARK_TEXT

        (root / CACHE_MARK).write_text(CACHE_MARK_TEXT)
    return root


# a cache folder --prune must refuse (files that must survive; whether the folder carries the mark)
PRUNE_KINDS: dict[str, tuple[dict[str, bytes], bool]] = {
    "home_cache_pip": ({"pip/http/v2/a": b"wheel", "huggingface/hub/x": b"model"}, False),
    "documents": ({"thesis.tex": b"mine", "notes/today.md": b"mine"}, False),
    "models_copy": ({"llms/qwen3-8b.json": LLM_JSON.read_bytes(), "README.md": b"mine"}, False),
    "one_known_kind_and_a_file": ({"tokens/a.npz": b"x", "budget.xlsx": b"mine"}, False),
    "marked_but_mixed": ({"tokens/a.npz": b"x", "budget.xlsx": b"mine"}, True),
    "marked_with_foreign_folder": ({"draft-tables/a.npz": b"x", "photos/cat.jpg": b"mine"}, True),
    "dotfile_only": ({".bashrc": b"mine"}, False),
    "kind_named_file": ({"tokens": b"a file, not a kind folder"}, True),
    "loose_file_at_top": ({"weights.pt": b"mine"}, True),
    "fake_mark_folder": ({".hybridspec-cache/x": b"mine", "tokens/a": b"x"}, False),
}


def _cases_issue60() -> list[Case]:
    out = []
    for kind, (files, mark) in PRUNE_KINDS.items():
        for extra in ([], ["--kind", "tokens"], ["--older-than", "0"]):
            def build(tmp, files=files, mark=mark, extra=extra):
                root = _root_with(tmp, files, mark)
                return ["sim.api.cache", "--prune", *extra], [root / f for f in files], _cache_env(root)
            out.append(Case(f"prune-{kind}{'-' + extra[0][2:] if extra else ''}", "loss", "sim.api.cache", build))

    def linked(tmp, marked: bool = True, kind_link: bool = False):
        target = _root_with(tmp, {"tokens/a.npz": b"x"} if not kind_link else {}, marked)
        precious = _write(tmp / "docs" / "keep.txt", b"mine")
        if kind_link:
            (target / "tokens").symlink_to(precious.parent)  # a kind that is a link: not the project's folder
            return ["sim.api.cache", "--prune"], [precious, target], _cache_env(target)
        link = tmp / "cache-link"
        link.symlink_to(target)
        return ["sim.api.cache", "--prune"], [target / "tokens" / "a.npz"], _cache_env(link)
    out.append(Case("prune-linked-root", "loss", "sim.api.cache", linked))
    out.append(Case("prune-linked-unmarked-root", "loss", "sim.api.cache", lambda tmp: linked(tmp, False)))
    out.append(Case("prune-kind-is-a-link", "loss", "sim.api.cache", lambda tmp: linked(tmp, True, True)))
    out.append(Case("prune-root-is-a-file", "os", "sim.api.cache", lambda tmp: (
        ["sim.api.cache", "--prune"], [_write(tmp / "f", b"mine")], _cache_env(tmp / "f"))))

    # --force never replaces a user's folder at a name the command writes a file to
    def folder_at(tmp, name: str, argv_of):
        d = tmp / "o"
        keep = _write(d / name / "mine.txt", b"mine")
        return argv_of(tmp, d) + ["--force"], [keep]
    writers = {"run": ("sim.api.run", lambda tmp, d: run_base(tmp) + ["--out", str(d)],
                       ("summary.json", "requests.csv", "report.html")),
               "sweep": ("sim.api.sweep", lambda tmp, d: sweep_base(tmp)[:-2] + ["--out", str(d)],
                         ("results.csv", "results.parquet", "requests.csv", "grid.json")),
               "report": ("sim.api.report", lambda tmp, d: ["sim.api.report", str(_fake_sweep(tmp)), "-o", str(d)],
                          ("index.html", "tables.md", "paper.md")),
               "sensitivity": ("sim.api.sensitivity", lambda tmp, d: sens_base(tmp)[:-2] + ["--out", str(d)],
                               ("sensitivity.md", "sensitivity.html", "sensitivity.csv")),
               "gpu_check": ("real.validation.gpu_check", lambda tmp, d: [
                   "real.validation.gpu_check", "--device", "cpu", "--model", "qwen3-tiny", "--quick", "--out", str(d)],
                   ("grid.csv", "cost_table.json", "errors.log"))}
    for w, (module, argv_of, names) in writers.items():
        for name in names:
            out.append(Case(f"force-{w}-user-folder-{name}", "loss", module,
                            lambda tmp, name=name, argv_of=argv_of: folder_at(tmp, name, argv_of)))
    def steps_folder(tmp):
        from sim.api.run import steps_file

        return folder_at(tmp, steps_file(), lambda tmp, d: run_base(tmp) + ["--out", str(d), "--steps"])
    out.append(Case("force-run-user-folder-steps", "loss", "sim.api.run", steps_folder))
    out.append(Case("force-sweep-user-file-at-cells", "loss", "sim.api.sweep", lambda tmp: (
        sweep_base(tmp)[:-2] + ["--out", str(tmp / "o"), "--force"], [_write(tmp / "o" / "cells", b"mine")])))

    # a Hugging Face config.json: absurd integers, wrong types, bytes of another encoding, duplicate keys, a pipe
    for kind, (klass, fields) in HF_KINDS.items():
        out.append(Case(f"run-hf-{kind}", klass, "sim.api.run", lambda tmp, fields=fields: (
            run_base(tmp) + ["--model", str(_hf_dir(tmp, fields))], [])))
    for kind, (klass, fields) in list(HF_KINDS.items())[:4]:
        out.append(Case(f"cost-hf-{kind}", klass, "sim.core.cost", lambda tmp, fields=fields: (
            ["sim.core.cost", "--llm", str(_hf_dir(tmp, fields) / "config.json")], [])))
    for kind, (klass, enc) in ENCODED_KINDS.items():
        out.append(Case(f"run-hf-{kind}", klass, "sim.api.run", lambda tmp, enc=enc: (
            run_base(tmp) + ["--model", str(_hf_dir(tmp, data=enc(json.dumps(HF_BASE))))], [])))
    for kind, (klass, enc) in list(ENCODED_KINDS.items())[:4]:
        out.append(Case(f"report-anchors-{kind}", klass, "sim.api.report", lambda tmp, enc=enc: (
            ["sim.api.report", str(_fake_sweep(tmp)), "-o", str(tmp / "rep")],
            [_write(tmp / "rep" / "anchors.json", enc('[{"anchor": "pr1:x", "simulated": 1.0}]'))])))

    def fifo_config(tmp):
        d = tmp / "in" / "model"
        d.mkdir(parents=True)
        os.mkfifo(d / "config.json")
        return run_base(tmp) + ["--model", str(d)], []
    out.append(Case("run-hf-config-fifo", "os", "sim.api.run", fifo_config))
    out.append(Case("run-hf-config-dev-zero", "size", "sim.api.run", lambda tmp: (
        run_base(tmp) + ["--model", str(_link(tmp / "in" / "m" / "config.json", "/dev/zero").parent)], [])))

    # sizes from the environment: parsed strictly (nan, inf, negative, zero, words refused, never a guard off)
    suffix_run = lambda tmp: run_base(tmp) + ["--drafters", "dspark,ngram,suffix", "--policy", "suffix"]  # noqa: E731
    for v in ("nan", "-1", "inf", "-inf", "0", "lots", "1e400", "0x10"):
        out.append(Case(f"run-suffix-memory-env-{v}", "args", "sim.api.run", lambda tmp, v=v: (
            suffix_run(tmp), [], {"HYBRIDSPEC_SUFFIX_MEMORY_GB": v})))
    for v in ("nan", "-5", "inf"):
        out.append(Case(f"fidelity-report-max-input-env-{v}", "args", "real.validation.report", lambda tmp, v=v: (
            ["real.validation.report", str(_good_run_dir(tmp)), "--out", str(tmp / "r.md")], [],
            {"HYBRIDSPEC_MAX_INPUT_MB": v})))

    # reads capped per kind: a 2 GiB tokenizer, checksum sidecar and grid are refused before they are read
    big = 2**31 + 1
    out.append(Case("run-tokenizer-2gib", "size", "sim.api.run", lambda tmp: (
        run_base(tmp, FIX / "text.jsonl") + ["--tokenizer", str(_sparse(tmp / "in" / "tokenizer.json", big))], [])))
    out.append(Case("run-tokenizer-fifo", "os", "sim.api.run", lambda tmp: (
        run_base(tmp, FIX / "text.jsonl") + ["--tokenizer", str(_fifo(tmp / "in" / "tokenizer.json"))], [])))
    out.append(Case("eval-drafter-sidecar-2gib", "size", "real.validation.eval_drafter", lambda tmp: (
        eval_drafter_base(tmp) + ["--drafter", str(_write(tmp / "in" / "w.pt", b"weights"))],
        [tmp / "in" / "w.pt"] if _sparse(tmp / "in" / "w.pt.sha256", big) else [])))
    out.append(Case("sweep-grid-2gib", "size", "sim.api.sweep", lambda tmp: (
        sweep_base(tmp) + ["--grid", str(_sparse(tmp / "in" / "grid.toml", big))], [])))
    out.append(Case("sweep-grid-utf16", "parser", "sim.api.sweep", lambda tmp: (
        sweep_base(tmp) + ["--grid", str(_write(tmp / "in" / "grid.toml", "batch_size = [2]\n".encode("utf-16")))], [])))
    out.append(Case("run-steps-without-out", "args", "sim.api.run", lambda tmp: (run_base(tmp) + ["--steps"], [])))
    return out


def _good_run_dir(tmp: Path) -> Path:
    d = tmp / "in" / "run"
    _write(d / "fidelity.json", json.dumps(fidelity_doc()).encode())
    return d


def _link(p: Path, target: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.symlink_to(target)
    return p


def _fifo(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(p)
    return p


MODULES = ("sim.api.run", "sim.api.sweep", "sim.api.report", "sim.api.calibrate", "sim.api.cost_tables", "sim.api.traces",
           "sim.api.sensitivity", "sim.api.bench", "sim.api.cache", "real.validation.validate", "real.validation.profile", "real.train_drafter", "real.validation.eval_drafter",
           "real.validation.drafter_report", "real.validation.gpu_check", "real.validation.workload",
           "real.drafter.export_vllm", "real.validation.vllm_cpu.make_models")

MODULES += ("real.validation.report", "real.validation.reprice", "real.validation.vllm_slots", "sim.api.suffix_report",
            "sim.api.drafter_axis")  # the input layer's commands (issue 46)


def generate() -> list[Case]:
    cases = (_cases_trace_inputs() + _cases_trace_stats_limit() + _cases_convert() + _cases_outputs()
             + _cases_numbers() + _cases_data_files() + _cases_type_confusion() + _cases_input_layer()
             + _cases_issue60())
    ids = [c.id for c in cases]
    dup = {i for i in ids if ids.count(i) > 1}
    assert not dup, f"duplicate case ids: {sorted(dup)[:5]}"
    return cases


CASES = generate()
