"""The sender's cost per data packet with and without the send ring (``MRC_TX_RING``), side by side in
one run: two engines with their socket drivers in this process, taking turns (one turn each, in order,
so every mode sees the same run), a WRITE of --size bytes from one to the other over ::1 (no testbed,
no root). Per mode (list: sendto per datagram, the default; batch: sendmmsg copying each datagram,
``MRC_BATCH_IO=1``; ring: sendmmsg from the engine's send ring) it prints the time spent in the
sender's driver turns per data packet (retransmissions included), the goodput and the retransmitted
packets, then the JSON. Modes interleave across --reps, and the table gives medians.

    .venv/bin/python bench/tx_ring.py [--size 64M] [--reps 3] [--rate-gbps 0] [--rtt-us 200]

The receiver is the same in every mode (recvmmsg into the engine's batch receive), so differences are
the sender's. Loopback has no fabric: the figures are the CPU's, not a NIC's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np

from mrc.dataplane.driver import SocketDriver
from mrc.transport import Context, EvProfile, NsccConfig, QpAttr
from mrc.units import parse_size

LO = socket.inet_pton(socket.AF_INET6, "::1")
PLANES = 4


def _sock() -> socket.socket:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.bind(("::1", 0))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
    return s


def _pair(size: int, mtu: int, rtt_ns: int, bdp: int) -> tuple[Any, ...]:
    a = Context(LO, ports=PLANES, seed=1, name="A")
    b = Context(LO, ports=PLANES, seed=2, name="B")
    nscc = NsccConfig.for_path(rtt_ns, bdp, mtu)
    qps = []
    for ctx in (a, b):
        prof = ctx.create_ev_profile(EvProfile.even(1, 128, PLANES))
        ccp = ctx.create_cc_profile(nscc)
        qps.append(ctx.create_qp(ctx.create_cq(), ev_profile=prof, cc_profile=ccp, attr=QpAttr(mtu=mtu)))
    qa, qb = qps
    qa.connect(LO, qb.qpn)
    qb.connect(LO, qa.qpn)
    return a, b, qa, qb


def one(mode: str, size: int, mtu: int, rate_bps: int, rtt_ns: int) -> dict[str, Any]:
    """One WRITE of `size` bytes; the two drivers take turns in this process (a turn each, in order, so
    the run is the same in every mode), and only the sender's turns are timed."""
    bdp = max(4 * mtu, int(rate_bps * PLANES / 8e9 * rtt_ns)) if rate_bps else 4 << 20
    a, b, qa, qb = _pair(size, mtu, rtt_ns, bdp)
    sa, sb = _sock(), _sock()
    src = np.frombuffer(os.urandom(size), np.uint8).copy()
    dst = np.zeros(size, np.uint8)
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qb.post_recv(7)
    rates = [rate_bps] * PLANES if rate_bps else None
    d = SocketDriver(a, sa, batch_io=mode == "batch", tx_ring=mode == "ring", port_rate_bps=rates)
    assert d.tx_ring is (mode == "ring")
    rd = SocketDriver(b, sb, batch_io=True, tx_ring=False)  # the engine's batch receive: a fast peer
    d.dst_port, rd.dst_port = sb.getsockname()[1], sa.getsockname()[1]
    done: list[Any] = []
    got: list[Any] = []
    sender_s = 0.0
    t0 = time.perf_counter()
    clock = time.perf_counter
    qa.post_send(1, smr, 0, size, dmr.addr, dmr.rkey, imm=0x1234)
    deadline = t0 + 120
    while not (done and got) and clock() < deadline:
        c = clock()
        d.turn()
        sender_s += clock() - c
        rd.turn()
        done.extend(qa.send_cq.poll())
        got.extend(qb.recv_cq.poll())
    wall = clock() - t0
    sa.close()
    sb.close()
    st = qa.stats()
    pkts = max(1, int(st["data_tx"]))
    ok = bool(done and got) and done[0].status.name == "SUCCESS" and np.array_equal(src, dst)
    return {"mode": mode, "ok": ok, "sender_us_per_pkt": sender_s / pkts * 1e6,
            "goodput_gbps": size * 8 / wall / 1e9, "tx_packets": pkts, "retx": pkts - -(-size // mtu)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="64M")
    ap.add_argument("--mtu", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rate-gbps", type=float, default=0.0, help="pace each of the 4 ports (0: unpaced)")
    ap.add_argument("--rtt-us", type=float, default=200.0, help="the path's RTT NSCC is configured for")
    ap.add_argument("--modes", default="list,batch,ring")
    args = ap.parse_args()
    size = parse_size(args.size)
    modes = args.modes.split(",")
    runs: list[dict[str, Any]] = []
    for _ in range(args.reps):
        for mode in modes:  # interleaved: a slower stretch of the VM hits every mode alike
            runs.append(one(mode, size, args.mtu, int(args.rate_gbps * 1e9), int(args.rtt_us * 1000)))
    print(f"{'mode':6} {'ok':>5} {'sender us/pkt':>13} {'Gbit/s':>7} {'retx':>6}")
    summary: dict[str, Any] = {}
    for mode in modes:
        rs = [r for r in runs if r["mode"] == mode]
        cpu = statistics.median(r["sender_us_per_pkt"] for r in rs)
        gbps = statistics.median(r["goodput_gbps"] for r in rs)
        retx = statistics.median(r["retx"] for r in rs)
        summary[mode] = {"sender_us_per_pkt": round(cpu, 2), "goodput_gbps": round(gbps, 3), "retx": retx,
                         "ok": all(r["ok"] for r in rs)}
        print(f"{mode:6} {summary[mode]['ok']!s:>5} {cpu:13.2f} {gbps:7.3f} {retx:6.0f}")
    if "list" in summary and "ring" in summary:
        ratio = summary["ring"]["sender_us_per_pkt"] / summary["list"]["sender_us_per_pkt"]
        summary["ring_vs_list_sender"] = round(ratio, 3)
        print(f"ring / list sender time per packet: {summary['ring_vs_list_sender']}")
    print(json.dumps({"size": size, "mtu": args.mtu, "rate_gbps": args.rate_gbps, "summary": summary,
                      "runs": runs}))


if __name__ == "__main__":
    main()
