"""Online recalibration of drafter confidences from each request's own verified outcomes (the `recal=k` option of
`hybrid` and `hybrid-price`): the general-text calibration, corrected per request and per drafter.

Why. Every drafter's confidences are calibrated on general text (sim/core/drafters/calibration.py, the DSpark profile,
the suffix calibrator). On a workload that copies more (code edits), they under-state acceptance, so a price-based
policy verifies too little of the chains that would have been accepted; a request that keeps copying shows it in
its own outcomes within a few steps.

Model. For request r and drafter d, the conditional acceptance of slot j of the chain drafted at a step is
    p*_j = sigmoid(logit p_j + b_rd),
p_j the calibrated confidence (the drafter's, unchanged) and b_rd an unknown offset [logits], shared by every slot
and step of that request and drafter, with the prior b_rd ~ Normal(0, 1 / k). k [1 / logit^2] is the prior's
precision, in the units of the evidence's Fisher information: a slot observed at p = 1/2 adds 1/4, so k = 4 weighs
as much as 16 such slots. k -> infinity is the calibration as fitted (b = 0).

Evidence. After a step the engine knows the tokens the request emitted, e = (accepted draft tokens of the verified
chain) + 1 (the target's token); drafter d's chain (if it ran) is compared with them, verified or not: its slots
j = 1..m are observed, m = min(len_d, acc_d + 1, e), with outcome y_j = 1{j <= acc_d} (acc_d: the leading tokens of
d's chain the target emits; the censoring rule of the calibrator's fit: slot j is seen only when 1..j-1 were
accepted and the emitted tokens reach it). The simulator reads acc_d from its tables; a real engine compares d's
proposed tokens with the emitted ones.

Update (online Laplace / assumed-density filtering: the Gaussian posterior Normal(b, 1/P) of b, one Newton step per
step's evidence). With p^_j = sigmoid(logit p_j + b) at the current b,
    g = sum_{j <= m} (y_j - p^_j)       [tokens: accepted minus expected accepted]
    h = sum_{j <= m} p^_j (1 - p^_j)    [Fisher information, 1 / logit^2]
    P <- P + h,   b <- b + g / P,       starting from P = k, b = 0.
Invariants: P >= k > 0 and never decreases (the posterior only sharpens); b = 0 until a slot is observed; a step
whose observed slots are all accepted never lowers b and one whose first observed slot is rejected never raises it;
|step of b| <= m / P <= m / k; as b grows on accepted slots p^ -> 1 and g -> 0 (it saturates instead of diverging,
where a count ratio would not). State: two float64 numbers per (request, drafter), whatever the trace length.

Apply: conf' = sigmoid(logit conf + b) on every confidence in (0, 1) (0 and 1 are kept: slots past a chain's end,
vLLM's fresh-request reset); monotone in conf, conf itself at b = 0 (up to float rounding). Everything is batched
torch on the tensors' device with no host synchronisation; the engine keeps the state (sim/engine/engine.py,
`Engine.recal`) and hands the policy the offsets of the decoding requests: the StepBatch the current ones
(`StepBatch.recal`), the HostView those one step older (`StepBatch.stale_recal`), as a host under asynchronous
scheduling plans the step before the previous one's outcome is back.

Run level (`runcal=k`, RecalState(shared=True)): one offset b_d per drafter for the whole run, the same model and
update with every request's observed slots of a step pooled (`observe_shared`): a bias every request shares (the
general-text calibration on a copy-heavy workload) from far more evidence, without per-request noise.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import math

import torch

from sim.infra.errors import ConfigError

EPS = 1e-6  # confidences are clamped to [EPS, 1 - EPS] before the logit (a finite offset stays finite)


def recalibrate(conf: torch.Tensor, offset: Optional[torch.Tensor]) -> torch.Tensor:
    """conf' = sigmoid(logit conf + offset[:, None]) where 0 < conf < 1, conf elsewhere; [R, K], conf's dtype.
    offset: float [R] logits (None: conf unchanged)."""
    if offset is None:
        return conf
    c = conf.to(torch.float64)
    out = torch.sigmoid(torch.logit(c.clamp(EPS, 1.0 - EPS)) + offset.to(torch.float64)[:, None])
    return torch.where((c > 0.0) & (c < 1.0), out, c).to(conf.dtype)


def evidence(offset: torch.Tensor, conf: torch.Tensor, length: torch.Tensor, acc: torch.Tensor,
             evidence: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's evidence per row at offsets b [R] (module docstring): (g [R] accepted minus expected accepted
    over the observed slots, h [R] their Fisher information), float64; 0 on rows with no observed slot."""
    f64 = torch.float64
    K = conf.shape[-1]
    seen = torch.minimum(torch.minimum(length, acc + 1), evidence).clamp(min=0)  # m
    j = torch.arange(K, device=conf.device)[None, :]
    mask = (j < seen[:, None]).to(f64)
    y = (j < acc[:, None]).to(f64)
    p = torch.sigmoid(torch.logit(conf.to(f64).clamp(EPS, 1.0 - EPS)) + offset.to(f64)[:, None])
    return ((y - p) * mask).sum(-1), (p * (1.0 - p) * mask).sum(-1)


