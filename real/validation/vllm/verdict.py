"""`real/validate.py --engine vllm --from-verdict DIR`: the setups a `python -m sim.run --out DIR` recommended, read
from DIR/verdict.json, as the vLLM validation's cells.

verdict.json (written by sim.run --out beside its tables):

    {"verdicts": [{"batch_size": 4,
                   "recommended": {"policy": "vllm-ngram:32", "serve": "VLLM_USE_V2_MODEL_RUNNER=1 vllm serve ..."},
                   "runner_up": {"policy": ..., "serve": ...} or null}, ...]}

Each recommended simulator policy becomes the flow policy vLLM runs it with (flow_policy), from what the policy
declares (Policy.vllm, sim/core/vllm.py's VllmRun), never from its name:
    no speculative method                          -> none
    DSpark with adaptive verification, its block   -> adaptive
    vLLM's n-gram at K                             -> ngram:K
    the plugin with settings (field, value), ...   -> hybrid:field=value:... (a true flag bare: hybrid:slots=32:skip)
Anything else (a fixed DSpark chain, EAGLE, MTP, suffix, a per-batch K, a build the validation does not run) is
refused in one line. The cell's `vllm serve` line must equal the verdict's (VllmRunConfig.serve_line, the same
builder): a verdict made for another target, drafter or calibrator is refused rather than validated as something
else.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from real.validation.vllm import config as C
from sim.infra.errors import ConfigError

VERDICT_FILE = "verdict.json"


@dataclasses.dataclass(frozen=True)
class Recommended:
    """One batch size's recommendation: the simulator's policy spec and its `vllm serve` line (None: not given)."""
    batch_size: int
    policy: str
    serve: str | None


def _setting(name: str, value) -> str:
    """One plugin setting as split_policy reads it back: a true flag bare, a number in its shortest form."""
    if value is True:
        return f":{name}"
    if isinstance(value, float):
        return f":{name}={value:g}"
    return f":{name}={value}"


# (what the policy's VllmRun must be, the flow policy) in order: the first rule that matches names the cell
RULES = (
    (lambda r: r.method is None, lambda r: C.NONE),
    (lambda r: r.plugin and not r.per_batch, lambda r: C.HYBRID + "".join(_setting(k, v) for k, v in r.plugin_config)),
    (lambda r: r.method == "ngram" and r.k and not r.per_batch, lambda r: f"{C.NGRAM}:{r.k}"),
    (lambda r: r.method == "dspark" and r.adaptive and not r.estimator and r.k is None and not r.per_batch,
     lambda r: C.BASELINE),
)


def flow_policy(spec: str) -> str:
    """The vLLM flow policy that runs the simulator policy `spec` (module docstring); ConfigError when the
    validation runs no such setup."""
    from sim.core.drafters.registry import drafters
    from sim.core.policies import get_policy

    try:  # the default drafters, else every one (a verdict of a run with --drafters ...,suffix)
        run = get_policy(spec).vllm
    except ConfigError:
        run = get_policy(spec, tuple(drafters())).vllm
    if run is not None and run.release is None:
        for match, name in RULES:
            if match(run):
                return name(run)
    raise ConfigError(f"policy '{spec}': the vLLM validation runs none, adaptive, vllm-ngram:K and the plugin "
                      "(hybrid-vllm...), not this setup")


def read_verdict(out_dir: str) -> list[Recommended]:
    """DIR/verdict.json's recommendations, by batch size; ConfigError (one line) when absent or malformed."""
    from sim.infra.inputs import CONFIG, read_json

    path = Path(out_dir) / VERDICT_FILE
    if not Path(out_dir).is_dir():
        raise ConfigError(f"--from-verdict {out_dir}: not a directory (the --out of a python -m sim.run)")
    if not path.is_file():
        raise ConfigError(f"--from-verdict {out_dir}: no {VERDICT_FILE} there (python -m sim.run --out DIR writes it)")
    body = read_json(path, CONFIG, what="--from-verdict")
    items = body.get("verdicts") if isinstance(body, dict) else None
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{path}: expected {{\"verdicts\": [...]}} with one entry per batch size")
    out, seen = [], set()
    for i, v in enumerate(items):
        where = f"{path}: verdicts[{i}]"
        rec = v.get("recommended") if isinstance(v, dict) else None
        bs = v.get("batch_size") if isinstance(v, dict) else None
        if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1:
            raise ConfigError(f"{where}.batch_size must be an integer >= 1, got {bs!r}")
        if not isinstance(rec, dict) or not isinstance(rec.get("policy"), str):
            raise ConfigError(f"{where}.recommended must be an object with a policy (a simulator policy spec)")
        serve = rec.get("serve")
        if serve is not None and not isinstance(serve, str):
            raise ConfigError(f"{where}.recommended.serve must be a `vllm serve` line, got {serve!r}")
        if bs in seen:  # several traces or groups at one batch size: each would need its own slice
            raise ConfigError(f"{where}: batch {bs} appears twice; validate one trace's verdict at a time")
        seen.add(bs)
        out.append(Recommended(bs, rec["policy"], serve))
    return out


def verdict_cells(out_dir: str, cfg: C.VllmRunConfig, version: str) -> tuple[tuple[int, str], ...]:
    """(batch size, flow policy) of every recommendation in DIR/verdict.json, each checked: the validation's
    `vllm serve` line for it equals the verdict's."""
    cells = []
    for r in read_verdict(out_dir):
        try:
            pol = flow_policy(r.policy)
        except ConfigError as exc:
            raise ConfigError(f"--from-verdict {out_dir}: batch {r.batch_size}: {exc}") from None
        mine = cfg.serve_line(pol, r.batch_size, version)
        if r.serve is not None and r.serve != mine:
            raise ConfigError(f"--from-verdict {out_dir}: at batch {r.batch_size} the verdict serves `{r.serve}` but "
                              f"this validation would serve `{mine}`; pass the target, drafter and calibrator the "
                              "verdict's run had (--vllm-model, --vllm-drafter, --hybrid-spec)")
        cells.append((r.batch_size, pol))
    return tuple(cells)
