"""The first-run checklist of a vLLM validation, on either build: what must hold before anything is measured.

  (a) plugin    the hybrid plugin loaded in the worker: real.vllm_plugin.rpc.hybrid_stats, called through
                LLM.collective_rpc after a short generate, answers from every worker, says nothing is inactive
                (keys loaded / active / enabled, where present) and, if it counts steps, counted some;
  (b) ngram     the plugin's n-gram kernels propose what the simulator's n-gram drafter proposes on the same
                histories: real.vllm_plugin.checks.ngram_selfcheck(device) in every worker (N/A, not a FAIL,
                when the plugin does not provide it);
  (c) sync      no host sync in a hybrid step: the hybrid's generate runs under VLLM_GPU_SYNC_CHECK=error (CUDA;
                N/A on the CPU build, which has no device to synchronise with);
  (d) lossless  the hybrid's outputs equal `none`'s (plain greedy decoding) at temperature 0, up to bf16 tie flips
                (real/validation/pipeline/lossless.py: a first difference where `none`'s top-2 margin is below the
                epsilon). On CUDA both runs use vLLM's batch-invariant mode where the installed build ships it
                (config.batch_invariant_env), so a tie flip should not even occur there.
vLLM processes (cells.run_cell, cached by their spec): `none` on the first CHECK_PROMPTS prompts of the first trace
(at most CHECK_MAX_TOKENS output tokens each, its margins recorded), then every hybrid variant the run plans
(`hybrid_variants`: plain, `slots=W`, `slots=W:skip`, ...: each runs device paths the others do not, such as DSpark's
num_speculative_tokens = 0 pass, W > block under CUDA graphs, the skip's pinned copies) on the same prompts, each
under the sync check and batch invariance. Items (a) to (d) per variant, each PASS, FAIL or N/A with a detail; a FAIL
stops the run unless --skip-checks.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from real.validation.pipeline.lossless import DEFAULT_TIE_EPSILON, compare_outputs
from real.validation.vllm.config import HYBRID, NONE, VllmRunConfig, batch_invariant_env, shell_line, split_policy

CHECK_PROMPTS = 4
CHECK_MAX_TOKENS = 32
ITEMS = {"a": "plugin loaded in the worker (real.vllm_plugin.rpc.hybrid_stats via LLM.collective_rpc)",
         "b": "n-gram kernels == the simulator's n-gram drafter (real.vllm_plugin.checks.ngram_selfcheck)",
         "c": "no host sync in a hybrid step (generate under VLLM_GPU_SYNC_CHECK=error)",
         "d": "hybrid outputs == none's outputs at temperature 0 (up to bf16 tie flips)"}
INACTIVE_KEYS = ("loaded", "active", "enabled")


@dataclass(frozen=True)
class CheckResult:
    key: str
    status: str   # PASS, FAIL or N/A
    detail: str
    policy: str = HYBRID  # the hybrid variant the item was checked on

    def line(self) -> str:
        return f"  [{self.key}] {self.status:<4s} {ITEMS[self.key]} ({self.policy}): {self.detail}"


def hybrid_variants(policies) -> tuple[str, ...]:
    """The hybrid policies among `policies`, in order (the plain hybrid when there is none: the plugin is checked
    whatever is measured)."""
    return tuple(dict.fromkeys(p for p in policies if split_policy(p)[0] == HYBRID)) or (HYBRID,)


def _short(x, n: int = 160) -> str:
    s = json.dumps(x, separators=(",", ":"), default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


def evaluate(base: dict, hyb: dict, sync_check: bool = True, epsilon: float = DEFAULT_TIE_EPSILON,
             policy: str = HYBRID) -> list[CheckResult]:
    """The four items from `none`'s and one hybrid variant's run results (engine.run_spec dicts); sync_check: item
    (c) ran."""
    out = _evaluate(base, hyb, sync_check, epsilon)
    return [CheckResult(r.key, r.status, r.detail, policy) for r in out]


def _evaluate(base: dict, hyb: dict, sync_check: bool, epsilon: float) -> list[CheckResult]:
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
    if not sync_check and not hyb.get("error"):
        out.append(CheckResult("c", "N/A", "on CPU there is no device to synchronise with (VLLM_GPU_SYNC_CHECK is a "
                                           "CUDA check; tests/test_vllm_plugin_lifecycle.py audits the step instead)"))
    elif hyb.get("error"):
        out.append(CheckResult("c", "FAIL", hyb["error"]))
    elif hyb.get("outputs") is None:
        out.append(CheckResult("c", "FAIL", "the hybrid run recorded no outputs"))
    else:
        out.append(CheckResult("c", "PASS", f"{len(hyb['outputs'])} requests generated with "
                                            f"VLLM_GPU_SYNC_CHECK={hyb.get('env', {}).get('VLLM_GPU_SYNC_CHECK', '?')}"))
    # (d) lossless
    if base.get("outputs") is None or hyb.get("outputs") is None:
        out.append(CheckResult("d", "FAIL", "no outputs to compare (" + ("none" if base.get("outputs") is None
                                                                          else "hybrid: see (c)") + ")"))
    else:
        cmp = compare_outputs(base["outputs"], hyb["outputs"], base.get("margins"), epsilon)
        bi = "batch-invariant mode" if (hyb.get("env") or {}).get("VLLM_BATCH_INVARIANT") == "1" else None
        out.append(CheckResult("d", "PASS" if cmp.lossless else "FAIL",
                               cmp.detail("none", "hybrid") + (f" ({bi})" if bi else "")))
    return out


def plan_lines(cfg: VllmRunConfig, work: Path, n_prompts: int, sync_check: bool,
               variants: tuple[str, ...] = (HYBRID,)) -> list[str]:
    """The checklist's items and the commands it runs, as printable lines."""
    from real.validation.pipeline.cells import policy_dir
    from real.validation.vllm.engine import child_argv

    n = min(CHECK_PROMPTS, n_prompts)
    lines = [f"  [{k}] {t}" for k, t in ITEMS.items()]
    lines.append(f"  on the first {n} prompts of the first trace, at most {CHECK_MAX_TOKENS} output tokens, batch {n}; "
                 f"(a) to (d) for each of {', '.join(variants)}:")
    for pol, sync in ((NONE, False), *((v, sync_check) for v in variants)):
        d = work / policy_dir(pol)
        lines.append(f"    {pol}: LLM(**{json.dumps(cfg.cell(pol).engine_kwargs(pol, n), separators=(',', ':'))})")
        lines.append("      " + shell_line(child_argv(d / "run.spec.json", d / "run.result.json"), check_env(cfg, sync)))
    return lines


