"""Loopback harness: two MRC engines joined by an in-memory multi-plane fabric on a virtual clock.

Plane p joins port p of host A to port p of host B, one independent link per direction. Each packet gets
serialization at the port rate, the plane's one-way delay plus a fixed per-EV extra delay (paths of one
plane differ), optional uniform jitter (reordering), and the impairments of the `FabricConfig`: random
loss, trimming (data packets cut after MXH, TRIMMED set), ECN-CE marking, and blackholes on a schedule
(a plane drops everything between two virtual times). Everything random comes from one seeded
generator, so a run is a pure function of its configuration and seed.

The driver loop is the reference use of the sans-I/O interface: deliver the earliest event (a datagram
or a timer) to its engine, collect `datagrams_to_send`, re-arm the engine's timer from `next_deadline`.
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from mrc.transport import (
    Context,
    EvProfile,
    NsccConfig,
    QpAttr,
    QueuePair,
    WcStatus,
    WorkCompletion,
    fastpath,
)
from mrc.transport.qp import NEVER as NEVER
from mrc.transport.qp import Datagram
from mrc.wire.consts import DEFAULT_PAYLOAD
from mrc.wire.icrc import IcrcContext
from mrc.wire.packet import WRITE_HDR_LEN, build_write, parse, trim_in_place

from . import limits
from .payload import seeded_bytes

GID_A: Final = bytes.fromhex("fd00000000000000000000000000000a")
GID_B: Final = bytes.fromhex("fd00000000000000000000000000000b")


@dataclass
class Blackhole:
    plane: int
    start_ns: int
    end_ns: int = NEVER  # NEVER: never heals

    def active(self, t: int) -> bool:
        return self.start_ns <= t < self.end_ns


@dataclass
class FabricConfig:
    planes: int = 4
    delay_ns: int = 2_000  # one-way link delay of every plane
    plane_delay_ns: list[int] = field(default_factory=list)  # extra one-way delay per plane
    ev_spread_ns: int = 500  # per-EV extra delay, fixed per EV index, uniform in [0, spread]
    jitter_ns: int = 0  # per-packet uniform extra delay: reordering within a path
    rate_gbps: float = 100.0  # per port and direction; 0 = infinite
    loss: float = 0.0  # per-packet drop probability, every plane, both directions
    plane_loss: dict[int, float] = field(default_factory=dict)
    trim: float = 0.0  # probability that a data packet is trimmed
    ecn: dict[int, float] = field(default_factory=dict)  # plane -> CE-marking probability (data)
    blackholes: list[Blackhole] = field(default_factory=list)

    def check(self) -> None:
        """ValueError naming the first field out of its range (`mrc.sim.limits`): every delay, rate,
        probability and plane index that the fabric turns into a timer, a list or a random draw."""
        L = limits
        planes = L.integer("planes", self.planes, 1, L.MAX_LOOPBACK_PLANES)
        L.nanoseconds("delay_ns", self.delay_ns, L.MAX_DELAY_NS)
        if len(self.plane_delay_ns) > planes:
            raise ValueError(f"plane_delay_ns has {len(self.plane_delay_ns)} entries for {planes} planes")
        for p, d in enumerate(self.plane_delay_ns):
            L.nanoseconds(f"plane_delay_ns[{p}]", d, L.MAX_DELAY_NS)
        L.nanoseconds("ev_spread_ns", self.ev_spread_ns, L.MAX_DELAY_NS)
        L.nanoseconds("jitter_ns", self.jitter_ns, L.MAX_DELAY_NS)
        L.rate_gbps("rate_gbps", self.rate_gbps, zero_is_infinite=True)
        L.probability("loss", self.loss)
        L.probability("trim", self.trim)
        for name, probs, one in (("plane_loss", self.plane_loss, False), ("ecn", self.ecn, True)):
            for p, prob in probs.items():
                L.integer(f"{name} plane", p, 0, planes - 1)
                L.probability(f"{name}[{p}]", prob, one=one)
        if len(self.blackholes) > L.MAX_BLACKHOLES:
            raise ValueError(f"at most {L.MAX_BLACKHOLES} blackholes, got {len(self.blackholes)}")
        for i, bh in enumerate(self.blackholes):
            L.integer(f"blackholes[{i}].plane", bh.plane, 0, planes - 1)
            L.nanoseconds(f"blackholes[{i}].start_ns", bh.start_ns)
            if bh.end_ns != NEVER:
                L.nanoseconds(f"blackholes[{i}].end_ns", bh.end_ns, lo=bh.start_ns + 1)

    def base_rtt_ns(self, mtu: int = DEFAULT_PAYLOAD) -> int:
        ser = 0 if not self.rate_gbps else int((mtu + 120) * 8 / self.rate_gbps)
        return 2 * self.delay_ns + self.ev_spread_ns + ser + 200

    def bdp_bytes(self, mtu: int = DEFAULT_PAYLOAD) -> int:
        rate = self.rate_gbps or 400.0
        return int(self.planes * rate * self.base_rtt_ns(mtu) / 8)


class LoopbackFabric:
    """The fabric and the event loop for two engines (index 0 = A, 1 = B)."""

    def __init__(self, cfg: FabricConfig, a: Context, b: Context, seed: int = 0) -> None:
        self.cfg = cfg
        self.engines = (a, b)
        self.rng = random.Random(seed ^ 0x5EED)
        self.heap: list[tuple[int, int, int, Any, int, bool]] = []
        self.seq = 0
        self.now = 0
        #: the time of the last event processed (`now` moves on to `until_ns` when a run ends there)
        self.last_t = 0
        self.timer_at = [NEVER, NEVER]
        planes = cfg.planes
        self.port_free = [[0] * planes, [0] * planes]
        pd = cfg.plane_delay_ns + [0] * (planes - len(cfg.plane_delay_ns))
        self.plane_delay = [cfg.delay_ns + pd[p] for p in range(planes)]
        spread_rng = random.Random(seed ^ 0xE5)
        self.ev_extra = [spread_rng.randint(0, cfg.ev_spread_ns) for _ in range(1 << 14)]
        self.loss = [cfg.plane_loss.get(p, cfg.loss) for p in range(planes)]
        self.ecn = [cfg.ecn.get(p, 0.0) for p in range(planes)]
        self.ns_per_byte = 8.0 / cfg.rate_gbps if cfg.rate_gbps else 0.0
        self.jitter = cfg.jitter_ns
        self.impaired = bool(cfg.blackholes or any(self.loss) or cfg.trim or any(self.ecn))
        # counters
        self.c: dict[str, int] = dict.fromkeys(
            ("lost", "blackholed", "trimmed", "ecn_marked"), 0
        )
        self.plane_data_bytes = [[0] * planes, [0] * planes]

    def transmit(self, src: int, dg: Datagram, now: int) -> None:
        data: Any
        data, p, ev, _ = dg
        n = len(data)
        is_data = data[0] < 0x10  # WRITE opcodes 0x0A/0x0B; control packets are 0xC0-0xC4
        if is_data:
            self.plane_data_bytes[src][p] += n
        ecn = False
        if self.impaired:
            cfg = self.cfg
            rng = self.rng
            c = self.c
            for bh in cfg.blackholes:
                if bh.plane == p and bh.start_ns <= now < bh.end_ns:
                    c["blackholed"] += 1
                    return
            lp = self.loss[p]
            if lp and rng.random() < lp:
                c["lost"] += 1
                return
            if is_data:
                if cfg.trim and rng.random() < cfg.trim:
                    n = trim_in_place(data, n)
                    data = memoryview(data)[:n]
                    c["trimmed"] += 1
                ep = self.ecn[p]
                if ep and rng.random() < ep:
                    ecn = True
                    c["ecn_marked"] += 1
        free = self.port_free[src]
        t = free[p]
        if t < now:
            t = now
        t += int(n * self.ns_per_byte)
        free[p] = t
        t += self.plane_delay[p] + self.ev_extra[ev]
        if self.jitter:
            t += self.rng.randint(0, self.jitter)
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, 1 - src, data, p, ecn))

    def _arm(self, j: int, now: int) -> None:
        dl = self.engines[j].next_deadline()
        if dl is not None and dl < self.timer_at[j]:
            if dl < now:
                dl = now
            self.timer_at[j] = dl
            self.seq += 1
            heapq.heappush(self.heap, (dl, self.seq, j, None, -1, False))

    def kick(self, now: int) -> None:
        """Let both engines send what they have (after posting work) and arm their timers."""
        for j, eng in enumerate(self.engines):
            for dg in eng.datagrams_to_send(now):
                self.transmit(j, dg, now)
            self._arm(j, now)

    def _compiled_loop(self) -> Any:
        """The C module whose `loopback_run` is this loop in C, or None. It runs the loop below event
        for event (the same order and times) where `transmit` draws nothing at random (no impairment,
        no jitter) and is not replaced (on the class or on this fabric), and both engines run the
        fast path in C; MRC_FASTPATH=py or 0 keeps this loop in Python, as the pure path's reference
        figure needs."""
        if self.impaired or self.jitter or getattr(self.transmit, "__func__", None) is not _TRANSMIT:
            return None
        c = fastpath._compiled()
        if c is None or any(getattr(e, "fast_send", None) is not c.send_new for e in self.engines):
            return None
        return c

    def run(
        self, until_ns: int = NEVER, stop: Callable[[], bool] | None = None, check_every: int = 64
    ) -> int:
        """Process events until the heap is empty, `until_ns` passes, or `stop()` is true (checked
        every `check_every` events and before every timer). Returns the number of events processed."""
        c = self._compiled_loop()
        if c is not None:
            events: int
            events, self.seq, self.now, self.last_t = c.loopback_run(
                self, self.engines, self.heap, self.timer_at, self.port_free, self.plane_delay, self.ev_extra,
                self.plane_data_bytes, self.ns_per_byte, self.seq, until_ns, self.now, self.last_t, stop,
                check_every,
            )
            return events
        heap = self.heap
        engines = self.engines
        timer_at = self.timer_at
        transmit = self.transmit
        pop = heapq.heappop
        events = 0
        while heap:
            if heap[0][0] > until_ns:
                self.now = until_ns
                break
            ev = pop(heap)
            t, _, j, data, port, ecn = ev
            eng = engines[j]
            if data is None:
                if timer_at[j] != t:
                    continue
                if stop is not None and stop():
                    # done before a timer that may lie far ahead (a responder's message sweep): the
                    # run ends at the time of the last event that did something
                    heapq.heappush(heap, ev)
                    break
                self.now = self.last_t = t
                timer_at[j] = NEVER
                eng.handle_timer(t)
            else:
                self.now = self.last_t = t
                eng.receive(data, t, ecn, port)
            out = eng.datagrams_to_send(t)
            if out:
                for dg in out:
                    transmit(j, dg, t)
            dl = eng.next_deadline()
            if dl is not None and dl < timer_at[j]:
                timer_at[j] = dl
                self.seq += 1
                heapq.heappush(heap, (dl if dl > t else t, self.seq, j, None, -1, False))
            events += 1
            if stop is not None and not events % check_every and stop():
                break
        return events


#: the `transmit` that `loopback_run` does in C (a replaced one, as a test's recorder, keeps the Python loop)
_TRANSMIT: Final = LoopbackFabric.transmit


# ------------------------------------------------------------------------------------------ scenario


@dataclass
class LoopbackConfig:
    size: int = 64 << 20
    evs: int = 128
    cc: str = "nscc"  # or "null"
    imm: int | None = 0x1234ABCD  # WRITE-with-immediate (None: plain WRITE)
    seed: int = 0
    settle_ns: int = 0  # keep running this long after completion (probes can restore EVs)
    time_limit_ns: int = 10_000_000_000  # virtual
    attr: QpAttr = field(default_factory=QpAttr)
    fabric: FabricConfig = field(default_factory=FabricConfig)
    profile: bool = False

    def check(self) -> None:
        """ValueError naming the first field out of its range: `build` allocates three buffers of
        `size` bytes and one EV profile of `evs` entries, and seeds numpy with `seed`."""
        L = limits
        self.fabric.check()
        L.integer("size", self.size, 1, L.MAX_LOOPBACK_BYTES, " bytes")
        L.integer("evs", self.evs, self.fabric.planes, L.MAX_EVS)
        if self.cc not in ("nscc", "null"):
            raise ValueError(f"cc must be nscc or null, got {self.cc!r}")
        if self.imm is not None:
            L.integer("imm", self.imm, 0, 2**32 - 1)
        L.seed("seed", self.seed)
        L.nanoseconds("settle_ns", self.settle_ns)
        L.nanoseconds("time_limit_ns", self.time_limit_ns, lo=1)
        self.attr.check()


@dataclass
class LoopbackRun:
    """A built loopback: contexts, QPs, buffers and fabric, for tests that drive it step by step."""

    cfg: LoopbackConfig
    a: Context
    b: Context
    qa: QueuePair
    qb: QueuePair
    fabric: LoopbackFabric
    src: np.ndarray
    dst: np.ndarray
    send_wc: list[WorkCompletion] = field(default_factory=list)
    recv_wc: list[WorkCompletion] = field(default_factory=list)


def build(cfg: LoopbackConfig) -> LoopbackRun:
    cfg.check()
    fab = cfg.fabric
    a = Context(GID_A, ports=fab.planes, seed=cfg.seed, name="A")
    b = Context(GID_B, ports=fab.planes, seed=cfg.seed + 1, name="B")
    nscc = NsccConfig.for_path(fab.base_rtt_ns(cfg.attr.mtu), fab.bdp_bytes(cfg.attr.mtu), cfg.attr.mtu)
    qps = []
    for ctx in (a, b):
        prof = ctx.create_ev_profile(EvProfile.even(1, cfg.evs, fab.planes))
        ccp = ctx.create_cc_profile(nscc if cfg.cc == "nscc" else None)
        cq = ctx.create_cq()
        qps.append(ctx.create_qp(cq, ev_profile=prof, cc_profile=ccp, attr=_copy_attr(cfg.attr)))
    qa, qb = qps
    qa.connect(GID_B, qb.qpn)
    qb.connect(GID_A, qa.qpn)
    src = seeded_bytes(cfg.size, cfg.seed)
    dst = np.zeros(cfg.size, dtype=np.uint8)
    dst.fill(0)  # resident, as registered (pinned) memory is: first-touch page faults are not the engine's
    fabric = LoopbackFabric(fab, a, b, cfg.seed)
    return LoopbackRun(cfg, a, b, qa, qb, fabric, src, dst)


def _copy_attr(attr: QpAttr) -> QpAttr:
    return QpAttr(**{k: getattr(attr, k) for k in QpAttr.__dataclass_fields__})


def run_transfer(run: LoopbackRun) -> dict[str, Any]:
    """WRITE run.src into run.dst (one message, WRITE-with-immediate unless cfg.imm is None) and report."""
    cfg = run.cfg
    a, b, qa, qb, fabric = run.a, run.b, run.qa, run.qb, run.fabric
    smr = a.reg_mr(run.src)
    dmr = b.reg_mr(run.dst)
    if cfg.imm is not None:
        qb.post_recv(7)
    qa.post_send(1, smr, 0, cfg.size, dmr.addr, dmr.rkey, imm=cfg.imm)
    done_at = [-1]

    def finished() -> bool:
        if qa.send_cq._q:
            run.send_wc.extend(qa.send_cq.poll())
        if qb.recv_cq._q:
            run.recv_wc.extend(qb.recv_cq.poll())
        sender_done = bool(run.send_wc) or qa.state.name == "ERROR"
        receiver_done = cfg.imm is None or bool(run.recv_wc) or qa.state.name == "ERROR"
        if sender_done and receiver_done:
            if done_at[0] < 0:
                done_at[0] = fabric.last_t
            return fabric.now >= done_at[0] + cfg.settle_ns
        return False

    prof: Any = None
    if cfg.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    fabric.kick(0)
    fabric.run(until_ns=cfg.time_limit_ns, stop=finished)
    finished()
    wall = time.perf_counter() - t0
    if prof is not None:
        prof.disable()
    return report(run, wall, done_at[0], prof)


def wire_floor_pps(packets: int = 2048, payload: int = DEFAULT_PAYLOAD) -> float:
    """Data packets per second of the wire work alone (build_write with its ICRC, parse with ICRC
    verification, placement copy), on this machine now: the floor under `engine_pps`, measured in the
    same run so that the ratio survives a noisy machine."""
    ctx = IcrcContext(GID_A, GID_B)
    src = memoryview(bytearray(packets * payload))
    dst = memoryview(bytearray(packets * payload))
    size = WRITE_HDR_LEN + payload + 4
    t0 = time.perf_counter()
    for i in range(packets):
        buf = bytearray(size)
        off = i * payload
        build_write(
            buf, ctx, dqpn=1, psn=i, ev_index=i & 127, va=off, rkey=1, payload=src[off : off + payload],
            msn=0, msg_len=packets * payload, msg_offset=off, timestamp_ns=i, flags=0, ackreq=False,
            imm=None,
        )
        p = parse(buf, ctx)
        dst[p.va : p.va + p.dma_len] = p.payload
    return packets / (time.perf_counter() - t0)


def report(run: LoopbackRun, wall: float, done_ns: int, prof: Any = None) -> dict[str, Any]:
    qa, qb, fab = run.qa, run.qb, run.fabric
    sa, sb = qa.stats(), qb.stats()
    floor = wire_floor_pps(min(2048, max(64, sa["data_tx"])))
    completed = (
        bool(run.send_wc)
        and all(w.status == WcStatus.SUCCESS for w in run.send_wc)
        and (run.cfg.imm is None or (bool(run.recv_wc) and run.recv_wc[0].imm_data == run.cfg.imm))
    )
    data_packets = sa["data_tx"]
    planes = run.cfg.fabric.planes
    counts = qa.paths.counts()
    ev_states = {f"plane{p}": {s: counts[s][p] for s in counts} for p in range(planes)}
    events = run.a.poll_ev_events()
    tot = sum(fab.plane_data_bytes[0]) or 1
    doc: dict[str, Any] = {
        "completed": completed,
        "bit_exact": bool(np.array_equal(run.src, run.dst)),
        "status": [w.status.name for w in run.send_wc],
        "size_bytes": run.cfg.size,
        "sim_time_s": (done_ns if done_ns >= 0 else fab.now) / 1e9,
        "wall_s": round(wall, 4),
        "data_packets": data_packets,
        "engine_pps": round(data_packets / wall) if wall > 0 else None,
        "wire_floor_pps": round(floor),
        "engine_vs_wire_floor": round(data_packets / wall / floor, 3) if wall > 0 else None,
        "goodput_gbps": round(run.cfg.size * 8 / done_ns, 2) if completed and done_ns > 0 else None,
        "retransmits": {
            "sack": sa["retx_sack"],
            "trim": sa["retx_trim"],
            "timeout": sa["retx_timeout"],
            "nack": sa["retx_nack"],
            "spurious": sa["retx_spurious"],
        },
        "trims": fab.c["trimmed"],
        "nacks": sb["nack_tx"],
        "sacks": sb["sack_tx"],
        "ecn_marked": fab.c["ecn_marked"],
        "ev_states": ev_states,
        "events": [
            {"t_ns": e.time_ns, "ev_index": e.ev_index, "port": e.port, "state": e.state.name,
             "lost": e.lost, "drop_count": e.drop_count}
            for e in events
        ],
        "plane_share": [round(x / tot, 4) for x in fab.plane_data_bytes[0]],
        "cwnd_bytes": qa.cc.cwnd,
        "cc": qa.cc.stats(),
        "srtt_ns": sa["srtt_ns"],
        "max_outstanding_psns": sa["max_outstanding"],
        "max_trim_recovery_ns": sa["max_trim_recovery_ns"],
        "fabric": dict(fab.c),
        "drops": {"A": dict(run.a.drops), "B": dict(run.b.drops)},
    }
    if prof is not None:
        doc["profile"] = profile_summary(prof)
    return doc


def profile_summary(prof: Any, top: int = 15) -> list[dict[str, Any]]:
    import pstats

    st = pstats.Stats(prof)
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{file.rsplit('/', 2)[-1]}:{line}({func})", "calls": nc,
                     "tottime_s": round(tt, 4), "cumtime_s": round(ct, 4)})
    rows.sort(key=lambda r: -r["tottime_s"])
    return rows[:top]


def loopback(cfg: LoopbackConfig) -> dict[str, Any]:
    """Build and run one transfer; the `mrcctl sim loopback` report."""
    return run_transfer(build(cfg))

