"""Run independent jobs in forked worker processes, one per CPU, results in order.

`mrcctl sim run` simulates each variant (ECMP, MRC, ...) of an experiment on its own fabric: the runs
share nothing, and each is one single-threaded event loop. `fork_map` gives every job its own process so
the variants of one experiment use every core the machine has; on this project's 2-core machines that
halves the wall time of the common two-variant runs. The results are the same as in one process (a
run is a pure function of its configuration and seed; tests/sim checks it).

Why fork and not a pool: the jobs are closures over the experiment's state (a fabric spec, message
sizes), which fork hands to the child as they are, with nothing pickled but the result. Each job gets a
fresh child, so nothing one run leaves in memory slows the next. A child that raises sends its
traceback back and the parent raises `WorkerError` with it; a child that dies without answering (killed,
out of memory) is reported with its exit status; on any error or Ctrl-C the parent ends the other
children it started (by their PIDs) and waits for them.
"""

from __future__ import annotations

import multiprocessing
import os
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from mrc.errors import MrcError

_T = TypeVar("_T")


class WorkerError(MrcError):
    """A job failed in its worker process (the message carries the worker's traceback)."""


def default_jobs() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _child(fn: Callable[[Any], Any], item: Any, conn: Connection) -> None:
    try:
        result = fn(item)
    except BaseException:
        conn.send((False, traceback.format_exc()))
    else:
        conn.send((True, result))
    finally:
        conn.close()


def fork_map(fn: Callable[[Any], _T], items: Sequence[Any], jobs: int) -> list[_T]:
    """[fn(x) for x in items], each call in a forked child, at most `jobs` at a time. With `jobs` <= 1
    or a single item everything runs in this process (no fork)."""
    if jobs <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    ctx = multiprocessing.get_context("fork")
    results: list[Any] = [None] * len(items)
    todo = list(range(len(items)))
    running: dict[Any, tuple[Any, int]] = {}  # receiving end -> (process, index)
    try:
        while todo or running:
            while todo and len(running) < jobs:
                i = todo.pop(0)
                recv_end, send_end = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(fn, items[i], send_end), daemon=True,
                                   name=f"mrc-worker-{i}")
                proc.start()
                send_end.close()  # the child holds the only writer: EOF when it dies
                running[recv_end] = (proc, i)
            for conn in wait(list(running)):
                assert isinstance(conn, Connection)
                proc, i = running.pop(conn)
                try:
                    ok, value = conn.recv()
                except EOFError:
                    proc.join()
                    raise WorkerError(f"job {items[i]!r}: worker {proc.pid} ended without a result "
                                      f"(exit status {proc.exitcode})") from None
                finally:
                    conn.close()
                proc.join()
                if not ok:
                    raise WorkerError(f"job {items[i]!r} failed in worker {proc.pid}:\n{value}")
                results[i] = value
    finally:
        for conn, (proc, _) in running.items():
            if proc.is_alive():
                proc.terminate()
            proc.join()
            conn.close()
    return results


class ForkMap:
    """`fork_map` with its worker count bound: the shape `mrc.sim.experiments.VariantMap` asks for."""

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def __call__(self, job: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        return fork_map(job, items, self.workers)


__all__ = ["ForkMap", "WorkerError", "default_jobs", "fork_map"]
