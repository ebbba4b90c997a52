"""The real speculative-decoding engine: the simulator's engine (sim/engine/engine.py) with a model in the loop.

It reuses everything the simulator does between the model calls -- the scheduler (sim/core/scheduler.py),
building each step's StepBatch, the policy call, the Allocation contract check, acceptance and emission
bookkeeping -- and overrides only the hooks where a real engine differs (see `Engine._step`):

  _propose   only the drafters the policy's Plan names (the step contract, sim/core/policies/base.py: the plan
             is made on the host before any drafter runs): the n-gram drafter runs for real on the device
             over each request's context (sim/core/drafters/ngram_torch.py); the model drafter is live or a replay
             stand-in (below). A drafter the plan leaves out (`hybrid` skipping the model pass) is not run,
             and its time is not charged;
             A live drafter of the run (--drafters ... suffix: the suffix tree, sim/engine/live.py) proposes
             on the host from the engine's own context, only when the plan names it (RealLiveChains); its
             time is charged (its own step column, suffix_ms) only on steps it ran, and a request whose
             suffix chain is chosen verifies those tokens;
  _verify    one varlen target forward over the step's prefill chunks and each decoding request's
             [last token, admitted draft tokens], greedy: accepted = leading draft tokens equal to the
             target's argmax, bonus = the argmax after them (teacher forcing: the reference's tokens);
  _emit      writes the tokens the target actually produced (drafts it accepted, then its bonus token);
  _charge    the clock: each step's measured wall time, split into draft / ngram / alloc / verify /
             sample / cpu (cpu = the rest of the step: scheduling, the host's plan, batch building,
             bookkeeping); draft and ngram only for drafters that ran (Engine.ran). Two more step columns
             say what `draft` holds (RealEngine.run): draft_pass (1: the model drafter's pass ran this step)
             and draft_upkeep_ms (the live drafter's context append, part of draft_ms; it follows every
             forward, so a step without the pass -- a prefill-only step, a step `hybrid` skips the drafter
             -- has draft_ms = draft_upkeep_ms). real/validation/profile.py prices the pass from the steps it ran on.
             Three more give the forward's padded attention shape (sim/core/cost/padded.py: kv_gather, kv_view,
             attn_rows_kv, from the q_lens and cache_lens the model ran), which real/validation/profile.py fits verify on.
Time: simulated time advances by each step's measured duration (a time-compressed replay: waiting for an
arrival costs no wall time). Steps are synchronous (no CPU/GPU overlap): simulate it with
EngineConfig(async_scheduling=False).

Reference and teacher forcing. The engine is built on DraftTables of a *reference* run: the trace's
prompts with the outputs of plain greedy decoding (real weights; `greedy_reference`) or the trace's own
outputs (teacher forcing, random weights: the target's token at every position is the reference's, so
acceptance is the trace's while every kernel runs at full size). The reference gives each request's
output length (the engine stops there, as vLLM's max_tokens / EOS would in a lossless run), the model
drafter stand-in's chains and the lossless check.

Model drafter. With `drafter` (a real.drafter.model.DSparkDrafter trained for this target, real weights only)
it runs live: the verify forward also returns the target's hidden states at the drafter's layers, each step
ends by appending the rows whose next token is now known to the drafter's per-slot context cache
(real/drafter/runtime.py; charged to `draft`), and _propose drafts K tokens with calibrated confidences
for every decoding request in one batched pass. Without one (random weights, teacher forced) a stand-in
replays the tables' chains (DraftTables.m_tok / m_conf): the synthetic profile's, or the recorded drafts the
tables were built with; its cost is that of a table lookup.
n-gram confidences: the calibrator's features at output position i are functions of the context
prompt + output[:i] only, so they are computed once per request from the reference (equal to the live
context in a lossless run); the proposals themselves (start, length, tokens) come from the live drafter,
and a live proposal that differs from the reference's is a violation.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from sim.core.cost.padded import NO_SHAPE, SHAPE_COLUMNS, padded_shape
from sim.core.drafters.ngram import NgramConfig
from sim.core.drafters.tables import DraftTables
from sim.engine.engine import Engine, EngineConfig
from sim.engine.live import LiveChains
from sim.infra.errors import ConfigError
from sim.core.policies.base import MODEL, NGRAM, Allocation, Plan, StepBatch
from sim.core.scheduler import StepPlan
from sim.engine.step_time import StepCharge, StepPrices
from real.engine.model import SHORT_QUERY_MAX
from sim.core.drafters.ngram_torch import HistoryBuffer, propose_ngram


def _to_device(obj, device: torch.device):
    """A copy of a StepBatch or Allocation with every tensor on `device`: its tensor fields and the tensors of its
    fields indexed by drafter (name -> tensor, or name -> (conf, len))."""
    import dataclasses

    def moved(v):
        if isinstance(v, torch.Tensor):
            return v.to(device)
        if isinstance(v, tuple):
            return tuple(moved(x) for x in v)
        return {k: moved(x) for k, x in v.items()} if isinstance(v, dict) else v

    return dataclasses.replace(obj, **{f.name: moved(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                       if isinstance(getattr(obj, f.name), (torch.Tensor, dict))})


class Clock:
    """Wall-clock phases of one step (ms). On CUDA each reading synchronises the device first, so that a
    phase is charged the kernels it launched."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.t = time.perf_counter()

    def lap(self) -> float:
        """ms since the previous lap."""
        if self.cuda:
            torch.cuda.synchronize()
        now = time.perf_counter()
        ms, self.t = (now - self.t) * 1000.0, now
        return ms


