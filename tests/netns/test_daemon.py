"""MRC over the real dataplane on default.toml (root): one mrcd per host namespace, applications through
the client library, the perftest-style bench, failure ride-through, trimming under incast, Prometheus,
the control socket's access rule, XDP's QPN filter, clean shutdown.

Behaviour only (bytes intact, EV states, counters that moved, targets up); the speed figures come from
`mrcctl bench write` (docs/daemon.md). Everything made here (namespaces, programs, pins, daemons,
Prometheus) is removed at the end, also when a test fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="namespaces, eBPF programs, daemons"),
              pytest.mark.netns, pytest.mark.bpf]

try:
    import bcc  # noqa: F401
except ImportError:
    pytest.skip("BCC (python3-bpfcc) is not importable", allow_module_level=True)

from mrc.ctl import daemons  # noqa: E402
from mrc.ctl.bench import BenchConfig, WriteBench  # noqa: E402
from mrc.ctl.metrics import METRICS  # noqa: E402
from mrc.dataplane import bpf, netns  # noqa: E402
from mrc.dataplane import testbed as tbmod  # noqa: E402
from mrc.dataplane.client import MrcClient, socket_path  # noqa: E402
from mrc.dataplane.fabric import FabricDataplane  # noqa: E402
from mrc.dataplane.udp import mrc_socket  # noqa: E402
from mrc.errors import MrcError  # noqa: E402
from mrc.wire.icrc import IcrcContext  # noqa: E402
from mrc.wire.packet import WRITE_HDR_LEN, build_write  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _free_base(n: int) -> int:
    for _ in range(50):
        base = 20000 + secrets.randbelow(30000)
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


@pytest.fixture(scope="module")
def tb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """default.toml with the dataplane attached and one mrcd per host; private run dir and pin root."""
    yield from bring_up_testbed(tmp_path_factory)


def bring_up_testbed(tmp_path_factory: pytest.TempPathFactory, extra_env: dict[str, str] | None = None,
                         prefix: str = "t") -> Iterator[dict[str, Any]]:
    """`tb`'s body, for modules that need their own testbed: the mrcds inherit `extra_env` (as an operator's
    environment would reach them), removed again afterwards with everything else."""
    env = {"MRC_RUN_DIR": str(tmp_path_factory.mktemp("mrc-run")),
           "MRC_BPF_PIN_ROOT": f"/sys/fs/bpf/mrc-test-{secrets.token_hex(4)}", **(extra_env or {})}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    name = prefix + secrets.token_hex(4)
    base = _free_base(4)
    try:
        # the operator's way: build, attach the dataplane, start one mrcd per host and wait for them
        r = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", "testbed", "up",
                            str(DEPLOY / "topologies" / "default.toml"), "--name", name, "--with-daemons",
                            "--metrics-base", str(base)], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        doc = json.loads(r.stdout)
        assert sorted(doc["daemons"]) == ["h0", "h1", "h2", "h3"]
        for d in doc["daemons"].values():
            assert Path(d["socket"]).exists()
        yield {"name": name, "metrics_base": base, "daemons": doc["daemons"],
               "tb": tbmod.Testbed.load(name)}
        running = sorted(h for h, st in daemons.status(name).items() if st["running"])
        r = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", "testbed", "down", "--name", name],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        # the mrcds it stopped are named and counted (it said "0 processes stopped" after stopping them)
        rep = json.loads(r.stdout)["removed"][0]
        assert sorted(rep["mrcds_stopped"]) == running and rep["processes_killed"] >= len(running)
        assert not daemons.record_path(name).exists()
        assert not any(a.get("testbed") == name for rec in bpf.records() for a in rec.get("attachments", []))
        pins = Path(env["MRC_BPF_PIN_ROOT"])
        assert not pins.exists() or not any(pins.iterdir())
        for d in doc["daemons"].values():
            assert not Path(f"/proc/{d['pid']}").exists() or b"mrc.ctl.daemon" not in Path(
                f"/proc/{d['pid']}/cmdline").read_bytes()
    finally:
        with contextlib.suppress(Exception):
            daemons.stop(name)
        with contextlib.suppress(Exception):
            tbmod.teardown(name)
        bpf.close_all()
        bpf.detach_everything()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _client(tb: dict[str, Any], host: str) -> MrcClient:
    return MrcClient.for_host(tb["tb"].ns(host))


def test_write_bit_exact_over_every_plane(tb: dict[str, Any]) -> None:
    doc = WriteBench(BenchConfig(tb["name"], "h0", "h2", [32 << 20], iters=1, baseline="single-path")).run()
    assert doc["bit_exact"]
    row = doc["rows"][0]
    assert row["bytes"] == 32 << 20
    assert all(row["plane_gbps"][str(p)] > 0 for p in range(4)), row["plane_gbps"]
    assert doc["capacity_gbps"] == pytest.approx(0.4)
    assert 0 < doc["goodput_fraction"] <= 1.0
    base = doc["baseline"]
    assert base["kind"] == "single-path" and base["bit_exact"] and base["goodput_gbps"] > 0


def test_sweep_and_restricted_planes(tb: dict[str, Any]) -> None:
    cfg = BenchConfig(tb["name"], "h1", "h3", [4096, 64 << 10, 1 << 20], iters=3, planes=[1, 2])
    doc = WriteBench(cfg).run()
    assert doc["bit_exact"]
    assert [r["bytes"] for r in doc["rows"]] == [4096, 64 << 10, 1 << 20]
    assert doc["capacity_gbps"] == pytest.approx(0.2)
    for r in doc["rows"]:
        assert r["iters"] == 3 and r["bw_min_gbps"] <= r["bw_avg_gbps"] <= r["bw_peak_gbps"]
        assert r["plane_gbps"]["0"] == 0 and r["plane_gbps"]["3"] == 0


def test_link_failure_ride_through(tb: dict[str, Any]) -> None:
    """A leaf-spine link goes down mid-transfer and comes back: the transfer completes bit-exact, the EVs
    through it are retired by the engine, DENIED by mrcd (the peer's mrcd too), and restored."""
    cfg = BenchConfig(tb["name"], "h0", "h2", [96 << 20], fail_link=("p0l0", "p0s0", 0.5), heal_after=1.0)
    doc = WriteBench(cfg).run()
    assert doc["bit_exact"]
    f = doc["failure"]
    assert not f["completed_before_failure"]
    assert f["evs_through_link"] == 8 and f["evs_assumed_bad"] >= 1
    assert f["detect_ms"] is not None and f["detect_ms"] > 0
    assert f["deny_ms"] is not None and f["deny_ms"] >= f["detect_ms"]
    assert f["restore_ms"] is not None
    with _client(tb, "h2") as c:
        acts = c.call("actions", since_ns=0)["actions"]
    assert any(a["kind"] == "deny" and a["link"] == "p0l0-p0s0" and "h0" in a["detail"] for a in acts)
    assert any(a["kind"] == "restore" and a["link"] == "p0l0-p0s0" for a in acts)
    for h in ("h0", "h2"):
        with _client(tb, h) as c:
            assert c.call("ev_show")["denied_links"] == []
    assert tbmod.Testbed.load(tb["name"]).down_links() == frozenset()


def _long_turns(stats: dict[str, Any]) -> int:
    """Loop turns of a `stats` reply that took longer than 50 ms (the old blocking connect's timeout)."""
    hist = stats["loop"]["turn_hist"]
    return int(hist["le_100ms"] + hist["le_1000ms"] + hist["over"])


def test_a_stalled_peer_mrcd_does_not_hold_up_the_local_reaction(tb: dict[str, Any]) -> None:
    """h3's mrcd stopped (SIGSTOP) with its control socket's listen backlog full, so that a connect() to it
    would block: h0 localises a failed link under a WRITE to h2 and DENYs / REPLACEs it; its notes to h3
    wait without blocking and are dropped after their patience, the notes to h1 and h2 are delivered, and
    no turn of h0's loop took longer than 50 ms meanwhile (a blocking connect would have taken that)."""
    h3 = tb["daemons"]["h3"]
    fillers: list[socket.socket] = []
    with _client(tb, "h0") as c:
        before = c.call("stats")
    since = time.monotonic_ns()  # mrcds stamp actions with the same CLOCK_MONOTONIC
    os.kill(h3["pid"], signal.SIGSTOP)
    try:
        for _ in range(4096):  # fill h3's backlog until a connect would block
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            fillers.append(s)
            if s.connect_ex(h3["socket"]) != 0:
                break
        else:
            pytest.fail("h3's control socket never refused a connect: its backlog is not bounded")
        cfg = BenchConfig(tb["name"], "h0", "h2", [96 << 20], fail_link=("p0l0", "p0s0", 0.5), heal_after=1.0)
        doc = WriteBench(cfg).run()
        assert doc["bit_exact"]
        f = doc["failure"]
        assert f["deny_ms"] is not None and f["restore_ms"] is not None
        deadline = time.monotonic() + 10
        while True:  # the notes to h3 (down, then up) are dropped once their patience ran out
            with _client(tb, "h0") as c:
                after = c.call("stats")
                acts = c.call("actions", since_ns=since)["actions"]
            notes = {k: after["peer_notes"][k] - before["peer_notes"][k] for k in ("sent", "dropped")}
            done = notes["dropped"] >= 2 and notes["sent"] == 2 * notes["dropped"]
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # every note to h3 (at least the link's down and up) dropped, every one to h1 and h2 delivered
        assert notes["dropped"] >= 2 and notes["sent"] == 2 * notes["dropped"], notes
        # h0 alone cannot tell p0l0-p0s0 from p0l1-p0s0 (every path it lost crosses both): either
        kinds = {a["kind"] for a in acts if a["link"] in ("p0l0-p0s0", "p0l1-p0s0")}
        assert {"deny", "replace", "restore"} <= kinds, acts
        assert _long_turns(after) == _long_turns(before), (before["loop"], after["loop"])
        print("\nh0 loop turns during the stalled-peer run:", after["loop"])
    finally:
        for s in fillers:
            s.close()
        os.kill(h3["pid"], signal.SIGCONT)
    with _client(tb, "h3") as c:  # h3 serves again
        assert c.call("hello")["host"] == "h3"


def _sent_toward(fd: FabricDataplane, node: str, peer: str) -> int:
    """Bytes `node`'s switch port toward `peer` passed on (forwarded, marked or trimmed)."""
    for row in fd.stats(node)["ports"].get(node, {}).values():
        if row["peer"] == peer:
            return sum(int(row["actions"][a]["bytes"]) for a in ("forward", "ecn_mark", "trim"))
    raise AssertionError(f"no port of {node} toward {peer}")


def test_a_slowed_link_is_steered_around(tb: dict[str, Any]) -> None:
    """A leaf-spine link of plane 0 at a tenth of its rate, routing unchanged: the transfer completes
    bit-exact, the slowed link carries clearly less than its plane's healthy one (the slow path's EVs
    are penalised by the delay rule and the ECN of the switch port's virtual queue, which follows the
    link's new rate), and the transfer is not held to the slow path's pace. Before, the whole QP slowed
    to that pace on every plane alike (4 x 10 Mbit/s). Measured at the leaf's ports rather than as
    plane 0's share: plane 0's healthy spine can carry all of that plane's traffic, so the better the
    steering, the closer plane 0's share comes to the others' (0.67-0.86 of them with both cores busy)."""
    from mrc.ctl.cli import main

    assert main(["testbed", "link", "set", "p0l0", "p0s0", "--rate", "10mbit", "--name", tb["name"]]) == 0
    try:
        with FabricDataplane.open(tb["name"]) as fd:
            before = {s: _sent_toward(fd, "p0l0", s) for s in ("p0s0", "p0s1")}
            doc = WriteBench(BenchConfig(tb["name"], "h0", "h2", [32 << 20], iters=1)).run()
            sent = {s: _sent_toward(fd, "p0l0", s) - before[s] for s in ("p0s0", "p0s1")}
    finally:
        main(["testbed", "link", "set", "p0l0", "p0s0", "--rate", "100mbit", "--name", tb["name"]])
    assert doc["bit_exact"]
    assert sent["p0s0"] < 0.5 * sent["p0s1"], sent
    assert doc["goodput_gbps"] > 0.1, doc["rows"][0]["plane_gbps"]  # 4 x 10 Mbit/s would be 0.04


def test_incast_trims_and_nacks_without_timeouts(tb: dict[str, Any]) -> None:
    """Three senders to one host through switch ports configured to trim: every transfer is intact, the
    switches trimmed, the senders got TRIMMED NACKs and retransmitted on them, and no ACK timeout fired."""
    name = tb["name"]
    topo = tb["tb"].topo
    with FabricDataplane.open(name) as fd:
        for p in range(topo.planes):
            fd.set_port(topo.leaf_name(p, topo.host_leaf("h2")), "h2", ecn_k=8 << 10, trim_t=16 << 10,
                        buffer=256 << 10)
    size = 8 << 20
    tbf0 = _tbf_drops(name)
    dst = _client(tb, "h2")
    senders = []
    try:
        for i, h in enumerate(("h0", "h1", "h3")):
            c = _client(tb, h)
            smr = c.reg_mr(size)
            smr.buf[:] = bytes([i + 1]) * size
            dmr = dst.reg_mr(size)
            qs = c.create_qp("h2")
            qd = dst.create_qp(h)
            c.connect(qs, qd.qpn)
            dst.connect(qd, qs.qpn)
            dst.post_recv(qd, 1)
            senders.append((c, smr, qs, dmr, qd, i + 1))
        for c, smr, qs, dmr, _qd, _v in senders:
            c.post_send(qs, wr_id=1, mr=smr, offset=0, length=size, remote_addr=dmr.addr, rkey=dmr.rkey,
                        imm=1)
        stats = []
        for c, _smr, qs, dmr, qd, v in senders:
            dst.wait_wc(qd, 1, timeout=120)
            c.wait_wc(qs, 1, timeout=60)
            assert dmr.buf[:] == bytes([v]) * size
            stats.append(c.call("qp_stats", qpn=qs.qpn))
    finally:
        for c, *_ in senders:
            c.close()
        dst.close()
        with FabricDataplane.open(name) as fd:
            b = topo.link.buffer_bytes
            for p in range(topo.planes):
                fd.set_port(topo.leaf_name(p, topo.host_leaf("h2")), "h2", ecn_k=b // 4, trim_t=b // 2,
                            buffer=b)
    assert sum(s["nack_trim_rx"] for s in stats) > 0
    assert sum(s["retx_trim"] for s in stats) > 0
    assert sum(s["rto"] for s in stats) == 0 and sum(s["retx_timeout"] for s in stats) == 0
    # every loss was the switches' own (counted by reason): no TBF overflowed behind a virtual queue that
    # believed it had room (the TBF drains only when the busy host runs its softirq: testbed.tbf_limit)
    tbf1 = _tbf_drops(name)
    assert {k: tbf1[k] - tbf0.get(k, 0) for k in tbf1 if tbf1[k] != tbf0.get(k, 0)} == {}
    with FabricDataplane.open(name) as fd:
        h2 = fd.stats("h2")["hosts"]["h2"]
    assert sum(r["rx_trimmed"] for r in h2["planes"].values()) > 0


def _tbf_drops(name: str) -> dict[str, int]:
    """Packets each fabric port's TBF has dropped so far, by "node:ifname"."""
    out = {}
    for lk in tbmod.show(name)["links"]:
        for end, ifname, n in (("a", lk["a_ifname"], 0), ("b", lk["b_ifname"], 1)):
            out[f"{lk[end]}:{ifname}"] = lk["tbf_dropped"][n]
    return out


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _query(base: str, q: str) -> float:
    res = _get(f"{base}/api/v1/query?query={urllib.parse.quote(q)}")["data"]["result"]
    return float(res[0]["value"][1]) if res else 0.0


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian prometheus is not installed")
def test_prometheus_scrapes_every_mrcd(tb: dict[str, Any], tmp_path: Path) -> None:
    base = tb["metrics_base"]
    targets = [f"127.0.0.1:{base + i}" for i in range(4)]
    # the metrics the dashboard and alert rules use are all in each exporter's output
    for t in targets:
        with urllib.request.urlopen(f"http://{t}/metrics", timeout=5) as r:
            text = r.read().decode()
        for m in METRICS:
            assert f"# TYPE {m.removesuffix('_total')} " in text or f"# TYPE {m} " in text, (t, m)
        # the live exposition passes the ecosystem's own linter
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                              timeout=60)
        assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), (t, lint)
    cfg = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    cfg = cfg.replace("scrape_interval: 5s", "scrape_interval: 1s")
    default = '["127.0.0.1:9470", "127.0.0.1:9471", "127.0.0.1:9472", "127.0.0.1:9473"]'
    cfg = cfg.replace(default, json.dumps(targets))
    assert json.dumps(targets) in cfg
    (tmp_path / "prometheus.yml").write_text(cfg)
    shutil.copy(DEPLOY / "prometheus" / "mrc.rules.yml", tmp_path / "mrc.rules.yml")
    for args in (["check", "config", str(tmp_path / "prometheus.yml")], ["check", "rules",
                                                                          str(tmp_path / "mrc.rules.yml")]):
        r = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
    port = _free_base(1)
    prom = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prom.log").open("wb"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        up: list[str] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                act = _get(f"{url}/api/v1/targets")["data"]["activeTargets"]
                up = [t["labels"]["instance"] for t in act if t["health"] == "up"]
                if sorted(up) == sorted(targets):
                    break
            time.sleep(0.5)
        assert sorted(up) == sorted(targets), (tmp_path / "prom.log").read_text()[-2000:]
        q = 'sum by (plane) (mrc_plane_tx_bytes_total{host="h0"})'
        time.sleep(2)
        res = _get(f"{url}/api/v1/query?query={urllib.parse.quote(q)}")["data"]["result"]
        before = {r["metric"]["plane"]: float(r["value"][1]) for r in res}
        assert sorted(before) == ["0", "1", "2", "3"]
        doc = WriteBench(BenchConfig(tb["name"], "h0", "h2", [8 << 20])).run()
        assert doc["bit_exact"]
        deadline = time.monotonic() + 30
        after = before
        while time.monotonic() < deadline:
            res = _get(f"{url}/api/v1/query?query={urllib.parse.quote(q)}")["data"]["result"]
            after = {r["metric"]["plane"]: float(r["value"][1]) for r in res}
            if all(after[p] > before[p] for p in before):
                break
            time.sleep(0.5)
        assert all(after[p] > before[p] for p in before), (before, after)
        # h2 is scraped on its own schedule: wait for a scrape after the bench (not only h0's)
        rx = 0.0
        while time.monotonic() < deadline:
            rx = _query(url, 'sum(mrc_data_rx_bytes_total{host="h2"})')
            if rx >= 8 << 20:
                break
            time.sleep(0.5)
        assert rx >= 8 << 20, rx
    finally:
        prom.terminate()
        try:
            prom.wait(10)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait(5)


