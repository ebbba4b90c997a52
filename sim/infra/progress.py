"""Progress on long work: a tqdm bar on a terminal, plain lines at a steady pace on a log or a pipe (progress_bar), and
a heartbeat line every few seconds for work that has no natural unit to count (Heartbeat)."""
from __future__ import annotations

import sys
import threading
import time


class Heartbeat:
    """Progress lines on stderr for logs and pipes (where a progress bar would print nothing readable): one at
    each `every` seconds, saying how many of `total` units are done and the time elapsed since `since` (a
    time.perf_counter() reading: a command's start, so that its successive heartbeats count on from one clock;
    default: this one's start), and a last one when the work ends, not when it fails (its error is the last
    line). A no-op when `every` is None or <= 0. Use as a context manager; call done(n) as units finish."""

    def __init__(self, what: str, total: int | None, every: float | None, stream=None, since: float | None = None):
        self.what, self.total, self.every = what, total, every
        self.stream = stream or sys.stderr
        self.n = 0
        self.t0 = time.perf_counter() if since is None else since
        self._stop = threading.Event()
        self._thread = None

    def line(self) -> str:
        el = time.perf_counter() - self.t0
        done = f"{self.n}/{self.total} {self.what} done" if self.total is not None else self.what
        return f"progress: {done}, {int(el // 60)}m{el % 60:04.1f}s elapsed"

    def _loop(self):
        while not self._stop.wait(self.every):
            print(self.line(), file=self.stream, flush=True)

    def done(self, n: int = 1) -> None:
        self.n += n

    def __enter__(self):
        if self.every and self.every > 0:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if exc_type is None:
                print(self.line(), file=self.stream, flush=True)
        return False


class _Lines:
    """A stream for tqdm that turns its carriage-return redraws into whole lines (a log shows one line per
    refresh instead of one long line of overwritten bars); the blank redraw of a closing bar prints nothing."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, s: str) -> None:
        s = s.replace("\r", "").rstrip()
        if s:
            self.stream.write(s + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(iterable=None, *, total: int | None = None, desc: str = "", unit: str = "it", disable: bool = False,
                 every_s: float = 30.0, stream=None, leave: bool = False, **kw):
    """tqdm on a terminal; on a log or a pipe, the same progress as plain lines at most every `every_s` seconds. The
    one place the project makes a progress bar (other keywords, initial= or smoothing=, go to tqdm)."""
    from tqdm import tqdm

    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=disable, leave=leave,
                file=stream if tty else _Lines(stream), mininterval=0.1 if tty else every_s,
                dynamic_ncols=tty, ascii=not tty, **kw)
