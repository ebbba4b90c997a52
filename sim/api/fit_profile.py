"""Fit the synthetic DSpark profile on general text (or to recorded drafts); check it against the published figures.

    python -m sim.fit_profile [--write] [--limit N]
    python -m sim.fit_profile --from-drafts FILE --trace TRACE [--block K] [--limit N]
                                       [--profile BASE] [--name NAME] [--out PATH] [--force]

Fitting uses traces/general.jsonl only; traces/chat.jsonl and traces/codeedit.jsonl are evaluation
traces: their numbers are measured and printed, never fed back into a knob. With --write:
  copy_prior   pi_j(f) = P(token i+j-1 copied | ext bucket f at i), counted on all of general.jsonl
               (smoothed (copies + 0.5) / (positions + 1));
  q1[copied]   an assumption from the published code figures, no trace: a stream of only copied tokens
               gets tau = top of the published code range (5.5), solved in closed form,
               tau = 1 + sum_{j=1..K} prod_{l<=j} q1 * decay^(l-1);
  q1[normal]   bisected so the simulator's tau on general.jsonl hits the middle of the published chat
               range (general text is chat-like ShareGPT, disjoint from chat.jsonl);
  sigma        bisected so the depth-1 confidence AUC on general.jsonl hits the middle of the published
               raw-head range 0.81-0.90;
  decay, rho, copy_min_ext, temp_scale   kept (assumptions: a tau target does not identify them).
Then it rewrites models/drafters/dspark-qwen3-b7.json (including its `source` text).

Measured with the simulator itself (`model-fixed:7`, batch size 4): tau = emitted tokens (accepted +
bonus) per request-step; AUC of the depth-1 confidence against 1{token 1 accepted}; ECE (15 bins) of the
prefix survival prod_{l<=j} c_il against 1{acc_i >= j} over every slot j that lies inside the output.

--from-drafts FILE --trace TRACE: fit the profile to recorded model drafts (a sidecar, docs/simulator.md
"Recorded drafts": per request, model_conf [L x K] and model_acc [L]) on the trace they were recorded on
(TRACE needs the token ids, or text that tokenizes to them: the copy classification reads the tokens).
Only the sidecar's requests are used (the first N of TRACE with --limit N, as in `sim.api.run --limit`; every
sidecar id must be among them). Knobs, from the recorded drafts only:
  copy c_t     copy_mask(ngram_tables(prompt + output), copy_min_ext): token t continues an exact copy,
               the classification the profile itself uses (`fit_copy_prior`).
  counts       for depth j = 1..K and class c, over chains i whose slot j lands inside the output
               (t = i + j - 1 < L) with copy_t = c:  n_j(c) = #{acc_i >= j - 1},  a_j(c) = #{acc_i >= j}:
               the recorded conditional acceptance at depth j is a_j(c) / n_j(c).
  model        in `synth_model_chains` the j-th token of chain i is accepted iff X_ij < theta_j(copy_t) with
               X_ij ~ N(0, 1); within one chain the X_ij sit on distinct tokens (distinct Z_t, independent
               E_ij), so given copy_t = c and tokens 1..j-1 accepted, token j is accepted with probability
               exactly q1[c] * decay[c]^(j-1), whatever rho, sigma and the copy prior are (rho only couples
               chains that overlap, sigma and the prior only shape the confidences).
  q1[c]        = a_1(c) / n_1(c), the depth-1 acceptance of class c: closed form (the maximum-likelihood
               estimate; depth-1 outcomes are independent across positions, each on its own token, so its
               standard error is sqrt(q1 (1 - q1) / n_1(c))). The knob is the chance that the drafter's first
               token is right on a copied (c = 1) or normal (c = 0) output token.
  decay[c]     given q1[c], the maximum-likelihood d of the binomial model a_j(c) ~ Bin(n_j(c), q1[c] d^(j-1))
               over depths j = 2..K: the per-depth multiplicative loss of conditional acceptance. The score
               sum_j (j-1) (a_j - (n_j - a_j) p_j / (1 - p_j)), p_j = q1 d^(j-1), falls in log d, so its zero
               is bisected on d in [0.05, 1] (a drafter whose conditional acceptance rises with depth gets 1,
               the profile's limit).
  copy_prior   counted on the sidecar's requests of TRACE (`fit_copy_prior`'s rule).
  sigma        the confidence-head noise (higher = less discrimination): bisected (in log sigma, 0.05-20)
               so that the synthetic profile's depth-1 confidence AUC on the same requests (the chains
               `synth_model_chains` draws for them, seed 0, temperature 0, with the fitted q1, decay and
               copy_prior) equals the recorded drafts' depth-1 AUC.
  kept         rho, copy_min_ext, temp_scale and conf_temperature come from the base profile (--profile):
               the fitted figures do not identify them; the written `source` text says so.
The trace's temperatures are overridden to 0 (the recorded acceptance is taken as the drafter's; at T > 0
the simulator scales q by temp_scale^T, as for any profile). Then tau, measured with the simulator
(`model-fixed:K`, batch size 4), conditional acceptance by depth, AUC and ECE (`head_quality`) are printed
for the recorded drafts (replayed: `SimSetup(drafts=FILE)`), the base profile and the fitted profile, on
the same requests. Under the model the fitted profile reproduces the recorded per-class conditional
acceptance by depth, hence tau (model-fixed never re-reads a rejected token, so rho does not enter tau),
up to how well q1 decay^(j-1) with two classes describes the real drafter: the printed per-class rows
show that misfit. The profile is written (`sim.infra.cli.write_whole`; an existing file needs --force,
checked before any work) to models/drafters/NAME.json, NAME = --name or fitted-<sidecar stem> (load it with
`--drafter NAME`), or to --out PATH (NAME defaults to its stem; load it with `--drafter PATH`).
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from sim.infra.cli import ArgumentParser, check_out_file, write_whole
from sim.core.drafters import model as model_mod
from sim.core.drafters.calibration import NgramCalibrator, auc, ece
from sim.core.drafters.model import (MODELS_DIR, ModelChains, ModelDrafterProfile, load_drafter_profile,
                                load_recorded_drafts, request_seed, synth_model_chains)
from sim.core.drafters.ngram import NgramConfig, ngram_tables
from sim.core.drafters.tables import DraftTables, copy_mask
from sim.infra.errors import ConfigError, TraceError
from sim.api.run import Prepared, SimSetup, prepare, run_one
from sim.infra import paths

REPO = paths.REPO
CHAT_RANGE = (3.1, 3.7)
CODE_RANGE = (4.9, 5.5)
AUC_RANGE = (0.81, 0.90)
FIT_TRACE = "traces/general.jsonl"
# (trace, published tau range, role): only FIT_TRACE informs a knob.
TRACES = ((FIT_TRACE, CHAT_RANGE, "fit"), ("traces/chat.jsonl", CHAT_RANGE, "check"),
          ("traces/codeedit.jsonl", CODE_RANGE, "check"))


def head_quality(tb: DraftTables) -> dict:
    """Conditional acceptance by depth, depth-1 AUC and prefix-survival ECE of the model drafter's tables."""
    acc = tb.m_acc
    K = tb.k_model
    rows = np.arange(len(acc))
    req = np.searchsorted(tb.offsets, rows, side="right") - 1
    left = tb.out_len[req] - (rows - tb.offsets[req])  # output tokens from row i on
    depth = np.arange(1, K + 1)
    inside = depth[None, :] <= left[:, None]
    surv = np.cumprod(tb.m_conf.astype(np.float64), axis=1)
    label = (acc[:, None] >= depth[None, :]).astype(np.float64)
    return {"cond": [float((acc[acc >= j] >= j + 1).mean()) if (acc >= j).any() else float("nan") for j in range(K)],
            "auc": auc(tb.m_conf[:, 0].astype(np.float64), (acc >= 1).astype(np.float64)),
            "ece": ece(surv[inside], label[inside])}


