"""The simpy discrete-event engine: arrivals, continuous batching, chunked prefill, KV capacity with
preemption, and asynchronous scheduling, around one speculative-decoding step per event.

Time model of one step (all ms). The GPU runs
    gpu = draft + ngram + alloc + verify + sample
and the CPU prepares the next step (cpu). Under asynchronous scheduling the CPU work of step t+1 overlaps
the GPU work of step t, so step = max(gpu, cpu); a policy or drafter that needs a host sync (reads GPU
results on the CPU before the next step, e.g. a CPU n-gram drafter) serialises them: step = gpu + cpu.
draft is the model drafter's pass that proposed the step's chains; in a run charged as vLLM (EngineConfig.scheduler,
vllm_version) it also holds the pass vLLM runs after a step whose drafts no request uses, where that release runs
it (sim/core/vllm.py, "Unused drafter passes": Engine.unused_pass_ms).
bubble = step - gpu is the time the GPU waits (sim/engine/step_time.py, shared by every path that charges a step).

The step is shared with the real torch engine (real/engine/engine.py), which subclasses Engine and
overrides only the hooks marked in `_step` (plan, propose, allocate, verify, emit, charge); admission, the
token budget, chunked prefill and preemption are the shared Scheduler's (sim/core/scheduler.py).

A decode step has the three phases of the policy contract (sim/core/policies/base.py): the host's HostView (the
stale chains and history, the step's shape and prices) -> `_plan` (Policy.plan: which drafters run, the
budget) -> `_propose` (only the planned drafters: a drafter left out has an empty chain and is not charged)
-> the StepBatch -> `_allocate` (Policy.allocate with the Plan). The Plan's fields are host values, so the
engine never reads a device value to decide what runs.

Scheduling (vLLM V1 style): at most `batch_size` running requests; each step has a token budget
`max_num_batched_tokens`; decoding requests take 1 + (admitted draft) tokens, and prompts are prefilled in
chunks with what is left. The step that finishes a prompt samples the first output token. KV usage is
counted in blocks of `block_size` tokens; when the next step would not fit, the most recently admitted
request is preempted (recompute: its KV is freed and its prompt plus generated tokens are prefilled again
later; no token is lost or emitted twice).

Costs: policies decide with the verify table vLLM profiles at start-up (CostModel.startup_verify_table, no
step's real context), or, a policy with Policy.step_table (`table=step`), with the table of the step's own token
count, KV context and sequences (CostModel.charged_verify_table: host-known before launch); the step is charged
its true cost, at this step's context and at the token count its CUDA graph is padded to (CostModel.graph_tokens).
A policy's Plan may leave a drafter out for the whole step: that drafter is then not proposed nor charged, and a
slot admitted from it is a violation (check 1 below).
Host-side history the policies may use (`_host_history`): the chain last drafted
for each request, its mean drafted model chain and its mean n-gram chain.

Emission: a decoding request at output position i verifies the admitted prefix of its chosen chain and
emits (accepted + 1) tokens: the accepted draft tokens as the drafter proposed them -- the model chain's
proposed tokens (DraftTables.m_tok) or, for an n-gram chain, the tokens at the copy source in the
context -- and the target's bonus token output[i + accepted] (from the trace). The accepted length comes
from the tables (m_acc, ng_acc), not from comparing tokens, so the emitted tokens are independent evidence.
vLLM's n-gram (`vllm-ngram:K`, charged as vLLM) also proposes fillers: past an admitted copy accepted whole,
its slots up to K hold the last context token, accepted while output[i + copy + j] equals it (`_filler_run`,
compared on the trace's tokens); they are emitted as that token, after the copy, and the lossless check's
item 3 compares them with the trace like any other (item 2 bounds the copy part by the context and the
whole by K). The native step does not emit fillers, so such a run steps as defined.
Slots verified past the admitted chain (Allocation.verified, `hybrid-vllm:...:fill=vllm`: what vLLM's top-B admits
past the plugin's chosen chains) are charged as verify tokens; where they hold the model chain's own tokens
(Allocation.past_chain == CHAIN_MODEL, the only chain modelled there) and the chain before them is accepted whole,
those the tables say the model chain gets right (m_acc) are accepted and emitted as the trace's tokens, before the
bonus (`_past_chain`; numpy step only).

Lossless check (`check_lossless`; RunResult.lossless is its result and RunResult.violation names the
first failure; the engine does not raise, callers do: `RunResult.raise_if_lossy`). A run is lossless iff
  1. policy contract, every decode step: 0 <= admitted <= length of the chosen chain and
     0 <= second <= length of the other chain (Allocation's contract; the engine would otherwise clamp),
     and no slot of a drafter the policy did not run;
  2. chain bounds, every step: a request emits at most as many draft tokens as its chain holds, and an
     n-gram chain's copied tokens lie in the context, source + emitted <= prompt_len + i (never the
     target's own future tokens); length-only requests, whose n-gram sources are synthetic, are exempt
     from the context bound;
  3. at the end: every output slot holds the trace's token, every request's position is its output
     length, and exactly sum(output lengths) tokens were written (with 3's first part: each slot once).
What it catches: over-stated acceptance of either chain (a wrong token is emitted: the model chain
proposes a wrong token from its first rejected slot on, an n-gram chain's next token differs from the
target's by the definition of its match length), a wrong copy source, over-admission, skipped and
duplicated emission. What it cannot catch: under-stated acceptance (fewer tokens accepted than the
chain matched: lossless, only slower), and for recorded drafts the recorded acceptance itself (the
sidecar has no token ids; their proposed tokens are built from model_acc).

Memory. With whole-trace DraftTables the engine keeps per-request scalars (n of each), the emitted-token
buffer (one slot per output position of the trace) and the host history's K-wide sums ([n, K_m], [n, K_n]).
With streaming tables (sim.core.drafters.stream; python -m sim.run --draft-tables stream, or auto above its budget)
a request's table rows, its emitted-token slots (a column of the arena) and its K-wide history sums (a slot
taken at admission) exist only from admission to finish, so they scale with the running requests (and those
preempted, which keep theirs). Item 3 of the lossless check then runs per request as it finishes, before its
rows are freed, with the same comparisons; the count of tokens written is checked at the end as before.
Step records are kept in numpy chunks (sim.engine.step_log). See docs/memory.md.

Live drafters (sim/core/drafters/registry.py: the suffix tree, whose proposals depend on the schedule) run inside
the step through sim.engine.live.LiveChains, on the numpy step only; their slots and time are recorded with the
model-free (n-gram) columns.

Speed. For the `none` policy, a stretch of pure decode steps (nothing admitted, preempted, prefilled or
finished) is computed at once by sim.engine.fast_forward with the same results bit for bit; for the others, the steps
of a steady schedule run in one loop (sim.engine.stretch) with the same calls and float operations. `_step`
stays the definition, and HYBRIDSPEC_REFERENCE_ENGINE=1 (or a subclass overriding a hook) steps every step.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import simpy
import torch
from sim.infra.progress import progress_bar

from sim.core.cost.base import CostModel
from sim.core.drafters.recalibration import RecalState, runcal_start_of
from sim.core.drafters.registry import Pricing, chain_id, table_prices
from sim.core.drafters.tables import has_decisions, ng_conf_zero_past_length
from sim.engine.native_step import NativeScans, Unsupported, make_native_step
from sim.engine.checks import LosslessChecks
from sim.engine.choice import array_form_of, choose, native_step_ok, plan_form_of
from sim.engine.fast_forward import clock_delays, fast_forward
from sim.engine.history import HostHistory, ragged_slots
from sim.engine.live import LiveChains
from sim.engine.stretch import steady_steps
from sim.infra.errors import ConfigError, SimulatorBug
from sim.engine.forms import ARRAY_FORM, NATIVE_STEP, WHOLE_STEP, transcribed_by
from sim.core.policies.base import CHAIN_MODEL, CHAIN_NGRAM, CHAIN_NONE, FREE, MODEL, NGRAM, Allocation, Decision, \
    HostView, Plan, Replay, StepBatch
from sim.core.policies.registry import Policy
from sim.engine.policy_fast import Arrays, decision
from sim.core.scheduler import SCHEDULED, Scheduler, StepPlan, full_kv_need
from sim.core.vllm import (DEFAULT_VLLM_VERSION, drafts_skip, filler_slots, parse_scheduler, parse_vllm_version,
                           runs_sync, slot_charge)
from sim.core.cost.padded import NO_SHAPE, SHAPE_COLUMNS, padded_shape
from sim.engine.step_log import STEP_COLUMNS, StepLog, make_record
from sim.engine.step_time import StepCharge, StepPrices, host_syncs


HELD_MAX = 4096  # steps the engine runs ahead of simpy's clock at most (Engine._engine)


def _advance(env: simpy.Environment, delays: list):
    """simpy's clock taken through steps of `delays` [ms] (now = now + delay each; clock_delays' timeouts)."""
    for d in clock_delays(env.now, delays):
        yield env.timeout(d)


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings. batch_size: max running requests; max_num_batched_tokens: per-step token budget;
    block_size: KV block (tokens); kv_capacity_tokens: None = the cost model's; async_scheduling: overlap
    CPU and GPU; rate: Poisson arrivals per second (None = use the trace's arrival_s, absent = all at 0);
    scheduler: how the budget charges drafts, "hybridspec" (the project's engines: the verified drafts) or
    "vllm" (vLLM's scheduler: every proposed slot plus its method's extra slots; sim.core.vllm.slot_charge;
    policies that exist only as vLLM runs them get vLLM's charge under either); vllm_version: the vLLM release
    whose charges and unused drafter passes that charge models (sim.core.vllm.VLLM_VERSIONS)."""

    batch_size: int = 4
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    kv_capacity_tokens: int | None = None
    async_scheduling: bool = True
    rate: float | None = None
    seed: int = 0
    scheduler: str = "hybridspec"  # the token budget's rule: the project's engines', or "vllm" (sim.core.vllm)
    vllm_version: str = DEFAULT_VLLM_VERSION
    runcal_start: str | None = None  # the run-level recalibration's start (recalibration.parse_runcal_start)

    def __post_init__(self) -> None:
        parse_scheduler(self.scheduler)
        parse_vllm_version(self.vllm_version)
        if self.batch_size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.batch_size}")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {self.block_size}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ConfigError(f"KV capacity must be >= 1 token, got {self.kv_capacity_tokens}")
        if self.rate is not None and not self.rate > 0:
            raise ConfigError(f"arrival rate must be > 0 requests/s, got {self.rate}")


