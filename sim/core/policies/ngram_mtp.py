"""`ngram-mtp`: vLLM main's NgramMTPSpeculator (vllm/v1/worker/gpu/spec_decode/mtp/speculator.py, Model Runner V2; in
no release the simulator models): an MTP drafter that copies from the context where the n-gram lookup matches, and
skips its own decode steps when every request matched.

Math. K = the model drafter's chain length (num_speculative_tokens; the MTP module stands in as a sequential head,
--speculative-config '{"method": "mtp", ...}' on a target with MTP layers: sim/core/vllm.py). Per request r of a
step, with n-gram chain length l_n[r] and model chain length l_m[r]:
    matched[r] = l_n[r] > 0
    chain[r]   = n-gram where matched[r], else the model chain;  admitted[r] = min(K, its length)   [tokens]
The MTP pass behind the step's drafts always runs its first (prefill) step, which keeps the draft KV cache
complete; its K - 1 decode steps are skipped when
    all_r matched[r]  and  the previous step's lookup matched every request too
(vLLM waits for this step's lookup only while the previous one matched every request, read without blocking), so
the pass is priced CostModel.draft_ms(R, 1) instead of draft_ms(R, K) for a sequential head (Allocation.steps[MODEL];
a block drafter such as DSpark has no decode steps to skip). The previous step's flag is host state the engine keeps
(`AllMatched`, Policy.online), vLLM's double-buffered all_matched_cpu.
`ngram-mtp:b1`, the other version in vLLM main's history: only a batch of one request looks up, waits for the
lookup and skips the decode steps on a match; larger batches draft with MTP alone (K steps).
Every admitted slot is verified (no adaptive verification). Not in a vLLM release: the 'vllm' scheduler refuses it
and the verdict does not call it deployable (VllmRun.release).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from sim.core.policies.base import MODEL, NGRAM, Allocation, StepBatch
from sim.core.policies.common import CHAIN_MODEL, CHAIN_NGRAM, finish
from sim.core.policies.registry import Policy, parse_spec, register, spec_name, spec_usage
from sim.core.settings import setting
from sim.core.vllm import VllmRun

VLLM_MAIN = "vLLM main (Model Runner V2's NgramMTPSpeculator, not in 0.33)"


class AllMatched:
    """The engine's online state of `ngram-mtp` (Policy.online; RecalState's interface): whether every decoding
    request's n-gram lookup matched at the previous step (0-d bool tensor), handed to the policy as
    StepBatch.all_matched[NGRAM] (and one step older as HostView.all_matched)."""

    field = "all_matched"  # the StepBatch field its flag travels in

    names = (NGRAM,)

    def __init__(self, k_model: int) -> None:
        self.flag = self.old = torch.tensor(False)

    def offsets(self, reqs) -> tuple[dict, dict]:
        return {NGRAM: self.flag}, {NGRAM: self.old}

    def observe(self, reqs, chains: dict, acc: dict, evidence, admitted: dict | None = None) -> None:
        """After a decode step: chains[NGRAM] = (conf, len) of its lookups (absent: the lookup did not run)."""
        self.old = self.flag
        got = chains.get(NGRAM)
        self.flag = torch.tensor(got is not None and bool((np.asarray(got[1]) > 0).all()))


def alloc_ngram_mtp(batch: StepBatch, batch1: bool) -> Allocation:
    """The module docstring's rule: each request's chain, and the MTP pass's steps (Allocation.steps[MODEL])."""
    K = batch.chains[MODEL][0].shape[1]
    R = batch.num_reqs
    matched = batch.chains[NGRAM][1] > 0
    if batch1 and R != 1:  # no lookup: MTP drafts every request, all K steps
        out = finish(torch.full_like(batch.chains[MODEL][1], CHAIN_MODEL), batch.chains[MODEL][1].clamp(max=K))
        return dataclasses.replace(out, steps={MODEL: torch.tensor(K)}, ran={NGRAM: torch.tensor(False)})
    everyone = matched.all()
    skip = everyone if batch1 else everyone & batch.all_matched.get(NGRAM, torch.tensor(False))
    chain = torch.where(matched, torch.full_like(matched, CHAIN_NGRAM, dtype=torch.int64),
                        torch.full_like(matched, CHAIN_MODEL, dtype=torch.int64))
    admitted = torch.where(matched, batch.chains[NGRAM][1].clamp(max=K), batch.chains[MODEL][1].clamp(max=K))
    return dataclasses.replace(finish(chain, admitted), steps={MODEL: torch.where(skip, 1, K)})


@dataclass(frozen=True)
class NgramMtpSettings:
    """`ngram-mtp`'s setting: which version of vLLM main's speculator."""

    b1: bool = setting(False, "the version that looks up at batch 1 only (larger batches draft with MTP alone, K "
                              "steps)")


@register("ngram-mtp", spec_usage("ngram-mtp", NgramMtpSettings), "vLLM main's NgramMTPSpeculator: the n-gram copy "
          "where the lookup matches, else the MTP (model) drafter's K tokens, the MTP decode steps skipped when this "
          "and the previous lookup matched every request; not in a vLLM release", settings=(NgramMtpSettings,))
def _ngram_mtp(params: list[str]) -> Policy:
    given = parse_spec("ngram-mtp", NgramMtpSettings, params)
    batch1 = NgramMtpSettings(**given).b1
    return Policy(spec_name("ngram-mtp", NgramMtpSettings, given), lambda b: alloc_ngram_mtp(b, batch1),
                  uses_model=True, uses_ngram=True, online=AllMatched, vllm=VllmRun("mtp", release=VLLM_MAIN, main=True))