def _prepared(profile_name: str, trace: str, limit: int | None, overrides: dict | None):
    prof = load_drafter_profile(profile_name)
    if overrides:
        prof = dataclasses.replace(prof, **overrides)
    return prepare(SimSetup(trace=_path(trace), drafter=profile_name, limit=limit), profile=prof)


def measure(profile_name: str, trace: str, limit: int | None, overrides: dict | None = None) -> dict:
    """tau (engine-measured), conditional acceptance by depth, AUC and ECE of the profile on a trace."""
    prep = _prepared(profile_name, trace, limit, overrides)
    row, _ = run_one(prep, "model-fixed:7", 4)
    return {"tau": row["mean_tokens_per_step"], **head_quality(prep.tables)}


def _path(trace: str) -> str:
    """Repository-relative trace names work from any directory."""
    p = Path(trace)
    return str(p if p.is_absolute() or p.exists() else REPO / p)


def request_copy(prof: ModelDrafterProfile, requests) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(id, copy mask [L], extended match length ext [L]) of each request (token ids needed): the copy
    classification and the head's feature that the profile's own tables use (`build_draft_tables`)."""
    cal = NgramCalibrator.load()
    cfg = NgramConfig(n_min=cal.cfg.n_min, n_max=cal.cfg.n_max, ext_max=cal.cfg.ext_max)
    out = []
    for req in requests:
        tab = ngram_tables(np.concatenate([req.prompt_ids, req.output_ids]).astype(np.int64), len(req.prompt_ids), cfg)
        out.append((req.id, copy_mask(tab, prof.copy_min_ext), np.asarray(tab.ext)))
    return out


def fit_copy_prior(prof: ModelDrafterProfile, trace: str = FIT_TRACE, limit: int | None = None) -> tuple[tuple[float, ...], ...]:
    """pi[b][j] = (copies + 0.5) / (positions + 1) over positions i with ext bucket b at i, where a copy
    means output token i+j is copied (`copy_mask`); positions past the output end do not count."""
    from sim.core.trace import load_trace

    return copy_prior_of(prof, request_copy(prof, load_trace(_path(trace), limit=limit).requests))


def copy_prior_of(prof: ModelDrafterProfile, rows) -> tuple[tuple[float, ...], ...]:
    """`fit_copy_prior`'s counts over `request_copy` rows."""
    nb, K = len(prof.copy_prior_edges) + 1, prof.block
    hits, seen = np.zeros((nb, K)), np.zeros((nb, K))
    for _, copy, ext in rows:
        b = prof.ext_bucket(ext)
        for j in range(K):
            n = len(copy) - j  # positions whose slot j+1 lies inside the output
            np.add.at(seen[:, j], b[:n], 1.0)
            np.add.at(hits[:, j], b[:n], copy[j:].astype(np.float64))
    pi = (hits + 0.5) / (seen + 1.0)
    return tuple(tuple(round(float(x), 4) for x in row) for row in pi)


