"""python -m sim.trace {convert,build,stats}: convert public trace formats, build the bundled traces, print stats.

  python -m sim.trace convert --from FORMAT IN -o OUT.jsonl [--skip-bad] [--workload W] [format options]
  python -m sim.trace build {codeedit,chat,general,all} [--out-dir out/traces] [--limit N]  (--out-dir traces: replace the bundled ones)
  python -m sim.trace stats FILE [FILE ...] [--skip-bad]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.cli_util import run_cli
from sim.errors import ConfigError

BUILDS = ("codeedit", "chat", "general", "all")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (as run_cli does)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    from sim.trace.convert import FORMATS

    ap = _Parser(prog="python -m sim.trace", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    c = sub.add_parser("convert", help="convert a public trace format to hybridspec JSONL")
    c.add_argument("--from", dest="fmt", required=True, metavar="FORMAT", help=f"one of: {', '.join(FORMATS)}")
    c.add_argument("input", metavar="IN")
    c.add_argument("-o", "--output", required=True, metavar="OUT")
    c.add_argument("--skip-bad", action="store_true", help="skip bad rows (and print how many) instead of failing")
    c.add_argument("--workload", default=None,
                   help="set this workload name on every request (azure: code or conv; default: from the file name)")
    g = c.add_argument_group("sharegpt (defaults: what vLLM's ShareGPT dataset builds)")
    g.add_argument("--turns", choices=("first", "all"), default="first",
                   help="first: one request per conversation, turn 0 -> turn 1, vLLM's length filter (vLLM); "
                        "all: one request per assistant turn, the earlier turns in the ChatML template as prompt")
    g.add_argument("--sharegpt-output-len", type=int, default=None,
                   help="--turns first: every output this many tokens (length-only), as vLLM's flag")
    g.add_argument("--no-length-filter", action="store_true",
                   help="--turns first: keep conversations outside vLLM's length filter")
    g = c.add_argument_group("vllm-custom (defaults: what vLLM's custom dataset builds)")
    g.add_argument("--custom-output-len", "--output-len", dest="output_len", type=int, default=256,
                   help="every output length, overriding output_tokens (vLLM's default 256); -1: each line's "
                        "output_tokens (required then)")
    g.add_argument("--keep-output-tokens", action="store_true",
                   help="a line's output_tokens where given, --custom-output-len elsewhere (not vLLM's reading)")
    g.add_argument("--skip-chat-template", action="store_true",
                   help="keep prompts raw instead of wrapping them in the chat template (vLLM's flag)")
    g = c.add_argument_group("burstgpt")
    g.add_argument("--model", default=None, help="keep this model's rows (default GPT-4, as vLLM; all: every model)")
    b = sub.add_parser("build", help="build bundled traces (deterministic)")
    b.add_argument("which", metavar="{codeedit,chat,general,all}")
    b.add_argument("--out-dir", default="out/traces",
                   help="where to write (default out/traces; --out-dir traces replaces the bundled traces)")
    b.add_argument("--limit", type=int, default=None, help="at most N requests per trace (for tests)")
    b.add_argument("--no-progress", action="store_true")
    s = sub.add_parser("stats", help="print request count, token percentiles and the n-gram copy fraction")
    s.add_argument("files", nargs="+", metavar="FILE")
    s.add_argument("--skip-bad", action="store_true")
    s.add_argument("--limit", type=int, default=None)
    return ap


def _convert(args) -> int:
    from sim.trace.convert import FORMATS, convert

    if args.fmt not in FORMATS:
        raise ConfigError(f"unknown format {args.fmt!r}; known formats: {', '.join(FORMATS)}")
    used = {"sharegpt": ("turns", "sharegpt_output_len", "no_length_filter"),
            "vllm-custom": ("keep_output_tokens", "skip_chat_template"), "burstgpt": ("model",)}
    for fmt, names in used.items():
        for n in names:
            if fmt != args.fmt and getattr(args, n) not in (None, False, "first"):
                raise ConfigError(f"--{n.replace('_', '-')} goes with --from {fmt}, not {args.fmt}")
    if Path(args.output).resolve() == Path(args.input).resolve():
        raise ConfigError(f"-o {args.output} is the input file; the conversion would destroy it: choose another output")
    res = convert(args.fmt, args.input, args.output, skip_bad=args.skip_bad, workload=args.workload,
                  output_len=args.output_len, turns=args.turns, sharegpt_output_len=args.sharegpt_output_len,
                  length_filter=not args.no_length_filter, keep_output_tokens=args.keep_output_tokens,
                  chat_template=not args.skip_chat_template, model=args.model)
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
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {args.limit}")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    if args.which in ("codeedit", "all"):
        from sim.trace import build_codeedit

        res = build_codeedit.build(out / "codeedit.jsonl", target=min(args.limit or build_codeedit.TARGET,
                                                                       build_codeedit.TARGET), progress=progress)
        print(f"codeedit: {res['n']} requests from {len(res['per_project'])} projects "
              f"({', '.join(f'{k}={v}' for k, v in sorted(res['per_project'].items()))}) -> {out / 'codeedit.jsonl'}")
    which = [w for w in ("chat", "general") if args.which in (w, "all")]
    if which:
        from sim.trace import build_sharegpt

        res = build_sharegpt.build_pair(out, limit=args.limit, which=tuple(which), progress=progress)
        for w in which:
            print(f"{w}: {res[w]['n']} requests from {res[w]['conversations']} conversations -> {out / (w + '.jsonl')}")
    return 0


def _stats(args) -> int:
    from sim.trace import load_trace
    from sim.trace.stats import trace_stats

    for f in args.files:
        tr = load_trace(f, limit=args.limit, skip_bad=args.skip_bad)
        print(trace_stats(tr).format())
        if args.skip_bad:
            print(f"  skipped {tr.skipped} bad lines" + (f" (first: {tr.problems[0]})" if tr.problems else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return {"convert": _convert, "build": _build, "stats": _stats}[args.cmd](args)


if __name__ == "__main__":
    run_cli(main)
