#!/usr/bin/env python3
"""Wire-format hot path on one core: data-packet build+ICRC and parse+ICRC for 4096-byte payloads,
next to a bare CRC-32 over the same 4096 + 52 bytes (the implementation the ICRC uses, `mrc.wire.crc`:
ISA-L's when installed, and zlib's for comparison), all in the same run.

Usage: ``python bench/wire.py [--seconds S] [--rounds R] [-j]``

Why this shape: the ICRC is a CRC-32 over the whole packet, so a bare ``crc32`` of the same bytes
is the floor the build and parse paths can approach; their ratio to it is the Python overhead we pay per
packet, and is what to watch when the wire code changes. Cases are interleaved round by round (each
round runs every case once, for about the same time), and each case reports the median of its rounds,
so that frequency scaling or a noisy neighbour shifts all cases alike instead of skewing one of them.
The process pins itself to one CPU when it may.

Columns: ops_per_s; ns_per_op; gbit_per_s = payload bits (4096 x 8) per second for every row, so rows
compare as throughput; ratio_to_crc32 = ns_per_op / ns_per_op of the bare crc32 the ICRC uses (how
many bare CRCs one operation costs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from itertools import repeat
from typing import Any

from mrc.wire import IcrcContext, build_write, parse
from mrc.wire.crc import CRC32_IMPL, crc32
from mrc.wire.packet import WRITE_HDR_LEN

PAYLOAD = 4096
CRC_CASE = f"{CRC32_IMPL}.crc32"
SRC = bytes.fromhex("fd000000000000000000000000000001")
DST = bytes.fromhex("fd000000000000000000000000000002")


def _pin_one_cpu() -> int | None:
    """Pin to the last CPU we may run on (away from CPU 0's interrupts); None where unsupported."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[-1]})
    return cpus[-1]


def _cases() -> dict[str, Callable[[int], None]]:
    """Each case runs `n` operations in a tight loop with everything bound to locals, so the loop
    costs the same few tens of ns in every row."""
    ctx = IcrcContext(SRC, DST)
    payload = bytes(range(256)) * (PAYLOAD // 256)
    buf = bytearray(WRITE_HDR_LEN + PAYLOAD + 4)
    length = build_write(buf, ctx, dqpn=0x1234, psn=0xFFFFF0, ev_index=7, va=0x7F0000000000, rkey=0xABCD,
                         payload=payload, msn=3, msg_len=1 << 20, msg_offset=8192, timestamp_ns=1)
    packet = bytes(buf[:length])
    assert parse(packet, ctx).icrc == "ok"
    covered = packet[:-4]  # the bytes the ICRC covers after the pseudo-header: 52 + 4096

    def build(n: int) -> None:
        b, c, p = buf, ctx, payload
        for _ in repeat(None, n):
            build_write(b, c, dqpn=0x1234, psn=0xFFFFF0, ev_index=7, va=0x7F0000000000, rkey=0xABCD,
                        payload=p, msn=3, msg_len=1 << 20, msg_offset=8192, timestamp_ns=1)

    def parse_(n: int) -> None:
        pk, c = packet, ctx
        for _ in repeat(None, n):
            parse(pk, c)

    def bare(f: Callable[..., int]) -> Callable[[int], None]:
        def crc(n: int) -> None:
            d = covered
            for _ in repeat(None, n):
                f(d)

        return crc

    cases = {"build_write+icrc": build, "parse+icrc": parse_, CRC_CASE: bare(crc32)}
    if CRC32_IMPL != "zlib":
        cases["zlib.crc32"] = bare(zlib.crc32)
    return cases


def _calibrate(fn: Callable[[int], None], target_s: float) -> int:
    """Operations that take about `target_s` seconds."""
    n = 64
    while True:
        t0 = time.perf_counter()
        fn(n)
        dt = time.perf_counter() - t0
        if dt >= 0.02:
            return max(1, int(n * target_s / dt))
        n *= 4


def run(seconds: float, rounds: int) -> dict[str, Any]:
    cpu = _pin_one_cpu()
    cases = _cases()
    per_batch = seconds / (rounds * len(cases))
    sizes = {name: _calibrate(fn, per_batch) for name, fn in cases.items()}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            n = sizes[name]
            t0 = time.perf_counter_ns()
            fn(n)
            samples[name].append((time.perf_counter_ns() - t0) / n)
    ns = {name: statistics.median(v) for name, v in samples.items()}
    rows = [
        {
            "name": name,
            "ops_per_s": round(1e9 / v),
            "ns_per_op": round(v, 1),
            "gbit_per_s": round(PAYLOAD * 8 / v, 2),
            "ratio_to_crc32": round(v / ns[CRC_CASE], 2),
        }
        for name, v in ns.items()
    ]
    config = {
        "payload_bytes": PAYLOAD,
        "packet_bytes": WRITE_HDR_LEN + PAYLOAD + 4,
        "crc32_bytes": WRITE_HDR_LEN + PAYLOAD,
        "seconds": seconds,
        "rounds": rounds,
        "statistic": "median of rounds",
        "cpu": cpu,
        "python": platform.python_version(),
        "zlib": zlib.ZLIB_RUNTIME_VERSION,
        "crc32": CRC32_IMPL,
        "machine": platform.machine(),
        "gbit_per_s": "payload bits per second",
        "ratio_to_crc32": f"ns_per_op / ns_per_op of {CRC_CASE}",
    }
    return {"config": config, "rows": rows}


def _table(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [
        f"MRC wire hot path, {c['payload_bytes']}-byte payload ({c['packet_bytes']}-byte packet), one core "
        f"(cpu {c['cpu']}), Python {c['python']}, zlib {c['zlib']}, ICRC crc32 from {c['crc32']}; median of "
        f"{c['rounds']} rounds",
        f"{'case':<20} {'ops/s':>12} {'ns/op':>10} {'Gbit/s':>8} {'x crc32':>8}",
    ]
    for r in result["rows"]:
        lines.append(
            f"{r['name']:<20} {r['ops_per_s']:>12,} {r['ns_per_op']:>10.1f} {r['gbit_per_s']:>8.2f} "
            f"{r['ratio_to_crc32']:>8.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=6.0, help="total measuring time (default 6)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds per case (default 9)")
    ap.add_argument("-j", "--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1:
        ap.error("--seconds must be > 0 and --rounds >= 1")
    result = run(args.seconds, args.rounds)
    print(json.dumps(result, indent=2) if args.json else _table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
