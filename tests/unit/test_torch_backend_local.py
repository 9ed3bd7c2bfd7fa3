"""The `mrc` torch.distributed backend (mrc.dataplane.torch_backend) without a testbed: ranks on one host
talk over shared memory only (RankTransport's intra-host carrier), so the host's mrcd is only asked who it
is: a stand-in answers the greeting and `hello` on a Unix socket. The whole job goes through torchrun with
the package's `torch.backends` entry point and nothing imported from mrc in the rank script; every
collective is compared with gloo in the same job. Over MRC between two emulated machines:
tests/netns/test_torch_backend.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not importable (make setup installs torch==2.13.0)")

from _torchrun_jobs import ENTRY_POINT, Job, entry_point_dir  # noqa: E402

from mrc.dataplane.protocol import PROTOCOL_VERSION  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class FakeMrcd:
    """Answers mrcd's greeting and `hello` (host `host`) on `path`, one thread per connection."""

    def __init__(self, path: Path, host: str) -> None:
        self.path, self.host = path, host
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(str(path))
        self.srv.listen(16)
        self.srv.settimeout(0.2)
        self.stop = threading.Event()
        self.hellos = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.srv.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c: socket.socket) -> None:
        with contextlib.suppress(OSError, ValueError), c, c.makefile("rwb") as f:
            greeting = {"mrcd": "fake", "host": self.host, "protocol": PROTOCOL_VERSION}
            f.write(self._line({"id": 0, "ok": greeting}))
            f.flush()
            for line in f:
                req = json.loads(line)
                if req.get("op") == "hello":
                    self.hellos += 1
                    ok = {"host": self.host, "testbed": "", "gid": "::1", "planes": 1, "evs": 1,
                          "pid": os.getpid(), "version": "fake", "peers": [], "link_rate_bps": 0,
                          "protocol": PROTOCOL_VERSION}
                    f.write(self._line({"id": req["id"], "ok": ok}))
                else:
                    f.write(self._line({"id": req.get("id"), "error": f"fake mrcd: no {req.get('op')}"}))
                f.flush()

    @staticmethod
    def _line(doc: dict[str, Any]) -> bytes:
        return (json.dumps(doc) + "\n").encode()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.srv.close()


@pytest.fixture
def mrcd(tmp_path: Path) -> Iterator[FakeMrcd]:
    d = FakeMrcd(tmp_path / "hA.sock", "hA")
    try:
        yield d
    finally:
        d.close()


def test_the_control_socket_comes_from_the_environment(tmp_path: Path) -> None:
    from mrc.dataplane.torch_backend import MrcBackendError, control_socket

    assert control_socket({"MRC_SOCKET": "/x/y.sock", "MRC_HOST": "h0"}) == Path("/x/y.sock")
    assert control_socket({"MRC_HOST": "tb-h1", "MRC_RUN_DIR": str(tmp_path)}) == tmp_path / "tb-h1.sock"
    with pytest.raises(MrcBackendError, match=r"no mrcd control socket in .*start mrcd"):
        control_socket({"MRC_RUN_DIR": str(tmp_path)})
    (tmp_path / "a.sock").touch()
    assert control_socket({"MRC_RUN_DIR": str(tmp_path)}) == tmp_path / "a.sock"
    (tmp_path / "b.sock").touch()
    with pytest.raises(MrcBackendError, match=r"2 mrcd control sockets .*a.sock, b.sock.*MRC_SOCKET"):
        control_socket({"MRC_RUN_DIR": str(tmp_path)})


