"""The multi-plane SRv6 testbed on the real kernel (root): every micro-SID path answers, each switch shifts
the outer destination by exactly one micro-SID, a failed link takes down exactly the paths the model says,
TBF holds the configured rate, and nothing is left behind — also when a build or a test fails half-way.

small.toml (2 planes; 1 spine each)          default.toml (4 planes; 2 leaves + 2 spines each)

   plane p = 0, 1:                              plane p = 0..3:

          p<p>s0                                      p<p>s0        p<p>s1
          /    \\                                      |    \\      /    |
      p<p>l0   p<p>l1                                 |      \\  /      |
        |        |                                    |      /  \\      |
        h0       h1                                  p<p>l0        p<p>l1
                                                     /    \\        /    \\
                                                   h0      h1    h2      h3

A cross-leaf path carries one container [source leaf, spine, destination leaf, destination host port],
e.g. h0 -> h3 in plane 1 through spine 1: fcbb:bbbb:1100:1201:1101:1303:: (seg6 encap.red on h0, End
with NEXT-C-SID on p1l0, p1s1, p1l1, End.DT6 on h3). Each testbed here has a random name, so its
namespaces (<name>-<node>) never collide with an operator's testbed or a parallel run.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyroute2.netlink.exceptions import NetlinkError

from mrc import topology
from mrc.errors import MrcError

ROOT = Path(__file__).resolve().parents[2]
TOPOS = ROOT / "deploy" / "topologies"

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="builds network namespaces"), pytest.mark.netns]

from mrc.dataplane import netns, seg6  # noqa: E402
from mrc.dataplane import testbed as tb  # noqa: E402

# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module", autouse=True)
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """State files of this module's testbeds live in a private directory."""
    d = tmp_path_factory.mktemp("mrc-run")
    old = os.environ.get("MRC_RUN_DIR")
    os.environ["MRC_RUN_DIR"] = str(d)
    yield d
    if old is None:
        del os.environ["MRC_RUN_DIR"]
    else:
        os.environ["MRC_RUN_DIR"] = old


@pytest.fixture(scope="module", autouse=True)
def kernel_features(run_dir: Path) -> None:
    """Skip (with the reason) only if the kernel truly lacks veth, TBF or SRv6 NEXT-C-SID."""
    name = "k" + secrets.token_hex(4)
    topo = topology.Topology(planes=1, leaves=1, spines=0, hosts=(("a", 0), ("b", 0)))
    try:
        tb.up(topo, name=name)
    except NetlinkError as e:
        missing = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOENT, errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT)
        if e.code in missing:
            pytest.skip(f"kernel lacks a testbed feature (veth, tbf, seg6local End next-csid): {e}")
        raise
    finally:
        tb.teardown(name)


def _name() -> str:
    return "t" + secrets.token_hex(4)


Factory = Callable[..., tb.Testbed]


@pytest.fixture
def make_testbed() -> Iterator[Factory]:
    """Build testbeds; the finalizer removes every one of them, whether the test passed or failed."""
    made: list[str] = []

    def make(path: Path = TOPOS / "small.toml", **kw: object) -> tb.Testbed:
        name = _name()
        made.append(name)
        return tb.up(topology.load(path), name=name, source=str(path), **kw)  # type: ignore[arg-type]

    yield make
    for name in made:
        tb.teardown(name)


@pytest.fixture(scope="module")
def small(run_dir: Path) -> Iterator[tb.Testbed]:
    name = _name()
    try:
        yield tb.up(topology.load(TOPOS / "small.toml"), name=name, source="small.toml")
    finally:
        tb.teardown(name)


@pytest.fixture(scope="module")
def default(run_dir: Path) -> Iterator[tuple[tb.Testbed, float]]:
    name = _name()
    t0 = time.monotonic()
    try:
        built = tb.up(topology.load(TOPOS / "default.toml"), name=name, source="default.toml")
        yield built, time.monotonic() - t0
    finally:
        tb.teardown(name)


def mrcctl(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", *args], capture_output=True, text=True,
                          timeout=120, env=os.environ.copy())
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _ours(name: str) -> list[str]:
    return [n for n in netns.listing() if n.startswith(f"{name}-")]


# ------------------------------------------------------------------------------------------ reachability


