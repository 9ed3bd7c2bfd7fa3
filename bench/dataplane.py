#!/usr/bin/env python3
"""The eBPF dataplane's cost, measured: packets per second from a socket in host a through one switch to
a socket in host b, with and without the programs, in the same run; and the kernel's End.DT6 against
decapsulation in XDP. Needs root (namespaces, BPF).

Usage: ``sudo .venv/bin/python bench/dataplane.py [--seconds S] [--rounds R] [--payload B] [-j]``

Setup: a one-plane testbed with one leaf and two hosts (a -> leaf -> b: host egress, one switch, host
ingress), links rate-limited at 30 Gbit/s by TBF so that the CPU, not the limit, sets the pace. The sender
(a process in a) blasts RDMA WRITE packets over 16 EVs with sendmmsg (64 per call); the receiver (a
process in b) counts what its socket delivers with recvmmsg. Both are pinned to different CPUs.

Cases (interleaved round by round; each reports the median of its rounds):

* ``kernel``: no programs. The testbed's own route: kernel seg6 encap.red at a, End at the leaf,
  End.DT6 at b.
* ``ebpf``: host_egress on a's mrc0 (encapsulation by EV + redirect), switch_port on every port (virtual
  queue at the link rate: no marks), host_ingress (XDP) at b; End.DT6 decapsulates.
* ``ebpf-xdp-decap``: the same, but host_ingress strips the outer header itself.

``rx_pps`` is what the receiving socket got per second of sending (the goodput in packets), ``tx_pps``
what the sender pushed, ``pkts/cpu-s`` packets delivered per CPU second the sender and receiver used
(user + system, softirq work done in their context included): the measure least disturbed by other
load on a shared machine. ``ratio pps`` / ``ratio cpu``: the median over rounds of that round's ratio to
``kernel`` (noise that hits a whole round cancels). A second table runs each program on one
frame with BPF_PROG_TEST_RUN (1M repeats) and gives ns per packet: the programs' own cost, without the
stack around them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
from typing import Any

SENDER = r"""
import ctypes as ct, os, socket, sys, time
from mrc import wire
from mrc.dataplane import netns, udp
ns, src, dst, seconds, payload = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
os.sched_setaffinity(0, {0})
netns.enter_for_exec(ns)
sk = udp.mrc_socket(None, src)
sk.connect((dst, 4791))
ctx = wire.IcrcContext(socket.inet_pton(socket.AF_INET6, src), socket.inet_pton(socket.AF_INET6, dst))
class iovec(ct.Structure): _fields_ = [("base", ct.c_void_p), ("len", ct.c_size_t)]
class msghdr(ct.Structure): _fields_ = [("name", ct.c_void_p), ("namelen", ct.c_uint32), ("iov", ct.c_void_p),
    ("iovlen", ct.c_size_t), ("control", ct.c_void_p), ("controllen", ct.c_size_t), ("flags", ct.c_int)]
class mmsghdr(ct.Structure): _fields_ = [("hdr", msghdr), ("len", ct.c_uint32)]
B = 64
bufs, iovs, msgs = [], (iovec * B)(), (mmsghdr * B)()
for i in range(B):
    b = bytearray(payload + 100)
    n = wire.build_write(b, ctx, dqpn=5, psn=i, ev_index=i % 16, va=0, rkey=1, payload=bytes(payload))
    cb = ct.create_string_buffer(bytes(b[:n]), n); bufs.append(cb)
    iovs[i].base, iovs[i].len = ct.addressof(cb), n
    msgs[i].hdr.iov, msgs[i].hdr.iovlen = ct.addressof(iovs[i]), 1
libc = ct.CDLL(None, use_errno=True)
import resource
sent, t0 = 0, time.perf_counter()
r0 = resource.getrusage(resource.RUSAGE_SELF)
end = t0 + seconds
while time.perf_counter() < end:
    r = libc.sendmmsg(sk.fileno(), msgs, B, 0)
    if r > 0:
        sent += r
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(sent, time.perf_counter() - t0, cpu, flush=True)
"""

RECEIVER = r"""
import ctypes as ct, os, select, sys, time
from mrc.dataplane import netns, udp
ns, addr = sys.argv[1], sys.argv[2]
os.sched_setaffinity(0, {1 % os.cpu_count()})
netns.enter_for_exec(ns)
sk = udp.mrc_socket(None, addr, rcvbuf=32 << 20)
class iovec(ct.Structure): _fields_ = [("base", ct.c_void_p), ("len", ct.c_size_t)]
class msghdr(ct.Structure): _fields_ = [("name", ct.c_void_p), ("namelen", ct.c_uint32), ("iov", ct.c_void_p),
    ("iovlen", ct.c_size_t), ("control", ct.c_void_p), ("controllen", ct.c_size_t), ("flags", ct.c_int)]
