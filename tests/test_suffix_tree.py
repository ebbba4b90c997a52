"""The suffix drafter's flat tree (sim/core/drafters/suffix.py: SuffixTree, arrays and one int-keyed dict) against the
straightforward definition kept here (`RefTree`: a trie of [count, {token: child}] nodes, the drafter's first
form): the same proposal (tokens, confidences, match length, score, source) at every position of random and real
token streams, through prompts, outputs, a global tree of finished outputs and its removals past max_cached; and
the flat tree frees what it removes."""
import random

import pytest

from sim.core.drafters.suffix import NO_PROPOSAL, SuffixConfig, SuffixDrafter, SuffixProposal, SuffixTree


class RefTree:
    """The definition: a trie of every substring of length <= max_depth, a node a [count, children] pair."""

    def __init__(self, max_depth):
        self.max_depth, self.root, self._open = max_depth, [0, {}], []

    def start(self):
        self._open = []

    def feed(self, token):
        opened = []
        for node in [self.root] + self._open:
            child = node[1].get(token)
            if child is None:
                child = node[1][token] = [0, {}]
            child[0] += 1
            opened.append(child)
        self._open = opened[: self.max_depth - 1]
        self.root[0] += 1

    def remove(self, tokens):
        for i in range(len(tokens)):
            node, path = self.root, []
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

    def node(self, tokens):
        node = self.root
        for t in tokens:
            node = node[1].get(t)
            if node is None:
                return None
        return node

    def propose(self, context, cfg, source):
        t, best = len(context), NO_PROPOSAL
        for m in range(1, min(self.max_depth - 1, t) + 1):
            node = self.node(context[t - m:])
            if node is None:
                break
            if not node[1]:
                continue
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
            p = SuffixProposal(tuple(toks), tuple(conf), m, score, source) if toks else NO_PROPOSAL
            if p.score >= best.score and len(p):
                best = p
        return best


class RefDrafter:
    """SuffixDrafter's definition over RefTree (per-request trees, a global tree of finished outputs)."""

    def __init__(self, cfg):
        self.cfg, self.glob, self.cached, self.req = cfg, RefTree(cfg.max_depth) if cfg.max_cached else None, [], {}

    def start(self, rid, prompt):
        tree = RefTree(self.cfg.max_depth)
        for t in prompt:
            tree.feed(t)
        self.req[rid] = (tree, list(prompt), len(prompt))

    def propose(self, rid):
        tree, ctx, _ = self.req[rid]
        best = tree.propose(ctx, self.cfg, "request")
        if self.glob is not None:
            other = self.glob.propose(ctx, self.cfg, "global")
            if other.score > best.score:
                best = other
        return best

    def observe(self, rid, tokens):
        tree, ctx, _ = self.req[rid]
        for t in tokens:
            ctx.append(t)
            tree.feed(t)

    def stop(self, rid, finished=True):
        tree, ctx, p = self.req.pop(rid)
        if finished and self.glob is not None and len(ctx) > p:
            out = ctx[p:]
            self.glob.start()
            for t in out:
                self.glob.feed(t)
            self.cached.append(out)
            if len(self.cached) > self.cfg.max_cached:
                self.glob.remove(self.cached.pop(0))


def _replay(cfg, requests, rng, batch):
    """Run requests (prompt, output) through both drafters, `batch` at a time in an interleaved schedule (each step
    every running request proposes, then emits 1-4 tokens; some stop unfinished); every proposal must be equal."""
    fast, ref = SuffixDrafter(cfg), RefDrafter(cfg)
    waiting, running, n = list(enumerate(requests)), {}, 0
    while waiting or running:
        while waiting and len(running) < batch:
            rid, (prompt, out) = waiting.pop(0)
            fast.start(rid, prompt)
            ref.start(rid, prompt)
            running[rid] = (out, 0)
        for rid in list(running):
            out, i = running[rid]
            if rng.random() < 0.7:  # some steps skip the drafter: observed tokens pile up before a proposal
                assert fast.propose(rid) == ref.propose(rid), (rid, i)
                n += 1
            step = out[i: i + rng.randint(1, 4)]
            fast.observe(rid, step)
            ref.observe(rid, step)
            i += len(step)
            if i >= len(out) or rng.random() < 0.01:
                done = i >= len(out)
                fast.stop(rid, done)
                ref.stop(rid, done)
                del running[rid]
            else:
                running[rid] = (out, i)
    return n, fast


