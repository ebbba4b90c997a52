"""The suffix-tree drafter (sim/core/drafters/suffix.py): trie counts, the longest continued suffix, greedy extension
by frequency with the probability stop and the length cap, the global tree of finished outputs (and its
bound), and one-line errors for settings out of range."""
import math
import random

import pytest

from sim.core.drafters.suffix import NO_PROPOSAL, SuffixConfig, SuffixDrafter, SuffixTree, accepted_length
from sim.infra.errors import ConfigError


def _brute_count(seqs, path, depth):
    """Occurrences of `path` as a substring of the sequences (len(path) <= depth)."""
    n = len(path)
    return sum(1 for s in seqs for i in range(len(s) - n + 1) if s[i:i + n] == path) if n <= depth else 0


def test_counts_are_substring_occurrences():
    rng = random.Random(0)
    seqs = [[rng.randrange(4) for _ in range(rng.randrange(1, 40))] for _ in range(5)]
    tree = SuffixTree(5)
    for s in seqs:
        tree.start()
        tree.feed_all(s)
    for _ in range(300):
        s = rng.choice(seqs)
        i = rng.randrange(len(s))
        path = s[i: i + rng.randrange(1, 6)]
        assert tree.count(tree.node(path)) == _brute_count(seqs, path, 5), path
    assert tree.node([0, 1, 2, 3, 0, 1]) is None  # deeper than the tree
    for s in seqs[:2]:  # removing sequences leaves the others' counts
        tree.remove(s)
    for _ in range(200):
        s = rng.choice(seqs[2:])
        i = rng.randrange(len(s))
        path = s[i: i + rng.randrange(1, 6)]
        assert tree.count(tree.node(path)) == _brute_count(seqs[2:], path, 5), path


def test_proposal_continues_the_longest_matched_suffix_by_frequency():
    cfg = SuffixConfig(max_depth=8, max_spec_tokens=8, max_spec_factor=4.0, min_token_prob=0.0, max_cached=0)
    tree = SuffixTree(8)
    # "1 2 3" was followed by 4 twice and by 9 once; the context ends with "1 2 3"
    ctx = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 9, 7, 1, 2, 3]
    tree.feed_all(ctx)
    p = tree.propose(ctx, cfg)
    assert p.tokens[:2] == (4, 5)
    # the best-scored of the candidates over every matched suffix length (m = 1, 2, 3 are continued here)
    cands = [tree._extend(tree.node(ctx[-m:]), m, cfg, "") for m in (1, 2, 3)]
    assert p.score == max(c.score for c in cands) and p.match_len == 2
    assert p.conf[0] == pytest.approx(2 / 3)
    assert p.score == pytest.approx(sum(math.prod(p.conf[: j + 1]) for j in range(len(p.conf))))
    assert accepted_length(p, [4, 5, 1, 2]) >= 2 and accepted_length(p, [9]) == 0


def test_probability_stop_and_length_cap():
    tree = SuffixTree(16)
    ctx = [5, 6, 1, 5, 6, 2, 5, 6, 3, 5, 6]  # after "5 6": 1, 2, 3 once each (p = 1/3)
    tree.feed_all(ctx)
    assert tree.propose(ctx, SuffixConfig(max_depth=16, min_token_prob=0.5, max_cached=0)) is NO_PROPOSAL
    p = tree.propose(ctx, SuffixConfig(max_depth=16, min_token_prob=0.3, max_spec_factor=8.0, max_cached=0))
    # ties go to the smaller token; past it "1 5 6" always went on with 2: p = 1 there
    assert p.match_len == 2 and p.tokens[:4] == (1, 5, 6, 2) and p.conf[:2] == (1 / 3, 1.0)
    one = tree.propose(ctx, SuffixConfig(max_depth=16, min_token_prob=0.3, max_spec_factor=1.0, max_cached=0))
    assert one.tokens == (1, 5)  # capped at factor x match length
    long = list(range(20)) + list(range(12))
    t2 = SuffixTree(32)
    t2.feed_all(long)
    capped = t2.propose(long, SuffixConfig(max_depth=32, max_spec_factor=0.5, max_spec_offset=1, max_cached=0))
    assert len(capped) == int(0.5 * capped.match_len + 1)


def test_global_tree_learns_from_finished_outputs_and_is_bounded():
    d = SuffixDrafter(SuffixConfig(max_depth=8, max_cached=2, max_spec_factor=4.0))
    answer = [40, 41, 42, 43, 44, 45]
    d.start("a", [1, 2, 3])
    d.observe("a", answer)
    d.stop("a")
    d.start("b", [7, 8, 9])
    d.observe("b", answer[:2])  # b starts the same answer: the global tree knows how it goes on
    p = d.propose("b")
    assert p.source == "global" and p.tokens[:4] == (42, 43, 44, 45)
    d.stop("b", finished=False)  # preempted or aborted: its output is not learnt
    for k in range(3):  # more finished outputs than max_cached: the first one leaves the tree
        d.start(k, [0])
        d.observe(k, [100 + k, 101 + k])
        d.stop(k)
    d.start("c", [7])
    d.observe("c", answer[:2])
    assert d.propose("c") is NO_PROPOSAL


@pytest.mark.parametrize("kw,msg", [({"max_depth": 1}, "--suffix-max-depth must be in 2..256"),
                                    ({"max_spec_tokens": 0}, "--suffix-max-spec-tokens"),
                                    ({"min_token_prob": 1.5}, "--suffix-min-token-prob must be in 0..1"),
                                    ({"max_spec_factor": -1.0}, "--suffix-max-spec-factor must be >= 0"),
                                    ({"max_cached": -1}, "--suffix-max-cached"), ({"max_depth": 2.5}, "integer")])
def test_settings_out_of_range_are_one_line_errors(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        SuffixConfig(**kw)


def test_declared_settings_become_flags_and_one_json_config():
    """The suffix drafter's settings, declared once (SuffixConfig), are flags of sim.run (--suffix-SETTING and
    --suffix-config) that land in the run's one drafter_config, checked by the declaration; the live drafter is
    built from it."""
    from sim.api.run import SimSetup, parse_args
    from sim.core.config import from_args
    from sim.core.drafters.registry import live_drafters

    a = parse_args(["--trace", "t.jsonl", "--suffix-config", '{"max_depth": 30, "min_token_prob": 0.2}',
                    "--suffix-max-depth", "40"])
    setup = from_args(SimSetup, a)
    assert setup.drafter_config == '{"suffix": {"max_depth": 40, "min_token_prob": 0.2}}'  # the flag wins
    cfg = live_drafters(["suffix"], setup.drafter_config)["suffix"].cfg
    assert (cfg.max_depth, cfg.min_token_prob, cfg.max_spec_tokens) == (40, 0.2, SuffixConfig().max_spec_tokens)
    with pytest.raises(ConfigError, match="--suffix-min-token-prob must be in 0..1"):
        from_args(SimSetup, parse_args(["--trace", "t.jsonl", "--suffix-min-token-prob", "3"]))
    with pytest.raises(ConfigError, match="unknown drafter 'nope'"):
        from_args(SimSetup, parse_args(["--trace", "t.jsonl", "--drafter-config", '{"nope": {}}']))