def pure_copy_tau(q1: float, decay: float, block: int) -> float:
    """tau = 1 + sum_{j=1..K} prod_{l<=j} q1 decay^(l-1) on a stream of only copied tokens (no output end)."""
    return 1.0 + float(np.cumprod(q1 * decay ** np.arange(block)).sum())


def bisect(f, lo: float, hi: float, target: float, iters: int = 12, increasing: bool = True) -> float:
    """x in [lo, hi] with f(x) ~ target for a monotone f."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        below = f(mid) < target
        lo, hi = (mid, hi) if below == increasing else (lo, mid)
    return (lo + hi) / 2


def fit(profile_name: str, limit: int | None) -> dict:
    """New values of the fitted knobs (module docstring), from general.jsonl and the published figures."""
    prof = load_drafter_profile(profile_name)
    pi = fit_copy_prior(prof)
    q_copy = round(bisect(lambda q: pure_copy_tau(q, prof.decay[1], prof.block), 0.3, 0.999, CODE_RANGE[1]), 4)
    fixed = {"copy_prior": pi}
    q_norm = round(bisect(lambda q: measure(profile_name, FIT_TRACE, limit, {**fixed, "q1": (q, q_copy)})["tau"],
                          0.3, 0.99, sum(CHAT_RANGE) / 2), 4)
    fixed["q1"] = (q_norm, q_copy)
    sigma = round(bisect(lambda s: head_quality(_prepared(profile_name, FIT_TRACE, limit, {**fixed, "sigma": s}).tables)["auc"],
                         0.2, 3.0, sum(AUC_RANGE) / 2, increasing=False), 3)
    return {**fixed, "sigma": sigma}


SOURCE = (
    "Synthetic DSpark block-7 drafter for Qwen3 targets, fitted by python -m sim.fit_profile --write "
    "on traces/general.jsonl only (first {limit} requests; copy_prior on all of it). q1[normal] = {q0}: the "
    "simulator's tau on general.jsonl = middle of the published DSpark chat range 3.1-3.7 (MT-Bench/Alpaca/"
    "Arena-Hard). sigma = {sigma}: depth-1 confidence AUC on general.jsonl = middle of the published raw-head "
    "range 0.81-0.90. copy_prior: the head's causal prior P(token i+j-1 copied | extended n-gram match length "
    "at i, bucketed at copy_prior_edges), counted on general.jsonl. q1[copied] = {q1}: assumption from the "
    "published code range, a stream of only copied tokens gets tau 5.5 (its top). decay, rho, copy_min_ext, "
    "temp_scale: assumptions, not fitted. chat.jsonl and codeedit.jsonl are evaluation traces, only checked "
    "(docs/simulator.md, tests/test_drafter_profile.py)."
)


def write_profile(profile_name: str, fitted: dict, limit: int | None) -> Path:
    """Rewrite the profile JSON with the fitted knobs and a `source` text that says where each came from."""
    path = MODELS_DIR / f"{profile_name}.json"
    raw = json.loads(path.read_text())
    raw["q1"] = list(fitted["q1"])
    raw["sigma"] = fitted["sigma"]
    raw["copy_prior_edges"] = list(load_drafter_profile(profile_name).copy_prior_edges)
    raw["copy_prior"] = [list(r) for r in fitted["copy_prior"]]
    raw["source"] = SOURCE.format(limit=limit, q0=fitted["q1"][0], q1=fitted["q1"][1], sigma=fitted["sigma"])
    return write_whole(path, json.dumps(raw, indent=2) + "\n", overwrite=True)  # whole or not at all


# ------------------------------------------------------------------------------ fit to recorded drafts
DECAY_MIN = 0.05
SIGMA_RANGE = (0.05, 20.0)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def class_depth_counts(chains: list[ModelChains], copies: list[np.ndarray], block: int) -> tuple[np.ndarray, np.ndarray]:
    """a[c, j-1], n[c, j-1] (module docstring): over chains i whose slot j lands inside the output on a
    token of class c, n counts those that reached slot j (acc_i >= j-1) and a those that accepted it."""
    a, n = np.zeros((2, block)), np.zeros((2, block))
    for ch, copy in zip(chains, copies):
        acc, c = np.asarray(ch.acc_len), np.asarray(copy, dtype=np.int64)
        for j in range(min(block, len(acc))):
            m = len(acc) - j  # chains i < m have slot j+1 on token i + j < L
            reach = acc[:m] >= j
            n[:, j] += np.bincount(c[j:][reach], minlength=2)
            a[:, j] += np.bincount(c[j:][reach & (acc[:m] >= j + 1)], minlength=2)
    return a, n


def fit_decay(q1: float, a: np.ndarray, n: np.ndarray) -> float:
    """Maximum-likelihood d of a_j ~ Bin(n_j, q1 d^e_j), e_j = 1, 2, ... (depths 2..K): the score falls in
    u = log d, so bisect its zero on [log DECAY_MIN, 0] (it ends at d = 1 when acceptance does not fall)."""
    e = np.arange(1, len(a) + 1, dtype=np.float64)

    def score(u: float) -> float:
        p = np.clip(q1 * np.exp(e * u), 1e-12, 1 - 1e-12)
        return float(np.sum(e * (a - (n - a) * p / (1 - p))))

    return float(np.exp(bisect(score, np.log(DECAY_MIN), 0.0, 0.0, iters=50, increasing=False)))


def synth_auc(prof: ModelDrafterProfile, rows, seed: int = 0) -> float:
    """Depth-1 confidence AUC of the chains the profile draws for `request_copy` rows (as its tables do,
    temperature 0)."""
    conf, acc = [], []
    for rid, copy, ext in rows:
        ch = synth_model_chains(prof, copy, request_seed(seed, rid), 0.0, match_ext=ext)
        conf.append(ch.conf[:, 0])
        acc.append(ch.acc_len >= 1)
    return auc(np.concatenate(conf).astype(np.float64), np.concatenate(acc).astype(np.float64))


def recorded_auc(chains: list[ModelChains]) -> float:
    return auc(np.concatenate([c.conf[:, 0] for c in chains]).astype(np.float64),
               np.concatenate([c.acc_len >= 1 for c in chains]).astype(np.float64))


def fit_drafts(base: ModelDrafterProfile, chains: list[ModelChains], rows) -> dict:
    """The knobs fitted to recorded chains (in the order of `request_copy` rows): q1 and decay (closed form /
    maximum likelihood per class), copy_prior (counted), sigma (bisected on the depth-1 AUC); plus the
    counts behind them and notes on anything kept from the base profile. `base` has the sidecar's block."""
    K = base.block
    a, n = class_depth_counts(chains, [c for _, c, _ in rows], K)
    q1, decay, notes = list(base.q1), list(base.decay), []
    for c, label in ((0, "normal"), (1, "copied")):
        if n[c, 0] == 0:
            notes.append(f"q1[{label}] and decay[{label}] kept from {base.name}: no {label} positions")
            continue
        q1[c] = round(float(np.clip(a[c, 0] / n[c, 0], 1e-4, 1.0)), 4)
        if n[c, 1:].sum() == 0:
            notes.append(f"decay[{label}] kept from {base.name}: no {label} position reached depth 2")
            continue
        decay[c] = round(fit_decay(q1[c], a[c, 1:], n[c, 1:]), 4)
        if decay[c] >= 0.9999:
            notes.append(f"decay[{label}] = 1: the recorded conditional acceptance does not fall with depth")
    pi = copy_prior_of(base, rows)
    shaped = dataclasses.replace(base, q1=tuple(q1), decay=tuple(decay), copy_prior=pi)
    target = recorded_auc(chains)
    if np.isnan(target):
        sigma = base.sigma
        notes.append(f"sigma kept from {base.name}: every (or no) recorded chain accepts its first token, no AUC")
    else:
        lo, hi = np.log(SIGMA_RANGE[0]), np.log(SIGMA_RANGE[1])
        u = bisect(lambda u: synth_auc(dataclasses.replace(shaped, sigma=float(np.exp(u))), rows), lo, hi, target,
                   iters=20, increasing=False)
        sigma = round(float(np.exp(u)), 3)
        if u - lo < 0.01 or hi - u < 0.01:
            notes.append(f"sigma = {sigma} is at the end of its range {SIGMA_RANGE}: the model cannot reach the "
                         f"recorded AUC {target:.3f}")
    return {"q1": tuple(q1), "decay": tuple(decay), "copy_prior": pi, "sigma": sigma, "a": a, "n": n,
            "recorded_auc": target, "notes": notes}


