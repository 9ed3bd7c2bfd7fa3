"""The three programs run on crafted frames with BPF_PROG_TEST_RUN (no interface, no namespace): the
ingress parser drops every malformed variant with the right reason and passes good and non-MRC frames;
host_egress pushes exactly the outer header the path map says; switch_port trims to the end of MXH and
fixes all three lengths."""

from __future__ import annotations

import contextlib
import ctypes as ct
import ipaddress
import struct
from collections.abc import Callable, Iterator

import pytest

from mrc import wire
from mrc.dataplane import abi, bpfsys, counters
from mrc.dataplane.bpf import Program, netns_cookie
from mrc.wire import ip

pytestmark = [pytest.mark.root(reason="loads eBPF programs, builds namespaces"), pytest.mark.bpf]

XDP_DROP, XDP_PASS = 1, 2
TC_ACT_OK, TC_ACT_SHOT, TC_ACT_REDIRECT = 0, 2, 7
PORT_MAC = "02:aa:00:00:00:01"
PEER_MAC = "02:aa:00:00:00:02"
SRC = ipaddress.IPv6Address("fd00::1")
DST = ipaddress.IPv6Address("fd00:0:0:1::1")
OUTER_SRC = ipaddress.IPv6Address("fc00:0:1300:1100::1")
CONTAINER = ipaddress.IPv6Address("fcbb:bbbb:100:200:101:301::")
CTX = wire.IcrcContext(SRC.packed, DST.packed)


def mrc_write(ev: int = 3, payload: bytes = b"p" * 100, dqpn: int = 5, imm: int | None = None,
              flags: int = 0) -> bytes:
    buf = bytearray(9000)
    n = wire.build_write(buf, CTX, dqpn=dqpn, psn=1, ev_index=ev, va=0x1000, rkey=7, payload=payload,
                         imm=imm, flags=flags)
    return bytes(buf[:n])


def inner(mrc: bytes, ev: int = 3) -> bytes:
    return ip.ipv6_udp(SRC.packed, DST.packed, wire.ev_sport(ev), mrc, traffic_class=ip.ECN_ECT0)


def fabric_frame(mrc: bytes, ev: int = 3, ecn: int = ip.ECN_ECT0) -> bytes:
    return ip.ether(PORT_MAC, PEER_MAC, ip.encap(inner(mrc, ev), OUTER_SRC.packed, CONTAINER.packed, ev,
                                                  ecn=ecn))


def patch(frame: bytes, off: int, fmt: str, value: int) -> bytes:
    b = bytearray(frame)
    struct.pack_into(fmt, b, off, value)
    return bytes(b)


# offsets in a fabric frame
OUTER, INNER, UDP = 14, 54, 94
BTH = UDP + 8


def _reth_mxh(frame: bytes) -> int:
    return BTH + 12 + 16


# ------------------------------------------------------------------------------------------- ingress


@pytest.fixture(scope="module")
def ingress(programs: dict[str, Program]) -> Program:
    prog = programs["host_ingress"]
    pid = prog.allocate_id("port", "offline/in")
    hid = prog.allocate_id("host", "offline/in")
    prog.maps["mrc_in_ports"].set(abi.mac_key(PORT_MAC),
                                  abi.InPort(port_id=pid, host_id=hid, plane=0, flags=0))
    return prog


def drops(prog: Program) -> dict[str, int]:
    pid = prog.record["ids"]["port"]["offline/in"]
    out = {}
    for r in abi.DropReason:
        out[r.label] = prog.maps["mrc_ingress_drops"].total(ct.c_uint32(pid * abi.DROP_MAX + r)).packets
    return out


GOOD = fabric_frame(mrc_write())
LAYERS = {"outer": OUTER, "inner": INNER, "udp": UDP, "bth": BTH, "reth": BTH + 12, "mxh": BTH + 28,
          "payload": BTH + 28 + 24, "mid-payload": BTH + 28 + 24 + 50}


def _cut(o: int) -> Callable[[], bytes]:
    """The good frame cut one byte into the header that starts at `o`."""
    return lambda: GOOD[: o + 1]


