"""The device check's registry of checks, the time cap of each and the run that keeps the whole within its budget.

A check is a function `fn(ctx) -> Outcome` registered with `@register(key, name, title, cap_s, quick_cap_s)`; the run
calls them in key order. Time (seconds, time.perf_counter):

    cap(check)  = min(its cap_s (quick_cap_s with --quick), budget_s - elapsed - RESERVE_S)
    a check starts only when cap(check) >= MIN_START_S; otherwise it is skipped (the budget is spent)
    ctx.left()  = seconds to the check's cap: a check with several parts stops starting new ones when it is low
                  (what it measured so far is kept; the outcome says what was left out)
    hard stop   at cap + GRACE_S a SIGALRM raises CheckTimeout (a BaseException, so library code that catches
                Exception cannot swallow it) in the main thread: the check is recorded as failed ("ran past its cap")

so the run ends by budget_s + GRACE_S - RESERVE_S < budget_s, plus the report's writing. A call that never gives
Python control back (a blocking CUDA call) is stopped by watchdog.py, a separate process, at budget_s + 30 s. An exception in a check is
that check's failure with a one-line reason (the traceback is kept in the JSON); the run goes on with the next one.
A failed or stopped check keeps the figures it put in `ctx.partial` as it went (and its `phase`, named in the line).
"""
from __future__ import annotations

import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import torch

if TYPE_CHECKING:
    from real.validation.device.options import DeviceCheckOptions

STATUSES = ("pass", "fail", "skip", "info")  # info: an informational check's failure (`register`), never the exit
RESERVE_S = 15.0  # kept back from every cap: the hard stop's grace and the report's writing
GRACE_S = 10.0    # between a check's cap (it stops starting parts) and the hard stop
MIN_START_S = 5.0  # a check is not started with less than this left


class CheckTimeout(BaseException):
    """A check ran past its cap plus the grace (raised by the SIGALRM handler)."""


@dataclass
class Outcome:
    """What a check found: status (pass / fail / skip), one line, and its figures (JSON values)."""

    status: str
    summary: str
    figures: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"a check's status must be one of {STATUSES}, got {self.status!r}")


@dataclass
class CheckResult:
    """One check's record in the report."""

    key: str
    name: str
    title: str
    status: str
    summary: str
    seconds: float
    cap_s: float
    figures: dict
    error: str | None = None  # the traceback of a check that raised

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    key: str
    name: str
    title: str
    cap_s: float
    quick_cap_s: float
    fn: Callable[["Context"], Outcome]
    informational: str | None = None  # why its failure does not fail the run (None: it does)


CHECKS: dict[str, Check] = {}


def register(key: str, name: str, title: str, cap_s: float, quick_cap_s: float, informational: str | None = None):
    """Register `fn(ctx) -> Outcome` as check `key` (its letter in the report). informational: why a failure of it
    is a finding, not a fault (it is then recorded as `info`, and the exit status ignores it)."""
    def deco(fn: Callable[["Context"], Outcome]) -> Callable[["Context"], Outcome]:
        if key in CHECKS:
            raise ValueError(f"device check {key!r} is registered twice")
        CHECKS[key] = Check(key, name, title, float(cap_s), float(quick_cap_s), fn, informational)
        return fn
    return deco


@dataclass
class Context:
    """What every check reads: the device, the run's settings (main.DeviceCheckOptions) and the current cap."""

    device: torch.device
    opts: "DeviceCheckOptions"
    deadline: float = float("inf")  # perf_counter time of the current check's cap
    partial: dict = field(default_factory=dict)  # figures so far: what a check that raises or times out leaves

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def quick(self) -> bool:
        return bool(self.opts.quick)

    def left(self) -> float:
        """Seconds to the current check's cap."""
        return self.deadline - time.perf_counter()

    def say(self, msg: str) -> None:
        say(msg)


_T0 = time.perf_counter()


def say(msg: str) -> None:
    """A progress line on stderr, with the seconds since the run started."""
    print(f"[device-check {time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message` (at most 300 characters)."""
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= 300 else line[:297] + "..."


@contextmanager
def hard_stop(seconds: float) -> Iterator[None]:
    """Raise CheckTimeout in the main thread after `seconds` (SIGALRM); nothing elsewhere (no signals there)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum, frame):  # noqa: ARG001 - signal handler signature
        raise CheckTimeout(f"ran past its cap ({seconds:.0f} s with the grace)")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _settle(ctx: Context) -> None:
    """After a check: drain the device so the next one starts clean (a failed check may have left work queued)."""
    if ctx.cuda:
        try:
            torch.cuda.synchronize(ctx.device)
            torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a broken context shows in the next check's own failure
            pass


def run_checks(ctx: Context, budget_s: float, t0: float, only: tuple[str, ...] = (),
               progress: Callable[[list[CheckResult], dict | None, list[dict]], None] | None = None
               ) -> list[CheckResult]:
    """Run every registered check (or those in `only`) in key order within `budget_s` seconds from t0; progress(done,
    running, pending) is told before each check and at the end (the watchdog's progress file)."""
    out = []
    keys = [k for k in sorted(CHECKS) if not only or k in only]

    def tell(current: dict | None, after: list[str]) -> None:
        if progress is not None:
            progress(out, current, [{"key": k, "name": CHECKS[k].name, "title": CHECKS[k].title} for k in after])

    for i, key in enumerate(keys):
        chk = CHECKS[key]
        cap = min(chk.quick_cap_s if ctx.quick else chk.cap_s, budget_s - (time.perf_counter() - t0) - RESERVE_S)
        if cap < MIN_START_S:
            say(f"{key} {chk.name}: SKIP (the time budget of {budget_s:.0f} s is spent)")
            out.append(CheckResult(key, chk.name, chk.title, "skip", f"not started: the time budget of {budget_s:.0f} s "
                                   "is spent (--budget-s)", 0.0, max(cap, 0.0), {}))
            continue
        say(f"{key} {chk.name}: {chk.title} (cap {cap:.0f} s)")
        tell({"key": key, "name": chk.name, "title": chk.title, "cap_s": round(cap, 1), "started": time.time()},
             keys[i + 1:])
        start = time.perf_counter()
        ctx.deadline, ctx.partial = start + cap, {}
        error = None
        try:
            with hard_stop(cap + GRACE_S):
                res = chk.fn(ctx)
        except CheckTimeout as exc:
            phase = f" while {ctx.partial['phase']}" if "phase" in ctx.partial else ""
            res = Outcome("fail", f"{exc}{phase}: stopped", dict(ctx.partial))
        except Exception as exc:  # noqa: BLE001 - one check's failure is its result; the run goes on
            res, error = Outcome("fail", one_line(exc), dict(ctx.partial)), traceback.format_exc()
        _settle(ctx)
        if res.status == "fail" and chk.informational:
            res = Outcome("info", f"{res.summary} (informational: {chk.informational})", res.figures)
        secs = time.perf_counter() - start
        say(f"{key} {chk.name}: {res.status.upper()} in {secs:.1f} s: {res.summary}")
        out.append(CheckResult(key, chk.name, chk.title, res.status, res.summary, round(secs, 3), round(cap, 1),
                               res.figures, error))
    tell(None, [])
    return out
