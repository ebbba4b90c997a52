"""vLLM's online acceptance estimator, simulated: adaptive verification's confidences for a model drafter without a
confidence head (EAGLE, EAGLE-3), learnt while serving. The policy `adaptive:online` runs vLLM's adaptive verification
(sim/core/policies/adaptive.py) on these confidences instead of a trained head's.

What vLLM does (0.32.0 and 0.33.0 ship the same estimator: vllm/v1/worker/gpu/spec_decode/acceptance_estimator.py,
OnlineAcceptanceEstimator; the speculator builds it when enable_adaptive_verification is on and the drafter has no
trained confidence head). Model, per draft position k = 0..K-1 of a chain:
    p_k = sigmoid(w * f_k + b_k),   f_k = clamp(logit(q_k), -40, 40)          [probability; f in logits]
q_k the largest probability of the drafter's distribution at position k (after temperature), so f scores the draft
distribution, not the drawn token; one slope w shared by every position, one intercept b_k per position.
Cold start w = 0.5, b_k = -0.2 (vLLM's median over the models it was tuned on).

Evidence, after each step, from the requests that verified drafts: a request that admitted a_r slots of which
m_r = (accepted drafts) were accepted observes its positions k < min(m_r + 1, a_r) -- the accepted ones (y = 1) and
the first rejected one if it was verified (y = 0); slots that adaptive verification trimmed are never observed. Each
observation adds, at its position k, with the prediction p made when the chain was drafted (the current
coefficients: they change only at a refit) and weight u = p (1 - p), residual r = y - p:
    H_ww += u f^2   H_wb[k] += u f   H_bb[k] += u   g_w += r f   g_b[k] += r   n[k] += 1
(the Newton / IRLS statistics of the Bernoulli log-likelihood in theta = (w, b_0..b_{K-1}): X^T W X, an arrowhead
matrix, and X^T (y - p)). Refit every REFIT_INTERVAL = 100 steps (vLLM's): one damped Newton step of the ridge
system (X^T W X + lambda I) dtheta = X^T (y - p), lambda = RIDGE = 1e-3, solved through the arrowhead's Schur
complement, C_k = H_bb[k] + lambda:
    dw   = (g_w - sum_k H_wb[k] g_b[k] / C_k) / (H_ww + lambda - sum_k H_wb[k]^2 / C_k)
    dw  *= N / (N + D)            N = sum_k n[k], D = DAMPING = 50 observations (vLLM's): half a step at N = D;
                                  dw = 0 where it is NaN or would make w negative
    db_k = (g_b[k] - H_wb[k] dw) / C_k * n[k] / (n[k] + D)           (0 where NaN)
then the statistics start afresh. So a position seen D times in a round moves half a Newton step; an unseen one
does not move (n = 0).

What the simulator uses as q. A drafter profile (sim/core/drafters/model.py) carries no draft distribution, only
each slot's confidence c, the synthetic head's calibrated acceptance probability given a noisy view of the slot's
difficulty; the simulator takes q = c (so f = logit c), the one per-slot score it has. A calibrated c is reproduced
by w = 1, b_k = 0; the estimator starts at vLLM's cold start and learns the mapping from the run's outcomes. Two
caveats, both in the estimator's favour: logit(max q) of a real EAGLE head ranks acceptance less sharply than the
profile's c (whose AUC the profile's sigma sets), and a real q is not calibrated at all.

State: one estimator per run (vLLM keeps one per worker, shared by every request), float64 (vLLM: float32): the
coefficients [1 + K] and the round's statistics [6, K]; the steps counted since the last refit are a host integer
(as vLLM's). Everything else is batched torch on the tensors' device with no host synchronisation: no .item(), no
data-dependent shape, NaN and sign guards as torch.where. The engine keeps the state (sim/engine/engine.py,
Engine.recal, made by Policy.online_state) and hands the policy the coefficients as of the previous step's outcomes
(StepBatch.estimator["dspark"]) and one step older (HostView.estimator, StepBatch.stale_estimator), as it hands
recalibration's offsets (sim/core/drafters/recalibration.py); `estimated` turns a view's model confidences into the
predictions.
The simulator counts decode steps (vLLM counts every step that samples, pure prefills included).
"""
from __future__ import annotations

import dataclasses

import torch

REFIT_INTERVAL = 100  # steps between refits (vLLM's OnlineAcceptanceEstimator.REFIT_INTERVAL)
DAMPING = 50.0        # observations that make half a Newton step (vLLM's DAMPING_OBSERVATIONS)
RIDGE = 1e-3          # lambda of the ridge on the Newton system (vLLM's L2)
INIT_SLOPE, INIT_BIAS = 0.5, -0.2  # vLLM's cold start
MAX_LOG_ODDS = 40.0   # |f| clamp [logits]
DRAFTER = "dspark"    # the model drafter's registered name: the profile stands for the EAGLE head
F64 = torch.float64


def cold_start(k: int, device=None) -> torch.Tensor:
    """The coefficients (w, b_0..b_{k-1}) before any refit, float64 [1 + k]."""
    out = torch.full((1 + k,), INIT_BIAS, dtype=F64, device=device)
    out[0] = INIT_SLOPE
    return out


def feature(conf: torch.Tensor) -> torch.Tensor:
    """f = clamp(logit q, -40, 40) with q = the confidences (module docstring), float64 [..., K]."""
    return torch.logit(conf.to(F64)).clamp(-MAX_LOG_ODDS, MAX_LOG_ODDS)