MALFORMED: dict[str, tuple[Callable[[], bytes], str]] = {
    **{f"cut before {name}": (_cut(o), "truncated") for name, o in LAYERS.items() if o > OUTER},
    "outer payload length too small": (lambda: patch(GOOD, OUTER + 4, "!H", len(GOOD) - 62), "bad_length"),
    "inner payload length wrong": (lambda: patch(GOOD, INNER + 4, "!H", len(GOOD) - 94 - 4), "bad_length"),
    "UDP length wrong": (lambda: patch(GOOD, UDP + 4, "!H", len(GOOD) - 94 - 4), "bad_length"),
    "DMA length disagrees": (lambda: patch(GOOD, BTH + 12 + 12, "!I", 99), "bad_length"),
    "MXH version 2": (lambda: patch(GOOD, _reth_mxh(GOOD), "!B", 2), "bad_version"),
    "BTH TVer 1": (lambda: patch(GOOD, BTH + 1, "!B", 0x01), "bad_version"),
    "unknown opcode": (lambda: patch(GOOD, BTH, "!B", 0x04), "bad_opcode"),
    "inner IP version 4": (lambda: patch(GOOD, INNER, "!B", 0x40), "bad_ip"),
    "outer IP version 5": (lambda: patch(GOOD, OUTER, "!B", 0x50), "bad_ip"),
    "trimmed flag on a full packet": (lambda: patch(GOOD, _reth_mxh(GOOD) + 1, "!B", 0x01), "bad_length"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_ingress_drops_malformed_with_reason(ingress: Program, case: str) -> None:
    make, reason = MALFORMED[case]
    frame = make()
    before = drops(ingress)
    rc, _out, _ = bpfsys.test_run(ingress.prog_fd, frame)
    after = drops(ingress)
    assert rc == XDP_DROP, case
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {reason: 1}


def test_cuts_land_where_intended() -> None:
    """The truncation cases above cut inside the header they name (the frame is long enough to hold the
    previous ones)."""
    assert len(GOOD) > LAYERS["mid-payload"]


@pytest.mark.parametrize("kind", ["write", "write_imm", "trimmed", "sack"])
def test_ingress_passes_good_and_counts(ingress: Program, kind: str) -> None:
    if kind == "write":
        frame = GOOD
    elif kind == "write_imm":
        frame = fabric_frame(mrc_write(imm=0xABCD, payload=b"q" * 33))
    elif kind == "trimmed":
        buf = bytearray(mrc_write())
        n = wire.trim_in_place(buf, len(buf))
        frame = fabric_frame(bytes(buf[:n]), ecn=ip.ECN_CE)
    else:
        buf = bytearray(256)
        n = wire.build_sack(buf, CTX, dqpn=5, psn=1, ev_index=3, cum_psn=1, bitmap=1, echo_ev_index=2,
                            echo_timestamp_ns=7)
        frame = fabric_frame(bytes(buf[:n]))
    before = drops(ingress)
    rc, out, _ = bpfsys.test_run(ingress.prog_fd, frame)
    assert rc == XDP_PASS
    assert drops(ingress) == before
    if kind == "trimmed":  # RFC 6040: the outer CE reaches the ECT(0) inner header
        assert (out[INNER + 1] >> 4) & 3 == ip.ECN_CE
        assert wire.parse(ip.split_ether(out).mrc).trimmed
    else:
        assert out == frame


def test_ingress_leaves_non_mrc_alone(ingress: Program) -> None:
    icmp = ip.ether(PORT_MAC, PEER_MAC, ip.encap(
        ip.pack_ipv6(SRC.packed, DST.packed, 8, 58) + bytes(8), OUTER_SRC.packed, CONTAINER.packed, 0))
    other_port = patch(GOOD, UDP + 2, "!H", 4792)
    arp = bytes.fromhex(PORT_MAC.replace(":", "")) + bytes(6) + b"\x08\x06" + bytes(28)
    before = drops(ingress)
    for frame in (icmp, other_port, arp):
        rc, out, _ = bpfsys.test_run(ingress.prog_fd, frame)
        assert rc == XDP_PASS and out == frame
    assert drops(ingress) == before


def test_ingress_decap_and_qp_filter(ingress: Program) -> None:
    m = ingress.maps["mrc_in_ports"]
    key = abi.mac_key(PORT_MAC)
    orig = m.get(key)
    try:
        v = m.get(key)
        v.flags = int(abi.PortFlag.XDP_DECAP | abi.PortFlag.QP_FILTER)
        m.set(key, v)
        ingress.maps["mrc_allowed_qps"].set(abi.QpKey(v.host_id, 5), ct.c_uint32(1))
        rc, out, _ = bpfsys.test_run(ingress.prog_fd, GOOD)
        assert rc == XDP_PASS
        assert out == GOOD[:14] + GOOD[54:]  # the outer IPv6 header is gone, the rest unchanged
        before = drops(ingress)
        rc, _o, _ = bpfsys.test_run(ingress.prog_fd, fabric_frame(mrc_write(dqpn=77)))
        assert rc == XDP_DROP
        assert drops(ingress)["foreign_qpn"] == before["foreign_qpn"] + 1
    finally:
        m.set(key, orig)


def _with_ext(frame: bytes, at: int, nh_off: int, ext: int) -> bytes:
    """`frame` with an 8-byte IPv6 extension header of type `ext` (six Pad1 options, or a fragment
    header) inserted at byte `at`, right after the IPv6 header whose next-header byte is at `nh_off`;
    the payload lengths of the IPv6 headers before it grow by 8."""
    b = bytearray(frame)
    nxt = b[nh_off]
    b[nh_off] = ext
    for o in (OUTER, INNER):
        if o < at:
            struct.pack_into("!H", b, o + 4, struct.unpack_from("!H", b, o + 4)[0] + 8)
    return bytes(b[:at]) + bytes([nxt, 0]) + bytes(6) + bytes(b[at:])


@contextlib.contextmanager
def _qp_filter(ingress: Program) -> Iterator[None]:
    """The test port with its QP filter on (a foreign QPN is dropped), as it was afterwards."""
    m = ingress.maps["mrc_in_ports"]
    key = abi.mac_key(PORT_MAC)
    orig = m.get(key)
    try:
        v = m.get(key)
        v.flags = int(abi.PortFlag.QP_FILTER)
        m.set(key, v)
        yield
    finally:
        m.set(key, orig)


def test_ingress_drops_tunnels_behind_extension_headers(ingress: Program) -> None:
    """A hop-by-hop, routing, fragment or destination-options header between the outer and the inner
    IPv6 header (or before the inner UDP 4791) used to make the program pass the frame unchecked, QP
    filter included, while End.DT6 would still decapsulate it into the MRC socket. MRC's fabric sends
    no extension headers: such a tunnel is dropped as bad_ip. Non-tunnel traffic with one (MLD's
    hop-by-hop before ICMPv6) still passes."""
    with _qp_filter(ingress):
        foreign = fabric_frame(mrc_write(dqpn=77))
        assert bpfsys.test_run(ingress.prog_fd, foreign)[0] == XDP_DROP
        for ext in (0, 43, 44, 60):
            for at, nh_off in ((INNER, OUTER + 6), (UDP, INNER + 6)):
                before = drops(ingress)["bad_ip"]
                rc, _o, _ = bpfsys.test_run(ingress.prog_fd, _with_ext(foreign, at, nh_off, ext))
                assert rc == XDP_DROP, (ext, at)
                assert drops(ingress)["bad_ip"] == before + 1, (ext, at)
        # six headers in a row (more than a parser steps over) hide nothing either
        deep = foreign
        for _ in range(6):
            deep = _with_ext(deep, INNER, OUTER + 6, 60)
        assert bpfsys.test_run(ingress.prog_fd, deep)[0] == XDP_DROP
        mld = ip.ether(PORT_MAC, PEER_MAC, ip.pack_ipv6(SRC.packed, DST.packed, 8 + 8, 0)
                       + bytes([58, 0]) + bytes(6) + bytes(8))
        before_all = drops(ingress)
        rc, out, _ = bpfsys.test_run(ingress.prog_fd, mld)
        assert rc == XDP_PASS and out == mld and drops(ingress) == before_all


def _delta(prog: Program, before: dict[str, int]) -> dict[str, int]:
    after = drops(prog)
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


def _tagged(frame: bytes, *tags: tuple[int, int]) -> bytes:
    """`frame` with VLAN tags (TPID, VID) inserted after its MAC addresses, outermost first."""
    return frame[:12] + b"".join(struct.pack("!HH", tpid, vid) for tpid, vid in tags) + frame[12:]


def test_ingress_checks_tagged_frames(ingress: Program) -> None:
    """A priority-tagged frame (802.1Q, VID 0) used to pass unchecked (only ethertype 0x86DD was
    looked at) while the stack strips the tag and End.DT6 delivers the packet to the MRC socket: a
    foreign QPN reached the engine past the QP filter. Up to four tags are stepped over, whatever their
    VID (a VLAN device on a real host takes tagged MRC too), and the packet meets every check; a deeper
    stack is dropped as bad_ip; a tagged frame keeps its tunnel (End.DT6 takes it off)."""
    with _qp_filter(ingress):
        ingress.maps["mrc_allowed_qps"].set(abi.QpKey(ingress.maps["mrc_in_ports"].get(
            abi.mac_key(PORT_MAC)).host_id, 5), ct.c_uint32(1))
        foreign = fabric_frame(mrc_write(dqpn=77))
        bad = patch(GOOD, _reth_mxh(GOOD), "!B", 2)
        for tags in (((0x8100, 0),), ((0x8100, 5),), ((0x88A8, 7), (0x8100, 0)),
                     ((0x8100, 0),) * 4):
            before = drops(ingress)
            assert bpfsys.test_run(ingress.prog_fd, _tagged(foreign, *tags))[0] == XDP_DROP, tags
            assert _delta(ingress, before) == {"foreign_qpn": 1}, tags
            before = drops(ingress)
            assert bpfsys.test_run(ingress.prog_fd, _tagged(bad, *tags))[0] == XDP_DROP, tags
            assert _delta(ingress, before) == {"bad_version": 1}, tags
            before = drops(ingress)
            assert bpfsys.test_run(ingress.prog_fd, _tagged(GOOD[: UDP + 20], *tags))[0] == XDP_DROP
            assert _delta(ingress, before) == {"truncated": 1}, tags
        before = drops(ingress)
        assert bpfsys.test_run(ingress.prog_fd, _tagged(GOOD, *((0x8100, 0),) * 5))[0] == XDP_DROP
        assert _delta(ingress, before) == {"bad_ip": 1}
        m = ingress.maps["mrc_in_ports"]
        v = m.get(abi.mac_key(PORT_MAC))
        v.flags = int(abi.PortFlag.XDP_DECAP | abi.PortFlag.QP_FILTER)
        m.set(abi.mac_key(PORT_MAC), v)
        good = _tagged(GOOD, (0x8100, 0))
        rc, out, _ = bpfsys.test_run(ingress.prog_fd, good)
        assert rc == XDP_PASS and out == good
        arp = _tagged(bytes.fromhex(PORT_MAC.replace(":", "")) + bytes(6) + b"\x08\x06" + bytes(28),
                      (0x8100, 0))
        before = drops(ingress)
        rc, out, _ = bpfsys.test_run(ingress.prog_fd, arp)
        assert rc == XDP_PASS and out == arp and drops(ingress) == before


def plain_frame(mrc: bytes, ev: int = 3) -> bytes:
    """MRC in plain IPv6/UDP (no tunnel) to the port's MAC."""
    return ip.ether(PORT_MAC, PEER_MAC, inner(mrc, ev))


def test_ingress_checks_mrc_that_is_not_tunnelled(ingress: Program) -> None:
    """UDP 4791 straight to a host (no IPv6-in-IPv6) is not how its fabric sends MRC, but addressed to
    the MRC address it reaches the socket: it used to pass unchecked, QP filter included. It is checked
    as MRC with its one IPv6 header, and not decapsulated."""
    with _qp_filter(ingress):
        m = ingress.maps["mrc_in_ports"]
        v = m.get(abi.mac_key(PORT_MAC))
        ingress.maps["mrc_allowed_qps"].set(abi.QpKey(v.host_id, 5), ct.c_uint32(1))
        v.flags = int(abi.PortFlag.XDP_DECAP | abi.PortFlag.QP_FILTER)
        m.set(abi.mac_key(PORT_MAC), v)
        good = plain_frame(mrc_write())
        rc, out, _ = bpfsys.test_run(ingress.prog_fd, good)
        assert rc == XDP_PASS and out == good
        udp = OUTER + 40
        cases = {
            "foreign_qpn": plain_frame(mrc_write(dqpn=77)),
            "bad_version": patch(good, udp + 8 + 1, "!B", 0x01),
            "bad_opcode": patch(good, udp + 8, "!B", 0x04),
            "bad_length": patch(good, udp + 4, "!H", len(good) - udp - 4),
            "truncated": good[: udp + 8 + 20],
            "bad_ip": _with_ext(good, udp, OUTER + 6, 60),
        }
        for reason, frame in cases.items():
            before = drops(ingress)
            assert bpfsys.test_run(ingress.prog_fd, frame)[0] == XDP_DROP, reason
            assert _delta(ingress, before) == {reason: 1}, reason
        # other UDP, and ICMPv6, still pass
        for frame in (patch(good, udp + 2, "!H", 4792),
                      ip.ether(PORT_MAC, PEER_MAC, ip.pack_ipv6(SRC.packed, DST.packed, 8, 58) + bytes(8))):
            before = drops(ingress)
            rc, out, _ = bpfsys.test_run(ingress.prog_fd, frame)
            assert rc == XDP_PASS and out == frame and drops(ingress) == before


def test_ingress_drops_a_chain_beyond_the_linear_data(ingress: Program) -> None:
    """Destination options of 2 KiB each, three of them before the inner header: the chain leaves the
    frame's linear part (the rest is in fragments), where the parser used to give up and pass the frame,
    unchecked, to End.DT6 and the MRC socket. Kilobytes of options are nothing legitimate: bad_ip."""
    def big_opts(frame: bytes, at: int, nh_off: int) -> bytes:
        b = bytearray(frame)
        nxt = b[nh_off]
        b[nh_off] = 60
        for o in (OUTER, INNER):
            if o < at:
                struct.pack_into("!H", b, o + 4, struct.unpack_from("!H", b, o + 4)[0] + 2048)
        return bytes(b[:at]) + bytes([nxt, 255]) + bytes(2046) + bytes(b[at:])

    with _qp_filter(ingress):
        for at, nh_off in ((INNER, OUTER + 6), (UDP, INNER + 6)):
            frame = fabric_frame(mrc_write(dqpn=77))
            for _ in range(3):
                frame = big_opts(frame, at, nh_off)
            before = drops(ingress)
            assert bpfsys.test_run(ingress.prog_fd, frame)[0] == XDP_DROP, at
            assert _delta(ingress, before) == {"bad_ip": 1}, at


def test_ingress_drops_mrc_for_a_mac_no_port_has(ingress: Program) -> None:
    """The port is found by the frame's destination MAC. MRC to a MAC no port has (broadcast, multicast,
    a stale or foreign unicast) used to be checked as port id 0 with no flags and passed: past the
    port's QP filter (the stack takes a group-addressed frame, End.DT6 delivers it to the socket), its
    drops in a row nothing read. It is dropped as bad_ip under port id 0, which
    `counters.unknown_port_rx_drops` reads; the port's own row does not move. Other traffic to such a
    MAC (neighbour discovery) still passes."""
    with _qp_filter(ingress):
        foreign = fabric_frame(mrc_write(dqpn=77))
        assert bpfsys.test_run(ingress.prog_fd, foreign)[0] == XDP_DROP  # the port's filter works
        for mac in ("ff:ff:ff:ff:ff:ff", "33:33:00:00:00:01", "02:aa:00:00:00:99"):
            for frame in (foreign, GOOD, patch(GOOD, _reth_mxh(GOOD), "!B", 2)):
                to_mac = ip.mac6(mac) + frame[6:]
                before, before0 = drops(ingress), counters.unknown_port_rx_drops(ingress)
                rc, _o, _ = bpfsys.test_run(ingress.prog_fd, to_mac)
                assert rc == XDP_DROP, mac
                assert drops(ingress) == before, mac
                after0 = counters.unknown_port_rx_drops(ingress)
                assert {k: after0[k] - before0.get(k, 0) for k in after0
                        if after0[k] != before0.get(k, 0)} == {"bad_ip": 1}, mac
        nd = ip.ether("33:33:ff:00:00:01", PEER_MAC, ip.pack_ipv6(SRC.packed, DST.packed, 8, 58) + bytes(8))
        before0 = counters.unknown_port_rx_drops(ingress)
        rc, out, _ = bpfsys.test_run(ingress.prog_fd, nd)
        assert rc == XDP_PASS and out == nd and counters.unknown_port_rx_drops(ingress) == before0


# -------------------------------------------------------------------------------------------- egress


def test_egress_pushes_outer_header_and_redirects(programs: dict[str, Program]) -> None:
    prog = programs["host_egress"]
    cookie = netns_cookie(None)  # test runs happen in this process's namespace
    hid = prog.allocate_id("host", "offline/eg")
    pid = prog.allocate_id("port", "offline/eg")
    prog.maps["mrc_hosts"].set(ct.c_uint64(cookie), ct.c_uint32(hid))
    key = abi.PathKey(netns_cookie=cookie, ev_index=9)
    key.dst[:] = list(DST.packed)
    e = abi.PathEntry(ifindex=1, port_id=pid, plane=1)
    e.smac[:] = list(bytes.fromhex("020000000001"))
    e.dmac[:] = list(bytes.fromhex("020000000002"))
    e.src[:] = list(OUTER_SRC.packed)
    e.container[:] = list(CONTAINER.packed)
    prog.maps["mrc_paths"].set(key, e)
    try:
        mrc = mrc_write(ev=9)
        plain = ip.ether("00:00:00:00:00:00", "00:00:00:00:00:00",
                         ip.ipv6_udp(SRC.packed, DST.packed, 40000, mrc))
        tx0 = prog.maps["mrc_egress_tx"].total(ct.c_uint32(pid)).packets
        rc, out, _ = bpfsys.test_run(prog.prog_fd, plain)
        assert rc == TC_ACT_REDIRECT
        assert out[:6] == bytes.fromhex("020000000002") and out[6:12] == bytes.fromhex("020000000001")
        f = ip.split_ether(out)
        assert f.outer is not None
        assert f.outer.dst == CONTAINER.packed and f.outer.src == OUTER_SRC.packed
        assert f.outer.flow_label == 9 and f.outer.ecn == ip.ECN_ECT0 and f.outer.next_header == 41
        assert f.outer.payload_len == len(plain) - 14
        assert f.sport == 0xC000 | 9  # the fabric source port, which the ICRC covers
        assert wire.parse(f.mrc, CTX, f.sport).icrc == "ok"
        assert prog.maps["mrc_egress_tx"].total(ct.c_uint32(pid)).packets == tx0 + 1
        # unknown EV: counted, dropped, never sent plain
        d = prog.maps["mrc_egress_drops"]
        row = ct.c_uint32(hid * abi.DROP_MAX + abi.DropReason.NO_PATH)
        n0 = d.total(row).packets
        other = ip.ether("00:00:00:00:00:00", "00:00:00:00:00:00",
                         ip.ipv6_udp(SRC.packed, DST.packed, 40000, mrc_write(ev=10)))
        assert bpfsys.test_run(prog.prog_fd, other)[0] == TC_ACT_SHOT
        assert d.total(row).packets == n0 + 1
        # an EV index wider than 14 bits has no path (it used to alias EV 9's and go out on it)
        wide = patch(plain, 14 + 40 + 8 + 12 + 16 + 2, "!H", 0x4000 | 9)
        assert bpfsys.test_run(prog.prog_fd, wide)[0] == TC_ACT_SHOT
        assert d.total(row).packets == n0 + 2
        # not MRC: untouched
        dns = ip.ether("00:00:00:00:00:00", "00:00:00:00:00:00",
                       ip.ipv6_udp(SRC.packed, DST.packed, 40000, b"x" * 20, dport=53))
        rc, out, _ = bpfsys.test_run(prog.prog_fd, dns)
        assert rc == TC_ACT_OK and out == dns
    finally:
        prog.maps["mrc_paths"].delete(key)
        prog.maps["mrc_hosts"].delete(ct.c_uint64(cookie))


def _plain(mrc: bytes) -> bytes:
    """An MRC datagram as the engine's socket hands it to mrc0 (lengths from `mrc`)."""
    return ip.ether("00:00:00:00:00:00", "00:00:00:00:00:00", ip.ipv6_udp(SRC.packed, DST.packed, 40000, mrc))


def _sack(ev: int) -> bytes:
    buf = bytearray(256)
    n = wire.build_sack(buf, CTX, dqpn=5, psn=1, ev_index=ev, cum_psn=1, bitmap=1, echo_ev_index=2,
                        echo_timestamp_ns=7)
    return bytes(buf[:n])


PLAIN_UDP = 14 + 40
EV_SHORT = 12


def _write_plain() -> bytes:
    return _plain(mrc_write(ev=EV_SHORT))


def _lengths(frame: bytes, ip_plen: int, udp_len: int) -> bytes:
    """`frame` with its IPv6 payload length and UDP length replaced."""
    return patch(patch(frame, 14 + 4, "!H", ip_plen), PLAIN_UDP + 4, "!H", udp_len)


GOOD_PLAIN: dict[str, Callable[[], bytes]] = {
    "write": _write_plain,
    "write_imm": lambda: _plain(mrc_write(ev=EV_SHORT, imm=0x77, payload=b"q" * 33)),
    "empty write": lambda: _plain(mrc_write(ev=EV_SHORT, payload=b"")),
    "sack": lambda: _plain(_sack(EV_SHORT)),
}
SHORT_PLAIN: dict[str, Callable[[], bytes]] = {
    # lengths that agree with the packet, but a datagram shorter than what its headers announce
    "write cut after MXH": lambda: _plain(mrc_write(ev=EV_SHORT)[:12 + 16 + 24]),
    "write_imm cut after MXH": lambda: _plain(mrc_write(ev=EV_SHORT, imm=1)[:12 + 20 + 24]),
    "write payload shorter than its DMA length": lambda: _plain(mrc_write(ev=EV_SHORT)[:-4 - 50]),
    "write without its ICRC": lambda: _plain(mrc_write(ev=EV_SHORT)[:-4]),
    "control cut after MXH": lambda: _plain(_sack(EV_SHORT)[:12 + 24]),
    "control MXH and 3 bytes": lambda: _plain(_sack(EV_SHORT)[:12 + 24 + 3]),
    # length fields that say more than the packet holds
    "IPv6 payload length beyond the packet": lambda: _write_plain()[:-10],
    "UDP length beyond the IPv6 payload": lambda: patch(_write_plain(), PLAIN_UDP + 4, "!H",
                                                        len(_write_plain()) - PLAIN_UDP + 8),
    # length fields that end the datagram before the headers the program routes on
    "datagram ends before MXH": lambda: _lengths(_write_plain(), 8 + 12, 8 + 12),
    "empty UDP datagram, MRC bytes after it": lambda: _lengths(_write_plain(), 8, 8),
}


@pytest.fixture()
def egress_path(programs: dict[str, Program]) -> Iterator[tuple[Program, int, int]]:
    """host_egress with a host id for this namespace and a path for (DST, EV_SHORT): (program, host id,
    port id)."""
    prog = programs["host_egress"]
    cookie = netns_cookie(None)
    hid = prog.allocate_id("host", "offline/eg-short")
    pid = prog.allocate_id("port", "offline/eg-short")
    prog.maps["mrc_hosts"].set(ct.c_uint64(cookie), ct.c_uint32(hid))
    key = abi.PathKey(netns_cookie=cookie, ev_index=EV_SHORT)
    key.dst[:] = list(DST.packed)
    e = abi.PathEntry(ifindex=1, port_id=pid, plane=1)
    e.src[:] = list(OUTER_SRC.packed)
    e.container[:] = list(CONTAINER.packed)
    prog.maps["mrc_paths"].set(key, e)
    try:
        yield prog, hid, pid
    finally:
        prog.maps["mrc_paths"].delete(key)
        prog.maps["mrc_hosts"].delete(ct.c_uint64(cookie))


def _egress_drops(prog: Program, hid: int) -> dict[str, int]:
    return {r.label: prog.maps["mrc_egress_drops"].total(ct.c_uint32(hid * abi.DROP_MAX + r)).packets
            for r in abi.DropReason}


@pytest.mark.parametrize("case", list(GOOD_PLAIN))
def test_egress_sends_whole_packets(egress_path: tuple[Program, int, int], case: str) -> None:
    prog, hid, pid = egress_path
    before = _egress_drops(prog, hid)
    tx0 = prog.maps["mrc_egress_tx"].total(ct.c_uint32(pid)).packets
    assert bpfsys.test_run(prog.prog_fd, GOOD_PLAIN[case]())[0] == TC_ACT_REDIRECT
    assert _egress_drops(prog, hid) == before
    assert prog.maps["mrc_egress_tx"].total(ct.c_uint32(pid)).packets == tx0 + 1


@pytest.mark.parametrize("case", list(SHORT_PLAIN))
def test_egress_drops_short_packets_as_truncated(egress_path: tuple[Program, int, int], case: str) -> None:
    """host_egress checked the headers it reads against the linear data only, never against the
    datagram's own lengths: a datagram shorter than its MRC headers, its payload (RETH's DMA length)
    and ICRC, or whose IPv6/UDP length says more than the packet holds, was encapsulated and sent onto
    the fabric (routed on an EV index that could lie past the datagram's end) for every receiver to
    drop. It is now dropped before it leaves, counted `truncated`."""
    prog, hid, pid = egress_path
    frame = SHORT_PLAIN[case]()
    before = _egress_drops(prog, hid)
    tx0 = prog.maps["mrc_egress_tx"].total(ct.c_uint32(pid)).packets
    rc, _out, _ = bpfsys.test_run(prog.prog_fd, frame)
    after = _egress_drops(prog, hid)
    assert rc == TC_ACT_SHOT, case
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"truncated": 1}
    assert prog.maps["mrc_egress_tx"].total(ct.c_uint32(pid)).packets == tx0


# -------------------------------------------------------------------------------------------- switch


def test_switch_trims_to_mxh_and_fixes_lengths(programs: dict[str, Program]) -> None:
    prog = programs["switch_port"]
    pid = prog.allocate_id("port", "offline/sw")
    key = abi.mac_key(PEER_MAC)  # the frames' source: the port that sends them
    cfg = abi.SwPort(port_id=pid, rate_bps=8, ecn_k=1000, trim_t=10000, buffer=10**6)
    prog.maps["mrc_sw_ports"].set(key, cfg)
    try:
        for imm in (None, 0x55):
            mrc = mrc_write(imm=imm, payload=b"z" * 3000)  # skb test runs take at most a page
            frame = fabric_frame(mrc)
            prog.maps["mrc_sw_vq"].set(ct.c_uint32(pid), abi.Vq(last_ns=2**63, backlog=20000))
            rc, out, _ = bpfsys.test_run(prog.prog_fd, frame)
            assert rc == TC_ACT_OK
            hl = wire.header_len(mrc[0])
            assert len(out) == 14 + 40 + 40 + 8 + hl
            f = ip.split_ether(out)  # checks outer, inner and UDP lengths against the frame
            assert f.outer is not None and f.outer.payload_len == len(out) - 54
            p = wire.parse(f.mrc)
            assert p.trimmed and p.flags & wire.MxhFlag.PRIO and p.dma_len == 3000 and p.imm == imm
            assert out[:UDP + 6] == patch(patch(patch(frame, OUTER + 4, "!H", len(out) - 54), INNER + 4, "!H",
                                                len(out) - 94), UDP + 4, "!H", len(out) - 94)[:UDP + 6]
        # between K and T: ECN-CE on the outer header, nothing cut
        prog.maps["mrc_sw_vq"].set(ct.c_uint32(pid), abi.Vq(last_ns=2**63, backlog=5000))
        frame = fabric_frame(mrc_write())
        rc, out, _ = bpfsys.test_run(prog.prog_fd, frame)
        assert rc == TC_ACT_OK and len(out) == len(frame) and (out[OUTER + 1] >> 4) & 3 == ip.ECN_CE
        # beyond the buffer even when trimmed: dropped
        prog.maps["mrc_sw_vq"].set(ct.c_uint32(pid), abi.Vq(last_ns=2**63, backlog=10**6))
        assert bpfsys.test_run(prog.prog_fd, frame)[0] == TC_ACT_SHOT
        acts = {a.label: prog.maps["mrc_sw_actions"].total(ct.c_uint32(pid * abi.SW_ACT_MAX + a)).packets
                for a in abi.SwitchAction}
        assert acts == {"forward": 0, "ecn_mark": 1, "trim": 2, "drop_buffer": 1, "drop_fault": 0,
                        "drop_blackhole": 0}
    finally:
        prog.maps["mrc_sw_ports"].delete(key)


def _mxh(frame: bytes) -> int:
    """Where MXH starts in a fabric frame (after RETH, or RETH and ImmDt)."""
    return BTH + wire.header_len(frame[BTH]) - 24


VERSIONS: dict[str, Callable[[bytes], bytes]] = {
    "MXH version 2": lambda f: patch(f, _mxh(f), "!B", 2),
    "MXH version 0": lambda f: patch(f, _mxh(f), "!B", 0),
    "BTH TVer 1": lambda f: patch(f, BTH + 1, "!B", f[BTH + 1] | 0x01),
    "inner IP version 4": lambda f: patch(f, INNER, "!B", 0x40 | (f[INNER] & 0x0F)),
    "outer IP version 5": lambda f: patch(f, OUTER, "!B", 0x50 | (f[OUTER] & 0x0F)),
}


@pytest.mark.parametrize("case", list(VERSIONS))
def test_switch_never_trims_another_version(programs: dict[str, Program], case: str) -> None:
    """switch_port cut any WRITE to the end of a version-1 MXH and set version 1's TRIMMED and PRIO
    bits, whatever its BTH TVer, MXH version or IP versions: a header of another version was cut and
    rewritten as if it were MRC's (and counted a trim the receiver never saw). Such a packet is not
    trimmed: it is forwarded untouched like any other traffic (the receiver's host_ingress drops it as
    bad_version / bad_ip, counted); a switch counts actions, not drop reasons."""
    prog = programs["switch_port"]
    pid = prog.allocate_id("port", "offline/sw-ver")
    key = abi.mac_key(PEER_MAC)
    prog.maps["mrc_sw_ports"].set(key, abi.SwPort(port_id=pid, rate_bps=8, ecn_k=1000, trim_t=10000,
                                                  buffer=10**6))
    try:
        def acts() -> dict[str, int]:
            return {a.label: prog.maps["mrc_sw_actions"].total(ct.c_uint32(pid * abi.SW_ACT_MAX + a)).packets
                    for a in abi.SwitchAction}

        for imm in (None, 0x55):
            good = fabric_frame(mrc_write(imm=imm, payload=b"z" * 3000), ecn=ip.ECN_NOT_ECT)
            # above T: the version-1 packet is trimmed ...
            prog.maps["mrc_sw_vq"].set(ct.c_uint32(pid), abi.Vq(last_ns=2**63, backlog=20000))
            before = acts()
            rc, out, _ = bpfsys.test_run(prog.prog_fd, good)
            assert rc == TC_ACT_OK and len(out) < len(good)
            assert acts()["trim"] == before["trim"] + 1
            # ... the same packet of another version, at the same backlog, leaves as it came
            frame = VERSIONS[case](good)
            prog.maps["mrc_sw_vq"].set(ct.c_uint32(pid), abi.Vq(last_ns=2**63, backlog=20000))
            before = acts()
            rc, out, _ = bpfsys.test_run(prog.prog_fd, frame)
            after = acts()
            assert rc == TC_ACT_OK, (case, imm)
            assert out == frame, (case, imm)
            assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"forward": 1}
    finally:
        prog.maps["mrc_sw_ports"].delete(key)