class RealLiveChains(LiveChains):
    """The real engine's live drafters (sim.engine.live.LiveChains): each drafter's proposal timed (the step's
    `live` laps, charged only when it ran), and emission of the tokens the target produced (the accepted
    drafts, then the target's own bonus token), not the trace's."""

    def propose_one(self, name: str, reqs: np.ndarray) -> tuple:
        eng = self.eng
        eng._lap["cpu_pre"] += eng._clock.lap()  # the host work before it (the drafters' context upkeep included)
        out = super().propose_one(name, reqs)
        eng._lap["live"][name] = eng._clock.lap()
        return out

    def admit(self, eng, *args) -> None:
        super().admit(eng, *args)
        for name in self._ms:  # its step column holds the measured proposal time, not the cost model's price
            self._ms[name] = eng._lap["live"].get(name, 0.0)

    def emit(self, eng, reqs, tok, n_draft, n_bonus) -> None:
        new = [[int(x) for x in tok[k, : n_draft[k]]] + ([eng._bonus[int(r)]] if n_bonus[k] else [])
               for k, r in enumerate(np.asarray(reqs).tolist())]
        eng._emit_tokens(np.asarray(reqs, dtype=np.int64), new)


class RealEngine(Engine):
    """The simulator's engine with a real target forward, a live n-gram drafter and a clock.

    model: a real.engine.model.Transformer with its per-slot KV cache (batch_size slots, each long enough
    for the longest request); teacher_forcing: take the target's tokens from the reference (random weights).
    """

    single_thread = False  # the model forward wants every core
    live_chains = RealLiveChains

    def __init__(self, tables: DraftTables, arrivals_s: np.ndarray, policy, cost, cfg: EngineConfig, model,
                 ngram_cfg: NgramConfig, teacher_forcing: bool = False, progress: bool = False, drafter=None,
                 live: dict | None = None) -> None:
        if getattr(tables, "streaming", False):
            raise ConfigError("the real engine reads every request's context up front: give it whole draft tables "
                              "(--draft-tables whole)")
        super().__init__(tables, arrivals_s, policy, cost, cfg, progress=progress, live=live)
        if policy.tree:
            raise ConfigError(f"policy '{policy.name}' verifies two branches (a tree): the real engine verifies "
                              "chains only; tree policies are simulation-only")
        if cfg.async_scheduling:
            raise ConfigError("the real engine steps synchronously: use EngineConfig(async_scheduling=False)")
        if ngram_cfg.k != tables.k_ngram:
            raise ConfigError(f"n-gram chain length {ngram_cfg.k} differs from the tables' {tables.k_ngram}")
        self.live.eng = self
        self.model, self.ngram_cfg, self.teacher = model, ngram_cfg, teacher_forcing
        self.device = next(model.parameters()).device
        max_ctx = int((tables.prompt_len + tables.out_len).max()) if self.n else 1
        self.max_ctx = max_ctx + max(tables.k_model, tables.k_ngram) + 2
        self.hist = HistoryBuffer(cfg.batch_size, self.max_ctx, self.device)
        self.slot_of: dict[int, int] = {}
        self.free_slots = list(range(cfg.batch_size))
        # each request's actual context (prompt + emitted tokens), on the host
        self.ctx = [tables.tokens[tables.tok_offsets[r]: tables.tok_offsets[r] + tables.prompt_len[r]].astype(np.int64)
                    for r in range(self.n)]
        self.out: list[list[int]] = [[] for _ in range(self.n)]
        self._clock = Clock(self.device)
        self._lap: dict = {}
        self._ng_tokens: np.ndarray | None = None
        self._bonus: dict[int, int] = {}
        self._kpos: dict[int, int] = {}
        self.dcache = None
        if drafter is not None and policy.uses_model:
            from real.drafter.runtime import DrafterCache

            if teacher_forcing:
                raise ConfigError("the trained drafter needs the target's real hidden states: not with teacher forcing")
            if drafter.cfg.block != tables.k_model:
                raise ConfigError(f"drafter proposes {drafter.cfg.block} tokens, the tables' model chains have "
                                  f"{tables.k_model}")
            self.dcache = DrafterCache(drafter, cfg.batch_size, self.max_ctx)
        self._m_tokens: np.ndarray | None = None
        self._fwd: list[tuple[int, int, int, int, int]] = []  # (request, slot, first position, rows, flat row)
        self._feats: torch.Tensor | None = None
        self._pass_log: list[bool] = []      # per step: the model drafter's pass ran (the step columns, run())
        self._upkeep_log: list[float] = []   # per step: the drafter's context append [ms], inside draft_ms
        self._fwd_shape = NO_SHAPE           # the step's forward's padded attention shape (sim/core/cost/padded.py)
        self._fwd_shape_log: list = []       # per step (the step columns kv_gather, kv_view, attn_rows_kv; run())

    # ---------------------------------------------------------------------------------------- slots
    def _sync_slots(self) -> None:
        """Free the slots of requests no longer running; give newly running ones a slot and load their
        context into the device history (prompt + tokens emitted so far: a resumed request keeps its own)."""
        running = set(self.sched.running)
        for r in [r for r in self.slot_of if r not in running]:
            self.free_slots.append(self.slot_of.pop(r))
        for r in self.sched.running:
            if r not in self.slot_of:
                s = self.free_slots.pop()
                self.slot_of[r] = s
                self.hist.reset(s, torch.from_numpy(self._context(r)))
                if self.dcache is not None:
                    self.dcache.reset(s)

    def _context(self, r: int) -> np.ndarray:
        """Request r's context: its prompt and the tokens it has emitted (int64)."""
        return np.concatenate([self.ctx[r], np.asarray(self.out[r], dtype=np.int64)])

    def _slots(self, reqs) -> torch.Tensor:
        return torch.tensor([self.slot_of[int(r)] for r in reqs], dtype=torch.int64, device=self.device)

    # ---------------------------------------------------------------------------------------- hooks
    def _schedule(self) -> StepPlan:
        self._lap = dict(draft=0.0, ngram=0.0, alloc=0.0, verify=0.0, sample=0.0, live={})
        self.ran = (False, False)
        plan = self.sched.schedule()
        self._sync_slots()
        return plan

    def _propose(self, reqs: np.ndarray, rows: np.ndarray, plan: Plan) -> dict:
        self._lap["cpu_pre"] = self._clock.lap()  # scheduling, the host history and the policy's plan
        self._m_tokens = None  # this step's live model chain only: never a chain an earlier step drafted
        chains = super()._propose(reqs, rows, plan)  # the stand-in model drafter: a replay of its chains
        if plan.runs(MODEL):
            if self.dcache is not None:
                anchor = torch.tensor([self.out[int(r)][-1] for r in reqs], dtype=torch.int64, device=self.device)
                out = self.dcache.draft(self._slots(reqs), anchor)
                self._m_tokens = out.tokens.cpu().numpy()
                chains["model_conf"] = out.conf.float().cpu().numpy()
            self._lap["draft"] = self._clock.lap()
        self._ng_tokens = None
        if plan.runs(NGRAM):
            hist, lens = self.hist.view(self._slots(reqs))
            prop = propose_ngram(hist, lens, self.ngram_cfg)
            live_len = prop.length.cpu().numpy()
            self._ng_tokens = prop.tokens.cpu().numpy()
            self._lap["ngram"] = self._clock.lap()
            # live proposals must be the reference's (the confidences come from its features)
            self._flag(live_len != chains["ngram_len"], reqs, "the live n-gram proposal differs from the reference's")
            chains["ngram_len"] = live_len
        self._kpos = {r: k for k, r in enumerate(reqs.tolist())}  # a request's index in the step's chains
        return chains

    def _allocate(self, batch: StepBatch, plan: Plan) -> Allocation:
        """The policy's device phase on the engine's device (the batch and the plan's budget moved there, the
        decision copied back)."""
        self._lap["cpu_pre"] += self._clock.lap()  # building the batch
        if self.device.type != "cpu":
            batch, plan = _to_device(batch, self.device), _to_device(plan, self.device)
        alloc = self.policy.allocate(batch, plan)
        if self.device.type != "cpu":
            alloc = _to_device(alloc, torch.device("cpu"))
        self._lap["alloc"] = self._clock.lap()
        return alloc

    def _verify(self, plan: StepPlan, reqs: np.ndarray, rows: np.ndarray, adm_m: np.ndarray, adm_n: np.ndarray,
                chains: dict) -> tuple[np.ndarray, np.ndarray]:
        tb = self.tb
        self._lap.setdefault("cpu_pre", 0.0)
        self._lap["cpu_pre"] += self._clock.lap()
        toks, q_lens, cache_lens, slots, logit_idx = [], [], [], [], []
        n_flat = 0
        self._fwd = []
        sample_first = []  # requests whose fresh prompt completes here: they sample output token 0
        for r, c in plan.prefilling:
            done_before = int(self.prefilled[r]) - c  # _prefill already advanced it
            toks.append(self._context(r)[done_before: done_before + c])
            self._fwd.append((r, self.slot_of[r], done_before, c, n_flat))
            q_lens.append(c)
            cache_lens.append(done_before)
            slots.append(self.slot_of[r])
            n_flat += c
            if self.prefilled[r] >= self.prefill_target[r] and self.pos[r] == 0:
                sample_first.append(r)
                logit_idx.append(n_flat - 1)
        drafts = []
        live = chains.get("live", {})
        from_live = {}  # step index -> the live drafter whose chain it verifies
        for name in live:
            for k in np.flatnonzero(self.live.adm[name] > 0).tolist():
                from_live[k] = name
        for k, r in enumerate(reqs.tolist()):
            if k in from_live:
                name = from_live[k]
                d = live[name][0][k, : self.live.adm[name][k]]
            elif adm_n[k] > 0:
                d = self._ng_tokens[k, : adm_n[k]]
            elif adm_m[k] > 0:
                d = self._model_tokens(k, rows[k])[: adm_m[k]]
            else:  # nothing admitted (or the plan ran no model pass): the request verifies its last token alone
                d = np.zeros(0, dtype=np.int64)
            drafts.append(np.asarray(d, dtype=np.int64))
            last = self.out[r][-1]
            toks.append(np.concatenate([[last], drafts[-1]]))
            q = 1 + len(d)
            q_lens.append(q)
            # the last emitted token's KV is (re)computed here: the cache holds prompt + pos - 1 tokens
            cache_lens.append(int(tb.prompt_len[r] + self.pos[r] - 1))
            self._fwd.append((r, self.slot_of[r], cache_lens[-1], q, n_flat))
            slots.append(self.slot_of[r])
            logit_idx.extend(range(n_flat, n_flat + q))
            n_flat += q
        acc_m = np.zeros(len(reqs), dtype=np.int64)
        acc_n = np.zeros(len(reqs), dtype=np.int64)
        self._bonus = {}
        # what the forward's attention does with these queries (the model's padded short batch; profile.py fits it)
        self._fwd_shape = padded_shape(q_lens, np.add(cache_lens, q_lens), SHORT_QUERY_MAX)
        if not q_lens:
            return acc_m, acc_n
        dev = self.device
        flat = torch.from_numpy(np.concatenate(toks).astype(np.int64)).to(dev)
        lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
        self._lap["cpu_pre"] += self._clock.lap()
        with torch.inference_mode():
            if self.dcache is not None:
                logits, self._feats = self.model(flat, lt(q_lens), lt(cache_lens), lt(slots), lt(logit_idx),
                                                 hidden_layers=self.dcache.d.cfg.layers)
            else:
                logits = self.model(flat, lt(q_lens), lt(cache_lens), lt(slots), lt(logit_idx))
            self._lap["verify"] = self._clock.lap()
            pred = logits.argmax(dim=-1).cpu().numpy()
        self._lap["sample"] = self._clock.lap()
        i = 0
        for r in sample_first:
            self._bonus[r] = int(tb.tokens[tb.tok_offsets[r] + tb.prompt_len[r]]) if self.teacher else int(pred[i])
            i += 1
        for k, r in enumerate(reqs.tolist()):
            d = drafts[k]
            q = 1 + len(d)
            g = pred[i: i + q]
            i += q
            if self.teacher:  # the reference's tokens at output positions pos .. pos + len(d)
                base = tb.tok_offsets[r] + tb.prompt_len[r] + self.pos[r]
                g = tb.tokens[base: base + q].astype(np.int64)
                g = np.concatenate([g, np.full(q - len(g), -1)])
            acc = int(np.cumprod(d == g[: len(d)]).sum()) if len(d) else 0
            acc = min(acc, int(tb.out_len[r] - self.pos[r]))  # nothing is accepted past the output's end
            self._bonus[r] = int(g[acc])
            if k in from_live:  # the target's acceptance replaces the trace's (LiveChains.settle reads it)
                live[from_live[k]][3][k] = acc
            elif adm_n[k] > 0:
                acc_n[k] = acc
            else:
                acc_m[k] = acc
        return acc_m, acc_n

    def _emit(self, reqs: np.ndarray, rows: np.ndarray, from_n: np.ndarray, n_draft: np.ndarray,
              n_bonus: np.ndarray) -> None:
        """Write what the target produced: request reqs[k]'s first n_draft[k] draft tokens of the chain it
        accepted, then (n_bonus[k] = 1) the target's own next token."""
        new_all = []
        for k, r in enumerate(reqs.tolist()):
            kk = self._kpos.get(r, k)  # `reqs` may be a subset of the step's (the rest took live chains)
            if n_draft[k]:
                if from_n[k]:
                    d = self._ng_tokens[kk, : n_draft[k]]
                else:
                    d = self._model_tokens(kk, rows[k])[: n_draft[k]]
                new = [int(x) for x in d]
            else:
                new = []
            if n_bonus[k]:
                new.append(self._bonus[r])
            new_all.append(new)
        self._emit_tokens(np.asarray(reqs, dtype=np.int64), new_all)

    def _emit_tokens(self, reqs: np.ndarray, tokens: list) -> None:
        """Write request reqs[k]'s tokens tokens[k] at its output position (output, device history)."""
        tb = self.tb
        toks_all, counts, dst = [], [], []
        for r, new in zip(reqs.tolist(), tokens):
            base = int(tb.offsets[r] + self.pos[r])
            dst.extend(range(base, base + len(new)))
            toks_all.extend(new)
            counts.append(len(new))
            self.out[r].extend(new)
        if not toks_all:
            return
        counts_a = np.asarray(counts, dtype=np.int64)
        self._write(np.asarray(reqs, dtype=np.int64), counts_a, np.asarray(dst, dtype=np.int64),
                    np.asarray(toks_all, dtype=np.int64))
        self.hist.append(self._slots(reqs), torch.tensor(toks_all, dtype=torch.int64, device=self.device),
                         torch.from_numpy(counts_a).to(self.device))

    def _model_tokens(self, k: int, row: int) -> np.ndarray:
        """The model chain of the step's k-th decoding request: the live drafter's, else the tables' replay.

        Only on a step whose plan ran the model pass: the Allocation contract admits no model slot otherwise,
        so reaching here without this step's chain is the engine's own bug, said as such."""
        if self.dcache is None:
            return self.tb.m_tok[row]
        if self._m_tokens is None:
            raise RuntimeError("model tokens read on a step whose plan ran no model pass")
        return self._m_tokens[k]

    def _append_drafter_context(self) -> None:
        """After the step: every forwarded row j whose next token t_{j+1} is now in the context enters the
        drafter's cache (accepted rows; a rejected draft's row is left out, its position rewritten later)."""
        if self.dcache is None or not self._fwd:
            return
        slots, pos, rows, nxt = [], [], [], []
        for r, slot, j0, n, f0 in self._fwd:
            ctx = self._context(r)
            n_ok = min(n, len(ctx) - 1 - j0)
            if n_ok <= 0:
                continue
            slots.extend([slot] * n_ok)
            pos.extend(range(j0, j0 + n_ok))
            rows.extend(range(f0, f0 + n_ok))
            nxt.append(ctx[j0 + 1: j0 + 1 + n_ok])
        if slots:
            dev = self.device
            lt = lambda x: torch.tensor(x, dtype=torch.int64, device=dev)  # noqa: E731
            self.dcache.append(lt(slots), lt(pos), self._feats[lt(rows)],
                               torch.from_numpy(np.concatenate(nxt).astype(np.int64)).to(dev))
        self._fwd, self._feats = [], None

    def _charge(self, parts: StepPrices, plan: StepPlan, R: int, total_tokens: int, kv_tokens: int, num_seqs: int,
                logit_rows: int) -> StepCharge:
        lap = self._lap
        tail = self._clock.lap()
        upkeep = 0.0  # the live drafter's context append: its cache follows every step, drafted or not
        if self.dcache is not None:
            self._append_drafter_context()
            upkeep = self._clock.lap()
        cpu = lap.get("cpu_pre", 0.0) + tail
        alloc = lap["alloc"]
        model_ran, ngram_ran = self.ran
        live_ran = self.live.ran if self.live else frozenset()
        if not (model_ran or ngram_ran or live_ran):
            cpu, alloc = cpu + alloc, 0.0  # no drafter ran: the simulator prices no allocation, only host work
        # a drafter that did not run is not charged (its lap is 0 unless the oracle, which proposes both to
        # read the truth, was charged for one only: that time is the host's then)
        draft, ngram = (lap["draft"] if model_ran else 0.0), (lap["ngram"] if ngram_ran else 0.0)
        cpu += lap["draft"] - draft + lap["ngram"] - ngram
        extra = 0.0  # the live drafters' proposals that ran (StepCharge.extra; each in its own step column)
        for name, ms in lap["live"].items():
            if name in live_ran:
                extra += ms
            else:
                cpu += ms
        self._pass_log.append(bool(model_ran))
        self._upkeep_log.append(upkeep)
        self._fwd_shape_log.append(self._fwd_shape)
        self._fwd_shape = NO_SHAPE
        return StepCharge(draft + upkeep, ngram, alloc, lap["verify"], lap["sample"], cpu, extra)

    def run(self):
        """The simulator's RunResult, with the outputs and two more step columns: draft_pass (int 0/1) and
        draft_upkeep_ms (float, ms, a part of draft_ms); see the module docstring."""
        self._clock.lap()
        self._pass_log, self._upkeep_log, self._fwd_shape_log = [], [], []
        res = super().run()
        res.outputs = [list(o) for o in self.out]
        n = len(res.steps["step_ms"])
        if len(self._pass_log) != n:  # one charge per step record: anything else is a bug, not data to drop
            raise RuntimeError(f"real engine: {len(self._pass_log)} charged steps for {n} step records")
        res.steps["draft_pass"] = np.asarray(self._pass_log, dtype=np.int64)
        res.steps["draft_upkeep_ms"] = np.asarray(self._upkeep_log, dtype=np.float64)
        arr = np.asarray(self._fwd_shape_log, dtype=np.int64).reshape(-1, len(SHAPE_COLUMNS))
        res.steps.update({c: arr[:, i] for i, c in enumerate(SHAPE_COLUMNS)})  # measured forwards' shapes
        return res
