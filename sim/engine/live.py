"""The engine's live drafters (sim/core/drafters/registry.py, kind 'live': proposals that depend on the schedule, such
as the suffix tree's, which learns from the outputs of requests that finished before the step), run inside the
simulation next to the table drafters, and their per-request host history.

Per step (Engine._step, numpy step only: the native step holds two drafters). What it uses of the engine is the
public step interface (sim/engine/api.py: LiveSteps), no private Engine member:
  * before proposing, each decoding request's drafter state catches up with what it emitted (`start` with
    prompt + output so far on its first decode step, then `observe` of the new tokens);
  * `propose`: the drafters the Plan names propose a chain per request (tokens, conf [R, K_d], len [R]); a
    drafter left out proposes nothing (len 0). Its exact acceptance at temperature 0 is the number of leading
    proposed tokens equal to the trace's next output tokens (capped at the output left);
  * after the policy: slots admitted from a drafter chain id (registry chain_id) are checked against its
    length and its run (lossless check 1), the accepted prefix min(admitted, acceptance) is emitted as the
    drafter proposed it, then the target's bonus token; the drafter's price is charged only if it ran;
  * a finished request's drafter state is stopped (`stop`: its output may join a global tree);
  * a drafter with a `verdict(rids, verified, accepted)` method hears, after each step it ran, each request's
    slots of its chain that the step verified and, of those, the target accepted.
Host history per drafter (its HostView.stale_chains and means entries): the chain last proposed for each request,
and the mean of its proposals' confidences (0 past each chain's length), as the n-gram chain's. Before its
first proposal for a request: the mean of every proposal it made in the run so far (all requests), and a
whole chain of confidence 1 before its very first one (as vLLM resets a fresh request's model confidences),
so that a policy that may skip the drafter tries it once. (A fresh request forecast at confidence 1 made
`hybrid` run the suffix drafter on every step a request joined: on traces/general.jsonl, batch 32, 82 of
381 steps, for 39 requests whose suffix chain was chosen; the run-wide mean is what the drafter has been
worth on a request it knows nothing about.)
The step record: each live drafter D has its own columns verified_D, accepted_D (tokens) and D_ms (its time as
charged, 0 on steps it did not run), next to the model and n-gram drafters' (verified_ngram, accepted_ngram and
ngram_ms are the n-gram drafter's alone); the step's time is charged as before (StepCharge.extra, with the
model-free ones). Memory: n x K_d per drafter (whole-trace arrays); the columns, a few numbers per step it ran.
"""
from __future__ import annotations

import numpy as np
import torch

from sim.core.drafters.registry import chain_id
from sim.engine.api import LiveSteps
from sim.engine.history import ragged_slots


