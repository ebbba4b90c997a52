"""The model drafter's chains a real engine drafted, as the simulator's recorded-drafts sidecar
(sim.core.drafters.model.load_recorded_drafts), so the prediction replays them instead of drawing the synthetic
drafter: one JSON line per request,

    {"id": ..., "model_conf": [[c_1 .. c_K] per output position], "model_acc": [accepted length per position]}

model_acc[p] = the longest prefix of the chain drafted at output position p that equals the reference's outputs
from p on (at temperature 0 exactly what the target accepts); a position where the engine drafted nothing holds an
empty chain (confidences 0, accepted 0).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from sim.infra.cli import write_whole


def write_sidecar(ids: Sequence[str], conf: Sequence[np.ndarray], acc: Sequence[np.ndarray], path: Path) -> Path:
    """The sidecar of per-request confidence rows [positions x K] and accepted lengths [positions] (written whole)."""
    lines = [json.dumps({"id": str(rid), "model_conf": np.round(np.asarray(c, dtype=np.float64), 6).tolist(),
                         "model_acc": np.asarray(a).astype(int).tolist()}) for rid, c, a in zip(ids, conf, acc)]
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
                        path: Path) -> Path | None:
    """The sidecar of chains an engine recorded as (request id, output position, tokens, confidences); None when
    it recorded none. A request id the engine suffixed ("3-8a52d547" for the output's "3") maps to its request."""
    chains = list(chains)
    if not chains:
        return None
    idx = {str(rid): i for i, rid in enumerate(ids)}
    conf = [np.zeros((len(reference[i]), k)) for i in range(len(ids))]
    acc = [np.zeros(len(reference[i]), dtype=np.int64) for i in range(len(ids))]
    for rid, pos, toks, cs in chains:
        i = idx.get(str(rid))
        if i is None:
            i = idx.get(str(rid).rsplit("-", 1)[0])
        if i is None or not 0 <= int(pos) < len(reference[i]):
            continue
        p = int(pos)
        conf[i][p] = np.clip(np.asarray(list(cs)[:k] + [0.0] * max(0, k - len(cs)), dtype=np.float64), 0.0, 1.0)
        acc[i][p] = accepted_length(toks, reference[i], p, k)
    return write_sidecar(ids, conf, acc, path)
