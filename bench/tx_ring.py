"""The sender's cost per data packet with and without the send ring (``MRC_TX_RING``), side by side in
one run: two engines with their socket drivers in this process, taking turns (one turn each, in order,
so every mode sees the same run), a WRITE of --size bytes from one to the other over ::1 (no testbed,
no root). Per mode (list: sendto per datagram, the default; batch: sendmmsg copying each datagram,
``MRC_BATCH_IO=1``; ring: sendmmsg from the engine's send ring) it prints the time spent in the
sender's driver turns per data packet (retransmissions included), the goodput and the retransmitted
packets, then the JSON. Modes interleave across --reps, and the table gives medians.

    .venv/bin/python bench/tx_ring.py [--size 64M] [--reps 3] [--rate-gbps 0] [--rtt-us 200]

The receiver is the same in every mode (recvmmsg into the engine's batch receive), so differences are
the sender's. Loopback has no fabric: the figures are the CPU's, not a NIC's. The pair of engines and
drivers is dataplane/lopair.py's, which tests/unit/test_driver_pair.py also runs.
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


def one(mode: str, size: int, mtu: int, rate_bps: int, rtt_ns: int) -> dict[str, Any]:
    """One WRITE of `size` bytes (dataplane/lopair.py); only the sender's driver turns are timed."""
    r = lopair.run(lopair.PairConfig(size=size, mtu=mtu, rate_bps=rate_bps, rtt_ns=rtt_ns,
                                     batch_io=mode == "batch", tx_ring=mode == "ring"))
    assert r["driver"]["tx_ring"] == (mode == "ring")
    keep = ("ok", "sender_us_per_pkt", "goodput_gbps", "tx_packets", "retx")
    return {"mode": mode, **{k: r[k] for k in keep}}


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
