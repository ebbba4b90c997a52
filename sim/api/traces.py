"""python -m sim.trace {convert,build,stats}: convert public trace formats, build the bundled traces, print stats.

  python -m sim.trace convert --from FORMAT IN -o OUT.jsonl [--force] [--skip-bad] [--workload W] [format options]
  python -m sim.trace build {codeedit,codeedit-model,chat,general,all} [--out-dir out/traces] [--limit N] [--force]
      (--out-dir traces --force: replace the bundled ones)
  python -m sim.trace stats FILE [FILE ...] [--skip-bad] [--limit N]

Every path is checked before any work (inputs readable regular files, outputs writable and not the input);
an existing output is replaced only with --force, and is written whole (a temporary sibling renamed into place).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from sim.infra.cli import ArgumentParser as _Parser, check_in_file, check_out_dir, check_out_file, int_at_least
from sim.infra.errors import ConfigError

BUILDS = ("codeedit", "codeedit-model", "chat", "general", "all")


def _parser() -> argparse.ArgumentParser:
    from sim.core.trace.convert import FORMATS

    ap = _Parser(prog="python -m sim.trace", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    c = sub.add_parser("convert", help="convert a public trace format to hybridspec JSONL")
    c.add_argument("--from", dest="fmt", required=True, metavar="FORMAT", help=f"one of: {', '.join(FORMATS)}")
    c.add_argument("input", metavar="IN")
    c.add_argument("-o", "--output", required=True, metavar="OUT")
    c.add_argument("--force", action="store_true", help="replace OUT if it exists")
    c.add_argument("--skip-bad", action="store_true", help="skip bad rows (and print how many) instead of failing")
    c.add_argument("--workload", default=None,
                   help="set this workload name on every request (azure: code or conv; default: from the file name)")
    g = c.add_argument_group("sharegpt (defaults: what vLLM's ShareGPT dataset builds)")
    g.add_argument("--turns", choices=("first", "all"), default="first",
                   help="first: one request per conversation, turn 0 -> turn 1, vLLM's length filter (vLLM); "
                        "all: one request per assistant turn, the earlier turns in the ChatML template as prompt")
    g.add_argument("--sharegpt-output-len", type=int_at_least(1), default=None,
                   help="--turns first: every output this many tokens (length-only), as vLLM's flag")
    g.add_argument("--no-length-filter", action="store_true",
                   help="--turns first: keep conversations outside vLLM's length filter")
    g = c.add_argument_group("vllm-custom (defaults: what vLLM's custom dataset builds)")
    g.add_argument("--custom-output-len", "--output-len", dest="output_len", type=int_at_least(-1), default=256,
                   help="every output length, overriding output_tokens (vLLM's default 256); -1: each line's "
                        "output_tokens (required then)")
    g.add_argument("--keep-output-tokens", action="store_true",
                   help="a line's output_tokens where given, --custom-output-len elsewhere (not vLLM's reading)")
    g.add_argument("--skip-chat-template", action="store_true",
                   help="keep prompts raw instead of wrapping them in the chat template (vLLM's flag)")
    g = c.add_argument_group("burstgpt")
    g.add_argument("--burstgpt-model", default=None, metavar="NAME",
                   help="keep the rows of this BurstGPT Model column value (default GPT-4, as vLLM; all: every model); "
                        "not --model, which names the served model in every other command")
    b = sub.add_parser("build", help="build bundled traces (deterministic)")
    b.add_argument("which", metavar="{codeedit,codeedit-model,chat,general,all}",
                   help="codeedit-model: the same edits shaped as an edit model's answers (traces/README.md)")
    b.add_argument("--out-dir", default="out/traces",
                   help="where to write (default out/traces; --out-dir traces replaces the bundled traces)")
    b.add_argument("--limit", type=int_at_least(1), default=None, help="at most N requests per trace (for tests)")
    b.add_argument("--force", action="store_true", help="replace traces already in --out-dir")
    b.add_argument("--no-progress", action="store_true")
    s = sub.add_parser("stats", help="print request count, token percentiles and the n-gram copy fraction")
    s.add_argument("files", nargs="+", metavar="FILE")
    s.add_argument("--skip-bad", action="store_true")
    s.add_argument("--limit", type=int_at_least(1), default=None,
                   help="the first N requests of each file (only those lines are read)")
    return ap


def _convert(args) -> int:
    from sim.core.trace.convert import FORMATS, convert

    if args.fmt not in FORMATS:
        raise ConfigError(f"unknown format {args.fmt!r}; known formats: {', '.join(FORMATS)}")
    used = {"sharegpt": ("turns", "sharegpt_output_len", "no_length_filter"),
            "vllm-custom": ("keep_output_tokens", "skip_chat_template"), "burstgpt": ("burstgpt_model",)}
    for fmt, names in used.items():
        for n in names:
            if fmt != args.fmt and getattr(args, n) not in (None, False, "first"):
                raise ConfigError(f"--{n.replace('_', '-')} goes with --from {fmt}, not {args.fmt}")
    if args.output_len == 0 or args.output_len < -1:
        raise ConfigError(f"--custom-output-len must be >= 1 or -1 (each line's output_tokens), got {args.output_len}")
    check_in_file(args.input, "IN")
    check_out_file(args.output, args.force, "-o", inputs=(args.input,))
    res = convert(args.fmt, args.input, args.output, skip_bad=args.skip_bad, workload=args.workload,
                  output_len=args.output_len, turns=args.turns, sharegpt_output_len=args.sharegpt_output_len,
                  length_filter=not args.no_length_filter, keep_output_tokens=args.keep_output_tokens,
                  chat_template=not args.skip_chat_template, model=args.burstgpt_model)
    n_lo = sum(1 for r in res.rows if "output_len" in r)
    kind = " (length-only)" if n_lo == len(res.rows) else (f" ({n_lo} length-only)" if n_lo else "")
    print(f"wrote {len(res.rows)} requests{kind} to {args.output}")
    if res.dropped:
        print(f"dropped {res.dropped} {res.dropped_why}")
    for note in res.notes:
        print(f"  {note}")
    if args.skip_bad:
        print(f"skipped {res.skipped} bad rows" + (f" (first: {res.problems[0]})" if res.problems else ""))
    return 0


def _build(args) -> int:
    if args.which not in BUILDS:
        raise ConfigError(f"unknown trace {args.which!r}; known: {', '.join(BUILDS)}")
    out = Path(args.out_dir)
    names = [f"{w}.jsonl" for w in ("codeedit", "codeedit-model", "chat", "general") if args.which in (w, "all")]
    check_out_dir(out, force=True, flag="--out-dir")  # a folder of other files is fine: only these are replaced
    existing = [out / n for n in names if (out / n).exists()]
    if existing and not args.force:
        raise ConfigError(f"--out-dir: {existing[0]} already exists; pass --force to replace it")
    created = [p for p in [out, *out.parents] if not p.exists()]
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _build_into(args, out)
    except BaseException:  # a failed build (full disk, Ctrl-C) leaves no empty folder it made behind
        for p in created:
            try:
                p.rmdir()  # only if still empty
            except OSError:
                break
        raise


def _build_into(args, out: Path) -> int:
    progress = not args.no_progress
    if args.which in ("codeedit", "all"):
        from sim.core.trace import build_codeedit

        res = build_codeedit.build(out / "codeedit.jsonl", target=min(args.limit or build_codeedit.TARGET,
                                                                       build_codeedit.TARGET), progress=progress)
        print(f"codeedit: {res['n']} requests from {len(res['per_project'])} projects "
              f"({', '.join(f'{k}={v}' for k, v in sorted(res['per_project'].items()))}) -> {out / 'codeedit.jsonl'}")
    if args.which in ("codeedit-model", "all"):
        from sim.core.trace import build_codeedit

        dest = out / "codeedit-model.jsonl"
        res = build_codeedit.build(dest, target=min(args.limit or build_codeedit.TARGET, build_codeedit.TARGET),
                                   progress=progress, shape="model")
        print(f"codeedit-model: {res['n']} requests from {len(res['per_project'])} projects -> {dest}")
    which = [w for w in ("chat", "general") if args.which in (w, "all")]
    if which:
        from sim.core.trace import build_sharegpt

        res = build_sharegpt.build_pair(out, limit=args.limit, which=tuple(which), progress=progress)
        for w in which:
            print(f"{w}: {res[w]['n']} requests from {res[w]['conversations']} conversations -> {out / (w + '.jsonl')}")
    return 0


def _stats(args) -> int:
    from sim.core.trace import load_trace
    from sim.core.trace.stats import trace_stats

    from sim.core.trace.loader import check_trace_file

    for f in args.files:  # every file checked before the first is read
        check_trace_file(Path(f), f)
    for f in args.files:
        tr = load_trace(f, limit=args.limit, skip_bad=args.skip_bad)
        print(trace_stats(tr).format())
        if args.skip_bad:
            print(f"  skipped {tr.skipped} bad lines" + (f" (first: {tr.problems[0]})" if tr.problems else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return {"convert": _convert, "build": _build, "stats": _stats}[args.cmd](args)
