"""Calibrated acceptance estimates for the n-gram drafter, fitted once on general text.

An n-gram chain has no confidence of its own. The calibrator g maps features of a proposal at output
position i and chain depth j (1-based) to the conditional acceptance probability
    p_ij = P(token j accepted | tokens 1..j-1 accepted) = sigmoid(w . phi(i, j)),
a logistic model on smooth features (so sparse regions borrow strength from their neighbours):
    phi = [1, h_1(log1p ext), ..., h_m(log1p ext), log j, log1p(ext) * log j, n / n_max, in_prompt,
           log1p occ, prev_hit, log r_all, log r_recent, log r_all * log1p ext, log r_recent * log1p ext]
where h_k are hinge functions max(0, x - knot_k) over a fixed knot grid (a piecewise-linear curve in the
log of the match length), ext is the match length extended backwards past n_max, occ how often the
suffix occurred before, in_prompt whether the copy source lies in the prompt, and prev_hit whether the
n-gram continuation at the previous output position was the token actually emitted, and r_all / r_recent
the share of earlier output positions (all of them, smoothed; the last 32) where it was (`copy_history`).

Censoring: depth j is observed only when tokens 1..j-1 were accepted, so the fit uses exactly the rows
{(i, j) : j <= length_i and acc_i >= j - 1} with label 1{acc_i >= j} (a discrete-time hazard model); the
survival a_ij = prod_{l <= j} p_il then estimates P(acc_i >= j).

Quality is reported as ECE of the prefix survival (15 equal-width bins, weighted by count) against the
label 1{acc_i >= j} over all slots j <= length_i, and the AUC of the same.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.special import expit

from sim.core.drafters.ngram import NgramConfig, NgramTable
from sim.infra.errors import ConfigError
from sim.infra import paths

CALIBRATOR_DIR = paths.MODELS / "calibrators"  # a checkout's models/, or the copy an installed wheel ships
DEFAULT_CALIBRATOR = "ngram-general"
FEATURE_SET = "hinge8+history2"
KNOTS = (0.0, 1.0, 1.7, 2.3, 2.9, 3.5, 4.2, 5.0)  # in log1p(ext): ext ~ 0, 2, 4.5, 9, 17, 32, 66, 147


def prev_hit(table: NgramTable) -> np.ndarray:
    """Whether the n-gram continuation at the previous output position was the emitted token."""
    ph = np.zeros(len(table), dtype=np.float64)
    if len(table) > 1:
        ph[1:] = table.acc_len[:-1] >= 1
    return ph


def copy_history(table: NgramTable, window: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """How much of the output so far continued an n-gram match: over all earlier output positions
    (smoothed, (hits + 1) / (i + 2)) and over the last `window` of them. A request that has been copying
    its input (an edit, a rewrite) keeps copying; both are known to the engine before the step."""
    hit = (table.acc_len >= 1).astype(np.float64)
    c = np.concatenate([[0.0], np.cumsum(hit)])  # c[i] = hits before position i
    i = np.arange(len(table))
    overall = (c[i] + 1.0) / (i + 2.0)
    lo = np.maximum(i - window, 0)
    recent = (c[i] - c[lo] + 0.5) / (i - lo + 1.0)
    return overall, recent


def _columns(le, lj, n_frac, in_prompt, locc, prev_hit, lo, lr) -> list:
    """The columns of phi from the features' logs, with operators and `.clip` only, so that the same lines
    build the design matrix from numpy arrays (offline: fitting, draft tables) and from torch tensors
    (live: `conditional_torch`, the vLLM plugin). Inputs broadcast against each other."""
    cols = [le * 0.0 + 1.0]
    cols += [(le - k).clip(min=0.0) for k in KNOTS]
    cols += [lj, le * lj, n_frac, in_prompt, locc, prev_hit]
    cols += [lo, lr, lo * le, lr * le]
    return cols


def features(table: NgramTable, cfg: NgramConfig, depth: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Design matrix phi for the slots (rows[s], depth[s]) of one request; depth is 1-based."""
    le = np.log1p(table.ext[rows].astype(np.float64))
    lj = np.log(depth.astype(np.float64))
    overall, recent = copy_history(table)
    cols = _columns(le, lj, table.n[rows] / cfg.n_max, table.in_prompt[rows].astype(np.float64),
                    np.log1p(table.occ[rows].astype(np.float64)), prev_hit(table)[rows],
                    np.log(overall[rows]), np.log(recent[rows]))
    return np.stack(cols, axis=1)