class mmsghdr(ct.Structure): _fields_ = [("hdr", msghdr), ("len", ct.c_uint32)]
B = 64
bufs = [ct.create_string_buffer(9216) for _ in range(B)]
iovs, msgs = (iovec * B)(), (mmsghdr * B)()
for i in range(B):
    iovs[i].base, iovs[i].len = ct.addressof(bufs[i]), 9216
    msgs[i].hdr.iov, msgs[i].hdr.iovlen = ct.addressof(iovs[i]), 1
libc = ct.CDLL(None, use_errno=True)
import resource
print("ready", flush=True)
got, first, last = 0, None, None
r0 = resource.getrusage(resource.RUSAGE_SELF)
while True:
    r = libc.recvmmsg(sk.fileno(), msgs, B, 0x40, None)
    if r > 0:
        got += r
        last = time.perf_counter()
        first = first or last
        continue
    if last is not None and time.perf_counter() - last > 0.5:
        break
    if first is None and select.select([sk], [], [], 10)[0] == []:
        break
    select.select([sk], [], [], 0.1)
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(got, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), flush=True)
"""


def run_pair(tbname: str, topo: Any, seconds: float, payload: int) -> dict[str, float]:
    # The sender binds the path address of a -> b: the testbed's kernel route for the baseline is the
    # source-specific one (a lookup from the bare MRC address finds no route there: the kernel's fib6
    # subtrees do not fall back to the plain /128 once source-specific routes exist for it). With the
    # programs, the dport-4791 rule sends it to mrc0 whatever the source.
    src, dst = str(topo.paths("a", "b")[0].path_address), str(topo.mrc_address("b"))
    rx = subprocess.Popen([sys.executable, "-c", RECEIVER, f"{tbname}-b", dst], stdout=subprocess.PIPE,
                          text=True)
    try:
        assert rx.stdout is not None
        assert rx.stdout.readline().strip() == "ready"
        tx = subprocess.run([sys.executable, "-c", SENDER, f"{tbname}-a", src, dst, str(seconds),
                             str(payload)], capture_output=True, text=True, timeout=seconds + 60)
        if tx.returncode != 0:
            raise RuntimeError(tx.stderr)
        sent, elapsed, tx_cpu = tx.stdout.split()
        got_s, rx_cpu = rx.stdout.readline().split()
        got = int(got_s)
    finally:
        with contextlib.suppress(Exception):
            rx.wait(timeout=15)
        if rx.poll() is None:
            rx.kill()
    cpu = float(tx_cpu) + float(rx_cpu)
    return {"tx_pps": int(sent) / float(elapsed), "rx_pps": got / float(elapsed),
            "delivered": got / max(1, int(sent)), "pkts_per_cpu_s": got / cpu if cpu else 0.0}


def prog_test_run(payload: int) -> list[dict[str, Any]]:
    """ns per packet of each program on one frame (BPF_PROG_TEST_RUN), the programs' own cost."""
    import ipaddress

    from mrc import wire
    from mrc.dataplane import abi, bpfsys
    from mrc.dataplane.bpf import netns_cookie, program
    from mrc.wire import ip

    src, dst = ipaddress.IPv6Address("fd00::1"), ipaddress.IPv6Address("fd00:0:0:1::1")
    ctx = wire.IcrcContext(src.packed, dst.packed)
    buf = bytearray(payload + 100)
    n = wire.build_write(buf, ctx, dqpn=5, psn=1, ev_index=3, va=0, rkey=1, payload=bytes(payload))
    inner = ip.ipv6_udp(src.packed, dst.packed, wire.ev_sport(3), bytes(buf[:n]), traffic_class=2)
    mac_a, mac_b = "02:00:00:00:00:01", "02:00:00:00:00:02"
    fabric = ip.ether(mac_a, mac_b, ip.encap(inner, src.packed, dst.packed, 3))
    plain = ip.ether(mac_a, mac_b, inner)
    out = []
    eg, ing, sw = program("host_egress"), program("host_ingress"), program("switch_port")
    cookie = netns_cookie(None)
    key = abi.PathKey(netns_cookie=cookie, ev_index=3)
    key.dst[:] = list(dst.packed)
    eg.maps["mrc_paths"].set(key, abi.PathEntry(ifindex=1, port_id=1))
    ing.maps["mrc_in_ports"].set(abi.mac_key(mac_a), abi.InPort(port_id=1, host_id=1))
    sw.maps["mrc_sw_ports"].set(abi.mac_key(mac_b), abi.SwPort(port_id=1, rate_bps=10**12, ecn_k=10**6,
                                                               trim_t=2 * 10**6, buffer=4 * 10**6))
    cases = [("host_egress (encap + redirect)", eg, plain), ("switch_port (queue, no mark)", sw, fabric),
             ("host_ingress (checks, pass)", ing, fabric)]
    for label, prog, frame in cases:
        if len(frame) > 3500 and prog.spec.hook != "xdp":
            frame = frame[:3500]  # skb test runs take at most a page; the programs read headers only
        _rc, _o, ns = bpfsys.test_run(prog.prog_fd, frame, repeat=1_000_000)
        out.append({"program": label, "ns_per_packet": ns, "mpps": round(1000 / ns, 2) if ns else None})
    v = ing.maps["mrc_in_ports"].get(abi.mac_key(mac_a))
    v.flags = int(abi.PortFlag.XDP_DECAP)
    ing.maps["mrc_in_ports"].set(abi.mac_key(mac_a), v)
    _rc, _o, ns = bpfsys.test_run(ing.prog_fd, fabric, repeat=1_000_000)
    out.append({"program": "host_ingress (checks, XDP decap)", "ns_per_packet": ns,
                "mpps": round(1000 / ns, 2) if ns else None})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--payload", type=int, default=1024)
    ap.add_argument("-j", "--json", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/dataplane.py needs root (namespaces, BPF)", file=sys.stderr)
        return 2
    os.environ.setdefault("MRC_RUN_DIR", tempfile.mkdtemp(prefix="mrc-bench-"))
    os.environ.setdefault("MRC_BPF_PIN_ROOT", f"/sys/fs/bpf/mrc-bench-{secrets.token_hex(4)}")

    from mrc.dataplane import bpf
    from mrc.dataplane import testbed as tb
    from mrc.dataplane.fabric import FabricDataplane
    from mrc.topology import LinkParams, Topology

    topo = Topology(planes=1, leaves=1, spines=0, hosts=(("a", 0), ("b", 0)),
                    link=LinkParams(rate_bps=30_000_000_000, mtu=9000, buffer_bytes=4 << 20))
    name = "b" + secrets.token_hex(4)
    cases = ["kernel", "ebpf", "ebpf-xdp-decap"]
    samples: dict[str, list[dict[str, float]]] = {c: [] for c in cases}
    try:
        tb.up(topo, name=name)
        for r in range(args.rounds):
            for case in cases:
                fd = None
                try:
                    if case != "kernel":
                        fd = FabricDataplane.attach(name, decap="xdp" if case.endswith("decap") else "kernel")
                    s = run_pair(name, topo, args.seconds, args.payload)
                finally:
                    if fd is not None:
                        fd.detach()
                samples[case].append(s)
                if not args.json:
                    print(f"round {r + 1} {case:<15} rx {s['rx_pps'] / 1e3:8.1f} kpps  "
                          f"tx {s['tx_pps'] / 1e3:8.1f} kpps  delivered {s['delivered']:.3f}",
                          file=sys.stderr)
        micro = prog_test_run(args.payload)
    finally:
        bpf.close_all()
        tb.teardown(name)
        bpf.detach_everything()
    keys = ("rx_pps", "tx_pps", "delivered", "pkts_per_cpu_s")
    med = {c: {k: statistics.median(s[k] for s in samples[c]) for k in keys} for c in cases}

    def paired(case: str, ref: str, key: str) -> float:
        """Median over rounds of this round's ratio: noise that hits a whole round cancels."""
        return round(statistics.median(a[key] / b[key] for a, b in zip(samples[case], samples[ref],
                                                                        strict=True)), 3)

    rows = [{"case": c, "rx_pps": round(med[c]["rx_pps"]), "tx_pps": round(med[c]["tx_pps"]),
             "delivered": round(med[c]["delivered"], 3), "pkts_per_cpu_s": round(med[c]["pkts_per_cpu_s"]),
             "ratio_pps": paired(c, "kernel", "rx_pps"), "ratio_cpu": paired(c, "kernel", "pkts_per_cpu_s")}
            for c in cases]
    doc = {"payload": args.payload, "seconds": args.seconds, "rounds": args.rounds, "cpus": os.cpu_count(),
           "kernel": platform.release(), "cases": rows,
           "xdp_decap_vs_end_dt6": {"ratio_pps": paired("ebpf-xdp-decap", "ebpf", "rx_pps"),
                                    "ratio_cpu": paired("ebpf-xdp-decap", "ebpf", "pkts_per_cpu_s")},
           "samples": samples, "prog_test_run": micro}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"one switch, {args.payload}-byte payloads, {args.seconds} s x {args.rounds} rounds, median; "
          f"{os.cpu_count()} CPUs, kernel {platform.release()}")
    print(f"{'case':<16}{'rx_pps':>10}{'tx_pps':>10}{'delivered':>11}{'pkts/cpu-s':>12}{'ratio pps':>11}"
          f"{'ratio cpu':>11}")
    for row in rows:
        print(f"{row['case']:<16}{row['rx_pps']:>10}{row['tx_pps']:>10}{row['delivered']:>11}"
              f"{row['pkts_per_cpu_s']:>12}{row['ratio_pps']:>11}{row['ratio_cpu']:>11}")
    x = doc["xdp_decap_vs_end_dt6"]
    print(f"XDP decap / End.DT6: {x['ratio_pps']} (pps), {x['ratio_cpu']} (packets per CPU second)")
    print(f"\n{'BPF_PROG_TEST_RUN, 1M repeats':<36}{'ns/pkt':>8}{'Mpps':>8}")
    for m in micro:
        print(f"{m['program']:<36}{m['ns_per_packet']:>8}{m['mpps']!s:>8}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
