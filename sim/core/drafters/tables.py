"""Per-request, per-position draft tables: the precomputed input of every engine step.

At temperature 0 the target output is fixed, so what each drafter proposes at output position i, and how
much of it the target accepts, depends only on i (docs/simulator.md). `build_draft_tables` computes,
once per trace, for every request r and output position i (row = offsets[r] + i):
  ng_len, ng_acc, ng_start   n-gram chain length, exact accepted length, source index in the token sequence
  ng_conf [K_n]              calibrated conditional acceptance estimates of the n-gram tokens
  m_conf [K_m], m_acc        model-drafter confidences and accepted length (synthetic profile or recorded)
  m_tok [K_m]                model-drafter proposed tokens (sim.core.drafters.model.chain_tokens): the target's
                             token on the accepted prefix, a wrong one from the first rejected slot on
  rec_chain, rec_skip        a real engine's recorded decisions at the row (recorded drafts with `chosen` /
                             `skipped`): the chain id it published (-1: none recorded), whether its model pass was
                             skipped; replayed by the policies that take them (sim/core/policies/base.py Replay)
An engine step then only gathers rows, which keeps policies comparable on identical draws.
Length-only requests (no token ids) borrow contiguous segments of the tables of a bundled trace of the
same workload (a block bootstrap of its empirical acceptance; `stat_profile` below).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sim.infra.progress import progress_bar

from sim.core.drafters.calibration import NgramCalibrator
from sim.core.drafters.model import ModelDrafterProfile, chain_tokens, request_seed, synth_model_chains
from sim.core.drafters.ngram import NgramConfig, ngram_tables
from sim.infra.errors import ConfigError
from sim.infra import paths

REPO = paths.REPO
# The per-row columns and their dtypes (one row per output position); `tokens` (int64) is per token.
ROW_DTYPES = {"ng_len": np.int64, "ng_acc": np.int64, "ng_start": np.int64, "ng_conf": np.float32,
              "m_conf": np.float32, "m_acc": np.int64, "m_tok": np.int32, "rec_chain": np.int8, "rec_skip": np.bool_}
ROW_COLUMNS = tuple(ROW_DTYPES)


@dataclass
class DraftTables:
    """Flat per-position tables of a whole trace (see module docstring); rows of request r are
    offsets[r] .. offsets[r+1]-1. tokens holds each request's prompt+output at tok_offsets[r]."""

    offsets: np.ndarray
    out_len: np.ndarray
    prompt_len: np.ndarray
    ng_len: np.ndarray
    ng_acc: np.ndarray
    ng_start: np.ndarray
    ng_conf: np.ndarray
    m_conf: np.ndarray
    m_acc: np.ndarray
    m_tok: np.ndarray  # [rows, K_m] int32
    rec_chain: np.ndarray  # [rows] int8: the recorded chain id, -1 where none
    rec_skip: np.ndarray  # [rows] bool: the recorded model pass was skipped
    tokens: np.ndarray
    tok_offsets: np.ndarray
    length_only: np.ndarray  # [n] bool: synthetic token ids (stat_profile); n-gram copies come from the output
    replayed_requests: int = 0  # requests whose model chains were replayed from recorded drafts

    @property
    def k_model(self) -> int:
        return self.m_conf.shape[1]

    @property
    def k_ngram(self) -> int:
        return self.ng_conf.shape[1]

    def subset(self, idx: np.ndarray) -> "DraftTables":
        """The tables of requests `idx` (in that order), as if the trace held only them. (ng_start indexes
        each request's own token buffer, so it carries over unchanged.)"""
        idx = np.asarray(idx, dtype=np.int64)
        rows = _ranges(self.offsets[idx], self.offsets[idx + 1])
        toks = _ranges(self.tok_offsets[idx], self.tok_offsets[idx + 1])
        out_len = self.out_len[idx]
        tok_len = self.tok_offsets[idx + 1] - self.tok_offsets[idx]
        cols = {k: getattr(self, k)[rows] for k in ROW_COLUMNS}
        return DraftTables(offsets=np.concatenate([[0], np.cumsum(out_len)]).astype(np.int64), out_len=out_len,
                           prompt_len=self.prompt_len[idx], tokens=self.tokens[toks],
                           tok_offsets=np.concatenate([[0], np.cumsum(tok_len)]).astype(np.int64),
                           length_only=self.length_only[idx], replayed_requests=0, **cols)

    def copy_fraction(self) -> np.ndarray:
        """Per request: share of output positions whose n-gram proposal's first token is right [0, 1]."""
        hit = np.add.reduceat((self.ng_acc >= 1).astype(np.float64), self.offsets[:-1]) if len(self.out_len) else np.zeros(0)
        return hit / np.maximum(self.out_len, 1)


