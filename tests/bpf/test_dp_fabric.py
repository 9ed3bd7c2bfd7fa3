"""The dataplane on a real testbed (small.toml: h0 and h1 on different leaves, 2 planes, 1 spine).

Packets are plain UDP/4791 from a socket in h0 (bound to its MRC address); host_egress encapsulates them by
EV and redirects them to a plane port; switch_port programs sit on every port; host_ingress (XDP) checks
and counts them at h1, where a socket receives them. Assertions are about what arrives and what the
counters and captures show."""

from __future__ import annotations

import contextlib
import ctypes as ct
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mrc import wire
from mrc.dataplane import fabric as fab
from mrc.dataplane import netns, udp
from mrc.dataplane import testbed as tb
from mrc.dataplane.fabric import FabricDataplane
from mrc.errors import MrcError
from mrc.wire import ip

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="loads eBPF programs, builds namespaces"),
              pytest.mark.netns, pytest.mark.bpf]


class Pair:
    """A sender socket in h0 and a receiver socket in h1 (MRC addresses, port 4791)."""

    def __init__(self, fd: FabricDataplane) -> None:
        self.fd = fd
        topo = fd.topo
        self.src, self.dst = topo.mrc_address("h0"), topo.mrc_address("h1")
        self.tx = udp.mrc_socket(fd.tb.ns("h0"), str(self.src))
        self.rx = udp.mrc_socket(fd.tb.ns("h1"), str(self.dst))
        self.ctx = wire.IcrcContext(self.src.packed, self.dst.packed)
        self.buf = bytearray(9100)
        self.psn = 0

    def send(self, ev: int, payload: bytes = b"m" * 1000, dqpn: int = 5) -> int:
        self.psn += 1
        n = wire.build_write(self.buf, self.ctx, dqpn=dqpn, psn=self.psn, ev_index=ev, va=self.psn * 8192,
                             rkey=1, payload=payload)
        self.tx.sendto(self.buf[:n], (str(self.dst), 4791))
        return self.psn

    def paced(self, evs: list[int], pps: float, payload: bytes) -> list[int]:
        psns = []
        t0 = time.perf_counter()
        for i, ev in enumerate(evs):
            while time.perf_counter() < t0 + i / pps:
                pass
            psns.append(self.send(ev, payload))
        return psns

    def receive(self, quiet_s: float = 0.3) -> list[tuple[wire.MrcPacket, int, int, bytes]]:
        """(packet, traffic class, source port, raw bytes) until nothing arrives for quiet_s."""
        out: list[tuple[wire.MrcPacket, int, int, bytes]] = []
        self.rx.settimeout(quiet_s)
        while True:
            try:
                data, (_a, sport), tclass = udp.recv_with_tclass(self.rx)
            except TimeoutError:
                return out
            out.append((wire.parse(data, self.ctx, sport), tclass, sport, data))

    def close(self) -> None:
        self.tx.close()
        self.rx.close()


@pytest.fixture
def pair(small_fabric: FabricDataplane) -> Iterator[Pair]:
    p = Pair(small_fabric)
    p.receive(0.05)
    yield p
    p.close()


def host_port(fd: FabricDataplane, host: str, plane: int) -> str:
    return fd.topo.link_between(host, fd.topo.leaf_name(plane, fd.topo.host_leaf(host))).a_ifname