def predict(conf: torch.Tensor, coef: torch.Tensor | None) -> torch.Tensor:
    """p_k = sigmoid(w f_k + b_k) for every slot of conf [R, K] (coef [1 + K'], K' >= K; None: the cold start);
    conf's dtype."""
    k = conf.shape[-1]
    c = cold_start(k, conf.device) if coef is None else coef.to(device=conf.device, dtype=F64)
    return torch.sigmoid(c[0] * feature(conf) + c[1:1 + k]).to(conf.dtype)


def estimated(view):
    """The StepBatch or HostView `view` with its model-chain confidences replaced by the estimator's predictions
    from the coefficients it carries (view.estimator[DRAFTER]; absent: the cold start), `estimator` emptied. A
    StepBatch's current and stale chains are both predicted with its current coefficients; its HostView (host_view)
    carries the older ones, from which the host plans."""
    coef = view.estimator.get(DRAFTER)
    conf, length = view.stale_chains[DRAFTER]
    fix = dict(stale_chains={**view.stale_chains, DRAFTER: (predict(conf, coef), length)}, estimator={})
    if hasattr(view, "chains"):  # a StepBatch: the current chain too
        conf, length = view.chains[DRAFTER]
        fix["chains"] = {**view.chains, DRAFTER: (predict(conf, coef), length)}
    return dataclasses.replace(view, **fix)


def statistics(coef: torch.Tensor, conf: torch.Tensor, admitted: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """One step's Newton statistics (module docstring) of chains conf [R, K] that admitted [R] slots of which
    accepted [R] were accepted: float64 [6, K], rows H_ww (per position, summed at the refit), H_wb, H_bb, g_w
    (per position), g_b, n."""
    k = conf.shape[-1]
    f = feature(conf)
    p = torch.sigmoid(coef[0] * f + coef[1:1 + k])
    j = torch.arange(k, device=conf.device)[None, :]
    acc = torch.minimum(accepted, admitted)[:, None]
    seen = ((j < acc + 1) & (j < admitted[:, None])).to(F64)
    u = p * (1.0 - p) * seen
    r = ((j < acc).to(F64) - p) * seen
    return torch.stack([(u * f * f).sum(0), (u * f).sum(0), u.sum(0), (r * f).sum(0), r.sum(0), seen.sum(0)])


def refit(coef: torch.Tensor, stats: torch.Tensor) -> torch.Tensor:
    """One damped Newton step of the ridge system from a round's statistics (module docstring): new coefficients,
    float64 [1 + K]."""
    h_ww, h_wb, h_bb, g_w, g_b, n = stats
    c = h_bb + RIDGE
    dw = (g_w.sum() - (h_wb * g_b / c).sum()) / (h_ww.sum() + RIDGE - (h_wb * h_wb / c).sum())
    total = n.sum()
    dw = dw * total / (total + DAMPING)
    dw = torch.where(torch.isnan(dw) | (coef[0] + dw < 0.0), torch.zeros_like(dw), dw)
    db = (g_b - h_wb * dw) / c * n / (n + DAMPING)
    db = torch.where(torch.isnan(db), torch.zeros_like(db), db)
    return torch.cat([(coef[0] + dw).reshape(1), coef[1:] + db])


class EstimatorState:
    """The engine's state of the estimator for one run (module docstring), with RecalState's interface
    (sim/core/drafters/recalibration.py): `offsets` hands the policy the coefficients, `observe` takes a step's
    outcomes. names: the drafters it serves (the model drafter only)."""

    field = "estimator"  # the StepBatch field its coefficients travel in (StepBatch.estimator)

    def __init__(self, k: int, interval: int = REFIT_INTERVAL):
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise ValueError(f"refit interval must be an integer >= 1, got {interval!r}")
        self.names, self.k, self.interval = (DRAFTER,), int(k), interval
        self.coef = cold_start(self.k)
        self.coef_host = self.coef.clone()
        self.stats = torch.zeros((6, self.k), dtype=F64)
        self.steps = 0  # since the last refit (host-known, as vLLM's counter)
        self.refits = 0

    def offsets(self, reqs) -> tuple[dict, dict]:
        """(current, one step older) coefficients, {DRAFTER: float64 [1 + K]}: one set for every request."""
        return {DRAFTER: self.coef}, {DRAFTER: self.coef_host}

    def observe(self, reqs, chains: dict, acc: dict, evidence, admitted: dict | None = None) -> None:
        """After a decode step: chains: name -> (conf [R, K], len [R]) of the drafters that ran; acc: name -> the
        leading tokens of that chain the target emits [R]; admitted: name -> the chain's slots verified this step
        [R] (0 where another chain was verified). `evidence` (the tokens emitted) is recalibration's, unused here:
        the estimator observes verified slots only. The older coefficients take the values before a refit."""
        self.coef_host = self.coef
        if DRAFTER in chains and admitted is not None:
            conf, _ = chains[DRAFTER]
            conf = torch.as_tensor(conf)
            self.stats = self.stats + statistics(self.coef, conf[:, :self.k], torch.as_tensor(admitted[DRAFTER]),
                                                 torch.as_tensor(acc[DRAFTER]))
        self.steps += 1
        if self.steps >= self.interval:
            self.coef = refit(self.coef, self.stats)
            self.stats = torch.zeros_like(self.stats)
            self.steps = 0
            self.refits += 1
