"""A model-free suffix-tree drafter (suffix decoding, as Arctic Inference and vLLM 0.33's `method: "suffix"`
describe it; this is an implementation of that idea written here, not a port).

Two trees of token n-grams, each a trie of every substring of length <= D (max_depth) of the sequences fed to
it, with an occurrence count per node:
  * a per-request tree over the request's prompt and its output so far (grows by one token per emitted token);
  * a global tree over the outputs of finished requests (each output added whole when its request finishes;
    the oldest are dropped past max_cached outputs), shared by every request: a live, schedule-dependent
    drafter, whose proposals depend on which requests finished before this step.

Proposal at context c (prompt + output so far), in each tree:
  1. match: every suffix s = c[t-m:t], 1 <= m <= D - 1, that is a path of the tree with a continuation (a
     child of its node);
  2. extend greedily from each such node: take the child with the largest count (ties: the smaller token
     id), with the empirical conditional acceptance p_j = count(child) / sum of the node's children's counts;
     stop when the path's probability p_1 ... p_j would drop below min_token_prob, at the tree's depth (a
     match of m leaves D - m levels), or at the cap L = min(max_spec_tokens, floor(max_spec_factor * m +
     max_spec_offset));
  3. keep the candidate with the largest score, the sum of its path probabilities (p_1 + p_1 p_2 + ...): the
     expected accepted length if the p_j were the true conditional acceptances (ties: the longer match). A
     long match is more precise, a shorter one leaves more depth to extend: the score trades them.
The drafter proposes the tree's proposal with the larger score (ties: the per-request tree's). Units:
tokens; probabilities in [0, 1].

A trie node is a pair [count, children] (children: token -> node), so feeding a token costs O(D) (the D
currently open suffixes each gain one child) and a proposal O(D + L). Memory grows with the distinct
substrings fed, at most D nodes per token: the per-request tree lives from a request's start to its stop.
"""
from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

import numpy as np

from sim.errors import ConfigError


