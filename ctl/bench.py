"""`mrcctl bench write`: perftest-style RDMA WRITE host to host through the testbed's mrcds.

The bench is an MRC application (client library): it registers one shared-memory region on each side,
opens a QP pair, and for each size runs `iters` WRITE-with-immediate of a seeded random buffer; each
iteration's time runs from the post to the responder's completion (both clocks are CLOCK_MONOTONIC on the
one machine). Before each iteration the destination is zeroed and after it compared with the source
(outside the timing): `bit_exact`.

With ``--fail-link A:B@S`` the link A-B is taken down S seconds into the (last) transfer and, with
``--heal-after H``, brought back H seconds later; the source mrcd's EV events and controller actions
give detect (first ASSUMED_BAD on an EV through the link), deny (mrcd's DENY of the link) and restore
(mrcd's restore after the link returned) times, and the acknowledged-byte timeline of the QP (sampled
every 10 ms) the goodput while the link is down and after it is restored.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from mrc.dataplane import netns
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import ClientQp, MrcClient, RemoteMr
from mrc.dataplane.fabric import FabricDataplane
from mrc.errors import MrcError
from mrc.wire.packet import payload_for_mtu

SAMPLE_S: Final = 0.01
#: the DestQP of the udp baseline's packets (no mrcd allocates it): allowed at the destination's
#: host_ingress for the run, dropped by its mrcd as an unknown QP, counted by the baseline's receiver
UDP_QPN: Final = 0xFFFFFE
UDP_IDLE_S: Final = 0.5


@contextlib.contextmanager
def prompt_thread() -> Iterator[None]:
    """Run the calling thread ahead of every ordinary task while it injects a failure: SCHED_FIFO (a
    real link fails at one instant, it does not wait for a time slice of a busy machine) and a GIL
    hand-over within 0.1 ms instead of the interpreter's 5 ms. Without the privilege it runs as it is."""
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    raised = False
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))  # 0: this thread (Linux)
        raised = True
    try:
        yield
    finally:
        if raised:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        sys.setswitchinterval(old_interval)


@dataclass
class BenchConfig:
    testbed: str
    src: str
    dst: str
    sizes: list[int]
    iters: int = 1
    planes: list[int] | None = None
    evs: int | None = None
    fail_link: tuple[str, str, float] | None = None
    heal_after: float | None = None
    baseline: str | None = None
    fail_mode: str = "down"  # down: the link is set down (carrier lost); blackhole: switch_port drops all
    seed: int = 1
    timeout_s: float = 600.0

    def to_dict(self) -> dict[str, Any]:
        return {"testbed": self.testbed, "src": self.src, "dst": self.dst, "sizes": self.sizes,
                "iters": self.iters, "planes": self.planes, "evs": self.evs,
                "fail_link": None if self.fail_link is None else
                {"a": self.fail_link[0], "b": self.fail_link[1], "at_s": self.fail_link[2]},
                "heal_after_s": self.heal_after, "fail_mode": self.fail_mode, "baseline": self.baseline,
                "seed": self.seed}


@dataclass
class Side:
    client: MrcClient
    mr: RemoteMr
    qp: ClientQp
    view: np.ndarray[Any, np.dtype[np.uint8]] = field(init=False)

    def __post_init__(self) -> None:
        self.view = np.frombuffer(self.mr.buf, dtype=np.uint8)


def parse_fail_link(value: str) -> tuple[str, str, float]:
    try:
        link, _, at = value.partition("@")
        a, b = link.split(":")
        return a, b, float(at or "1")
    except ValueError:
        raise MrcError(f"--fail-link {value!r}: expected A:B@SECONDS (e.g. p0l0:p0s0@1)") from None


def _delta(st0: dict[str, Any], st1: dict[str, Any], key: str) -> int:
    """How much counter `key` of two qp_stats answers moved (0 where the daemon has no such counter)."""
    return int(st1.get(key, 0)) - int(st0.get(key, 0))


def _retx(st: dict[str, Any]) -> int:
    return sum(int(st.get(f"retx_{c}", 0)) for c in ("sack", "trim", "timeout", "nack"))


