"""mrcd on "real machines" (root): network namespaces built by tests/netns/machines.sh with plain iproute2
commands (no mrc testbed, no topology builder; NIC-like ports eth1..eth4; for the Clos, kernel SRv6
switches mrc did not configure), each machine with its host configuration file and an mrcd started the
way systemd starts it: `mrcd --config FILE` inside the machine, readiness by sd_notify (READY=1 on a
NOTIFY_SOCKET this test listens on), SIGTERM to stop.

Checked: a WRITE back to back over all four planes, bit-exact, and the operator commands against the
local mrcd; SIGTERM leaves nothing of mrcd in the machine; a WRITE over the Clos across leaves, bit-exact,
with a leaf-spine link down (DENY and REPLACE at the source, the transfer completes) and back (restored);
an mrcd restarted under a running bench (the bench fails with a clear error, the new mrcd serves, no
attachment doubled) and after SIGKILL (the new one removes what the dead one left); torchrun, 2 machines x
2 ranks, on the `mrc` backend: collectives bit-identical to gloo, DDP's loss within 5% of gloo's per step.
Every process started here is ended by PID on every exit path; machines.sh removes the namespaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.root(reason="namespaces, eBPF programs, daemons"),
              pytest.mark.netns, pytest.mark.bpf]

try:
    import bcc  # noqa: F401
except ImportError:
    pytest.skip("BCC (python3-bpfcc) is not importable", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machines import Machine, Machines, machines, skip_reason  # noqa: E402

from mrc.dataplane.client import MrcClient  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
READY_S = 180.0


@pytest.fixture(autouse=True)
def _needs_machines() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """mrcd's records for this test only (what a machine's /run/mrc holds)."""
    d = tmp_path / "run"
    monkeypatch.setenv("MRC_RUN_DIR", str(d))
    return d


class Mrcd:
    """One machine's mrcd, started as systemd would: `mrcd --config`, sd_notify readiness, SIGTERM."""

    def __init__(self, m: Machine, log: Path) -> None:
        self.m = m
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        notify = self.log.with_suffix(".notify")
        with contextlib.suppress(FileNotFoundError):
            notify.unlink()
        sk = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sk.bind(str(notify))
        env = {**os.environ, "NOTIFY_SOCKET": str(notify)}
        with self.log.open("ab") as f:
            self.proc = subprocess.Popen(self.m.exec(str(ROOT / ".venv" / "bin" / "mrcd"), "--config",
                                                     str(self.m.config)),
                                         env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            sk.settimeout(1.0)
            deadline = time.monotonic() + READY_S
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"mrcd of {self.m.name} exited {self.proc.returncode}:\n"
                                         f"{self.log.read_text(errors='replace')[-3000:]}")
                with contextlib.suppress(TimeoutError):
                    msg = sk.recv(4096).decode()
                    if "READY=1" in msg.split("\n"):
                        return
            raise AssertionError(f"mrcd of {self.m.name} sent no READY=1 in {READY_S:g} s")
        finally:
            sk.close()
            with contextlib.suppress(FileNotFoundError):
                notify.unlink()

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        p = self.proc
        if p is None or p.poll() is not None:
            return None if p is None else p.returncode
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)  # `ip netns exec` execs mrcd: the group is mrcd's
        try:
            return p.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            return p.wait(10)


@contextlib.contextmanager
def mrcds(ms: Machines, letters: str, logs: Path) -> Iterator[dict[str, Mrcd]]:
    out = {x: Mrcd(ms[x], logs / f"mrcd-{x}.log") for x in letters}
    try:
        for d in out.values():
            d.start()
        yield out
    finally:
        for d in out.values():
            d.stop()


