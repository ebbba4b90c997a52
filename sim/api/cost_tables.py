"""python -m sim.cost [--llm qwen3-8b] [--context 1024] [--write-tables [--force]]

Prints, for every GPU, the roofline model's anchor figures (batch-1 decode step, knee, per-token slope,
KV capacity) and tables of step times by batch size and by tokens per step. --write-tables regenerates
the derived example table models/cost_tables/h100-sxm_qwen3-8b.json (a tracked file: only with --force).
"""
from __future__ import annotations

from sim.infra.cli import ArgumentParser, check_out_file, int_at_least
from sim.core.cost.profiled import default_table_path, tables_from_cost_model, write_cost_table
from sim.core.cost.roofline import RooflineCost
from sim.infra.errors import ConfigError
from sim.core.models import DEFAULT_LLM, get_llm, list_gpus

MAX_CONTEXT = 10**7  # tokens: past every model's context length by far; beyond it the tables mean nothing

BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKENS = (1, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048)


def report(llm: str, context: int) -> str:
    out = []
    for gpu in list_gpus():
        c = RooflineCost(llm=llm, gpu=gpu)
        ref = RooflineCost(llm="llama-3.1-8b", gpu=gpu)
        out.append(f"== {llm} on {gpu} ==")
        out.append(f"  batch-1 decode step (verify + sample, ctx 512): {c.decode_step_ms(1, 512):.2f} ms "
                   f"(llama-3.1-8b: {ref.decode_step_ms(1, 512):.2f} ms; anchor H100 ~7.5)")
        out.append(f"  non-attention knee: {c.knee_tokens:.0f} tokens/step (llama-3.1-8b {ref.knee_tokens:.0f}; "
                   f"anchor H100 ~128, A100 ~64); slope past it: {c.ms_per_token * 1e3:.1f} us/token "
                   f"(llama {ref.ms_per_token * 1e3:.1f}; anchor H100 ~20, A100 66-70)")
        cfg = c.config
        out.append(f"  KV: {cfg.kv_bytes_per_token} B/token (target {c.llm.kv_bytes_per_token}); "
                   f"pool {cfg.kv_pool_bytes / 2**30:.1f} GiB = {c.kv_capacity_tokens:,} tokens "
                   f"(gpu_memory_utilization {cfg.gpu_memory_utilization})")
        out.append(f"  step times by batch size (ms; each request has {context} tokens of context; "
                   f"spec = 1 + 7 draft tokens per request, draft = DSpark block 7)")
        out.append(f"  {'batch':>6} {'decode':>8} {'tok/s':>8} {'verify8':>8} {'draft7':>7} {'ngram':>6} "
                   f"{'alloc':>6} {'cpu':>6}")
        for b in BATCHES:
            dec = c.decode_step_ms(b, context)
            v8 = float(c.verify_ms(8 * b, b * context, b)) + c.sample_ms(8 * b)
            out.append(f"  {b:>6} {dec:>8.2f} {b / dec * 1e3:>8.0f} {v8:>8.2f} {c.draft_ms(b, 7, b * context):>7.2f} "
                       f"{c.ngram_ms(b):>6.3f} {c.alloc_ms(b):>6.3f} {c.cpu_ms(b, 8 * b):>6.3f}")
        out.append("  verify by tokens per step (ms; short context, one sequence per 8 tokens)")
        out.append(f"  {'tokens':>6} {'verify':>8} {'linear':>8} {'ms/tok':>8}")
        for t in TOKENS:
            v = float(c.verify_ms(t, 0, max(1, t // 8)))
            out.append(f"  {t:>6} {v:>8.2f} {c.linear_ms(t):>8.2f} {v / t:>8.4f}")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m sim.cost", description=__doc__.splitlines()[2])
    ap.add_argument("--llm", default=DEFAULT_LLM)
    ap.add_argument("--context", type=int_at_least(0), default=1024, help="context tokens per request (default 1024)")
    ap.add_argument("--write-tables", action="store_true",
                    help="regenerate the derived example table models/cost_tables/h100-sxm_qwen3-8b.json")
    ap.add_argument("--force", action="store_true", help="with --write-tables: replace the existing (tracked) table")
    a = ap.parse_args(argv)
    if a.context > MAX_CONTEXT:
        raise ConfigError(f"--context must be <= {MAX_CONTEXT} tokens, got {a.context}")
    get_llm(a.llm)  # a bad name fails before any table is printed
    if a.write_tables:
        path = check_out_file(default_table_path("qwen3-8b", "h100-sxm"), a.force, "--write-tables",
                              hint="it is a tracked file; pass --force to regenerate it")
        cost = RooflineCost(llm="qwen3-8b", gpu="h100-sxm")
        p = write_cost_table(tables_from_cost_model(cost), path, overwrite=True)
        print(f"wrote {p}")
        return 0
    print(report(a.llm, a.context))
    return 0