def _random_requests(rng, n, vocab):
    """Token streams with repeats (a small vocabulary, copied stretches), as code edits have."""
    out = []
    for _ in range(n):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(0, 60))]
        resp = []
        while len(resp) < rng.randrange(1, 80):
            if prompt and rng.random() < 0.5:
                i = rng.randrange(len(prompt))
                resp += prompt[i: i + rng.randrange(1, 12)]
            else:
                resp.append(rng.randrange(vocab))
        out.append((prompt, resp))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_flat_tree_proposes_as_the_definition_on_random_streams(seed, monkeypatch):
    import sim.core.drafters.suffix as sx

    if seed % 2:  # every prompt and finished output fed whole (feed_sequence's numpy levels)
        monkeypatch.setattr(sx, "BULK_MIN", 0)
    rng = random.Random(seed)
    cfg = SuffixConfig(max_depth=rng.choice([2, 3, 5, 8, 24]), max_spec_tokens=rng.choice([1, 4, 24]),
                       max_spec_factor=rng.choice([0.5, 1.0, 4.0]), max_spec_offset=rng.choice([0.0, 1.0, 2.5]),
                       min_token_prob=rng.choice([0.0, 0.1, 0.5]), max_cached=rng.choice([0, 1, 3, 10000]))
    n, fast = _replay(cfg, _random_requests(rng, 40, rng.choice([2, 5, 30])), rng, rng.choice([1, 4, 16]))
    assert n > 150
    if cfg.max_cached and cfg.max_cached < 40:  # removals happened: the tree holds only what it keeps
        fast.catch_up()
        want = RefTree(cfg.max_depth)
        for out in fast._cached:
            want.start()
            for t in out:
                want.feed(t)
        assert len(fast.global_tree) == 1 + _nodes(want.root)


def _nodes(node):
    return sum(1 + _nodes(c) for c in node[1].values())


def test_flat_tree_proposes_as_the_definition_on_real_token_streams():
    from sim.core.trace import load_trace

    reqs = load_trace("traces/codeedit.jsonl", limit=6).requests
    streams = [(r.prompt_ids[-600:].tolist(), r.output_ids[:300].tolist()) for r in reqs]
    n, _ = _replay(SuffixConfig(max_cached=2), streams, random.Random(0), 3)
    assert n > 150


def test_counts_and_removal_free_nodes():
    rng = random.Random(1)
    seqs = [[rng.randrange(3) for _ in range(rng.randrange(1, 30))] for _ in range(8)]
    tree, ref = SuffixTree(4), RefTree(4)
    for s in seqs:
        tree.start(), ref.start()
        for t in s:
            tree.feed(t), ref.feed(t)
    for _ in range(200):
        s = rng.choice(seqs)
        i = rng.randrange(len(s))
        path = s[i: i + rng.randrange(1, 5)]
        assert tree.count(tree.node(path)) == ref.node(path)[0]
    for s in seqs:
        tree.remove(s)
    assert len(tree) == 1 and not tree._edge and tree.count(0) == 0  # nothing left but the root
    kept = SuffixTree(4, removable=False)  # a request's tree: no child lists, no removal
    kept.feed_sequence(seqs[0])
    assert kept.count(kept.node(seqs[0][:1])) == seqs[0].count(seqs[0][0]) and kept._first is None
    with pytest.raises(RuntimeError, match="removable"):
        kept.remove(seqs[0])
    with pytest.raises(ValueError, match="token id"):
        tree.feed(-1)


def _path(tree, v):
    """The path of node v (searched from the root)."""
    return next(p for p, _ in _walk(tree) if _ == v)


def _walk(tree):
    stack = [(0, ())]
    while stack:
        v, path = stack.pop()
        yield path, v
        u = tree._first[v]
        while u >= 0:
            stack.append((u, path + (tree._tok[u],)))
            u = tree._next[u]


def _canon(tree):
    """path -> (count, children's count sum, best child's token) over every node of a flat tree, by its lists."""
    out, stack = {}, [(0, ())]
    while stack:
        v, path = stack.pop()
        b = tree._best[v]
        out[path] = (tree._count[v], tree._csum[v], tree._tok[b] if b >= 0 else None)
        u = tree._first[v]
        while u >= 0:
            stack.append((u, path + (tree._tok[u],)))
            u = tree._next[u]
    return out