def check_env(cfg: VllmRunConfig, sync: bool) -> dict[str, str]:
    """A checklist process's environment: the run's, batch-invariant where available, the sync check if asked."""
    return dict(cfg.env(sync_check=sync), **batch_invariant_env(cfg.device))


def run_checklist(cfg: VllmRunConfig, sl, work: Path, sync_check: bool, epsilon: float,
                  variants: tuple[str, ...] = (HYBRID,)) -> list[CheckResult]:
    """Run the checklist's processes (`none`, then each hybrid variant at its own config, cfg.cell; cells.run_cell:
    cached by their spec) and evaluate the items per variant."""
    from real.validation.pipeline.cells import policy_dir
    from real.validation.vllm.cells import run_cell
    from real.validation.vllm.engine import VllmRunError

    n = min(CHECK_PROMPTS, len(sl.ids))
    base = run_cell(cfg, sl, NONE, n, work / NONE, warmup=False, n=n, max_tokens=CHECK_MAX_TOKENS, margins=True,
                    env=check_env(cfg, False))  # without a reference nothing can be checked: its failure stops the run
    out = []
    for pol in variants:
        try:
            hyb = run_cell(cfg.cell(pol), sl, pol, n, work / policy_dir(pol), warmup=False, selfcheck=True, n=n,
                           max_tokens=CHECK_MAX_TOKENS, env=check_env(cfg, sync_check))
        except VllmRunError as exc:  # the variant's engine did not even start: every item it owns fails with why
            hyb = {"error": str(exc),
                   "hybrid_stats": {"available": False, "detail": f"the {pol} process failed ({exc})"}}
        out += evaluate(base, hyb, sync_check, epsilon, pol)
    return out
