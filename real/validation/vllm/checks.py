"""The first-run checklist of a vLLM validation: what only a GPU can show, checked before anything is measured.

  (a) plugin    the hybrid plugin loaded in the worker: real.vllm_plugin.rpc.hybrid_stats, called through
                LLM.collective_rpc after a short generate, answers from every worker, says nothing is inactive
                (keys loaded / active / enabled, where present) and, if it counts steps, counted some;
  (b) ngram     the plugin's n-gram kernels propose what the simulator's n-gram drafter proposes on the same
                histories: real.vllm_plugin.checks.ngram_selfcheck(device) in every worker (N/A, not a FAIL,
                when the plugin does not provide it);
  (c) sync      no host sync in a hybrid step: the hybrid's generate runs under VLLM_GPU_SYNC_CHECK=error;
  (d) lossless  the hybrid's outputs equal the baseline's (adaptive) token for token at temperature 0.
Two vLLM processes (engine.launch): the baseline on the first CHECK_PROMPTS prompts of the first trace (at most
CHECK_MAX_TOKENS output tokens each), then the hybrid on the same prompts with the sync check on. Each item is
PASS, FAIL or N/A with a detail; a FAIL stops the run unless --skip-checks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from real.validation.vllm.config import BASELINE, HYBRID, VllmRunConfig, shell_line

CHECK_PROMPTS = 4
CHECK_MAX_TOKENS = 32
ITEMS = {"a": "plugin loaded in the worker (real.vllm_plugin.rpc.hybrid_stats via LLM.collective_rpc)",
         "b": "n-gram kernels == the simulator's n-gram drafter (real.vllm_plugin.checks.ngram_selfcheck)",
         "c": "no host sync in a hybrid step (generate under VLLM_GPU_SYNC_CHECK=error)",
         "d": "hybrid outputs == baseline outputs at temperature 0"}
INACTIVE_KEYS = ("loaded", "active", "enabled")


@dataclass(frozen=True)
class CheckResult:
    key: str
    status: str   # PASS, FAIL or N/A
    detail: str

    def line(self) -> str:
        return f"  [{self.key}] {self.status:<4s} {ITEMS[self.key]}: {self.detail}"


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first output token where a and b differ (the shorter length if one is a prefix); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(ref: list[list[int]], got: list[list[int]]) -> tuple[bool, str]:
    """(equal, one-line detail) of two runs' outputs, request by request."""
    if len(ref) != len(got):
        return False, f"{len(got)} outputs for {len(ref)} requests"
    bad = [(i, first_divergence(r, g)) for i, (r, g) in enumerate(zip(ref, got))]
    bad = [(i, j) for i, j in bad if j is not None]
    if not bad:
        return True, f"{len(ref)}/{len(ref)} requests equal ({sum(map(len, ref))} tokens)"
    i, j = bad[0]
    r, g = ref[i], got[i]
    return False, (f"{len(bad)}/{len(ref)} requests differ; request {i} first at output token {j} (baseline "
                   f"{r[j] if j < len(r) else 'end'}, hybrid {g[j] if j < len(g) else 'end'})")


