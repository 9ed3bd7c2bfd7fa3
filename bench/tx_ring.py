"""The socket drivers' cost per data packet, mode by mode, side by side in one run: two engines with their
socket drivers in this process, taking turns (one turn each, in order, so every mode sees the same run),
a WRITE of --size bytes from one to the other over ::1 (no testbed, no root). The modes (`MODES`):
list, batch and ring vary the sender (sendto per datagram; sendmmsg copying each datagram,
``MRC_BATCH_IO``; sendmmsg from the engine's send ring, ``MRC_TX_RING``) before a batching receiver;
old and new are the drivers' defaults before and since 2026-12-05 at both ends (per-datagram calls;
batch I/O with the C receive kernel), all is batch I/O and the send ring at both ends. Per mode it
prints the time spent in the sender's and in the receiver's driver turns per data packet
(retransmissions included), the goodput and the retransmitted packets, then the JSON. Modes
interleave across --reps, and the table gives medians.

    .venv/bin/python bench/tx_ring.py [--size 64M] [--reps 3] [--rate-gbps 0] [--rtt-us 200] [--modes ...]

Loopback has no fabric: the figures are the CPU's, not a NIC's (and a datagram's delivery to the
receiving socket runs inside the sender's send call). The pair of engines and drivers is
dataplane/lopair.py's, which tests/unit/test_driver_pair.py also runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mrc.dataplane import lopair
from mrc.units import parse_size

#: mode -> (A's batch_io, A's tx_ring, B's batch_io, B's tx_ring)
MODES = {
    "list": (False, False, True, False),  # sendto per datagram; the receiver batches (a fast peer)
    "batch": (True, False, True, False),  # sendmmsg copying each datagram
    "ring": (False, True, True, False),  # sendmmsg from the engine's send ring
    "old": (False, False, False, False),  # the drivers' defaults before 2026-12-05, both ends
    "new": (True, False, True, False),  # the defaults since: batch I/O (the C receive kernel), both ends
    "all": (True, True, True, True),  # batch I/O and the send ring, both ends
}


def one(mode: str, size: int, mtu: int, rate_bps: int, rtt_ns: int) -> dict[str, Any]:
    """One WRITE of `size` bytes (dataplane/lopair.py); each driver's turns are timed."""
    a_batch, a_ring, b_batch, b_ring = MODES[mode]
    r = lopair.run(lopair.PairConfig(size=size, mtu=mtu, rate_bps=rate_bps, rtt_ns=rtt_ns, batch_io=a_batch,
                                     tx_ring=a_ring, peer_batch_io=b_batch, peer_tx_ring=b_ring))
    assert r["driver"]["tx_ring"] == a_ring and r["peer_driver"]["batch_io"] == b_batch
    keep = ("ok", "sender_us_per_pkt", "receiver_us_per_pkt", "goodput_gbps", "tx_packets", "retx")
    return {"mode": mode, **{k: r[k] for k in keep}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="64M")
    ap.add_argument("--mtu", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rate-gbps", type=float, default=0.0, help="pace each of the 4 ports (0: unpaced)")
    ap.add_argument("--rtt-us", type=float, default=200.0, help="the path's RTT NSCC is configured for")
    ap.add_argument("--modes", default="list,batch,ring,old,new,all", help=f"of {','.join(MODES)}")
    args = ap.parse_args()
    size = parse_size(args.size)
    modes = args.modes.split(",")
    runs: list[dict[str, Any]] = []
    for _ in range(args.reps):
        for mode in modes:  # interleaved: a slower stretch of the VM hits every mode alike
            runs.append(one(mode, size, args.mtu, int(args.rate_gbps * 1e9), int(args.rtt_us * 1000)))
    print(f"{'mode':6} {'ok':>5} {'sender us/pkt':>13} {'receiver us/pkt':>15} {'Gbit/s':>7} {'retx':>6}")
    summary: dict[str, Any] = {}
    for mode in modes:
        rs = [r for r in runs if r["mode"] == mode]
        cpu = statistics.median(r["sender_us_per_pkt"] for r in rs)
        rcpu = statistics.median(r["receiver_us_per_pkt"] for r in rs)
        gbps = statistics.median(r["goodput_gbps"] for r in rs)
        retx = statistics.median(r["retx"] for r in rs)
        summary[mode] = {"sender_us_per_pkt": round(cpu, 2), "receiver_us_per_pkt": round(rcpu, 2),
                         "goodput_gbps": round(gbps, 3), "retx": retx,
                         "ok": all(r["ok"] for r in rs)}
        print(f"{mode:6} {summary[mode]['ok']!s:>5} {cpu:13.2f} {rcpu:15.2f} {gbps:7.3f} {retx:6.0f}")
    if "list" in summary and "ring" in summary:
        ratio = summary["ring"]["sender_us_per_pkt"] / summary["list"]["sender_us_per_pkt"]
        summary["ring_vs_list_sender"] = round(ratio, 3)
        print(f"ring / list sender time per packet: {summary['ring_vs_list_sender']}")
    for m in ("new", "all"):
        if "old" in summary and m in summary:
            both = {x: summary[x]["sender_us_per_pkt"] + summary[x]["receiver_us_per_pkt"]
                    for x in ("old", m)}
            summary[f"{m}_vs_old_both_ends"] = round(both[m] / both["old"], 3)
            print(f"{m} / old, both drivers' time per packet: {summary[f'{m}_vs_old_both_ends']}")
    print(json.dumps({"size": size, "mtu": args.mtu, "rate_gbps": args.rate_gbps, "summary": summary,
                      "runs": runs}))


if __name__ == "__main__":
    main()