def has_decisions(tb) -> bool:
    """Whether the tables hold a real engine's recorded decisions (rec_chain >= 0 somewhere): whole tables by that
    column, a streaming arena (sim.core.drafters.stream) by its recipe's recorded drafts."""
    spec = getattr(tb, "spec", None)
    if spec is not None:
        return any(ch.chosen is not None for ch in (spec.recorded or {}).values())
    return bool(np.any(tb.rec_chain >= 0))


def zero_past_length(conf: np.ndarray, length: np.ndarray) -> bool:
    """Whether every entry of the rows conf [rows, K] at or past its row's length is +0.0, sign included."""
    conf, length = np.asarray(conf), np.asarray(length)
    short = np.flatnonzero(length < conf.shape[1])  # only these rows have slots past their length
    x = conf[short][np.arange(conf.shape[1])[None, :] >= length[short][:, None]]
    return bool(not np.any((x != 0) | np.signbit(x)))


def ng_conf_zero_past_length(tb: DraftTables) -> bool:
    """Whether every n-gram confidence past its chain's length is +0.0, sign included (the calibrator writes
    them so), checked once per tables object: then the host-side history may add the rows as they are, and the
    native step (sim/engine/native_step.py) reads the rows up to their length only."""
    flag = getattr(tb, "_ng_zero_past_len", None)
    if flag is None:
        flag = zero_past_length(tb.ng_conf, tb.ng_len)
        try:
            tb._ng_zero_past_len = flag
        except AttributeError:
            pass
    return flag


def expected_outputs(tb: DraftTables) -> np.ndarray:
    """The trace's output tokens in the output buffer's layout (request r's at offsets[r] .. offsets[r + 1] - 1),
    read from `tokens` (what the engine's lossless check compares the emitted tokens with). Kept on the tables
    object while its arrays are the same objects: every run over the same tables reuses it."""
    key = (tb.tokens, tb.tok_offsets, tb.prompt_len, tb.out_len, tb.offsets)
    hit = getattr(tb, "_expected", None)
    if hit is not None and all(a is b for a, b in zip(hit[0], key)):
        return hit[1]
    req = np.repeat(np.arange(len(tb.out_len)), tb.out_len)
    pos = np.arange(len(req)) - tb.offsets[req]
    out = tb.tokens[tb.tok_offsets[req] + tb.prompt_len[req] + pos]
    try:
        tb._expected = (key, out)
    except AttributeError:
        pass
    return out


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Concatenated aranges lo[k]..hi[k]-1."""
    n = hi - lo
    return np.repeat(lo - np.concatenate([[0], np.cumsum(n)[:-1]]), n) + np.arange(int(n.sum()))


def copy_mask(tab, min_ext: int) -> np.ndarray:
    """Output tokens that continue an exact copy: the n-gram continuation is right inside a long match.
    This is the truth about token i (it reads output[i]): it may shape acceptance, never a confidence."""
    return (tab.acc_len >= 1) & (tab.ext >= min_ext)


def build_draft_tables(
    requests: list,
    ngram_cfg: NgramConfig,
    profile: ModelDrafterProfile,
    calibrator: NgramCalibrator,
    seed: int = 0,
    progress: bool = False,
    recorded: dict | None = None,
    synthetic: tuple[float, ...] | None = None,
) -> DraftTables:
    """Precompute the draft tables of `requests` (sim.core.trace.Request objects). `recorded` maps request
    ids to ModelChains recorded by a real engine (sim.core.drafters.model.load_recorded_drafts); those
    requests replay them exactly instead of drawing synthetic chains. `synthetic`: vLLM's synthetic rejection
    sampling's unconditional rates, which then decide every chain's acceptance (sim.core.drafters.synthetic)."""
    check_calibrator(ngram_cfg, calibrator)
    parts: dict[str, list] = {k: [] for k in ROW_COLUMNS + ("tokens",)}
    out_len, prompt_len, length_only = [], [], []
    replayed = 0
    it = progress_bar(requests, desc="draft tables", unit="req", disable=not progress, leave=False)
    for req in it:
        rows = request_rows(req, ngram_cfg, profile, calibrator, seed, recorded, synthetic)
        replayed += bool(recorded is not None and req.output_ids is not None and req.id in recorded)
        for k in parts:
            parts[k].append(rows[k])
        out_len.append(len(rows["m_acc"]))
        length_only.append(req.output_ids is None or synthetic is not None)  # synthetic: content not checked (apply)
        prompt_len.append(len(rows["tokens"]) - len(rows["m_acc"]))
    out = np.asarray(out_len, dtype=np.int64)
    tok_lens = np.asarray([len(t) for t in parts["tokens"]], dtype=np.int64)
    return DraftTables(
        offsets=np.concatenate([[0], np.cumsum(out)]).astype(np.int64),
        out_len=out,
        prompt_len=np.asarray(prompt_len, dtype=np.int64),
        ng_len=np.concatenate(parts["ng_len"]).astype(np.int64),
        ng_acc=np.concatenate(parts["ng_acc"]).astype(np.int64),
        ng_start=np.concatenate(parts["ng_start"]).astype(np.int64),
        ng_conf=np.concatenate(parts["ng_conf"]).astype(np.float32),
        m_conf=np.concatenate(parts["m_conf"]).astype(np.float32),
        m_acc=np.concatenate(parts["m_acc"]).astype(np.int64),
        m_tok=np.concatenate(parts["m_tok"]).astype(np.int32),
        rec_chain=np.concatenate(parts["rec_chain"]).astype(np.int8),
        rec_skip=np.concatenate(parts["rec_skip"]).astype(bool),
        tokens=np.concatenate(parts["tokens"]).astype(np.int64),
        tok_offsets=np.concatenate([[0], np.cumsum(tok_lens)]).astype(np.int64),
        length_only=np.asarray(length_only, dtype=bool),
        replayed_requests=replayed,
    )


def check_calibrator(ngram_cfg: NgramConfig, calibrator: NgramCalibrator) -> None:
    """ConfigError unless the calibrator was fitted for the drafter's n-gram sizes."""
    if calibrator.cfg.n_min != ngram_cfg.n_min or calibrator.cfg.n_max != ngram_cfg.n_max:
        raise ConfigError(
            f"the n-gram calibrator was fitted for n in [{calibrator.cfg.n_min}, {calibrator.cfg.n_max}] "
            f"but the drafter uses [{ngram_cfg.n_min}, {ngram_cfg.n_max}]; refit it with python -m sim.calibrate"
        )


