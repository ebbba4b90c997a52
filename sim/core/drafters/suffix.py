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

The definition is that trie with a node as a pair [count, {token: child}] (kept, as `RefTree`, in
tests/test_suffix_tree.py, which checks every proposal of this module against it). It is stored here flat
(SuffixTree: node ids index int64 arrays, edges in a numpy hash table, sim/core/drafters/edge_table.py), with each
node's child-count sum and most frequent child kept as counts change, so a greedy step is O(1); feeding a token
costs O(D) (the D open suffixes each gain a child; a suffix never followed by the token makes the longer ones
new without a look-up), a run of tokens is fed level by level at once with numpy (from BULK_MIN tokens), and a
proposal costs O(D L) with no walk for the request's own tree (its matched suffixes are the open ones). Only a
proposal reads the trees, so they catch up lazily (SuffixDrafter): a request's tree is built at its first
proposal, fed its new tokens at the next, and finished outputs join the global tree when a proposal next
reads it; the proposals are those of feeding every token as it comes (a tree's counts depend on what was fed,
not when). Memory: 4 int64 a node of a request's tree, 6 of the global tree's, plus 2-4 int64 of edge table;
one node per distinct substring (length <= D) of what a tree holds, at most D per token: a request's tree
from its first proposal to its stop (then freed), the global tree over at most max_cached outputs (nodes whose
count drops to 0 are freed and their ids reused); the drafter keeps each running request's context and the
cached outputs' tokens.
Memory estimate, checked before a run (`memory_bytes`, `check_memory`): BYTES_PER_NODE x D x (the `batch` longest
contexts, prompt + output [tokens], whose request trees may live at once + the max_cached longest outputs of the
global tree) [bytes]; BYTES_PER_NODE is the peak resident size measured per node (the arrays, the edge table at its
load factor, their growth). Refused in one line: one request's tree over TREE_LIMIT (a 10^6-token prompt at depth
24, or 40k tokens at depth 256: gigabytes for one request's drafter), or the whole estimate over 3/4 of the memory
this process can still take; HYBRIDSPEC_SUFFIX_MEMORY_GB=G sets the one limit instead (the whole estimate <= G GiB).
"""
from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass, fields
from typing import Iterable, Optional

import numpy as np

from sim.core.drafters.edge_table import EdgeTable
from sim.core.drafters.settings import check_value, setting, settings_from
from sim.core.drafters.suffix_acceptance import SOURCES, AcceptanceStats, group
from sim.infra.errors import ConfigError
from sim.infra import paths


@dataclass(frozen=True)
class SuffixConfig:
    """Suffix drafter settings (vLLM 0.33's `suffix_decoding_*` names and defaults), declared once here: the registry
    makes them the flags --suffix-max-depth ... and --suffix-config JSON (sim/core/drafters/settings.py)."""

    max_depth: int = setting(24, "tokens of a tree path (vLLM's suffix_decoding_max_tree_depth)", lo=2, hi=256)
    max_spec_tokens: int = setting(24, "the longest chain [tokens] (vLLM's num_speculative_tokens)", lo=1, hi=256)
    max_spec_factor: float = setting(1.0, "chain cap = factor * match length + offset (suffix_decoding_max_spec_"
                                     "factor)", lo=0.0)
    max_spec_offset: float = setting(0.0, "the offset of that cap [tokens]", lo=0.0)
    min_token_prob: float = setting(0.1, "stop a chain below this path probability (suffix_decoding_min_token_prob)",
                                    lo=0.0, hi=1.0)
    max_cached: int = setting(10000, "finished outputs the global tree keeps; 0 = no global tree "
                              "(suffix_decoding_max_cached_requests)", lo=0)
    confidence: str = setting("calibrated", "what a chain's per-slot confidences are: calibrated (the tree's "
                              "frequencies through the general-text calibrator), raw (the tree's frequencies, whose "
                              "path sums are Arctic Inference's score), online (vLLM main's acceptance statistics per "
                              "source, match length and position, learnt from the verified drafts; "
                              "sim/core/drafters/suffix_acceptance.py)")

    def __post_init__(self) -> None:
        for f in fields(self):
            check_value("suffix", SuffixConfig, f.name, getattr(self, f.name))
        if self.confidence not in CONFIDENCES:
            raise ConfigError(f"--suffix-confidence must be one of {', '.join(CONFIDENCES)}, got {self.confidence!r}")


CONFIDENCES = ("calibrated", "raw", "online")  # SuffixConfig.confidence's values (LiveSuffixDrafter)


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


BYTES_PER_NODE = 192  # peak resident bytes per tree node, measured on traces/codeedit.jsonl (132-226 at depth 24-256)
TREE_LIMIT = 2**30  # bytes one request's tree may take by default (module docstring)
MEMORY_ENV = "HYBRIDSPEC_SUFFIX_MEMORY_GB"


def _available_bytes() -> int | None:
    """What this process can still take: MemAvailable, and the address-space limit's headroom where one is set;
    None when neither is known."""
    import resource

    got = []
    try:
        with open("/proc/meminfo") as f:
            got += [int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:")]
    except (OSError, ValueError, IndexError):
        pass
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft != resource.RLIM_INFINITY:
        try:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * resource.getpagesize()
            got.append(max(soft - used, 0))
        except (OSError, ValueError):
            pass
    return min(got) if got else None


def memory_bytes(cfg: "SuffixConfig", contexts, outputs, batch: int) -> tuple[int, int]:
    """(the whole estimate, the largest request tree's) [bytes] of the suffix drafter over requests of `contexts`
    (prompt + output) and `outputs` tokens, at most `batch` at once (module docstring)."""
    ctx = np.sort(np.asarray(contexts, dtype=np.int64))[::-1]
    out = np.sort(np.asarray(outputs, dtype=np.int64))[::-1]
    per_token = BYTES_PER_NODE * cfg.max_depth
    live = int(ctx[:max(int(batch), 1)].sum()) * per_token
    cached = int(out[:cfg.max_cached].sum()) * per_token if cfg.max_cached else 0
    return live + cached, (int(ctx[0]) * per_token if len(ctx) else 0)


def check_memory(cfg: "SuffixConfig", contexts, outputs, batch: int) -> None:
    """ConfigError (one line, before any tree is built) when memory_bytes is past its limit (module docstring)."""
    total, tree = memory_bytes(cfg, contexts, outputs, batch)
    from sim.infra.inputs import env_size

    gib = 2**30
    limit_gib = env_size(MEMORY_ENV, "GiB")  # nan, inf, -1 or 0 refused: none of them may switch the guard off
    if limit_gib is not None:
        if total > limit_gib * gib:
            raise ConfigError(f"the suffix drafter would take about {total / gib:.1f} GiB (depth {cfg.max_depth}, batch "
                              f"{batch}), over {MEMORY_ENV}={limit_gib:g}; lower --suffix-max-depth or the batch")
        return
    if tree > TREE_LIMIT:
        raise ConfigError(f"the suffix drafter's tree of one request of {tree // (BYTES_PER_NODE * cfg.max_depth)} "
                          f"tokens at depth {cfg.max_depth} would take about {tree / gib:.1f} GiB (at most "
                          f"{TREE_LIMIT / gib:.0f} GiB a request); lower --suffix-max-depth, shorten the request, or "
                          f"set {MEMORY_ENV}")
    free = _available_bytes()
    if free is not None and total > 0.75 * free:
        raise ConfigError(f"the suffix drafter would take about {total / gib:.1f} GiB (depth {cfg.max_depth}, batch "
                          f"{batch}, {cfg.max_cached} cached outputs), more than the {free / gib:.1f} GiB this machine "
                          f"has free; lower --suffix-max-depth, --suffix-max-cached or the batch, or set {MEMORY_ENV}")


BULK_MIN = 384  # runs of fewer tokens are fed one by one: numpy's per-level overhead outweighs them (measured)
_KEY = 1 << 32  # an edge's key: parent node * _KEY + token (token ids in [0, 2**32), node ids below 2**31)


class SuffixTree:
    """A trie of every substring of length <= max_depth of the sequences fed to it, with occurrence counts.

    Stored flat (node ids index arrays; node 0 is the root) so that a node costs no Python object of its own
    (a node as a [count, {children}] pair cost two garbage-collected containers, and the collector's passes
    over millions of them were most of a three-drafter run's time):
      _edge           parent * _KEY + token -> child (sim/core/drafters/edge_table.py: two int64 arrays, looked up
                      one key at a time or a whole level of a sequence at once)
      _count[v]       occurrences of v's path in the sequences fed
      _csum[v]        the sum of v's children's counts (occurrences of v's path followed by a token)
      _best[v]        v's child of the largest count, ties to the smaller token (-1: no child); kept as
                      counts change, so a greedy step is O(1), not O(children)
      _tok[v]         the token of the edge into v
      _first[v], _next[v]  v's children as a list (first child, next sibling; -1 ends it): only removal walks
                      it, so a tree made with removable=False (a request's) keeps none
    Removal frees the nodes whose count reaches 0 (their ids are reused), so the tree holds exactly the distinct
    substrings (length <= max_depth) of the sequences it holds: 6 int64 per node (4 if not removable) and 2-4
    int64 of edge table."""

    def __init__(self, max_depth: int, removable: bool = True) -> None:
        self.max_depth = max_depth
        self._edge = EdgeTable()
        self._count = array("q", [0])
        self._csum = array("q", [0])
        self._best = array("q", [-1])
        self._tok = array("q", [-1])
        self._first = array("q", [-1]) if removable else None
        self._next = array("q", [-1]) if removable else None
        self._arrays = tuple(a for a in (self._count, self._csum, self._best, self._tok, self._first, self._next)
                             if a is not None)
        self._free: list = []  # ids of removed nodes, reused first
        self._open: list = []  # nodes of the suffixes (length 1 .. D-1) ending at the last token fed

    def __len__(self) -> int:
        """Nodes held, the root included."""
        return len(self._count) - len(self._free)

    def start(self) -> None:
        """Begin a new sequence: its substrings do not continue the previous one's."""
        self._open = []

    def _new(self, parent: int, token: int) -> int:
        if self._free:
            v = self._free.pop()
            self._count[v] = self._csum[v] = 0
            self._best[v] = -1
            self._first[v] = -1
            self._tok[v] = token
        else:
            v = len(self._count)
            self._count.append(0)
            self._csum.append(0)
            self._best.append(-1)
            self._tok.append(token)
            if self._first is not None:
                self._first.append(-1)
                self._next.append(-1)
        if self._first is not None:
            self._next[v] = self._first[parent]
            self._first[parent] = v
        self._edge.put(parent * _KEY + token, v)
        return v

    def feed(self, token: int) -> None:
        """Append one token to the current sequence: every open suffix (and the empty one) gains it."""
        token = int(token)
        if not 0 <= token < _KEY:
            raise ValueError(f"suffix tree: token id {token} out of range [0, 2**32)")
        edge, count, csum, best, tok = self._edge, self._count, self._csum, self._best, self._tok
        opened = []
        nodes = [0] + self._open  # the suffixes ending at the last token, shortest first
        i = 0
        for node in nodes:
            c = edge.get(node * _KEY + token, -1)
            if c < 0:
                break
            k = count[c] + 1
            count[c] = k
            csum[node] += 1
            b = best[node]
            if b != c and (k > count[b] or (k == count[b] and token < tok[b])):
                best[node] = c
            opened.append(c)
            i += 1
        for node in nodes[i:]:  # a suffix never followed by `token`: no longer one was either (no look-up)
            c = self._new(node, token)
            count[c] = 1
            csum[node] += 1
            b = best[node]
            if b < 0 or (count[b] == 1 and token < tok[b]):
                best[node] = c
            opened.append(c)
        self._open = opened[: self.max_depth - 1]  # a path of D nodes cannot be extended further
        count[0] += 1

    def feed_all(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.feed(t)

    def feed_sequence(self, tokens) -> None:
        """start() + feed_all(tokens)."""
        self.feed_sequences([tokens])

    def feed_sequences(self, seqs: list) -> None:
        """start() + feed_all(seq) for each sequence in turn, all in one feed_more pass (each a new sequence)."""
        seqs = [np.asarray(q, dtype=np.int64).ravel() for q in seqs]
        ends_empty = not seqs or not len(seqs[-1])
        seqs = [q for q in seqs if len(q)]
        self.start()
        if seqs:
            starts = np.zeros(sum(len(q) for q in seqs), dtype=bool)
            starts[np.cumsum([0] + [len(q) for q in seqs[:-1]])] = True
            self._feed_runs(np.concatenate(seqs), starts)
        if ends_empty:  # the last sequence started and had nothing: no suffix is open
            self.start()

    def feed_more(self, tokens) -> None:
        """feed_all(tokens), continuing the current sequence, in one pass (below)."""
        x = np.asarray(tokens, dtype=np.int64).ravel()
        self._feed_runs(x, np.zeros(len(x), dtype=bool))

    def _feed_runs(self, x: np.ndarray, starts: np.ndarray) -> None:
        """feed_all(x), with start() before each token where `starts` is set, level by level over all of x at once
        (numpy): the same tree, the same open suffixes. Level d holds the substrings of length d ending at each
        token j; each is its parent (length d - 1, ending at token j - 1: level d - 1's; for the first token
        of x the open suffix of length d - 1; none for a sequence's first token) and the edge token x[j], so a
        level is one unique() of (parent, token) keys and one batch of edge look-ups: counts += occurrences,
        parents' csum += them, new nodes linked under their parents, and each parent's best child the largest
        (count, -token) among its old best and its children this level touched (the others' counts did not
        change)."""
        n = len(x)
        if n < max(BULK_MIN, 1):  # numpy's per-level overhead outweighs a few tokens fed one by one
            for t, s in zip(x.tolist(), starts.tolist()):
                if s:
                    self.start()
                self.feed(t)
            return
        if x.min() < 0 or x.max() >= _KEY:
            raise ValueError(f"suffix tree: token ids out of range [0, 2**32) in a run of {n}")
        fresh = len(self._edge) == 0  # an empty tree (a request's at its start): every node this call makes is new
        old_open = [] if starts[0] else self._open
        last = n - 1 - int(np.flatnonzero(starts)[-1]) if starts.any() else n - 1 + len(old_open)  # ... its length - 1
        ids = np.zeros(n, dtype=np.int64)  # level d - 1's node ending at each token (level 0: the root)
        opened = []
        for d in range(1, self.max_depth + 1):
            if d == 1:
                par = ids
            else:
                head = old_open[d - 2] if len(old_open) >= d - 1 else -1
                par = np.concatenate([[head], ids[:-1]])
                par[starts] = -1
            ok = par >= 0
            if not ok.any():
                break
            keys = par[ok] * _KEY + x[ok]
            uk, inv, cnt = np.unique(keys, return_inverse=True, return_counts=True)
            got = np.full(len(uk), -1, dtype=np.int64) if fresh else self._edge.get_many(uk)
            new = got < 0
            if new.any():
                got[new] = self._alloc(int(new.sum()))
                self._edge.put_many(uk[new], got[new])
            self._bulk_update(got, uk // _KEY, uk % _KEY, cnt, new)
            ids = np.full(n, -1, dtype=np.int64)
            ids[ok] = got[inv.ravel()]
            if d <= last + 1:
                opened.append(int(ids[-1]))  # the node of the length-d suffix ending at the last token
        self._open = opened[: self.max_depth - 1]
        self._count[0] += n

    def _alloc(self, k: int) -> np.ndarray:
        """k node ids (freed ones first); fresh ones are appended to every array, their fields set by the caller."""
        reuse = [self._free.pop() for _ in range(min(k, len(self._free)))]
        fresh = k - len(reuse)
        start = len(self._count)
        if fresh:
            blank = np.zeros(fresh, dtype=np.int64).tobytes()
            for a in self._arrays:
                a.frombytes(blank)
        return np.concatenate([np.asarray(reuse, dtype=np.int64), np.arange(start, start + fresh, dtype=np.int64)])

    def _bulk_update(self, ids, up, ut, cnt, new) -> None:
        """One level of feed_more: children `ids` (parents `up`, tokens `ut`, `new` ones just allocated) gain
        `cnt` occurrences each. The children come sorted by (parent, token) (unique() of parent * _KEY + token),
        so each parent's are one group, in token order."""
        view = lambda a: np.frombuffer(a, dtype=np.int64)  # noqa: E731  (writable views, dropped on return)
        count, csum, best, tok = (view(a) for a in (self._count, self._csum, self._best, self._tok))
        if new.any():
            v, u = ids[new], up[new]  # sorted by parent too
            count[v] = 0
            csum[v] = 0
            best[v] = -1
            tok[v] = ut[new]
        if new.any() and self._first is not None:
            first, nxt = view(self._first), view(self._next)
            first[v] = -1
            step = u[1:] != u[:-1]
            last = np.r_[step, True]  # the last new child of each parent: linked before its old ones
            nxt[v[:-1]] = v[1:]
            nxt[v[last]] = first[u[last]]
            first[u[np.r_[True, step]]] = v[np.r_[True, step]]
        k = count[ids] + cnt
        count[ids] = k
        g = np.flatnonzero(np.r_[True, up[1:] != up[:-1]])  # each parent's group starts
        par = up[g]
        csum[par] += np.add.reduceat(cnt, g)
        # each parent's best: its touched child of the largest count, the first (smallest token) among equals,
        # against its old best (untouched children kept their counts, at most the old best's)
        top = np.maximum.reduceat(k, g)
        size = np.diff(np.r_[g, len(ids)])
        at = np.flatnonzero(k == np.repeat(top, size))
        grp = np.searchsorted(g, at, side="right")  # group (+1) of each maximum
        first_at = at[np.r_[True, grp[1:] != grp[:-1]]]
        cand, ck, ct = ids[first_at], top, ut[first_at]
        ob = best[par]
        obk = count[np.maximum(ob, 0)]
        take = (ob < 0) | (ck > obk) | ((ck == obk) & (ct < tok[np.maximum(ob, 0)]))
        best[par[take]] = cand[take]

    def remove(self, tokens: list) -> None:
        """Take one whole sequence fed by start() + feed_all(tokens) back out (counts down, nodes whose count
        reaches 0 freed: every node below one is on the same path, so the walk frees them all)."""
        if self._first is None:
            raise RuntimeError("suffix tree: made with removable=False")
        edge, count, csum, best = self._edge, self._count, self._csum, self._best
        for i in range(len(tokens)):
            node = 0
            for t in tokens[i: i + self.max_depth]:
                key = node * _KEY + int(t)
                c = edge.get(key)
                count[c] -= 1
                csum[node] -= 1
                if count[c] <= 0:
                    edge.delete(key)
                    self._unlink(node, c)
                    self._free.append(c)
                if best[node] == c:
                    self._rebest(node)
                node = c
            count[0] -= 1

    def _unlink(self, parent: int, v: int) -> None:
        first, nxt = self._first, self._next
        if first[parent] == v:
            first[parent] = nxt[v]
            return
        u = first[parent]
        while nxt[u] != v:
            u = nxt[u]
        nxt[u] = nxt[v]

    def _rebest(self, v: int) -> None:
        """v's most frequent child again (ties: the smaller token), after a child's count went down."""
        count, tok, nxt = self._count, self._tok, self._next
        b, u = -1, self._first[v]
        while u >= 0:
            if b < 0 or count[u] > count[b] or (count[u] == count[b] and tok[u] < tok[b]):
                b = u
            u = nxt[u]
        self._best[v] = b

    def node(self, tokens) -> Optional[int]:
        """The node of the path `tokens` from the root, or None."""
        node, edge = 0, self._edge
        for t in tokens:
            node = edge.get(node * _KEY + int(t), -1)
            if node < 0:
                return None
        return node

    def count(self, node: int) -> int:
        """Occurrences of the node's path in the sequences fed."""
        return self._count[node]

    def propose(self, context: list, cfg: SuffixConfig, source: str = "") -> SuffixProposal:
        """The best-scored greedy proposal over the matched suffixes of `context` (module docstring)."""
        t = len(context)
        matched = []
        for m in range(1, min(self.max_depth - 1, t) + 1):
            node = self.node(context[t - m:])
            if node is None:
                break  # a suffix that never occurred: no longer one did either
            matched.append(node)
        return self._best_of(matched, cfg, source)

    def propose_fed(self, cfg: SuffixConfig, source: str = "") -> SuffixProposal:
        """propose(context) where `context` is the sequence fed since the last start(): its suffixes' nodes are
        the open ones, with no walk."""
        return self._best_of(self._open, cfg, source)

    def _best_of(self, matched: list, cfg: SuffixConfig, source: str) -> SuffixProposal:
        """The best-scored extension over `matched`, the nodes of the matched suffixes of length 1, 2, ..."""
        best = NO_PROPOSAL
        csum = self._csum
        for i, node in enumerate(matched):
            if not csum[node]:
                continue
            p = self._extend(node, i + 1, cfg, source)
            if p.score >= best.score and len(p):
                best = p  # ties: the longer match
        return best

    def _extend(self, node: int, m: int, cfg: SuffixConfig, source: str) -> SuffixProposal:
        """Greedy extension from the node of a matched suffix of length m, by the most frequent child."""
        cap = min(cfg.max_spec_tokens, int(cfg.max_spec_factor * m + cfg.max_spec_offset), self.max_depth - m)
        count, csum, best, tok = self._count, self._csum, self._best, self._tok
        toks, conf, prob, score, floor = [], [], 1.0, 0.0, cfg.min_token_prob
        while len(toks) < cap:
            c = best[node]
            if c < 0:
                break
            p = count[c] / csum[node]
            if prob * p < floor:
                break
            prob *= p
            score += prob
            toks.append(tok[c])
            conf.append(p)
            node = c
        return SuffixProposal(tuple(toks), tuple(conf), m, score, source) if toks else NO_PROPOSAL


class SuffixDrafter:
    """The suffix drafter over many requests: start / propose / observe / stop per request, a global tree
    of finished outputs shared by all (module docstring)."""

    name = "suffix"

    def __init__(self, cfg: SuffixConfig = SuffixConfig()) -> None:
        self.cfg = cfg
        self.global_tree = SuffixTree(cfg.max_depth) if cfg.max_cached else None
        self._cached: deque = deque()  # the outputs the global tree holds, oldest first
        self._finished: deque = deque()  # outputs finished since the global tree was last read, not in it yet
        #                                   (the newest max_cached: an older one would join and leave at once)
        self._req: dict = {}  # request id -> [its tree (None until its first proposal), its context, prompt
        #                       length, tokens of the context fed to its tree]

    # Only a proposal reads the trees, so each catches up when one is made, with what happened since the last,
    # in runs fed at once (SuffixTree.feed_more): a request's tree is built at its first proposal and fed its
    # new tokens at the next ones; finished outputs join the global tree when a proposal next reads it. A
    # request that never proposes (a policy that seldom runs the drafter) never costs a tree. The proposals
    # are those of feeding every token at once: a tree's counts depend on what was fed, not when.
    def check_memory(self, contexts, outputs, batch: int) -> None:
        """The module's check_memory for this drafter's settings, before a run (the engine calls it)."""
        check_memory(self.cfg, contexts, outputs, batch)

    def start(self, rid, prompt: Iterable[int]) -> None:
        """A request begins (or resumes) with its prompt (a prompt whose tree alone is past the limit is refused here
        too, for a caller that gave no estimate up front)."""
        ctx = [int(t) for t in prompt]
        if len(ctx) * BYTES_PER_NODE * self.cfg.max_depth > TREE_LIMIT:
            check_memory(self.cfg, [len(ctx)], [0], 1)
        self._req[rid] = [None, ctx, len(ctx), 0]

    def propose(self, rid) -> SuffixProposal:
        """The better-scored proposal of the request's tree and the global tree at its current context."""
        req = self._req[rid]
        tree, ctx, _, fed = req
        if tree is None:
            tree = req[0] = SuffixTree(self.cfg.max_depth, removable=False)  # it is dropped whole at its stop
            tree.feed_sequence(ctx)
        elif fed < len(ctx):
            tree.feed_more(ctx[fed:])
        req[3] = len(ctx)
        best = tree.propose_fed(self.cfg, "request")  # the request's tree was fed exactly ctx
        if self.global_tree is not None:
            self.catch_up()
            other = self.global_tree.propose(ctx, self.cfg, "global")
            if other.score > best.score:
                best = other
        return best

    def observe(self, rid, tokens: Iterable[int]) -> None:
        """Tokens the request emitted this step join its context."""
        self._req[rid][1].extend(int(t) for t in tokens)

    def stop(self, rid, finished: bool = True) -> None:
        """The request leaves: a finished one's output is to join the global tree (the oldest leaves it past
        max_cached outputs)."""
        _, ctx, p, _ = self._req.pop(rid)
        if finished and self.global_tree is not None and len(ctx) > p:
            self._finished.append(ctx[p:])
            if len(self._finished) > self.cfg.max_cached:  # it would leave the tree as soon as it joined
                self._finished.popleft()

    def catch_up(self) -> None:
        """The global tree takes in the outputs finished since it was last read, in order (and drops the oldest
        past max_cached)."""
        if not self._finished:
            return
        self.global_tree.feed_sequences(list(self._finished))  # the counts are sums over the outputs: any order
        self._cached.extend(self._finished)
        self._finished = deque()
        while len(self._cached) > self.cfg.max_cached:
            self.global_tree.remove(self._cached.popleft())


def accepted_length(proposal: SuffixProposal, future: list) -> int:
    """Leading proposal tokens equal to the target's next tokens `future` (exact acceptance at temperature 0)."""
    n = 0
    for a, b in zip(proposal.tokens, future):
        if a != b:
            break
        n += 1
    return n


def suffix_config(settings: dict) -> SuffixConfig:
    """SuffixConfig from a settings dict (SuffixConfig's field names); ConfigError (one line) for an unknown
    name or a value out of range."""
    return settings_from("suffix", SuffixConfig, settings)


class LiveSuffixDrafter(SuffixDrafter):
    """The suffix drafter as the engine runs it (sim.core.drafters.registry.Drafter, a live drafter): proposals for a
    batch as padded arrays, and its price.

    Confidence (SuffixConfig.confidence): `calibrated`, each slot's p_j, the tree's empirical conditional frequency
    count(child) / count(children), through `calibrator` (p, e) -> acceptance estimate, e = match length + slot
    index [tokens] (sim/api/suffix_calibrate.py, fit on general text; None: the raw p_j); `raw`, the p_j (which
    over-state acceptance where the tree has seen little; their path sum is the proposal's score); `online`, vLLM
    main's acceptance statistics of the proposal's (source, match length) group per position, learnt from the
    verdicts the engine reports (`verdict`; sim/core/drafters/suffix_acceptance.py). Cost: a host-side walk of two tries per request, priced as the
    host n-gram lookup (cost_model.ngram_ms(R, on_gpu=False)) [ms]; simulation only, no real run checks it."""

    def __init__(self, cfg: SuffixConfig = SuffixConfig(), calibrator=None) -> None:
        super().__init__(cfg)
        self.calibrator = calibrator if cfg.confidence == "calibrated" else None
        self.stats = AcceptanceStats(cfg.max_spec_tokens) if cfg.confidence == "online" else None
        self._group: dict = {}  # request -> (its last proposal's group, its length): `online` only

    @property
    def width(self) -> int:
        return self.cfg.max_spec_tokens

    def propose(self, rids) -> tuple:  # the batch form of SuffixDrafter.propose (one request)
        K, R = self.width, len(rids)
        tok = np.zeros((R, K), dtype=np.int64)
        conf = np.zeros((R, K), dtype=np.float64)
        n = np.zeros(R, dtype=np.int64)
        raw, ctx = [], []
        source, match = np.zeros(R, dtype=np.int64), np.zeros(R, dtype=np.int64)
        for k, r in enumerate(rids):
            p = SuffixDrafter.propose(self, int(r))
            m = len(p)
            if m:
                tok[k, :m] = p.tokens
                n[k] = m
                raw.extend(p.conf)
                ctx.extend(range(p.match_len, p.match_len + m))
                source[k], match[k] = SOURCES.index(p.source), p.match_len
        if self.stats is not None:  # vLLM main's acceptance statistics of each proposal's group
            groups = group(source, match)
            self._group.update(zip(np.asarray(rids).tolist(), zip(groups.tolist(), n.tolist())))
            return tok, self.stats.confidences(groups, n), n
        if raw:  # the calibrator is elementwise: one call for the batch's slots (row-major, as the mask)
            raw = np.asarray(raw, dtype=np.float64)
            conf[np.arange(K)[None, :] < n[:, None]] = (
                raw if self.calibrator is None else self.calibrator(raw, np.asarray(ctx, dtype=np.int64)))
        return tok, conf, n

    def verdict(self, rids, verified: np.ndarray, accepted: np.ndarray) -> None:
        """The target's verdict on each request's last proposal, after a step that ran the drafter: its slots
        verified and, of those, accepted [tokens]; what `online` confidences learn from (others ignore it)."""
        if self.stats is None:
            return
        got = [self._group.pop(int(r), (0, 0)) for r in rids]
        if got:
            g, valid = (np.asarray(x, dtype=np.int64) for x in zip(*got))
            self.stats.observe(g, valid, verified, accepted)

    def stop(self, rid, finished: bool = True) -> None:
        self._group.pop(rid, None)
        super().stop(rid, finished)

    def cost(self, num_reqs: int, cost_model) -> float:
        return float(cost_model.ngram_ms(num_reqs, on_gpu=False))


# The calibrator of the drafter's confidences (fit on general text by python -m sim.suffix_calibrate,
# whose docstring gives the method): conf = table[bin of p_j in P_EDGES, bin of e = match length + j in E_EDGES].
P_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99)
E_EDGES = (1, 2, 4, 8, 16)
SMOOTH = 4.0  # fitting slots a cell's estimate is pulled towards the overall acceptance with
DEFAULT_SUFFIX_CALIBRATOR = paths.MODELS / "calibrators" / "suffix-general.json"


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
        from sim.infra.inputs import CONFIG, List, Num, Obj, read_json

        row = List(Num(0, 1), len(E_EDGES), len(E_EDGES))
        data = read_json(path, CONFIG, Obj({"table": List(row, len(P_EDGES), len(P_EDGES))}), what="suffix calibrator")
        table = np.asarray(data["table"], dtype=np.float64)
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
