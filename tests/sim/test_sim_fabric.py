"""The fabric model on hand-computable scenarios: serialization and propagation, a link failure, ECN,
trimming and drops at an output queue, micro-SID forwarding that matches the topology model."""

from __future__ import annotations

from typing import Any

import pytest

from mrc import topology
from mrc.sim.fabric import WIRE_OVERHEAD, Fabric, FabricParams

# 8 Gb/s = 1 byte/ns: a packet of 1000 wire bytes takes exactly 1000 ns to serialize
RATE = 8_000_000_000
WIRE = 1000
PAYLOAD = WIRE - WIRE_OVERHEAD


class Stub:
    """An endpoint that sends `count` data packets to `dst` at t = 0 and records what arrives."""

    def __init__(self, dst: int | None = None, count: int = 0, tag: int = 0) -> None:
        self.todo = count
        self.dst = dst
        self.tag = tag
        self.got: list[tuple[int, int, int, bool, int]] = []  # (time, tag, seq, ecn, length)

    def receive(
        self, data: Any, now: int, ecn: bool = False, port: int = 0, src: bytes | None = None
    ) -> None:
        self.got.append((now, data[1], data[2], ecn, len(data)))

    def handle_timer(self, now: int) -> None:
        pass

    def datagrams_to_send(self, now: int) -> list[Any]:
        out = []
        for k in range(self.todo):
            buf = bytearray(PAYLOAD)
            buf[0], buf[1], buf[2] = 0x0A, self.tag, k  # a WRITE opcode: a data packet the fabric may trim
            out.append((buf, 0, 0, self.dst))
        self.todo = 0
        return out

    def next_deadline(self) -> int | None:
        return None


def _fabric(topo: topology.Topology, **kw: Any) -> Fabric:
    return Fabric(topo, FabricParams(rate_bps=RATE, **kw))


def _attach(fab: Fabric, h: int, ep: Stub, spine: int | None) -> None:
    def route(dg: Any) -> tuple[int, int]:
        return fab.path_container(h, dg[3], 0, spine)

    fab.attach(h, ep, route)


def test_one_flow_over_one_link_runs_at_the_link_rate() -> None:
    # h0 -> leaf -> h1: packet k leaves the NIC at (k+1)s, reaches the leaf at (k+1)s + d, is serialized
    # there without waiting (same rate) and reaches h1 at (k+2)s + 2d.
    topo = topology.generate(1, 1, 0, 2)
    fab = _fabric(topo, delay_ns=500)
    a, b = Stub(1, 50), Stub()
    _attach(fab, 0, a, None)
    _attach(fab, 1, b, None)
    fab.kick(0, 0)
    fab.run()
    assert [g[0] for g in b.got] == [(k + 2) * 1000 + 2 * 500 for k in range(50)]
    assert fab.hops == 100  # two links per packet
    # 50 packets in 49 inter-arrival gaps of exactly one serialization time: the link rate
    span = b.got[-1][0] - b.got[0][0]
    assert 49 * WIRE * 8 / span * 1e9 == RATE


def test_failure_drops_exactly_the_packets_queued_or_on_the_link() -> None:
    # h0 -> p0l0 -> p0s0 -> p0l1 -> h1 with a 5 us propagation delay. Packet k enters p0l0's uplink at
    # (k+1)s + d = (k+6) us and reaches the spine at (k+2)s + 2d = (k+12) us. The uplink fails at 20.5 us:
    # packets 9..14 are on it then (lost), 15.. find it down (dropped, no route), 0..8 arrive.
    topo = topology.generate(1, 2, 1, 1)
    fab = _fabric(topo, delay_ns=5_000)
    a, b = Stub(1, 30), Stub()
    _attach(fab, 0, a, 0)
    _attach(fab, 1, b, 0)
    li = fab.link("p0l0", "p0s0")
    fab.at(20_500, lambda t: fab.set_link(li, False, t))
    fab.kick(0, 0)
    fab.run()
    assert [g[2] for g in b.got] == list(range(9))
    assert fab.lost_on_link[li] == 6
    assert fab.drops == {"link_failed": 6, "link_down": 15}
    assert fab.down_data_drops[li] == 15


def test_link_heals_and_traffic_flows_again() -> None:
    topo = topology.generate(1, 2, 1, 1)
    fab = _fabric(topo, delay_ns=500)
    a, b = Stub(1, 10), Stub()
    _attach(fab, 0, a, 0)
    _attach(fab, 1, b, 0)
    li = fab.link("p0l0", "p0s0")
    fab.at(0, lambda t: fab.set_link(li, False, t))
    fab.at(4_000, lambda t: fab.set_link(li, True, t))
    fab.kick(0, 0)
    fab.run()
    # packet k reaches p0l0 at (k+1) us + 0.5 us: k = 0..2 find the link down, 3.. pass
    assert [g[2] for g in b.got] == list(range(3, 10))
    assert fab.drops == {"link_down": 3}