def request_rows(req, ngram_cfg: NgramConfig, profile: ModelDrafterProfile, calibrator: NgramCalibrator, seed: int,
                 recorded: dict | None = None, synthetic: tuple[float, ...] | None = None) -> dict:
    """request_rows_of (below), with vLLM's synthetic acceptance deciding every chain's acceptance when `synthetic`
    gives its rates (sim.core.drafters.synthetic.apply; drawn per request, seeded by its id)."""
    rows = _request_rows(req, ngram_cfg, profile, calibrator, seed, recorded)
    if synthetic is None:
        return rows
    from sim.core.drafters import synthetic as syn

    rows = syn.apply(rows, synthetic, request_seed(seed + 2, req.id))
    if req.output_ids is not None:
        rows["m_tok"] = chain_tokens(req.output_ids, rows["m_acc"], profile.block)
    return rows


def _request_rows(req, ngram_cfg: NgramConfig, profile: ModelDrafterProfile, calibrator: NgramCalibrator, seed: int,
                  recorded: dict | None = None) -> dict:
    """One request's rows (ROW_COLUMNS, one row per output position, and its prompt+output `tokens`), the
    same whether built for the whole trace (build_draft_tables) or when the request is admitted
    (sim.core.drafters.stream): every draw is seeded by the request's id (request_seed), never by its order."""
    if req.output_ids is None:
        return stat_profile(req, ngram_cfg, profile, calibrator, seed)
    toks = np.concatenate([req.prompt_ids, req.output_ids]).astype(np.int64)
    tab = ngram_tables(toks, len(req.prompt_ids), ngram_cfg)
    if recorded is not None and req.id in recorded:
        chains = recorded[req.id]
        if len(chains.acc_len) != req.output_len or chains.conf.shape[1] != profile.block:
            raise ConfigError(f"recorded drafts of request '{req.id}' have {len(chains.acc_len)} positions x "
                              f"{chains.conf.shape[1]} tokens; the trace needs {req.output_len} x {profile.block}")
    else:
        chains = synth_model_chains(profile, copy_mask(tab, profile.copy_min_ext), request_seed(seed, req.id),
                                    req.temperature, match_ext=tab.ext)
    ng_acc = tab.acc_len
    if req.temperature > 0:
        ng_acc = _thin_acceptance(ng_acc, profile.temp_scale**req.temperature, request_seed(seed + 1, req.id))
    L = len(chains.acc_len)
    return dict(ng_len=tab.length, ng_acc=ng_acc, ng_start=tab.start, ng_conf=calibrator.conditional(tab, ngram_cfg.k),
                m_conf=chains.conf, m_acc=chains.acc_len, tokens=toks,
                m_tok=chain_tokens(req.output_ids, chains.acc_len, profile.block),
                rec_chain=np.full(L, -1, dtype=np.int8) if chains.chosen is None else chains.chosen,
                rec_skip=np.zeros(L, dtype=bool) if chains.skipped is None else chains.skipped)