class LosslessError(SimulatorBug):
    """Emitted tokens differ from the trace output: a bug in a policy or drafter, never acceptable."""


@dataclass
class RunResult:
    """Everything one simulated run produced. lossless: the result of Engine.check_lossless (see the
    module docstring); violation: '' when lossless, else a one-line description of the first failure."""

    requests: dict  # column name -> array, one entry per request
    steps: dict  # column name -> array, one entry per engine step
    sim_time_s: float
    lossless: bool
    violation: str = ""
    accepted_hist: np.ndarray | None = None  # drafts by accepted length (Engine.acc_hist); None: not recorded
    # the slots verified past the chosen chains (Allocation.verified, Policy.verifies_past): decode_steps, steps_with
    # (steps where vLLM's budget exceeded the positive slots, so it admitted some), slots, accepted; None: not modelled
    past_slots: dict | None = None
    # a real engine's recorded decisions the policy took (Replay): rows (decode rows with a recorded chain),
    # rows_disagree (of them, where the policy's own choice differs), steps (steps whose drafter plan was recorded),
    # steps_disagree (where the policy's own plan differs); None: the tables hold none
    replay: dict | None = None

    def raise_if_lossy(self, what: str = "") -> "RunResult":
        """Raise LosslessError (one line, prefixed by `what`) unless the run was lossless; else return self."""
        if not self.lossless:
            raise LosslessError(f"{what + ': ' if what else ''}not lossless: {self.violation}")
        return self




def planned_chains(chains: dict, plan: Plan) -> dict:
    """`chains` (every drafter's, as the native step gathers them) as Engine._propose hands them to the policy:
    a drafter the plan leaves out proposed nothing (length 0, confidence 0). Without this a policy whose allocate
    reads a skipped drafter's chain saw one there in the native step and none in the numpy step (hybrid-vllm:skip
    scheduled min(K, output left) slots after a skipped pass in one, W in the other)."""
    if plan.runs(MODEL) and plan.runs(NGRAM):
        return chains
    out = dict(chains)
    for name, conf, length in ((MODEL, "model_conf", "model_len"), (NGRAM, "ngram_conf", "ngram_len")):
        if not plan.runs(name):
            out[conf], out[length] = np.zeros_like(chains[conf]), np.zeros_like(chains[length])
    return out


