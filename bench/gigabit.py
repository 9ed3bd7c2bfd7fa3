#!/usr/bin/env python3
"""Where an mrcd's time goes at gigabit speeds (docs/daemon.md, "Gigabit speeds: where the time goes").
Needs root (testbeds with mrcds).

    sudo .venv/bin/python bench/gigabit.py [--ab batch|mtu|floor|pace|catchup|ackdelay] [--rate 10gbit]
                                           [--size 256M] [--iters 2] [--rounds 6] [--profile DIR] [-j]

Round by round, alternating between the two arms of ``--ab``, a fresh testbed of
deploy/topologies/default.toml with its links at ``--rate`` and one mrcd per host; in each, one ``mrcctl
bench write --src h0 --dst h2`` and the source's (h0) and destination's (h2) mrcd CPU seconds, user and
system, read from /proc around it (the measure a busy shared machine disturbs least), per data packet
and per MiB. The arms (the first is the older behaviour):

* ``batch``: ``MRC_BATCH_IO=0`` (per-datagram recvmsg_into / sendto) and ``=1`` (recvmmsg / sendmmsg);
* ``mtu`` (the default): links of MTU 4244, whose payload is 4 KiB, and of the default 9000 (8 KiB);
* ``floor``: ``MRC_ACK_REQ_FLOOR=-1`` (AckReq on every packet below ack_coalesce x mtu in flight, the
  engine's default) and mrcd's own 0 (no floor).
* ``pace``: ``MRC_PACE_DEBT=0`` (the pacer waits for a whole datagram's worth of tokens) and ``=1`` (a
  datagram goes on any credit, the bucket taken into debt; the default).
* ``catchup``: ``MRC_PACE_CATCHUP=0`` (a backlogged port's credit stops at the burst, released port by
  port) and ``=1`` (a backlogged port spends what it earned since the last turn, released in the
  engine's order; the default).
* ``ackdelay``: the responder's delayed ACK at 4 us (the engine's default) and at 50 us (fewer SACKs
  where a loop turn takes longer than 4 us).

Prints per round and the medians, and the median of the paired (same round) ratios, second arm / first.

``--profile DIR``: instead, one run per arm with the h0 and h2 mrcds restarted under cProfile
(``python -m cProfile -o DIR/ARM-HOST.prof -m mrc.ctl.daemon``; SIGTERM ends them and writes the
profile), then the per-data-packet cumulative time of the driver's and the engine's entry points.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pstats
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MRCCTL = [sys.executable, "-m", "mrc.ctl.cli"]
sys.path.insert(0, str(ROOT))


@dataclasses.dataclass(frozen=True)
class Arm:
    label: str
    env: dict[str, str]
    link_mtu: int = 9000

    @property
    def payload(self) -> int:
        from mrc.wire.packet import payload_for_mtu

        return payload_for_mtu(self.link_mtu)


ARMS: dict[str, tuple[Arm, Arm]] = {
    "batch": (Arm("MRC_BATCH_IO=0", {"MRC_BATCH_IO": "0"}), Arm("MRC_BATCH_IO=1", {"MRC_BATCH_IO": "1"})),
    "mtu": (Arm("mtu 4244 (4 KiB payload)", {}, 4244), Arm("mtu 9000 (8 KiB payload)", {}, 9000)),
    "floor": (Arm("MRC_ACK_REQ_FLOOR=-1", {"MRC_ACK_REQ_FLOOR": "-1"}),
              Arm("MRC_ACK_REQ_FLOOR=0", {"MRC_ACK_REQ_FLOOR": "0"})),
    "pace": (Arm("MRC_PACE_DEBT=0", {"MRC_PACE_DEBT": "0"}), Arm("MRC_PACE_DEBT=1", {"MRC_PACE_DEBT": "1"})),
    "catchup": (Arm("MRC_PACE_CATCHUP=0", {"MRC_PACE_CATCHUP": "0"}),
                Arm("MRC_PACE_CATCHUP=1", {"MRC_PACE_CATCHUP": "1"})),
    "ackdelay": (Arm("MRC_ACK_DELAY_NS=4000", {"MRC_ACK_DELAY_NS": "4000"}),
                 Arm("MRC_ACK_DELAY_NS=50000", {"MRC_ACK_DELAY_NS": "50000"})),
}


def _ctl(*args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
    r = subprocess.run([*MRCCTL, *args], capture_output=True, text=True, env=env, timeout=900)
    if check and r.returncode != 0:
        raise RuntimeError(f"mrcctl {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def _cpu(pid: int) -> tuple[float, float]:
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(f[11]) / tck, int(f[12]) / tck


def _pids(name: str) -> dict[str, int]:
    from mrc.ctl import daemons

    return {h: int(d["pid"]) for h, d in daemons.records(name)["daemons"].items()}


@contextlib.contextmanager
def _testbed(text: str, arm: Arm) -> Any:
    name = "g" + secrets.token_hex(3)
    env = {**os.environ, **arm.env}
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as tf:
        tf.write(re.sub(r"(?m)^mtu = \d+", f"mtu = {arm.link_mtu}", text, count=1))
    try:
        _ctl("testbed", "up", tf.name, "--name", name, "--with-daemons", "--metrics-base",
             str(30000 + secrets.randbelow(20000)), env=env)
        yield name
    finally:
        _ctl("testbed", "down", "--name", name, check=False)
        Path(tf.name).unlink()


def _bench(name: str, size: str, iters: int) -> dict[str, Any]:
    return dict(json.loads(_ctl("-j", "bench", "write", "--name", name, "--src", "h0", "--dst", "h2",
                                "--size", size, "--iters", str(iters))))


def one_round(text: str, arm: Arm, size: str, iters: int) -> dict[str, Any]:
    with _testbed(text, arm) as name:
        pids = _pids(name)
        c0 = {h: _cpu(pids[h]) for h in ("h0", "h2")}
        doc = _bench(name, size, iters)
        c1 = {h: _cpu(pids[h]) for h in ("h0", "h2")}
    nbytes = sum(r["bytes"] * r["iters"] for r in doc["rows"])
    pkts = nbytes / arm.payload
    out: dict[str, Any] = {"arm": arm.label, "payload": arm.payload, "goodput_gbps": doc["goodput_gbps"],
                           "bit_exact": doc["bit_exact"]}
    for h in ("h0", "h2"):
        out[f"{h}_user_us"] = round((c1[h][0] - c0[h][0]) / pkts * 1e6, 2)
        out[f"{h}_sys_us"] = round((c1[h][1] - c0[h][1]) / pkts * 1e6, 2)
    out["cpu_us_per_pkt"] = round(sum(out[f"{h}_{k}_us"] for h in ("h0", "h2") for k in ("user", "sys")), 2)
    cpu_s = sum(c1[h][k] - c0[h][k] for h in ("h0", "h2") for k in (0, 1))
    out["cpu_ms_per_mib"] = round(cpu_s / (nbytes / (1 << 20)) * 1e3, 3)
    return out


def profile(text: str, arm: Arm, size: str, outdir: Path) -> dict[str, Any]:
    """One bench with the h0 and h2 mrcds under cProfile; their per-data-packet hot spots."""
    outdir.mkdir(parents=True, exist_ok=True)
    mode = re.sub(r"[^A-Za-z0-9]+", "_", arm.label).strip("_")
    with _testbed(text, arm) as name:
        from mrc.ctl import daemons
        from mrc.dataplane.client import socket_path
        from mrc.dataplane.testbed import Testbed

        tb = Testbed.load(name)
        old = _pids(name)
        procs = []
        try:
            for h in ("h0", "h2"):
                os.kill(old[h], signal.SIGTERM)
            time.sleep(1.5)
            for h in ("h0", "h2"):
                socket_path(tb.ns(h)).unlink(missing_ok=True)
                prof = str(outdir / f"{mode}-{h}.prof")
                procs.append(subprocess.Popen(
                    ["nice", "-n", str(daemons.DAEMON_NICE), sys.executable, "-m", "cProfile", "-o", prof,
                     "-m", "mrc.ctl.daemon", "--testbed", name, "--host", h],
                    env={**os.environ, **arm.env}, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True))
            deadline = time.monotonic() + 20
            while not all(socket_path(tb.ns(h)).exists() for h in ("h0", "h2")):
                if time.monotonic() > deadline:
                    raise RuntimeError("the profiled mrcds did not start")
                time.sleep(0.1)
            time.sleep(0.5)
            doc = _bench(name, size, 1)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(5)
    pkts = sum(r["bytes"] * r["iters"] for r in doc["rows"]) / arm.payload
    rows: dict[str, Any] = {"goodput_gbps": doc["goodput_gbps"]}
    for h in ("h0", "h2"):
        rows[h] = hot_spots(outdir / f"{mode}-{h}.prof", pkts)
    return rows


SPOTS = [  # (label, file suffix or "", function name): cumulative seconds per data packet
    ("driver.receive", "driver.py", "receive"), ("driver.flush", "driver.py", "flush"),
    ("  pacing (_pace)", "driver.py", "_pace"),
    ("  sendto", "", "<method 'sendto' of '_socket.socket' objects>"),
    ("  recvmsg_into", "", "<method 'recvmsg_into' of '_socket.socket' objects>"),
    ("  sendmmsg (SendBatch.send)", "mmsg.py", "send"), ("  recvmmsg (RecvBatch.recv)", "mmsg.py", "recv"),
    ("engine receive (Context.receive)", "transport/engine.py", "receive"),
    ("engine receive, fast path (fastpath.receive)", "transport/fastpath.py", "receive"),
    ("engine send (Context.datagrams_to_send)", "transport/engine.py", "datagrams_to_send"),
    ("engine timers (Context.handle_timer)", "transport/engine.py", "handle_timer"),
    ("epoll wait", "", "<method 'poll' of 'select.epoll' objects>"),
]


def hot_spots(path: Path, pkts: float) -> dict[str, float]:
    st: Any = pstats.Stats(str(path))
    out = {}
    for label, suffix, fn in SPOTS:
        ct = sum(v[3] for (f, _l, n), v in st.stats.items() if n == fn and (not suffix or f.endswith(suffix)))
        if ct:
            out[label] = round(ct / pkts * 1e6, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--ab", choices=sorted(ARMS), default="mtu")
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--size", default="256M")
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR")
    ap.add_argument("-j", "--json", action="store_true")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/gigabit.py needs root (testbeds, mrcds)", file=sys.stderr)
        return 2
    text = (ROOT / "deploy" / "topologies" / "default.toml").read_text()
    text = re.sub(r'rate = "[^"]*"', f'rate = "{args.rate}"', text, count=1)
    arms = ARMS[args.ab]
    if args.profile is not None:
        doc: dict[str, Any] = {a.label: profile(text, a, args.size, args.profile) for a in arms}
        print(json.dumps(doc, indent=2))
        return 0
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for a in arms if r % 2 == 0 else arms[::-1]:  # who goes first alternates
            row = {"round": r + 1, **one_round(text, a, args.size, args.iters)}
            rounds.append(row)
            if not args.json:
                print(f"round {r + 1} {a.label}: {row['goodput_gbps']:.3f} Gbit/s, CPU us per data packet "
                      f"h0 {row['h0_user_us']} user + {row['h0_sys_us']} sys, h2 {row['h2_user_us']} user + "
                      f"{row['h2_sys_us']} sys; {row['cpu_ms_per_mib']} ms per MiB", file=sys.stderr)
    keys = ("goodput_gbps", "cpu_us_per_pkt", "cpu_ms_per_mib", "h0_user_us", "h0_sys_us", "h2_user_us",
            "h2_sys_us")
    med = {a.label: {k: round(statistics.median(x[k] for x in rounds if x["arm"] == a.label), 3)
                     for k in keys} for a in arms}
    old_rows = [x for x in rounds if x["arm"] == arms[0].label]
    new_rows = [x for x in rounds if x["arm"] == arms[1].label]
    paired = {k: round(statistics.median(b[k] / a[k] for a, b in zip(old_rows, new_rows, strict=True)), 3)
              for k in ("goodput_gbps", "cpu_us_per_pkt", "cpu_ms_per_mib")}
    doc = {"ab": args.ab, "rate": args.rate, "size": args.size, "iters": args.iters, "cpus": os.cpu_count(),
           "median": med, "paired_second_over_first": paired, "rounds": rounds}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print("| arm | goodput Gbit/s | CPU us per data packet (h0 user + sys, h2 user + sys) | "
          "CPU ms per MiB |")
    print("|---|---|---|---|")
    for a in arms:
        m = med[a.label]
        print(f"| {a.label} | {m['goodput_gbps']} | {m['cpu_us_per_pkt']} ({m['h0_user_us']} + "
              f"{m['h0_sys_us']}, {m['h2_user_us']} + {m['h2_sys_us']}) | {m['cpu_ms_per_mib']} |")
    print(f"paired {arms[1].label} / {arms[0].label}: goodput {paired['goodput_gbps']}, CPU per packet "
          f"{paired['cpu_us_per_pkt']}, CPU per MiB {paired['cpu_ms_per_mib']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
