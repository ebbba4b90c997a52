"""The drafter registry: every drafter a run may enable (`--drafters dspark,ngram,suffix`), one entry each.

Two kinds of drafter, one contract (`Drafter`: start / propose / observe / stop / cost):
  table  the proposal at output position i depends only on the request and i (the exact n-gram lookup over
         the trace's own context, the model drafter's profile or recorded drafts), so it is precomputed once
         per trace in the DraftTables (sim/core/drafters/tables.py) and `propose` is a read of rows;
  live   the proposal depends on the schedule (the suffix tree learns from the outputs of requests that
         finished before this step), so the engine runs it inside the simulation: `start` when a request
         first decodes, `observe` with the tokens it emitted, `propose` each step it is planned, `stop` when
         it finishes.
Each drafter has a chain id (Allocation.chain: 1 = dspark, 2 = ngram, 3 = suffix, ...; 0 = none), fixed by
the registry so that a policy's allocation means the same in every run. The default set, ("dspark",
"ngram"), is today's two-drafter run: its policies, fast forms and results are unchanged.

How to add a drafter (docs/design.md, "Adding a drafter"): write its module with a class implementing
`Drafter` (live) or a DraftTables column (table), register it below with `register_drafter`, and price it in
`cost`; the N-drafter policies (sim/core/policies/multi.py) then choose among it and the others.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Optional, Protocol, Sequence

import numpy as np

from sim.core.drafters.suffix import LiveSuffixDrafter, SuffixCalibrator, suffix_config
from sim.infra.errors import ConfigError

DEFAULT_DRAFTERS = ("dspark", "ngram")


class Drafter(Protocol):
    """What a live drafter does for the engine (table drafters are read from DraftTables instead).

    start(rid, context)     a request begins: its context so far (prompt, and output if it resumes)
    propose(rids)           one chain per request: (tokens int64 [R, K], conf float64 [R, K] conditional
                            acceptance estimates in [0, 1], len int64 [R]); slots j >= len are padding
    observe(rid, tokens)    tokens the request emitted (accepted drafts and the target's bonus token)
    stop(rid, finished)     the request leaves (finished: its output may join what later proposals learn from)
    cost(R, cost_model)     the drafter's time for R requests in one step [ms]
    width                   K, the longest chain it proposes [tokens]
    """

    width: int

    def start(self, rid: int, context: Sequence[int]) -> None: ...

    def propose(self, rids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def observe(self, rid: int, tokens: Iterable[int]) -> None: ...

    def stop(self, rid: int, finished: bool = True) -> None: ...

    def cost(self, num_reqs: int, cost_model) -> float: ...


@dataclass(frozen=True)
class DrafterSpec:
    """A registered drafter: name, kind ('table' or 'live'), chain id, one-line summary, and for a live drafter
    its factory (settings dict -> a fresh Drafter for one run; ConfigError on a setting out of range)."""

    name: str
    kind: str
    chain: int
    summary: str
    factory: Optional[Callable[[dict], Drafter]] = None


_REGISTRY: Dict[str, DrafterSpec] = {}


def register_drafter(spec: DrafterSpec) -> None:
    if spec.name in _REGISTRY or any(s.chain == spec.chain for s in _REGISTRY.values()):
        raise RuntimeError(f"drafter '{spec.name}' (chain {spec.chain}) registered twice")
    _REGISTRY[spec.name] = spec


def drafters() -> Dict[str, DrafterSpec]:
    """Every registered drafter, name -> spec, in registration (= chain id) order."""
    return _REGISTRY


def chain_id(name: str) -> int:
    return _REGISTRY[name].chain


def parse_drafters(text) -> tuple[str, ...]:
    """A --drafters value ('dspark,ngram,suffix', or a list of names) as registered names in registry order;
    ConfigError (one line) for an unknown, repeated or empty name."""
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else list(text))]
    if not names or any(not n for n in names):
        raise ConfigError(f"--drafters: expected names separated by commas (registered: {', '.join(_REGISTRY)}), "
                          f"got {text!r}")
    for n in names:
        if n not in _REGISTRY:
            raise ConfigError(f"--drafters: unknown drafter '{n}'; registered: {', '.join(_REGISTRY)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--drafters: a drafter is named twice in {text!r}")
    return tuple(n for n in _REGISTRY if n in names)


def live_drafters(names: Iterable[str], settings: Optional[dict] = None) -> dict:
    """Fresh live drafters (name -> Drafter) for one run, for the live ones among `names`; settings: name ->
    that drafter's settings dict."""
    settings = settings or {}
    return {n: _REGISTRY[n].factory(dict(settings.get(n) or {})) for n in names if _REGISTRY[n].kind == "live"}


def _suffix(settings: dict) -> Drafter:
    return LiveSuffixDrafter(suffix_config(settings), SuffixCalibrator.load())


register_drafter(DrafterSpec("dspark", "table", 1, "the model drafter (DSpark block drafter profile or recorded "
                             "drafts; --drafter)"))
register_drafter(DrafterSpec("ngram", "table", 2, "the exact n-gram drafter over the request's context (vLLM's "
                             "prompt lookup; --ngram-k)"))
register_drafter(DrafterSpec("suffix", "live", 3, "the suffix-tree drafter over the request's context and the "
                             "outputs of finished requests (sim/core/drafters/suffix.py)", _suffix))


def parse_drafter_list(text: str) -> str:
    """A --drafters value, checked (parse_drafters) and written in registry order: 'dspark,ngram,suffix'."""
    return ",".join(parse_drafters(text))
