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

Settings: a drafter declares them once, as a frozen dataclass of `setting(...)` fields in its own module
(sim/core/drafters/settings.py), named in its DrafterSpec. A run carries every drafter's settings as one canonical
JSON object {"drafter": {"setting": value}} (DrafterConfig.drafter_config); the flags --D-SETTING and --D-config
JSON are made from the declaration (add_drafter_flags), and `live_drafters` hands each factory its checked
settings instance.

How to add a drafter (docs/design.md, "Extending"): write its module with a class implementing `Drafter` (live)
or a DraftTables column (table) and its settings class, register it below with `register_drafter`, and price it
in its `cost`; the N-drafter policies (sim/core/policies/multi.py) then choose among it and the others.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Protocol, Sequence

import numpy as np

from sim.core.drafters import DEFAULT_DRAFTERS  # noqa: F401  (defined with the package: read by the vLLM plugin)
from sim.core.drafters.settings import setting_flag, setting_types, settings_from
from sim.core.drafters.suffix import LiveSuffixDrafter, SuffixCalibrator, SuffixConfig, check_memory
from sim.infra.errors import ConfigError
from sim.infra.registry import Registry


class Drafter(Protocol):
    """What a live drafter does for the engine (table drafters are read from DraftTables instead).

    start(rid, context)     a request begins: its context so far (prompt, and output if it resumes)
    propose(rids)           one chain per request: (tokens int64 [R, K], conf float64 [R, K] conditional
                            acceptance estimates in [0, 1], len int64 [R]); slots j >= len are padding
    observe(rid, tokens)    tokens the request emitted (accepted drafts and the target's bonus token)
    stop(rid, finished)     the request leaves (finished: its output may join what later proposals learn from)
    cost(R, cost_model)     the drafter's time for R requests in one step [ms]
    width                   K, the longest chain it proposes [tokens]
    check_memory(contexts, outputs, batch)  optional: ConfigError before a run whose requests (prompt + output and
                            output lengths [tokens], `batch` at once) would take the drafter past its memory limit
    verdict(rids, verified, accepted)  optional: after a step it ran, each request's slots of its chain verified
                            and, of those, accepted [tokens] (int64 [R]; sim/engine/live.py)
    """

    width: int

    def start(self, rid: int, context: Sequence[int]) -> None: ...

    def propose(self, rids: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def observe(self, rid: int, tokens: Iterable[int]) -> None: ...

    def stop(self, rid: int, finished: bool = True) -> None: ...

    def cost(self, num_reqs: int, cost_model) -> float: ...


@dataclass(frozen=True)
class Pricing:
    """What a table drafter's price reads besides R and the cost model: the model drafter's block [tokens] and
    whether a lookup runs as a GPU kernel (False: on the host, for a policy that syncs)."""

    block: int
    on_gpu: bool = True


@dataclass(frozen=True)
class DrafterSpec:
    """A registered drafter: name, kind ('table' or 'live'), chain id, one-line summary, for a live drafter its
    factory (its settings instance -> a fresh Drafter for one run), its settings class (a frozen dataclass of
    sim/core/drafters/settings.py `setting` fields; None: no settings), for a drafter whose memory grows with the
    requests its up-front check (check_live_memory; None: none), and for a table drafter its price: (R, cost model,
    Pricing) -> ms of its pass for R requests in one step, from the cost model's kind of work it does (a live
    drafter prices itself: Drafter.cost)."""

    name: str
    kind: str
    chain: int
    summary: str
    factory: Optional[Callable[[Any], Drafter]] = None
    settings: Optional[type] = None
    memory: Optional[Callable[..., None]] = None  # (settings, contexts, outputs, batch) -> None or ConfigError
    price: Optional[Callable[[int, Any, Pricing], float]] = None


_REGISTRY: Registry[DrafterSpec] = Registry("drafter", unique=lambda spec: spec.chain)  # a chain id is one drafter's


def register_drafter(spec: DrafterSpec) -> None:
    """Register `spec` under its name (the one registry idiom, sim/infra/registry.py); RuntimeError when its name or
    its chain id is taken."""
    _REGISTRY.add(spec.name, spec)


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


def drafter_settings(config: str | dict | None) -> dict[str, dict]:
    """name -> settings dict of a run's drafter_config (canonical JSON, a dict of the same, or None: {})."""
    if config is None or config == "":
        return {}
    return json.loads(config) if isinstance(config, str) else {k: dict(v) for k, v in config.items()}


def parse_drafter_config(text: str | dict | None) -> str | None:
    """A --drafter-config value (a JSON object {"drafter": {"setting": value}}), each drafter's settings checked by
    its declaration, written back in a canonical form (sorted keys); None for nothing set. ConfigError (one line)
    for bad JSON, an unknown drafter, a drafter without settings, or a bad setting."""
    if text is None:
        return None
    if isinstance(text, str):
        try:
            cfg = json.loads(text)
        except (ValueError, RecursionError):
            raise ConfigError(f"--drafter-config: not JSON: {text[:60]!r}") from None
    else:
        cfg = text
    if not isinstance(cfg, dict):
        raise ConfigError(f"--drafter-config: expected a JSON object such as '{{\"suffix\": {{\"max_depth\": 24}}}}', "
                          f"got {str(text)[:60]!r}")
    for name, values in cfg.items():
        spec = _REGISTRY.get(name)
        if spec is None:
            raise ConfigError(f"--drafter-config: unknown drafter '{name}'; registered: {', '.join(_REGISTRY)}")
        if spec.settings is None:
            raise ConfigError(f"--drafter-config: drafter '{name}' has no settings")
        settings_from(name, spec.settings, values)
    cfg = {n: dict(sorted(v.items())) for n, v in sorted(cfg.items()) if v}
    return json.dumps(cfg, sort_keys=True) if cfg else None


def merge_drafter_config(config: str | None, extra: dict[str, dict]) -> str | None:
    """`config` with `extra` (name -> settings dict) laid over it, setting by setting, checked (parse_drafter_config)."""
    merged = drafter_settings(config)
    for name, values in extra.items():
        merged[name] = {**merged.get(name, {}), **values}
    return parse_drafter_config(merged)


def check_settings_used(config: str | dict | None, names: Iterable[str]) -> None:
    """ConfigError (one line) when `config` sets a drafter the run does not enable (`names`): its settings would
    be ignored without a word (--suffix-config with --drafters dspark,ngram)."""
    enabled = set(names)
    unused = [n for n in drafter_settings(config) if n not in enabled]
    if unused:
        raise ConfigError(f"--{unused[0]}-config / --{unused[0]}-*: settings for the {unused[0]} drafter, which this run "
                          f"does not enable (--drafters {','.join(n for n in _REGISTRY if n in enabled)}); add "
                          f"{unused[0]} to --drafters, or drop its settings")


def live_drafters(names: Iterable[str], config: str | dict | None = None) -> dict:
    """Fresh live drafters (name -> Drafter) for one run, for the live ones among `names`, each built from its
    settings in `config` (a run's drafter_config: canonical JSON, or name -> settings dict)."""
    values = drafter_settings(config)
    out = {}
    for n in names:
        spec = _REGISTRY[n]
        if spec.kind != "live":
            continue
        arg = settings_from(n, spec.settings, values.get(n, {})) if spec.settings is not None else None
        out[n] = spec.factory(arg)
    return out


def check_live_memory(names: Iterable[str], config: str | dict | None, contexts, outputs, batch: int) -> None:
    """Before a run: each live drafter among `names` that declares a memory check (DrafterSpec.memory) is given its
    settings from `config` and the run's requests (prompt + output and output lengths [tokens], `batch` at once):
    one ConfigError when it would not fit, before anything is built."""
    values = drafter_settings(config)
    for n in dict.fromkeys(names):
        spec = _REGISTRY[n]
        if spec.kind == "live" and spec.memory is not None:
            spec.memory(settings_from(n, spec.settings, values.get(n, {})), contexts, outputs, batch)


def _example(spec: DrafterSpec) -> str:
    """A --D-config value to show: '{"first_setting": ...}'."""
    return f"'{{\"{dataclasses.fields(spec.settings)[0].name}\": ...}}'"


def add_drafter_flags(group) -> None:
    """Each registered drafter's settings as flags in `group` (an argparse group): --D-config JSON (several at once)
    and --D-SETTING VALUE (one each; the declared type and help), default unset. collect_drafter_flags reads them."""
    for spec in _REGISTRY.values():
        if spec.settings is None:
            continue
        group.add_argument(f"--{spec.name}-config", dest=f"drafter_json__{spec.name}", default=None, metavar="JSON",
                           help=f"the {spec.name} drafter's settings as a JSON object, e.g. {_example(spec)} "
                                "(or one flag each, below)")
        for f in dataclasses.fields(spec.settings):
            typ = setting_types(spec.settings)[f.name]
            kw: dict = {"dest": f"drafter__{spec.name}__{f.name}", "default": None, "metavar": f.name.upper(),
                        "help": f"{spec.name} drafter: {f.metadata['help']} (default: {f.default})"}
            if typ is bool:
                kw["action"] = argparse.BooleanOptionalAction
                del kw["metavar"]
            else:
                kw["type"] = typ
            group.add_argument(setting_flag(spec.name, f.name), **kw)


def collect_drafter_flags(ns: argparse.Namespace, config: str | None) -> str | None:
    """`config` (a --drafter-config value) with the flags add_drafter_flags made laid over it: --D-config first,
    then each --D-SETTING; checked by each drafter's declaration, canonical (merge_drafter_config)."""
    extra: dict[str, dict] = {}
    for spec in _REGISTRY.values():
        if spec.settings is None:
            continue
        text = getattr(ns, f"drafter_json__{spec.name}", None)
        if text is not None:
            try:
                values = json.loads(text)
            except (ValueError, RecursionError):
                raise ConfigError(f"--{spec.name}-config: not a JSON object of settings: {text[:60]!r}") from None
            if not isinstance(values, dict):
                raise ConfigError(f"--{spec.name}-config: expected a JSON object such as {_example(spec)}, got "
                                  f"{text[:60]!r}")
            extra.setdefault(spec.name, {}).update(values)
        for f in dataclasses.fields(spec.settings):
            v = getattr(ns, f"drafter__{spec.name}__{f.name}", None)
            if v is not None:
                extra.setdefault(spec.name, {})[f.name] = v
    return merge_drafter_config(config, extra)


def _suffix(settings: SuffixConfig) -> Drafter:
    return LiveSuffixDrafter(settings, SuffixCalibrator.load())


def _neural_pass(num_reqs: int, cost_model, p: Pricing) -> float:
    """A neural drafter's pass: a block of p.block tokens for each of `num_reqs` requests [ms]."""
    return cost_model.draft_ms(num_reqs, p.block)


def _lookup(num_reqs: int, cost_model, p: Pricing) -> float:
    """A lookup over each request's context, as a GPU kernel or on the host (p.on_gpu) [ms]."""
    return cost_model.ngram_ms(num_reqs, on_gpu=p.on_gpu)


def table_prices(names, num_reqs: int, cost_model, pricing: Pricing) -> dict:
    """The prices of the table drafters among `names` for `num_reqs` requests, name -> ms (DrafterSpec.price)."""
    specs = [_REGISTRY[n] for n in names]
    return {s.name: s.price(num_reqs, cost_model, pricing) for s in specs if s.price is not None}


register_drafter(DrafterSpec("dspark", "table", 1, "the model drafter (DSpark block drafter profile or recorded "
                             "drafts; --drafter)", price=_neural_pass))
register_drafter(DrafterSpec("ngram", "table", 2, "the exact n-gram drafter over the request's context (vLLM's "
                             "prompt lookup; --ngram-k)", price=_lookup))
register_drafter(DrafterSpec("suffix", "live", 3, "the suffix-tree drafter over the request's context and the "
                             "outputs of finished requests (sim/core/drafters/suffix.py)", _suffix, SuffixConfig,
                             check_memory))


def parse_drafter_list(text: str) -> str:
    """A --drafters value, checked (parse_drafters) and written in registry order: 'dspark,ngram,suffix'."""
    return ",".join(parse_drafters(text))
