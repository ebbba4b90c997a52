"""Plain greedy decoding without speculation: the reference every speculative run must equal token for
token (lossless), and the source of the reference outputs the real engine is built on.

One group of prompts runs at a time, one KV slot each: each prompt is prefilled in chunks of at most `chunk`
tokens, then the group decodes one token per request per forward until each stops, at `eos_id` (not
emitted, as a serving engine strips it, unless it is the first token: an output has at least one) or after
its max_tokens. With `hidden_layers` the group also keeps, for every token the target ran, its greedy next
token and the outputs of those layers (the drafter's training data and references, real/drafter/data.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from sim.infra.progress import progress_bar


@dataclass
class Generation:
    """One prompt's greedy output; with hidden_layers also, per forwarded token (prompt, then output):
    greedy [F] int32 the argmax after it, feats [F, len(layers) * hidden] fp16."""
    output: np.ndarray
    greedy: np.ndarray | None = None
    feats: torch.Tensor | None = None


@torch.inference_mode()
def greedy_group(model, prompts: list[np.ndarray], max_tokens: list[int], eos_id: int | None, chunk: int = 512,
                 hidden_layers: tuple[int, ...] = ()) -> list[Generation]:
    """Greedy decoding of one group, prompt i in KV slot i (the model needs len(prompts) slots of at least
    max(len(prompt) + max_tokens) tokens)."""
    dev = next(model.parameters()).device
    lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    keep = bool(hidden_layers)
    n = len(prompts)
    out: list[list[int]] = [[] for _ in range(n)]
    greedy: list[list[torch.Tensor]] = [[] for _ in range(n)]
    feats: list[list[torch.Tensor]] = [[] for _ in range(n)]
    nxt = [0] * n

    def run(tokens, q_lens, cache_lens, slots, logit_idx):
        res = model(tokens, q_lens, cache_lens, slots, logit_idx, hidden_layers=hidden_layers)
        logits, h = res if keep else (res, None)
        return logits.argmax(-1).to(torch.int32).cpu(), (h.to(torch.float16).cpu() if keep else None)

    for s, p in enumerate(prompts):
        p = np.asarray(p, dtype=np.int64)
        for c0 in range(0, len(p), chunk):
            piece = p[c0: c0 + chunk]
            # every row's argmax when kept (training labels), else only the last row's
            rows = torch.arange(len(piece), device=dev) if keep else lt([len(piece) - 1])
            g, h = run(torch.from_numpy(piece).to(dev), lt([len(piece)]), lt([c0]), lt([s]), rows)
            if keep:
                greedy[s].append(g)
                feats[s].append(h)
        nxt[s] = int(g[-1])
    live = [i for i in range(n) if max_tokens[i] > 0]
    while live:
        still = []
        for i in live:
            if eos_id is not None and nxt[i] == eos_id and out[i]:  # an output has >= 1 token
                continue
            out[i].append(nxt[i])
            if len(out[i]) < max_tokens[i]:
                still.append(i)
        live = still
        if not live:
            break
        pos = [len(prompts[i]) + len(out[i]) - 1 for i in live]
        g, h = run(lt([out[i][-1] for i in live]), lt([1] * len(live)), lt(pos), lt(live), lt(list(range(len(live)))))
        for k, i in enumerate(live):
            nxt[i] = int(g[k])
            if keep:
                greedy[i].append(g[k: k + 1])
                feats[i].append(h[k: k + 1])
    return [Generation(np.asarray(out[i], dtype=np.int64),
                       torch.cat(greedy[i]).numpy() if keep else None,
                       torch.cat(feats[i]) if keep else None) for i in range(n)]


def greedy_generate(model, prompts: list[np.ndarray], max_tokens: list[int], eos_id: int | None,
                    batch_size: int = 8, chunk: int = 512, progress: bool = False) -> list[np.ndarray]:
    """Greedy outputs (int64 arrays) of `model` for each prompt, in groups of batch_size. The model's KV cache
    needs batch_size slots of at least max(len(prompt) + max_tokens) tokens."""
    outs: list[np.ndarray] = []
    bar = progress_bar(total=len(prompts), desc="greedy reference", unit="req", disable=not progress)
    for g0 in range(0, len(prompts), batch_size):
        group = slice(g0, g0 + batch_size)
        outs.extend(g.output for g in greedy_group(model, prompts[group], max_tokens[group], eos_id, chunk))
        bar.update(len(prompts[group]))
    bar.close()
    return outs
