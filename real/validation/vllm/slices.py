"""The slice of a trace a vLLM run generates, `none`'s outputs written as the reference trace, and the refusal of
the torch engine's flags (real/validation/vllm/flow.py, on either build: builds.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sim.infra.errors import ConfigError

TORCH_ONLY = {"model": "smollm2-135m", "random_weights": False, "device": "cpu", "drafter": "default",
              "repeat": None}  # repeats and verdicts: the torch engine only, so far


@dataclass(frozen=True)
class Slice:
    """The requests of a trace a vLLM run generates: prompts as token ids (the target's tokenizer's), per-request
    max_tokens = min(the trace's output length, the cap)."""
    trace: str
    ids: tuple[str, ...]
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: tuple[int, ...]
    passed_over: int
    tokenizer: str | None = None  # what tokenized the prompts (marked on the reference trace); None: not said

    @property
    def stem(self) -> str:
        return Path(self.trace).stem


def load_slice(trace: str, limit: int, max_prompt: int, cap: int, model: str = "qwen3-8b",
               tokenizer: str | None = None) -> Slice:
    """The first `limit` requests of `trace` whose prompt has at most max_prompt tokens (trace order), its text in
    the tokenizer of `model` (a models/llms spec: the target's) or `tokenizer` (the target directory's); token ids
    that cannot be the target's are refused."""
    from sim.core.models import get_llm
    from sim.core.trace.loader import load_trace
    from sim.core.trace.tokenizer import tokenizer_for

    tok = tokenizer or tokenizer_for(model)[0]
    tr = load_trace(trace, tokenizer=tok, vocab_size=get_llm(model).vocab_size)
    if tr.length_only:
        raise ConfigError(f"{trace}: the vLLM engine needs the prompts' tokens; this trace has lengths only")
    ids, prompts, mts, passed = [], [], [], 0
    for r in tr.requests:
        if len(ids) >= limit:
            break
        if r.prompt_len > max_prompt:
            passed += 1
            continue
        ids.append(r.id)
        prompts.append(tuple(int(t) for t in r.prompt_ids))
        mts.append(max(1, min(int(r.output_len), cap)))
    if not ids:
        raise ConfigError(f"{trace}: no request has a prompt of at most {max_prompt} tokens")
    # the reference is marked with the spec's tokenizer, which its prediction (--model the spec) checks it against
    return Slice(trace, tuple(ids), tuple(prompts), tuple(mts), passed, None if tokenizer else tok or None)


def refuse_torch_flags(a) -> None:
    """ConfigError when a torch-engine flag was given a value with --engine vllm."""
    for k, d in TORCH_ONLY.items():
        if getattr(a, k, d) != d:
            hint = ("; with --engine vllm the target and drafter are --vllm-model and --vllm-drafter"
                    if k in ("model", "random_weights", "device", "drafter") else
                    ("; vLLM's steps are deterministic at temperature 0 (a repeat gives the same steps and tokens) and "
                     "on the CPU build its wall clock is the harness's (interpreted kernels), so repeats and verdicts "
                     "wait for a GPU run (docs/real.md, 'Verdicts')" if k == "repeat" else ""))
            raise ConfigError(f"--{k.replace('_', '-')} is for the torch engine{hint}")


def write_reference(sl: Slice, outputs: list[list[int]], path: Path) -> None:
    """The baseline's outputs as a token-id trace (the simulator's --trace)."""
    from real.validation.fidelity import write_output

    mark = {"tokenizer": sl.tokenizer} if sl.tokenizer else {}
    write_output(path, "".join(json.dumps({"id": i, "prompt_ids": list(p), "output_ids": o, **mark}) + "\n"
                         for i, p, o in zip(sl.ids, sl.prompts, outputs)))