def observe(offset: torch.Tensor, precision: torch.Tensor, conf: torch.Tensor, length: torch.Tensor,
            acc: torch.Tensor, evidence_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's update of (offset b [R], precision P [R]) from drafter d's chain (conf [R, K], its length [R]),
    the leading tokens of it the target emits (acc [R]) and the tokens emitted (evidence e [R]); module docstring.
    Rows with no observed slot are unchanged. Returns the new (b, P), float64."""
    b, P = offset.to(torch.float64), precision.to(torch.float64)
    g, h = evidence(b, conf, length, acc, evidence_)
    P = P + h
    return b + g / P, P


def observe_shared(offset: torch.Tensor, precision: torch.Tensor, conf: torch.Tensor, length: torch.Tensor,
                   acc: torch.Tensor, evidence_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`observe` for one offset shared by every request of the run (the `runcal=k` option: b and P are [1]): the
    step's evidence of all R rows pooled, P <- P + sum_r h_r, b <- b + sum_r g_r / P."""
    b, P = offset.to(torch.float64), precision.to(torch.float64)
    g, h = evidence(b.expand(conf.shape[0]), conf, length, acc, evidence_)
    P = P + h.sum()
    return b + g.sum() / P, P


def recalibrated(view):
    """The StepBatch or HostView `view` with every drafter's confidences recalibrated by its offsets (the view's
    `recal`, name -> [R] logits; a drafter without one is unchanged), and `recal` emptied, so that applying it
    twice is applying it once. The view itself when it carries no offsets."""
    off = getattr(view, "recal", None)
    if not off:
        return view
    fix = dict(stale_chains={k: (recalibrate(c, off.get(k)), ln) for k, (c, ln) in view.stale_chains.items()},
               means={k: recalibrate(c, off.get(k)) for k, c in view.means.items()}, recal={})
    if hasattr(view, "chains"):  # a StepBatch: the current chains too
        fix["chains"] = {k: (recalibrate(c, off.get(k)), ln) for k, (c, ln) in view.chains.items()}
    return dataclasses.replace(view, **fix)


RUNCAL_START_FLAG = "--runcal-start"


def parse_runcal_start(text: str | None) -> str | None:
    """`NAME=b/P,...` (the simulator's --runcal-start: the run-level state a run starts from, per drafter NAME its
    offset b [logits] and precision P [1 / logit^2] > 0) checked and normalised; None stays None. A real vLLM run's
    plugin learns runcal's state in its warm-up too, so its measured run starts from that state, not the prior
    (real/validation/vllm/cells.py passes it)."""
    return None if not text else runcal_start_text(runcal_start_of(text))


def runcal_start_text(state: dict[str, tuple[float, float]]) -> str:
    """The --runcal-start text of drafter -> (offset, precision), the one spelling (runcal_start_of reads it)."""
    return ",".join(f"{n}={float(b)!r}/{float(P)!r}" for n, (b, P) in state.items())


def runcal_start_of(text: str | None) -> dict[str, tuple[float, float]]:
    """The drafters' (offset, precision) of a --runcal-start text (parse_runcal_start); {} when none. ConfigError
    (one line naming the part) on a malformed one."""
    out: dict[str, tuple[float, float]] = {}
    for part in (text or "").split(","):
        name, eq, rest = part.partition("=")
        b, slash, P = rest.partition("/")
        try:
            got = (float(b), float(P)) if eq and slash and name.strip() else None
        except ValueError:
            got = None
        if got is None or not all(math.isfinite(x) for x in got) or got[1] <= 0 or name.strip() in out:
            raise ConfigError(f"{RUNCAL_START_FLAG} {text!r}: expected NAME=OFFSET/PRECISION per drafter, comma "
                              f"separated, a finite offset, a precision > 0 and each drafter once; got {part!r}")
        out[name.strip()] = got
    return out


class RecalState:
    """An engine's recalibration state (module docstring): per request r and drafter d, the offset b [logits] and
    precision P [1 / logit^2], host float64 arrays [n, D] (the trace's n requests, D = the policy's drafters), and
    the offsets one step older that the host plans from (they travel in StepBatch.recal / stale_recal: `field`).
    Fixed size per request; the update is `observe`'s torch (the simulator's tensors live on the CPU, so wrapping
    the arrays costs no copy).
    shared=True (`runcal=k`): one offset per drafter for the whole run (arrays [1, D]), updated from every
    request's evidence at once (`observe_shared`): a bias of the general-text calibration that the workload shares
    (code edits copy more than general text) is learnt from far more slots than one request's, so without the
    per-request offsets' noise, and it carries over to requests that join later."""

    field = "recal"  # the StepBatch field its offsets travel in (HostView.recal: the older ones)

    def __init__(self, drafters: tuple, n: int, k: float, shared: bool = False):
        self.names, self.k, self.shared = tuple(drafters), float(k), bool(shared)
        D, rows = len(self.names), 1 if shared else n
        self.b = torch.zeros((rows, D), dtype=torch.float64)
        self.P = torch.full((rows, D), self.k, dtype=torch.float64)
        self.b_host = torch.zeros((rows, D), dtype=torch.float64)

    def start(self, state: dict[str, tuple[float, float]]) -> None:
        """Start the run-level state (shared=True only) from drafter -> (offset b, precision P) instead of the prior
        (0, k): a real run's state after its warm-up (parse_runcal_start). ConfigError for per-request offsets or a
        drafter the policy does not recalibrate."""
        if not self.shared:
            raise ConfigError(f"{RUNCAL_START_FLAG} starts the run-level recalibration (runcal=k); this policy's is "
                              "per request")
        for name, (b, P) in state.items():
            if name not in self.names:
                raise ConfigError(f"{RUNCAL_START_FLAG}: the policy recalibrates {', '.join(self.names)}, not {name}")
            i = self.names.index(name)
            self.b[0, i] = self.b_host[0, i] = float(b)
            self.P[0, i] = float(P)

    def _rows(self, reqs) -> torch.Tensor:
        idx = torch.as_tensor(reqs)
        return torch.zeros_like(idx) if self.shared else idx

    def offsets(self, reqs) -> tuple[dict, dict]:
        """(current, one step older) offsets of requests `reqs` (int64 [R]): name -> float64 [R]."""
        idx = self._rows(reqs)
        cur, old = self.b[idx], self.b_host[idx]
        return ({d: cur[:, i] for i, d in enumerate(self.names)}, {d: old[:, i] for i, d in enumerate(self.names)})

    def observe(self, reqs, chains: dict, acc: dict, evidence, admitted: dict | None = None) -> None:
        """After a step: requests `reqs` emitted `evidence` tokens [R]; chains: name -> (conf [R, K], len [R]) of
        the drafters that ran (absent: did not run, nothing observed); acc: name -> the leading tokens of that
        chain the target emits [R]; admitted (each chain's verified slots) is not used: the evidence rule above
        observes past them. The host's offsets take the values before this update (one step old)."""
        e = torch.as_tensor(evidence)
        if self.shared:
            self.b_host.copy_(self.b)
            for i, d in enumerate(self.names):
                if d in chains:
                    conf, length = chains[d]
                    self.b[:, i], self.P[:, i] = observe_shared(self.b[:, i], self.P[:, i], torch.as_tensor(conf),
                                                                torch.as_tensor(length), torch.as_tensor(acc[d]), e)
            return
        idx = torch.as_tensor(reqs)
        self.b_host[idx] = self.b[idx]
        for i, d in enumerate(self.names):
            if d not in chains:
                continue
            conf, length = chains[d]
            b, P = observe(self.b[idx, i], self.P[idx, i], torch.as_tensor(conf), torch.as_tensor(length),
                           torch.as_tensor(acc[d]), e)
            self.b[idx, i], self.P[idx, i] = b, P
