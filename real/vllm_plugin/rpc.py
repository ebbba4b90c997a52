"""Functions to call in vLLM's workers through `LLM.collective_rpc(fn)` (the worker is the argument)."""
from __future__ import annotations


def hybrid_stats(worker) -> dict:
    """The hybrid speculator's live statistics in this worker ({"loaded": False, ...} when it is not running,
    with the plugin's registration errors, if any)."""
    from real.vllm_plugin.plugin import REGISTER_ERRORS

    runner = getattr(worker, "model_runner", None)
    sp = getattr(runner, "speculator", None)
    hybrid = getattr(sp, "hybrid", None)
    if hybrid is None:
        return {"loaded": False, "speculator": type(sp).__name__, "register_errors": list(REGISTER_ERRORS)}
    live = getattr(runner, "adaptive_verification", None)
    return {"loaded": True, "speculator": type(sp).__name__, "warmed_up": bool(getattr(sp, "warmed_up", False)),
            "attached_live_manager": sp.adaptive_manager is not None and sp.adaptive_manager is live,
            **hybrid.stats()}


def cost_tables(worker) -> dict | None:
    """Adaptive verification's cost tables in this worker (draft ms by request count, verify ms by total tokens),
    or None without adaptive verification or before they were profiled."""
    av = getattr(getattr(worker, "model_runner", None), "adaptive_verification", None)
    if av is None or av.cost_tables is None:
        return None
    d, v = av.cost_tables
    return {"draft_ms": [float(x) for x in d], "verify_ms": [float(x) for x in v]}

