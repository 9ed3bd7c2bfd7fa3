"""The three programs run on crafted frames with BPF_PROG_TEST_RUN (no interface, no namespace): the
ingress parser drops every malformed variant with the right reason and passes good and non-MRC frames;
host_egress pushes exactly the outer header the path map says; switch_port trims to the end of MXH and
fixes all three lengths."""

from __future__ import annotations

import ctypes as ct
import ipaddress
import struct
from collections.abc import Callable

import pytest

from mrc import wire
from mrc.dataplane import abi, bpfsys
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


def test_ingress_drops_tunnels_behind_extension_headers(ingress: Program) -> None:
    """A hop-by-hop, routing, fragment or destination-options header between the outer and the inner
    IPv6 header (or before the inner UDP 4791) used to make the program pass the frame unchecked, QP
    filter included, while End.DT6 would still decapsulate it into the MRC socket. MRC's fabric sends
    no extension headers: such a tunnel is dropped as bad_ip. Non-tunnel traffic with one (MLD's
    hop-by-hop before ICMPv6) still passes."""
    m = ingress.maps["mrc_in_ports"]
    key = abi.mac_key(PORT_MAC)
    orig = m.get(key)
    try:
        v = m.get(key)
        v.flags = int(abi.PortFlag.QP_FILTER)
        m.set(key, v)
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
    finally:
        m.set(key, orig)


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