def _client_as_nobody(path: Path, timeout: float = 30.0) -> tuple[int, str]:
    """Open an MrcClient on `path` from a forked child running as uid/gid 65534 (nobody). A fork, not a
    new interpreter: the child already has mrc imported, so it needs no access to the venv or the checkout
    (which may sit in a directory other users cannot enter). Returns (the child's exit code, what it
    reported): 3 with the MrcError's text when refused, 0 when it got a connection."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                MrcClient(path, timeout=timeout).sk.close()
                msg, code = "connected", 0
            except MrcError as e:
                msg, code = str(e), 3
        except BaseException as e:  # report anything else to the parent
            msg = f"{type(e).__name__}: {e}"
        with contextlib.suppress(OSError):
            os.write(wfd, msg.encode())
        os._exit(code)
    os.close(wfd)
    chunks: list[bytes] = []
    eof = False
    try:
        deadline = time.monotonic() + timeout + 30
        while not eof and select.select([rfd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(rfd, 65536)
            chunks.append(chunk)
            eof = not chunk
    finally:
        os.close(rfd)
        if not eof:  # stuck (or the test is failing): do not leave the child behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace")


def test_control_socket_is_root_only(tb: dict[str, Any]) -> None:
    """Three layers refuse a non-root user: the private run directories, the socket's mode 0600, and
    mrcd's own check of the peer's credentials (SO_PEERCRED). Each is shown on its own by opening the
    ones before it for a moment."""
    path = socket_path(tb["tb"].ns("h1"))
    assert path.stat().st_mode & 0o777 == 0o600
    rc, out = _client_as_nobody(path)
    assert rc == 3, out
    assert "permission denied" in out and "root-only" in out
    top = os.environ["MRC_RUN_DIR"].rsplit("/", 2)[0]  # /tmp/pytest-of-root
    dirs = [p for p in [path.parent, *path.parent.parents] if str(p).startswith(top)]
    modes = {p: p.stat().st_mode & 0o777 for p in [*dirs, path]}
    try:
        for p in dirs:
            os.chmod(p, modes[p] | 0o011)
        rc_mode, out_mode = _client_as_nobody(path)  # the directories open: the socket's mode refuses
        os.chmod(path, 0o666)
        rc_cred, out_cred = _client_as_nobody(path)  # the file open too: mrcd refuses the peer
    finally:
        for p, m in modes.items():
            os.chmod(p, m)
    assert rc_mode == 3, out_mode
    assert out_mode == f"{path}: permission denied: the MRC control socket is root-only (uid 65534)"
    assert rc_cred == 3, out_cred
    assert out_cred == "permission denied: the MRC control socket is root-only (uid 65534)"


def test_unknown_qpn_dropped_at_xdp(tb: dict[str, Any]) -> None:
    topo = tb["tb"].topo
    src, dst = topo.mrc_address("h0"), topo.mrc_address("h2")
    payload = b"\xab" * 256
    buf = bytearray(WRITE_HDR_LEN + len(payload) + 4)
    build_write(buf, IcrcContext(src.packed, dst.packed), dqpn=0xABCDE, psn=0, ev_index=1, va=0x1000, rkey=7,
                payload=payload, msg_len=len(payload))
    # earlier tests' QPs, destroyed with packets still in flight toward them, may have reached h2's
    # engine (counted unknown_qpn, as they should): what matters is that these 5 do not
    with _client(tb, "h2") as c:
        engine_before = c.call("stats")["engine_drops"].get("unknown_qpn", 0)
    with FabricDataplane.open(tb["name"]) as fd:
        before = fd.ingress_drops("h2").get("foreign_qpn", 0)
        sk = mrc_socket(tb["tb"].ns("h0"), str(src), port=0)
        try:
            for _ in range(5):
                sk.sendto(buf, (str(dst), 4791))
        finally:
            sk.close()
        deadline = time.monotonic() + 5
        after = before
        while time.monotonic() < deadline and after < before + 5:
            time.sleep(0.05)
            after = fd.ingress_drops("h2").get("foreign_qpn", 0)
    assert after == before + 5
    with _client(tb, "h2") as c:  # never reached the engine
        assert c.call("stats")["engine_drops"].get("unknown_qpn", 0) == engine_before


def test_operator_commands_json(tb: dict[str, Any]) -> None:
    def mrcctl(*args: str) -> Any:
        r = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", *args, "--name", tb["name"]],
                           capture_output=True, text=True, timeout=120)
        doc = json.loads(r.stdout)
        return r.returncode, doc

    rc, doc = mrcctl("ev", "show", "--host", "h0", "--peer", "h3")
    assert rc == 0 and len(doc["hosts"]["h0"]["peers"]["h3"]) == 64
    rc, doc = mrcctl("ev", "deny", "--host", "h0", "--peer", "h3", "--plane", "2")
    assert rc == 0 and doc["denied"] == 16
    rc, doc = mrcctl("ev", "show", "--host", "h0", "--peer", "h3", "--state", "denied")
    assert {r["plane"] for r in doc["hosts"]["h0"]["peers"]["h3"]} == {2}
    rc, doc = mrcctl("ev", "restore", "--host", "h0", "--peer", "h3", "--plane", "2")
    assert rc == 0 and doc["restored"] == 16
    rc, doc = mrcctl("qp", "show")
    assert rc == 0 and isinstance(doc["qps"], list)
    rc, doc = mrcctl("port", "show", "--host", "h1")
    assert rc == 0 and [p["enabled"] for p in doc["ports"]] == [True] * 4
    rc, doc = mrcctl("port", "set", "h1", "p3l0", "--admin", "down")
    assert rc == 0 and doc["enabled"] is False
    rc, doc = mrcctl("port", "show", "--host", "h1")
    assert [p["enabled"] for p in doc["ports"]] == [True, True, True, False]
    rc, doc = mrcctl("port", "set", "h1", "p3l0", "--admin", "up")
    assert rc == 0 and doc["enabled"] is True
    # PORT as `port show` prints it (the plane), as well as the interface
    rc, doc = mrcctl("port", "set", "h1", "2", "--admin", "down")
    assert rc == 0 and doc["enabled"] is False and doc["ifname"] == "p2l0"
    rc, doc = mrcctl("port", "set", "h1", "2", "--admin", "up")
    assert rc == 0 and doc["enabled"] is True
    rc, doc = mrcctl("port", "set", "h1", "\u00b2", "--admin", "up")  # a digit to isdigit, not to int
    assert rc == 1 and "no plane port" in doc["error"]
    # a link written as bench's A:B is a usage error naming the value, before any mrcd is asked
    rc, doc = mrcctl("ev", "deny", "--host", "h0", "--peer", "h3", "--link", "p0l0:p0s0")
    assert rc == 2 and "p0l0:p0s0" in doc["error"]
    rc, doc = mrcctl("ev", "deny", "--host", "h0", "--peer", "h3", "--link", "p0l0-p9s9")
    assert rc == 1 and "no path to h3 crosses it" in doc["error"]
    # `testbed show` lists the mrcds: what an operator needs when an alert fires
    rc, doc = mrcctl("testbed", "show")
    assert rc == 0 and sorted(doc["daemons"]) == ["h0", "h1", "h2", "h3"]
    for h, d in doc["daemons"].items():
        assert d["running"] and d["pid"] == tb["daemons"][h]["pid"] and d["log"] == tb["daemons"][h]["log"]
    rc, doc = mrcctl("bench", "write", "--src", "h1", "--dst", "h0", "--size", "1M", "--iters", "2")
    assert rc == 0 and doc["bit_exact"] and {"config", "capacity_gbps", "goodput_gbps", "goodput_fraction",
                                             "rows"} <= set(doc)
    rc, doc = mrcctl("stats", "--host", "h0")
    assert rc == 0 and all(p["rx_packets"] > 0 for p in doc["hosts"]["h0"]["dataplane"]["planes"].values())
    rc, doc = mrcctl("ev", "deny", "--host", "h0", "--peer", "nope", "--plane", "1")
    assert rc != 0 and "nope" in doc["error"]


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie's files are closed, its exit handlers ran)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_removes_entries_and_socket(tb: dict[str, Any]) -> None:
    """Last: h3's mrcd, stopped by SIGTERM, removes its path-map entries and its socket."""
    name = tb["name"]
    pid = int(tb["daemons"]["h3"]["pid"])
    path = socket_path(tb["tb"].ns("h3"))
    with FabricDataplane.open(name) as fd:
        assert fd.lookup_path("h3", "h0", 63) is not None
        os.kill(pid, signal.SIGTERM)
        # until the process has ended (a zombie or gone): mrcd closes its control socket before it
        # removes its map entries, so the socket's absence alone raced the check under load
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.05)
        assert not _running(pid)
        assert not path.exists()
        assert fd.lookup_path("h3", "h0", 63) is None
        assert fd.lookup_path("h0", "h3", 63) is not None  # the others' are untouched
    with pytest.raises(MrcError, match="no mrcd is listening"):
        MrcClient(path)
    assert netns.exists(tb["tb"].ns("h3"))
    # its log says why it ended (the runbook reads it): a signal, not a crash
    assert "mrcd: h3: stopped on SIGTERM" in Path(tb["daemons"]["h3"]["log"]).read_text()