def test_small_every_path_reachable(small: tb.Testbed) -> None:
    results = tb.probe(small.name)
    assert len(results) == len(small.topo.paths()) == 4
    assert all(r.reachable and r.rtt_ms is not None for r in results), [r.to_dict() for r in results]


def test_default_every_path_reachable_via_cli(default: tuple[tb.Testbed, float]) -> None:
    built, seconds = default
    assert seconds < 30, f"default testbed took {seconds:.1f} s to build"
    proc = mrcctl("-j", "testbed", "ping", "--name", built.name)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["reachable"] == len(built.topo.paths()) == 80 and doc["unreachable"] == 0
    p = next(x for x in doc["paths"] if (x["src"], x["dst"], x["plane"], x["spine"]) == ("h0", "h3", 1, 1))
    assert p["container"] == "fcbb:bbbb:1100:1201:1101:1303::"
    assert p["links"] == [["h0", "p1l0"], ["p1l0", "p1s1"], ["p1s1", "p1l1"], ["p1l1", "h3"]]
    assert p["reachable"] is True and p["rtt_ms"] > 0
    within = next(x for x in doc["paths"] if (x["src"], x["dst"], x["plane"]) == ("h0", "h1", 0))
    assert within["spine"] is None and within["links"] == [["h0", "p0l0"], ["p0l0", "h1"]]


# ------------------------------------------------------------------------------------------ captures


class Capture:
    """tcpdump on one interface inside one namespace, written to a pcap file.

    tcpdump's TPACKET ring copies each frame when the kernel taps it. A plain AF_PACKET recv() does not
    do for this test: its queued clone shares data with the skb that the next namespace's End rewrites
    in place, so it would show the destination already shifted."""

    def __init__(self, built: tb.Testbed, node: str, ifname: str, out: Path) -> None:
        assert shutil.which("tcpdump"), "tcpdump missing: make setup installs it"
        self.out = out
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mrc.ctl.cli", "testbed", "exec", "--name", built.name, node, "--",
             "tcpdump", "--immediate-mode", "-i", ifname, "-U", "-n", "-w", str(out), "ip6"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=os.environ.copy(),
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()  # "tcpdump: listening on IF, ..." once the ring is up
        assert "listening on" in line, line

    def stop(self) -> list[bytes]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=10)
        data = self.out.read_bytes()
        frames, off = [], 24  # pcap global header
        while off + 16 <= len(data):
            incl = struct.unpack_from("<I", data, off + 8)[0]
            frames.append(data[off + 16:off + 16 + incl])
            off += 16 + incl
        return frames

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _ipv6_in_ipv6(frame: bytes) -> tuple[ipaddress.IPv6Address, ipaddress.IPv6Address, ipaddress.IPv6Address,
                                         int] | None:
    """(outer dst, inner src, inner dst, outer next header) of an Ethernet/IPv6 frame."""
    if len(frame) < 14 + 40 or struct.unpack_from("!H", frame, 12)[0] != 0x86DD:
        return None
    nh = frame[14 + 6]
    outer_dst = ipaddress.IPv6Address(frame[14 + 24:14 + 40])
    if nh != 41 or len(frame) < 14 + 80:
        return (outer_dst, ipaddress.IPv6Address(0), ipaddress.IPv6Address(0), nh)
    inner = 14 + 40
    return (outer_dst, ipaddress.IPv6Address(frame[inner + 8:inner + 24]),
            ipaddress.IPv6Address(frame[inner + 24:inner + 40]), nh)


def test_outer_destination_shifts_one_usid_per_switch(
    default: tuple[tb.Testbed, float], tmp_path: Path,
) -> None:
    built, _ = default
    topo = built.topo
    path = topo.path("h0", "h3", 1, 1)
    # capture where each hop receives the request: leaf from the host, spine from the leaf, ...
    points = list(zip(path.hops[1:], path.hops[:-1], strict=True))  # (node, ifname facing the previous hop)
    caps: list[Capture] = []
    try:
        for i, (node, ifname) in enumerate(points):
            caps.append(Capture(built, node, ifname, tmp_path / f"{i}.pcap"))
        results = tb.probe(built.name, src="h0", dst="h3")
        assert all(r.reachable for r in results)
        time.sleep(0.2)
        seen = [c.stop() for c in caps]
    finally:
        for c in caps:
            c.kill()
    for k, ((node, ifname), frames) in enumerate(zip(points, seen, strict=True)):
        expected = topo.container(path.usids[k:])  # k switches have each consumed one micro-SID
        outer = {
            p[0] for p in map(_ipv6_in_ipv6, frames)
            if p is not None and p[1] == path.path_address and p[2] == topo.mrc_address("h3")
        }
        assert outer == {expected}, f"at {node}/{ifname}: saw {sorted(map(str, outer))}, expected {expected}"
    # encap.red with one container: IPv6 directly in IPv6, no SRH on the wire
    nhs = {p[3] for p in map(_ipv6_in_ipv6, seen[1]) if p is not None and p[1] == path.path_address}
    assert nhs == {41}


