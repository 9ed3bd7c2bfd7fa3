"""The responder's receive of a batch of data packets: `Context.receive_batch` with each of its compiled
kernels (mrc/transport/rxbatch.py: `_fastc.rx_run` in C, `_rxnumba` in numba) against one
`Context.receive` per datagram (what the socket driver did with each recvmmsg slot: `bytes` of the
slot, then the call), side by side in one process, alternating.

    .venv/bin/python bench/rxbatch.py [--batch 4,16,64] [--packets 16384] [--rounds 3] [-j]

A requester A sends one 128 MiB WRITE at 8 KiB per packet; its datagrams are copied into a 64-slot
array (as recvmmsg fills its slots) and handed to B in batches of --batch, B's SACKs back to A. Timed:
B's receive calls only (placement into an already-touched region, ICRC check, bitmap, SACKs). Prints
microseconds per data packet for each path, the ratios, and the kernel calls per packet; every path
must place every byte (checked). The kernels take every batch here, however small (`rxbatch.MIN_BATCH`
set to 1): the crossover this shows is where `MIN_BATCH` comes from.
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


def run(kernel: str, packets: int, batch: int) -> dict[str, float]:
    """`kernel`: "c" or "numba" (receive_batch with that kernel), "" (one receive per datagram)."""
    batched = bool(kernel)
    rxbatch.KERNEL = kernel or rxbatch.KERNEL  # read when B's batch receiver is made (its first batch)
    rxbatch.MIN_BATCH = 1  # the kernel for every batch: where it pays is what this measures
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
    assert rx is None or rx.kernel == kernel
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
    kernels = [k for k, ok in (("c", rxbatch._c_kernel_ok()), ("numba", rxbatch.NUMBA_OK)) if ok]
    if not kernels:
        raise SystemExit("rxbatch: neither _fastc nor python-isal's crc32_gzip_refl here; nothing to compare")
    sizes = [int(x) for x in args.batch.split(",")]
    for k in kernels:
        run(k, 1024, 16)  # compile / load the kernel outside the timing
    rows: list[dict[str, Any]] = []
    for bs in sizes:
        us: dict[str, list[float]] = {"": [], **{k: [] for k in kernels}}
        calls = []
        for _ in range(args.rounds):
            for k in us:
                res = run(k, args.packets, bs)
                us[k].append(res["us_per_packet"])
                if k == kernels[0]:
                    calls.append(res["calls_per_packet"])
        row: dict[str, Any] = {"batch": bs, "one_by_one_us": [round(x, 3) for x in us[""]]}
        for k in kernels:
            row[f"{k}_us"] = [round(x, 3) for x in us[k]]
            row[f"one_by_one_vs_{k}"] = round(statistics.median(
                o / x for o, x in zip(us[""], us[k], strict=True)), 3)
        if len(kernels) == 2:
            row["numba_vs_c"] = round(statistics.median(
                x / c for x, c in zip(us["numba"], us["c"], strict=True)), 3)
        row["kernel_calls_per_packet"] = round(statistics.median(calls), 3)
        rows.append(row)
    if args.json:
        print(json.dumps({"bench": "rxbatch", "packets": args.packets, "rounds": args.rounds,
                          "kernels": kernels, "rows": rows}))
        return
    head = f"{'BATCH':>5}  {'ONE-BY-ONE us/pkt':>18}"
    head += "".join(f"  {k.upper() + ' us/pkt':>18}" for k in kernels)
    head += "".join(f"  {'1-BY-1/' + k.upper():>13}" for k in kernels)
    print(head + ("  NUMBA/C" if len(kernels) == 2 else "") + "  CALLS/PKT")

    def span(xs: list[float]) -> str:
        return f"{min(xs):.2f}-{max(xs):.2f}"

    for r in rows:
        line = f"{r['batch']:>5}  {span(r['one_by_one_us']):>18}"
        line += "".join(f"  {span(r[f'{k}_us']):>18}" for k in kernels)
        line += "".join(f"  {r[f'one_by_one_vs_{k}']:>13.2f}" for k in kernels)
        if len(kernels) == 2:
            line += f"  {r['numba_vs_c']:>7.2f}"
        print(line + f"  {r['kernel_calls_per_packet']:>9.2f}")

if __name__ == "__main__":
    main()
