"""The suffix drafter's calibrator: its tree frequencies turned into acceptance estimates, fit on general text.

    python -m sim.suffix_calibrate --trace traces/general.jsonl --sample 150 --out FILE

The tree's conditional frequency p_j = count(child) / count(children) over-states acceptance where the tree has
seen little (a path seen once has p = 1): on 150 general requests a slot with p = 1 is accepted 28% of the time
after a one-token match and 95% after a match of 16 or more. The calibrator is a table over two features known
at proposal time, the raw p_j (bins P_EDGES) and the context the slot extends, e = m + j (the matched suffix
length plus the slots before it; bins E_EDGES [tokens]):
    conf_j = (accepted + W * prior) / (proposed + W)   over the fitting slots in the cell,
prior = the overall acceptance, W = SMOOTH slots (a cell with few slots leans to the prior). The fitting slots
are every proposal's slots up to and including its first rejected one, at every output position of the sampled
requests, the requests fed in trace order (per-request and global trees, as sim/api/suffix_report.py).
The bundled calibrator (models/calibrators/suffix-general.json) was made by the command above on
traces/general.jsonl, never on the traces the reports evaluate. Units: probabilities, tokens.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from sim.infra.cli import SEED, ArgumentParser, check_out_file, int_at_least
from sim.core.drafters.suffix import E_EDGES, P_EDGES, SMOOTH, SuffixConfig, SuffixDrafter, fit
from sim.infra.errors import ConfigError
from sim.infra.fsio import own_path


def fitting_slots(tables, cfg: SuffixConfig, progress: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(raw p, context e, accepted) of every fitting slot over the requests of `tables` (module docstring)."""
    tb, d = tables, SuffixDrafter(cfg)
    P, E, Y = [], [], []
    n = len(tb.out_len)
    for r in range(n):
        base, pl, L = int(tb.tok_offsets[r]), int(tb.prompt_len[r]), int(tb.out_len[r])
        seq = tb.tokens[base: base + pl + L].tolist()
        d.start(r, seq[:pl])
        for i in range(L):
            p = d.propose(r)
            for j, (t, c) in enumerate(zip(p.tokens, p.conf)):
                if pl + i + j >= len(seq):
                    break
                ok = t == seq[pl + i + j]
                P.append(c)
                E.append(p.match_len + j)
                Y.append(ok)
                if not ok:
                    break
            d.observe(r, [seq[pl + i]])
        d.stop(r)
        if progress:
            print(f"\rrequest {r + 1}/{n}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return np.asarray(P, dtype=np.float64), np.asarray(E, dtype=np.int64), np.asarray(Y, dtype=bool)


def _write_new(path: Path, text: str) -> None:
    """Write `text` to a new file `path` whole or not at all (a temporary file linked into place: never over an
    existing file)."""
    tmp = own_path(path, "tmp")
    try:
        tmp.write_text(text)
        os.link(tmp, path)
    except FileExistsError:
        raise ConfigError(f"--out {path} exists: choose a new file (a calibrator is never overwritten)") from None
    finally:
        tmp.unlink(missing_ok=True)


def main(argv=None) -> int:
    from sim.api.run import SimSetup, prepare

    ap = ArgumentParser(prog="python -m sim.suffix_calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default="traces/general.jsonl", help="the fitting trace (default traces/general.jsonl)")
    ap.add_argument("--sample", type=int_at_least(1), default=150, help="requests sampled (default 150)")
    ap.add_argument("--seed", type=SEED, default=1)
    ap.add_argument("--out", type=Path, required=True, help="the calibrator file to write (never overwritten)")
    a = ap.parse_args(argv)
    check_out_file(a.out, False, "--out", hint="choose a new file (a calibrator is never overwritten)")  # claimed
    cfg = SuffixConfig()
    prep = prepare(SimSetup(trace=a.trace, sample=a.sample, seed=a.seed))
    p, e, y = fitting_slots(prep.tables, cfg)
    table, n = fit(p, e, y)
    print(f"{len(y)} fitting slots, acceptance {y.mean():.3f}; rows p >= {list(P_EDGES)}, columns e >= {list(E_EDGES)}")
    for r, edge in enumerate(P_EDGES):
        print(f"p >= {edge:<5} " + " ".join(f"{table[r, c]:.3f} ({n[r, c]:>6})" for c in range(len(E_EDGES))))
    _write_new(a.out, json.dumps({
        "made_by": f"python -m sim.suffix_calibrate --trace {a.trace} --sample {a.sample} --seed {a.seed}",
        "suffix_config": cfg.__dict__, "p_edges": list(P_EDGES), "e_edges": list(E_EDGES), "smooth": SMOOTH,
        "slots": n.tolist(), "table": table.round(6).tolist()}, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0