# ------------------------------------------------------------------------------------------ failures


@pytest.mark.parametrize("link", [("p2l1", "p2s0"), ("h1", "p3l0")])
def test_link_down_breaks_exactly_the_paths_through_it(default: tuple[tb.Testbed, float],
                                                       link: tuple[str, str]) -> None:
    built, _ = default
    topo = built.topo
    through = {p.key for p in topo.paths() if p.crosses(*link)}
    assert through and len(through) < len(topo.paths())
    proc = mrcctl("-j", "testbed", "link", "down", *link, "--name", built.name)
    try:
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["state"] == "down"
        results = tb.probe(built.name, timeout_s=0.5)
        dead = {(r.src, r.dst, r.plane, r.spine) for r in results if not r.reachable}
        assert dead == through
        assert all(r.expected == ((r.src, r.dst, r.plane, r.spine) not in through) for r in results)
        # ping judges against the model: the paths through a down link are expected to fail -> exit 0
        assert mrcctl("testbed", "ping", "--name", built.name, "--timeout", "0.5").returncode == 0
    finally:
        tb.set_link(built.name, *link, up=True)
    assert all(r.reachable for r in tb.probe(built.name))


def test_ping_fails_when_a_path_that_should_work_does_not(make_testbed: Factory) -> None:
    built = make_testbed()
    # break p0s0 behind the model's back: remove its End SID
    with contextlib.closing(netns.ipr(built.ns("p0s0"))) as ipr:
        ipr.route("del", family=socket.AF_INET6, dst=str(built.topo.usid_prefix("p0s0")), type="local")
    proc = mrcctl("-j", "testbed", "ping", "--name", built.name, "--timeout", "0.3")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["failed_expected"] == 2 and doc["unreachable"] == 2
    assert {(p["src"], p["plane"]) for p in doc["paths"] if not p["reachable"]} == {("h0", 0), ("h1", 0)}
    # `link up` re-applies the node's routes, which repairs it
    tb.set_link(built.name, "p0l0", "p0s0", up=True)
    assert all(r.reachable for r in tb.probe(built.name))


# ------------------------------------------------------------------------------------------ kernel state


def test_flavors_and_encaps_read_back_from_kernel(small: tb.Testbed) -> None:
    leaf = tb.routes(small.name, "p0l0")
    end = [r for r in leaf if r["dst"] == "fcbb:bbbb:100::/48"]
    assert end and end[0]["encap"] == {"type": "seg6local", "action": "End",
                                       "flavors": {"operations": ["next-csid"], "lblen": 32, "nflen": 16}}
    host = tb.routes(small.name, "h0")
    dt6 = [r["encap"] for r in host if r["dst"] == "fcbb:bbbb:300::/48"]
    assert dt6 == [{"type": "seg6local", "action": "End.DT6", "table": 255}]
    path = small.topo.path("h0", "h1", 1, 0)
    steered = [r for r in host if r["from"] == f"{path.path_address}/128"]
    want = {"type": "seg6", "mode": "encap.red", "segs": [str(path.container)]}
    assert [r["encap"] for r in steered] == [want]


