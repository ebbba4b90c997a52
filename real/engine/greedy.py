"""Plain greedy decoding without speculation: the reference every speculative run must equal token for
token (lossless), and the source of the reference outputs the real engine is built on.

Requests run in groups of `batch_size`: each prompt is prefilled in chunks of at most `chunk` tokens, then
the group decodes one token per request per forward until each stops, at `eos_id` (not emitted, as a
serving engine strips it, unless it is the first token: an output has at least one) or after max_tokens.
"""
from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm


@torch.inference_mode()
def greedy_generate(model, prompts: list[np.ndarray], max_tokens: list[int], eos_id: int | None,
                    batch_size: int = 8, chunk: int = 512, progress: bool = False) -> list[np.ndarray]:
    """Greedy outputs (int64 arrays) of `model` for each prompt. The model's KV cache needs batch_size
    slots of at least max(len(prompt) + max_tokens) tokens."""
    dev = next(model.parameters()).device
    lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
    outs: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(prompts)
    bar = tqdm(total=len(prompts), desc="greedy reference", unit="req", disable=not progress, leave=False)
    for g0 in range(0, len(prompts), batch_size):
        group = list(range(g0, min(g0 + batch_size, len(prompts))))
        nxt, out = {}, {i: [] for i in group}
        for s, i in enumerate(group):
            p = np.asarray(prompts[i], dtype=np.int64)
            for c0 in range(0, len(p), chunk):
                piece = p[c0: c0 + chunk]
                logits = model(torch.from_numpy(piece).to(dev), lt([len(piece)]), lt([c0]), lt([s]), lt([len(piece) - 1]))
            nxt[i] = int(logits.argmax(-1)[0])
        live = [i for i in group if max_tokens[i] > 0]
        while live:
            keep = []
            for i in live:
                if eos_id is not None and nxt[i] == eos_id and out[i]:  # an output has >= 1 token
                    continue
                out[i].append(nxt[i])
                if len(out[i]) < max_tokens[i]:
                    keep.append(i)
            live = keep
            if not live:
                break
            slots = [group.index(i) for i in live]
            pos = [len(prompts[i]) + len(out[i]) - 1 for i in live]
            logits = model(lt([out[i][-1] for i in live]), lt([1] * len(live)), lt(pos), lt(slots),
                           lt(list(range(len(live)))))
            for i, t in zip(live, logits.argmax(-1).tolist()):
                nxt[i] = int(t)
        for i in group:
            outs[i] = np.asarray(out[i], dtype=np.int64)
        bar.update(len(group))
    bar.close()
    return outs