@dataclass(frozen=True)
class SuffixConfig:
    """Suffix drafter settings (vLLM 0.33's `suffix_decoding_*` names and defaults): max_depth D (tokens of a
    tree path), max_spec_tokens (longest chain), max_spec_factor and max_spec_offset (the chain cap
    factor * match length + offset), min_token_prob (stop below this path probability), max_cached (finished
    outputs the global tree keeps; 0 = no global tree)."""

    max_depth: int = 24
    max_spec_tokens: int = 24
    max_spec_factor: float = 1.0
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    max_cached: int = 10000

    def __post_init__(self) -> None:
        for name in ("max_depth", "max_spec_tokens", "max_cached"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(f"suffix drafter setting {name} must be an integer, got {v!r}")
        if not 2 <= self.max_depth <= 256:
            raise ConfigError(f"suffix drafter max_depth must be in 2..256, got {self.max_depth}")
        if not 1 <= self.max_spec_tokens <= 256:
            raise ConfigError(f"suffix drafter max_spec_tokens must be in 1..256, got {self.max_spec_tokens}")
        if self.max_cached < 0:
            raise ConfigError(f"suffix drafter max_cached must be >= 0, got {self.max_cached}")
        for name in ("max_spec_factor", "max_spec_offset"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"suffix drafter setting {name} must be a finite number >= 0, got {v!r}")
        if not (isinstance(self.min_token_prob, (int, float)) and 0.0 <= self.min_token_prob <= 1.0):
            raise ConfigError(f"suffix drafter min_token_prob must be in [0, 1], got {self.min_token_prob!r}")


@dataclass(frozen=True)
class SuffixProposal:
    """A proposal: tokens, each slot's conditional acceptance estimate p_j, the matched suffix length m, the
    score (sum of the path probabilities) and which tree it came from ('request' or 'global')."""

    tokens: tuple
    conf: tuple
    match_len: int
    score: float
    source: str

    def __len__(self) -> int:
        return len(self.tokens)


NO_PROPOSAL = SuffixProposal((), (), 0, 0.0, "none")


class SuffixTree:
    """A trie of every substring of length <= max_depth of the sequences fed to it, with occurrence counts."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root: list = [0, {}]
        self._open: list = []  # nodes of the suffixes (length 1 .. D-1) ending at the last token fed

    def start(self) -> None:
        """Begin a new sequence: its substrings do not continue the previous one's."""
        self._open = []

    def feed(self, token: int) -> None:
        """Append one token to the current sequence: every open suffix (and the empty one) gains it."""
        opened = []
        for node in [self.root] + self._open:
            child = node[1].get(token)
            if child is None:
                child = node[1][token] = [0, {}]
            child[0] += 1
            opened.append(child)
        self._open = opened[: self.max_depth - 1]  # a path of D nodes cannot be extended further
        self.root[0] += 1

    def feed_all(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.feed(int(t))

    def remove(self, tokens: list) -> None:
        """Take one whole sequence fed by start() + feed_all(tokens) back out (counts down, empty nodes dropped)."""
        for i in range(len(tokens)):
            node = self.root
            path = []
            for t in tokens[i: i + self.max_depth]:
                child = node[1][t]
                path.append((node, t, child))
                node = child
            for parent, t, child in path:
                child[0] -= 1
                if child[0] <= 0:
                    del parent[1][t]
                    break
            self.root[0] -= 1

    def node(self, tokens) -> Optional[list]:
        """The node of the path `tokens` from the root, or None."""
        node = self.root
        for t in tokens:
            node = node[1].get(int(t))
            if node is None:
                return None
        return node

    def propose(self, context: list, cfg: SuffixConfig, source: str = "") -> SuffixProposal:
        """The best-scored greedy proposal over the matched suffixes of `context` (module docstring)."""
        t = len(context)
        best = NO_PROPOSAL
        for m in range(1, min(self.max_depth - 1, t) + 1):
            node = self.node(context[t - m:])
            if node is None:
                break  # a suffix that never occurred: no longer one did either
            if not node[1]:
                continue
            p = self._extend(node, m, cfg, source)
            if p.score >= best.score and len(p):
                best = p  # ties: the longer match
        return best

    def _extend(self, node: list, m: int, cfg: SuffixConfig, source: str) -> SuffixProposal:
        """Greedy extension from the node of a matched suffix of length m, by the most frequent child."""
        cap = min(cfg.max_spec_tokens, int(cfg.max_spec_factor * m + cfg.max_spec_offset), self.max_depth - m)
        toks, conf, prob, score = [], [], 1.0, 0.0
        while len(toks) < cap and node[1]:
            total = sum(c[0] for c in node[1].values())
            tok, child = min(node[1].items(), key=lambda kv: (-kv[1][0], kv[0]))
            p = child[0] / total
            if prob * p < cfg.min_token_prob:
                break
            prob *= p
            score += prob
            toks.append(tok)
            conf.append(p)
            node = child
        return SuffixProposal(tuple(toks), tuple(conf), m, score, source) if toks else NO_PROPOSAL


class SuffixDrafter:
    """The suffix drafter over many requests: start / propose / observe / stop per request, a global tree
    of finished outputs shared by all (module docstring)."""

    name = "suffix"

    def __init__(self, cfg: SuffixConfig = SuffixConfig()) -> None:
        self.cfg = cfg
        self.global_tree = SuffixTree(cfg.max_depth) if cfg.max_cached else None
        self._cached: deque = deque()
        self._req: dict = {}  # request id -> (its tree, its context, prompt length)

    def start(self, rid, prompt: Iterable[int]) -> None:
        """A request begins (or resumes): its tree is built over its prompt."""
        tree = SuffixTree(self.cfg.max_depth)
        ctx = [int(t) for t in prompt]
        tree.feed_all(ctx)
        self._req[rid] = (tree, ctx, len(ctx))

    def propose(self, rid) -> SuffixProposal:
        """The better-scored proposal of the request's tree and the global tree at its current context."""
        tree, ctx, _ = self._req[rid]
        best = tree.propose(ctx, self.cfg, "request")
        if self.global_tree is not None:
            other = self.global_tree.propose(ctx, self.cfg, "global")
            if other.score > best.score:
                best = other
        return best

    def observe(self, rid, tokens: Iterable[int]) -> None:
        """Tokens the request emitted this step join its context and its tree."""
        tree, ctx, _ = self._req[rid]
        for t in tokens:
            ctx.append(int(t))
            tree.feed(int(t))

    def stop(self, rid, finished: bool = True) -> None:
        """The request leaves: a finished one's output joins the global tree (the oldest leaves it past
        max_cached outputs)."""
        tree, ctx, p = self._req.pop(rid)
        if finished and self.global_tree is not None and len(ctx) > p:
            out = ctx[p:]
            self.global_tree.start()
            self.global_tree.feed_all(out)
            self._cached.append(out)
            if len(self._cached) > self.cfg.max_cached:
                self.global_tree.remove(self._cached.popleft())


def accepted_length(proposal: SuffixProposal, future: list) -> int:
    """Leading proposal tokens equal to the target's next tokens `future` (exact acceptance at temperature 0)."""
    n = 0
    for a, b in zip(proposal.tokens, future):
        if a != b:
            break
        n += 1
    return n


SETTINGS = {"max_depth": int, "max_spec_tokens": int, "max_spec_factor": float, "max_spec_offset": float,
            "min_token_prob": float, "max_cached": int}


def suffix_config(settings: dict) -> SuffixConfig:
    """SuffixConfig from a settings dict (SuffixConfig's field names); ConfigError (one line) for an unknown
    name or a value out of range."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ConfigError(f"suffix drafter: unknown setting(s) {', '.join(unknown)} (known: {', '.join(SETTINGS)})")
    return SuffixConfig(**settings)


class LiveSuffixDrafter(SuffixDrafter):
    """The suffix drafter as the engine runs it (sim.drafters.registry.Drafter, a live drafter): proposals for a
    batch as padded arrays, and its price.

    Confidence: each slot's p_j, the tree's empirical conditional frequency count(child) / count(children),
    through `calibrator` (p, e) -> acceptance estimate, e = match length + slot index [tokens]
    (sim/drafters/suffix_calibrate.py, fit on general text; None: the raw p_j, which over-states acceptance
    where the tree has seen little). Cost: a host-side walk of two tries per request, priced as the
    host n-gram lookup (cost_model.ngram_ms(R, on_gpu=False)) [ms]; simulation only, no real run checks it."""

    def __init__(self, cfg: SuffixConfig = SuffixConfig(), calibrator=None) -> None:
        super().__init__(cfg)
        self.calibrator = calibrator

    @property
    def width(self) -> int:
        return self.cfg.max_spec_tokens

    def propose(self, rids) -> tuple:  # the batch form of SuffixDrafter.propose (one request)
        K, R = self.width, len(rids)
        tok = np.zeros((R, K), dtype=np.int64)
        conf = np.zeros((R, K), dtype=np.float64)
        n = np.zeros(R, dtype=np.int64)
        for k, r in enumerate(rids):
            p = SuffixDrafter.propose(self, int(r))
            m = len(p)
            if m:
                tok[k, :m] = p.tokens
                raw = np.asarray(p.conf, dtype=np.float64)
                conf[k, :m] = raw if self.calibrator is None else self.calibrator(raw, p.match_len + np.arange(m))
                n[k] = m
        return tok, conf, n

    def cost(self, num_reqs: int, cost_model) -> float:
        return float(cost_model.ngram_ms(num_reqs, on_gpu=False))


def parse_suffix_settings(text: str) -> str:
    """A --suffix-config value: a JSON object of SuffixConfig settings, checked (ConfigError, one line, for bad JSON,
    an unknown name or a value out of range) and written back in a canonical form."""
    try:
        cfg = json.loads(text)
    except (ValueError, RecursionError):
        raise ConfigError(f"--suffix-config: not a JSON object of suffix drafter settings: {text[:60]!r}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"--suffix-config: expected a JSON object such as '{{\"max_depth\": 24}}', got {text[:60]!r}")
    suffix_config(cfg)
    return json.dumps(cfg, sort_keys=True)


def suffix_settings(text: str | None) -> dict:
    """The settings dict of a (checked) --suffix-config value; {} for None."""
    return {} if not text else json.loads(text)


# The calibrator of the drafter's confidences (fit on general text by python -m sim.drafters.suffix_calibrate,
# whose docstring gives the method): conf = table[bin of p_j in P_EDGES, bin of e = match length + j in E_EDGES].
P_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99)
E_EDGES = (1, 2, 4, 8, 16)
SMOOTH = 4.0  # fitting slots a cell's estimate is pulled towards the overall acceptance with
DEFAULT_SUFFIX_CALIBRATOR = Path(__file__).resolve().parents[2] / "models" / "calibrators" / "suffix-general.json"


class SuffixCalibrator:
    """conf = table[p bin, e bin]: the acceptance estimate of a slot with tree frequency p and context e [tokens]."""

    def __init__(self, table: np.ndarray) -> None:
        self.table = np.asarray(table, dtype=np.float64)

    def __call__(self, p: np.ndarray, e: np.ndarray) -> np.ndarray:
        i = np.searchsorted(P_EDGES, p, side="right") - 1
        k = np.searchsorted(E_EDGES, e, side="right") - 1
        return self.table[np.clip(i, 0, len(P_EDGES) - 1), np.clip(k, 0, len(E_EDGES) - 1)]

    @classmethod
    def load(cls, path=DEFAULT_SUFFIX_CALIBRATOR) -> "SuffixCalibrator":
        try:
            data = json.loads(Path(path).read_text())
            table = np.asarray(data["table"], dtype=np.float64)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"suffix calibrator {path}: cannot be read ({exc})") from None
        if table.shape != (len(P_EDGES), len(E_EDGES)) or not ((table >= 0) & (table <= 1)).all():
            raise ConfigError(f"suffix calibrator {path}: expected a {len(P_EDGES)} x {len(E_EDGES)} table in [0, 1]")
        return cls(table)


def fit(p: np.ndarray, e: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(table [len(P_EDGES), len(E_EDGES)], slots per cell) of the smoothed acceptance (module docstring)."""
    prior = float(y.mean()) if len(y) else 0.0
    i = np.searchsorted(P_EDGES, p, side="right") - 1
    k = np.searchsorted(E_EDGES, e, side="right") - 1
    shape = (len(P_EDGES), len(E_EDGES))
    cells = np.ravel_multi_index((np.clip(i, 0, shape[0] - 1), np.clip(k, 0, shape[1] - 1)), shape)
    n = np.bincount(cells, minlength=shape[0] * shape[1]).reshape(shape)
    a = np.bincount(cells, weights=y.astype(np.float64), minlength=shape[0] * shape[1]).reshape(shape)
    return (a + SMOOTH * prior) / (n + SMOOTH), n