def _mrcctl(sock: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MRC_SOCKET": str(sock)}
    return subprocess.run([str(ROOT / ".venv" / "bin" / "mrcctl"), "-j", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


@contextlib.contextmanager
def bench_server(dst: Machine, path: Path) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "MRC_SOCKET": str(dst.socket)}
    p = subprocess.Popen([str(ROOT / ".venv" / "bin" / "mrcctl"), "bench", "serve", "--listen", str(path)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not path.exists() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.05)
        assert path.exists(), "bench serve did not listen"
        yield p
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _write(src: Machine, server: Path, size: str, iters: int = 1, flag: str = "--server") -> dict[str, Any]:
    r = _mrcctl(src.socket, "bench", "write", flag, str(server), "--size", size, "--iters", str(iters))
    assert r.returncode == 0, r.stdout + r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def _ip_json(m: Machine, *args: str) -> Any:
    out = subprocess.run(["ip", "-j", "-n", m.netns, *args], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out or "[]")


def _leftovers(m: Machine, run_dir: Path) -> list[str]:
    """What of an mrcd is still in machine `m`: mrc0, XDP programs on its ports, the MRC address, the
    rule, records."""
    left = []
    links = {lk["ifname"]: lk for lk in _ip_json(m, "link", "show")}
    if "mrc0" in links:
        left.append("mrc0")
    left += [f"xdp on {p}" for p in m.ports if "xdp" in links.get(p, {})]
    lo = _ip_json(m, "-6", "addr", "show", "dev", "lo")
    if any(a.get("local") == str(m.mrc_address) for x in lo for a in x.get("addr_info", [])):
        left.append("MRC address on lo")
    if any(r.get("table") == "4791" for r in _ip_json(m, "-6", "rule", "show")):
        left.append("rule to table 4791")
    for f in (run_dir / "dataplane").glob("*.json"):
        if f"host:{m.name}" in f.read_text():
            left.append(f"record {f.name}")
    if (run_dir / "host" / f"{m.name}.json").exists():
        left.append("host record")
    return left


def _actions(m: Machine, since_ns: int) -> list[dict[str, Any]]:
    with MrcClient(m.socket) as c:
        acts: list[dict[str, Any]] = c.call("actions", since_ns=since_ns)["actions"]
    return acts


def _force_generic_xdp(config: Path, ifname: str) -> None:
    """The file asks for generic XDP on one port (a driver without native XDP)."""
    text = config.read_text()
    line = f'interface = "{ifname}"'
    assert line in text
    config.write_text(text.replace(line, f'{line}\nxdp = "generic"', 1))


def test_back_to_back_write_operator_commands_and_a_clean_stop(tmp_path: Path, run_dir: Path) -> None:
    with machines("b2b") as ms:
        a, b = ms["A"], ms["B"]
        _force_generic_xdp(a.config, a.ports[2])
        with mrcds(ms, "AB", tmp_path) as d, bench_server(b, tmp_path / "bench.sock"):
            # a client asking for more than the server's bound gets an error, and the server goes on
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sk:
                sk.settimeout(30)
                sk.connect(str(tmp_path / "bench.sock"))
                sk.sendall(b'{"op": "setup", "peer": "ma", "size": 1099511627776}\n')
                assert b"out of range" in sk.recv(4096)
            doc = _write(a, tmp_path / "bench.sock", "64M", iters=2, flag="--dst")  # = --server here
            assert doc["bit_exact"] and doc["src"] == a.name and doc["dst"] == b.name
            row = doc["rows"][0]
            total = sum(row["plane_gbps"].values())
            assert len(row["plane_gbps"]) == 4
            # sprayed over all 4; plane 2's port runs XDP in generic mode, the slowest path, which delay
            # steering gives less (15-17 % of the bytes at 8 KiB payloads)
            assert all(v > 0.10 * total for v in row["plane_gbps"].values()), row
            for cmd in (["stats"], ["qp"], ["ev", "show"], ["port", "show"], ["prog"]):
                r = _mrcctl(a.socket, *cmd)
                assert r.returncode == 0, (cmd, r.stdout + r.stderr)
            st = json.loads(_mrcctl(a.socket, "stats").stdout)["hosts"][a.name]
            assert sum(p["tx_packets"] for p in st["dataplane"]["planes"].values()) > 16_000
            ports = json.loads(_mrcctl(a.socket, "port", "show").stdout)
            assert [p["ifname"] for p in ports["ports"] if p["host"] == a.name] == list(a.ports)
            log = (tmp_path / "mrcd-A.log").read_text()
            modes = ["generic" if i == 2 else "native" for i in range(4)]
            for p, m in zip(a.ports, modes, strict=True):
                assert f"host_ingress on {p} (XDP {m})" in log, log
            progs = json.loads(_mrcctl(a.socket, "prog").stdout)["programs"]
            shown = {x["ifname"]: x["xdp_mode"] for p in progs for x in p["attachments"]
                     if x["node"] == a.name and x["hook"] == "xdp"}
            assert shown == dict(zip(a.ports, modes, strict=True)), shown
            xdp = {lk["ifname"]: lk.get("xdp", {}).get("mode") for lk in _ip_json(a, "link", "show")
                   if lk["ifname"] in a.ports}
            assert xdp[a.ports[2]] == 2 and xdp[a.ports[0]] == 1, xdp  # the kernel's: 2 generic, 1 native
            assert "mrc0" in _leftovers(a, run_dir)
            assert d["A"].stop() == 0 and d["B"].stop() == 0
        for m in (a, b):
            assert _leftovers(m, run_dir) == [], m.name
            # the port addresses were the machine's own (machines.sh): mrcd leaves them
            have = {x["local"] for i in _ip_json(m, "-6", "addr", "show", "dev", m.ports[0])
                    for x in i.get("addr_info", [])}
            assert str(m.addresses[0].ip) in have


def test_a_next_hop_that_answers_late_gets_its_evs_then(tmp_path: Path, run_dir: Path) -> None:
    """mA starts while mB's plane-0 port is down (its machine still booting): mrcd starts anyway, says
    which next hop does not answer, and writes that plane's paths once it does."""
    with machines("b2b") as ms:
        a, b = ms["A"], ms["B"]
        subprocess.run(["ip", "-n", b.netns, "link", "set", b.ports[0], "down"], check=True)
        mrcd_a, mrcd_b = Mrcd(a, tmp_path / "mrcd-A.log"), Mrcd(b, tmp_path / "mrcd-B.log")
        try:
            mrcd_a.start()
            log = tmp_path / "mrcd-A.log"
            assert f"plane 0: next hop {b.addresses[0].ip} on {a.ports[0]} does not answer" in log.read_text()
            subprocess.run(["ip", "-n", b.netns, "link", "set", b.ports[0], "up"], check=True)
            mrcd_b.start()
            deadline = time.monotonic() + 30
            while "answered: its EVs get their paths" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "answered: its EVs get their paths" in log.read_text(), log.read_text()
            with bench_server(b, tmp_path / "bench.sock"):
                doc = _write(a, tmp_path / "bench.sock", "32M")
            assert doc["bit_exact"] and doc["rows"][0]["plane_gbps"]["0"] > 0, doc
        finally:
            mrcd_a.stop()
            mrcd_b.stop()


def test_sigterm_while_mrcd_sets_up_leaves_nothing(tmp_path: Path, run_dir: Path) -> None:
    """SIGTERM while mrcd is still installing (here: waiting for a next hop that does not answer) undoes
    what it made so far."""
    with machines("b2b") as ms:
        a, b = ms["A"], ms["B"]
        subprocess.run(["ip", "-n", b.netns, "link", "set", b.ports[0], "down"], check=True)
        log = tmp_path / "mrcd-A.log"
        with log.open("wb") as f:
            p = subprocess.Popen(a.exec(str(ROOT / ".venv" / "bin" / "mrcd"), "--config", str(a.config)),
                                 stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while "host_egress on mrc0" not in log.read_text() and time.monotonic() < deadline:
                assert p.poll() is None, log.read_text()
                time.sleep(0.05)
            assert "mrc0" in _leftovers(a, run_dir)  # under way: the neighbour wait comes after mrc0
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(60)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        assert p.returncode != 0 and _leftovers(a, run_dir) == [], (p.returncode, log.read_text())


def test_clos_write_rides_through_a_leaf_spine_failure(tmp_path: Path, run_dir: Path) -> None:
    with machines("clos") as ms:
        assert ms.check().ok  # the fabric itself, before any mrcd (its XDP takes check's packets)
        a, c = ms["A"], ms["C"]
        with mrcds(ms, "AC", tmp_path), bench_server(c, tmp_path / "bench.sock"):
            doc = _write(a, tmp_path / "bench.sock", "32M")
            assert doc["bit_exact"] and set(doc["rows"][0]["plane_gbps"]) == {"0", "1"}
            since = time.monotonic_ns()  # mrcd stamps actions with the same CLOCK_MONOTONIC
            ms.link("p0l0", "to-s0", "down")  # plane 0: A's leaf loses spine 0
            try:
                doc = _write(a, tmp_path / "bench.sock", "64M")
                assert doc["bit_exact"]
                acts = _actions(a, since)
                kinds = {x["kind"] for x in acts}
                assert {"deny", "replace"} <= kinds, acts
                # what it denied is on plane 0 through spine 0 (uSID 0x0200), from A's own traffic
                assert any(x["kind"] == "deny" and "p0:0200" in x["link"] for x in acts), acts
            finally:
                ms.link("p0l0", "to-s0", "up")
            restored = False
            for _ in range(6):  # probes through the denied link answer again once it is back
                doc = _write(a, tmp_path / "bench.sock", "16M")
                assert doc["bit_exact"]
                if any(x["kind"] == "restore" for x in _actions(a, since)):
                    restored = True
                    break
            assert restored, _actions(a, since)


def test_restart_under_a_running_bench_and_after_sigkill(tmp_path: Path, run_dir: Path) -> None:
    with machines("b2b") as ms:
        a, b = ms["A"], ms["B"]
        with mrcds(ms, "AB", tmp_path) as d, bench_server(b, tmp_path / "bench.sock"):
            env = {**os.environ, "MRC_SOCKET": str(a.socket)}
            bench = subprocess.Popen([str(ROOT / ".venv" / "bin" / "mrcctl"), "bench", "write", "--server",
                                      str(tmp_path / "bench.sock"), "--size", "1G", "--iters", "4"],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
            try:
                with MrcClient(a.socket) as cl:  # wait until the WRITE is under way
                    deadline = time.monotonic() + 60
                    while not cl.call("qp_show") and time.monotonic() < deadline:
                        time.sleep(0.05)
                time.sleep(0.5)
                assert d["A"].stop() == 0  # `systemctl restart` is a stop and a start
                _out, err = bench.communicate(timeout=60)
            finally:
                if bench.poll() is None:
                    os.killpg(bench.pid, signal.SIGKILL)
                    bench.wait()
            assert bench.returncode != 0 and "mrcd closed the connection" in err, err
            d["A"].start()
            # a second mrcd for the same host is refused and takes nothing from the first
            second = subprocess.run(a.exec(str(ROOT / ".venv" / "bin" / "mrcd"), "--config", str(a.config)),
                                    capture_output=True, text=True, timeout=120)
            assert second.returncode != 0 and "another mrcd" in second.stderr, second.stderr
            assert (run_dir / "host" / f"{a.name}.json").exists()
            assert _write(a, tmp_path / "bench.sock", "16M")["bit_exact"]
            xdp = [lk["ifname"] for lk in _ip_json(a, "link", "show") if "xdp" in lk]
            assert sorted(xdp) == sorted(a.ports)  # one program per port, none doubled
            # a crash: the next mrcd removes what the dead one left and installs afresh
            d["A"].stop(signal.SIGKILL)
            assert "mrc0" in _leftovers(a, run_dir)
            d["A"].start()
            assert "removed what a previous mrcd left" in (tmp_path / "mrcd-A.log").read_text()
            assert _write(a, tmp_path / "bench.sock", "16M")["bit_exact"]
            assert len([lk for lk in _ip_json(a, "link", "show") if lk["ifname"] == "mrc0"]) == 1
        assert _leftovers(a, run_dir) == [] and _leftovers(b, run_dir) == []


@pytest.mark.timeout(1200)
def test_torchrun_two_machines_two_ranks_on_the_mrc_backend(tmp_path: Path, run_dir: Path) -> None:
    pytest.importorskip("torch", reason="torch is not importable (make setup installs it)")
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from _torchrun_jobs import Job

    steps = 8
    with machines("b2b") as ms, mrcds(ms, "AB", tmp_path):
        nodes = [{"MRC_SOCKET": str(ms["A"].socket)}, {"MRC_SOCKET": str(ms["B"].socket)}]
        env = {"MRC_TEST_SIZES": "1,1000,65537,1048579", "MRC_TEST_STEPS": str(steps),
               "MRC_TEST_TIMEOUT": "300"}
        with Job(tmp_path / "job", nodes, 2, env) as job:
            rcs = job.wait(900)
            res = job.results()
            tail = job.log_tail()
        assert not job.rank_pids() and not job.launcher_pids()
    assert rcs == [0, 0], tail
    assert sorted(res) == [0, 1, 2, 3], tail
    for r, doc in res.items():
        assert doc["ok"], (r, doc.get("error"), doc.get("traceback"))
        assert doc["backend"] == "mrc"
        assert all(doc["identical"].values()), {k: v for k, v in doc["identical"].items() if not v}
    hosts = res[0]["hosts"]
    assert sorted(hosts) == ["ma", "ma", "mb", "mb"]
    m, g = res[0]["ddp_mrc"]["losses"], res[0]["ddp_gloo"]["losses"]
    assert len(m) == len(g) == steps
    gaps = [abs(x - y) / y for x, y in zip(m, g, strict=True)]
    assert max(gaps) < 0.05, gaps
    mrc = {r: d["stats"]["mrc_bytes"] for r, d in res.items()}
    assert sum(mrc.values()) > 8 << 20, mrc  # the ring's hops between the machines went over MRC


def test_a_topology_file_config_on_a_fabric_mrc_built(tmp_path: Path, run_dir: Path) -> None:
    """The third form of [fabric]: `topology = FILE` (a fabric mrc's topology file describes; here the
    testbed builder made it, without its dataplane). mrcd takes paths, addresses and gateways from the
    topology and installs the rest itself."""
    import secrets

    from mrc import topology
    from mrc.dataplane import testbed as tbmod

    topo_file = ROOT / "deploy" / "topologies" / "default.toml"
    topo = topology.load(topo_file)
    name = "c" + secrets.token_hex(3)
    tbmod.up(topo, name=name, source=str(topo_file))
    try:
        tb = tbmod.Testbed.load(name)
        sites = {}
        for h in ("h0", "h2"):
            leaf = topo.host_leaf(h)
            ports = [topo.link_between(h, topo.leaf_name(p, leaf)).a_ifname for p in range(topo.planes)]
            planes = "".join(f'[[plane]]\ninterface = "{ifn}"\n' for ifn in ports)
            cfg = tmp_path / f"{h}.toml"
            cfg.write_text(f'[host]\nname = "{h}"\n{planes}[fabric]\ntopology = "{topo_file}"\n'
                           f'[control]\nsocket = "{tmp_path / (h + ".sock")}"\n')
            sites[h] = Machine(h.upper(), h, h, tb.ns(h), cfg, topo.mrc_address(h), "",
                               tmp_path / f"{h}.sock", tuple(ports), (), ())
        ms: Any = {"A": sites["h0"], "C": sites["h2"]}
        with mrcds(ms, "AC", tmp_path), bench_server(sites["h2"], tmp_path / "bench.sock"):
            doc = _write(sites["h0"], tmp_path / "bench.sock", "16M")
            assert doc["bit_exact"] and doc["dst"] == "h2"
            assert len(doc["rows"][0]["plane_gbps"]) == topo.planes
    finally:
        tbmod.teardown(name)
