"""Synthetic state that drives the plugin's step as vLLM does, with no vLLM: token histories and step inputs.

Histories (int32 [rows, width], vLLM's `req_states.all_token_ids` layout: a row holds one request's prompt and
output, whatever lies past its length is junk the step must ignore), one kind per entry of HISTORY_KINDS:
  random      tokens drawn uniformly from RANDOM_VOCAB: n-grams rarely repeat, most positions have no match;
  dense       tokens from a vocabulary of 4: every context matches at n_max, many earlier occurrences;
  repetitive  code-edit shaped: a source span, copies of it with edits, and a periodic run longer than ext_max
              (the calibrator's extended match saturates), over a vocabulary of 1,000.

A step (real/vllm_plugin/speculator.py: observe_verification, then propose) at batch size R over S request slots:
  idx_mapping  int32 [R]: the slot of each batch row (distinct slots; with `padded`, one more row of -1, as a
               CUDA-graph-padded batch has)
  num_sampled  int32 [R]: accepted + 1 in 1..W+1 (0 for a row still prefilling, 1 in 16), num_rejected in
               0..W-accepted; total_len advances by num_sampled before the step, as vLLM's post_update does
  DSpark's     tokens int64 [R, K_b] and confidences float32 [R, K_b] (uniform 0.05..0.95)
  tables       the verify table 10 ms + 0.05 ms per token above 64 and the draft table 1..2 ms (`set_cost_tables`)
Every input is made on the host from the seed and copied to the device before the steps (`StepPlan.to`), so the
same plan runs on the CPU and on the device, and a step itself copies nothing from the host.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from real.vllm_plugin.config import HybridSpecConfig
from real.vllm_plugin.hybrid import HybridDrafter

RANDOM_VOCAB = 50_000
STATE = ("ring", "hits", "pos", "last_ngram", "last_conf", "reached", "accepted", "predicted", "chosen")


def _random(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    return rng.integers(0, RANDOM_VOCAB, (rows, width))


def _dense(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    return rng.integers(0, 4, (rows, width))


def _repetitive(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    out = rng.integers(0, 1000, (rows, width))
    for r in range(rows):
        src = int(rng.integers(16, max(17, width // 8)))
        pos = src
        while pos < width:  # copies of a span of the source, each edited in a few places
            a = int(rng.integers(0, src))
            n = int(min(rng.integers(8, max(9, src - a + 1)), width - pos))
            out[r, pos: pos + n] = out[r, a: a + n]
            edits = rng.random(n) < 0.03
            out[r, pos: pos + n][edits] = rng.integers(0, 1000, int(edits.sum()))
            pos += n + int(rng.integers(0, 12))
        run = int(min(width // 4, 3000))  # a periodic run: matches extend past ext_max (1,024)
        a = int(rng.integers(width // 2, width - run + 1))
        out[r, a: a + run] = np.resize(rng.integers(0, 1000, int(rng.integers(2, 9))), run)
    return out


HISTORY_KINDS = {"random": _random, "dense": _dense, "repetitive": _repetitive}


@dataclass
class Histories:
    """A batch of request histories: tokens int32 [rows, width], context lengths and prompt lengths int64 [rows]."""

    kind: str
    tokens: np.ndarray
    lens: np.ndarray
    plen: np.ndarray


def histories(kind: str, rows: int, width: int, seed: int) -> Histories:
    """`rows` histories of one kind (module docstring): row r holds lens[r] tokens of context (between half the width
    and the width; row 0 the whole width) and random junk after; prompt lengths up to half the context (row 0: 0)."""
    rng = np.random.default_rng([seed, rows, width, sorted(HISTORY_KINDS).index(kind)])
    tok = HISTORY_KINDS[kind](rng, rows, width).astype(np.int32)
    lens = rng.integers(width // 2, width + 1, rows)
    lens[0] = width
    plen = (rng.random(rows) * lens / 2).astype(np.int64)
    plen[0] = 0
    return Histories(kind, tok, lens.astype(np.int64), plen)


# ---------------------------------------------------------------------------------------------------- steps
@dataclass
class StepPlan:
    """Inputs of `steps` live steps of R rows over S slots (module docstring); tensors on one device."""

    S: int
    W: int
    block: int
    token_ids: torch.Tensor        # int32 [S, width]
    prompt_len: torch.Tensor       # int32 [S]
    idx: torch.Tensor              # int32 [R] (+1 padded row)
    totals: list[torch.Tensor]     # int32 [S] per step: total_len after the step's tokens were appended
    ns: list[torch.Tensor]         # int32 [R] per step
    nr: list[torch.Tensor]         # int32 [R] per step
    mtok: list[torch.Tensor]       # int64 [R, K_b] per step
    mconf: list[torch.Tensor]      # float32 [R, K_b] per step
    draft_table: np.ndarray
    verify_table: np.ndarray

    @property
    def R(self) -> int:
        return int(self.idx.shape[0])

    @property
    def steps(self) -> int:
        return len(self.ns)

    def to(self, device: torch.device) -> "StepPlan":
        """The same plan on `device` (a copy of every tensor; the tables stay on the host)."""
        moved = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                moved[f.name] = v.to(device)
            elif isinstance(v, list):
                moved[f.name] = [t.to(device) for t in v]
        return replace(self, **moved)


def step_plan(R: int, S: int, W: int, block: int, width: int, steps: int, seed: int, kind: str = "repetitive",
              padded: bool = False) -> StepPlan:
    """A plan on the CPU (module docstring): S slots of `kind` histories `width` wide, R of them live."""
    if not 1 <= R <= S:
        raise ValueError(f"need 1 <= R <= S, got R={R}, S={S}")
    rng = np.random.default_rng([seed, R, S, W, block, width, steps])
    h = histories(kind, S, width, seed)
    room = (steps + 1) * (W + 1)
    if room > width:
        raise ValueError(f"a history of {width} tokens has no room for {steps} steps of up to {W + 1} tokens")
    lo = max(width - 4 * room, min(width // 2, width - room))  # total_len before the first step: in [lo, width - room]
    start = rng.integers(lo, width - room + 1, S)
    plen = (start * rng.uniform(0.1, 0.6, S)).astype(np.int64)
    slots = rng.permutation(S)[:R]
    idx = np.concatenate([slots, [-1]]) if padded else slots
    total = start.copy()
    totals, ns, nr, mtok, mconf = [], [], [], [], []
    for _ in range(steps):
        n_s = rng.integers(1, W + 2, R)
        n_s[rng.random(R) < 1 / 16] = 0  # still prefilling: nothing verified, nothing to draft from
        n_r = np.minimum(rng.integers(0, W + 1, R), W - np.maximum(n_s - 1, 0))
        total = total.copy()
        total[slots] += n_s
        if padded:
            n_s, n_r = np.append(n_s, 1), np.append(n_r, 0)
        totals.append(torch.as_tensor(total, dtype=torch.int32))
        ns.append(torch.as_tensor(n_s, dtype=torch.int32))
        nr.append(torch.as_tensor(n_r, dtype=torch.int32))
        mtok.append(torch.as_tensor(rng.integers(0, 1000, (len(idx), block)), dtype=torch.int64))
        mconf.append(torch.as_tensor(rng.uniform(0.05, 0.95, (len(idx), block)), dtype=torch.float32))
    t = np.arange(S * (W + 1) + 65, dtype=np.float64)
    return StepPlan(S=S, W=W, block=block, token_ids=torch.as_tensor(h.tokens), prompt_len=torch.as_tensor(plen,
                    dtype=torch.int32), idx=torch.as_tensor(idx, dtype=torch.int32), totals=totals, ns=ns, nr=nr,
                    mtok=mtok, mconf=mconf, draft_table=np.linspace(1.0, 2.0, S + 1),
                    verify_table=10.0 + np.maximum(t - 64, 0) * 0.05)


def drafter(plan: StepPlan, device: torch.device, compiled: bool = False, warm: bool = True,
            warm_sizes: tuple[int, ...] | None = None, cfg: HybridSpecConfig | None = None) -> HybridDrafter:
    """The plugin's HybridDrafter for the plan's slots on `device`, its tables set and (warm) its step warmed up, as
    the speculator does when vLLM's cost tables arrive (on_cost_tables); warm_sizes: the batch sizes of the warm-up
    (None: the plugin's own, 1 and every slot); cfg: its hybrid_spec (default: the defaults, `compile` as given)."""
    cfg = HybridSpecConfig(compile=compiled) if cfg is None else cfg
    d = HybridDrafter(cfg, plan.S, plan.W, device, block=plan.block, compiled=compiled)
    d.set_cost_tables(plan.draft_table, plan.verify_table)
    if warm:
        d.warm_up(plan.token_ids, plan.totals[0], plan.prompt_len, batch_sizes=warm_sizes)
    return d


def step(d: HybridDrafter, plan: StepPlan, s: int):
    """Live step s: observe, then propose (as HybridSpeculator calls them). Returns (ns, nr, Proposal)."""
    ns, nr = d.observe(plan.idx, plan.ns[s], plan.nr[s], plan.token_ids, plan.totals[s], plan.prompt_len)
    p = d.propose(plan.idx, plan.ns[s], plan.mtok[s], plan.mconf[s], plan.token_ids, plan.totals[s], plan.prompt_len,
                  d.table, d.draft_ms(plan.R))
    return ns, nr, p


def snapshot(d: HybridDrafter, out) -> dict[str, torch.Tensor]:
    """Host copies of a step's outputs and of the drafter's state after it, the sink row left out (a device sync:
    never inside a step)."""
    ns, nr, p = out
    got = {"ns": ns, "nr": nr, "tokens": p.tokens, "conf": p.conf, "use_ngram": p.use_ngram, "ngram_len": p.ngram_len}
    for name in STATE:  # per-slot buffers without the sink row (padded rows' writes land there by design)
        t = getattr(d, name)
        got[name] = t[: d.max_reqs] if t.shape[0] == d.max_reqs + 1 else t
    return {k: v.detach().to("cpu", copy=True) for k, v in got.items()}


def differences(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor], rel: float = 1e-6) -> dict[str, float]:
    """Per field: the number of differing entries (integers, booleans) or, for floats, the largest difference when it
    exceeds rel * max(1, |want|max) (float64 sums may add in another order on another device). Empty: equal."""
    out = {}
    for k, w in want.items():
        g = got[k]
        if g.shape != w.shape or g.dtype != w.dtype:
            out[k] = float("inf")
        elif w.is_floating_point():
            diff = float((g.double() - w.double()).abs().max()) if w.numel() else 0.0
            if diff > rel * max(1.0, float(w.double().abs().max()) if w.numel() else 0.0):
                out[k] = diff
        else:
            n = int((g != w).sum())
            if n:
                out[k] = float(n)
    return out


def max_float_diff(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> float:
    """The largest difference over the float fields (0 when all are equal)."""
    return max([float((got[k].double() - w.double()).abs().max()) for k, w in want.items()
                if w.is_floating_point() and w.numel()] or [0.0])
