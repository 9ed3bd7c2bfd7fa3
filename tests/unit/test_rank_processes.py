"""The launcher's rank processes (ctl/allreduce_mrc.py `RankProcesses`, used by `mrcctl allreduce
--transport mrc` and `mrcctl ddp`), with stand-in ranks that speak its JSON-lines protocol: a rank that
fails ends the run at once, not after its peers' transport timeout."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mrc.ctl import allreduce_mrc
from mrc.errors import MrcError

#: a stand-in rank: answers "ready", then per command line either an answer, an error, or nothing
#: (blocked, as a rank waiting for a message from a peer that has failed); leaves at end of stdin
_RANK = r"""
import json, sys, time
mode = sys.argv[1]
print(json.dumps({"ready": mode}), flush=True)
for line in sys.stdin:
    if json.loads(line).get("op") == "quit":
        break
    if mode == "garbage":
        print("Traceback (most recent call last):", flush=True)
    elif mode == "fail":
        print(json.dumps({"error": "rank 1: input: 3000 elements where 2000 were expected"}), flush=True)
    elif mode == "ok":
        print(json.dumps({"ok": 7}), flush=True)
    else:
        time.sleep(3600)
"""


@pytest.fixture
def ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[allreduce_mrc.RankProcesses]:
    monkeypatch.setattr(allreduce_mrc, "prime_codec", lambda: None)  # no codec in these ranks
    rp = allreduce_mrc.RankProcesses(["h0", "h1", "h2"], tmp_path)
    yield rp
    rp.close(grace_s=0.0)


def _start(rp: allreduce_mrc.RankProcesses, tmp_path: Path, modes: list[str]) -> None:
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    for m in modes:
        rp.start([sys.executable, str(script), m], {"PATH": "/usr/bin:/bin"})
    assert rp.wait_ready(60) == modes


def test_a_failing_rank_ends_the_run_without_waiting_for_its_blocked_peers(
    ranks: allreduce_mrc.RankProcesses, tmp_path: Path
) -> None:
    """Rank 0 is blocked (as on a message its failed peer will never send) and comes first in rank
    order: waiting for the answers one by one raised rank 0's 'no answer within 600 s' only after the
    whole timeout. Now rank 1's own error is raised as it comes, and every rank is ended."""
    _start(ranks, tmp_path, ["block", "fail", "ok"])
    for r in range(3):
        ranks.send(r, {"op": "run"})
    with pytest.raises(MrcError, match="3000 elements where 2000 were expected"):
        ranks.answers(600)
    assert all(p.poll() is not None for p in ranks.procs)  # the blocked rank too
    with pytest.raises(MrcError, match="is gone"):
        ranks.send(0, {"op": "run"})


def test_answers_come_back_in_rank_order(ranks: allreduce_mrc.RankProcesses, tmp_path: Path) -> None:
    _start(ranks, tmp_path, ["ok", "ok", "ok"])
    for r in (2, 0, 1):
        ranks.send(r, {"op": "run"})
    assert ranks.answers(60) == [7, 7, 7]


def test_a_rank_that_exits_is_named_with_its_status(ranks: allreduce_mrc.RankProcesses,
                                                     tmp_path: Path) -> None:
    _start(ranks, tmp_path, ["ok", "ok", "ok"])
    ranks.send(1, {"op": "quit"})  # rank 1 leaves; the others get a command and answer
    ranks.send(0, {"op": "run"})
    ranks.send(2, {"op": "run"})
    with pytest.raises(MrcError, match=r"rank 1 \(h1\) exited \(status 0\)"):
        ranks.answers(60)


def test_a_rank_line_that_is_not_an_answer_is_named_not_a_traceback(
    ranks: allreduce_mrc.RankProcesses, tmp_path: Path
) -> None:
    _start(ranks, tmp_path, ["ok", "garbage", "ok"])
    for r in range(3):
        ranks.send(r, {"op": "run"})
    with pytest.raises(MrcError, match=r"rank 1 \(h1\): expected a 'ok' line, got 'Traceback"):
        ranks.answers(60)