def _subset(prep: Prepared, idx: np.ndarray) -> Prepared:
    """The prepared run restricted to requests `idx` (the sidecar's)."""
    if len(idx) == len(prep.tables.out_len):
        return prep
    return dataclasses.replace(prep, tables=prep.tables.subset(idx), arrivals=prep.arrivals[idx])


def _measure_prepared(prep: Prepared, block: int) -> dict:
    row, res = run_one(prep, f"model-fixed:{block}", 4)
    res.raise_if_lossy(f"model-fixed:{block} at batch size 4")
    return {"tau": row["mean_tokens_per_step"], **head_quality(prep.tables)}


def _out_path(drafts: str, name: str | None, out: str | None) -> tuple[Path, str]:
    """Where the fitted profile goes and its name (module docstring); a bad name is a ConfigError."""
    if out is not None:
        path = Path(out)
        if path.suffix != ".json":
            raise ConfigError(f"--out {out}: a drafter profile file must end in .json")
        name = name or path.stem
    else:
        name = name or f"fitted-{Path(drafts).stem}"
        path = model_mod.MODELS_DIR / f"{name}.json"
    if not _NAME.fullmatch(name) or name.endswith("-cost"):
        raise ConfigError(f"profile name '{name}' must be letters, digits, '.', '_' or '-' and not end in -cost "
                          "(--name NAME)")
    return path, name


