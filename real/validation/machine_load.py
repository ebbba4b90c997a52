"""How loaded the machine was while a real engine was timed: samples before and after a measurement.

The load average alone cannot say whether a measurement was disturbed: it is a one-minute decaying mean that
counts the engine itself. So a probe reads, before and after the measurement, the machine's CPU counters
(/proc/stat: busy and steal time of all cores) and this process's own CPU time (getrusage, every thread and
waited-for children), and takes the difference:

    wall        seconds between the two samples
    own_cores   (own CPU seconds) / wall                         cores the engine used on average
    others      (machine busy seconds - own CPU seconds) / wall  cores every other process used on average
    steal       (steal seconds) / wall                           cores the hypervisor gave to other guests
    free        cores - engine_threads                           cores the engine does not need
    loaded      others + steal > free + guard                    (guard: --load-guard, default 0.25 cores)

A loaded measurement is kept and marked; real/validation/fidelity_stats.py never lets it disagree. The load averages,
CPU model, mean clock frequency and thread count are recorded beside it. Where /proc is missing (not Linux)
the counters are unknown and nothing is marked loaded, which the record says.
"""
from __future__ import annotations

import os
import resource
import time
from dataclasses import asdict, dataclass

DEFAULT_LOAD_GUARD = 0.25  # cores of others' work beyond the free ones that mark a measurement loaded


def _clk_tck() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def _proc_stat() -> tuple[float, float] | None:
    """(busy seconds, steal seconds) of all cores since boot, or None where /proc/stat is unreadable."""
    try:
        with open("/proc/stat") as fh:
            f = fh.readline().split()
    except OSError:
        return None
    if not f or f[0] != "cpu" or len(f) < 9:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (float(x) for x in f[1:9])
    hz = _clk_tck()
    return (user + nice + system + irq + softirq) / hz, steal / hz  # guest time is inside user already


def _own_cpu_s() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _freq_mhz() -> float | None:
    try:
        with open("/proc/cpuinfo") as fh:
            mhz = [float(line.split(":", 1)[1]) for line in fh if line.startswith("cpu MHz")]
    except (OSError, ValueError):
        return None
    return sum(mhz) / len(mhz) if mhz else None


@dataclass(frozen=True)
class LoadSample:
    """One reading of the machine's counters (module docstring)."""
    wall: float                     # time.monotonic(), s
    stat: tuple[float, float] | None  # (busy, steal) seconds since boot
    own_cpu_s: float
    loadavg: tuple[float, float, float] | None
    freq_mhz: float | None


def sample() -> LoadSample:
    try:
        la = tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        la = None
    return LoadSample(time.monotonic(), _proc_stat(), _own_cpu_s(), la, _freq_mhz())  # type: ignore[arg-type]


@dataclass(frozen=True)
class LoadRecord:
    """What the machine did between two samples, and whether that marks the measurement as loaded."""
    wall_s: float
    own_cpu_s: float
    own_cores: float
    others_cores: float | None      # None: counters unknown on this platform
    steal_cores: float | None
    cores: int
    engine_threads: int
    guard: float
    loaded: bool
    loadavg_before: tuple[float, float, float] | None
    loadavg_after: tuple[float, float, float] | None
    freq_mhz_before: float | None
    freq_mhz_after: float | None

    def to_json(self) -> dict:
        return asdict(self)

    def note(self) -> str:
        if self.others_cores is None:
            return "load unknown (no /proc/stat)"
        return (f"others used {self.others_cores:.2f} cores, steal {self.steal_cores:.2f}, engine {self.own_cores:.2f} "
                f"of {self.cores} (load average {self.loadavg_after[0] if self.loadavg_after else '?'})")


def between(before: LoadSample, after: LoadSample, engine_threads: int, cores: int | None = None,
            guard: float = DEFAULT_LOAD_GUARD) -> LoadRecord:
    """The load record of the interval between two samples (module docstring for the rule)."""
    cores = cores or os.cpu_count() or 1
    wall = max(after.wall - before.wall, 1e-9)
    own = max(after.own_cpu_s - before.own_cpu_s, 0.0)
    if before.stat is not None and after.stat is not None:
        busy = after.stat[0] - before.stat[0]
        others = max(busy - own, 0.0) / wall
        steal = max(after.stat[1] - before.stat[1], 0.0) / wall
        loaded = others + steal > max(cores - engine_threads, 0) + guard
    else:
        others = steal = None
        loaded = False
    return LoadRecord(wall, own, own / wall, others, steal, cores, engine_threads, guard, loaded,
                      before.loadavg, after.loadavg, before.freq_mhz, after.freq_mhz)


class LoadProbe:
    """`with LoadProbe(threads) as p: ...` then `p.record`: the load record of the block's interval."""

    def __init__(self, engine_threads: int, guard: float = DEFAULT_LOAD_GUARD) -> None:
        self.engine_threads, self.guard = engine_threads, guard
        self.record: LoadRecord | None = None

    def __enter__(self) -> "LoadProbe":
        self._before = sample()
        return self

    def __exit__(self, *exc) -> None:
        self.record = between(self._before, sample(), self.engine_threads, guard=self.guard)
