"""Trivial first-slot predictors a drafter must beat, on the same held-out anchors (real/drafter/train.SeqTensors).

At anchor a (the target has emitted t_a; the label is its greedy token g_a = labels[a, 0]):
  trigram      the most frequent token after (t_{a-1}, t_a) in the training text, backing off to the bigram
               after t_a and then the most frequent token (counts over every training token stream)
  prompt copy  the token that followed the last earlier occurrence of (t_{a-1}, t_a) in the sequence itself
               (t_{i+2} for the largest i + 1 < a with t_i = t_{a-1}, t_{i+1} = t_a); no occurrence: a miss
  ridge        argmax over the vocabulary of E (w_f * y_hat), y_hat = W [RMSNorm(h^l_{a-1}) for each target layer l ;
               E[t_a]] fitted in closed form (ridge, lambda N |W|^2, lambda chosen on held-out training sequences)
               to the target's RMS-normed final state at a on the training positions; w_f the target's final-norm
               weight, E its tied embedding
Accuracy = hits / anchors, every anchor counted (a predictor with no answer misses).
"""
from __future__ import annotations

from collections import Counter, defaultdict

import torch

from real.drafter.train import final_state, rms_unit, sample_anchors


def anchors_of(st, max_anchors: int = 256, start: int = 1) -> torch.Tensor:
    """The held-out anchors: up to `max_anchors` positions a >= max(1, start) with a slot-0 label, spread evenly
    (start = the prompt's length: the anchors a serving drafter meets, on the target's own output)."""
    ok = torch.nonzero(st.valid[1:, 0]).squeeze(1) + 1
    ok = ok[ok >= start]
    if len(ok) > max_anchors:
        ok = ok[torch.linspace(0, len(ok) - 1, max_anchors).long()].unique()
    return ok


class Trigram:
    def __init__(self, streams):
        self.tri: dict[tuple[int, int], Counter] = defaultdict(Counter)
        self.bi: dict[int, Counter] = defaultdict(Counter)
        uni: Counter = Counter()
        for s in streams:
            s = [int(x) for x in s]
            for i in range(len(s) - 2):
                self.tri[(s[i], s[i + 1])][s[i + 2]] += 1
            for i in range(len(s) - 1):
                self.bi[s[i]][s[i + 1]] += 1
            uni.update(s)
        self.top = uni.most_common(1)[0][0] if uni else 0

    def predict(self, prev: int, cur: int) -> int:
        c = self.tri.get((prev, cur)) or self.bi.get(cur)
        return c.most_common(1)[0][0] if c else self.top


def prompt_copy(tokens: torch.Tensor, a: int) -> int:
    """t_{i+2} after the last earlier (t_{a-1}, t_a) at i, i + 1 < a; -1 when there is none."""
    t = tokens[: a + 1]
    hit = torch.nonzero((t[:-2] == t[a - 1]) & (t[1:-1] == t[a])).squeeze(1)
    return int(t[int(hit[-1]) + 2]) if len(hit) else -1


def _ridge_features(st, idx: torch.Tensor, n_layers: int, D: int, embed: torch.Tensor) -> torch.Tensor:
    h = rms_unit(st.feats[idx - 1].float().unflatten(-1, (n_layers, D)))
    return torch.cat([h.flatten(-2), embed[st.tokens[idx]].float()], -1).double()


class RidgeNext:
    """The ridge predictor (module docstring), fitted on up to `max_positions` training positions; lambda chosen
    among `lams` by top-1 agreement with the target on every tenth training sequence held out of the fit (a
    lambda too small overfits the topics of the sequences it saw and would understate this baseline)."""

    def __init__(self, train, embed: torch.Tensor, norm_w: torch.Tensor, n_layers: int,
                 lams: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1), max_positions: int = 40000, seed: int = 0):
        D = embed.shape[1]
        self.D, self.L, self.embed, self.norm_w = D, n_layers, embed.float(), norm_w.float()
        gen = torch.Generator().manual_seed(seed)
        per = max(1, max_positions // max(len(train), 1))
        X, Y, held = [], [], []
        for i, st in enumerate(train):
            ok = sample_anchors(st, per, gen, stop=st.feats.shape[0])  # a < C: the final state at a is known
            if len(ok):
                X.append(_ridge_features(st, ok, n_layers, D, self.embed))
                Y.append(final_state(st, ok, D).double())
                held.append(torch.full((len(ok),), i % 10 == 9))
        X, Y, h = torch.cat(X), torch.cat(Y), torch.cat(held)
        if not h.any() or h.all():
            h = torch.arange(len(X)) % 10 == 9
        Gt, Bt = X[~h].T @ X[~h], X[~h].T @ Y[~h]
        eye = torch.eye(X.shape[1], dtype=X.dtype)
        want = ((Y[h].float() * self.norm_w) @ self.embed.T).argmax(-1)
        self.scores = {}
        for lam in lams:
            self.W = torch.linalg.solve(Gt + lam * int((~h).sum()) * eye, Bt).float()
            self.scores[lam] = float((self._argmax(X[h].float()) == want).float().mean())
        self.lam = max(self.scores, key=self.scores.get)
        G = Gt + X[h].T @ X[h] + self.lam * X.shape[0] * eye
        self.W = torch.linalg.solve(G, Bt + X[h].T @ Y[h]).float()            # [F, D]

    def _argmax(self, feats: torch.Tensor) -> torch.Tensor:
        y = rms_unit(feats @ self.W)
        return ((y * self.norm_w) @ self.embed.T).argmax(-1)

    def predict(self, st, idx: torch.Tensor) -> torch.Tensor:
        return self._argmax(_ridge_features(st, idx, self.L, self.D, self.embed).float())


def first_slot_table(held, trigram: Trigram, ridge: RidgeNext, drafter_first=None, max_anchors: int = 256,
                     output_only: bool = False) -> dict:
    """First-slot accuracy of each predictor over the same held-out anchors: {name: accuracy, "anchors": n}.
    `drafter_first(st, anchors) -> predicted ids` adds the drafter's; `output_only`: anchors on the output only."""
    hits: Counter = Counter()
    n = 0
    for st in held:
        a = anchors_of(st, max_anchors, st.prompt_len if output_only else 1)
        if len(a) == 0:
            continue
        lab = st.labels[a, 0]
        n += len(a)
        hits["trigram"] += sum(trigram.predict(int(st.tokens[i - 1]), int(st.tokens[i])) == int(y)
                               for i, y in zip(a.tolist(), lab.tolist()))
        hits["prompt_copy"] += sum(prompt_copy(st.tokens, i) == int(y) for i, y in zip(a.tolist(), lab.tolist()))
        hits["ridge"] += int((ridge.predict(st, a) == lab).sum())
        if drafter_first is not None:
            hits["drafter"] += int((drafter_first(st, a) == lab).sum())
    return {**{k: round(v / max(n, 1), 4) for k, v in hits.items()}, "anchors": n}


__all__ = ["Trigram", "RidgeNext", "prompt_copy", "first_slot_table", "anchors_of"]