def _short(x, n: int = 160) -> str:
    s = json.dumps(x, separators=(",", ":"), default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


def evaluate(base: dict, hyb: dict) -> list[CheckResult]:
    """The four items from the baseline's and the hybrid's run results (engine.run_spec dicts)."""
    out = []
    # (a) the plugin's rpc
    hs = hyb.get("hybrid_stats") or {}
    workers = hs.get("workers")
    if not hs.get("available"):
        out.append(CheckResult("a", "FAIL", hs.get("detail", "no hybrid_stats recorded") + "; is the plugin installed?"))
    elif hs.get("error"):
        out.append(CheckResult("a", "FAIL", f"the rpc raised {hs['error']}"))
    elif not workers or not all(isinstance(w, dict) for w in workers):
        out.append(CheckResult("a", "FAIL", f"the rpc returned {_short(workers)}, not one dict per worker"))
    else:
        off = [k for w in workers for k in INACTIVE_KEYS if k in w and not w[k]]
        idle = [w for w in workers if "steps" in w and not w["steps"]]
        if off:
            out.append(CheckResult("a", "FAIL", f"the plugin reports {off[0]}=false: {_short(workers[0])}"))
        elif idle:
            out.append(CheckResult("a", "FAIL", f"the hybrid speculator counted no steps: {_short(idle[0])}"))
        else:
            out.append(CheckResult("a", "PASS", f"{len(workers)} worker(s): {_short(workers[0])}"))
    # (b) the n-gram self-check
    sc = hyb.get("ngram_selfcheck")
    if not sc:
        out.append(CheckResult("b", "N/A", "not run (the hybrid run did not get that far)"))
    elif any(ok is None for ok, _ in sc):
        out.append(CheckResult("b", "N/A", next(d for ok, d in sc if ok is None)))
    elif all(ok for ok, _ in sc):
        out.append(CheckResult("b", "PASS", sc[0][1] or "equal"))
    else:
        out.append(CheckResult("b", "FAIL", next(d for ok, d in sc if not ok)))
    # (c) the sync check
    if hyb.get("error"):
        out.append(CheckResult("c", "FAIL", hyb["error"]))
    elif hyb.get("outputs") is None:
        out.append(CheckResult("c", "FAIL", "the hybrid run recorded no outputs"))
    else:
        out.append(CheckResult("c", "PASS", f"{len(hyb['outputs'])} requests generated with "
                                            f"VLLM_GPU_SYNC_CHECK={hyb.get('env', {}).get('VLLM_GPU_SYNC_CHECK', '?')}"))
    # (d) lossless
    if base.get("outputs") is None or hyb.get("outputs") is None:
        out.append(CheckResult("d", "FAIL", "no outputs to compare (" + ("baseline" if base.get("outputs") is None
                                                                          else "hybrid: see (c)") + ")"))
    else:
        ok, detail = compare_outputs(base["outputs"], hyb["outputs"])
        out.append(CheckResult("d", "PASS" if ok else "FAIL", detail))
    return out


def runs(cfg: VllmRunConfig, ids: list[str], prompts: list[list[int]], max_tokens: list[int]) -> list[tuple]:
    """(label, spec, env) of the two checklist runs: the baseline, then the hybrid under the sync check."""
    n = min(CHECK_PROMPTS, len(prompts))
    common = {"config": cfg.to_json(), "batch_size": n, "ids": ids[:n], "prompts": prompts[:n],
              "max_tokens": [min(CHECK_MAX_TOKENS, m) for m in max_tokens[:n]], "warmup": False}
    return [("check_baseline", dict(common, policy=BASELINE), cfg.env()),
            ("check_hybrid", dict(common, policy=HYBRID, catch_errors=True, selfcheck=True), cfg.env(sync_check=True))]


def plan_lines(cfg: VllmRunConfig, work: Path, n_prompts: int) -> list[str]:
    """The checklist's items and the commands it runs, as printable lines."""
    from real.validation.vllm.engine import child_argv

    n = min(CHECK_PROMPTS, n_prompts)
    lines = [f"  [{k}] {t}" for k, t in ITEMS.items()]
    lines.append(f"  on the first {n} prompts of the first trace, at most {CHECK_MAX_TOKENS} output tokens, batch {n}:")
    for label, pol, sync in (("check_baseline", BASELINE, False), ("check_hybrid", HYBRID, True)):
        lines.append(f"    {label}: LLM(**{json.dumps(cfg.engine_kwargs(pol, n), separators=(',', ':'))})")
        lines.append("      " + shell_line(child_argv(work / f"{label}.spec.json", work / f"{label}.result.json"),
                                           cfg.env(sync_check=sync)))
    return lines


def run_checklist(cfg: VllmRunConfig, ids, prompts, max_tokens, work: Path) -> list[CheckResult]:
    """Run the two checklist processes (GPU) and evaluate the items."""
    from real.validation.vllm.engine import VllmRunError, launch

    (lb, sb, eb), (lh, sh, eh) = runs(cfg, ids, prompts, max_tokens)
    base = launch(sb, work, lb, eb)  # without a baseline nothing can be checked: its failure stops the run
    try:
        hyb = launch(sh, work, lh, eh)
    except VllmRunError as exc:  # the hybrid's engine did not even start: every item it owns fails with why
        hyb = {"error": str(exc), "hybrid_stats": {"available": False, "detail": f"the hybrid's process failed ({exc})"}}
    return evaluate(base, hyb)