def conditional_torch(weights: torch.Tensor, ext: torch.Tensor, n: torch.Tensor, in_prompt: torch.Tensor,
                      occ: torch.Tensor, prev_hit: torch.Tensor, overall: torch.Tensor, recent: torch.Tensor,
                      length: torch.Tensor, k: int, n_max: int) -> torch.Tensor:
    """`NgramCalibrator.conditional` for a batch of live proposals, in torch on their device, host-sync free.

    One proposal per row r (all [R]): ext, n, occ (int), in_prompt and prev_hit (bool or 0/1), overall and
    recent (the copy-history shares of `copy_history`, in (0, 1]), length (chain length 0..k). Returns
    p[r, j-1] = sigmoid(w . phi(r, j)) for depth j = 1..k, 0 where j > length[r]; float32 [R, k].
    weights: float64 [F] on the same device. Same columns as `features` (`_columns`)."""
    dev = ext.device
    f64 = torch.float64
    le = torch.log1p(ext.to(f64))[:, None]
    depth = torch.arange(1, k + 1, device=dev)
    lj = torch.log(depth.to(f64))[None, :]
    col = lambda x: x.to(f64)[:, None]  # noqa: E731
    cols = _columns(le, lj, col(n) / n_max, col(in_prompt), torch.log1p(col(occ)), col(prev_hit),
                    torch.log(col(overall)), torch.log(col(recent)))
    X = torch.stack(torch.broadcast_tensors(*cols), dim=-1)  # [R, k, F]
    p = torch.sigmoid(X @ weights.to(f64))
    return (p * (depth[None, :] <= length[:, None])).to(torch.float32)


def calibrator_slots(table: NgramTable) -> tuple[np.ndarray, np.ndarray]:
    """All (row, depth) slot pairs with depth <= chain length."""
    rows = np.repeat(np.arange(len(table)), table.length)
    starts = np.repeat(np.cumsum(table.length) - table.length, table.length)
    depth = np.arange(len(rows)) - starts + 1
    return rows, depth


