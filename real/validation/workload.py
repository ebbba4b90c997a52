"""A validation workload: a trace slice, the target model, and the reference run every engine run is built on.

Two modes:
  real weights (SmolLM2-135M-Instruct from its GGUF): prompts are the trace's text tokenized with the
      model's own tokenizer; the reference outputs are the model's plain greedy outputs
      (real/engine/greedy.py), capped at --max-tokens;
  random weights, teacher forced (any models/llms architecture): prompts and outputs are the trace's own
      token ids (folded into the model's vocabulary, id mod V), outputs capped at --max-tokens; the target's
      token at each position is the trace's, so acceptance is the trace's while every kernel runs at size;
      with a drafter file trained for that architecture (--drafter FILE) the random model decodes greedily
      instead, so that its live drafter reads the target's own hidden states (the live-drafter path without
      real weights: tests/test_validate_e2e.py).
A slice keeps, in trace order (or a seeded sample), the requests whose prompt has at most --max-prompt
tokens, up to --limit of them; how many longer prompts were passed over is reported, not hidden.

The draft tables of the reference (sim/core/drafters/tables.py) give the engine its output lengths and the n-gram
confidences. Model drafter: with real weights, the project's trained drafter (real/drafter/, default
models/drafters/dspark-smollm2-135m-b7.pt) runs live in the engine, and the tables hold its chains at every
output position, drafted from the target's hidden states recorded while generating the reference (so the
simulator replays the same drafter), likewise a drafter file given with random weights; otherwise (random
weights, or drafter=None) the synthetic profile's chains stand in (replayed from the tables).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from sim.core.drafters.calibration import DEFAULT_CALIBRATOR, NgramCalibrator
from sim.core.drafters.model import load_drafter_profile
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.tables import DraftTables, build_draft_tables
from sim.core.drafters.registry import DEFAULT_DRAFTERS, live_drafters
from sim.engine.engine import EngineConfig, RunResult
from sim.infra.errors import ConfigError
from sim.core.policies import get_policy
from sim.core.trace.loader import prompt_texts
from sim.core.trace.schema import Request

REAL_WEIGHT_MODELS = {"smollm2-135m": "smollm2-135m-gguf"}  # models/llms name -> weights spec of build_model
DRAFTER = "dspark-qwen3-b7"  # the stand-in model drafter's synthetic profile


@dataclass
class Workload:
    trace: str
    model_label: str          # models/llms name
    weights: str              # build_model spec: a GGUF alias, or the llms name (random)
    teacher: bool
    device: torch.device
    dtype: torch.dtype
    requests: list[Request]
    tables: DraftTables
    ngram_cfg: NgramConfig
    passed_over: int = 0      # requests skipped for a prompt longer than max_prompt
    notes: list[str] = field(default_factory=list)
    drafter: object = None    # the trained drafter (real weights), attached to the target's embedding
    _model: object = None

    @classmethod
    def build(cls, trace: str, model: str, random_weights: bool, device: str, limit: int | None, sample: int | None,
              seed: int, max_tokens: int, max_prompt: int, progress: bool = False, k_ngram: int = 32,
              teacher: bool | None = None, drafter: str | None = "default") -> "Workload":
        """The slice and its reference. teacher: take the target's tokens from the trace (default: with random
        weights); teacher=False with random weights uses the random model's own greedy outputs (tests).
        drafter: weights file of the trained model drafter ("default": the bundled one; None: the synthetic
        stand-in), used with real weights; with random weights a file trained for `model` (not "default": the
        bundled one is SmolLM2's), or a DSparkDrafter built for `model` (any weights). A drafter with random
        weights decodes the random model greedily (teacher=None): the drafter reads the target's real hidden
        states, which teacher forcing would not give it."""
        from real.engine.model import ModelArgs

        if max_tokens < 1:
            raise ConfigError(f"--max-tokens must be >= 1, got {max_tokens}")
        if max_prompt < 1:
            raise ConfigError(f"--max-prompt must be >= 1, got {max_prompt}")
        weights, dev, dtype = target_weights(model, random_weights, device, "to run it teacher-forced")
        args = ModelArgs.from_llm(model)
        raw = read_slice(trace, limit, sample, seed, max_prompt, model, random_weights, args.vocab_size)
        reqs, passed = raw
        if not reqs:
            raise ConfigError(f"{trace}: no request has a prompt of at most {max_prompt} tokens")
        for r in reqs:
            if r.prompt_len + max_tokens > args.max_seq_len:
                raise ConfigError(f"{trace}: request '{r.id}' needs {r.prompt_len + max_tokens} tokens of context; "
                                  f"{model} has {args.max_seq_len}")
        own = drafter is not None and (not isinstance(drafter, str) or drafter != "default")  # not the bundled one
        live = drafter is not None and (not random_weights or own)  # a trained drafter runs live in the engine
        teacher = (random_weights and not live) if teacher is None else teacher
        if teacher and not random_weights:
            raise ConfigError("teacher forcing is for random weights (real weights decode greedily)")
        wl = cls(trace, model, weights, teacher, dev, dtype, reqs, None, None, passed)  # type: ignore[arg-type]
        if teacher:
            for r in reqs:
                r.output_ids = r.output_ids[:max_tokens]
                r.output_len = len(r.output_ids)
        else:
            from real.engine.greedy import greedy_generate
            from sim.core.trace.smollm2_tokenizer import SmolTokenizer

            eos = SmolTokenizer.from_gguf().eos_id if not random_weights else None
            mdl = wl.model(max_slots=8, extra=max_tokens)
            if live:
                outs, recorded = _reference_with_drafter(wl, mdl, drafter, max_tokens, eos, progress)
            else:
                outs = greedy_generate(mdl, [r.prompt_ids for r in reqs], [max_tokens] * len(reqs), eos,
                                       batch_size=8, progress=progress)
            for r, o in zip(reqs, outs):
                r.output_ids = o.astype(np.int32)
                r.output_len = len(o)
        calib = NgramCalibrator.load(DEFAULT_CALIBRATOR)
        wl.ngram_cfg = NgramConfig(n_min=calib.cfg.n_min, n_max=calib.cfg.n_max, k=k_ngram, ext_max=calib.cfg.ext_max)
        wl.tables = build_draft_tables(reqs, wl.ngram_cfg, load_drafter_profile(DRAFTER), calib, seed=seed,
                                       recorded=recorded if wl.drafter is not None else None)
        return wl

    def model(self, max_slots: int, extra: int = 0):
        """The target with a KV cache of max_slots slots, each as long as the longest request (+ extra);
        built once and rebuilt only when more slots or length are needed."""
        from real.engine.weights import build_model

        need = int(max(r.prompt_len + max(r.output_len, extra) for r in self.requests)) + 40
        m = self._model
        if m is None or m.max_slots < max_slots or m.max_len < need:
            m, _ = build_model(self.weights, self.device, self.dtype, max_slots=max_slots, max_len=need)
            self._model = m
        return m

    def write_trace(self, path: Path) -> None:
        """The reference as a token-id trace the simulator loads (prompt_ids, output_ids), written whole (a
        temporary sibling renamed into place): a kill leaves the earlier file or this one, never half."""
        from sim.infra.cli import write_whole

        write_whole(Path(path), "".join(json.dumps({"id": r.id, "prompt_ids": [int(x) for x in r.prompt_ids],
                                                    "output_ids": [int(x) for x in r.output_ids]}) + "\n"
                                        for r in self.requests), overwrite=True)


def _reference_with_drafter(wl: Workload, mdl, drafter: str, max_tokens: int, eos: int, progress: bool):
    """Greedy reference outputs generated with the target's hidden states, and the trained drafter's chains at
    every output position drafted from them (sim.core.drafters.model.ModelChains per request id)."""
    from real.drafter.data import generate_group
    from real.drafter.evaluate import output_chains
    from real.drafter.model import ENGINE_DRAFTER, file_sha256, load_drafter
    from real.engine.weights import find_smollm2_gguf
    from sim.infra.progress import progress_bar
    from sim.core.drafters.model import ModelChains

    if isinstance(drafter, str):
        path = ENGINE_DRAFTER if drafter == "default" else drafter
        real_sha = None if wl.weights == wl.model_label else file_sha256(find_smollm2_gguf())  # random weights: none
        d = load_drafter(path, target=wl.model_label, target_sha256=real_sha, device=wl.device, dtype=wl.dtype)
    else:
        d = drafter.to(device=wl.device, dtype=wl.dtype).eval()
    d.attach_target(mdl.tok_embeddings.weight)
    wl.drafter = d
    reqs = wl.requests
    outs, recorded = [], {}
    for g0 in progress_bar(range(0, len(reqs), 8), desc="greedy reference + drafts", unit="group", disable=not progress):
        group = reqs[g0: g0 + 8]
        seqs = generate_group(mdl, [r.prompt_ids.astype(np.int64) for r in group], max_tokens, eos, d.cfg.layers)
        for r, sq in zip(group, seqs):
            outs.append(sq.tokens[sq.prompt_len:].astype(np.int64))
            ch = output_chains(d, sq)
            recorded[r.id] = ModelChains(conf=ch["conf"].astype(np.float32), acc_len=ch["acc"].astype(np.int64))
    return outs, recorded


def target_weights(model: str, random_weights: bool, device: str, random_use: str) -> tuple:
    """(weights spec for build_model, device, dtype) of the target `model`: its real weights (REAL_WEIGHT_MODELS),
    or random ones for any models/llms name; bfloat16 on CUDA, float32 elsewhere. A model without real weights
    and no random_weights is a ConfigError whose hint says what --random-weights would do (`random_use`)."""
    from real.engine.weights import resolve_device

    if not random_weights and model not in REAL_WEIGHT_MODELS:
        raise ConfigError(f"no real weights for model '{model}' (real weights: {', '.join(REAL_WEIGHT_MODELS)}); "
                          f"use --random-weights {random_use}")
    dev = resolve_device(device)
    return (model if random_weights else REAL_WEIGHT_MODELS[model], dev,
            torch.bfloat16 if dev.type == "cuda" else torch.float32)


def read_slice(trace: str, limit, sample, seed, max_prompt, model, random_weights, vocab) -> tuple[list[Request], int]:
    """The slice's requests (prompt ids in the target's vocabulary) and how many were passed over."""
    from sim.core.trace.loader import load_trace

    if random_weights:
        tr = load_trace(trace, sample=sample, seed=seed) if sample else load_trace(trace)
        pool = [r for r in tr.requests if not r.length_only]
        if len(pool) < len(tr.requests):
            raise ConfigError(f"{trace}: {len(tr.requests) - len(pool)} request(s) have no token content; "
                              "teacher forcing needs outputs")
        for r in pool:
            r.prompt_ids = (r.prompt_ids.astype(np.int64) % vocab).astype(np.int32)
            r.output_ids = (r.output_ids.astype(np.int64) % vocab).astype(np.int32)
    else:
        from sim.core.trace.smollm2_tokenizer import SmolTokenizer

        tok = SmolTokenizer.from_gguf()
        pool = []
        for rid, text in slice_prompts(trace, sample, seed):
            ids = np.asarray(tok.encode(text), dtype=np.int32)
            pool.append(Request(id=rid, prompt_ids=ids, output_ids=np.zeros(1, dtype=np.int32), prompt_len=len(ids),
                                output_len=1))
    kept, passed = [], 0
    for r in pool:
        if limit is not None and len(kept) >= limit:
            break
        if r.prompt_len > max_prompt:
            passed += 1
            continue
        r.prompt_len = len(r.prompt_ids)
        kept.append(r)
    return kept, passed


# the trace's prompt texts (callers in real/validation/validate.py and real/validation/eval_drafter.py use this name)
slice_prompts = prompt_texts


def build_engine_model(wl: Workload, max_slots: int):
    return wl.model(max_slots=max_slots)


def run_real(wl: Workload, model, policy: str, batch_size: int, cost, progress: bool = False,
             max_num_batched_tokens: int = 512, drafters: str = ",".join(DEFAULT_DRAFTERS),
             drafter_config: str | None = None) -> RunResult:
    """One real-engine run of the workload (all requests arrive at 0). `cost` prices the policies'
    decisions (the machine's profiled table); None = a provisional one (profiling runs). drafters: the run's
    enabled drafters (--drafters; a live one such as suffix runs inside the engine, with its settings from
    `drafter_config`, a checked --drafter-config value)."""
    from real.engine.engine import RealEngine

    model = wl.model(max_slots=batch_size)
    if cost is None:
        cost = provisional_cost(model)
    cfg = EngineConfig(batch_size=batch_size, max_num_batched_tokens=max_num_batched_tokens, async_scheduling=False,
                       kv_capacity_tokens=10**9)
    pol = get_policy(policy, drafters)
    live = live_drafters(pol.uses_extra, drafter_config)  # fresh per run
    eng = RealEngine(wl.tables, np.zeros(len(wl.requests)), pol, cost, cfg, model, wl.ngram_cfg,
                     teacher_forcing=wl.teacher, progress=progress, drafter=wl.drafter, live=live)
    return eng.run()


def provisional_table(llm: str, vocab_size: int) -> dict:
    """The provisional cost table's JSON object (provisional_cost)."""
    from sim.core.cost.profiled import FORMAT

    xs = [1, 16, 64, 256, 1024]
    zero = {"num_reqs": [1], "ms": [1e-6]}
    return {
        "format": FORMAT, "llm": llm, "gpu": "cpu", "source": "provisional", "capture_sizes": [],
        "verify": {"num_tokens": xs, "ms": [1.0 + x / 16 for x in xs]}, "kv_ms_per_token": 0.0,
        "draft": dict(zero, block=7), "ngram": zero, "alloc": {"*": zero}, "sample": {"num_tokens": [1], "ms": [1e-6]},
        "cpu": {"base_ms": 0.0, "per_req_ms": 0.0, "per_token_ms": 0.0}, "kv_capacity_tokens": 10**9,
        "vocab_size": int(vocab_size)}


def provisional_cost(model):
    """A cost model for decisions before anything is profiled: verify ms proportional to tokens
    (1 + T/16, a CPU-like shape), every other part 0. Used only by profiling runs."""
    from sim.core.cost.profiled import ProfiledCost, cost_table_from_dict

    table = cost_table_from_dict(provisional_table(model.args.name, model.args.vocab_size), "the provisional cost table")
    return ProfiledCost(table, fallback=None)