def test_show_reports_kernel_state(small: tb.Testbed) -> None:
    proc = mrcctl("-j", "testbed", "show", "--name", small.name, check=True)
    doc = json.loads(proc.stdout)
    assert doc["complete"] and len(doc["nodes"]) == 8 and len(doc["links"]) == 8
    for lk in doc["links"]:
        assert lk["state"] == "up" and lk["oper"] == ["UP", "UP"]
        assert lk["rate_kernel"] == [100_000_000, 100_000_000]
        assert lk["tbf_dropped"] == [0, 0]
    h0 = next(n for n in doc["nodes"] if n["name"] == "h0")
    assert h0["mrc_address"] == "fd00::1" and [p["usid"] for p in h0["ports"]] == ["0300", "1300"]
    # the neighbours are permanent entries: no ND on the fabric
    with contextlib.closing(netns.ipr(small.ns("p0l0"))) as ipr:
        states = {n.get_attr("NDA_DST"): n["state"] for n in ipr.get_neighbours(family=socket.AF_INET6)}
    lk = small.topo.link_between("h0", "p0l0")
    assert states[str(lk.a_addr)] == tb.NUD_PERMANENT


def test_exec_runs_inside_the_host_namespace(small: tb.Testbed) -> None:
    proc = mrcctl("testbed", "exec", "--name", small.name, "h1", "--", "cat", "/proc/net/if_inet6",
                  check=True)
    want = ipaddress.IPv6Address(small.topo.mrc_address("h1")).exploded.replace(":", "")
    assert want in proc.stdout
    assert ipaddress.IPv6Address(small.topo.mrc_address("h0")).exploded.replace(":", "") not in proc.stdout


def test_errors_are_one_line(small: tb.Testbed) -> None:
    proc = mrcctl("-j", "testbed", "link", "down", "h0", "h1", "--name", small.name)
    assert proc.returncode != 0 and "no link between h0 and h1" in json.loads(proc.stdout)["error"]
    proc = mrcctl("testbed", "ping", "--name", small.name, "--src", "nobody")
    assert proc.returncode != 0 and "no host 'nobody'" in proc.stderr and "Traceback" not in proc.stderr
    proc = mrcctl("testbed", "show", "--name", "nosuchtb")
    assert proc.returncode != 0 and "no testbed named 'nosuchtb'" in proc.stderr


# ------------------------------------------------------------------------------------------ rate limits