@dataclass
class NgramCalibrator:
    """A fitted calibrator: weights w over the features above, for a drafter config."""

    weights: np.ndarray
    cfg: NgramConfig
    fitted_on: str = ""

    def conditional(self, table: NgramTable, k: int | None = None) -> np.ndarray:
        """p[i, j-1] for every output position i and depth j <= k (0 beyond the chain length); float32 [L, k]."""
        k = k or self.cfg.k
        out = np.zeros((len(table), k), dtype=np.float32)
        rows, depth = calibrator_slots(table)
        keep = depth <= k
        rows, depth = rows[keep], depth[keep]
        if len(rows):
            out[rows, depth - 1] = expit(features(table, self.cfg, depth, rows) @ self.weights)
        return out

    def save(self, path: Path, overwrite: bool = True) -> None:
        """Write the calibrator whole (a temporary sibling renamed into place); an existing file is replaced
        only when overwrite."""
        from sim.infra.cli import write_whole

        write_whole(Path(path), json.dumps({
            "kind": "logistic-hinge",
            "features": FEATURE_SET,
            "knots": list(KNOTS),
            "weights": [round(float(w), 8) for w in self.weights],
            "ngram": {"n_min": self.cfg.n_min, "n_max": self.cfg.n_max, "k": self.cfg.k, "ext_max": self.cfg.ext_max},
            "fitted_on": self.fitted_on,
        }, indent=1) + "\n", overwrite=overwrite)

    @classmethod
    def load(cls, name_or_path: str | Path = DEFAULT_CALIBRATOR) -> "NgramCalibrator":
        p = calibrator_path(name_or_path)
        from sim.core.models import read_json_object  # lazy: the vLLM plugin loads this module, not the model specs

        raw = read_json_object(p, "n-gram calibrator")
        if tuple(raw.get("knots", ())) != KNOTS or raw.get("features") != FEATURE_SET:
            raise ConfigError(f"calibrator {p} was fitted with another feature set; refit with python -m sim.calibrate")
        try:
            w = np.asarray(raw["weights"], dtype=np.float64)
            cfg = NgramConfig(**raw["ngram"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{p}: bad calibrator file ({exc.__class__.__name__}: {exc})") from None
        if w.shape != (len(KNOTS) + 11,) or not np.all(np.isfinite(w)):
            raise ConfigError(f"{p}: 'weights' must be {len(KNOTS) + 11} finite numbers")
        return cls(w, cfg, raw.get("fitted_on", ""))


def calibrator_path(name_or_path: str | Path) -> Path:
    """The file of an n-gram calibrator: a name (no suffix) under CALIBRATOR_DIR, else a path as given;
    ConfigError naming the known calibrators when it does not exist."""
    from sim.infra.inputs import is_input

    p = Path(name_or_path)
    if not p.suffix and not is_input(p):  # a name; a path on disk (even a pipe, refused when read) stays a path
        p = CALIBRATOR_DIR / f"{name_or_path}.json"
    if not p.exists():
        known = ", ".join(sorted(x.stem for x in CALIBRATOR_DIR.glob("*.json")))
        raise ConfigError(f"unknown n-gram calibrator '{name_or_path}'; choose one of: {known or '(none fitted yet)'} "
                          f"(in {CALIBRATOR_DIR}), or a JSON file")
    return p


def censored_rows(tables: list[NgramTable], cfg: NgramConfig) -> tuple[np.ndarray, np.ndarray]:
    """Design matrix and labels of every observed slot (the censoring rule in the module docstring)."""
    Xs, ys = [], []
    for tab in tables:
        rows, depth = calibrator_slots(tab)
        obs = tab.acc_len[rows] >= depth - 1
        rows, depth = rows[obs], depth[obs]
        if len(rows) == 0:
            continue
        Xs.append(features(tab, cfg, depth, rows))
        ys.append((tab.acc_len[rows] >= depth).astype(np.float64))
    if not Xs:
        raise ConfigError("no n-gram proposals to fit the calibrator on")
    return np.concatenate(Xs), np.concatenate(ys)


def fit_calibrator(tables: list[NgramTable], cfg: NgramConfig, l2: float = 1e-3, fitted_on: str = "") -> NgramCalibrator:
    """Maximum-likelihood logistic fit (L-BFGS, small ridge) on the censored slots of `tables`."""
    X, y = censored_rows(tables, cfg)
    n = len(y)

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        z = X @ w
        p = expit(z)
        nll = np.sum(np.logaddexp(0.0, z) - y * z) / n + 0.5 * l2 * np.dot(w[1:], w[1:])
        g = X.T @ (p - y) / n
        g[1:] += l2 * w[1:]
        return nll, g

    from scipy.optimize import minimize  # here, not at the top: 0.9 s of import only fitting needs

    res = minimize(loss, np.zeros(X.shape[1]), jac=True, method="L-BFGS-B", options={"maxiter": 500})
    return NgramCalibrator(res.x, cfg, fitted_on)


def survival_labels(tables: list[NgramTable], conds: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Predicted prefix survival a_ij and label 1{acc_i >= j} for every slot j <= length_i."""
    preds, labels = [], []
    for tab, p in zip(tables, conds):
        surv = np.cumprod(p.astype(np.float64), axis=1)
        rows, depth = calibrator_slots(tab)
        keep = depth <= p.shape[1]
        rows, depth = rows[keep], depth[keep]
        preds.append(surv[rows, depth - 1])
        labels.append((tab.acc_len[rows] >= depth).astype(np.float64))
    return np.concatenate(preds), np.concatenate(labels)


def ece(pred: np.ndarray, label: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error: sum over equal-width bins of (share of slots) x |mean pred - mean label|."""
    if len(pred) == 0:
        return float("nan")
    b = np.minimum((pred * bins).astype(np.int64), bins - 1)
    cnt = np.bincount(b, minlength=bins)
    sp = np.bincount(b, weights=pred, minlength=bins)
    sl = np.bincount(b, weights=label, minlength=bins)
    nz = cnt > 0
    return float(np.sum(np.abs(sp[nz] - sl[nz])) / len(pred))


def auc(pred: np.ndarray, label: np.ndarray) -> float:
    """Area under the ROC curve (rank statistic with ties averaged)."""
    from scipy.stats import rankdata

    pos = label > 0.5
    n1, n0 = int(pos.sum()), int((~pos).sum())
    if n1 == 0 or n0 == 0:
        return float("nan")
    r = rankdata(pred)
    return float((r[pos].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