@pytest.mark.parametrize("seed", range(4))
def test_feeding_runs_at_once_builds_the_token_by_token_tree(seed, monkeypatch):
    import sim.core.drafters.suffix as sx

    monkeypatch.setattr(sx, "BULK_MIN", 0)
    rng = random.Random(seed)
    D = rng.choice([2, 4, 24])
    bulk, step = SuffixTree(D), SuffixTree(D)
    kept = []
    for _ in range(12):
        seq = [rng.randrange(rng.choice([2, 7, 200])) for _ in range(rng.randrange(0, 300))]
        bulk.start()
        i = 0
        while i < len(seq):  # in runs of any length, each continuing the last (feed_more)
            j = i + rng.choice([1, 3, 40, 300])
            bulk.feed_more(seq[i:j])
            i = j
        step.start()
        step.feed_all(seq)
        kept.append(seq)
        assert [_path(bulk, v) for v in bulk._open] == [_path(step, v) for v in step._open]
        if len(kept) > 3 and rng.random() < 0.5:  # freed ids are reused by the next sequence
            old = kept.pop(0)
            bulk.remove(old)
            step.remove(old)
        assert _canon(bulk) == _canon(step)
        group = [[rng.randrange(7) for _ in range(rng.randrange(0, 60))] for _ in range(rng.randrange(1, 5))]
        bulk.feed_sequences(group)  # several sequences in one pass
        for q in group:
            step.start()
            step.feed_all(q)
        kept += [q for q in group if q]
        assert _canon(bulk) == _canon(step)
        assert [_path(bulk, v) for v in bulk._open] == [_path(step, v) for v in step._open]
    assert len(bulk) == len(step) == len(_canon(step))


def test_batch_proposals_calibrate_each_slot_as_one_request_would():
    import numpy as np

    from sim.core.drafters.suffix import LiveSuffixDrafter, SuffixCalibrator

    cal = SuffixCalibrator.load()
    d = LiveSuffixDrafter(SuffixConfig(max_depth=8, max_spec_tokens=6, max_spec_factor=3.0), cal)
    rng = random.Random(3)
    reqs = _random_requests(rng, 12, 4)
    for rid, (prompt, out) in enumerate(reqs):
        d.start(rid, prompt)
        d.observe(rid, out[: len(out) // 2])
    rids = np.array([5, 0, 11, 3, 7, 1])
    tok, conf, n = d.propose(rids)
    assert n.sum() > 0
    for k, r in enumerate(rids.tolist()):
        p = SuffixDrafter.propose(d, r)
        assert n[k] == len(p) and tuple(tok[k, :n[k]].tolist()) == p.tokens and not tok[k, n[k]:].any()
        want = cal(np.asarray(p.conf), p.match_len + np.arange(len(p))) if len(p) else []
        assert np.array_equal(conf[k, :n[k]], want) and not conf[k, n[k]:].any()


def test_edge_table_is_a_map():
    """sim/core/drafters/edge_table.py against a dict: one-key and many-key puts, gets and deletes, through rebuilds."""
    import numpy as np

    from sim.core.drafters.edge_table import EdgeTable

    rng = random.Random(0)
    for _ in range(20):
        t, ref = EdgeTable(bits=rng.choice([1, 2, 4])), {}
        for _ in range(300):
            op = rng.random()
            if op < 0.4:
                k = rng.randrange(rng.choice([50, 10**6, 2**62]))
                if k not in ref:
                    ref[k] = rng.randrange(10**9)
                    t.put(k, ref[k])
            elif op < 0.6 and ref:
                k = rng.choice(list(ref))
                t.delete(k)
                del ref[k]
            elif op < 0.8:
                ks = list({rng.randrange(2**40) for _ in range(rng.randrange(30))} - set(ref))
                vs = [rng.randrange(10**9) for _ in ks]
                t.put_many(np.array(ks, dtype=np.int64), np.array(vs, dtype=np.int64))
                ref.update(zip(ks, vs))
            else:
                qs = [rng.choice(list(ref)) if ref and rng.random() < 0.5 else rng.randrange(2**40) for _ in range(20)]
                got = t.get_many(np.array(qs, dtype=np.int64)).tolist()
                assert got == [ref.get(q, -1) for q in qs] == [t.get(q, -1) for q in qs]
            assert len(t) == len(ref)
            assert 2 * (t.used + t.deleted) <= len(t.keys)  # at most half full


def test_outputs_waiting_for_the_global_tree_are_bounded():
    """Finished outputs wait for the next proposal to join the global tree; no more than max_cached of them
    (an older one would join and leave at once), and the proposal is the definition's."""
    cfg = SuffixConfig(max_depth=6, max_cached=2, max_spec_factor=4.0)
    fast, ref = SuffixDrafter(cfg), RefDrafter(cfg)
    for k in range(7):
        for d in (fast, ref):
            d.start(k, [1, 2])
            d.observe(k, [10 + k, 11 + k, 12 + k, 13])
            d.stop(k)
        assert len(fast._finished) <= 2
    for d in (fast, ref):
        d.start("q", [0])
        d.observe("q", [15])
    assert fast.propose("q") == ref.propose("q") and fast.propose("q").tokens[:2] == (16, 17)
    assert len(fast._cached) == 2 and not fast._finished
