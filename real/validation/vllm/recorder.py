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
"""
from __future__ import annotations

from typing import Any

_STATE: dict[str, Any] = {"req_states": None, "rows": [], "installed": False}


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
        if not kwargs.get("dummy_run") and not kwargs.get("is_profile") and kwargs.get("num_speculative_tokens") != 0:
            _record(self, input_batch)
        return out

    dsp.DSparkSpeculator.propose = propose
    _STATE["installed"] = True


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
    """rpc: forget what was recorded so far (the warm-up's chains)."""
    _STATE["rows"].clear()


def collect(worker) -> list[list]:
    """rpc: the chains recorded since the last clear, on the host: [request id, output position, tokens, confs]."""
    out = []
    for ids, prompt, total, tok, conf in _STATE["rows"]:
        pos = total.cpu().numpy().astype("int64") - prompt.astype("int64")
        toks, cs = tok.cpu().tolist(), conf.float().cpu().tolist()
        out += [[rid, int(p), t, c] for rid, p, t, c in zip(ids, pos, toks, cs)]
    _STATE["rows"].clear()
    return out
