"""Ranks over MRC for `mrcctl allreduce --transport mrc` (docs/collective.md, "Ranks over MRC").

`MrcRunner` is a `mrc.collective.bench.Runner`: it starts K rank processes per testbed host, host-major
(`place_ranks`: ranks 0..K-1 on the first host, K..2K-1 on the second, ...; `python -m
mrc.ctl.allreduce_rank`, each in its own session, ended by PID on every exit path), gives them a
rendezvous (a torch.distributed TCPStore served from this process when torch is importable, else a
directory of JSON files written atomically), and for each iteration hands every rank its input buffer
(a float32 file in a private run directory on /dev/shm), lets them all-reduce over their mrcds and reads
their results back (with the bytes each rank sent through MRC and to co-located ranks, which go through
shared memory: `dataplane.collective.RankTransport`): the iteration time runs from the first rank's
start to the last rank's end (one machine, one CLOCK_MONOTONIC), and every rank's result must be
bit-identical to rank 0's.

With a failure (A:B@SECONDS, optional heal-after) the link goes down SECONDS after the first measured
iteration started (through the testbed API, as `mrcctl bench write --fail-link`) and comes back later;
an iteration reports `failed_link_down` when the link was down at any moment between its start and end.
With `sample_s` the per-plane bytes sent by every host's egress program (mrcd's `stats`) are sampled in a
thread: `timeline()` gives per-plane throughput over time with the iterations and the failure on the
same clock.

`RankProcesses` (the rank processes' life: start in their own sessions, JSON lines both ways, end by PID
on every exit path), `serve_store` (the rendezvous this process serves), `rank_env` (one BLAS thread) and
`slot_bytes` (the largest message) are shared with the DDP ranks (ctl/ddp_rank.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any, Final

import numpy as np
import numpy.typing as npt

from mrc.collective import Config, Result
from mrc.collective.hier import LAYOUTS
from mrc.collective.ring import max_message_bytes
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import MrcClient
from mrc.dataplane.collective import torch_available
from mrc.errors import MrcError
from mrc.quant.accel import prime as prime_codec

F32 = npt.NDArray[np.float32]
READY_TIMEOUT_S: Final = 120.0
RENDEZVOUS: Final = ("auto", "tcpstore", "file")


def slot_bytes(size_bytes: int, ranks: int, algorithm: str) -> int:
    """MRC slot size for a buffer of `size_bytes`: the largest message the collective posts
    (mrc.collective.ring.max_message_bytes: one pipelined segment for the ring)."""
    return max_message_bytes(size_bytes // 4, ranks, algorithm)


def layout_for(layout: str, ranks_per_host: int) -> str:
    """The layout a run uses: `auto` is the hierarchy with several ranks per host (docs/collective.md,
    "Ranks per host: flat ring or hierarchy"), the flat ring otherwise; `hier` with one rank per host is
    the flat ring (there is nothing to reduce within a host)."""
    if layout == "auto":
        return "hier" if ranks_per_host > 1 else "flat"
    return "flat" if ranks_per_host == 1 else layout


def place_ranks(hosts: list[str], ranks: int, ranks_per_host: int | None = None) -> list[str]:
    """Every rank's host, host-major: ranks 0..K-1 on hosts[0], K..2K-1 on hosts[1], ... so that the
    ring crosses the fabric only between host groups. K = `ranks_per_host`, or by default 1 when `ranks`
    fits the hosts and `ranks / len(hosts)` otherwise (then `ranks` must be a multiple of the hosts).
    At least 2 hosts are used (a ring within one host would not touch MRC)."""
    if ranks < 2:
        raise MrcError("--transport mrc needs at least 2 ranks")
    if ranks_per_host is None:
        if ranks <= len(hosts):
            ranks_per_host = 1
        elif ranks % len(hosts):
            raise MrcError(f"{ranks} ranks on {len(hosts)} hosts: the ranks must be at most the hosts or a "
                           "multiple of them (or say --ranks-per-host)")
        else:
            ranks_per_host = ranks // len(hosts)
    if ranks_per_host < 1 or ranks % ranks_per_host:
        raise MrcError(f"{ranks} ranks are not a whole number of hosts at {ranks_per_host} ranks per host")
    used = ranks // ranks_per_host
    if used > len(hosts):
        raise MrcError(f"{ranks} ranks at {ranks_per_host} per host need {used} hosts; the testbed has "
                       f"{len(hosts)}")
    if used < 2:
        raise MrcError(f"{ranks} ranks at {ranks_per_host} per host use one host: --transport mrc needs "
                       "ranks on at least 2 hosts")
    return [hosts[r // ranks_per_host] for r in range(ranks)]


#: glibc malloc for the rank processes: blocks up to 32 MiB (glibc's largest mmap threshold) come from
#: the heap and freed heap memory stays in the process, so the multi-MiB message buffers of one step
#: reuse the pages of the last instead of asking the kernel for fresh, zeroed ones (mmap threshold and
#: trimming otherwise adapt per free and return them). Measured in docs/collective.md, "Rank memory".
RANK_MALLOC: Final = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"


def rank_env() -> dict[str, str]:
    """The rank processes' environment: one BLAS thread per rank (n processes each spinning a thread pool
    on a small machine slow the codec's dot products twenty-fold: measured 570 -> 28 ms for 1 MiB at 4
    ranks on 2 cores) and RANK_MALLOC, unless the caller's environment sets GLIBC_TUNABLES itself.
    MRC_RING_ZERO_COPY=0 leaves malloc as it is (the old behaviour, for side-by-side runs)."""
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(k, "1")
    if env.get("MRC_RING_ZERO_COPY", "1").strip() != "0":
        env.setdefault("GLIBC_TUNABLES", RANK_MALLOC)
    return env


def serve_store(choice: str, rundir: Path, timeout_s: float) -> tuple[Any, str, str]:
    """The rendezvous served from this process: (store object to keep alive, URL for the ranks, name).
    `tcpstore`: torch.distributed's TCPStore on 127.0.0.1, an ephemeral port; `file`: JSON files in
    `rundir`; `auto`: TCPStore when torch is importable."""
    if choice not in RENDEZVOUS:
        raise MrcError(f"rendezvous must be one of {', '.join(RENDEZVOUS)}")
    if choice == "tcpstore" and not torch_available():
        raise MrcError("rendezvous tcpstore needs torch (torch.distributed)")
    if choice == "tcpstore" or (choice == "auto" and torch_available()):
        import datetime

        import torch.distributed as dist

        store = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", 0, None, True, datetime.timedelta(seconds=timeout_s), wait_for_workers=False)
        return store, f"tcp://127.0.0.1:{store.port}", "torch TCPStore"
    return None, f"file:{rundir / 'rendezvous'}", "json files"


class RankProcesses:
    """Rank processes of one run, rank r on hosts[r] (a host may hold several): each started in its own
    session with a JSON-lines protocol (commands on stdin, one answer per line on stdout: {"ready"|"ok":
    ...} or {"error": ...}), stderr to `rundir/rank<r>.log`; `close` ends them by PID on every exit path
    (a `quit` line, then SIGTERM, then SIGKILL) — a rank whose launcher vanished sees end of stdin and
    leaves."""

    def __init__(self, hosts: list[str], rundir: Path) -> None:
        self.hosts = hosts
        self.rundir = rundir
        self.procs: list[subprocess.Popen[str]] = []
        self.logs: list[IO[bytes]] = []
        # the codec's numba kernels: compiled (or loaded from the on-disk cache) once here, before the
        # ranks start, instead of by every rank at once on an empty cache (docs/quant.md §8)
        prime_codec()

    def start(self, cmd: list[str], env: dict[str, str]) -> None:
        """Start the next rank (rank len(procs))."""
        log = open(self.rundir / f"rank{len(self.procs)}.log", "wb")  # noqa: SIM115 (closed in close())
        self.logs.append(log)
        self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                           text=True, start_new_session=True, env=env))

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> list[Any]:
        return self.answers(timeout, "ready")

    def log_tail(self, r: int) -> str:
        try:
            lines = (self.rundir / f"rank{r}.log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def _read(self, r: int, key: str) -> Any:
        """Rank r's answer line (readable now): its `key`, or its error raised."""
        p = self.procs[r]
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            p.wait(5)
            tail = self.log_tail(r)
            raise MrcError(f"rank {r} ({self.hosts[r]}) exited (status {p.returncode})"
                           + (f": {tail}" if tail else ""))
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            doc = None
        if not isinstance(doc, dict) or ("error" not in doc and key not in doc):
            raise MrcError(f"rank {r} ({self.hosts[r]}): expected a {key!r} line, got {line.strip()[:200]!r}")
        if "error" in doc:
            raise MrcError(str(doc["error"]))
        return doc[key]

    def answers(self, timeout: float, key: str = "ok") -> list[Any]:
        """One answer from every rank, in rank order, waiting on all of them at once. The first failure
        (a rank's error, its exit, or no answer within `timeout`) ends every rank and is raised then: a
        rank that failed leaves its peers waiting for messages that will never come, and waiting for
        their answers one by one held the run for their whole transport timeout (120 s by default)."""
        got: list[Any] = [None] * len(self.procs)
        pending = set(range(len(self.procs)))
        deadline = time.monotonic() + timeout
        try:
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    r = min(pending)
                    raise MrcError(f"rank {r} ({self.hosts[r]}): no answer within {timeout:.0f} s")
                files: dict[IO[str], int] = {}
                for r in sorted(pending):
                    out = self.procs[r].stdout
                    assert out is not None
                    files[out] = r
                rd, _, _ = select.select(list(files), [], [], min(left, 1.0))
                for f in rd:
                    r = files[f]
                    got[r] = self._read(r, key)
                    pending.discard(r)
        except MrcError:
            self.close(grace_s=0.0)
            raise
        return got

    def send(self, r: int, doc: dict[str, Any]) -> None:
        p = self.procs[r]
        assert p.stdin is not None
        try:
            p.stdin.write(json.dumps(doc) + "\n")
            p.stdin.flush()
        except (OSError, ValueError):  # a broken pipe, or a rank already ended (its stdin closed)
            raise MrcError(f"rank {r} ({self.hosts[r]}) is gone: {self.log_tail(r)}") from None

    def close(self, grace_s: float = 10.0) -> None:
        """End every rank: a `quit` line, `grace_s` to leave, then SIGTERM, then SIGKILL (by PID). Safe
        to call again."""
        for r, p in enumerate(self.procs):
            if p.poll() is None:
                with contextlib.suppress(MrcError):
                    self.send(r, {"op": "quit"})
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.1, deadline - time.monotonic()))
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGKILL)
                    p.wait(5)
            for f in (p.stdin, p.stdout):
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()
        for log in self.logs:
            log.close()
        self.logs = []