def _thin_acceptance(acc: np.ndarray, keep: float, rng: np.random.Generator) -> np.ndarray:
    """Temperature > 0 approximation: each matching n-gram token survives rejection sampling with
    probability `keep`; the accepted length is cut at the first rejected token."""
    if len(acc) == 0:
        return acc
    K = int(acc.max()) if len(acc) else 0
    if K == 0:
        return acc
    u = rng.random((len(acc), K)) < keep
    return np.minimum(acc, np.cumprod(u, axis=1).sum(axis=1))


_PROFILE_CACHE: dict[tuple, dict] = {}


def stat_profile(req, ngram_cfg: NgramConfig, profile: ModelDrafterProfile, calibrator: NgramCalibrator, seed: int) -> dict:
    """Rows for a length-only request: a block bootstrap from the bundled trace of its workload
    (codeedit for 'codeedit'/'code*', chat otherwise). Token ids are synthetic placeholders: the
    n-gram sources point into a private token buffer whose tokens equal the output where accepted."""
    workload = "codeedit" if (req.workload or "").startswith("code") else "chat"
    key = (workload, ngram_cfg, profile, id(calibrator), seed)
    if key not in _PROFILE_CACHE:
        from sim.core.trace import load_trace

        path = REPO / "traces" / f"{workload}.jsonl"
        if not path.exists():
            raise ConfigError(f"length-only request '{req.id}' needs the bundled trace {path} as its statistical profile")
        base = build_draft_tables(load_trace(str(path), limit=200).requests, ngram_cfg, profile, calibrator, seed)
        _PROFILE_CACHE[key] = {"tables": base}
    base: DraftTables = _PROFILE_CACHE[key]["tables"]
    rng = request_seed(seed, "len:" + req.id)
    L = req.output_len
    starts, stops, got = [], [], 0  # segments [start, stop) of base rows, drawn until L rows are covered
    while got < L:
        r = int(rng.integers(len(base.out_len)))
        a, b = base.offsets[r], base.offsets[r + 1]
        s = int(rng.integers(a, b))
        starts.append(s)
        stops.append(int(b))
        got += int(b) - s
    idx = _ranges(np.asarray(starts, dtype=np.int64), np.asarray(stops, dtype=np.int64))[:L]
    P = req.prompt_len
    # Synthetic token buffer: prompt of zeros, output of distinct ids. n-gram proposals copy the output
    # itself (ng_start = P + pos: the current token, not the context), so their copied tokens are right
    # by construction and the engine exempts these requests from its copy-source check (length_only);
    # the model chains' proposed tokens follow the replayed acceptance as for token traces.
    out_tokens = np.arange(1, L + 1, dtype=np.int64)
    toks = np.concatenate([np.zeros(P, dtype=np.int64), out_tokens])
    pos = np.arange(L)
    ng_len = np.minimum(base.ng_len[idx], np.maximum(L - pos, 0))
    ng_acc = np.minimum(base.ng_acc[idx], ng_len)
    ng_start = np.where(ng_len > 0, P + pos, -1)
    m_acc = np.minimum(base.m_acc[idx], L - pos)  # a borrowed chain never reaches past this output's end
    return dict(ng_len=ng_len, ng_acc=ng_acc, ng_start=ng_start, ng_conf=base.ng_conf[idx], m_conf=base.m_conf[idx],
                m_acc=m_acc, m_tok=chain_tokens(out_tokens, m_acc, base.k_model), tokens=toks,
                rec_chain=np.full(L, -1, dtype=np.int8), rec_skip=np.zeros(L, dtype=bool))