FROM_DRAFTS_SOURCE = (
    "Fitted by python -m sim.fit_profile --from-drafts {drafts} --trace {trace}{limit} to the recorded "
    "model drafts in {drafts}: {reqs} requests, {rows} positions ({copied} copied). q1 = the recorded depth-1 "
    "acceptance of normal / copied output positions (copy_mask with copy_min_ext {cme}), closed form; decay = "
    "maximum likelihood of the recorded conditional acceptance by depth per class, q1 decay^(j-1); sigma: the "
    "synthetic depth-1 confidence AUC on the same requests = the recorded {auc:.3f} (bisected); copy_prior "
    "counted on those requests of {trace}. rho, copy_min_ext, temp_scale and conf_temperature are kept from "
    "the base profile {base}, not fitted. model-fixed:{K} at batch size 4 on those requests: recorded tau "
    "{tau_rec:.3f}, this profile {tau_fit:.3f} (base {tau_base:.3f}).{notes}"
)


def from_drafts(drafts: str, trace: str, base_name: str, block: int | None, limit: int | None,
                path: Path, name: str, force: bool) -> dict:
    """Fit a profile to the recorded drafts (module docstring), write it to `path`, measure recorded / base /
    fitted on the sidecar's requests. Returns the fit and the measurements."""
    from sim.core.trace import load_trace

    base = load_drafter_profile(base_name)
    K, block_of_base = block or base.block, base.block
    if K != base.block:  # the base's copy prior has base.block columns; the fit recounts it for K
        base = dataclasses.replace(base, block=K, copy_prior=())
    try:
        recorded = load_recorded_drafts(drafts, K)
    except TraceError as exc:
        if exc.field == "model_conf" and "list of lists" in exc.reason:
            raise TraceError(f"{exc.reason} (the block size K is --block, default {base_name}'s)", exc.file,
                             exc.line, exc.field) from None
        raise
    if not recorded:
        raise TraceError("no recorded requests (empty sidecar)", drafts)
    reqs = load_trace(_path(trace), limit=limit).requests
    ids = {r.id for r in reqs}
    unknown = sorted(set(recorded) - ids)
    if unknown:
        where = f"the first {limit} requests of {trace} (--limit)" if limit else trace
        raise ConfigError(f"{drafts}: recorded drafts for {len(unknown)} request(s) not in {where}, e.g. '{unknown[0]}'")
    idx = np.asarray([k for k, r in enumerate(reqs) if r.id in recorded], dtype=np.int64)
    mine = [reqs[k] for k in idx]
    for r in mine:
        if r.output_ids is None:
            raise ConfigError(f"{trace}: request '{r.id}' has no token ids (length-only); --from-drafts reads the "
                              "output tokens to classify copied positions")
        ch = recorded[r.id]
        if len(ch.acc_len) != r.output_len:
            raise ConfigError(f"{drafts}: recorded drafts of request '{r.id}' have {len(ch.acc_len)} positions; "
                              f"the trace's output has {r.output_len} tokens")
    rows = request_copy(base, mine)
    chains = [recorded[r.id] for r in mine]
    fit_ = fit_drafts(base, chains, rows)
    if K != block_of_base:
        fit_["notes"].append(f"the base profile is measured at block {K} without its copy prior (it has {block_of_base} columns)")
    fitted = dataclasses.replace(base, name=name, q1=fit_["q1"], decay=fit_["decay"], sigma=fit_["sigma"],
                                 copy_prior=fit_["copy_prior"])

    def setup(**kw) -> SimSetup:
        return SimSetup(trace=_path(trace), drafter=base_name, limit=limit, temperature=0.0, **kw)

    m = {"recorded": _measure_prepared(_subset(prepare(setup(drafts=drafts), profile=base), idx), K),
         "base": _measure_prepared(_subset(prepare(setup(), profile=base), idx), K),
         "fitted": _measure_prepared(_subset(prepare(setup(), profile=fitted), idx), K)}
    notes = "".join(f" Note: {x}." for x in fit_["notes"])
    source = FROM_DRAFTS_SOURCE.format(
        drafts=drafts, trace=trace, limit=f" --limit {limit}" if limit else "", reqs=len(mine),
        rows=int(fit_["n"][:, 0].sum()), copied=int(fit_["n"][1, 0]), cme=base.copy_min_ext,
        auc=fit_["recorded_auc"], base=base_name, K=K, tau_rec=m["recorded"]["tau"], tau_fit=m["fitted"]["tau"],
        tau_base=m["base"]["tau"], notes=notes)
    fitted = dataclasses.replace(fitted, source=source)
    raw = {"name": name, "block": K, "q1": list(fitted.q1), "decay": list(fitted.decay), "rho": fitted.rho,
           "sigma": fitted.sigma, "conf_temperature": fitted.conf_temperature, "copy_min_ext": fitted.copy_min_ext,
           "temp_scale": fitted.temp_scale, "source": source, "copy_prior_edges": list(fitted.copy_prior_edges),
           "copy_prior": [list(r) for r in fitted.copy_prior]}
    write_whole(path, json.dumps(raw, indent=2) + "\n", overwrite=force)
    if load_drafter_profile(str(path)) != fitted:  # what was measured is what was written
        raise AssertionError(f"{path} does not load back as the fitted profile")
    return {"fit": fit_, "base": base, "fitted": fitted, "measured": m, "path": path, "requests": len(mine)}


