#!/usr/bin/env python3
"""Resident memory of one mrcd with N QPs (issue 18: "RSS of mrcd with 64 QPs <= 1.5x v0.1.0's").

Measures the resident set of host h0's mrcd (`/proc/PID/status`: VmRSS, VmHWM, and VmRSS's split into
RssAnon / RssFile / RssShmem) twice: idle (daemons up, this script's clients connected and one small
memory region registered per host, no QP), then after N QPs were created in h0's mrcd toward its peers
(round robin over the other hosts, `--peers` to choose), each connected to a QP of the peer's mrcd, and
(unless `--write 0`) one small WRITE with immediate completed on each, so that every QP's send and
receive state, windows and EV table were touched. Prints both samples and the per-QP increment;
`-j` prints the same as JSON (rss_idle_kib, rss_qps_kib, per_qp_kib, hwm_*_kib, ...).

    .venv/bin/python bench/mrcd_rss.py [-n NAME] [--qps 64] [--write 1024] [--settle 2] [-j]

Without `-n`, brings a testbed `rss` up with its daemons (`mrcctl testbed up --with-daemons -n rss`,
metrics on 127.0.0.1:9780+i so as not to collide with another testbed's) and takes it down at the end,
also on failure; with `-n NAME`, uses testbed NAME, which must be up with its daemons, and leaves it up.
The testbed is driven through `sys.executable -m mrc.ctl.cli` and the client library of the `mrc` this
interpreter imports, so that the same script measures an older checkout: run it with PYTHONPATH set to
a tree whose `mrc`, `mrc.ctl` and `mrc.dataplane` are that checkout's (the mrcds inherit the
environment; the JSON names the `mrc` file and version that were imported, and the mrcd's own version).
Only the client calls of v0.1.0's protocol are used (hello, reg_mr, create_qp, connect, post_recv,
post_send), so v0.1.0 (455353a) and later commits can be compared with it; docs/daemon.md
"Memory per QP (issue 18)" has the comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mrc
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import ClientQp, MrcClient, RemoteMr

SRC = "h0"
DEFAULT_NAME = "rss"
DEFAULT_METRICS_BASE = 9780
STATUS_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def proc_status(pid: int) -> dict[str, int]:
    """The memory lines of /proc/PID/status, in KiB."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in STATUS_FIELDS:
            out[key] = int(val.split()[0])
    return out


def mrcd_env(pid: int) -> dict[str, Any]:
    """How the mrcd was started: its command line, working directory and PYTHONPATH (which `mrc` it ran)."""
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
    return {"cmdline": Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip(),
            "cwd": str(Path(f"/proc/{pid}/cwd").resolve()), "pythonpath": env.get("PYTHONPATH")}


def cli(*args: str) -> None:
    """`mrcctl ARGS` of the imported mrc (same interpreter, same environment)."""
    subprocess.run([sys.executable, "-m", "mrc.ctl.cli", *args], check=True, stdout=subprocess.DEVNULL)


@contextlib.contextmanager
def testbed(name: str | None, metrics_base: int) -> Iterator[str]:
    """The testbed to measure: `name` as it is, or a fresh one (`rss`) that is taken down afterwards."""
    if name is not None:
        yield name
        return
    cli("testbed", "up", "--with-daemons", "-n", DEFAULT_NAME, "--metrics-base", str(metrics_base))
    try:
        yield DEFAULT_NAME
    finally:
        cli("testbed", "down", "-n", DEFAULT_NAME)


@dataclass
class Pair:
    """One QP of h0's mrcd and its peer QP."""

    qp: ClientQp
    peer: str
    peer_qp: ClientQp