def test_the_package_declares_the_entry_point_torch_loads(tmp_path: Path) -> None:
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["torch.backends"]
    assert f"mrc = {eps['mrc']}" == ENTRY_POINT
    ep = entry_point_dir(tmp_path)
    code = "import torch.distributed as d; print('mrc' in d.Backend.backend_list, sorted(d.Backend._plugins))"
    for autoload, want in (("1", "True ['MRC']"), ("0", "False []")):
        env = {**os.environ, "PYTHONPATH": str(ep), "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload}
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == want, (autoload, r.stdout, r.stderr)


@pytest.mark.parametrize("code", [
    "import mrc.dataplane.torch_backend, torch.distributed as d",  # the module first: torch loads it inside
    "import torch, torch.distributed as d",
    "import mrc.collective.ddp, torch, torch.distributed as d",
])
def test_the_backend_registers_in_any_import_order(code: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(entry_point_dir(tmp_path))}
    r = subprocess.run([sys.executable, "-W", "error", "-c", f"{code}; print(d.Backend._plugins['MRC'])"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "_BackendPlugin" in r.stdout


@pytest.mark.slow
def test_three_ranks_on_one_host_match_gloo(mrcd: FakeMrcd, tmp_path: Path) -> None:
    t0 = time.monotonic()
    cfg = {"MRC_TEST_SIZES": "1,7,1000,65537,200003", "MRC_TEST_STEPS": "6", "MRC_TEST_TIMEOUT": "120"}
    with Job(tmp_path / "job", [{"MRC_SOCKET": str(mrcd.path)}], 3, cfg) as job:
        rcs = job.wait(400)
        res = job.results()
        tail = job.log_tail()
    assert not job.rank_pids() and not job.launcher_pids()
    assert rcs == [0], tail
    assert sorted(res) == [0, 1, 2], tail
    for r, d in res.items():
        assert d["ok"], (r, d.get("traceback"))
        assert d["backend"] == "mrc" and d["pg_type"] == "MrcProcessGroup" and d["hosts"] == ["hA"] * 3
        assert all(d["identical"].values()), {k: v for k, v in d["identical"].items() if not v}
        assert d["close"]["all_reduce_random"] < 1e-5
        assert "integer or bool tensors only" in d["errors"]["band_float"]
        assert "MAX of torch.complex64: complex numbers have no order" in d["errors"]["max_complex"]
        for op, said in (("send", "send"), ("recv", "recv"), ("isend", "send"), ("scatter", "scatter"),
                         ("gather", "gather"), ("all_to_all", "all_to_all"),
                         ("all_to_all_single", "all_to_all_single")):
            msg = d["errors"].get(f"refused_{op}", "")
            assert f"mrc backend: {said} is not supported" in msg, (op, msg)
        assert d["stats"]["mrc_bytes"] == 0 and d["stats"]["local_bytes"] > 0
        m, g = d["ddp_mrc"]["losses"], d["ddp_gloo"]["losses"]
        assert len(m) == len(g) == 6
        gap = max(abs(a - b) / b for a, b in zip(m, g, strict=True))
        assert gap < 0.05
        hooked = d["ddp_hook"]["losses"]  # mrc's 4-bit hook over the group's transport
        assert max(abs(a - b) / b for a, b in zip(hooked, g, strict=True)) < 0.05
        assert d["ddp_hook"]["hook_messages"] == 2 * (3 - 1) * (6 - 2)
    assert "sub_group_all_reduce" in res[1]["identical"]
    assert len({d["ddp_mrc"]["params_sha256"] for d in res.values()}) == 1
    assert mrcd.hellos >= 3
    print(f"\n3 ranks on one host: {sum(len(d['identical']) for d in res.values())} bit-identical checks, "
          f"max DDP loss gap {gap:.2e}; {time.monotonic() - t0:.1f} s")


@pytest.mark.slow
def test_an_unreachable_mrcd_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "mrcd.sock"
    t0 = time.monotonic()
    with Job(tmp_path / "job", [{"MRC_SOCKET": str(missing)}], 2, {"MRC_TEST_TIMEOUT": "600"}) as job:
        rcs = job.wait(300)
        res = job.results()
        tail = job.log_tail()
    took = time.monotonic() - t0
    assert not job.rank_pids() and not job.launcher_pids()
    assert rcs[0] not in (None, 0), tail
    assert took < 240, f"{took:.0f} s: the ranks waited instead of failing"
    # the first rank to fail is reported; torchrun then ends the other before it may have written
    assert res, tail
    for d in res.values():
        assert not d["ok"]
        assert str(missing) in d["error"] and "start mrcd" in d["error"], d["error"]
    first = next(iter(res.values()))["error"]
    print(f"\nunreachable mrcd: torchrun failed in {took:.1f} s: {first}")


def test_a_rank_that_cannot_start_fails_its_peers_at_once(mrcd: FakeMrcd, tmp_path: Path) -> None:
    """Rank 1's mrcd is not there: rank 0 (whose mrcd answers) does not wait out the 10-minute timeout."""
    from mrc.dataplane.torch_backend import MrcBackendError, MrcProcessGroup

    store = torch.distributed.HashStore()
    missing = tmp_path / "gone.sock"
    errors: dict[int, str] = {}

    def rank(r: int, sock: Path) -> None:
        try:
            MrcProcessGroup(store, r, 2, timedelta(seconds=600), env={"MRC_SOCKET": str(sock)})
        except MrcBackendError as e:
            errors[r] = str(e)

    t0 = time.monotonic()
    ts = [threading.Thread(target=rank, args=(r, s)) for r, s in ((0, mrcd.path), (1, missing))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts)
    assert time.monotonic() - t0 < 30
    assert str(missing) in errors[1] and "start mrcd" in errors[1]
    assert "a peer could not start (mrc backend, rank 1: cannot reach mrcd" in errors[0], errors[0]
    assert str(missing) in errors[0]


def test_a_group_made_again_on_the_same_store_does_not_read_the_first_ones_keys(
        mrcd: FakeMrcd, tmp_path: Path) -> None:
    """torch gives a group made again after destroy_process_group the same name, so the same store
    prefix, and torchrun's store outlives the group: the second incarnation read the first one's keys
    (a co-located rank's closed socket: a raw ConnectionRefusedError on one rank, the whole timeout on the
    other). Each incarnation has keys of its own; here rank 0 comes back a second later than rank 1."""
    from mrc.dataplane.torch_backend import MrcProcessGroup

    store = torch.distributed.HashStore()
    made: dict[tuple[int, int], Any] = {}

    def rank(r: int, round_: int) -> None:
        if round_ == 1 and r == 0:
            time.sleep(1.0)
        try:
            made[r, round_] = MrcProcessGroup(store, r, 2, timedelta(seconds=600),
                                              env={"MRC_SOCKET": str(mrcd.path)})
        except Exception as e:
            made[r, round_] = e

    t0 = time.monotonic()
    for round_ in (0, 1):
        ts = [threading.Thread(target=rank, args=(r, round_)) for r in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in ts)
        pgs = [made[r, round_] for r in (0, 1)]
        assert all(isinstance(pg, MrcProcessGroup) for pg in pgs), pgs
        for pg in pgs:
            pg.shutdown()
    assert time.monotonic() - t0 < 30


def test_a_peer_that_fails_during_the_co_located_set_up_ends_the_wait_at_once(
        mrcd: FakeMrcd, tmp_path: Path) -> None:
    """Rank 0 waits for its co-located rank 1 to connect; rank 1 (played by the test) has published its
    host, then fails and says so in the store. Rank 0 used to wait in accept() for the whole timeout
    (10 minutes here); it ends within a fraction of a second of the failure, with the peer's reason."""
    from mrc.dataplane.torch_backend import MrcBackendError, MrcProcessGroup

    store = torch.distributed.HashStore()
    store.set("mrc/1/host1", json.dumps({"host": "hA", "pid": 1}))
    errors: list[str] = []

    def rank0() -> None:
        try:
            MrcProcessGroup(store, 0, 2, timedelta(seconds=600), env={"MRC_SOCKET": str(mrcd.path)})
        except MrcBackendError as e:
            errors.append(str(e))

    t = threading.Thread(target=rank0)
    t.start()
    deadline = time.monotonic() + 30
    while not store.check(["mrc/1/local0"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # rank 0 is in its accept loop now
    t0 = time.monotonic()
    store.set("mrc/1/failed", "rank 1: its mrcd went away")
    t.join(timeout=60)
    assert not t.is_alive()
    assert time.monotonic() - t0 < 5
    assert errors and "a peer could not start (rank 1: its mrcd went away)" in errors[0], errors
