"""The device check's settings, one frozen dataclass validated once (main.parse_args builds it from the flags).

Sizes are the full run's on a GPU; --quick (the tests) shrinks every one of them (`shrunk`), and a CPU run leaves out
the timing sizes its memory cannot hold (timing.py). Units: tokens, requests, seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from real.vllm_plugin.config import MAX_SLOTS
from real.validation.vllm.config import VllmRunConfig
from sim.core.drafters.ngram import NgramConfig
from sim.infra.errors import ConfigError

# The whole run, before the report is written. By design within the 8 minutes a borrowed GPU session has: every check
# stops within min(its cap, what the budget leaves) plus the runner's grace (runner.py), and the watchdog process kills
# a run still going at budget + 30 s = 450 s (watchdog.py). The caps (s): a 60, b 45, c 30, d 120, e 60, f 120, g 45.
BUDGET_S = 420.0


@dataclass(frozen=True)
class DeviceCheckOptions:
    """Everything the checks read."""

    out: str
    force: bool = False
    device: str = "auto"  # auto: cuda when torch sees a GPU, else cpu
    quick: bool = False
    budget_s: float = BUDGET_S
    sizes: tuple[int, ...] = (1, 8, 32, 256)  # requests per step in (d)
    history: int = 40_960                     # tokens of every request's history in (d)
    slots: int = NgramConfig().k              # W: vLLM's draft slots per request (the n-gram chain's length)
    block: int = VllmRunConfig().num_speculative_tokens  # K_b: DSpark's trained block (the default checkpoint's)
    equal_reqs: int = 8     # requests per step in (b), (c), (e) and (f)
    equal_history: int = 4096  # their history
    steps: int = 12         # live steps per comparison or timing
    positions: int = 256    # context positions per history row compared in (a)
    seed: int = 0
    only: tuple[str, ...] = ()  # check keys to run (default: all)
    argv: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.device not in ("auto", "cuda", "cpu"):
            raise ConfigError(f"--device must be auto, cuda or cpu, got {self.device!r}")
        if not self.budget_s > 0:
            raise ConfigError(f"--budget-s must be > 0, got {self.budget_s}")
        if not self.sizes or min(self.sizes) < 1:
            raise ConfigError(f"--sizes must be request counts >= 1, got {','.join(map(str, self.sizes))}")
        if not 1 <= self.block <= self.slots <= MAX_SLOTS:
            raise ConfigError(f"--block {self.block} and --slots {self.slots}: need 1 <= block <= slots <= {MAX_SLOTS}")
        # a step appends up to W + 1 tokens per request; every history leaves room for the most steps a check runs
        # on one plan (2 x --steps in (e) and (f)) and the warm-ups
        room = (2 * self.steps + 8) * (self.slots + 1) + 64
        for name in ("history", "equal_history"):
            if getattr(self, name) < room:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)}: too short for {self.steps} steps "
                                  f"of up to {self.slots + 1} tokens; give at least {room}")
        for name in ("equal_reqs", "steps", "positions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")

    def shrunk(self) -> "DeviceCheckOptions":
        """--quick: every size small (what the default tests run on a CPU in seconds)."""
        return replace(self, sizes=tuple(sorted({min(s, 4) for s in self.sizes})), history=min(self.history, 768),
                       equal_reqs=min(self.equal_reqs, 3), equal_history=min(self.equal_history, 768),
                       steps=min(self.steps, 3), positions=min(self.positions, 16))
