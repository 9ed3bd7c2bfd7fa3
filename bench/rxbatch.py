"""The responder's receive of a batch of data packets: `Context.receive_batch` with its compiled kernel
(mrc/transport/rxbatch.py) against one `Context.receive` per datagram (what the socket driver did with
each recvmmsg slot: `bytes` of the slot, then the call), side by side in one process, alternating.

    .venv/bin/python bench/rxbatch.py [--batch 4,16,64] [--packets 16384] [--rounds 3] [-j]

A requester A sends one 128 MiB WRITE at 8 KiB per packet; its datagrams are copied into a 64-slot
array (as recvmmsg fills its slots) and handed to B in batches of --batch, B's SACKs back to A. Timed:
B's receive calls only (placement into an already-touched region, ICRC check, bitmap, SACKs). Prints
microseconds per data packet for each path, the ratio, and the kernel calls per packet; both paths
must place every byte (checked).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np

from mrc.transport import Context, QpAttr, rxbatch

GA = bytes.fromhex("fd000000000000000000000000000001")
GB = bytes.fromhex("fd000000000000000000000000000002")
SIZE = 128 << 20


def run(batched: bool, packets: int, batch: int) -> dict[str, float]:
    attr = QpAttr(mtu=8192)
    a = Context(GA, ports=4, seed=1)
    b = Context(GB, ports=4, seed=2)
    qa = a.create_qp(a.create_cq(), ev_profile=a.create_ev_profile(count=64), attr=attr)
    qb = b.create_qp(b.create_cq(), ev_profile=b.create_ev_profile(count=64), attr=attr)
    qa.connect(GB, qb.qpn)
    qb.connect(GA, qa.qpn)
    src = np.frombuffer(np.random.default_rng(1).bytes(SIZE), dtype=np.uint8).copy()
    dst = np.ones(SIZE, dtype=np.uint8)  # touched: the placement's page faults are not what is timed
    smr, dmr = a.reg_mr(src), b.reg_mr(dst)
    qa.post_send(1, smr, 0, SIZE, dmr.addr, dmr.rkey)
    slots = np.zeros((64, 9216), dtype=np.uint8)
    lens = np.zeros(64, dtype=np.int64)
    ecn = np.zeros(64, dtype=np.bool_)
    ports = np.zeros(64, dtype=np.int64)
    srcs = np.tile(np.frombuffer(GA, dtype=np.uint8), (64, 1))
    now = 1_000
    done = 0
    spent = 0.0
    receive = b.receive
    while done < packets and qa.busy:
        pkts = [bytes(dg.data) for dg in a.datagrams_to_send(now)]
        for i in range(0, len(pkts), batch):
            chunk = pkts[i : i + batch]
            k = len(chunk)
            for j, p in enumerate(chunk):
                slots[j, : len(p)] = np.frombuffer(p, dtype=np.uint8)
                lens[j] = len(p)
                ports[j] = j % 4
            t0 = time.perf_counter()
            if batched:
                b.receive_batch(slots[:k], lens[:k], ecn[:k], ports[:k], srcs[:k], now)
            else:
                for j in range(k):
                    receive(slots[j, : lens[j]].tobytes(), now, False, j % 4, GA)
            spent += time.perf_counter() - t0
            done += k
        for dg in b.datagrams_to_send(now):
            a.receive(bytes(dg.data), now, False, 0, GB)
        now += 20_000
        a.handle_timer(now)
        b.handle_timer(now)
    # no loss and in order: every packet handed over is placed, the first `done` of the WRITE
    if qb.rx_bytes != done * 8192 or not np.array_equal(dst[: done * 8192], src[: done * 8192]):
        raise SystemExit("the bytes placed differ from the source")
    rx = b._batch_rx
    return {"us_per_packet": spent / done * 1e6, "packets": done,
            "calls_per_packet": (rx.calls / done) if rx is not None else 0.0,
            "taken": (rx.taken / done) if rx is not None else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="4,16,64", help="batch sizes (datagrams per call), comma-separated")
    ap.add_argument("--packets", type=int, default=16384)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-j", "--json", action="store_true")
    args = ap.parse_args()
    if not rxbatch.AVAILABLE:
        raise SystemExit("rxbatch: python-isal without crc32_gzip_refl here; nothing to compare")
    sizes = [int(x) for x in args.batch.split(",")]
    run(True, 1024, 16)  # compile / load the kernel outside the timing
    rows: list[dict[str, Any]] = []
    for bs in sizes:
        one, bat, calls = [], [], []
        for _ in range(args.rounds):
            one.append(run(False, args.packets, bs)["us_per_packet"])
            res = run(True, args.packets, bs)
            bat.append(res["us_per_packet"])
            calls.append(res["calls_per_packet"])
        ratios = [o / x for o, x in zip(one, bat, strict=True)]
        rows.append({"batch": bs, "one_by_one_us": [round(x, 3) for x in one],
                     "kernel_us": [round(x, 3) for x in bat],
                     "ratio_median": round(statistics.median(ratios), 3),
                     "kernel_calls_per_packet": round(statistics.median(calls), 3)})
    if args.json:
        print(json.dumps({"bench": "rxbatch", "packets": args.packets, "rounds": args.rounds, "rows": rows}))
        return
    print(f"{'BATCH':>5}  {'ONE-BY-ONE us/pkt':>22}  {'KERNEL us/pkt':>22}  {'RATIO':>6}  CALLS/PKT")
    for r in rows:
        o = "-".join(f"{x:.2f}" for x in (min(r["one_by_one_us"]), max(r["one_by_one_us"])))
        k = "-".join(f"{x:.2f}" for x in (min(r["kernel_us"]), max(r["kernel_us"])))
        print(f"{r['batch']:>5}  {o:>22}  {k:>22}  {r['ratio_median']:>6.2f}  "
              f"{r['kernel_calls_per_packet']:.2f}")


if __name__ == "__main__":
    main()