def test_sigkill_leaves_only_what_detach_removes(tb: dict[str, Any]) -> None:
    """h1's mrcd SIGKILLed: its map entries and a dead socket stay; clients are told nobody listens;
    the fixture's 'testbed down' (daemons stopped, programs detached, pins removed) is checked after."""
    pid = int(tb["daemons"]["h1"]["pid"])
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10

    while time.monotonic() < deadline and _running(pid):
        time.sleep(0.05)
    assert not _running(pid)
    path = socket_path(tb["tb"].ns("h1"))
    assert path.exists()
    with pytest.raises(MrcError, match=r"no mrcd is listening|no greeting|closed the connection"):
        MrcClient(path, timeout=5)
    with FabricDataplane.open(tb["name"]) as fd:
        assert fd.lookup_path("h1", "h0", 0) is not None


def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", *args], capture_output=True, text=True,
                       timeout=300)
    return r.returncode, json.loads(r.stdout)


def test_testbed_start_brings_back_the_stopped_and_the_killed(tb: dict[str, Any]) -> None:
    """After h3's SIGTERM and h1's SIGKILL above: `mrcctl stats` answers for h0 and h2, names h1 and h3
    unreachable and exits 1 (it used to leave h3 out and fail whole for h1's dead socket). The runbook's
    recovery, `mrcctl testbed start`, starts just those two (h0's and h2's mrcds keep running) with the
    testbed's metrics addresses (`testbed up --with-daemons` again refused: the testbed exists); then
    every host answers and a WRITE between the restarted two is bit-exact."""
    name, base = tb["name"], tb["metrics_base"]
    rc, doc = _cli("stats", "--name", name)
    assert rc == 1
    assert sorted(doc["hosts"]) == ["h0", "h2"] and sorted(doc["unreachable"]) == ["h1", "h3"]
    assert "no mrcd is listening" in doc["unreachable"]["h3"]
    rc, doc = _cli("testbed", "start", "--name", name)
    assert rc == 0, doc
    assert doc["started"] == ["h1", "h3"] and doc["running"] == ["h0", "h2"]
    assert doc["daemons"]["h1"]["metrics"] == f"127.0.0.1:{base + 1}"
    records = daemons.records(name)["daemons"]
    assert records["h0"]["pid"] == tb["daemons"]["h0"]["pid"]
    assert records["h1"]["pid"] != tb["daemons"]["h1"]["pid"]
    rc, doc = _cli("testbed", "start", "--name", name)
    assert rc == 0 and doc["started"] == []
    rc, doc = _cli("stats", "--name", name)
    assert rc == 0 and sorted(doc["hosts"]) == ["h0", "h1", "h2", "h3"] and "unreachable" not in doc
    w = WriteBench(BenchConfig(name, "h1", "h3", [1 << 20], iters=1)).run()
    assert w["bit_exact"]
