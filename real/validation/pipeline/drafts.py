"""The model drafter's chains a real engine drafted, as the simulator's recorded-drafts sidecar
(sim.core.drafters.model.load_recorded_drafts), so the prediction replays them instead of drawing the synthetic
drafter: one JSON line per request,

    {"id": ..., "model_conf": [[c_1 .. c_K] per output position], "model_acc": [accepted length per position]}

model_acc[p] = the longest prefix of the chain drafted at output position p that equals the reference's outputs
from p on (at temperature 0 exactly what the target accepts); a position where the engine drafted nothing holds an
empty chain (confidences 0, accepted 0). Where the engine also recorded which chain it published per position (the
vLLM plugin's `chain_choices`), the line adds "chosen" (that chain's id, CHAIN_MODEL or CHAIN_NGRAM; -1 where none
was recorded) and "skipped" (1 where a chain was published but no model chain was drafted: the skip fired), which
hybrid-vllm replays (sim/core/policies/base.py Replay).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from sim.core.policies.base import CHAIN_MODEL, CHAIN_NGRAM
from sim.infra.cli import write_whole


def write_sidecar(ids: Sequence[str], conf: Sequence[np.ndarray], acc: Sequence[np.ndarray], path: Path,
                  decisions: Sequence[tuple] | None = None) -> Path:
    """The sidecar of per-request confidence rows [positions x K] and accepted lengths [positions], with the
    engine's decisions (chosen, skipped) [positions] each when given (written whole)."""
    def line(i: int, rid, c, a) -> str:
        obj = {"id": str(rid), "model_conf": np.round(np.asarray(c, dtype=np.float64), 6).tolist(),
               "model_acc": np.asarray(a).astype(int).tolist()}
        if decisions is not None:
            obj["chosen"], obj["skipped"] = (np.asarray(x).astype(int).tolist() for x in decisions[i])
        return json.dumps(obj)

    lines = [line(i, rid, c, a) for i, (rid, c, a) in enumerate(zip(ids, conf, acc))]
    write_whole(path, "\n".join(lines) + "\n", overwrite=True)
    return path


def accepted_length(chain: Sequence[int], outputs: Sequence[int], pos: int, k: int) -> int:
    """How many of `chain`'s first k tokens equal outputs[pos:] (the accepted prefix at temperature 0)."""
    m = 0
    while m < k and m < len(chain) and pos + m < len(outputs) and int(chain[m]) == int(outputs[pos + m]):
        m += 1
    return m


def sidecar_from_chains(ids: Sequence[str], reference: Sequence[Sequence[int]],
                        chains: Iterable[tuple[str, int, Sequence[int], Sequence[float]]], k: int,
                        path: Path, choices: Iterable[tuple] | None = None) -> Path | None:
    """The sidecar of chains an engine recorded as (request id, output position, tokens, confidences); None when
    it recorded none. A request id the engine suffixed ("3-8a52d547" for the output's "3") maps to its request.
    choices: the chain it published per (request id, output position, n-gram chain published, its length), the
    last recorded at a position kept; None or empty: the sidecar has no decisions."""
    chains = list(chains)
    if not chains:
        return None
    idx = {str(rid): i for i, rid in enumerate(ids)}

    def at(rid, pos) -> int | None:
        i = idx.get(str(rid))
        if i is None:
            i = idx.get(str(rid).rsplit("-", 1)[0])
        return None if i is None or not 0 <= int(pos) < len(reference[i]) else i

    conf = [np.zeros((len(reference[i]), k)) for i in range(len(ids))]
    acc = [np.zeros(len(reference[i]), dtype=np.int64) for i in range(len(ids))]
    drafted = [np.zeros(len(reference[i]), dtype=bool) for i in range(len(ids))]
    for rid, pos, toks, cs in chains:
        i = at(rid, pos)
        if i is None:
            continue
        p = int(pos)
        conf[i][p] = np.clip(np.asarray(list(cs)[:k] + [0.0] * max(0, k - len(cs)), dtype=np.float64), 0.0, 1.0)
        acc[i][p] = accepted_length(toks, reference[i], p, k)
        drafted[i][p] = True
    choices = list(choices or [])
    if not choices:
        return write_sidecar(ids, conf, acc, path)
    chosen = [np.full(len(reference[i]), -1, dtype=np.int64) for i in range(len(ids))]
    for rid, pos, use_ngram, _ in choices:
        i = at(rid, pos)
        if i is not None:
            chosen[i][int(pos)] = CHAIN_NGRAM if use_ngram else CHAIN_MODEL
    skipped = [(c >= 0) & ~d for c, d in zip(chosen, drafted)]
    return write_sidecar(ids, conf, acc, path, list(zip(chosen, skipped)))
