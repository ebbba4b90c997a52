"""One registry idiom for every family of named things: policy families (sim/core/policies/registry.py), drafters
(sim/core/drafters/registry.py), cost-model kinds (sim/core/cost) and the simulator's fast policy forms
(sim/engine/forms.py).

    COST = Registry("cost model")

    @COST.register("roofline")          # a decorator ...
    def _roofline(llm, gpu, **kw): ...

    COST.add("flat", build_flat)        # ... or a call
    COST.lookup("rooflin")              # ConfigError: unknown cost model 'rooflin' (did you mean ...); choose one of: ...

A Registry is a dict, name -> entry in registration order, so readers iterate, index and test membership as on
any dict; `add` refuses a name registered twice (a RuntimeError: a programming error, found at import), and
`lookup` turns an unknown name into one ConfigError line naming the valid choices.
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

from sim.infra.errors import ConfigError, did_you_mean

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """name -> entry of one kind of thing (`kind`, as errors name it), in registration order."""

    def __init__(self, kind: str, *, unique: Callable[[T], object] | None = None):
        super().__init__()
        self.kind = kind
        self._unique = unique  # a second key that must also differ between entries (a drafter's chain id)

    def add(self, name: str, entry: T) -> T:
        """Register `entry` under `name`; RuntimeError when the name (or the entry's unique key) is taken."""
        if name in self or (self._unique is not None
                            and any(self._unique(e) == self._unique(entry) for e in self.values())):
            raise RuntimeError(f"{self.kind} '{name}' registered twice")
        self[name] = entry
        return entry

    def register(self, name: str, wrap: Callable[[Callable], T] | None = None):
        """Decorator: register the decorated function (or `wrap(function)`, the entry made from it) under `name`;
        returns the function unchanged."""

        def deco(fn: Callable) -> Callable:
            self.add(name, fn if wrap is None else wrap(fn))
            return fn

        return deco

    def replace(self, name: str, entry: T) -> None:
        """Put a new entry in place of the registered `name` (a family given its form over any drafters)."""
        if name not in self:
            raise RuntimeError(f"{self.kind} '{name}' is not registered")
        self[name] = entry

    def lookup(self, name: str, where: str = "") -> T:
        """The entry of `name`; ConfigError (one line: `where`, the name, a near miss, the choices) otherwise."""
        if name in self:
            return self[name]
        head = f"{where}: " if where else ""
        raise ConfigError(f"{head}unknown {self.kind} '{name}'{did_you_mean(str(name), self)}; choose one of: "
                          f"{', '.join(self)}")