class WriteBench:
    def __init__(self, cfg: BenchConfig, progress: Callable[[str], None] = lambda _m: None) -> None:
        self.cfg = cfg
        self.progress = progress
        self.tb = tbmod.Testbed.load(cfg.testbed)
        topo = self.tb.topo
        for h in (cfg.src, cfg.dst):
            if h not in topo.host_names():
                raise MrcError(f"testbed {cfg.testbed}: no host {h!r}")
        if cfg.src == cfg.dst:
            raise MrcError("--src and --dst must differ")
        if cfg.planes is not None:
            bad = [p for p in cfg.planes if not 0 <= p < topo.planes]
            if bad:
                raise MrcError(f"no plane {bad[0]} (planes 0..{topo.planes - 1})")
        if cfg.fail_link is not None:
            tbmod.Testbed.load(cfg.testbed).link(cfg.fail_link[0], cfg.fail_link[1])
        self.planes = cfg.planes if cfg.planes is not None else list(range(topo.planes))
        self.capacity_bps = len(self.planes) * topo.link.rate_bps
        # bytes per data packet, as mrcd's QPs on this testbed (ctl/site.py): what a PSN is worth and the
        # udp baseline's packet size
        self.payload = payload_for_mtu(topo.link.mtu)
        self.cwnd: list[int] = []

    # -- set-up
    def _open(self, size: int, evs: int | None, planes: list[int] | None) -> tuple[Side, Side]:
        a = MrcClient.for_host(self.tb.ns(self.cfg.src))
        b = MrcClient.for_host(self.tb.ns(self.cfg.dst))
        try:
            amr = a.reg_mr(size)
            bmr = b.reg_mr(size)
            qa = a.create_qp(self.cfg.dst, evs=evs, planes=planes)
            qb = b.create_qp(self.cfg.src, evs=evs, planes=planes)
            a.connect(qa, qb.qpn, qb.mtu)
            b.connect(qb, qa.qpn, qa.mtu)
        except BaseException:
            a.close()
            b.close()
            raise
        sa, sb = Side(a, amr, qa), Side(b, bmr, qb)
        rng = np.random.default_rng(self.cfg.seed)
        sa.view[:] = rng.integers(0, 256, size, dtype=np.uint8)
        return sa, sb

    @staticmethod
    def _close(*sides: Side) -> None:
        for s in sides:
            with contextlib.suppress(Exception):
                s.client.destroy_qp(s.qp)
            del s.view
            s.client.close()

    def _one(self, a: Side, b: Side, size: int, wr: int, sampler: list[tuple[int, int]] | None,
             on_start: Callable[[int], None] | None = None) -> tuple[float, bool]:
        b.view[:size] = 0
        b.client.post_recv(b.qp, wr)
        stop = threading.Event()
        th = None
        if sampler is not None:
            th = threading.Thread(target=self._sample, args=(a, stop, sampler), daemon=True)
        t0 = time.monotonic_ns()
        a.client.post_send(a.qp, wr_id=wr, mr=a.mr, offset=0, length=size, remote_addr=b.mr.addr,
                           rkey=b.mr.rkey, imm=wr & 0xFFFFFFFF)
        if on_start is not None:
            on_start(t0)
        if th is not None:
            th.start()
        try:
            wc = b.client.wait_wc(b.qp, wr, timeout=self.cfg.timeout_s)
            a.client.wait_wc(a.qp, wr, timeout=self.cfg.timeout_s)
        finally:
            stop.set()
            if th is not None:
                th.join()
        dt = (int(wc["time_ns"]) - t0) / 1e9
        exact = int(wc["byte_len"]) == size and bool(np.array_equal(a.view[:size], b.view[:size]))
        return dt, exact

    def _sample(self, a: Side, stop: threading.Event, out: list[tuple[int, int]]) -> None:
        c = MrcClient.for_host(self.tb.ns(self.cfg.src))
        try:
            while not stop.is_set():
                st = c.call("qp_stats", qpn=a.qp.qpn)
                out.append((int(st["time_ns"]), int(st["snd_una"])))
                self.cwnd.append(int(st["cwnd"]))
                stop.wait(SAMPLE_S)
        finally:
            c.close()

    # -- runs
    def run(self) -> dict[str, Any]:
        cfg = self.cfg
        rows = []
        exact_all = True
        total_bytes = 0
        total_s = 0.0
        failure = None
        biggest = max(cfg.sizes)
        a, b = self._open(biggest, cfg.evs, cfg.planes)
        try:
            wr = 0
            for size in cfg.sizes:
                times = []
                st0 = a.client.call("qp_stats", qpn=a.qp.qpn)
                for it in range(cfg.iters):
                    wr += 1
                    last = size == cfg.sizes[-1] and it == cfg.iters - 1
                    if cfg.fail_link is not None and last:
                        dt, exact, failure = self._with_failure(a, b, size, wr)
                    else:
                        dt, exact = self._one(a, b, size, wr, None)
                    times.append(dt)
                    exact_all &= exact
                    if not exact:
                        self.progress(f"  {size} B iteration {it}: destination differs from the source")
                st1 = a.client.call("qp_stats", qpn=a.qp.qpn)
                t = sum(times)
                pb0, pb1 = st0["port_bytes"], st1["port_bytes"]
                rows.append({
                    "bytes": size, "iters": cfg.iters,
                    "bw_peak_gbps": round(size * 8 / min(times) / 1e9, 6),
                    "bw_avg_gbps": round(size * cfg.iters * 8 / t / 1e9, 6),
                    "bw_min_gbps": round(size * 8 / max(times) / 1e9, 6),
                    "msg_rate": round(cfg.iters / t, 3),
                    "plane_gbps": {str(p): round((pb1[p] - pb0[p]) * 8 / t / 1e9, 6)
                                   for p in range(len(pb1))},
                    "retransmits": _retx(st1) - _retx(st0),
                    "trims": _delta(st0, st1, "nack_trim_rx"),
                    "rto": _delta(st0, st1, "rto"),
                    # loss calls later refuted, and EVs taken out of the spray: spurious ones cost the
                    # sender its fast path (docs/daemon.md, "Pacing that keeps up")
                    "lost_then_acked": _delta(st0, st1, "lost_then_acked"),
                    "ev_marked_bad": _delta(st0, st1, "ev_marked_bad"),
                    # ... and how many of those an acknowledgement showed to be wrong (paths.refute)
                    "ev_refuted": _delta(st0, st1, "ev_refuted"),
                    "seconds": round(t, 4),
                })
                total_bytes += size * cfg.iters
                total_s += t
                self.progress(f"  {size} B x {cfg.iters}: {rows[-1]['bw_avg_gbps']:.4f} Gb/s")
        finally:
            self._close(a, b)
        goodput = total_bytes * 8 / total_s / 1e9
        doc: dict[str, Any] = {
            "config": cfg.to_dict(), "capacity_gbps": self.capacity_bps / 1e9, "bit_exact": exact_all,
            "goodput_gbps": round(goodput, 6),
            "goodput_fraction": round(goodput * 1e9 / self.capacity_bps, 4),
            "rows": rows,
        }
        if failure is not None:
            doc["failure"] = failure
        if cfg.baseline == "single-path":
            doc["baseline"] = self._single_path(biggest)
        elif cfg.baseline == "tcp":
            doc["baseline"] = self._tcp(biggest)
        elif cfg.baseline == "udp":
            doc["baseline"] = self._udp(biggest)
        if "baseline" in doc and doc["baseline"]["goodput_gbps"]:
            doc["baseline"]["ratio"] = round(goodput / doc["baseline"]["goodput_gbps"], 3)
        return doc

    def _single_path(self, size: int) -> dict[str, Any]:
        self.progress(f"  baseline single-path: 1 EV on plane {self.planes[0]}")
        a, b = self._open(size, 1, [self.planes[0]])
        try:
            dt, exact = self._one(a, b, size, 1, None)
        finally:
            self._close(a, b)
        g = size * 8 / dt / 1e9
        return {"kind": "single-path", "bytes": size, "seconds": round(dt, 4), "goodput_gbps": round(g, 6),
                "goodput_fraction_of_one_plane": round(g * 1e9 / self.tb.topo.link.rate_bps, 4),
                "bit_exact": exact}

    def _tcp(self, size: int) -> dict[str, Any]:
        if shutil.which("iperf3") is None:
            raise MrcError("--baseline tcp needs iperf3")
        topo = self.tb.topo
        plane = self.planes[0]
        spine = topo.paths(self.cfg.src, self.cfg.dst, plane=plane)[0].spine
        # the client's source is the address that selects one micro-SID path (the testbed's kernel seg6
        # routes; the reply takes the reverse path): TCP over exactly one plane, one path
        src_addr = str(topo.path_address(self.cfg.src, self.cfg.dst, plane, spine))
        self.progress(f"  baseline tcp: iperf3 from {src_addr} (plane {plane}, one path)")
        dst_addr = str(topo.mrc_address(self.cfg.dst))
        server = subprocess.Popen(["iperf3", "-s", "-1", "-B", dst_addr], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL,
                                  preexec_fn=lambda: netns.enter_for_exec(self.tb.ns(self.cfg.dst)))
        try:
            time.sleep(0.3)
            res = subprocess.run(["iperf3", "-c", dst_addr, "-B", src_addr, "-n", str(size), "-J"],
                                 capture_output=True,
                                 text=True, timeout=self.cfg.timeout_s,
                                 preexec_fn=lambda: netns.enter_for_exec(self.tb.ns(self.cfg.src)))
        finally:
            if server.poll() is None:
                server.terminate()
            server.wait(5)
        import json

        try:
            end = json.loads(res.stdout)["end"]
            bps = float(end["sum_received"]["bits_per_second"])
        except (ValueError, KeyError) as e:
            raise MrcError(f"iperf3 failed: {res.stderr.strip() or e}") from None
        return {"kind": "tcp", "bytes": size, "goodput_gbps": round(bps / 1e9, 6),
                "goodput_fraction_of_one_plane": round(bps / self.tb.topo.link.rate_bps, 4)}

    def _udp_evs(self) -> list[int]:
        """The EV indices the source mrcd uses toward the destination on the bench's planes (GOOD ones),
        else those the path map holds for the pair (EV 0..63)."""
        c = MrcClient.for_host(self.tb.ns(self.cfg.src))
        try:
            rows = c.call("ev_show")["peers"].get(self.cfg.dst, [])
        finally:
            c.close()
        evs = [int(r["ev_index"]) for r in rows if int(r["plane"]) in self.planes and r["state"] == "GOOD"]
        if evs:
            return evs
        with FabricDataplane.open(self.cfg.testbed) as fd:
            found = [(ev, fd.lookup_path(self.cfg.src, self.cfg.dst, ev)) for ev in range(64)]
        return [ev for ev, p in found if p is not None and p.plane in self.planes]

    def _udp(self, size: int) -> dict[str, Any]:
        import json

        topo = self.tb.topo
        evs = self._udp_evs()
        if not evs:
            raise MrcError(f"--baseline udp: no path from {self.cfg.src} to {self.cfg.dst} on planes "
                           f"{self.planes}")
        mtu = self.payload
        packets = -(-size // mtu)
        src_addr, dst_addr = str(topo.mrc_address(self.cfg.src)), str(topo.mrc_address(self.cfg.dst))
        self.progress(f"  baseline udp: {packets} x {mtu} B sendmmsg over {len(evs)} EVs "
                      f"(planes {','.join(map(str, self.planes))})")
        code = "import sys; from mrc.ctl.bench import udp_blast_main; sys.exit(udp_blast_main(sys.argv[1:]))"
        fd = FabricDataplane.open(self.cfg.testbed)
        rx: subprocess.Popen[str] | None = None
        try:
            fd.allow_qps(self.cfg.dst, [UDP_QPN])
            rx = subprocess.Popen([sys.executable, "-c", code, "recv", str(packets), str(self.cfg.timeout_s),
                                   str(mtu)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  preexec_fn=lambda: netns.enter_for_exec(self.tb.ns(self.cfg.dst)))
            assert rx.stdout is not None
            if rx.stdout.readline().strip() != "ready":
                err = rx.stderr.read() if rx.stderr else ""
                raise MrcError(f"--baseline udp: the receiver failed: {err.strip()}")
            tx = subprocess.run([sys.executable, "-c", code, "send", src_addr, dst_addr, str(packets),
                                 ",".join(map(str, evs)), str(mtu)], capture_output=True, text=True,
                                timeout=self.cfg.timeout_s,
                                preexec_fn=lambda: netns.enter_for_exec(self.tb.ns(self.cfg.src)))
            if tx.returncode != 0:
                raise MrcError(f"--baseline udp: the sender failed: {tx.stderr.strip()}")
            sent = json.loads(tx.stdout)
            out, err = rx.communicate(timeout=self.cfg.timeout_s)
            if rx.returncode != 0:
                raise MrcError(f"--baseline udp: the receiver failed: {err.strip()}")
            got = json.loads(out)
        finally:
            if rx is not None and rx.poll() is None:
                rx.kill()
                rx.wait(5)
            with contextlib.suppress(Exception):
                fd.disallow_qp(self.cfg.dst, UDP_QPN)
            fd.close()
        full = int(got["full"])
        span = (int(got["last_ns"]) - int(sent["t0_ns"])) / 1e9 if full else 0.0
        g = full * mtu * 8 / span / 1e9 if span > 0 else 0.0
        tx_s = (int(sent["t1_ns"]) - int(sent["t0_ns"])) / 1e9
        return {"kind": "udp", "bytes": packets * mtu, "payload": mtu, "evs": len(evs), "planes": self.planes,
                "packets_sent": int(sent["sent"]), "send_errors": int(sent["errors"]),
                "packets_received": int(got["packets"]), "received_bytes": int(got["bytes"]),
                "trimmed": int(got["packets"]) - full, "delivered": round(full / max(1, packets), 4),
                "seconds": round(span, 4), "goodput_gbps": round(g, 6),
                "goodput_fraction": round(g * 1e9 / self.capacity_bps, 4),
                "tx_kpps": round(int(sent["sent"]) / tx_s / 1e3, 1) if tx_s > 0 else None,
                "rx_kpps": round(full / span / 1e3, 1) if span > 0 else None,
                "sender_cpu_s": round(float(sent["cpu_s"]), 3),
                "receiver_cpu_s": round(float(got["cpu_s"]), 3)}

    def _with_failure(self, a: Side, b: Side, size: int, wr: int) -> tuple[float, bool, dict[str, Any]]:
        assert self.cfg.fail_link is not None
        la, lb, at_s = self.cfg.fail_link
        heal = self.cfg.heal_after
        marks: dict[str, int] = {}
        timers: list[threading.Timer] = []

        # the link goes down through a netlink socket opened beforehand, so the failure instant is known
        # to within the one call (set_link, which records the state, opens a socket per namespace)
        lk = self.tb.link(la, lb)
        ipr = netns.ipr(self.tb.ns(lk.b))
        idx = int(ipr.link_lookup(ifname=lk.b_ifname)[0])
        blackhole = self.cfg.fail_mode == "blackhole"
        fab: FabricDataplane | None = None
        with contextlib.suppress(MrcError):  # without the programs a "down" is the link-down alone
            fab = FabricDataplane.open(self.cfg.testbed)
        if blackhole and fab is None:
            raise MrcError(f"testbed {self.cfg.testbed}: a blackhole needs the eBPF dataplane attached")

        def fail() -> None:
            # The failure's instant (the blackhole's map updates) runs ahead of every ordinary task;
            # the kernel's link-down after it (10+ ms of work here: a veth waits for RCU grace periods
            # and the stack flushes its routes) and the record are the emulated switch's own chores
            # and run as an ordinary task: at SCHED_FIFO they would starve the engines of a CPU right
            # after the failure (no SACK reaches the source meanwhile), which a switch's link-down
            # does not do to its hosts (docs/testbed.md, "Rate limits and failures").
            with prompt_thread():
                placed = strike()
            if not blackhole:
                take_down(placed)
            self.progress(f"  link {la}-{lb} {'blackholed' if blackhole else 'down'} at {at_s} s")

        def strike() -> bool:
            marks["fail"] = time.monotonic_ns()
            if blackhole:
                assert fab is not None
                fab.set_fault(la, lb, blackhole=True)  # two map updates: the failure instant is exact
                marks["fail_done"] = time.monotonic_ns()
                return False
            # as testbed link down does (fail_link_now): drop at once, then the kernel's link-down,
            # which takes 10+ ms; both clocks are reported (cut_ms, fail_call_ms)
            placed = fab is not None and fab.cut_link(la, lb)
            marks["cut"] = time.monotonic_ns()
            return placed

        def take_down(placed: bool) -> None:
            ipr.link("set", index=idx, state="down")
            marks["fail_done"] = time.monotonic_ns()
            tbmod.set_link(self.cfg.testbed, la, lb, up=False)
            if placed:
                assert fab is not None
                fab.clear_faults(la, lb)

        def restore() -> None:
            marks["heal"] = time.monotonic_ns()
            if blackhole:
                assert fab is not None
                fab.clear_faults(la, lb)
            else:
                tbmod.set_link(self.cfg.testbed, la, lb, up=True)  # link up and the node's routes back
            marks["heal_done"] = time.monotonic_ns()
            self.progress(f"  link {la}-{lb} up again at {at_s + (heal or 0)} s")

        def on_start(_t0: int) -> None:
            timers.append(threading.Timer(at_s, fail))
            if heal is not None:
                timers.append(threading.Timer(at_s + heal, restore))
            for t in timers:
                t.start()

        # the EVs through the link as they are before it fails: mrcd replaces them once it has localised
        # the failure, so a table read afterwards would miss most of them
        through = self._evs_through(a, (la, lb))
        samples: list[tuple[int, int]] = []
        try:
            dt, exact = self._one(a, b, size, wr, samples, on_start)
        finally:
            for t in timers:
                t.cancel()
                with contextlib.suppress(RuntimeError):
                    t.join()
            if "fail" in marks and "heal_done" not in marks:
                if blackhole:
                    assert fab is not None
                    fab.clear_faults(la, lb)
                else:
                    tbmod.set_link(self.cfg.testbed, la, lb, up=True)
            ipr.close()
            if fab is not None:
                fab.close()
        end_ns = samples[-1][0] if samples else time.monotonic_ns()
        return dt, exact, self._failure_doc(a, marks, samples, end_ns, (la, lb), through)

    def _evs_through(self, a: Side, link: tuple[str, str]) -> set[int]:
        """EV indices of the source's table toward the destination whose path crosses `link`."""
        rows = a.client.call("ev_show")["peers"].get(self.cfg.dst, [])
        through = set()
        for r in rows:
            hops = [self.cfg.src, *[x for x in r["via"].split("-") if x], self.cfg.dst]
            if any({x, y} == set(link) for x, y in itertools.pairwise(hops)):
                through.add(int(r["ev_index"]))
        return through

    def _failure_doc(self, a: Side, marks: dict[str, int], samples: list[tuple[int, int]], end_ns: int,
                     link: tuple[str, str], through: set[int]) -> dict[str, Any]:
        doc: dict[str, Any] = {"link": f"{link[0]}-{link[1]}", "detect_ms": None, "deny_ms": None,
                               "restore_ms": None, "goodput_fraction_during": None,
                               "goodput_fraction_after": None,
                               "completed_before_failure": "fail" not in marks}
        if "fail" not in marks:
            return doc
        tf = marks["fail"]
        doc["fail_call_ms"] = round((marks.get("fail_done", tf) - tf) / 1e6, 3)
        if "cut" in marks:  # packets into the link dropped from here on (the link-down call goes on)
            doc["cut_ms"] = round((marks["cut"] - tf) / 1e6, 3)
        log = a.client.call("actions", since_ns=tf)
        bad = [e for e in log["events"] if e["qpn"] == a.qp.qpn and e["state"] == "ASSUMED_BAD"
               and e["ev_index"] in through]
        lname = "-".join(sorted(link))
        denies = [x for x in log["actions"] if x["kind"] == "deny" and x["link"] == lname]
        doc["evs_through_link"] = len(through)
        doc["evs_assumed_bad"] = len({e["ev_index"] for e in bad})
        if bad:
            doc["detect_ms"] = round((bad[0]["time_ns"] - tf) / 1e6, 3)
        if denies:
            doc["deny_ms"] = round((denies[0]["time_ns"] - tf) / 1e6, 3)
            doc["denied_evs"] = denies[0]["evs"]
        # goodput per 100 ms from the failure on (fraction of capacity), and the window then
        bins: list[float] = []
        t = samples[0][0] if samples else tf
        while samples and t < end_ns:
            f = self._fraction(samples, t, t + 100_000_000)
            bins.append(-1.0 if f is None else f)
            t += 100_000_000
        doc["timeline_fraction_100ms"] = bins
        doc["timeline_start_ms"] = round(((samples[0][0] if samples else tf) - tf) / 1e6, 1)
        doc["cwnd_min_bytes"] = min(self.cwnd) if self.cwnd else None
        th = marks.get("heal")
        if th is not None:
            doc["heal_call_ms"] = round((marks.get("heal_done", th) - th) / 1e6, 3)
        doc["healed_during_transfer"] = th is not None
        t_down_end = th if th is not None else end_ns
        doc["goodput_fraction_during"] = self._fraction(samples, tf, t_down_end)
        if th is not None:
            restores = [x for x in log["actions"] if x["kind"] == "restore" and x["link"] == lname
                        and x["time_ns"] >= th]
            if restores:
                tr = restores[0]["time_ns"]
                doc["restore_ms"] = round((tr - th) / 1e6, 3)
                doc["goodput_fraction_after"] = self._fraction(samples, tr, end_ns)
        return doc

    def _fraction(self, samples: list[tuple[int, int]], t0: int, t1: int) -> float | None:
        pts = [(t, u) for t, u in samples if t0 <= t <= t1]
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return None
        bits = (pts[-1][1] - pts[0][1]) * self.payload * 8
        return round(bits / ((pts[-1][0] - pts[0][0]) / 1e9) / self.capacity_bps, 4)


def incast(testbed: str, dst: str, srcs: list[str], size: int, *, ecn_k: int, trim_t: int, buffer: int,
           progress: Callable[[str], None] = lambda _m: None, timeout_s: float = 600.0) -> dict[str, Any]:
    """N senders WRITE `size` bytes each to `dst` at once, with the switch ports toward `dst` set to
    (ecn_k, trim_t, buffer): completion, bit-exactness, trims, NACK-driven retransmits and timeouts."""
    tb = tbmod.Testbed.load(testbed)
    topo = tb.topo
    for h in (dst, *srcs):
        if h not in topo.host_names():
            raise MrcError(f"testbed {testbed}: no host {h!r}")
    if dst in srcs or len(set(srcs)) != len(srcs):
        raise MrcError("the senders must be distinct hosts other than the destination")
    leaf_ports = [(topo.leaf_name(p, topo.host_leaf(dst)), dst) for p in range(topo.planes)]
    with FabricDataplane.open(testbed) as fd:
        old = [fd.set_port(n, f) for n, f in leaf_ports]  # current settings (nothing changed)
        for n, f in leaf_ports:
            fd.set_port(n, f, ecn_k=ecn_k, trim_t=trim_t, buffer=buffer)
    d = MrcClient.for_host(tb.ns(dst))
    senders: list[tuple[MrcClient, RemoteMr, ClientQp, RemoteMr, ClientQp, int]] = []
    try:
        for i, h in enumerate(srcs):
            c = MrcClient.for_host(tb.ns(h))
            smr = c.reg_mr(size)
            smr.buf[:] = bytes([i + 1]) * size
            dmr = d.reg_mr(size)
            qs = c.create_qp(dst)
            qd = d.create_qp(h)
            c.connect(qs, qd.qpn, qd.mtu)
            d.connect(qd, qs.qpn, qs.mtu)
            d.post_recv(qd, 1)
            senders.append((c, smr, qs, dmr, qd, i + 1))
        progress(f"  {len(srcs)} x {size} B -> {dst}")
        t0 = time.monotonic_ns()
        for c, smr, qs, dmr, _qd, _v in senders:
            c.post_send(qs, wr_id=1, mr=smr, offset=0, length=size, remote_addr=dmr.addr, rkey=dmr.rkey,
                        imm=1)
        rows: list[dict[str, Any]] = []
        for (c, _smr, qs, dmr, qd, v), h in zip(senders, srcs, strict=True):
            wc = d.wait_wc(qd, 1, timeout=timeout_s)
            c.wait_wc(qs, 1, timeout=timeout_s)
            st = c.call("qp_stats", qpn=qs.qpn)
            rows.append({"src": h, "bit_exact": dmr.buf[:] == bytes([v]) * size,
                         "seconds": round((int(wc["time_ns"]) - t0) / 1e9, 4),
                         "trim_nacks": int(st["nack_trim_rx"]), "retx_trim": int(st["retx_trim"]),
                         "retx_sack": int(st["retx_sack"]), "retx_timeout": int(st["retx_timeout"]),
                         "rto": int(st["rto"]), "ecn_echoes": int(st["ecn_echo_rx"])})
    finally:
        for c, *_rest in senders:
            c.close()
        d.close()
        with FabricDataplane.open(testbed) as fd:
            for (n, f), cfg in zip(leaf_ports, old, strict=True):
                fd.set_port(n, f, ecn_k=cfg["ecn_k"], trim_t=cfg["trim_t"], buffer=cfg["buffer"])
    with FabricDataplane.open(testbed) as fd:
        sw = fd.stats()["ports"]
    trims = sum(sw[n][f]["actions"]["trim"]["packets"] for n, f in leaf_ports)
    drops = sum(sw[n][f]["actions"]["drop_buffer"]["packets"] for n, f in leaf_ports)
    total_s = max(r["seconds"] for r in rows)
    return {"dst": dst, "srcs": srcs, "bytes": size, "ecn_k": ecn_k, "trim_t": trim_t, "buffer": buffer,
            "bit_exact": all(r["bit_exact"] for r in rows), "seconds": total_s,
            "goodput_gbps": round(len(srcs) * size * 8 / total_s / 1e9, 6),
            "capacity_gbps": topo.planes * topo.link.rate_bps / 1e9,
            "switch_trims_total": trims, "switch_buffer_drops_total": drops,
            "trim_nacks": sum(r["trim_nacks"] for r in rows), "retx_trim": sum(r["retx_trim"] for r in rows),
            "rto": sum(r["rto"] for r in rows), "retx_timeout": sum(r["retx_timeout"] for r in rows),
            "senders": rows}


def _udp_filter() -> bytes:
    """A classic BPF socket filter for a raw IPv6/UDP socket (data from the UDP header on): UDP
    destination port 4791 and BTH DestQP == UDP_QPN, the whole packet; anything else: nothing."""
    import struct

    prog = [(0x28, 0, 0, 2),            # ldh [2]           UDP destination port
            (0x15, 0, 4, 4791),         # jeq #4791, else drop
            (0x20, 0, 0, 12),           # ld [12]           BTH bytes 4..7 (8 + 4)
            (0x54, 0, 0, 0xFFFFFF),     # and #0xffffff     DestQP
            (0x15, 0, 1, UDP_QPN),      # jeq #UDP_QPN, else drop
            (0x06, 0, 0, 0xFFFFFFFF),   # ret #-1
            (0x06, 0, 0, 0)]            # ret #0
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def udp_blast_main(argv: list[str]) -> int:
    """The udp baseline's two ends, each run in its host's namespace by `WriteBench._udp`:

    ``send SRC DST PACKETS EVS PAYLOAD``: PACKETS RDMA WRITE packets (PAYLOAD bytes, DestQP UDP_QPN) from
    SRC (an ephemeral port) to DST port 4791, round-robin over the comma-separated EV indices, with
    sendmmsg; prints {"sent", "errors", "t0_ns", "t1_ns", "cpu_s"}.
    ``recv PACKETS TIMEOUT PAYLOAD``: counts the matching packets on a raw socket (recvmmsg) until
    PACKETS came or none for UDP_IDLE_S after the first; prints {"packets", "full", "bytes", "first_ns",
    "last_ns", "cpu_s"} after a line "ready"."""
    import ctypes
    import errno
    import json
    import resource
    import select
    import socket

    from mrc import wire
    from mrc.dataplane import mmsg, udp

    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    role = argv[0]
    if role == "send":
        src, dst, packets, evs = argv[1], argv[2], int(argv[3]), [int(x) for x in argv[4].split(",")]
        mtu = int(argv[5])
        sk = udp.mrc_socket(None, src, port=0)
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        ictx = wire.IcrcContext(socket.inet_pton(socket.AF_INET6, src),
                                socket.inet_pton(socket.AF_INET6, dst))
        slots = len(evs) * max(1, -(-64 // len(evs)))
        sb = mmsg.SendBatch(slots)
        name = sb.name(socket.inet_pton(socket.AF_INET6, dst), wire.ROCEV2_UDP_PORT)
        payload = bytes(mtu)
        buf = bytearray(mtu + 128)
        for j in range(slots):
            n = wire.build_write(buf, ictx, dqpn=UDP_QPN, psn=j, ev_index=evs[j % len(evs)], va=0, rkey=0,
                                 payload=payload)
            sb.load(j, buf[:n], name)
        sent = errors = 0
        c0 = cpu()
        t0 = time.monotonic_ns()
        while sent < packets:
            k = min(slots, packets - sent)
            try:
                sent += sb.send(sk.fileno(), 0, k)
            except InterruptedError:
                continue
            except OSError as e:  # ENOBUFS from a full queue: that packet is lost
                if e.errno not in (errno.ENOBUFS, errno.EAGAIN):
                    raise
                errors += 1
                sent += 1
        t1 = time.monotonic_ns()
        print(json.dumps({"sent": sent, "errors": errors, "t0_ns": t0, "t1_ns": t1, "cpu_s": cpu() - c0}))
        return 0
    if role == "recv":
        packets, timeout_s, mtu = int(argv[1]), float(argv[2]), int(argv[3])
        SO_ATTACH_FILTER, SO_RCVBUFFORCE = 26, 33
        sk = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
        code = _udp_filter()
        cbuf = ctypes.create_string_buffer(code, len(code))
        import struct

        fprog = struct.pack("=H6xQ", len(code) // 8, ctypes.addressof(cbuf))
        sk.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        try:
            sk.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 256 << 20)
        except OSError:
            sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 << 20)
        rb = mmsg.RecvBatch(64, control=False)
        # a full packet's length as the raw socket sees it: UDP header + the sender's WRITE packet
        full_len = 8 + wire.build_write(bytearray(mtu + 128), wire.IcrcContext(bytes(16), bytes(16)),
                                        dqpn=UDP_QPN, psn=0, ev_index=0, va=0, rkey=0, payload=bytes(mtu))
        got = full = nbytes = 0
        first = last = 0
        print("ready", flush=True)
        c0 = cpu()
        start = time.monotonic()
        while got < packets:
            k = rb.recv(sk.fileno())
            if k:
                now = time.monotonic_ns()
                first = first or now
                last = now
                for j in range(k):
                    ln = rb.length(j)
                    nbytes += ln
                    full += ln == full_len
                got += k
                continue
            idle = (time.monotonic_ns() - last) / 1e9 if last else time.monotonic() - start
            if idle > (UDP_IDLE_S if last else timeout_s):
                break
            select.select([sk], [], [], 0.05)
        print(json.dumps({"packets": got, "full": full, "bytes": nbytes, "first_ns": first, "last_ns": last,
                          "cpu_s": cpu() - c0}))
        return 0
    raise SystemExit(f"udp_blast_main: unknown role {role!r}")