class Engine(HostHistory, LosslessChecks):
    """One simulated serving engine running one policy over one trace's draft tables: the loop, the clock and the
    step here; the per-request host history (sim/engine/history.py) and the lossless checks
    (sim/engine/checks.py) in their mixins."""

    single_thread = True  # torch intra-op threads during run(): one (the simulator's tensors are tiny)
    live_chains = LiveChains  # how the engine runs its live drafters (the real engine's own emits real tokens)

    def __init__(self, tables, arrivals_s: np.ndarray, policy, cost: CostModel,
                 cfg: EngineConfig, progress: bool = False, live: dict | None = None):
        """tables: a whole-trace DraftTables, or a sim.core.drafters.stream.StreamingTables (then each request's rows
        are built when it is admitted and freed when it finishes; see Memory in the module docstring).
        live: the run's live drafters the policy uses, name -> a fresh Drafter (sim/core/drafters/registry.py;
        sim.engine.live runs them); their steps take the numpy step (the fast forms transcribe two drafters)."""
        if not isinstance(policy, Policy):
            raise TypeError(f"Engine takes a Policy (sim.engine.policies.sim_policy), got {type(policy).__name__}")
        self.stream = getattr(tables, "streaming", False)
        if self.stream:
            tables = tables.open()  # this run's arena
        self.tb, self.policy, self.cost, self.cfg = tables, policy, cost, cfg
        n = len(tables.out_len)
        self.n = n
        self.live = self.live_chains(live or {}, n)
        for d in self.live.d.values():  # a live drafter's memory estimate, refused before any step (registry.Drafter)
            check = getattr(d, "check_memory", None)
            if check is not None:
                check(np.asarray(tables.prompt_len) + np.asarray(tables.out_len), tables.out_len, cfg.batch_size)
        kx = self.live.width
        missing = [d for d in policy.uses_extra if d not in self.live.d]
        if missing:
            raise ConfigError(f"policy '{policy.name}' uses the drafter(s) {', '.join(missing)}, which this engine does "
                              "not run (enable them with --drafters: the simulator and the real torch engine run them "
                              "live)")
        if cfg.rate is not None:
            rng = np.random.default_rng(cfg.seed)
            self.arrival = np.cumsum(rng.exponential(1.0 / cfg.rate, size=n))
        else:
            self.arrival = np.asarray(arrivals_s, dtype=np.float64)
        self.kv_cap = cfg.kv_capacity_tokens if cfg.kv_capacity_tokens is not None else cost.kv_capacity_tokens
        bs = cfg.block_size
        kmax = max(tables.k_model if policy.uses_model else 0, tables.k_ngram if policy.uses_ngram else 0, kx)
        charge = slot_charge(policy.name, policy.vllm, cfg.scheduler, kmax, tables.k_model, cfg.vllm_version)
        if cfg.async_scheduling and runs_sync(policy.vllm, charge, cfg.vllm_version):
            self.cfg = cfg = replace(cfg, async_scheduling=False)  # vLLM serves the method synchronously (suffix)
        chain = max(tables.k_model, tables.k_ngram, kx, charge.kv_extra - 1)
        need = full_kv_need(tables.prompt_len + tables.out_len, chain, bs)
        worst = int(np.argmax(need)) if n else 0
        alone = full_kv_need(np.array([tables.prompt_len[worst] + tables.out_len[worst]]), 0, bs)[0] if n else 0
        if n and need[worst] > self.kv_cap and alone <= self.kv_cap:
            # the request fits alone: the chain's slots (K, W, vLLM's lookahead) are what the cache cannot hold
            raise ConfigError(
                f"request {worst} fits the cache of {self.kv_cap} KV tokens alone, but not beside {chain} draft "
                f"slots (the policy's K or W, the drafter's block, vLLM's lookahead): {int(need[worst])} needed; "
                "lower the chain length or give a larger cache")
        if n and need[worst] > self.kv_cap:
            raise ConfigError(
                f"request {worst} needs {int(need[worst])} KV tokens but the cache holds {self.kv_cap}: "
                "it can never run on this model/GPU; use a larger GPU or a smaller --limit/trace")
        self.progress = progress
        # Scheduling state lives in the shared scheduler; these are views of its arrays.
        self.sched = Scheduler(tables.prompt_len, cfg.batch_size, cfg.max_num_batched_tokens, cfg.block_size,
                               self.kv_cap, kmax, out_len=tables.out_len, charge=charge)
        self._draft_cap = None  # this step's StepPlan.draft_cap (drafts the budget left each decoding request)
        # vLLM's drafter rows (a run charged as vLLM): its scheduler gives every decoding request its whole
        # num_speculative_tokens and its drafter, which does not know max_tokens, publishes a whole chain, so near a
        # request's end the model chain is not cut to the output left (what is accepted still is, by the tables'
        # acceptances); and it drafts on a partial prefill chunk's row too (_prefill). The project's engines cut the
        # chain and reset a new request's row whatever its chunks.
        self.whole_model_chain = charge.rule == SCHEDULED
        # vLLM schedules each request its own proposal (SlotCharge.variable, suffix): the scheduler asks for the
        # live drafters' proposals as it splits the budget; kept here for the step (_live_proposals)
        self._early = None
        if charge.variable:
            self.sched.draft_lens = self._proposal_lens
        # vLLM's n-gram fills its proposal to K with the last sampled token (sim.core.vllm.filler_slots): K, or 0
        self.filler_k = filler_slots(policy.vllm, charge, cfg.vllm_version) \
            if policy.uses_ngram and not policy.uses_model else 0
        # vLLM's drafter pass after a step whose drafts no request uses (sim.core.vllm.drafts_skip): None, none is
        # charged; False, charged (0.32); True, charged unless vLLM's scheduler knew and skipped it (0.33)
        self.unused_pass = drafts_skip(policy.vllm, charge, cfg.vllm_version) if policy.uses_model else None
        self._fill_from = None  # this step's n-gram copy lengths, past which accepted draft tokens are fillers
        # slots verified past the chosen chains (Allocation.verified): decode steps, steps with any, slots, accepted
        self.past_stats = np.zeros(4, dtype=np.int64)
        # recorded decisions (RunResult.replay): rows, rows where the policy's own chain differs, steps, steps differing
        self._replay = has_decisions(tables)
        self.replay_stats = np.zeros(4, dtype=np.int64)
        st = self.sched.state
        self.pos, self.prefilled, self.prefill_target = st.pos, st.prefilled, st.prefill_target
        self.n_preempt, self.fresh = st.n_preempt, st.fresh
        self.prev_pos = np.zeros(n, dtype=np.int64)     # position of the previous decode step (stale rows)
        self.model_pos = np.zeros(n, dtype=np.int64)    # position of the last step the model drafter ran
        # Running mean of the model chains drafted for each request (sum over drafts, count): the host's
        # estimate of a request's model chain when its pass was skipped at the previous step.
        # The K-wide sums are indexed by history slot (_hist): the request itself with whole tables; with
        # streaming tables a slot held from admission to finish, so they take (live requests) x K, not n x K.
        self._hslot = np.full(n, -1, dtype=np.int64) if self.stream else None
        self._free_slots: list[int] = []
        self._hused = 0  # history slots handed out so far (streaming)
        hist_rows = 0 if self.stream else n
        self.m_conf_sum = np.zeros((hist_rows, tables.k_model), dtype=np.float64)
        self.m_conf_cnt = np.zeros(n, dtype=np.int64)
        # Running mean of each request's n-gram chains (confidence per slot, 0 past the chain's length).
        self.ng_conf_sum = np.zeros((hist_rows, tables.k_ngram), dtype=np.float64)
        self.ng_conf_cnt = np.zeros(n, dtype=np.int64)
        self._price_memo: dict = {}
        self._charge_memo: dict = {}  # (running, step tokens) -> graph tokens, sample and CPU time [ms]
        # token-buffer index of output[0], per request (the arena keeps its own up to date)
        self.out_base = tables.out_base if self.stream else tables.tok_offsets[:-1] + tables.prompt_len
        self.t_first = np.full(n, np.nan)
        self.t_done = np.full(n, np.nan)
        self.n_steps = np.zeros(n, dtype=np.int64)
        # drafts (request-steps that verify >= 1 draft token) by accepted length 0..K: vLLM's spec-decode counts
        # (its acceptance length and per-position acceptance, sim.core.metrics.spec_decode_metrics)
        self.acc_hist = np.zeros(max(tables.k_model, tables.k_ngram, kx) + 1, dtype=np.int64)
        self.n_outputs = int(tables.out_len.sum())
        self._emitted = None if self.stream else np.full(self.n_outputs, -1, dtype=np.int64)
        self.n_written = 0  # tokens written into emitted_tokens (== n_outputs iff each slot written once)
        self.violation = ""  # first violation of the step checks (module docstring, items 1-2)
        self._out_violation: tuple[int, str] | None = None  # streaming: (request, message) of item 3's first failure
        # Policies decide with the verify table vLLM profiles once at start-up (a fixed reference context,
        # see CostModel.startup_verify_table); every step is charged its true cost at its own context.
        kdec = max(tables.k_model, tables.k_ngram, kx)
        most = min(cfg.batch_size, max(n, 1))  # never more running than requests: memory follows the trace
        self.decision_table = torch.from_numpy(cost.startup_verify_table(
            cfg.max_num_batched_tokens, cfg.batch_size, 1 + tables.k_model,
            length=cfg.max_num_batched_tokens + most * kdec + 2))
        vocab = cost.vocab_size
        # vLLM 0.33's verification logits cap: one fp32 chunk of 2**30 bytes, vocab_size * 4 bytes per row
        self.max_logits = 2**30 // (vocab * 4) if vocab else None
        self.steps = StepLog(STEP_COLUMNS)  # one StepRecord per step, kept as numpy chunks
        # a padded cost table (sim/core/cost/padded.py) prices each step's padded attention shape: the steps then run
        # the numpy form (the native step, fast-forward and steady stretches do not track per-request queries)
        self.padded = int(getattr(cost, "short_query_max", 0) or 0)
        self._shape = NO_SHAPE
        self._shape_log: list = []
        self.ran = (False, False)  # (model, n-gram): the drafters the last numpy step's _admit found ran
        self._bar = None
        # online recalibration (Policy.recal, sim/core/drafters/recalibration.py: per-request offsets) or another
        # online state of the policy (Policy.online: vLLM's acceptance estimator), kept here, fed by _recalibrate
        self.recal = policy.online_state(n, tables.k_model)
        if cfg.runcal_start:  # a real run's state after its warm-up, not the prior (real/validation/vllm/cells.py)
            if not isinstance(self.recal, RecalState):
                raise ConfigError(f"--runcal-start is for a policy with runcal=k, not {policy.name}")
            self.recal.start(runcal_start_of(cfg.runcal_start))
        # the StepBatch fields its values travel in (the state declares which: recal, estimator or all_matched)
        self._online_fields = None if self.recal is None else (self.recal.field, "stale_" + self.recal.field)
        # the verify table the policy decides with this step: the start-up profile, or (Policy.step_table) the
        # step's own, set by the numpy step before the plan
        self.step_table = policy.step_table
        self._table = self.decision_table
        # the native step and the policies' fast forms hold two drafters' chains, no recalibration state and the
        # start-up table: a run with a live drafter, recalibration or step tables takes the numpy step (the
        # definitions)
        if self.live or self.recal is not None or self.step_table:
            self._fast = self._arrays = None

    # ----------------------------------------------------------------------------------------- utils
    @property
    def emitted_tokens(self) -> np.ndarray:
        """The emitted-token buffer, indexed by table row (-1: not emitted yet); the arena's with streaming."""
        return self.tb.emitted if self.stream else self._emitted

    @property
    def _ng_clean(self) -> bool:
        """Whether ng_conf * (slot < ng_len) == ng_conf for every row the engine can read (read per step: an
        arena learns it as requests are admitted)."""
        return ng_conf_zero_past_length(self.tb)

    @transcribed_by(*WHOLE_STEP)
    def step_prices(self, R: int) -> StepPrices:
        """The drafters' and the allocation kernel's prices for R decoding requests, as if every drafter the
        policy uses runs (the cost model's, computed once per R: they depend on nothing else). Shared: copy it
        before changing it."""
        out = self._price_memo.get(R)
        if out is None:
            cost, pol, out = self.cost, self.policy, StepPrices()
            quoted = table_prices(pol.drafters, R, cost, Pricing(self.tb.k_model, on_gpu=not pol.host_sync))
            out.draft, out.ngram = quoted.get(MODEL, 0.0), quoted.get(NGRAM, 0.0)  # the native step's two columns
            if pol.uses_model or pol.uses_ngram or pol.uses_extra:
                out.alloc = cost.alloc_ms(R, policy=pol.name, adaptive=pol.adaptive_verification) + \
                    (cost.plugin_ms(R) if pol.runs_plugin else 0.0)  # the plugin's own step (CostModel.plugin_ms)
            if pol.runs_plugin and out.draft:  # the part of DSpark's step a skipped pass still runs: every step's,
                res = min(cost.skip_residual_ms(R), out.draft)  # so a skip saves the rest (CostModel.skip_residual_ms)
                out.draft, out.alloc = out.draft - res, out.alloc + res
            out.extra = self.live.prices(R, cost)
            self._price_memo[R] = out
        return out

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _write(self, reqs: np.ndarray, counts: np.ndarray, dst: np.ndarray, tokens: np.ndarray) -> None:
        """Store `tokens` at buffer slots `dst` (counts[k] of them for request reqs[k], at its position) and
        advance the positions; n_written counts every store so that a slot stored twice is detectable."""
        self.emitted_tokens[dst] = tokens
        self.pos[reqs] += counts
        self.n_written += len(tokens)

    def _emit_fill(self, reqs: np.ndarray, counts: np.ndarray) -> None:
        """Emit counts[k] copies of request reqs[k]'s last context token (vLLM's n-gram fillers it accepted)."""
        total = int(counts.sum())
        if total == 0:
            return
        pos = self.pos[reqs]
        rep, j = ragged_slots(counts)
        tok = self.tb.tokens[(self.out_base[reqs] + pos - 1)[rep]]
        self._write(reqs, counts, (self.tb.offsets[reqs] + pos)[rep] + j, tok)

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _emit(self, reqs: np.ndarray, rows: np.ndarray, from_n: np.ndarray, n_draft: np.ndarray,
              n_bonus: np.ndarray) -> None:
        """Emit, for request reqs[k] at table row rows[k], its first n_draft[k] proposed draft tokens --
        model chain: m_tok[row, j]; n-gram chain (from_n[k]): tokens[tok_offsets + ng_start[row] + j] --
        then n_bonus[k] (0 or 1) bonus token from the target, output[pos + n_draft]. reqs are distinct."""
        tb = self.tb
        counts = n_draft + n_bonus
        total = int(counts.sum())
        if total == 0:
            return
        pos = self.pos[reqs]
        rep, j = ragged_slots(counts)  # j: depth of each slot
        # Where slot j is read from in the token buffer: the target's output at pos + j (bonus, and the
        # default), or the n-gram copy source + j for an n-gram draft token.
        out_src = self.out_base[reqs] + pos
        draft_src = np.where(from_n, tb.tok_offsets[reqs] + tb.ng_start[rows], out_src)
        draft = j < n_draft[rep]
        tok = tb.tokens.take(np.where(draft, draft_src[rep], out_src[rep]) + j, mode="clip")
        md = draft & ~from_n[rep]
        if md.any():  # model draft tokens: the chain's proposals (wrong from the first rejected slot on)
            tok[md] = tb.m_tok[rows[rep[md]], np.minimum(j[md], tb.k_model - 1)]
        self._write(reqs, counts, (tb.offsets[reqs] + pos)[rep] + j, tok)

    # ----------------------------------------------------------------------------------------- simpy
    def _arrivals(self, env: simpy.Environment, wake: list):
        order = np.argsort(self.arrival, kind="stable")
        for r in order:
            dt = self.arrival[r] - env.now / 1000.0
            if dt > 0:
                yield env.timeout(dt * 1000.0)
            self.sched.add(int(r))
            if not wake[0].triggered:
                wake[0].succeed()

    def _engine(self, env: simpy.Environment, wake: list):
        """The engine's process: step while requests run, wait for an arrival when none does. A step that
        ends before simpy's next event (an arrival) is not yielded to simpy one by one: nothing else can run
        in between, so the next step starts at once, at now + step_ms (the float sum simpy's timeout would
        make), and the clock catches up, to the same time, before any other event (`held`). With fast-forward
        (sim/engine/fast_forward.py reads simpy's clock and next event) every step is yielded. While the scheduler's plan
        is steady, the steps up to the next event, finished request or full held list run in one loop
        (sim.engine.stretch), with the same results."""
        done = 0
        forms = choose(self)  # sim/engine/choice.py: the one place a step's form is chosen
        ff, stretch = forms.fast_forward, forms.stretch
        now, held = env.now, []  # the engine's clock: simpy's plus the held steps' delays
        while done < self.n:
            if held and self.sched.idle():
                yield from _advance(env, held)
                held = []
            if self.sched.idle():
                wake[0] = env.event()
                yield wake[0]
                now = env.now
                continue
            if ff:
                delays = self._fast_forward(env)
                if delays:
                    yield from _advance(env, delays)
                    now = env.now
                    continue
            ran = None
            if stretch and self.sched.steady():
                ran = steady_steps(self, now, env.peek(), HELD_MAX - len(held))
                stretch = ran is not None  # None: the engine runs the numpy step, which has no stretches
            if ran is None:
                step_ms, finished = self._step(now)
                delays = (step_ms,)
            else:
                delays, finished = ran
            if self.live and finished:
                self.live.stop(self, finished)
            self._release_rows(finished)
            for d in delays:
                now = now + d
            if ff:  # fast-forward reads simpy's clock: never ahead of it
                yield env.timeout(step_ms)
            else:
                held.extend(delays)
                # another event is due by the step's end (simpy orders them), or HELD_MAX steps are held (an
                # offline trace has no next event: the list would grow with the run)
                if not now < env.peek() or len(held) >= HELD_MAX:
                    yield from _advance(env, held)
                    held = []
            for r in finished:
                self.t_done[r] = now / 1000.0
            done += len(finished)
            if self._bar is not None and finished:
                self._bar.update(len(finished))
        if held:
            yield from _advance(env, held)

    def run(self) -> RunResult:
        env = simpy.Environment()
        wake = [env.event()]
        env.process(self._arrivals(env, wake))
        env.process(self._engine(env, wake))
        if self.progress:
            self._bar = progress_bar(total=self.n, desc=f"{self.policy.name} bs={self.cfg.batch_size}", unit="req", leave=False)
        threads = torch.get_num_threads()
        if self.single_thread:
            torch.set_num_threads(1)  # tiny per-step tensors: more threads only add wake-ups and contention
        try:
            env.run()
        finally:
            torch.set_num_threads(threads)
        if self._bar is not None:
            self._bar.close()
        violation = self.check_lossless()
        tb = self.tb
        t0 = float(self.arrival.min()) if self.n else 0.0
        sim_time = float(np.nanmax(self.t_done)) - t0 if self.n else 0.0
        reqs = {
            "request": np.arange(self.n), "prompt_len": tb.prompt_len, "output_len": tb.out_len,
            "arrival_s": self.arrival, "first_token_s": self.t_first, "finish_s": self.t_done,
            "ttft_s": self.t_first - self.arrival,
            "tpot_s": np.where(tb.out_len > 1, (self.t_done - self.t_first) / np.maximum(tb.out_len - 1, 1), np.nan),
            "decode_steps": self.n_steps, "preemptions": self.n_preempt,
        }
        steps = self.steps.to_columns()
        if self.padded:  # the padded shape each step was charged at (sim/core/cost/padded.py)
            arr = np.asarray(self._shape_log, dtype=np.int64).reshape(-1, len(SHAPE_COLUMNS))
            steps.update({c: arr[:, i] for i, c in enumerate(SHAPE_COLUMNS)})
        if self.live:  # each live drafter's verified, accepted and ms columns (sim/engine/live.py)
            steps.update(self.live.columns(len(steps["step_ms"])))
        past = dict(zip(("decode_steps", "steps_with", "slots", "accepted"), map(int, self.past_stats))) \
            if self.policy.verifies_past else None
        replay = dict(zip(("rows", "rows_disagree", "steps", "steps_disagree"), map(int, self.replay_stats))) \
            if self._replay else None
        return RunResult(requests=reqs, steps=steps, sim_time_s=sim_time, lossless=not violation, violation=violation,
                         accepted_hist=self.acc_hist.copy(), past_slots=past, replay=replay)

    def _fast_forward(self, env: simpy.Environment) -> list:
        """The steps of a pure-decode stretch computed at once (sim.engine.fast_forward); their delays [ms], or []."""
        return fast_forward(self, env.now, env.peek())

    # ----------------------------------------------------------------------------------------- step
    # One step, in the order both engines share (the real engine overrides the marked hooks):
    #   _schedule -> prefill bookkeeping -> _host_state, _host_view -> _plan (hook) -> _propose (hook: the
    #   planned drafters) -> _step_batch -> _allocate (hook: timing) -> _admit -> _verify (hook: tables here,
    #   a model forward there) -> _accept -> _emit (hook)
    #   -> _charge (hook: the cost model here, the clock there).

    @transcribed_by(*WHOLE_STEP)
    def _schedule(self) -> StepPlan:
        """The shared scheduler's plan for this step (sim.core.scheduler); streaming tables build the rows of the
        requests it admits."""
        return self._admit_rows(self.sched.schedule())

    @transcribed_by(ARRAY_FORM, *WHOLE_STEP)
    def _plan(self, view: HostView) -> Plan:
        """Hook: the policy's host phase (Policy.plan), before any drafter runs; the simulator runs its fast form's
        plan where the form has one (a form over any drafters, sim/engine/policy_fast_multi.py) and the engine's class
        keeps _allocate (the real engine, which overrides it, plans and allocates as defined)."""
        pol = self.policy
        memo = getattr(self, "_plan_form", None)
        if memo is None or memo[0] is not pol:
            memo = self._plan_form = (pol, plan_form_of(self))
        return pol.plan(view) if memo[1] is None else memo[1](view)

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _propose(self, reqs: np.ndarray, rows: np.ndarray, plan: Plan) -> dict:
        """Hook: the chains of the drafters in `plan` for the decoding requests at output rows `rows` of the
        tables: model_conf [R, K_m], model_len [R], ngram_conf [R, K_n], ngram_len [R] (numpy); a drafter
        the plan leaves out proposes nothing (length 0, confidence 0)."""
        tb = self.tb
        R = len(reqs)
        if plan.runs(MODEL):
            m_conf, m_len = tb.m_conf[rows], self._scheduled_model_len(reqs)
        else:
            m_conf, m_len = np.zeros((R, tb.k_model), dtype=tb.m_conf.dtype), np.zeros(R, dtype=np.int64)
        if plan.runs(NGRAM):
            n_conf, n_len = tb.ng_conf[rows], tb.ng_len[rows]
            if self._draft_cap is not None:
                n_len = np.minimum(n_len, self._draft_cap)
        else:
            n_conf, n_len = np.zeros((R, tb.k_ngram), dtype=tb.ng_conf.dtype), np.zeros(R, dtype=np.int64)
        return dict(model_conf=m_conf, model_len=m_len, ngram_conf=n_conf, ngram_len=n_len)

    @transcribed_by(ARRAY_FORM, *WHOLE_STEP)
    def _allocate(self, batch: StepBatch, plan: Plan) -> Allocation:
        """Hook: the policy's device phase (Policy.allocate with `plan`; the real engine times it). The
        simulator runs the policy's faster form when it has one (Policy.sim_fn, checked against the definition
        by tests/test_fast_forms.py): a form is the whole policy on one view, its plan recomputed from
        the batch's host-known fields, which are the HostView `plan` was made from; a form with both phases
        (fast_multi) allocates under `plan` as Policy.allocate does."""
        pol = self.policy
        run = pol.sim_callable
        if run is pol:
            return pol.allocate(batch, plan)
        fast = getattr(run, "allocate", None)
        return run(batch) if fast is None else fast(batch, plan)

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _verify(self, plan: StepPlan, reqs: np.ndarray, rows: np.ndarray, adm_m: np.ndarray,
                adm_n: np.ndarray, chains: dict) -> tuple[np.ndarray, np.ndarray]:
        """Hook: run the target over the step (prefill chunks and the admitted draft slots) and return how
        many of each chain's admitted tokens it accepts (acc_m, acc_n; int64 [R]). Here: the tables'
        exact acceptance at temperature 0, capped at what was admitted."""
        tb = self.tb
        acc_m, acc_n = np.minimum(adm_m, tb.m_acc[rows]), np.minimum(adm_n, tb.ng_acc[rows])
        self._fill_from = None
        if self.filler_k and len(reqs):
            acc_n = acc_n + self._filler_run(reqs, adm_n, acc_n)
        return acc_m, acc_n

    def _past_chain(self, alloc: Allocation, rows: np.ndarray, adm: np.ndarray, acc: np.ndarray,
                    chains: dict) -> tuple[np.ndarray, np.ndarray]:
        """The slots vLLM verifies past each request's admitted chain (Allocation.verified - admitted) and those of
        them the target accepts (int64 [R] each): slot j >= adm holds the model chain's own token where
        past_chain is CHAIN_MODEL (j < its length), accepted iff the admitted chain is accepted whole and j < the
        trace's m_acc (the model chain matches the target through slot j, so its token j is the target's); a
        filler where CHAIN_NONE (or past_chain None), never accepted (a filler's token equal to the target's by
        chance is not modelled). Another chain's tokens there are not modelled: SimulatorBug."""
        past = np.maximum(alloc.verified.numpy().astype(np.int64) - adm, 0)
        fill = np.full(len(adm), CHAIN_NONE) if alloc.past_chain is None else alloc.past_chain.numpy()
        other = (fill != CHAIN_NONE) & (fill != CHAIN_MODEL)
        if other.any():
            raise SimulatorBug(f"policy '{self.policy.name}' fills verified slots past its chain with chain "
                               f"{int(fill[other][0])}'s tokens; the engine models only the model chain's there")
        own = (fill == CHAIN_MODEL) & (acc == adm)
        reach = np.minimum(np.minimum(adm + past, chains["model_len"]), self.tb.m_acc[rows])
        return past, np.where(own, np.maximum(reach - adm, 0), 0)

    def _filler_run(self, reqs: np.ndarray, adm_n: np.ndarray, acc_n: np.ndarray) -> np.ndarray:
        """vLLM's n-gram fillers the target accepts (int64 [R]): where a request's admitted copy (L = adm_n
        tokens, the whole matched chain up to K) is accepted in full, its slots L..K-1 hold the last sampled
        token c = context[-1]; the target accepts them while output[pos + L + j] == c. Length-only requests
        (no real tokens) get none. Sets _fill_from = L for the emission."""
        tb, K = self.tb, self.filler_k
        base = self.out_base[reqs] + self.pos[reqs]  # token-buffer index of output[pos]
        last = tb.tokens[base - 1]  # the last token of the context (the prompt's last at pos 0)
        slots = K if self._draft_cap is None else np.minimum(K, self._draft_cap)  # the drafts the step scheduled
        room = np.minimum(slots - adm_n, tb.out_len[reqs] - self.pos[reqs] - adm_n)
        room = np.where((acc_n == adm_n) & ~tb.length_only[reqs], room, 0)
        j = np.arange(K)
        same = tb.tokens.take(base[:, None] + adm_n[:, None] + j[None, :], mode="clip") == last[:, None]
        run = np.cumprod(same & (j[None, :] < room[:, None]), axis=1).sum(axis=1).astype(np.int64)
        self._fill_from = adm_n
        return run

    @transcribed_by(*WHOLE_STEP)
    def _charge(self, parts: StepPrices, plan: StepPlan, R: int, total_tokens: int, kv_tokens: int, num_seqs: int,
                logit_rows: int) -> StepCharge:
        """Hook: the step's time split (StepCharge, ms). `parts` holds the drafters' and the allocation's
        prices (0 for what did not run). Here: the cost model's true cost, at this step's context and at the
        token count its CUDA graph is padded to."""
        hit = self.counts_charge(len(self.sched.running), total_tokens)
        if not total_tokens:
            verify = 0.0
        elif self.padded:  # the step's padded attention shape (set by _step)
            verify = float(self.cost.verify_ms(hit[0], kv_tokens, num_seqs, logit_rows=logit_rows, shape=self._shape))
        else:
            verify = float(self.cost.verify_ms(hit[0], kv_tokens, num_seqs, logit_rows=logit_rows))
        return StepCharge(parts.draft, parts.ngram, parts.alloc, verify, hit[1], hit[2], parts.extra)

    def counts_charge(self, running: int, total_tokens: int) -> tuple:
        """What of a step's charge depends on the counts only (the cost model is pure): (graph tokens, sample
        ms, CPU ms) for `running` requests and `total_tokens` step tokens, memoised."""
        key = (running, total_tokens)
        hit = self._charge_memo.get(key)
        if hit is None:
            if len(self._charge_memo) >= 1 << 16:  # bounded: long runs over many batch shapes start afresh
                self._charge_memo.clear()
            cost = self.cost
            hit = self._charge_memo[key] = (cost.graph_tokens(total_tokens),
                                            cost.sample_ms(total_tokens) if total_tokens else 0.0,
                                            cost.cpu_ms(*key))
        return hit

    @staticmethod
    def _known(stale: tuple, mean_ng, prices: StepPrices) -> tuple[dict, dict, dict]:
        """The two default drafters' host-known entries, indexed by name: stale chains (stale = model conf, model
        len, n-gram conf, n-gram len), means and prices, wrapped without copies in fresh dicts (the live drafters
        add theirs)."""
        from_numpy = torch.from_numpy
        stale_chains = {"dspark": (from_numpy(stale[0]), from_numpy(stale[1])),
                        "ngram": (from_numpy(stale[2]), from_numpy(stale[3]))}
        means = {} if mean_ng is None else {"ngram": from_numpy(mean_ng)}
        return stale_chains, means, {"dspark": prices.draft, "ngram": prices.ngram}

    @transcribed_by(ARRAY_FORM, *WHOLE_STEP)
    def _host_view(self, reqs: np.ndarray, stale: tuple, mean_ng, T: int, n_seqs: int, n_prefill_done: int,
                   prices: StepPrices) -> HostView:
        """The policy's view of the step before any drafter runs (sim.core.policies.base.HostView), as tensors
        wrapping the host arrays without copies; prices as if every drafter the policy uses runs."""
        from_numpy = torch.from_numpy
        stale_chains, means, draft_ms_of = self._known(stale, mean_ng, prices)
        self.live.host_entries(reqs, len(reqs), self.cost, stale_chains, means, draft_ms_of)
        return HostView(
            stale_chains=stale_chains, scheduled_len={MODEL: from_numpy(self._scheduled_model_len(reqs))},
            num_nondraft_tokens=T,
            verify_cost_ms=self._table, draft_cost_ms=prices.total(), draft_ms_of=draft_ms_of, means=means,
            num_sampling_reqs=len(reqs) + n_prefill_done,
            max_draft_tokens=None if self.max_logits is None else max(0, self.max_logits - n_seqs),
            replay=self._replay_at(reqs, self.tb.offsets[reqs] + self.pos[reqs]),
            **({} if self.recal is None else {self.recal.field: self.recal.offsets(reqs)[1]}))

    def _replay_at(self, reqs: np.ndarray, rows: np.ndarray) -> Replay | None:
        """The recorded decisions at the decoding requests' rows and at their previous step's (host tensors); None
        when the tables hold none (has_decisions)."""
        if not self._replay:
            return None
        tb, from_numpy = self.tb, torch.from_numpy
        srows = tb.offsets[reqs] + self.prev_pos[reqs]
        return Replay(chain=from_numpy(tb.rec_chain[rows].astype(np.int64)), skipped=from_numpy(tb.rec_skip[rows]),
                      stale_chain=from_numpy(tb.rec_chain[srows].astype(np.int64)))

    def _count_replay(self, batch: StepBatch, plan: Plan, alloc: Allocation) -> None:
        """RunResult.replay's counts of one step: the recorded rows and steps the policy took, and where its own
        decision (Allocation.own_chain, Plan.own_drafters) differs from the recorded one."""
        if plan.own_drafters is not None:
            self.replay_stats[2:] += (1, int((MODEL in plan.own_drafters) != (MODEL in plan.drafters)))
        if alloc.own_chain is not None and batch.replay is not None:
            rec = batch.replay.chain.numpy()
            at = rec != FREE
            self.replay_stats[:2] += (int(at.sum()), int((alloc.own_chain.numpy()[at] != rec[at]).sum()))

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _scheduled_model_len(self, reqs: np.ndarray) -> np.ndarray:
        """The model chain length each decoding request is scheduled: min(K_m, output left, the drafts the
        step's budget left it) (host-known); not cut to the output left under vLLM's scheduler
        (whole_model_chain)."""
        out = self._model_chain_len(reqs, self.pos[reqs])
        return out if self._draft_cap is None else np.minimum(out, self._draft_cap)

    @transcribed_by(ARRAY_FORM, *WHOLE_STEP)
    def _step_batch(self, reqs: np.ndarray, rows: np.ndarray, chains: dict, stale: tuple, mean_ng, T: int,
                    kv_tokens: int, n_seqs: int, n_prefill_done: int, prices: StepPrices) -> StepBatch:
        """The StepBatch of the chains and the host-side history (stale = model conf, model len, n-gram conf,
        n-gram len), as numpy arrays: wrapped without copies."""
        tb, pol, from_numpy = self.tb, self.policy, torch.from_numpy
        # every drafter indexed by its registered name (the model drafter's stale chain is the one last drafted for
        # the request, not the previous step's if the pass was skipped)
        chains_t = {"dspark": (from_numpy(chains["model_conf"]), from_numpy(chains["model_len"])),
                    "ngram": (from_numpy(chains["ngram_conf"]), from_numpy(chains["ngram_len"]))}
        stale_chains, means, draft_ms_of = self._known(stale, mean_ng, prices)
        true_acc = {"dspark": from_numpy(tb.m_acc[rows]), "ngram": from_numpy(tb.ng_acc[rows])} \
            if pol.needs_truth else {}
        self.live.batch_entries(reqs, chains, pol.needs_truth, self.cost, chains_t, stale_chains, means, draft_ms_of,
                                true_acc)
        return StepBatch(
            chains=chains_t, stale_chains=stale_chains, num_nondraft_tokens=T, verify_cost_ms=self._table,
            draft_cost_ms=prices.total(), draft_ms_of=draft_ms_of, means=means, true_acc=true_acc,
            true_verify_cost_ms=from_numpy(self._true_table(T, len(reqs), kv_tokens, n_seqs)) if pol.needs_truth else None,
            num_sampling_reqs=len(reqs) + n_prefill_done,
            max_draft_tokens=None if self.max_logits is None else max(0, self.max_logits - n_seqs),
            replay=self._replay_at(reqs, rows),
            **({} if self.recal is None else dict(zip(self._online_fields, self.recal.offsets(reqs)))),
        )

    def _true_table(self, T: int, R: int, kv_tokens: int, n_seqs: int) -> np.ndarray:
        """The verify time the engine will charge this step for every token count up to all slots (the oracle's
        true_verify_cost_ms) [ms]."""
        tb = self.tb
        return self.cost.charged_verify_table(T + R * max(tb.k_model, tb.k_ngram, self.live.width) + 1, kv_tokens, n_seqs)

    # ------------------------------------------------- the live drafters' part of the step (sim/engine/live.py)
    def flag(self, bad: np.ndarray, reqs: np.ndarray, what: str) -> None:
        """Record the step checks' first violation: `what` for the first request with bad[k] set."""
        self._flag(bad, reqs, what)

    def check_chain_bounds(self, reqs: np.ndarray, rows: np.ndarray, from_n: np.ndarray, n_draft: np.ndarray,
                           m_len: np.ndarray, ng_len: np.ndarray) -> None:
        """The lossless check's item 2 on emitted table-chain drafts (LosslessChecks._check_chain_bounds)."""
        self._check_chain_bounds(reqs, rows, from_n, n_draft, m_len, ng_len)

    def emit_drafts(self, reqs: np.ndarray, rows: np.ndarray, from_n: np.ndarray, n_draft: np.ndarray,
                    n_bonus: np.ndarray) -> None:
        """Emit the table chains' accepted drafts, then the bonus token (the engine's emission hook: a real
        engine's own)."""
        self._emit(reqs, rows, from_n, n_draft, n_bonus)

    def write_tokens(self, reqs: np.ndarray, counts: np.ndarray, dst: np.ndarray, tokens: np.ndarray) -> None:
        """Store emitted tokens at buffer slots `dst` and advance the positions (counted: lossless item 3)."""
        self._write(reqs, counts, dst, tokens)

    def record_drafts(self, reqs: np.ndarray, rows: np.ndarray, model_ran: bool) -> None:
        """After a step: the table chains drafted in it join the requests' host-side history."""
        self._record_drafts(reqs, rows, model_ran)

    @transcribed_by(*WHOLE_STEP)
    def drafters_ran(self, said: dict | None, prices: StepPrices | None,
                      plan: Plan | None = None) -> tuple[bool, bool]:
        """Whether the two default drafters ran this step (the native step's two columns): those of the plan
        (None: the policy's default plan, every drafter it uses), less one whose Allocation says it ran not
        (Allocation.ran / Decision.ran: the oracle's choice, or a fast form's report of its fused plan; host
        values); drops the prices of those that did not run (from `prices`, unless None)."""
        if plan is None:
            plan = self.policy.default_plan
        said_model, said_ngram = (None, None) if said is None else (said.get(MODEL), said.get(NGRAM))
        model_ran = plan.runs(MODEL) and (said_model is None or bool(said_model))
        ngram_ran = plan.runs(NGRAM) and (said_ngram is None or bool(said_ngram))
        if prices is not None:
            if not model_ran:
                prices.draft = 0.0
            if not ngram_ran:
                prices.ngram = 0.0
            if not (model_ran or ngram_ran):
                prices.alloc = 0.0
        return model_ran, ngram_ran

    @transcribed_by(NATIVE_STEP, *WHOLE_STEP)
    def _admit(self, alloc: Allocation, plan: Plan, reqs: np.ndarray, chains: dict, prices: StepPrices) -> tuple:
        """Draft slots verified from each chain (a tree policy verifies the other chain as a second branch),
        after the Allocation contract check; drops the prices of drafters that did not run.
        Returns (adm_m, adm_n, model_ran)."""
        model_ran, ngram_ran = self.drafters_ran(alloc.ran, prices, plan)
        self.ran = (model_ran, ngram_ran)
        steps = alloc.stepped(MODEL)
        if steps is not None and model_ran and getattr(self.cost, "draft_sequential", False):
            # a sequential head that ran fewer steps than its chain (Allocation.steps): priced at those
            prices.draft = self.cost.draft_ms(len(reqs), min(self.tb.k_model, int(steps)))
        chain = alloc.chain.numpy()
        adm = alloc.admitted.numpy().astype(np.int64)
        is_m = chain == CHAIN_MODEL
        is_n = chain == CHAIN_NGRAM
        if alloc.second is None:  # single chain: the other chain verifies nothing
            want_m, want_n = np.where(is_m, adm, 0), np.where(is_n, adm, 0)
        elif alloc.second_chain is None:  # the second branch is the other of the two chains
            sec = alloc.second.numpy().astype(np.int64)
            want_m = np.where(is_m, adm, np.where(is_n, sec, 0))
            want_n = np.where(is_n, adm, np.where(is_m, sec, 0))
        else:  # a tree over more drafters names its second branch's chain
            sec = np.where(chain > 0, alloc.second.numpy().astype(np.int64), 0)
            sc = alloc.second_chain.numpy()
            want_m = np.where(is_m, adm, np.where(sc == CHAIN_MODEL, sec, 0))
            want_n = np.where(is_n, adm, np.where(sc == CHAIN_NGRAM, sec, 0))
        m_len, ng_len = chains["model_len"], chains["ngram_len"]
        # Allocation contract: 0 <= slots <= the chain's length (what the engine would otherwise clamp).
        self._flag((want_m > m_len) | (want_n > ng_len) | (np.minimum(want_m, want_n) < 0), reqs,
                   "the policy admitted more draft tokens than its chain holds")
        self._flag(((want_m > 0) & (not model_ran)) | ((want_n > 0) & (not ngram_ran)), reqs,
                   "the policy admitted draft tokens of a drafter it did not run this step")
        if self.live:
            self.live.admit(self, alloc, plan, reqs, chain, adm, chains, prices)
        return np.minimum(want_m, m_len), np.minimum(want_n, ng_len), model_ran

    @transcribed_by(*WHOLE_STEP)
    def _prefill(self, plan: StepPlan) -> tuple[int, list[int], int]:
        """Advance the prefill chunks: (KV tokens they read, requests whose fresh prompt completes, chunks
        that complete a prefill). The chunk that completes a fresh prompt samples output token 0.

        In a run charged as vLLM (whole_model_chain) a chunk that leaves the prefill unfinished clears the
        request's `fresh` mark: vLLM's drafter runs on that chunk's row too and publishes its confidences, and
        the budget of the first decode step reads the publication of the step before the last chunk -- the reset
        1.0 only when the prefill took one step, else a chunk's confidences, for which the host history's row
        stands in (its first chain)."""
        kv_tokens = 0
        first_tok = []
        n_prefill_done = 0  # chunks that complete their prefill: they sample a token in vLLM
        for r, c in plan.prefilling:
            kv_tokens += int(self.prefilled[r]) + c
            self.prefilled[r] += c
            if self.prefilled[r] >= self.prefill_target[r]:
                n_prefill_done += 1
                if self.pos[r] == 0:
                    first_tok.append(r)
            elif self.whole_model_chain:
                self.fresh[r] = False
        return kv_tokens, first_tok, n_prefill_done

    @transcribed_by(*WHOLE_STEP)
    def native_step(self):
        """The native form of the step's bookkeeping (sim.engine.native_step.NativeStep), or None: the numpy step.
        Decided on the first step; dropped for good if the tables or state stop matching the C's dtypes."""
        fast = getattr(self, "_fast", False)
        if fast is False:
            fast = self._fast = make_native_step(self) if native_step_ok(self) else None
            if fast is not None and type(self.sched) is Scheduler:
                try:
                    self.sched.scans = NativeScans(self.sched, (fast.ffi, fast.lib))
                except Unsupported:
                    pass
        if fast is not None:
            try:
                fast.bind()
            except Unsupported:
                fast = self._fast = None
        return fast

    def array_form(self):
        """The policy's fast form on the native step's gathered arrays (sim.engine.policy_fast.Arrays: a fast
        form's `arrays`), or None: the step builds a StepBatch. Only where the simulator runs the policy's
        fast form (Policy.sim_callable) and the engine's class keeps the hooks it bypasses (a subclass
        overriding _allocate sees every batch); decided on the first step."""
        form = getattr(self, "_arrays", False)
        if form is False:
            form = self._arrays = array_form_of(self)
        return form

    @transcribed_by(*WHOLE_STEP)
    def decide(self, form, g, T: int, kv_tokens: int, n_seqs: int, n_prefill_done: int,
                prices: StepPrices) -> Decision:
        """The native step's policy call on the gathered step `g` (sim.engine.native_step.Gathered): the policy's fast
        form on the arrays (`form`, Engine.array_form), else -- no form, or the form declines -- the policy
        on a StepBatch through its plan and _allocate. Returns the Decision: numpy arrays and host bools (a
        fast form's report of its fused plan, or the Plan's and the Allocation's say combined)."""
        R = len(g.reqs)
        if form is not None:
            tb = self.tb
            truth = (tb.m_acc[g.rows], tb.ng_acc[g.rows], self._true_table(T, R, kv_tokens, n_seqs)) \
                if self.policy.needs_truth else ()
            out = form(Arrays(g.packed, g.ptrs, g.mean_ng, T, R + n_prefill_done,
                              prices.total(), prices.draft,
                              None if self.max_logits is None else max(0, self.max_logits - n_seqs),
                              self.decision_table, prices.ngram, *truth, has_nan=g.has_nan))
            if out is not None:
                return decision(out)
        # the simulator's proposals are table reads, gathered with the history: plan, then allocate on them
        plan = self._plan(self._host_view(g.reqs, g.stale, g.mean_ng, T, n_seqs, n_prefill_done, prices))
        batch = self._step_batch(g.reqs, g.rows, planned_chains(g.chains, plan), g.stale, g.mean_ng, T, kv_tokens,
                                 n_seqs, n_prefill_done, prices)
        alloc = self._allocate(batch, plan)
        if self._replay:
            self._count_replay(batch, plan, alloc)
        if alloc.steps:  # the native step's Decision has no room for them (base.Allocation)
            raise SimulatorBug(f"policy '{self.policy.name}' reports drafter steps, which only the numpy step reads")
        model_ran, ngram_ran = self.drafters_ran(alloc.ran, None, plan)
        second = None if alloc.second is None else alloc.second.numpy()
        return Decision(alloc.chain.numpy(), alloc.admitted.numpy(), second, {MODEL: model_ran, NGRAM: ngram_ran})

    @transcribed_by(*WHOLE_STEP)
    def _step(self, now_ms: float) -> tuple[float, list[int]]:
        tb, pol = self.tb, self.policy
        plan = self._schedule()
        decoding, prefilling = plan.decoding, plan.prefilling
        self._draft_cap = plan.draft_cap
        prefill_tokens = sum(c for _, c in prefilling) if prefilling else 0
        kv_tokens, first_tok, n_prefill_done = self._prefill(plan)
        R = len(decoding)
        verified = [0, 0]
        accepted = [0, 0]
        emitted = 0
        prices = StepPrices()
        n_seqs = R + len(prefilling)
        reqs = decoding
        # vLLM's scheduler decides before the step runs whether to skip the pass after it (sim.core.vllm.drafts_skip)
        known = self.unused_pass is True and self.drafts_known_unused(decoding, prefilling)
        fast = self.native_step()
        if fast is not None:
            if R:
                T = R + prefill_tokens
                prices = self.step_prices(R).copy()
                form = self.array_form()
                g = fast.gather(reqs, pol.uses_ngram and (form is None or form.reads_mean), reuse=form is not None)
                kv_tokens += g.kv
                chain, adm, sec, said = self.decide(form, g, T, kv_tokens, n_seqs, n_prefill_done, prices)
                model_ran, ngram_ran = self.drafters_ran(said, prices)
                sums, bad = fast.commit(g, chain, adm, sec, model_ran, ngram_ran)
                for k, what in zip(bad, self.COMMIT_CHECKS):
                    if k >= 0 and not self.violation:
                        self.violation = f"request {int(reqs[k])}: {what}"
                verified, accepted, emitted, completed = sums[:2], sums[2:4], sums[4], sums[5]
                self.sched.last_draft = verified[0] + verified[1]
                total_tokens = T + self._forward_drafts(R)
            else:
                total_tokens, completed = prefill_tokens, 0
            if self.unused_pass is not None:
                self._add_unused_pass(prices, plan, completed, known)
            return self._finish_step(now_ms, plan, R, prefill_tokens, kv_tokens, first_tok, n_prefill_done, n_seqs,
                                     prices, verified, accepted, emitted, total_tokens, may_finish=completed > 0)
        rows = tb.offsets[reqs] + self.pos[reqs]
        adm_m = adm_n = np.zeros(R, dtype=np.int64)
        chains: dict = {}
        if R:
            kv_tokens += int((tb.prompt_len[reqs] + self.pos[reqs]).sum())
            T = R + prefill_tokens
            # Quoted as if every drafter the policy uses runs; the plan may leave one out (its price is dropped).
            prices = self.step_prices(R).copy()
            k_step = self.sched.step_k  # vLLM's dynamic speculation length: a sequential head runs k_step passes
            if k_step is not None and prices.draft and getattr(self.cost, "draft_sequential", False):
                prices.draft = self.cost.draft_ms(R, min(tb.k_model, k_step))
            stale, mean_ng = self._host_state(reqs)
            if self.step_table:
                self._table = torch.from_numpy(self._true_table(T, R, kv_tokens, n_seqs))
            drafting = self._plan(self._host_view(reqs, stale, mean_ng, T, n_seqs, n_prefill_done, prices))
            chains = self._propose(reqs, rows, drafting)
            if self.live:
                self._live_proposals(reqs, drafting, chains)
            batch = self._step_batch(reqs, rows, chains, stale, mean_ng, T, kv_tokens, n_seqs, n_prefill_done, prices)
            alloc = self._allocate(batch, drafting)
            if self._replay:
                self._count_replay(batch, drafting, alloc)
            adm_m, adm_n, model_ran = self._admit(alloc, drafting, reqs, chains, prices)
        acc_m, acc_n = self._verify(plan, reqs, rows, adm_m, adm_n, chains)
        past_ver = past_acc = None
        if R and alloc.verified is not None:
            past_ver, past_acc = self._past_chain(alloc, rows, adm_m + adm_n, np.maximum(acc_m, acc_n), chains)
        if R and self.recal is not None:
            self._recalibrate(reqs, rows, chains, alloc)
        if self.padded:  # every drafter's admitted slots are queries of the verify forward
            drafts = adm_m + adm_n if past_ver is None else adm_m + adm_n + past_ver
            for k in (self.live.adm if self.live else ()):
                drafts = drafts + self.live.adm[k]
            self._shape = self._step_shape(plan, reqs, drafts)
        if R and self.live and past_ver is not None:
            self._flag(np.ones(R, dtype=bool), reqs, "slots verified past the chain are not modelled with live drafters")
        if R and self.live:
            verified, accepted, emitted = self.live.settle(self, reqs, rows, adm_m, adm_n, acc_m, acc_n, chains,
                                                           model_ran)
            self.sched.last_draft = verified[0] + verified[1] + self.live.verified_live  # the live chains' too
            total_tokens = T + self.sched.last_draft
        elif R:
            from_n = acc_n > acc_m  # the branch whose tokens are kept (ties: the model's, same tokens)
            acc = np.maximum(acc_m, acc_n)
            chain_acc = acc
            if past_acc is not None:  # the model chain's tokens accepted past the chain (emitted as the trace's)
                acc = acc + past_acc
            # vLLM's filling n-gram drafts K slots for every request
            drafted = (adm_m + adm_n) > 0 if self._fill_from is None else np.ones(R, dtype=bool)
            self.acc_hist += np.bincount(np.minimum(acc[drafted], len(self.acc_hist) - 1),
                                         minlength=len(self.acc_hist))
            left = tb.out_len[reqs] - self.pos[reqs]
            n_emit = np.minimum(acc + 1, left)
            # Draft tokens as the chosen chain proposed them, then the target's bonus token (none when the
            # drafts reach the end of the output).
            n_draft = np.minimum(acc, n_emit)
            if past_acc is not None:  # the chain's own tokens, then the accepted past slots and the bonus token,
                n_chain = np.minimum(chain_acc, n_emit)  # read from the trace (m_acc says they are its tokens)
                self._check_chain_bounds(reqs, rows, from_n, n_chain, chains["model_len"], chains["ngram_len"])
                self._emit(reqs, rows, from_n, n_chain, n_emit - n_chain)
            elif self._fill_from is None:
                self._check_chain_bounds(reqs, rows, from_n, n_draft, chains["model_len"], chains["ngram_len"])
                self._emit(reqs, rows, from_n, n_draft, n_emit - n_draft)
            else:  # copies, then vLLM's fillers (the last sampled token), then the bonus token
                n_fill = np.where(from_n, np.maximum(n_draft - self._fill_from, 0), 0)
                self._flag(n_draft > self.filler_k, reqs, "emitted more draft tokens than the K slots vLLM drafts")
                self._check_chain_bounds(reqs, rows, from_n, n_draft - n_fill, chains["model_len"], chains["ngram_len"])
                zero = np.zeros(R, dtype=np.int64)
                self._emit(reqs, rows, from_n, n_draft - n_fill, zero)
                self._emit_fill(reqs, n_fill)
                self._emit(reqs, rows, np.zeros(R, dtype=bool), zero, n_emit - n_draft)
            self.prev_pos[reqs] = rows - tb.offsets[reqs]
            self._record_drafts(reqs, rows, model_ran)
            self.n_steps[reqs] += 1
            verified = [int(adm_m.sum()), int(adm_n.sum())]
            self.sched.last_draft = verified[0] + verified[1]
            if past_ver is not None:  # charged: the target's forward holds them
                self.sched.last_draft += int(past_ver.sum())
                self.past_stats += (1, int((past_ver > 0).any()), int(past_ver.sum()), int(past_acc.sum()))
            accepted = [int(acc[~from_n].sum()), int(acc[from_n].sum())]
            emitted = int(n_emit.sum())
            total_tokens = T + self._forward_drafts(R)
        else:
            total_tokens = prefill_tokens
        if self.unused_pass is not None:
            completed = int(np.count_nonzero(self.pos[reqs] >= tb.out_len[reqs])) if R else 0
            self._add_unused_pass(prices, plan, completed, known)
        return self._finish_step(now_ms, plan, R, prefill_tokens, kv_tokens, first_tok, n_prefill_done, n_seqs,
                                 prices, verified, accepted, emitted, total_tokens)

    def _proposal_lens(self, decoding: np.ndarray) -> np.ndarray:
        """The length of each decoding request's proposal (int64 [R]; the longest of the policy's live drafters'),
        for the scheduler's budget split under SlotCharge.variable: vLLM drafts after a step and schedules the next
        one from those proposals, so they are made here, before the split, and the step uses them."""
        chains: dict = {}
        self.live.propose(self, decoding, self.policy.default_plan, chains)
        self._early = (decoding, chains["live"])
        lens = [c[2] for c in chains["live"].values()]
        return np.maximum.reduce(lens) if lens else np.zeros(len(decoding), dtype=np.int64)

    def _live_proposals(self, reqs: np.ndarray, plan: Plan, chains: dict) -> None:
        """chains['live'] for the step (sim.engine.live.LiveChains.propose): the proposals the scheduler's split
        already made (_proposal_lens) where they are this plan's and these requests', else made now; each cut to
        the drafts the budget scheduled for its request (StepPlan.draft_cap), as vLLM truncates them."""
        early, self._early = self._early, None
        same_live = (plan.drafters ^ self.policy.default_plan.drafters).isdisjoint(self.live.d)
        if early is not None and same_live and len(early[0]) >= len(reqs) and \
                np.array_equal(early[0][:len(reqs)], reqs):
            chains["live"] = {k: tuple(a[:len(reqs)] for a in v) for k, v in early[1].items()}
        else:
            self.live.propose(self, reqs, plan, chains)
        cap = self._draft_cap
        if cap is not None:
            chains["live"] = {k: (t, c, np.minimum(n, cap), np.minimum(a, cap))
                              for k, (t, c, n, a) in chains["live"].items()}

    @transcribed_by(*WHOLE_STEP)
    def _add_unused_pass(self, prices: StepPrices, plan: StepPlan, completed: int, known: bool) -> None:
        """Charge the step the drafter pass vLLM runs after it for no request (unused_pass_ms), with the model
        drafter's (`completed`: decoding requests whose output completed this step)."""
        if self.unused_pass is not None:
            extra = self.unused_pass_ms(plan.decoding, plan.prefilling, completed, known)
            if extra:
                prices.draft += extra

    def _recalibrate(self, reqs: np.ndarray, rows: np.ndarray, chains: dict, alloc: Allocation) -> None:
        """Recalibration's evidence of the step (sim/core/drafters/recalibration.py): the tokens each request emits,
        e = min(accepted of the verified chain + 1, output left), and each drafter's chain with the leading tokens
        of it the target emits (here the tables' exact acceptance, capped at the chain; a real engine compares the
        chain's tokens with the emitted ones), and each chain's verified slots (what vLLM's acceptance estimator
        observes). Only what is known once the step's tokens are."""
        tb = self.tb
        got = {"dspark": (chains["model_conf"], chains["model_len"], tb.m_acc[rows]),
               "ngram": (chains["ngram_conf"], chains["ngram_len"], tb.ng_acc[rows])}
        for k, (_, conf, length, acc) in chains.get("live", {}).items():
            got[k] = (conf, length, acc)
        cid = alloc.chain.numpy()
        adm = alloc.admitted.numpy()
        took = np.zeros(len(reqs), dtype=np.int64)
        verified = {}  # each chain's slots verified this step (0 where another chain was)
        for name, (conf, length, acc) in got.items():
            sel = cid == chain_id(name)
            verified[name] = np.where(sel, adm, 0)
            took = np.where(sel, np.minimum(adm, np.minimum(acc, length)), took)
        e = np.minimum(took + 1, tb.out_len[reqs] - self.pos[reqs])
        self.recal.observe(reqs, {n: (c, ln) for n, (c, ln, _) in got.items() if n in self.recal.names},
                           {n: np.minimum(a, ln) for n, (_, ln, a) in got.items()}, e, admitted=verified)

    def _step_shape(self, plan: StepPlan, reqs: np.ndarray, drafts: np.ndarray):
        """The step's padded attention shape (sim/core/cost/padded.py): each prefill chunk's c queries over the
        entries prefilled so far (its own included), each decoding request's 1 + drafts queries over its cache
        (prompt + pos - 1 entries, the last emitted token's recomputed here) plus those queries."""
        q = [c for _, c in plan.prefilling]
        k = [int(self.prefilled[r]) for r, _ in plan.prefilling]  # _prefill advanced them: entries after the chunk
        if len(reqs):
            qd = 1 + np.asarray(drafts, dtype=np.int64)
            q += qd.tolist()
            k += (self.tb.prompt_len[reqs] + self.pos[reqs] - 1 + qd).tolist()
        return padded_shape(q, k, self.padded)

    @transcribed_by(*WHOLE_STEP)
    def drafts_known_unused(self, decoding: np.ndarray, prefilling: list) -> bool:
        """Whether vLLM's scheduler knows, as it schedules the step, that no drafts proposed after it will be used
        (0.33's Scheduler._drafts_unused for every scheduled request; called before the step emits, after its
        prefill chunks are counted): each prefill chunk is not its prompt's last, or is and samples the request's
        only output token; each decoding request samples its last token for sure -- the output the scheduler
        knows plus one reaches its length, that output being pos, or under asynchronous scheduling the output
        before the request's previous step, which is in flight and counted as one token (prev_pos + 1)."""
        out, known = self.tb.out_len, self.prev_pos if self.cfg.async_scheduling else self.pos
        sure = 2 if self.cfg.async_scheduling else 1  # tokens the scheduler counts on: this step's, the one in flight
        for r in decoding:  # most steps fail at the first request
            if known[r] + sure < out[r]:
                return False
        return all(self.prefilled[r] < self.prefill_target[r] or (self.pos[r] == 0 and out[r] <= 1)
                   for r, _ in prefilling)

    @transcribed_by(*WHOLE_STEP)
    def unused_pass_ms(self, decoding: np.ndarray, prefilling: list, completed: int, known: bool) -> float:
        """The drafter pass vLLM runs after this step although no request uses its drafts (sim.core.vllm.drafts_skip;
        called after the step emitted, before a prefill's first token) [ms]: the model drafter's pass over the
        step's scheduled requests where `completed` covers every decoding request (each completed its output) and
        each prefill chunk is not its prompt's last or completes its request with its first token; 0 where no
        such pass is charged (Engine.unused_pass None) or vLLM skips it (0.33: `known`, drafts_known_unused)."""
        R, mode = len(decoding), self.unused_pass
        n = R + len(prefilling)
        if mode is None or (mode and known) or not n or completed < R:
            return 0.0
        out = self.tb.out_len
        if any(self.prefilled[r] >= self.prefill_target[r] and not (self.pos[r] == 0 and out[r] <= 1)
               for r, _ in prefilling):
            return 0.0
        return float(self.cost.draft_ms(n, self.tb.k_model))

    def _forward_drafts(self, R: int) -> int:
        """Draft slots the step's target forward holds: the verified ones (Scheduler.last_draft), or under a
        charge that verifies every scheduled slot (vLLM without adaptive verification) all R decoding requests'
        scheduled drafts, as the budget left them."""
        c = self.sched.charge
        if not c.verify_all:
            return self.sched.last_draft
        return R * c.drafts if self._draft_cap is None else int(self._draft_cap.sum())

    @transcribed_by(*WHOLE_STEP)
    def _finish_step(self, now_ms: float, plan: StepPlan, R: int, prefill_tokens: int, kv_tokens: int,
                     first_tok: list, n_prefill_done: int, n_seqs: int, prices: StepPrices, verified: list,
                     accepted: list, emitted: int, total_tokens: int,
                     may_finish: bool = True) -> tuple[float, list[int]]:
        """The rest of a step after the decoding requests' emission: the prefills' first tokens, the charge,
        the step's time, finished requests, and the step's row. may_finish=False: no decoding request's output
        completed this step (the native step counts them), so only a first token can finish a request (a
        request finishes at the step its position reaches its length, with no prefill pending: the scheduler
        is not asked otherwise)."""
        tb, pol, preempted = self.tb, self.policy, plan.preempted
        if first_tok:  # the prefill's sampled token: output[0], from the target
            fast = getattr(self, "_fast", None)
            if fast is not None:
                fast.emit_bonus(first_tok)
            else:
                ft = np.asarray(first_tok, dtype=np.int64)
                none = np.zeros(len(ft), dtype=np.int64)
                self._emit(ft, self.tb.offsets[ft], none.astype(bool), none, none + 1)
            prev_pos, model_pos = self.prev_pos, self.model_pos
            for r in first_tok:
                prev_pos[r] = model_pos[r] = 0
            emitted += len(first_tok)
        logit_rows = total_tokens - prefill_tokens + n_prefill_done
        if self.padded:
            self._shape_log.append(self._shape)
        t = self._charge(prices, plan, R, total_tokens, kv_tokens, n_seqs, logit_rows=logit_rows)
        gpu_ms, step_ms = t.times(host_syncs(pol, self.cfg))
        end_s = (now_ms + step_ms) / 1000.0
        for r in first_tok:
            if np.isnan(self.t_first[r]):
                self.t_first[r] = end_s
        finished = self.sched.pop_finished(tb.out_len) if may_finish or first_tok else []
        self.steps.append(make_record((now_ms, step_ms, R, prefill_tokens, verified[0], verified[1], accepted[0],
                                       accepted[1], emitted, t.draft, t.ngram, t.alloc, t.verify,
                                       t.sample, t.cpu, step_ms - gpu_ms, kv_tokens, preempted, total_tokens,
                                       logit_rows, n_seqs)))
        return step_ms, finished
