"""Functions to call in vLLM's workers through `LLM.collective_rpc(fn)` (the worker is the argument)."""
from __future__ import annotations


def hybrid_stats(worker) -> dict:
    """The hybrid speculator's live statistics in this worker ({"loaded": False} when it is not running)."""
    sp = getattr(getattr(worker, "model_runner", None), "speculator", None)
    hybrid = getattr(sp, "hybrid", None)
    if hybrid is None:
        return {"loaded": False, "speculator": type(sp).__name__}
    return {"loaded": True, "speculator": type(sp).__name__, **hybrid.stats()}

