"""Model-based drafter (DSpark-like block drafter): synthetic chains from a profile, or recorded ones.

Synthetic acceptance model (a Gaussian copula with shared token difficulty), per request:
  every output token t has a difficulty Z_t ~ N(0, 1), shared by every chain that covers it;
  the chain drafted at output position i proposes block K tokens; its j-th token (j = 1..K) lands on
  t = i + j - 1 and is accepted, given tokens 1..j-1 were, iff
        X_ij = rho * Z_t + sqrt(1 - rho^2) * E_ij < theta_j(copy_t),   E_ij ~ N(0, 1)
  with theta_j(c) = Phi^-1(q_j(c)); q_j(c) = q1[c] * decay[c]^(j-1) is the conditional acceptance at depth j
  (a probability), c = copy_t = 1 on tokens the output copies from its context (the n-gram continuation
  at t is the emitted token, inside a match of at least `copy_min_ext` tokens; `tables.copy_mask`), else 0.
  copy_t is the truth about token t, so it may shape acceptance (the world: a drafter does accept more
  on copied spans) but the confidence head below never sees it.

Confidence head (causal): the chain drafted at i sees only prompt + output[:i]. It sees X_ij through
noise, W_ij = X_ij + sigma * N_ij, N_ij ~ N(0, 1); since X_ij ~ N(0, 1) a priori,
        X_ij | W_ij ~ N(mu, sd^2),   mu = W_ij / (1 + sigma^2),   sd = sqrt(sigma^2 / (1 + sigma^2)).
  It does not know copy_t; it knows a feature of the context, f_i = the bucket of ext_i (the n-gram
  drafter's match length at i extended backwards, in tokens, computed from tokens before i; buckets split
  at `copy_prior_edges`), and the prior pi_j(f) = P(copy_{i+j-1} = 1 | f_i = f) (`copy_prior`, fitted on
  general text by `sim.api.fit_profile`). X is independent of copy_t, so its posterior is the mixture
        c_ij = pi_j(f_i) * Phi((theta_j(1) - mu) / sd) + (1 - pi_j(f_i)) * Phi((theta_j(0) - mu) / sd),
  a probability. It is calibrated for P(token j accepted | W_ij, f_i); as the conditional acceptance given
  tokens 1..j-1 accepted it is approximate (copy status is correlated along a chain and pi_j is a
  marginal); `python -m sim.fit_profile` reports the resulting ECE. sigma sets the head's
  discrimination (AUC) and `conf_temperature` T distorts it, c' = sigmoid(logit(c) / T), to model a head
  before (T != 1) or after (T = 1) temperature scaling.
  Accepted length of chain i = number of leading accepted tokens (at most the remaining output).

Temperature > 0 (an approximation, documented): the same model with q scaled by `temp_scale ** temperature`.

Proposed tokens (`chain_tokens`): slot j of the chain drafted at position i proposes output[i + j] where
it is accepted (j < acc_len[i]) and a token different from the target's, output[i + j] + 1, at the first
rejected slot and after (-1 past the end of the output). The engine emits accepted model tokens from these
proposals, so an engine or table bug that over-states acceptance emits a wrong token, which its lossless
check catches (sim/engine/engine.py).

Recorded drafts (from a real engine, replayed exactly) use the sidecar format in docs/simulator.md (`load_recorded_drafts`):
one JSON object per request {"id", "model_conf": [[...K]...L], "model_acc": [...L]}. The sidecar carries no
token ids, so the proposed tokens of recorded chains are built from model_acc the same way: the lossless
check then verifies that the engine emits only tokens inside the recorded accepted prefixes, not the
recorded acceptance itself.
"""
from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import ndtr, ndtri

from sim.infra.errors import ConfigError
from sim.core.models import read_json_object
from sim.infra import paths

MODELS_DIR = paths.REPO / "models" / "drafters"


