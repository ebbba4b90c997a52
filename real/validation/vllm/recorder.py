"""Records the DSpark chains a vLLM run drafts, on either build, for the simulator to replay (pipeline/drafts.py).

Runs in vLLM's worker process, installed through `LLM.collective_rpc(attach)` (in-process on the CPU build, the
engine-core process on CUDA). It wraps DSparkSpeculator.propose -- a public method, the one each step calls
whatever runs inside it (a CUDA-graph replay on 0.33) -- and after it keeps, per live request row r:

    the output position  p_r = total_len[idx_r] - prompt_len[idx_r]        (the position the chain drafts from)
    the chain            draft_tokens[r, :K], draft_token_confidence_probs[r, :K]

Without a host sync in the step: the tokens, confidences and total lengths are cloned on the device (three small
copies per step; prompt lengths and request ids are host values already), and copied to the host once, by
`collect` after the timed generate. The hybrid speculator's own propose calls DSpark's first, so in a hybrid run
these are DSpark's chains before the hybrid chose between them and the n-gram chain's.

In a hybrid run it also records which chain the plugin published per live request row (`collect_choices`): it wraps
HybridDrafter.propose (real/vllm_plugin/hybrid.py, unchanged) and keeps device clones of the Proposal's use_ngram and
ngram_len with the row's output position; the rows' request ids are the step's batch, kept (host values) by the
DSpark wrapper, which every live step calls, a skipped pass included (K = 0). Padded steps (warm-up, profiling) are
left out. What the simulator would need to replay these choices is in docs/real.md ("The plugin").

It also records each step's schedule as adaptive verification budgets it (`collect_budgets`): the scheduled
requests, their scheduled tokens and drafts, the stale confidences it budgets on and the draft budget B it admits
-- host values that AdaptiveVerificationManager.get_num_tokens already holds, so no copy from the device and no sync
(the rows are kept as a host array, made lists by `collect_budgets`). The prediction's step table is compared with it
step by step (real/validation/vllm/budgets.py) to find where a simulated run leaves the real one.
"""
from __future__ import annotations

from typing import Any

_STATE: dict[str, Any] = {"req_states": None, "rows": [], "installed": False, "choices": [], "batch": None,
                          "padded": False, "budgets": []}


def _record(speculator, input_batch) -> None:
    rs = _STATE["req_states"]
    if rs is None:
        return
    R = int(input_batch.num_reqs)
    if R == 0:
        return
    idx_np = input_batch.idx_mapping_np[:R]
    idx = input_batch.idx_mapping[:R]
    _STATE["rows"].append((list(input_batch.req_ids[:R]), rs.prompt_len.np[idx_np].copy(),
                           rs.total_len.gpu[idx.long()].clone(), speculator.draft_tokens[:R].clone(),
                           speculator.draft_token_confidence_probs[:R].clone()))


def _install() -> None:
    if _STATE["installed"]:
        return
    from vllm.v1.worker.gpu.spec_decode.dspark import speculator as dsp

    orig = dsp.DSparkSpeculator.propose

    def propose(self, input_batch, *args, **kwargs):
        out = orig(self, input_batch, *args, **kwargs)
        if not kwargs.get("dummy_run") and not kwargs.get("is_profile"):
            R = int(input_batch.num_reqs)  # this step's rows, for the plugin's choice recorded next (host values)
            _STATE["batch"] = (list(input_batch.req_ids[:R]), input_batch.idx_mapping_np[:R].copy())
            if kwargs.get("num_speculative_tokens") != 0:
                _record(self, input_batch)
        return out

    dsp.DSparkSpeculator.propose = propose
    _install_choices()
    _install_budgets()
    _STATE["installed"] = True


def _record_choice(proposal, total_len) -> None:
    """The chain the plugin published for each row of this step's batch (device clones; no host sync)."""
    rs, batch = _STATE["req_states"], _STATE["batch"]
    if rs is None or batch is None or _STATE["padded"]:
        return
    ids, idx_np = batch
    R = len(ids)
    if R == 0 or proposal.use_ngram.shape[0] < R:
        return
    idx = rs_index(idx_np, total_len.device)
    _STATE["choices"].append((ids, rs.prompt_len.np[idx_np].copy(), total_len[idx].clone(),
                              proposal.use_ngram[:R].clone(), proposal.ngram_len[:R].clone()))