def _print_from_drafts(r: dict, drafts: str) -> None:
    base, fitted, fit_, m = r["base"], r["fitted"], r["fit"], r["measured"]
    K = fitted.block
    print(f"{drafts}: {r['requests']} requests, {int(fit_['n'][:, 0].sum())} positions "
          f"({int(fit_['n'][1, 0])} copied)")
    print(f"{'knob':<16}{'base':>16}{'fitted':>18}")
    for k in ("q1", "decay"):
        print(f"{k + '[normal]':<16}{getattr(base, k)[0]:>16.4f}{getattr(fitted, k)[0]:>18.4f}")
        print(f"{k + '[copied]':<16}{getattr(base, k)[1]:>16.4f}{getattr(fitted, k)[1]:>18.4f}")
    print(f"{'sigma':<16}{base.sigma:>16.3f}{fitted.sigma:>18.3f}")
    print(f"kept from {base.name}: rho {fitted.rho}, copy_min_ext {fitted.copy_min_ext}, "
          f"temp_scale {fitted.temp_scale}, conf_temperature {fitted.conf_temperature}; copy_prior counted on the trace")
    a, n = fit_["a"], fit_["n"]
    q = fitted.q()
    for c, label in ((0, "normal"), (1, "copied")):
        rec = " ".join(f"{x:.2f}" if y else "  - " for x, y in zip(a[c] / np.maximum(n[c], 1), n[c]))
        print(f"{label} conditional acceptance by depth: recorded {rec} | fitted " + " ".join(f"{x:.2f}" for x in q[c]))
    print(f"\n{'model-fixed:' + str(K) + ', batch 4':<22}{'tau':>7}{'AUC':>7}{'ECE':>7}  conditional acceptance by depth")
    for key, label in (("recorded", "recorded drafts"), ("base", f"base {base.name}"), ("fitted", "fitted profile")):
        x = m[key]
        print(f"{label:<22}{x['tau']:>7.3f}{x['auc']:>7.3f}{x['ece']:>7.3f}  " + " ".join(f"{c:.2f}" for c in x["cond"]))
    for note in fit_["notes"]:
        print(f"note: {note}")
    p = r["path"]
    use = fitted.name if p.resolve() == (model_mod.MODELS_DIR / f"{fitted.name}.json").resolve() else str(p)
    print(f"wrote {p}; use it with: python -m sim.run --drafter {use} ...")


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m sim.fit_profile", description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="dspark-qwen3-b7",
                    help="the profile to refit (--write), or the base profile of --from-drafts")
    ap.add_argument("--limit", type=int, default=None,
                    help="the first N requests of each trace (default: 300 for the general-text fit and checks; "
                         "all of TRACE with --from-drafts)")
    ap.add_argument("--write", action="store_true", help="refit on general.jsonl and rewrite the profile file")
    ap.add_argument("--from-drafts", metavar="FILE", default=None,
                    help="fit a new profile to recorded model drafts (sidecar JSONL, docs/simulator.md)")
    ap.add_argument("--trace", default=None, help="with --from-drafts: the trace the drafts were recorded on")
    ap.add_argument("--block", type=int, default=None, help="with --from-drafts: K, the chain length of the "
                    "recorded drafts (default: the base profile's)")
    ap.add_argument("--name", default=None, help="with --from-drafts: the new profile's name "
                    "(default: fitted-<sidecar stem>, or the stem of --out)")
    ap.add_argument("--out", default=None, help="with --from-drafts: where to write it "
                    "(default: models/drafters/NAME.json)")
    ap.add_argument("--force", action="store_true", help="with --from-drafts: replace an existing --out file")
    a = ap.parse_args(argv)
    if a.limit is not None and a.limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {a.limit}")
    if a.from_drafts is not None:
        if a.write:
            raise ConfigError("--write refits the profile on general text; it does not go with --from-drafts")
        if a.trace is None:
            raise ConfigError("--from-drafts needs --trace, the trace the drafts were recorded on")
        if a.block is not None and not 1 <= a.block <= 64:
            raise ConfigError(f"--block must be in 1..64, got {a.block}")
        path, name = _out_path(a.from_drafts, a.name, a.out)
        check_out_file(path, a.force, "--out")  # before any work; a tracked profile only when --out names it
        r = from_drafts(a.from_drafts, a.trace, a.profile, a.block, a.limit, path, name, a.force)
        _print_from_drafts(r, a.from_drafts)
        return 0
    extra = [f for f, v in (("--trace", a.trace), ("--block", a.block), ("--name", a.name), ("--out", a.out),
                            ("--force", a.force or None)) if v is not None]
    if extra:
        raise ConfigError(f"{', '.join(extra)} only go with --from-drafts FILE")
    limit = a.limit or 300
    if a.write:
        check_out_file(MODELS_DIR / f"{a.profile}.json", True, "--write")  # --write names the profile file
        fitted = fit(a.profile, limit)
        print(f"wrote {write_profile(a.profile, fitted, limit)}: q1 = {list(fitted['q1'])}, sigma = {fitted['sigma']}")
    print(f"{'trace':<24}{'role':>7}{'tau':>7}{'published':>11}{'AUC':>7}{'ECE':>7}  conditional acceptance by depth")
    for trace, rng, role in TRACES:
        m = measure(a.profile, trace, limit)
        print(f"{trace:<24}{role:>7}{m['tau']:>7.2f}{f'{rng[0]}-{rng[1]}':>11}{m['auc']:>7.3f}{m['ece']:>7.3f}  "
              + " ".join(f"{c:.2f}" for c in m["cond"]))
    print(f"fit: knobs fitted on {FIT_TRACE} (its tau target: the chat range; AUC target {AUC_RANGE[0]}-{AUC_RANGE[1]}); "
          "check: measured only, never used to set a knob")
    return 0