def _incast_two(**kw: Any) -> tuple[Fabric, Stub]:
    # h0 and h1 send 5 packets each to h2 on the same leaf: both reach the leaf together every 1 us, the
    # port toward h2 drains one per us, so the j-th packet of h0 finds j packets queued (j·1000 bytes)
    # and h1's finds j + 1 (h0's arrives first: it was kicked first).
    topo = topology.generate(1, 1, 0, 3)
    fab = _fabric(topo, delay_ns=500, **kw)
    a, b, c = Stub(2, 5, tag=0), Stub(2, 5, tag=1), Stub()
    for h, ep in enumerate((a, b, c)):
        _attach(fab, h, ep, None)
    fab.kick(0, 0)
    fab.kick(1, 0)
    fab.run()
    return fab, c


def test_ecn_marks_only_above_the_threshold() -> None:
    fab, c = _incast_two(ecn_bytes=2500, buffer_bytes=1 << 20, trim_bytes=None)
    marked = sorted((tag, k) for _, tag, k, ecn, _ in c.got if ecn)
    # backlog > 2500 bytes: h0's packets j >= 3 (3000, 4000), h1's j >= 2 (3000, 4000, 5000)
    assert marked == [(0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]
    assert fab.ecn_marks == 5
    assert fab.port_max_backlog[fab.port_of("p0l0", "h2")] == 5000
    # without queueing pressure nothing is marked
    fab2, c2 = _incast_two(ecn_bytes=5000, buffer_bytes=1 << 20, trim_bytes=None)
    assert not any(g[3] for g in c2.got) and fab2.ecn_marks == 0


def test_buffer_drops_without_trimming() -> None:
    # a packet is dropped when backlog + its own 1000 bytes exceed the 3500-byte buffer. Round j (every
    # 1 us): h0's packet finds 0, 1000, 2000, 2000, 2000 bytes (the port drains 1000 per round and the
    # dropped packets add nothing), h1's finds 1000, 2000, 3000, 3000, 3000: h1's packets 2, 3, 4 drop.
    fab, c = _incast_two(ecn_bytes=1 << 20, buffer_bytes=3500, trim_bytes=None)
    got = sorted((tag, k) for _, tag, k, _, _ in c.got)
    assert fab.drops == {"buffer_no_trim": 3}
    assert got == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 0), (1, 1)]


def test_trimming_cuts_data_above_the_threshold_and_skips_the_queue() -> None:
    fab, c = _incast_two(ecn_bytes=1 << 20, buffer_bytes=1 << 20, trim_bytes=1500)
    trimmed = sorted((tag, k) for _, tag, k, _, n in c.got if n == 52)  # WRITE headers up to MXH
    # backlog > 1500: h0's j >= 2 and h1's j >= 1; a trimmed packet adds only its header's time
    assert fab.trims == len(trimmed) > 0
    assert (0, 0) not in trimmed and (0, 1) not in trimmed and (1, 0) not in trimmed
    assert not fab.drops
    times = {(tag, k): t for t, tag, k, _, _ in c.got}
    ser_hdr = fab.ser(52 + WIRE_OVERHEAD)
    # h1's packet 1 is trimmed at (2 us + 0.5 us) and reaches h2 one header time and one delay later
    assert times[(1, 1)] == 2_500 + ser_hdr + 500


def test_forwarding_uses_the_topologys_micro_sid_containers() -> None:
    topo = topology.load(topology.default_topology_dir() / "default.toml")
    fab = Fabric(topo)
    mask = (1 << 96) - 1
    for path in topo.paths():
        s, d = topo.host_index(path.src), topo.host_index(path.dst)
        port, cont = fab.path_container(s, d, path.plane, path.spine)
        assert cont == int(path.container) & mask
        assert port == fab.port_of(path.src, topo.leaf_name(path.plane, topo.host_leaf(path.src)))


@pytest.mark.parametrize("spine", [0, 1])
def test_a_packet_follows_its_container_hop_by_hop(spine: int) -> None:
    topo = topology.load(topology.default_topology_dir() / "default.toml")
    fab = Fabric(topo)
    a, b = Stub(3, 1), Stub()
    def route(dg: Any) -> tuple[int, int]:
        return fab.path_container(0, 3, 2, spine)
    fab.attach(0, a, route)
    fab.attach(3, b, route)
    fab.kick(0, 0)
    fab.run()
    assert len(b.got) == 1 and fab.hops == 4
    up = fab.port_of("p2l0", f"p2s{spine}")
    other = fab.port_of("p2l0", f"p2s{1 - spine}")
    assert fab.port_tx_bytes[up] > 0 and fab.port_tx_bytes[other] == 0