@dataclass(frozen=True)
class ModelDrafterProfile:
    """Synthetic DSpark-like drafter profile (see module docstring for the model)."""

    name: str
    block: int = 7
    q1: tuple[float, float] = (0.80, 0.97)        # conditional acceptance at depth 1: (normal, copied) tokens
    decay: tuple[float, float] = (0.985, 0.995)   # per-depth multiplicative decay: (normal, copied)
    rho: float = 0.7                               # weight of the shared token difficulty
    sigma: float = 0.8                             # confidence-head noise (higher = lower AUC)
    conf_temperature: float = 1.0                  # 1 = calibrated head
    copy_min_ext: int = 4                          # match length that marks a copied span
    temp_scale: float = 0.93                       # acceptance scale per unit of sampling temperature
    # The head's prior on copy status: bucket b of ext_i (tokens) is edges[b-1] <= ext_i < edges[b];
    # copy_prior[b][j] = pi_{j+1}(b). Empty = the head assumes no token is copied.
    copy_prior_edges: tuple[int, ...] = (1, 4, 8, 16, 32, 64)
    copy_prior: tuple[tuple[float, ...], ...] = ()
    cost_spec: str = "dspark-cost"  # the cost shape in models/drafters/ that prices this drafter's passes
    source: str = ""

    def __post_init__(self) -> None:
        for key in ("block", "copy_min_ext"):  # a float or a boolean here would index arrays
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"drafter profile {self.name}: {key} must be an integer, got {v!r}")
        if not isinstance(self.name, str):
            raise ConfigError(f"drafter profile: name must be a string, got {self.name!r}")
        if not 1 <= self.block <= 64:
            raise ConfigError(f"drafter profile {self.name}: block must be in 1..64, got {self.block}")
        for key in ("q1", "decay"):
            v = getattr(self, key)
            if not (isinstance(v, tuple) and len(v) == 2 and all(isinstance(x, (int, float)) for x in v)):
                raise ConfigError(f"drafter profile {self.name}: {key} must be two numbers [normal, copied], got {v!r}")
        for key in ("rho", "sigma", "conf_temperature", "temp_scale"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                raise ConfigError(f"drafter profile {self.name}: {key} must be a finite number, got {v!r}")
        for v in (*self.q1, *self.decay, self.temp_scale):
            if not 0.0 < v <= 1.0:
                raise ConfigError(f"drafter profile {self.name}: probabilities must be in (0, 1], got {v}")
        if not 0.0 <= self.rho < 1.0 or self.sigma <= 0 or self.conf_temperature <= 0:
            raise ConfigError(f"drafter profile {self.name}: need 0 <= rho < 1, sigma > 0, conf_temperature > 0")
        self._check_copy_prior()

    def _check_copy_prior(self) -> None:
        """copy_prior_edges: increasing ints >= 1; copy_prior: empty, or one row of `block` probabilities
        per bucket (len(edges) + 1 rows)."""
        e = self.copy_prior_edges
        if not (isinstance(e, tuple) and all(isinstance(x, int) and x >= 1 for x in e) and list(e) == sorted(set(e))):
            raise ConfigError(f"drafter profile {self.name}: copy_prior_edges must be increasing integers >= 1, got {e!r}")
        pi = self.copy_prior
        if pi == ():
            return
        ok = isinstance(pi, tuple) and len(pi) == len(e) + 1 and all(
            isinstance(r, tuple) and len(r) == self.block and all(isinstance(x, (int, float)) and 0.0 <= x <= 1.0 for x in r)
            for r in pi)
        if not ok:
            raise ConfigError(f"drafter profile {self.name}: copy_prior must be {len(e) + 1} rows (one per ext bucket) "
                              f"of {self.block} probabilities in [0, 1]")

    def q(self) -> np.ndarray:
        """q[c, j]: conditional acceptance at depth j+1 for copy flag c (array [2, block])."""
        j = np.arange(self.block)
        return np.stack([self.q1[c] * self.decay[c] ** j for c in (0, 1)]).clip(1e-6, 1 - 1e-6)

    def ext_bucket(self, ext: np.ndarray) -> np.ndarray:
        """Bucket index b of each extended match length (tokens): edges[b-1] <= ext < edges[b]."""
        return np.searchsorted(np.asarray(self.copy_prior_edges), np.asarray(ext), side="right")

    def copy_prob(self, ext: np.ndarray) -> np.ndarray:
        """pi[i, j]: the head's prior that token j+1 of the chain drafted at i is copied, given ext_i
        (array [len(ext), block]); zeros when the profile has no copy prior."""
        if not self.copy_prior:
            return np.zeros((len(ext), self.block))
        return np.asarray(self.copy_prior, dtype=np.float64)[self.ext_bucket(ext)]


def with_block(profile: ModelDrafterProfile, block: int) -> ModelDrafterProfile:
    """The same drafter proposing `block` tokens per chain (an EAGLE-style head run for K = block steps): q_j
    and the copy prior are per depth, so depths past the profile's block extend them (the copy prior's last
    column repeats) and a shorter block truncates them."""
    if block == profile.block:
        return profile
    prior = tuple(tuple(row[:block]) + (row[-1],) * max(0, block - len(row)) for row in profile.copy_prior)
    return dataclasses.replace(profile, block=int(block), copy_prior=prior)


def list_drafter_profiles() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.json") if not p.stem.endswith("-cost"))


def is_profile_path(name: str) -> bool:
    """A --drafter value names a file (it ends in .json or has a folder) rather than a profile in MODELS_DIR."""
    return name.endswith(".json") or "/" in name or "\\" in name


def load_drafter_profile(name: str) -> ModelDrafterProfile:
    """Load models/drafters/NAME.json, or a profile file when NAME is a path (ends in .json or has a folder,
    e.g. one written by `python -m sim.fit_profile --from-drafts ... --out`); unknown names raise
    ConfigError listing the known ones. NAME:K is that profile run for chains of K tokens (with_block; how
    --speculative-config's eagle methods choose num_speculative_tokens)."""
    if not is_profile_path(name) and ":" in name:
        base, _, k = name.rpartition(":")
        if not k.isdigit() or not 1 <= int(k) <= 64:
            raise ConfigError(f"drafter profile '{name}': the chain length after ':' must be an integer in 1..64")
        return with_block(load_drafter_profile(base), int(k))
    if is_profile_path(name):
        from sim.infra.inputs import check_regular

        path = Path(name)
        check_regular(path, "drafter profile")  # missing, a folder, a pipe, a device: named as what it is
    else:
        path = MODELS_DIR / f"{name}.json"
        if not path.exists() or name.endswith("-cost"):
            raise ConfigError(f"unknown drafter profile '{name}'; choose one of: {', '.join(list_drafter_profiles())}"
                              " (or a path to a profile .json)")
    raw = read_json_object(path, "drafter profile")
    known = ModelDrafterProfile.__dataclass_fields__
    unknown = sorted(k for k in raw if k not in known)
    if unknown or not {"name", "block", "q1", "decay"} <= set(raw):
        # e.g. an LLM's or a cost profile's file given as --drafter: refuse it rather than run on the defaults
        raise ConfigError(f"{path}: not a drafter profile (" + (f"unknown keys {', '.join(unknown[:5])}" if unknown else
                          f"missing {', '.join(sorted({'name', 'block', 'q1', 'decay'} - set(raw)))}") + ")")
    fields = {k: _tuples(v) for k, v in raw.items() if k in known}
    try:
        return ModelDrafterProfile(**fields)
    except TypeError as exc:  # a missing or mistyped field
        raise ConfigError(f"{path}: bad drafter profile: {exc}") from None


def _tuples(v):
    """JSON lists -> (nested) tuples, so that profiles stay hashable."""
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


@dataclass
class ModelChains:
    """Model-drafter chains at every output position of one request: conf [L, K] and acc_len [L]; where a real
    engine recorded its decisions too (a sidecar's `chosen` / `skipped`), chosen [L] (int8: the chain id it published
    at that position, -1 where none was recorded) and skipped [L] (bool: its model pass was skipped there)."""

    conf: np.ndarray
    acc_len: np.ndarray
    chosen: np.ndarray | None = None
    skipped: np.ndarray | None = None


def load_recorded_drafts(path: str, block: int | None = None) -> dict[str, ModelChains]:
    """Read a recorded-drafts sidecar (JSONL, one request per line):
        {"id": "r1", "model_conf": [[c_1, ..., c_K], ...one row per output position...],
         "model_acc": [a_0, a_1, ...one accepted length per output position...]}
    model_conf[i][j] is the confidence the real drafter gave token j+1 of the chain it drafted at output
    position i; model_acc[i] is how many of that chain's tokens the target accepted. Optional, the engine's
    decisions (a vLLM run's plugin, replayed by hybrid-vllm: sim/core/policies/base.py Replay):
    "chosen": [the chain id published at each position (1 the model chain, 2 the n-gram chain), -1 where none was
    recorded], "skipped": [1 where the model pass was skipped at that position, else 0]. Errors name the
    file, line and field (TraceError)."""
    from sim.infra.errors import TraceError
    from sim.core.trace.loader import file_lines, check_trace_file, decode_json_line

    out: dict[str, ModelChains] = {}
    check_trace_file(Path(path), str(path))
    for ln, raw in file_lines(Path(path), str(path)):  # one line at a time, with the loader's located errors
        obj = decode_json_line(raw, str(path), ln)
        if not isinstance(obj, dict):
            raise TraceError("expected a JSON object", path, ln)
        rid = obj.get("id")
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            raise TraceError("missing or not a string", path, ln, "id")
        rid = str(rid)
        if rid in out:
            raise TraceError(f"duplicate id '{rid}'", path, ln, "id")
        try:
            conf = np.asarray(obj["model_conf"], dtype=np.float64)
            acc = np.asarray(obj["model_acc"], dtype=np.float64)
        except KeyError as exc:
            raise TraceError("missing", path, ln, exc.args[0]) from None
        except (TypeError, ValueError):
            raise TraceError("must be numbers (a list of lists for model_conf)", path, ln, "model_conf") from None
        if conf.ndim != 2 or (block is not None and conf.shape[1] != block):
            raise TraceError(f"must be a [positions x {block or 'K'}] list of lists", path, ln, "model_conf")
        if not np.all(np.isfinite(conf)) or conf.min(initial=0) < 0 or conf.max(initial=0) > 1:
            raise TraceError("confidences must be finite and in [0, 1]", path, ln, "model_conf")
        if acc.ndim != 1 or len(acc) != len(conf) or not np.all(np.isfinite(acc)) or np.any(acc < 0) \
                or np.any(acc != np.round(acc)) or np.any(acc > conf.shape[1]):
            raise TraceError("must be one integer in [0, K] per row of model_conf", path, ln, "model_acc")
        rec = {k: _decisions(obj, k, len(conf), path, ln) for k in ("chosen", "skipped")}
        if (rec["chosen"] is None) != (rec["skipped"] is None):
            raise TraceError("'chosen' and 'skipped' come together", path, ln, "chosen")
        out[rid] = ModelChains(conf=conf.astype(np.float32), acc_len=acc.astype(np.int64),
                               chosen=None if rec["chosen"] is None else rec["chosen"].astype(np.int8),
                               skipped=None if rec["skipped"] is None else rec["skipped"].astype(bool))
    if not out:  # an empty sidecar would silently fall back to the synthetic profile
        raise TraceError("no recorded drafts in the file (it is empty)", path)
    return out


def _decisions(obj: dict, key: str, n: int, path, ln: int) -> np.ndarray | None:
    """A sidecar line's optional per-position decisions (`chosen`: -1 or a chain id in 1..127; `skipped`: 0 or 1),
    one integer per row of model_conf; None when absent."""
    from sim.infra.errors import TraceError

    if key not in obj:
        return None
    lo, hi = (-1, 127) if key == "chosen" else (0, 1)
    try:
        a = np.asarray(obj[key], dtype=np.float64)
    except (TypeError, ValueError):
        a = None
    if a is None or a.ndim != 1 or len(a) != n or not np.all(np.isfinite(a)) or np.any(a != np.round(a)) \
            or np.any((a < lo) | (a > hi)) or (key == "chosen" and np.any(a == 0)):
        what = "-1 or a chain id (1 model, 2 n-gram)" if key == "chosen" else "0 or 1"
        raise TraceError(f"must be one integer per row of model_conf, each {what}", path, ln, key)
    return a.astype(np.int64)


NO_TOKEN = -1  # a chain slot past the end of the output: there is no target token to propose


def chain_tokens(output: np.ndarray, acc_len: np.ndarray, block: int) -> np.ndarray:
    """Tokens the model drafter proposed at every output position, [L, block] int32.

    Slot j of the chain drafted at position i lands on output token t = i + j and proposes
        output[t]        if j < acc_len[i]        (accepted: the target's own token)
        output[t] + 1    if j >= acc_len[i], t < L (rejected: differs from the target's by construction)
        NO_TOKEN         if t >= L                 (past the end of the output)
    so the number of leading slots equal to output[i:] (greedy verification) is exactly min(acc_len[i], L - i)."""
    out = np.asarray(output, dtype=np.int64)
    L = len(out)
    t = np.arange(L)[:, None] + np.arange(block)[None, :]
    inside = t < L
    target = np.where(inside, out[np.minimum(t, max(L - 1, 0))] if L else 0, NO_TOKEN)
    accepted = np.arange(block)[None, :] < np.asarray(acc_len)[:, None]
    tok = np.where(accepted | ~inside, target, target + 1)
    return tok.astype(np.int32)


def request_seed(seed: int, request_id: str) -> np.random.Generator:
    """A generator that depends only on (seed, request id), so draws do not depend on trace order."""
    digest = hashlib.sha256(f"{seed}:{request_id}".encode()).digest()
    return np.random.default_rng(np.frombuffer(digest[:16], dtype=np.uint64))


def synth_model_chains(
    profile: ModelDrafterProfile,
    copy_mask: np.ndarray,
    rng: np.random.Generator,
    temperature: float = 0.0,
    *,
    match_ext: np.ndarray,
) -> ModelChains:
    """Draw the model drafter's chains for one request of L = len(copy_mask) output tokens.

    copy_mask[t]: whether output token t is copied (the truth; shapes acceptance only).
    match_ext[i]: the n-gram drafter's extended match length at position i (tokens; from the context
    before i), the head's only view of copying. Draws depend only on rng and L."""
    L = len(copy_mask)
    K = profile.block
    q = profile.q()
    if temperature > 0:
        q = q * profile.temp_scale**temperature
    theta = ndtri(q)  # [2, K]: thresholds for normal and copied tokens
    Z = rng.standard_normal(L + K)
    E = rng.standard_normal((L, K))
    noise = rng.standard_normal((L, K))
    t = np.arange(L)[:, None] + np.arange(K)[None, :]  # token each slot lands on
    copy = np.zeros(L + K, dtype=np.int64)
    copy[:L] = copy_mask.astype(np.int64)
    X = profile.rho * Z[t] + np.sqrt(1 - profile.rho**2) * E
    accept = (X < theta[copy[t], np.arange(K)[None, :]]) & (t < L)
    acc_len = np.cumprod(accept, axis=1).sum(axis=1)
    conf = head_confidence(theta, X + profile.sigma * noise, profile.sigma, profile.copy_prob(match_ext))
    if profile.conf_temperature != 1.0:
        conf = _distort(conf, profile.conf_temperature)
    return ModelChains(conf=conf.astype(np.float32), acc_len=acc_len.astype(np.int64))


def head_confidence(theta: np.ndarray, W: np.ndarray, sigma: float, pi: np.ndarray) -> np.ndarray:
    """c_ij = pi_ij Phi((theta_j(1) - mu) / sd) + (1 - pi_ij) Phi((theta_j(0) - mu) / sd), the posterior
    acceptance probability given the noisy observation W (mu, sd: posterior of X | W, module docstring).
    theta [2, K] (standard-normal units), W and pi [L, K]; returns probabilities [L, K]."""
    s2 = sigma**2
    mu = W / (1 + s2)
    sd = np.sqrt(s2 / (1 + s2))
    return pi * ndtr((theta[1] - mu) / sd) + (1 - pi) * ndtr((theta[0] - mu) / sd)


def _distort(conf: np.ndarray, temperature: float) -> np.ndarray:
    """sigmoid(logit(c) / T): an over- (T < 1) or under-confident (T > 1) head."""
    c = conf.clip(1e-6, 1 - 1e-6)
    return 1.0 / (1.0 + np.exp(-(np.log(c) - np.log1p(-c)) / temperature))