def rs_index(idx_np, device):
    """The batch's request slots as a device index (a host-to-device copy of R ints, no sync)."""
    import torch

    return torch.as_tensor(idx_np, dtype=torch.long).to(device, non_blocking=True)


def _install_choices() -> None:
    """Wrap the plugin's HybridDrafter.propose (kept Proposal per live step) and padded_step (left out)."""
    try:
        from real.vllm_plugin.hybrid import HybridDrafter
    except ImportError:  # the plugin is not installed: nothing to record
        return
    orig_propose, orig_padded = HybridDrafter.propose, HybridDrafter.padded_step

    def propose(self, idx_mapping, num_sampled, model_tokens, model_conf, token_ids, total_len, *args, **kwargs):
        p = orig_propose(self, idx_mapping, num_sampled, model_tokens, model_conf, token_ids, total_len, *args,
                         **kwargs)
        _record_choice(p, total_len)
        return p

    def padded_step(self, *args, **kwargs):
        _STATE["padded"] = True
        try:
            return orig_padded(self, *args, **kwargs)
        finally:
            _STATE["padded"] = False

    HybridDrafter.propose, HybridDrafter.padded_step = propose, padded_step


def _install_budgets() -> None:
    """Wrap AdaptiveVerificationManager.get_num_tokens (the host-side budget; absent on a build without it)."""
    try:
        from vllm.v1.worker.gpu.spec_decode import adaptive_verification as av
    except ImportError:
        return
    orig = av.AdaptiveVerificationManager.get_num_tokens

    def get_num_tokens(self, num_tokens_per_req, draft_tokens):
        n = orig(self, num_tokens_per_req, draft_tokens)
        if not _STATE["padded"] and self._batch_budget is not None:
            ids = list(num_tokens_per_req)
            rows = [self.req_states.req_id_to_index[r] for r in ids]
            stale = self._stale_confidences[self._stale_idx].np[rows]  # host rows (a fancy-indexed copy): no sync
            _STATE["budgets"].append([ids, [int(num_tokens_per_req[r]) for r in ids],
                                      [len(draft_tokens.get(r, ())) for r in ids], int(self._batch_budget[2]), stale])
        return n

    av.AdaptiveVerificationManager.get_num_tokens = get_num_tokens


def attach(worker) -> bool:
    """rpc: install the recorder in this worker and point it at the runner's request state; False when the
    runner has none (a run without a model drafter records nothing)."""
    runner = getattr(worker, "model_runner", None)
    rs = getattr(runner, "req_states", None)
    if rs is None or getattr(runner, "speculator", None) is None:
        return False
    _install()
    _STATE["req_states"] = rs
    _STATE["rows"].clear()
    return True


def clear(worker) -> None:
    """rpc: forget what was recorded so far (the warm-up's chains and choices)."""
    _STATE["rows"].clear()
    _STATE["choices"].clear()
    _STATE["budgets"].clear()


def collect_budgets(worker) -> list[list]:
    """rpc: adaptive verification's budget per step since the last clear: [request ids, scheduled tokens per
    request, scheduled drafts per request, admitted draft budget B (B >= the drafts scheduled: all verified), the stale
    confidences B was chosen from, per request (W wide)]."""
    out = [[ids, tok, drafts, b, stale.round(6).tolist()] for ids, tok, drafts, b, stale in _STATE["budgets"]]
    _STATE["budgets"].clear()
    return out


def collect_choices(worker) -> list[list]:
    """rpc: the plugin's chain per live request row since the last clear, on the host: [request id, output position,
    n-gram chain published (bool), its length]."""
    out = []
    for ids, prompt, total, use_ng, ng_len in _STATE["choices"]:
        pos = total.cpu().numpy().astype("int64") - prompt.astype("int64")
        out += [[rid, int(p), bool(u), int(n)] for rid, p, u, n in zip(ids, pos, use_ng.cpu().tolist(),
                                                                       ng_len.cpu().tolist())]
    _STATE["choices"].clear()
    return out


def collect(worker) -> list[list]:
    """rpc: the chains recorded since the last clear, on the host: [request id, output position, tokens, confs]."""
    out = []
    for ids, prompt, total, tok, conf in _STATE["rows"]:
        pos = total.cpu().numpy().astype("int64") - prompt.astype("int64")
        toks, cs = tok.cpu().tolist(), conf.float().cpu().tolist()
        out += [[rid, int(p), t, c] for rid, p, t, c in zip(ids, pos, toks, cs)]
    _STATE["rows"].clear()
    return out