@contextlib.contextmanager
def capture(ns: str, ifname: str, out: Path, count: int) -> Iterator[None]:
    proc = subprocess.Popen(["ip", "netns", "exec", ns, "tcpdump", "--immediate-mode", "-U", "-n",
                             "-i", ifname, "-c", str(count), "-w", str(out), "ip6 and ip6[6] == 41"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # "listening on ..." once the capture runs
        assert "listening" in line, line
        yield
        proc.wait(timeout=5)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()


def read_pcap(path: Path) -> list[bytes]:
    from scapy.utils import rdpcap

    return [bytes(p) for p in rdpcap(str(path))] if path.exists() else []


# --------------------------------------------------------------------------------------------- egress


def test_ev_follows_path_map_on_the_wire(small_fabric: FabricDataplane, pair: Pair, tmp_path: Path) -> None:
    fd = small_fabric
    evs = list(range(8))
    expect = {ev: fd.lookup_path("h0", "h1", ev) for ev in evs}
    assert all(p is not None for p in expect.values())
    assert {p.plane for p in expect.values() if p} == {0, 1}  # the default map sprays over both planes
    before = fd.stats("h0")["hosts"]["h0"]["planes"]
    caps = {p: tmp_path / f"plane{p}.pcap" for p in (0, 1)}
    counts = {p: sum(1 for x in expect.values() if x and x.plane == p) for p in (0, 1)}
    with capture(fd.tb.ns("h0"), host_port(fd, "h0", 0), caps[0], counts[0]), \
            capture(fd.tb.ns("h0"), host_port(fd, "h0", 1), caps[1], counts[1]):
        payloads = {ev: bytes([65 + ev]) * (500 + ev) for ev in evs}
        for ev in evs:
            pair.send(ev, payloads[ev])
    got = pair.receive()
    # every packet arrived intact: ICRC over the rewritten source port, payload bytes
    assert sorted(p.ev_index for p, *_ in got) == evs
    for p, _tc, sport, _raw in got:
        assert p.icrc == "ok" and sport == 0xC000 | p.ev_index
        assert bytes(p.payload) == payloads[p.ev_index]
    # the outer header each plane port put on the wire is the path map's
    for plane, cap in caps.items():
        frames = read_pcap(cap)
        assert len(frames) == counts[plane]
        for frame in frames:
            f = ip.split_ether(frame)
            assert f.outer is not None
            ev = f.outer.flow_label
            path = expect[ev]
            assert path is not None and path.plane == plane
            assert f.outer.dst_str == str(path.container)
            assert f.outer.src_str == str(fd.topo.port_address("h0", plane))
            assert f.outer.ecn == ip.ECN_ECT0 and f.outer.next_header == 41
            assert f.inner.dst_str == str(pair.dst) and f.sport == 0xC000 | ev
    after = fd.stats("h0")["hosts"]["h0"]["planes"]
    for plane in (0, 1):
        assert after[plane]["tx_packets"] - before[plane]["tx_packets"] == counts[plane]


def test_changing_the_path_map_moves_the_ev(small_fabric: FabricDataplane, pair: Pair) -> None:
    fd = small_fabric
    old = fd.lookup_path("h0", "h1", 0)
    assert old is not None
    other = next(p for p in fd.topo.paths("h0", "h1") if p.plane != old.plane)
    fd.set_path("h0", "h1", 0, other)
    try:
        before = fd.stats("h0")["hosts"]["h0"]["planes"]
        for _ in range(5):
            pair.send(0)
        assert len(pair.receive()) == 5
        after = fd.stats("h0")["hosts"]["h0"]["planes"]
        assert after[other.plane]["tx_packets"] - before[other.plane]["tx_packets"] == 5
        assert after[old.plane]["tx_packets"] == before[old.plane]["tx_packets"]
        h1 = fd.stats("h1")["hosts"]["h1"]["planes"]
        assert h1[other.plane]["rx_packets"] >= 5
    finally:
        fd.set_path("h0", "h1", 0, old)


def test_unknown_ev_is_dropped_and_counted(small_fabric: FabricDataplane, pair: Pair) -> None:
    fd = small_fabric
    s0 = fd.stats("h0")
    for _ in range(3):
        pair.send(700)
    assert pair.receive(0.2) == []
    s1 = fd.stats("h0")
    no_path = [s["hosts"]["h0"]["tx_drops"].get("no_path", 0) for s in (s0, s1)]
    assert no_path[1] - no_path[0] == 3
    # nothing was redirected to a plane port (and mrc0 swallows what is not redirected)
    for plane, row in s1["hosts"]["h0"]["planes"].items():
        assert row["tx_packets"] == s0["hosts"]["h0"]["planes"][plane]["tx_packets"]


def test_second_attach_is_refused_and_harmless(small_fabric: FabricDataplane, pair: Pair) -> None:
    with pytest.raises(MrcError, match="already has mrc programs attached"):
        FabricDataplane.attach(small_fabric.name)
    for ev in range(4):
        pair.send(ev)
    assert len(pair.receive()) == 4


def test_non_mrc_traffic_still_uses_the_kernel_paths(small_fabric: FabricDataplane) -> None:
    results = tb.probe(small_fabric.name)
    assert results and all(r.reachable for r in results)


@pytest.mark.parametrize("mode", ["kernel", "xdp"])
def test_both_decap_modes_deliver_the_same(small_fabric: FabricDataplane, pair: Pair, mode: str) -> None:
    """End.DT6 (kernel) or host_ingress (XDP) strips the outer header: the socket gets the same bytes."""
    fd = small_fabric
    fd.set_decap(mode)
    try:
        rx0 = sum(v["rx_packets"] for v in fd.stats("h1")["hosts"]["h1"]["planes"].values())
        for ev in range(6):
            pair.send(ev, b"d" * 2000)
        got = pair.receive()
        assert sorted(p.ev_index for p, *_ in got) == list(range(6))
        assert all(p.icrc == "ok" and bytes(p.payload) == b"d" * 2000 for p, *_ in got)
        rx1 = sum(v["rx_packets"] for v in fd.stats("h1")["hosts"]["h1"]["planes"].values())
        assert rx1 - rx0 == 6
    finally:
        fd.set_decap("xdp")


# -------------------------------------------------------------------------------------------- ingress


def test_malformed_packets_are_dropped_at_xdp(small_fabric: FabricDataplane, pair: Pair) -> None:
    """Frames injected from the leaf into h1's plane-0 port: good ones reach the socket, malformed ones are
    dropped with their reason and never reach it."""
    fd = small_fabric
    topo = fd.topo
    lk = topo.link_between("h1", topo.leaf_name(0, topo.host_leaf("h1")))
    sid = topo.usid_prefix("h1", 0).network_address

    def frame(mrc: bytes, ev: int = 1) -> bytes:
        inner = ip.ipv6_udp(pair.src.packed, pair.dst.packed, wire.ev_sport(ev), mrc, traffic_class=2)
        return ip.ether(lk.a_mac, lk.b_mac, ip.encap(inner, lk.b_addr.packed, sid.packed, ev))

    def write(dqpn: int = 5, ev: int = 1) -> bytes:
        pair.psn += 1
        n = wire.build_write(pair.buf, pair.ctx, dqpn=dqpn, psn=pair.psn, ev_index=ev, va=0, rkey=1,
                             payload=b"g" * 300)
        return bytes(pair.buf[:n])

    def patched(b: bytes, off: int, value: int) -> bytes:
        x = bytearray(b)
        x[off] = value
        return bytes(x)

    good = frame(write())
    bth = 14 + 80 + 8
    cases = {
        "truncated": [good[:14 + 40 + 20], good[:bth - 4], good[:bth + 8], good[:bth + 40], good[:-10]],
        "bad_length": [patched(good, 14 + 80 + 5, good[14 + 80 + 5] ^ 0x10)],  # UDP length (low byte)
        "bad_version": [patched(good, bth + 28, 7)],  # MXH version
        "bad_opcode": [patched(good, bth, 0x11)],
        "foreign_qpn": [frame(write(dqpn=999))],
    }
    fd.allow_qps("h1", [5])
    fd.set_qp_filter(True)
    sk = netns.socket_in(fd.tb.ns(lk.b), socket.AF_PACKET, socket.SOCK_RAW)
    try:
        sk.bind((lk.b_ifname, 0))
        d0 = fd.ingress_drops("h1")
        for frames in cases.values():
            for f in frames:
                sk.send(f)
        for _ in range(3):
            sk.send(frame(write()))
        time.sleep(0.1)
        got = pair.receive()
        d1 = fd.ingress_drops("h1")
    finally:
        sk.close()
        fd.set_qp_filter(False)
    delta = {k: d1.get(k, 0) - d0.get(k, 0) for k in d1 if d1.get(k, 0) != d0.get(k, 0)}
    assert len(got) == 3 and all(p.dqpn == 5 and p.icrc == "ok" for p, *_ in got), delta
    assert delta == {k: len(v) for k, v in cases.items()}


# -------------------------------------------------------------------------------------------- switch


# The virtual queue of switch_port, step by step exactly as bpf/switch_port.c computes it: drain since
# the last packet (at most one second's worth), trim above T, drop what does not fit in the buffer, mark
# above K. The tests below compare every packet with it, using the program's own per-packet state
# (mrc_sw_vq: last_ns, backlog) read back after each packet, so that no assertion depends on how fast
# this process, the kernel or a loaded machine happened to send or forward.
def vq_step(backlog: int, dt_ns: int, cfg: dict[str, int], full_len: int, trim_len: int) -> tuple[str, int]:
    drained = min(dt_ns, 1_000_000_000) * (cfg["rate_bps"] // 8) // 1_000_000_000
    backlog = max(backlog - drained, 0)
    length, trimmed = (trim_len, True) if backlog > cfg["trim_t"] else (full_len, False)
    if backlog + length > cfg["buffer"]:
        return "lost", backlog
    if trimmed:
        return "trimmed", backlog + length
    return ("ce" if backlog > cfg["ecn_k"] else "clean"), backlog + length


class CongestedPort:
    """The leaf port towards h1 on plane 0 with a given virtual queue; sends one packet at a time and
    waits until switch_port has run on it (its vq timestamp moves), recording the vq state after each."""

    def __init__(self, fd: FabricDataplane, pair: Pair, **cfg: int) -> None:
        self.fd, self.pair, self.cfg = fd, pair, cfg
        self.leaf = fd.topo.leaf_name(0, fd.topo.host_leaf("h1"))
        self.evs = _plane_evs(fd, 0)
        fd.set_port(self.leaf, "h1", **cfg)  # also empties the virtual queue
        assert fd.switch is not None
        self.vq = fd.switch.maps["mrc_sw_vq"]
        self.key = ct.c_uint32(fd._sw_port(self.leaf, "h1")[1].port_id)
        self.trace: list[tuple[int, int, int]] = [(self.state()[0], 0, 0)]  # (last_ns, backlog, psn)

    def state(self) -> tuple[int, int]:
        v = self.vq.get(self.key)
        return int(v.last_ns), int(v.backlog)

    def send(self, payload: bytes) -> int:
        before = self.trace[-1][0]
        psn = self.pair.send(self.evs[len(self.trace) % len(self.evs)], payload)
        deadline = time.monotonic() + 30  # a guard against a hang, not a timing assumption
        while (st := self.state())[0] == before:
            assert time.monotonic() < deadline, "switch_port never saw the packet"
            time.sleep(0.0002)
        self.trace.append((*st, psn))
        return psn

    def actions(self) -> dict[str, dict[str, int]]:
        acts: dict[str, dict[str, int]] = self.fd.stats(self.leaf)["ports"][self.leaf]["h1"]["actions"]
        return acts

    def expected(self, full_len: int, trim_len: int) -> list[tuple[int, str]]:
        """(psn, outcome) per packet from the recorded program state; checks the recorded backlog too."""
        out = []
        for (t0, b0, _), (t1, b1, psn) in zip(self.trace, self.trace[1:], strict=False):
            what, backlog = vq_step(b0, t1 - t0, self.cfg, full_len, trim_len)
            assert backlog == b1, (psn, what, backlog, b1, self.trace)
            out.append((psn, what))
        return out

    def restore(self) -> None:
        self.fd.set_port(self.leaf, "h1", **fab.switch_defaults(self.fd.topo, self.leaf, "h1"))


def frame_lens(payload_len: int) -> tuple[int, int]:
    """skb->len at a switch port: Ethernet, outer and inner IPv6, UDP, then the MRC packet (ICRC
    included) in full or cut to the end of MXH."""
    envelope = 14 + 40 + 40 + 8
    headers = wire.header_len(wire.Opcode.RDMA_WRITE_ONLY)
    return envelope + headers + payload_len + 4, envelope + headers


def outcomes(got: list[tuple[wire.MrcPacket, int, int, bytes]], payload: bytes) -> dict[int, str]:
    out = {}
    for p, tclass, _sport, raw in got:
        if p.trimmed:
            assert len(raw) == wire.header_len(p.opcode)  # cut to the end of MXH
            assert p.dma_len == len(payload)
            assert p.flags & wire.MxhFlag.PRIO
            out[p.psn] = "trimmed"
        else:
            assert p.icrc == "ok" and bytes(p.payload) == payload
            out[p.psn] = "ce" if tclass & 3 == 3 else "clean"
    return out


@contextlib.contextmanager
def quiet_upstream(fd: FabricDataplane, target: tuple[str, str]) -> Iterator[None]:
    """No virtual queue on the other switch ports of plane 0 (they forward everything), so that only the
    port under test marks, trims or drops; their defaults again afterwards."""
    changed = []
    try:
        for port in fab.ports(fd.topo):
            if port.plane == 0 and not port.is_host and (port.node, port.ifname) != target:
                fd.set_port(port.node, port.ifname, rate_bps=0)
                changed.append(port)
        yield
    finally:
        for port in changed:
            fd.set_port(port.node, port.ifname, **fab.switch_defaults(fd.topo, port.node, port.peer))


def test_congested_port_marks_then_trims_then_drops(small_fabric: FabricDataplane, pair: Pair) -> None:
    """A burst into a switch port whose virtual queue fills: ECN-CE first, then trimmed packets (TRIMMED,
    PRIO, lengths consistent), then drops, in that order of load. The port drains 1 byte/s (nothing in
    the test's time: the order is the queue's, not the scheduler's); each packet's outcome is also the
    one the program's own recorded state predicts, and the counters agree."""
    fd = small_fabric
    payload = b"c" * 4096
    full, trim = frame_lens(len(payload))
    trims = 40
    # clean (empty queue), CE (one packet queued, above K), then trimmed (two queued, above T) until
    # exactly `trims` headers are queued: the next one no longer fits (one byte short), nor any after it
    cfg = {"rate_bps": 8, "ecn_k": 2000, "trim_t": 6000, "buffer": 2 * full + trims * trim + 1}
    assert cfg["ecn_k"] < full <= cfg["trim_t"] < 2 * full
    n = 2 + trims + 20
    leaf = fd.topo.leaf_name(0, fd.topo.host_leaf("h1"))
    h0 = fd.stats("h1")["hosts"]["h1"]["planes"][0]
    with quiet_upstream(fd, (leaf, "h1")):
        port = CongestedPort(fd, pair, **cfg)
        try:
            s0 = port.actions()
            sent = [port.send(payload) for _ in range(n)]
            got = pair.receive(0.5)
            s1 = port.actions()
            h1 = fd.stats("h1")["hosts"]["h1"]["planes"][0]
        finally:
            port.restore()
    expected = port.expected(full, trim)
    outcome = {psn: "lost" for psn in sent}
    outcome.update(outcomes(got, payload))
    order = [outcome[psn] for psn in sent]
    assert order == [what for _psn, what in expected], (order, port.trace)
    assert order == ["clean", "ce"] + ["trimmed"] * trims + ["lost"] * (n - 2 - trims)
    delta = {k: {f: s1[k][f] - s0[k][f] for f in ("packets", "bytes")} for k in s1}
    assert delta["forward"] == {"packets": 1, "bytes": full}
    assert delta["ecn_mark"] == {"packets": 1, "bytes": full}
    assert delta["trim"] == {"packets": trims, "bytes": trims * trim}
    assert delta["drop_buffer"] == {"packets": n - 2 - trims, "bytes": (n - 2 - trims) * trim}
    assert sum(d["packets"] for d in delta.values()) == n  # nothing else crossed the port
    assert h1["rx_trimmed"] - h0["rx_trimmed"] == trims
    assert h1["rx_ce"] - h0["rx_ce"] == 1


def test_virtual_queue_drains_at_the_port_rate(small_fabric: FabricDataplane, pair: Pair) -> None:
    """At 1 Mbit/s the queue loses rate/8 bytes per second between packets, computed from the program's
    own timestamps: a packet right behind others finds them partly drained (and is marked above K), one
    sent after a pause longer than the buffer's drain time finds the queue empty."""
    fd = small_fabric
    payload = b"q" * 4096
    full, trim = frame_lens(len(payload))
    cfg = {"rate_bps": 1_000_000, "ecn_k": 2000, "trim_t": 12000, "buffer": 24000}
    empty_after_s = cfg["buffer"] / (cfg["rate_bps"] / 8)  # 0.192 s
    port = CongestedPort(fd, pair, **cfg)
    partial = 0
    try:
        for _round in range(5):
            for _ in range(4):
                port.send(payload)
            time.sleep(empty_after_s + 0.05)
            port.send(payload)  # the queue is empty by now, whatever the scheduler did
            pair.receive(0.05)
            steps = list(zip(port.trace, port.trace[1:], strict=False))
            partial = sum(1 for (t0, b0, _), (t1, _b1, _) in steps
                          if 0 < (t1 - t0) * (cfg["rate_bps"] // 8) // 1_000_000_000 < b0)
            if partial:
                break
    finally:
        port.restore()
    expected = port.expected(full, trim)  # every recorded backlog is the drain formula's
    assert partial, ("no packet found a partly drained queue", port.trace)
    after_pause = [what for i, (_psn, what) in enumerate(expected) if i % 5 == 4]
    assert after_pause and set(after_pause) == {"clean"}
    assert {what for _psn, what in expected} <= {"clean", "ce", "trimmed"}


def _plane_evs(fd: FabricDataplane, plane: int) -> list[int]:
    out = []
    for ev in range(16):
        path = fd.lookup_path("h0", "h1", ev)
        if path is not None and path.plane == plane:
            out.append(ev)
    return out


def test_drop_probability_within_tolerance(small_fabric: FabricDataplane, pair: Pair) -> None:
    fd = small_fabric
    leaf = fd.topo.leaf_name(0, fd.topo.host_leaf("h1"))
    fd.set_fault(leaf, "h1", drop=0.1)
    n = 3000
    try:
        evs = _plane_evs(fd, 0)
        s0 = fd.stats(leaf)["ports"][leaf]["h1"]["actions"]["drop_fault"]["packets"]
        pair.paced([evs[i % len(evs)] for i in range(n)], 10000, b"s" * 64)
        got = pair.receive()
        s1 = fd.stats(leaf)["ports"][leaf]["h1"]["actions"]["drop_fault"]["packets"]
    finally:
        fd.clear_faults(leaf, "h1")
    lost = n - len(got)
    assert s1 - s0 == lost
    # binomial(3000, 0.1): sigma = 16.4 packets; 4 sigma
    assert abs(lost - 0.1 * n) < 4 * (n * 0.1 * 0.9) ** 0.5, lost


def test_blackhole_and_single_ev_faults(small_fabric: FabricDataplane, pair: Pair) -> None:
    fd = small_fabric
    spine = fd.topo.spine_name(0, 0)
    leaf0 = fd.topo.leaf_name(0, fd.topo.host_leaf("h0"))
    p0, p1 = _plane_evs(fd, 0), _plane_evs(fd, 1)
    fd.set_fault(leaf0, spine, blackhole=True)
    try:
        for ev in p0 + p1:
            pair.send(ev)
        got = sorted(p.ev_index for p, *_ in pair.receive())
        assert got == sorted(p1)  # every packet through the failed link is gone, the other plane intact
        bh = fd.stats(leaf0)["ports"][leaf0][spine]["actions"]["drop_blackhole"]["packets"]
        assert bh >= len(p0)
    finally:
        fd.clear_faults(leaf0, spine)
    assert fd.faults() == []
    fd.set_fault(leaf0, spine, blackhole=True, ev=p0[0])
    try:
        for ev in p0 + p1:
            pair.send(ev)
        got = sorted(p.ev_index for p, *_ in pair.receive())
        assert got == sorted(set(p0 + p1) - {p0[0]})  # only that EV is dropped
    finally:
        fd.clear_faults()
    fd.set_fault(plane=1, drop=1.0)  # a whole plane loses everything
    try:
        for ev in p0 + p1:
            pair.send(ev)
        assert sorted(p.ev_index for p, *_ in pair.receive()) == sorted(p0)
    finally:
        assert fd.clear_faults(plane=1) == 8  # 4 links of plane 1, both ends


def test_a_link_rate_change_moves_the_switch_ports_virtual_queues_too(small_fabric: FabricDataplane) -> None:
    """`mrcctl testbed link set A B --rate R` with the programs attached: the TBF and the virtual queues
    of both switch ends drain at R (they kept the attach-time rate, so a slowed link dropped without a
    mark: MRC could not steer away from it)."""
    from mrc.ctl.cli import main

    fd = small_fabric
    nominal = fd.topo.link.rate_bps
    try:
        assert main(["testbed", "link", "set", "p0l0", "p0s0", "--rate", "10mbit", "--name", fd.name]) == 0
        assert [fd._sw_port(n, i)[1].rate_bps for n, i in fd.link_ports("p0l0", "p0s0")] == [10_000_000] * 2
        other = fd.link_ports("p1l0", "p1s0")
        assert [fd._sw_port(n, i)[1].rate_bps for n, i in other] == [nominal] * 2
    finally:
        main(["testbed", "link", "set", "p0l0", "p0s0", "--rate", str(nominal), "--name", fd.name])
    assert [fd._sw_port(n, i)[1].rate_bps for n, i in fd.link_ports("p0l0", "p0s0")] == [nominal] * 2
