"""`mrcctl sim run allreduce`: ring all-reduce time over the simulated fabric (docs/collective.md §7).

The message sizes are the real ones: the collective (mrc.collective.allreduce) runs in-process on random
float32 buffers through a transport that records every chunk it posts. The fabric then carries those
messages: one rank per host (ranks spread over the leaves), each message one RDMA WRITE from rank i to
rank i + 1 (MRC engines, or the single-path baseline). The ring pipelines its chunks segment by segment
(mrc.collective.ring): segment j of ring step s leaves rank i as soon as rank i has received segment j of
step s - 1 from rank i - 1 (the data dependency; as with unbounded slots, and the compute time of
decode-add-encode is not simulated). Time = the last message's completion. The same run with `none`
(uncompressed float32) gives the speed-up of compression on the same fabric.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import numpy as np

from mrc.collective import Config, Transport, allreduce, run_inproc

from . import limits
from .experiments import (
    Progress,
    RunSpec,
    VariantMap,
    _host_params,
    _loop_speed,
    _reporter,
    _run_jobs,
    check_run,
    in_process,
)
from .fabric import Fabric
from .hosts import Flow, Traffic


class _Recorder:
    """A Transport that forwards to another and records (ring step, segment, size) of every message
    posted, in order (the step and segment from the ring's tags)."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.messages: list[tuple[int, int, int]] = []
        self.send_window = getattr(inner, "send_window", 1)

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def world_size(self) -> int:
        return self.inner.world_size

    def send(self, dst: int, tag: int, data: bytes | memoryview) -> None:
        self.messages.append((*ring_position(tag, self.world_size), len(data)))
        self.inner.send(dst, tag, data)

    def recv(self, src: int, tag: int) -> bytes:
        return self.inner.recv(src, tag)

    def flush(self) -> None:
        self.inner.flush()


def ring_position(tag: int, n: int) -> tuple[int, int]:
    """(ring step 0 .. 2 (n - 1) - 1, segment) of a ring message from its tag (mrc.collective.ring)."""
    phase, low = tag >> 20, tag & ((1 << 20) - 1)
    step, seg = low >> 8, low & 0xFF
    if phase == 1:
        return step, seg
    if phase == 2:
        return n - 1 + step, seg
    raise ValueError(f"tag {tag:#x} is not a ring message")


def message_sizes(ranks: int, elements: int, cfg: Config, seed: int) -> list[list[tuple[int, int, int]]]:
    """msgs[r]: (ring step, segment, bytes) of every message rank r posts to rank r + 1, in order
    (2 (n - 1) steps, one message per segment of the chunk a step carries)."""
    rng = np.random.default_rng(seed)
    bufs = [rng.standard_normal(elements, dtype=np.float32) for _ in range(ranks)]

    def body(t: Transport) -> list[tuple[int, int, int]]:
        rec = _Recorder(t)
        allreduce(rec, bufs[t.rank], cfg, 0)
        return rec.messages

    return run_inproc(ranks, body)


def _ring_time(spec: RunSpec, variant: str, msgs: list[list[tuple[int, int, int]]], hosts: list[int],
               until_ns: int, progress: Progress | None, label: str) -> dict[str, Any]:
    """One ring all-reduce over a fresh fabric: the result row, with the run's "speed"."""
    fs = spec.fabric
    n = len(msgs)
    flows: list[Flow] = []
    index: dict[tuple[int, int, int], int] = {}  # (rank, step, segment) -> flow
    for r in range(n):
        for step, seg, size in msgs[r]:
            index[(r, step, seg)] = len(flows)
            flows.append(Flow(hosts[r], hosts[(r + 1) % n], max(1, size), start_ns=-1))
    # flow -> the flow it waits for: the left neighbour's same segment one step earlier
    after = {i: index[((r - 1) % n, step - 1, seg)] for (r, step, seg), i in index.items() if step > 0}
    first = [i for (_r, step, _seg), i in index.items() if step == 0]
    fab = Fabric(fs.topology(), fs.params(trimming=variant != "mrc-notrim"))
    tr = Traffic(fab, variant, flows, _host_params(spec), until_ns)
    waiting = dict(after)

    def tick(t: int) -> None:
        tr.poll(t)
        for i, dep in list(waiting.items()):
            if tr.done_ns[dep] >= 0:
                del waiting[i]
                tr.start_flow(i, t)
        if not tr.all_done():
            fab.at(t + 500, tick)

    def begin(t: int) -> None:
        for i in first:
            tr.start_flow(i, t)
        tick(t)

    fab.at(0, begin)
    t0 = time.perf_counter()
    fab.run(until_ns=until_ns, stop=tr.all_done, check_every=1024,
            progress=_reporter(progress, label, until_ns))
    tr.poll(fab.now)
    wall = time.perf_counter() - t0
    ok = all(st == "SUCCESS" for st in tr.status)
    return {
        "completed": ok,
        "time_s": max(tr.done_ns) / 1e9 if ok else None,
        "wire_bytes": sum(f.size or 0 for f in flows),
        "wall_s": round(wall, 2),
        **tr.counters(),
        "speed": _loop_speed(fab),
    }


def run(spec: RunSpec, ranks: int, size_bytes: int, cfg: Config, time_limit_ns: int = 1_000_000_000,
        progress: Progress | None = None, run_all: VariantMap = in_process) -> dict[str, Any]:
    """Ring all-reduce of `size_bytes` of float32 per rank with `cfg` and uncompressed, per variant."""
    check_run(spec, time_limit_ns)
    fs = spec.fabric
    limits.integer("size_bytes", size_bytes, 4, limits.MAX_BUFFERS_BYTES, " bytes")
    if ranks * size_bytes > limits.MAX_BUFFERS_BYTES:  # the collective runs in-process on real buffers
        raise ValueError(f"{ranks} ranks x {size_bytes} bytes: at most 1 GiB ({limits.MAX_BUFFERS_BYTES} "
                         "bytes) in all")
    if ranks < 2 or ranks > fs.hosts:
        raise ValueError(f"{ranks} ranks need 2..{fs.hosts} hosts (the fabric has {fs.hosts})")
    elements = size_bytes // 4
    if elements < ranks:
        raise ValueError(f"{size_bytes} bytes is fewer float32 elements than ranks")
    spread = fs.hosts // ranks
    hosts = [r * spread for r in range(ranks)]
    if progress:
        progress(f"allreduce: compressing {ranks} x {size_bytes} bytes ({cfg.scheme}) for the message sizes")
    cases = {"compressed": message_sizes(ranks, elements, cfg, spec.seed),
             "uncompressed": message_sizes(ranks, elements, Config("none"), spec.seed)}
    runs = [(v, case) for v in spec.variants for case in cases]

    def one(run: tuple[str, str]) -> dict[str, Any]:
        variant, case = run
        return _ring_time(spec, variant, cases[case], hosts, time_limit_ns, progress, f"{variant} {case}")

    outs, speed = _run_jobs(run_all, one, runs)
    results: dict[str, Any] = {}
    for (variant, case), r in zip(runs, outs, strict=True):
        del r["speed"]
        t = r["time_s"]
        algbw = size_bytes / t / 1e9 if t else None
        busbw = algbw * 2 * (ranks - 1) / ranks if algbw is not None else None
        results.setdefault(variant, {})[case] = {**r, "algbw_gbps": algbw, "busbw_gbps": busbw}
    for row in results.values():
        tc, tu = row["compressed"]["time_s"], row["uncompressed"]["time_s"]
        row["speedup"] = tu / tc if tc and tu else None
    return {
        "experiment": "allreduce",
        "config": {**asdict(spec), "ranks": ranks, "size_bytes": size_bytes, "hosts": hosts,
                   "scheme": cfg.scheme, "bits": cfg.bits, "partial_sums": cfg.partial_sums,
                   "algorithm": cfg.algorithm},
        "results": results,
        **speed,
    }