class MrcRunner:
    name = "mrc"

    def __init__(self, testbed: str, ranks: int, size_bytes: int, algorithm: str, *,
                 fail_link: tuple[str, str, float] | None = None, heal_after: float | None = None,
                 sample_s: float = 0.0, timeout_s: float = 120.0, rendezvous: str = "auto",
                 ranks_per_host: int | None = None, layout: str = "auto", intra: str = "none",
                 intra_bits: float = 8.0, progress: Any = lambda _m: None) -> None:
        if rendezvous not in RENDEZVOUS:
            raise MrcError(f"rendezvous must be one of {', '.join(RENDEZVOUS)}")
        if layout not in LAYOUTS:
            raise MrcError(f"layout must be one of {', '.join(LAYOUTS)}")
        self.rendezvous_choice = rendezvous
        self.testbed = testbed
        self.tb = tbmod.Testbed.load(testbed)
        try:
            self.rank_hosts = place_ranks(self.tb.topo.host_names(), ranks, ranks_per_host)
        except MrcError as e:
            raise MrcError(f"testbed {testbed}: {e}") from None
        self.hosts = list(dict.fromkeys(self.rank_hosts))  # the hosts used, in order
        self.ranks_per_host = ranks // len(self.hosts)
        # the hierarchy needs several ranks on a host to reduce there; with one it would be the flat ring
        self.layout = layout_for(layout, self.ranks_per_host)
        if self.layout == "hier" and algorithm != "ring":
            raise MrcError("--layout hier runs the ring between the hosts: --algorithm ring")
        self.intra, self.intra_bits = intra, intra_bits
        # per measured iteration: message bytes of all ranks through MRC and to co-located ranks
        self.split_bytes: dict[int, tuple[int, int]] = {}
        self.rank_cpu: dict[int, tuple[float, int]] = {}  # step -> (ranks' CPU s, their page faults)
        if fail_link is not None:
            self.tb.link(fail_link[0], fail_link[1])
        self.fail_link = fail_link
        self.heal_after = heal_after
        self.sample_s = sample_s
        self.timeout_s = timeout_s
        self.progress = progress
        # hier: the intra-host messages are the whole buffer's segments (a one-rank "ring"'s), never
        # smaller than the leaders' ring's
        self.slot_bytes = slot_bytes(size_bytes, 1 if self.layout == "hier" else ranks, algorithm)
        self.store: Any = None
        self.rendezvous = ""
        self.t_ref: int | None = None
        self.down: list[tuple[int, int | None]] = []  # (down_ns, up_ns or None)
        self.iter_marks: list[dict[str, Any]] = []
        self.samples: list[tuple[int, list[int]]] = []
        self.events: list[tuple[int, str]] = []
        self._timers: list[threading.Timer] = []
        self._link_lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.rundir = Path(tempfile.mkdtemp(prefix="mrc-allreduce-", dir=base))
        self.ranks = RankProcesses(self.rank_hosts, self.rundir)
        self.procs = self.ranks.procs  # the rank processes (Popen), rank r at index r
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- ranks
    def _start(self) -> None:
        self.store, url, self.rendezvous = serve_store(self.rendezvous_choice, self.rundir, self.timeout_s)
        self.progress(f"  {len(self.rank_hosts)} rank processes, {self.ranks_per_host} per host on "
                      f"{', '.join(self.hosts)} (rendezvous: {self.rendezvous}; "
                      f"slots of {self.slot_bytes} B)")
        env = rank_env()
        for h in self.rank_hosts:
            self.ranks.start([sys.executable, "-m", "mrc.ctl.allreduce_rank", "--rank", str(len(self.procs)),
                              "--hosts", ",".join(self.rank_hosts), "--ns", self.tb.ns(h), "--store", url,
                              "--slot-bytes", str(self.slot_bytes), "--timeout", str(self.timeout_s),
                              "--prefix", f"ar{os.getpid()}"], env)
        self.ranks.wait_ready()

    def _send(self, r: int, doc: dict[str, Any]) -> None:
        self.ranks.send(r, doc)

    # -- failure and sampling
    def _begin(self) -> None:
        self.t_ref = time.monotonic_ns()
        if self.sample_s > 0:
            self._sampler = threading.Thread(target=self._sample, name="plane-sampler", daemon=True)
            self._sampler.start()
        if self.fail_link is not None:
            at = self.fail_link[2]
            self._timers.append(threading.Timer(at, self._set_link, (False,)))
            if self.heal_after is not None:
                self._timers.append(threading.Timer(at + self.heal_after, self._set_link, (True,)))
            for t in self._timers:
                t.daemon = True
                t.start()

    def _set_link(self, up: bool) -> None:
        assert self.fail_link is not None
        a, b, _ = self.fail_link
        with self._link_lock:
            if up and (not self.down or self.down[-1][1] is not None):
                return
            t = time.monotonic_ns()
            if not up:
                self.down.append((t, None))
            tbmod.set_link(self.testbed, a, b, up=up)
            if up:
                self.down[-1] = (self.down[-1][0], time.monotonic_ns())
            self.events.append((t, f"{a}-{b} {'up' if up else 'down'}"))
        self.progress(f"  link {a}-{b} {'up again' if up else 'down'}")

    def _sample(self) -> None:
        clients = []
        try:
            clients = [MrcClient.for_host(self.tb.ns(h)) for h in self.hosts]
            while not self._stop.is_set():
                t = time.monotonic_ns()
                per_plane = [0] * self.tb.topo.planes
                for c in clients:
                    st = c.call("stats")
                    for p, row in st["dataplane"]["planes"].items():
                        per_plane[int(p)] += int(row.get("tx_bytes", 0))
                self.samples.append((t, per_plane))
                self._stop.wait(self.sample_s)
        except (MrcError, OSError, KeyError) as e:
            self.progress(f"  plane sampler stopped: {e}")
        finally:
            for c in clients:
                c.close()

    # -- Runner
    def run(self, buffers: list[F32], cfg: Config, step: int) -> tuple[list[Result], float, bool]:
        n = len(self.procs)
        if len(buffers) != n:
            raise MrcError(f"{len(buffers)} buffers for {n} ranks")
        ins, outs = [], []
        for r, b in enumerate(buffers):
            ins.append(self.rundir / f"in{r}.f32")
            outs.append(self.rundir / f"out{r}.f32")
            np.ascontiguousarray(b, np.float32).tofile(ins[r])
        if step >= 0 and self.t_ref is None:
            self._begin()
        conf = {"scheme": cfg.scheme, "bits": cfg.bits, "partial_sums": cfg.partial_sums,
                "algorithm": cfg.algorithm, "seed": cfg.seed, "average": cfg.average,
                "correlation": cfg.correlation}
        for r in range(n):
            self._send(r, {"op": "run", "step": step, "input": str(ins[r]), "output": str(outs[r]),
                           "config": conf, "layout": self.layout, "intra": self.intra,
                           "intra_bits": self.intra_bits})
        # every rank has read its input before any starts: the iteration's clock is the collective's,
        # not the spread of the ranks' file reads
        # (a rank that fails ends them all: `RankProcesses.answers`)
        self.ranks.answers(self.timeout_s + 30, "loaded")
        for r in range(n):
            self._send(r, {"op": "go"})
        answers: list[dict[str, Any]] = self.ranks.answers(self.timeout_s + 30)
        t0 = min(int(a["t_start_ns"]) for a in answers)
        t1 = max(int(a["t_end_ns"]) for a in answers)
        results = []
        for r, a in enumerate(answers):
            # mapped, not copied: the page cache's pages, no fresh 64 MiB per rank (the mapping stays
            # valid after the file is unlinked below)
            size = outs[r].stat().st_size
            if size != 4 * buffers[r].size:
                raise MrcError(f"rank {r} wrote {size} bytes of result where {4 * buffers[r].size} "
                               f"were expected")
            out = np.memmap(outs[r], dtype=np.float32, mode="r") if size else np.zeros(0, np.float32)
            results.append(Result(out, int(a["wire_bytes"]), int(a["messages"]),
                                  tuple(float(x) for x in a["bits_per_hop"])))
        for r in range(1, n):
            if not np.array_equal(results[r].out, results[0].out):
                raise MrcError(f"rank {r}'s result differs from rank 0's")
        down = any(d0 <= t1 and (d1 is None or d1 >= t0) for d0, d1 in self.down)
        if step >= 0:
            self.split_bytes[step] = (sum(int(a.get("mrc_bytes", 0)) for a in answers),
                                      sum(int(a.get("local_bytes", 0)) for a in answers))
            self.rank_cpu[step] = (round(sum(float(a.get("cpu_s", 0.0)) for a in answers), 4),
                                   sum(int(a.get("page_faults", 0)) for a in answers))
        if step >= 0 and self.t_ref is not None:
            self.iter_marks.append({"iter": step, "start_s": (t0 - self.t_ref) / 1e9,
                                    "end_s": (t1 - self.t_ref) / 1e9, "link_down": down})
        for f in (*ins, *outs):
            f.unlink(missing_ok=True)
        return results, (t1 - t0) / 1e9, down

    # -- report
    def extra(self) -> dict[str, Any]:
        """What the MRC run adds to the report: hosts, rendezvous, the failure, the timeline."""
        ref = self.t_ref or 0
        doc: dict[str, Any] = {"testbed": self.testbed, "hosts": self.hosts, "rendezvous": self.rendezvous,
                               "slot_bytes": self.slot_bytes, "ranks_per_host": self.ranks_per_host,
                               "layout": self.layout, "intra": self.intra if self.layout == "hier" else None,
                               "split_bytes": dict(self.split_bytes), "rank_cpu": dict(self.rank_cpu)}
        if self.fail_link is not None:
            a, b, at = self.fail_link
            doc["failure"] = {
                "link": f"{a}-{b}", "at_s": at, "heal_after_s": self.heal_after,
                "down_s": [round((d0 - ref) / 1e9, 3) for d0, _ in self.down],
                "up_s": [None if d1 is None else round((d1 - ref) / 1e9, 3) for _, d1 in self.down],
            }
        if self.sample_s > 0:
            planes: list[list[float]] = [[] for _ in range(self.tb.topo.planes)]
            ts: list[float] = []
            for (ta, pa), (tb_, pb) in zip(self.samples, self.samples[1:], strict=False):
                dt = (tb_ - ta) / 1e9
                if dt <= 0:
                    continue
                ts.append(round(((ta + tb_) / 2 - ref) / 1e9, 3))
                for p in range(len(planes)):
                    planes[p].append(round((pb[p] - pa[p]) * 8 / dt / 1e9, 6))
            doc["timeline"] = {"t_s": ts, "plane_tx_gbps": planes, "iterations": self.iter_marks,
                               "sample_s": self.sample_s}
        return doc

    def close(self) -> None:
        self._stop.set()
        for t in self._timers:
            t.cancel()
        if self._sampler is not None:
            self._sampler.join(10)
        with self._link_lock:
            if self.fail_link is not None and self.down and self.down[-1][1] is None:
                with contextlib.suppress(Exception):
                    tbmod.set_link(self.testbed, self.fail_link[0], self.fail_link[1], up=True)
                self.down[-1] = (self.down[-1][0], time.monotonic_ns())
        self.ranks.close()
        self.store = None
        shutil.rmtree(self.rundir, ignore_errors=True)

    def __enter__(self) -> MrcRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