class LiveChains:
    """The live drafters of one run (name -> Drafter) and their per-request state (module docstring)."""

    def __init__(self, drafters: dict, n: int):
        self.d = dict(drafters)
        self.width = max((x.width for x in self.d.values()), default=0)
        self.started = {k: np.zeros(n, dtype=bool) for k in self.d}
        self.fed = {k: np.zeros(n, dtype=np.int64) for k in self.d}
        self.last_conf = {k: np.zeros((n, x.width)) for k, x in self.d.items()}
        self.last_len = {k: np.zeros(n, dtype=np.int64) for k in self.d}
        self.sum_conf = {k: np.zeros((n, x.width)) for k, x in self.d.items()}
        self.cnt = {k: np.zeros(n, dtype=np.int64) for k in self.d}
        self.run_sum = {k: np.zeros(x.width) for k, x in self.d.items()}  # over every proposal of the run
        self.run_cnt = {k: 0 for k in self.d}
        self._price: dict = {}  # R -> {name: ms}
        self._cols = {k: {} for k in self.d}  # step row -> (verified, accepted, ms) of the steps it ran
        self._ms: dict = {}  # this step's charged time per drafter [ms]
        self.verified_live = 0  # this step's slots verified from the live drafters' chains
        self.adm: dict = {}  # this step's admitted slots per drafter
        self.ran: frozenset = frozenset()  # this step's drafters that ran

    def __bool__(self) -> bool:
        return bool(self.d)

    def price_of(self, R: int, cost) -> dict:
        out = self._price.get(R)
        if out is None:
            out = self._price[R] = {k: x.cost(R, cost) for k, x in self.d.items()}
        return out

    def prices(self, R: int, cost) -> float:
        """The live drafters' price for R requests [ms] (0.0 without any)."""
        total = 0.0
        for v in self.price_of(R, cost).values():
            total = total + v
        return total

    # ------------------------------------------------------------------------------------------ state
    def _sync(self, eng: LiveSteps, reqs) -> None:
        """Each request's drafter state catches up with the tokens it emitted (module docstring)."""
        tb, emitted = eng.tb, eng.emitted_tokens
        for k, x in self.d.items():
            st, fed = self.started[k], self.fed[k]
            for r in np.asarray(reqs).tolist():
                p, o = int(eng.pos[r]), int(tb.offsets[r])
                if not st[r]:
                    t0 = int(tb.tok_offsets[r])
                    x.start(r, tb.tokens[t0: t0 + int(tb.prompt_len[r])].tolist() + emitted[o: o + p].tolist())
                    st[r], fed[r] = True, p
                elif fed[r] < p:
                    x.observe(r, emitted[o + int(fed[r]): o + p].tolist())
                    fed[r] = p

    def stop(self, eng: LiveSteps, finished) -> None:
        """Finished requests leave every drafter (after their last tokens are observed)."""
        for r in finished:
            self._sync(eng, [r])
            for k, x in self.d.items():
                if self.started[k][r]:
                    x.stop(r, True)
                    self.started[k][r] = False

    # ------------------------------------------------------------------------------------------ step
    def propose(self, eng: LiveSteps, reqs: np.ndarray, plan, chains: dict) -> None:
        """The planned live drafters' chains and exact acceptances, into chains['live'][name] = (tokens, conf,
        len, acc)."""
        self._sync(eng, reqs)
        tb, R, out = eng.tb, len(reqs), {}
        left = tb.out_len[reqs] - eng.pos[reqs]
        base = eng.out_base[reqs] + eng.pos[reqs]
        for k, x in self.d.items():
            K = x.width
            if plan.runs(k):
                tok, conf, n = self.propose_one(k, reqs)
            else:
                tok, conf, n = np.zeros((R, K), np.int64), np.zeros((R, K)), np.zeros(R, np.int64)
            j = np.arange(K)
            truth = tb.tokens.take(base[:, None] + j[None, :], mode="clip")
            same = (tok == truth) & (j[None, :] < np.minimum(n, left)[:, None])
            out[k] = (tok, conf, n, np.cumprod(same, axis=1).sum(1))
        chains["live"] = out

    def propose_one(self, name: str, reqs: np.ndarray) -> tuple:
        """Drafter `name`'s proposal for the step's requests (tokens, conf, len): the engine's hook around a live
        drafter's own work (the real engine times it)."""
        return self.d[name].propose(reqs)

    def host_entries(self, reqs: np.ndarray, R: int, cost, stale_chains: dict, means: dict, draft_ms_of: dict) -> None:
        """The HostView's entries of the live drafters, written into its indexed fields: each one's stale chain, its
        mean chain and its price."""
        if not self.d:
            return
        f = torch.from_numpy
        for k in self.d:
            conf, n, cnt = self.last_conf[k][reqs], self.last_len[k][reqs], self.cnt[k][reqs]
            fresh = cnt == 0
            if fresh.any():  # no proposal yet: the run's mean proposal (confidence 1 before any: module docstring)
                conf, n = conf.copy(), n.copy()
                total = self.run_cnt[k]
                conf[fresh] = self.run_sum[k] / total if total else 1.0
                n[fresh] = conf.shape[1]
            stale_chains[k] = (f(conf), f(n))
            means[k] = f(np.where(cnt[:, None] > 0, self.sum_conf[k][reqs] / np.maximum(cnt, 1)[:, None], conf))
        draft_ms_of.update(self.price_of(R, cost))

    def batch_entries(self, reqs: np.ndarray, chains: dict, needs_truth: bool, cost, chains_t: dict,
                      stale_chains: dict, means: dict, draft_ms_of: dict, true_acc: dict) -> None:
        """The StepBatch's entries of the live drafters (the HostView's, the current chains, the truth)."""
        if not self.d:
            return
        self.host_entries(reqs, len(reqs), cost, stale_chains, means, draft_ms_of)
        live = chains["live"]
        for k, c in live.items():
            chains_t[k] = (torch.from_numpy(c[1]), torch.from_numpy(c[2]))
            if needs_truth:
                true_acc[k] = torch.from_numpy(c[3])

    def admit(self, eng: LiveSteps, alloc, plan, reqs, chain: np.ndarray, adm: np.ndarray, chains: dict, prices) -> None:
        """The slots admitted from each live drafter's chain, after the Allocation contract check; its price
        kept only if it ran (and the allocation kernel's, which a step pays whenever any drafter runs)."""
        said = alloc.ran or {}
        self.ran = frozenset(k for k in self.d if plan.runs(k) and (k not in said or bool(said[k])))
        live, self.adm = chains["live"], {}
        sec = None
        if alloc.second is not None and alloc.second_chain is not None:  # a tree's second branch may be live
            sec = np.where(chain > 0, alloc.second.numpy().astype(np.int64), 0)
            sc = alloc.second_chain.numpy()
        for k in self.d:
            want = np.where(chain == chain_id(k), adm, 0 if sec is None else np.where(sc == chain_id(k), sec, 0))
            eng.flag((want > live[k][2]) | (want < 0), reqs, "the policy admitted more draft tokens than its chain holds")
            eng.flag((want > 0) & (k not in self.ran), reqs,
                      "the policy admitted draft tokens of a drafter it did not run this step")
            self.adm[k] = np.minimum(want, live[k][2])
        R = len(reqs)
        price = self.price_of(R, eng.cost)
        prices.extra = 0.0
        self._ms = {}
        for k in self.d:
            if k in self.ran:
                prices.extra = prices.extra + price[k]
                self._ms[k] = price[k]
        if self.ran:
            prices.alloc = eng.step_prices(R).alloc

    def settle(self, eng: LiveSteps, reqs, rows, adm_m, adm_n, acc_m, acc_n, chains, model_ran) -> tuple:
        """Emission and bookkeeping of a step with live drafters (Engine._step's, with their chains):
        returns (verified [model, model-free], accepted [model, model-free], emitted)."""
        tb, R, live = eng.tb, len(reqs), chains["live"]
        from_n = acc_n > acc_m
        acc = np.maximum(acc_m, acc_n)
        xk = np.zeros(R, dtype=bool)
        xtok = np.zeros((R, max(self.width, 1)), dtype=np.int64)
        xlen = np.zeros(R, dtype=np.int64)
        drafted = (adm_m + adm_n) > 0
        src = {}  # live drafter -> the requests whose emitted drafts are its chain's
        for k, (tok, conf, n, a) in live.items():
            sel = self.adm[k] > 0
            acc_k = np.minimum(self.adm[k], a)
            take = sel & (acc_k >= acc)  # a tree's branch that accepts most (a single chain: its own)
            acc = np.where(take, acc_k, acc)
            for j in src:
                src[j] &= ~take
            src[k] = take
            xk |= take
            drafted |= sel
            xtok[take, :tok.shape[1]] = tok[take]
            xlen = np.where(take, n, xlen)
        from_n &= ~xk
        eng.acc_hist += np.bincount(np.minimum(acc[drafted], len(eng.acc_hist) - 1), minlength=len(eng.acc_hist))
        left = tb.out_len[reqs] - eng.pos[reqs]
        n_emit = np.minimum(acc + 1, left)
        n_draft = np.minimum(acc, n_emit)
        t = ~xk
        eng.check_chain_bounds(reqs[t], rows[t], from_n[t], n_draft[t], chains["model_len"][t],
                                chains["ngram_len"][t])
        eng.flag(n_draft > np.where(xk, xlen, n_draft), reqs, "a request emitted more draft tokens than its chain holds")
        if t.any():
            eng.emit_drafts(reqs[t], rows[t], from_n[t], n_draft[t], n_emit[t] - n_draft[t])
        if xk.any():
            self.emit(eng, reqs[xk], xtok[xk], n_draft[xk], n_emit[xk] - n_draft[xk])
        eng.prev_pos[reqs] = rows - tb.offsets[reqs]
        eng.record_drafts(reqs, rows, model_ran)
        for k in self.ran:
            tok, conf, n, a = live[k]
            verdict = getattr(self.d[k], "verdict", None)  # a drafter that learns from its verified slots
            if verdict is not None:
                verdict(reqs, self.adm[k], np.minimum(self.adm[k], a))
            self.last_conf[k][reqs], self.last_len[k][reqs] = conf, n
            valid = conf * (np.arange(conf.shape[1]) < n[:, None])
            self.sum_conf[k][reqs] += valid
            self.cnt[k][reqs] += 1
            self.run_sum[k] += valid.sum(0)
            self.run_cnt[k] += len(reqs)
        eng.n_steps[reqs] += 1
        row = len(eng.steps)  # the record this step appends (Engine._finish_step, after this)
        self.verified_live = int(sum(int(self.adm[k].sum()) for k in live))  # slots the verify forward holds too
        for k in live:
            if k in self.ran:
                self._cols[k][row] = (int(self.adm[k].sum()), int(acc[src[k]].sum()), self._ms.get(k, 0.0))
        verified = [int(adm_m.sum()), int(adm_n.sum())]
        accepted = [int(acc[~from_n & ~xk].sum()), int(acc[from_n & ~xk].sum())]
        return verified, accepted, int(n_emit.sum())

    def columns(self, n_steps: int) -> dict:
        """The step record's columns of the live drafters, over the run's n_steps steps: verified_D, accepted_D
        (int64 tokens) and D_ms (float64 ms as charged), 0 on steps D did not run."""
        out = {}
        for k, rows in self._cols.items():
            v, a, ms = np.zeros(n_steps, np.int64), np.zeros(n_steps, np.int64), np.zeros(n_steps)
            for i, (vi, ai, mi) in rows.items():
                v[i], a[i], ms[i] = vi, ai, mi
            out[f"verified_{k}"], out[f"accepted_{k}"], out[f"{k}_ms"] = v, a, ms
        return out

    def emit(self, eng: LiveSteps, reqs, tok, n_draft, n_bonus) -> None:
        """Emit each request's first n_draft proposed tokens of its live chain (`tok` [R, K]), then n_bonus (0
        or 1) bonus token from the target, output[pos + n_draft] (Engine._emit's layout; the real engine's
        LiveChains writes the target's own bonus token instead)."""
        tb = eng.tb
        counts = n_draft + n_bonus
        total = int(counts.sum())
        if total == 0:
            return
        pos = eng.pos[reqs]
        rep, j = ragged_slots(counts)
        out = tb.tokens.take((eng.out_base[reqs] + pos)[rep] + j, mode="clip")
        d = j < n_draft[rep]
        out[d] = tok[rep[d], j[d]]
        eng.write_tokens(reqs, counts, (tb.offsets[reqs] + pos)[rep] + j, out)
