#!/usr/bin/env python3
"""How long a pipelining client makes another client of the same mrcd wait (docs/daemon.md, "The loop's
time is bounded too"). Needs a running mrcd (e.g. `mrcctl testbed up --with-daemons`) and root.

    sudo .venv/bin/python bench/control_flood.py /run/mrc/TESTBED-h0.sock [--requests 40000] [--rounds 2] [-j]

One client writes `--requests` `qp_show` lines at once and reads the answers; meanwhile a second client
sends `hello` every 10 ms and times each answer. Prints, per round, when the last flood answer came and
the probe's median and worst latency (a table, or JSON with -j). The probe's latency is what the
flood costs every other client of that mrcd, its QPs' completions included.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from typing import Any


def _connect(path: str) -> tuple[socket.socket, Any]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    f = s.makefile("rb")
    f.readline()  # the greeting
    return s, f


def one_round(path: str, n: int, timeout_s: float = 120.0) -> dict[str, Any]:
    flood, ff = _connect(path)
    probe, pf = _connect(path)
    try:
        payload = b"".join(b'{"id":%d,"op":"qp_show"}\n' % (i + 1) for i in range(n))
        got = [0]

        def read() -> None:
            while got[0] < n and ff.readline():
                got[0] += 1

        reader = threading.Thread(target=read, daemon=True)
        writer = threading.Thread(target=flood.sendall, args=(payload,), daemon=True)
        t0 = time.perf_counter()
        reader.start()
        writer.start()
        lat: list[float] = []
        while got[0] < n and time.perf_counter() - t0 < timeout_s:
            a = time.perf_counter()
            probe.sendall(b'{"id":1,"op":"hello"}\n')
            if not pf.readline():
                break
            lat.append(time.perf_counter() - a)
            time.sleep(0.01)
        reader.join(timeout_s)
        done = time.perf_counter() - t0
    finally:
        flood.close()
        probe.close()
    lat.sort()
    return {"requests": n, "answered": got[0], "all_answered_s": round(done, 3), "probes": len(lat),
            "probe_p50_ms": round(lat[len(lat) // 2] * 1e3, 2) if lat else None,
            "probe_max_ms": round(lat[-1] * 1e3, 2) if lat else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("socket", help="the mrcd's control socket")
    ap.add_argument("--requests", type=int, default=40000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-j", "--json", action="store_true")
    args = ap.parse_args()
    rows = [one_round(args.socket, args.requests) for _ in range(args.rounds)]
    if args.json:
        print(json.dumps({"rounds": rows}))
        return 0
    head = ("round", "requests", "answered", "all in s", "probes", "p50 ms", "max ms")
    print(f"{head[0]:>5} {head[1]:>9} {head[2]:>9} {head[3]:>9} {head[4]:>7} {head[5]:>8} {head[6]:>8}")
    for i, r in enumerate(rows):
        print(f"{i:>5} {r['requests']:>9} {r['answered']:>9} {r['all_answered_s']:>9} {r['probes']:>7} "
              f"{r['probe_p50_ms']!s:>8} {r['probe_max_ms']!s:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
