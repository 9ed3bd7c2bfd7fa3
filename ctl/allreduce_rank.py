"""One all-reduce rank over MRC (started by `mrcctl allreduce --transport mrc`, K per testbed host).

    python -m mrc.ctl.allreduce_rank --rank R --hosts h0,h0,h1,h1 --ns NS --store URL --slot-bytes N

`--hosts` names every rank's host (rank i on the i-th; a host appears once per rank it holds). It opens a
`RankTransport` (rendezvous in the store): ranks on other hosts through its host's mrcd, co-located ranks
through shared memory; says ``{"ready": ...}`` on stdout, then follows commands from stdin, one JSON
object per line:

    {"op": "run", "step": K, "input": PATH, "output": PATH, "config": {...}}
        read the float32 buffer at PATH, answer {"loaded": R} and wait for the line {"op": "go"} (the
        launcher sends it once every rank has loaded: the clock starts together, not skewed by how
        long each rank took to read its input), all-reduce it (mrc.collective.allreduce), write the
        result to OUTPUT; answer {"ok": {"t_start_ns", "t_end_ns", "wire_bytes", "mrc_bytes",
        "local_bytes", "messages", "bits_per_hop", "cpu_s", "page_faults"}} (mrc_bytes + local_bytes =
        wire_bytes: this run's message bytes that went through MRC / to co-located ranks; cpu_s: the
        rank's user + system time during the all-reduce, page_faults its minor faults then)
        With "layout": "hier" (and "intra", "intra_bits") the run is the hierarchical all-reduce
        (mrc.collective.hier): the ranks of each host reduce to the host's first rank over shared memory,
        those leaders run the ring between the hosts over MRC, and each leader sends the result back.
    {"op": "quit"}  (or end of stdin: the launcher went away)  -> destroy the QPs and exit

Any failure is answered {"error": "one line"}; after a transport failure the rank exits (its peers then
fail their own waits and say so).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import numpy as np

from mrc.collective import Config, Result, TransportError, allreduce, ring
from mrc.collective.hier import allreduce_hosts
from mrc.collective.transport import Transport
from mrc.dataplane.collective import RankTransport, open_store
from mrc.errors import MrcError

from .rank_proc import leave_on_sigterm, rank_parser, say


def load(path: str, keep: np.ndarray | None) -> np.ndarray:
    """The float32 buffer in the file at `path`, read into `keep` when that has the file's length."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size % 4:
            raise MrcError(f"{path}: {size} bytes is not a whole number of float32 values")
        buf = keep if keep is not None and keep.nbytes == size else np.empty(size // 4, np.float32)
        view = buf.data.cast("B")
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise MrcError(f"{path}: ended after {got} of {size} bytes")
            got += n
    return buf


def hier_allreduce(t: Transport, hosts: list[str], x: np.ndarray, cfg: Config, step: int, intra: str,
                   intra_bits: float, out: np.ndarray | None, work: np.ndarray | None) -> Result:
    """The hierarchical all-reduce over this rank's transport, as the ring's `Result` (wire bytes: the
    message bytes of both kinds, MRC and shared memory, as the flat ring counts them)."""
    res = allreduce_hosts(t, hosts, x, cfg, step, intra, intra_bits, out, work)
    return Result(res.out, res.inter_bytes + res.intra_bytes, res.messages, res.bits_per_hop)


def main(argv: list[str] | None = None) -> int:
    ap = rank_parser("mrc.ctl.allreduce_rank", "mrc-ar")
    ap.add_argument("--slot-bytes", type=int, required=True)
    # slots per peer = messages in flight toward a peer (the ring's pipelining window): 4 measured faster
    # than 2 for both 2-bit (256 KiB segments: 0.63 vs 0.63-0.79 s) and uncompressed (4 MiB: 4.0-4.3 vs
    # 4.3-4.6 s) 64 MiB runs on default.toml (docs/collective.md §4a)
    ap.add_argument("--slots", type=int, default=4)
    a = ap.parse_args(argv)
    leave_on_sigterm()
    hosts = a.hosts.split(",")
    try:
        t = RankTransport(open_store(a.store, a.timeout), a.rank, hosts, a.ns, a.slot_bytes,
                          slots=a.slots, timeout_s=a.timeout, prefix=a.prefix)
    except (MrcError, OSError) as e:
        say({"error": f"rank {a.rank} ({hosts[a.rank]}): {e}"})
        return 1
    # the input and result buffers, kept while the size stays (ring.ZERO_COPY): no fresh 64 MiB twice
    # per iteration for the kernel to zero
    x: np.ndarray | None = None
    out: np.ndarray | None = None
    work: np.ndarray | None = None  # the hierarchy's host sum (leaders)
    try:
        say({"ready": {"rank": a.rank, "host": hosts[a.rank], "qpn": {p: q.qpn for p, q in t.qps.items()}}})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("op") == "quit":
                break
            if cmd.get("op") != "run":
                say({"error": f"unknown op {cmd.get('op')!r}"})
                continue
            cfg = Config(**cmd["config"])
            try:
                x = load(cmd["input"], x if ring.ZERO_COPY else None)
            except (MrcError, OSError) as e:
                say({"error": f"rank {a.rank} ({hosts[a.rank]}): input: {e}"})
                return 1
            say({"loaded": a.rank})
            go = json.loads(sys.stdin.readline() or '{"op": "quit"}')
            if go.get("op") == "quit":
                break
            if go.get("op") != "go":
                say({"error": f"rank {a.rank}: expected the go line, got {go.get('op')!r}"})
                return 1
            if ring.ZERO_COPY and (out is None or out.size != x.size):
                out = np.empty(x.size, np.float32)
            hier = cmd.get("layout", "flat") == "hier"
            if hier and ring.ZERO_COPY and (work is None or work.size != x.size):
                work = np.empty(x.size, np.float32)
            mrc0, local0 = t.mrc_bytes, t.local_bytes
            try:
                u0 = resource.getrusage(resource.RUSAGE_SELF)
                t0 = time.monotonic_ns()
                if hier:
                    res = hier_allreduce(t, hosts, x, cfg, int(cmd["step"]), str(cmd.get("intra", "none")),
                                         float(cmd.get("intra_bits", 8.0)), out if ring.ZERO_COPY else None,
                                         work if ring.ZERO_COPY else None)
                else:
                    res = allreduce(t, x, cfg, int(cmd["step"]), out=out if ring.ZERO_COPY else None)
                t1 = time.monotonic_ns()
                u1 = resource.getrusage(resource.RUSAGE_SELF)
            except (TransportError, MrcError, OSError) as e:
                say({"error": f"rank {a.rank} ({hosts[a.rank]}): {e}"})
                return 1
            res.out.tofile(cmd["output"])
            cpu = (u1.ru_utime - u0.ru_utime) + (u1.ru_stime - u0.ru_stime)
            say({"ok": {"t_start_ns": t0, "t_end_ns": t1, "wire_bytes": res.wire_bytes,
                         "mrc_bytes": t.mrc_bytes - mrc0, "local_bytes": t.local_bytes - local0,
                         "messages": res.messages, "bits_per_hop": list(res.bits_per_hop),
                         "cpu_s": round(cpu, 4), "page_faults": u1.ru_minflt - u0.ru_minflt}})
    finally:
        t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
