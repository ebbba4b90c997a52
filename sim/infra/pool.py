"""Local worker processes for a command's independent cells (a sweep's, the plugin menu's): run side by side, and all
stopped at once when the command is stopped (Ctrl-C, SIGTERM, SIGHUP: run_cli turns each into KeyboardInterrupt) or
a cell fails, instead of the executor's default of finishing every queued cell first.

    run_local(fn, items, workers, on_done)    # on_done(key, fn(item)) in completion order; items: (key, item) pairs

Each worker dies with the command (sim.infra.fsio.die_with_parent) and runs torch on one thread (`workers`
processes share the cores; torch's default of one thread per core in each would oversubscribe them).
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterable

from sim.infra.fsio import die_with_parent, forking_workers


def one_thread() -> None:
    """torch on one thread in this process (a worker's share of the cores)."""
    import torch

    torch.set_num_threads(1)


def worker_init() -> None:
    """A local worker process: dies with its command, then one torch thread."""
    die_with_parent()
    one_thread()


def run_local(fn: Callable[[Any], Any], items: Iterable[tuple[Any, Any]], workers: int,
              on_done: Callable[[Any, Any], None]) -> None:
    """fn(item) for each (key, item) in `workers` processes; on_done(key, result) in the command's process as each
    ends. A stop or a failing cell terminates the running workers and cancels the queued cells, then re-raises."""
    ex = ProcessPoolExecutor(max_workers=workers, initializer=worker_init)
    try:
        with forking_workers():  # workers fork on submit: a stop signal during their start-up is not lost
            pending = {ex.submit(fn, item): key for key, item in items}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                on_done(pending.pop(f), f.result())
    except BaseException:
        # the executor has no public way to end its workers; its process table is read, nothing else
        for p in list(getattr(ex, "_processes", {}).values()):
            p.terminate()
        ex.shutdown(wait=True, cancel_futures=True)
        raise
    ex.shutdown(wait=True, cancel_futures=True)