def _iperf3(built: tb.Testbed, src: str, dst: str, path: topology.Path, seconds: int = 3) -> float:
    """Receiver-side goodput (bit/s) of one iperf3 TCP flow pinned to ``path``."""
    assert shutil.which("iperf3"), "iperf3 missing: make setup installs it"
    port = 5201 + secrets.randbelow(1000)
    server = subprocess.Popen(
        [sys.executable, "-m", "mrc.ctl.cli", "testbed", "exec", "--name", built.name, dst, "--",
         "iperf3", "-s", "-1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy(),
    )
    try:
        time.sleep(0.5)
        proc = mrcctl("testbed", "exec", "--name", built.name, src, "--", "iperf3", "-J", "-c",
                      str(built.topo.mrc_address(dst)), "-B", str(path.path_address), "-p", str(port),
                      "-t", str(seconds), "-O", "1", check=True)
        return float(json.loads(proc.stdout)["end"]["sum_received"]["bits_per_second"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)


@pytest.mark.slow
def test_rate_limit_holds_and_can_be_changed(make_testbed: Factory) -> None:
    built = make_testbed()
    path = built.topo.path("h0", "h1", 0, 0)
    configured = built.topo.link.rate_bps
    measured = _iperf3(built, "h0", "h1", path)
    print(f"rate {configured / 1e6:.0f} Mbit/s configured, {measured / 1e6:.2f} Mbit/s measured")
    assert abs(measured - configured) <= 0.15 * configured, f"{measured / 1e6:.1f} Mbit/s"
    # a rate change on one link of the path is the new bottleneck
    proc = mrcctl("-j", "testbed", "link", "set", "p0s0", "p0l1", "--rate", "40mbit", "--name", built.name)
    assert proc.returncode == 0, proc.stderr
    measured = _iperf3(built, "h0", "h1", path)
    print(f"rate 40 Mbit/s configured, {measured / 1e6:.2f} Mbit/s measured")
    assert abs(measured - 40e6) <= 0.15 * 40e6, f"{measured / 1e6:.1f} Mbit/s vs 40"
    # the other plane is untouched
    other = _iperf3(built, "h0", "h1", built.topo.path("h0", "h1", 1, 0), seconds=2)
    print(f"other plane: {other / 1e6:.2f} Mbit/s measured")
    assert abs(other - configured) <= 0.15 * configured
    # the topology files' floor is the command's too: below it, one error line (pyroute2 raised
    # struct.error packing a jumbo frame's burst time at 100 bit/s: a traceback)
    proc = mrcctl("testbed", "link", "set", "p1s0", "p1l1", "--rate", "100bit", "--name", built.name)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("mrcctl: error: link rate 100bit: the TBF limit must be 1kbit"), proc.stderr
    proc = mrcctl("testbed", "link", "set", "p1s0", "p1l1", "--rate", "1kbit", "--name", built.name)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------------ cleanup


def test_two_testbeds_do_not_interfere(make_testbed: Factory) -> None:
    a = make_testbed()
    b = make_testbed()
    assert set(a.namespaces()).isdisjoint(b.namespaces())
    tb.set_link(a.name, "p1l0", "p1s0", up=False)
    assert sum(not r.reachable for r in tb.probe(a.name, timeout_s=0.5)) == 2
    assert all(r.reachable for r in tb.probe(b.name))
    tb.teardown(a.name)
    assert _ours(a.name) == [] and len(_ours(b.name)) == 8
    assert all(r.reachable for r in tb.probe(b.name))


def test_failed_build_removes_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    name = _name()
    calls = []
    real = tb._configure_node

    def flaky(t: tb.Testbed, s: object, node: str) -> None:
        calls.append(node)
        if len(calls) == 5:
            raise RuntimeError("injected failure half-way")
        real(t, s, node)  # type: ignore[arg-type]

    monkeypatch.setattr(tb, "_configure_node", flaky)
    try:
        with pytest.raises(RuntimeError, match="half-way"):
            tb.up(topology.load(TOPOS / "small.toml"), name=name)
        assert _ours(name) == []
        assert not tb.Testbed.path_for(name).exists()
    finally:
        tb.teardown(name)


def test_down_after_a_killed_build_and_with_processes_inside() -> None:
    name = _name()
    before = set(os.listdir("/sys/class/net"))
    builder = subprocess.Popen([sys.executable, "-m", "mrc.ctl.cli", "testbed", "up",
                                str(TOPOS / "default.toml"), "--name", name],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    sleeper = None
    try:
        # kill the builder half-way (as a crash would); the state file is written before anything else
        deadline = time.monotonic() + 20
        while len(_ours(name)) < 6 and time.monotonic() < deadline and builder.poll() is None:
            time.sleep(0.005)
        builder.send_signal(signal.SIGKILL)
        builder.wait(timeout=10)
        assert _ours(name), "the build never started"
        assert tb.Testbed.path_for(name).exists()
        # a process living in one of the testbed's namespaces must not keep it alive
        ns = _ours(name)[0]
        sleeper = subprocess.Popen(["sleep", "300"], preexec_fn=lambda: netns.enter_for_exec(ns))
        assert sleeper.pid in netns.pids_in([ns])
        proc = mrcctl("-j", "testbed", "down", "--name", name, check=True)
        report = json.loads(proc.stdout)["removed"][0]
        assert report["processes_killed"] == 1
        sleeper.wait(timeout=10)
        assert _ours(name) == []
        assert not tb.Testbed.path_for(name).exists()
        assert set(os.listdir("/sys/class/net")) <= before  # nothing leaked into the root namespace
    finally:
        if builder.poll() is None:
            builder.kill()
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
        tb.teardown(name)


def test_delay_is_refused_with_the_reason(tmp_path: Path) -> None:
    f = tmp_path / "delay.toml"
    f.write_text((TOPOS / "small.toml").read_text().replace('mtu = 9000', 'mtu = 9000\ndelay = "1ms"'))
    name = _name()
    try:
        with pytest.raises(MrcError, match="netem"):
            tb.up(topology.load(f), name=name)
        assert _ours(name) == []
    finally:
        tb.teardown(name)


def test_seg6_route_request_rejected_by_kernel_is_an_error(small: tb.Testbed) -> None:
    """The message classes talk to the real kernel: a route to a missing device is refused (ENODEV)."""
    with contextlib.closing(netns.ipr(small.ns("p0s0"))) as ipr, pytest.raises(NetlinkError) as e:
        seg6.route_request(ipr, seg6.seg6local_msg("fcbb:bbbb:999::", 48, 9999, "End",
                                                   flavors={"operations": ["next-csid"], "lblen": 32,
                                                            "nflen": 16}))
    assert e.value.code == errno.ENODEV