def run(name: str, qps: int, peers: list[str] | None, write: int, settle_s: float) -> dict[str, Any]:
    tb = tbmod.Testbed.load(name)
    hosts = tb.topo.host_names()
    if SRC not in hosts:
        raise SystemExit(f"testbed {name}: no host {SRC}")
    peers = peers or [h for h in hosts if h != SRC]
    bad = [p for p in peers if p not in hosts or p == SRC]
    if bad:
        raise SystemExit(f"testbed {name}: {bad[0]!r} is not a peer of {SRC} (hosts: {', '.join(hosts)})")
    size = max(write, 1) * qps
    clients: dict[str, MrcClient] = {}
    mrs: dict[str, RemoteMr] = {}
    try:
        for h in [SRC, *dict.fromkeys(peers)]:
            clients[h] = MrcClient.for_host(tb.ns(h), timeout=30.0)
            mrs[h] = clients[h].reg_mr(size)
        a = clients[SRC]
        pid = int(a.info["pid"])
        time.sleep(settle_s)
        idle = proc_status(pid)
        t0 = time.monotonic()
        pairs: list[Pair] = []
        for i in range(qps):
            peer = peers[i % len(peers)]
            b = clients[peer]
            qa = a.create_qp(peer)
            qb = b.create_qp(SRC)
            a.connect(qa, qb.qpn)
            b.connect(qb, qa.qpn)
            pairs.append(Pair(qa, peer, qb))
        create_s = time.monotonic() - t0
        if write > 0:
            mrs[SRC].buf[:size] = bytes(i & 0xFF for i in range(size))
            for i, p in enumerate(pairs):
                b = clients[p.peer]
                b.post_recv(p.peer_qp, i + 1)
                a.post_send(p.qp, wr_id=i + 1, mr=mrs[SRC], offset=i * write, length=write,
                            remote_addr=mrs[p.peer].addr + i * write, rkey=mrs[p.peer].rkey, imm=i + 1)
            for i, p in enumerate(pairs):
                clients[p.peer].wait_wc(p.peer_qp, i + 1, timeout=30.0)
                a.wait_wc(p.qp, i + 1, timeout=30.0)
        time.sleep(settle_s)
        after = proc_status(pid)
        started = mrcd_env(pid)
    finally:
        for c in clients.values():
            with contextlib.suppress(Exception):
                c.close()
    n = max(qps, 1)
    return {
        "testbed": name, "host": SRC, "pid": pid, "mrcd_version": a.info.get("version"),
        "mrc_version": mrc.__version__, "mrc_file": mrc.__file__, "evs": a.info.get("evs"),
        "planes": a.info.get("planes"), "qps": qps, "peers": peers, "write_bytes": write,
        "create_s": round(create_s, 3),
        "rss_idle_kib": idle["VmRSS"], "rss_qps_kib": after["VmRSS"], f"rss_{qps}qp_kib": after["VmRSS"],
        "per_qp_kib": round((after["VmRSS"] - idle["VmRSS"]) / n, 2),
        "anon_per_qp_kib": round((after["RssAnon"] - idle["RssAnon"]) / n, 2),
        "hwm_idle_kib": idle["VmHWM"], "hwm_qps_kib": after["VmHWM"],
        "idle": idle, "after": after, "mrcd": started,
    }


def render(r: dict[str, Any]) -> str:
    rows = [("", "idle", f"{r['qps']} QPs", "per QP")]
    for k in STATUS_FIELDS:
        i, a = r["idle"].get(k, 0), r["after"].get(k, 0)
        rows.append((f"{k} KiB", str(i), str(a), f"{(a - i) / max(r['qps'], 1):.1f}"))
    w = [max(len(row[c]) for row in rows) for c in range(4)]
    lines = [f"mrcd {r['host']} of testbed {r['testbed']} (pid {r['pid']}, mrcd {r['mrcd_version']}, "
             f"{r['evs']} EVs, {r['planes']} planes), {r['qps']} QPs to {','.join(r['peers'])}, "
             f"{r['write_bytes']} B WRITE each, created in {r['create_s']} s"]
    lines += ["  ".join(c.rjust(w[j]) for j, c in enumerate(row)) for row in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--name", default=None,
                    help="testbed that is up with its daemons (default: bring up 'rss' and take it down)")
    ap.add_argument("--qps", type=int, default=64, help="QPs to create in h0's mrcd (default 64)")
    ap.add_argument("--peers", default=None, help="comma-separated peers (default: every other host)")
    ap.add_argument("--write", type=int, default=1024, help="bytes WRITTEN once on each QP (0: none)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds to wait before each sample")
    ap.add_argument("--metrics-base", type=int, default=DEFAULT_METRICS_BASE,
                    help="metrics port base of the testbed brought up (default 9780)")
    ap.add_argument("-j", "--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    peers = args.peers.split(",") if args.peers else None
    with testbed(args.name, args.metrics_base) as name:
        r = run(name, args.qps, peers, args.write, args.settle)
    print(json.dumps(r, indent=2) if args.json else render(r))


if __name__ == "__main__":
    main()
