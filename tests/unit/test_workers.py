"""ctl.workers.fork_map: results in order from forked children, failures reported with the child's
traceback or exit status, and no child left behind."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from mrc.ctl.workers import ForkMap, WorkerError, default_jobs, fork_map


def _square_with_pid(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def test_results_in_order_each_job_in_its_own_child() -> None:
    out = fork_map(_square_with_pid, list(range(7)), 2)
    assert [v for v, _ in out] == [x * x for x in range(7)]
    pids = {p for _, p in out}
    assert os.getpid() not in pids and len(pids) == 7  # a fresh child per job
    assert multiprocessing.active_children() == []


def test_one_job_or_one_worker_runs_here() -> None:
    assert fork_map(_square_with_pid, [3], 4) == [(9, os.getpid())]
    assert fork_map(_square_with_pid, [1, 2], 1) == [(1, os.getpid()), (4, os.getpid())]
    assert ForkMap(1)(_square_with_pid, [2]) == [(4, os.getpid())]
    assert default_jobs() >= 1


def _fail_on_two(x: int) -> int:
    if x == 2:
        raise ValueError("no twos here")
    return x


def test_a_failing_job_raises_with_the_workers_traceback() -> None:
    with pytest.raises(WorkerError) as e:
        fork_map(_fail_on_two, [1, 2, 3], 2)
    assert "ValueError: no twos here" in str(e.value) and "job 2" in str(e.value)
    assert multiprocessing.active_children() == []


def _die(x: int) -> int:
    if x == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_a_killed_worker_is_reported_with_its_exit_status() -> None:
    with pytest.raises(WorkerError, match=r"ended without a result \(exit status -9\)"):
        fork_map(_die, [0, 1, 2, 3], 2)
    assert multiprocessing.active_children() == []
