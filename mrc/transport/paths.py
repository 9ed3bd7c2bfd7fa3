"""EV profiles and per-QP path state (`mrc_ctl.h`): which entropy value (EV) every packet is sprayed
on, the EV states GOOD / ASSUMED_BAD / DENIED / UNKNOWN, steering preferences, probes and events.

A `PathSet` is one QP's view of its EV profile. Spraying picks a port from a weighted pattern (a port's
weight is the sum of its GOOD EVs' preferences, so bytes balance across ports when every EV is clean and
shift away from a port whose EVs report ECN or trims), then the next EV of that port round robin,
skipping penalised EVs in proportion to their penalty. Penalties rise on ECN-echo and trims and decay on
clean acknowledgements; they never shrink the window. A loss that is not a trim retires the EV at once
(ASSUMED_BAD, never below `ev_min_active` GOOD EVs); probes with exponential backoff bring it back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any, Final


class EvState(IntEnum):
    GOOD = 0
    ASSUMED_BAD = 1
    DENIED = 2
    UNKNOWN = 3


class EvMode(IntEnum):
    AUTO = 0  # the fabric's own entropy: the engine uses indices only
    EXP = 1  # explicit (EV, port) array from the controller
    GEN = 2  # generated from field descriptions


#: Steering penalty limits: ECN-echo/trim add PEN_STEP, a clean acknowledgement removes 1.
PEN_MAX: Final = 8
PEN_STEP: Final = 2
_PATTERN_SLOTS_PER_PORT: Final = 16
_REBUILD_EVERY: Final = 32
#: EV events (without an EV event CQ) and probe results a QP keeps until they are polled
MAX_UNPOLLED: Final = 4096

GOOD: Final = int(EvState.GOOD)
ASSUMED_BAD: Final = int(EvState.ASSUMED_BAD)
DENIED: Final = int(EvState.DENIED)
#: EvState -> its bit in an EV event mask (mrc_ctl_ev_state: GOOD 1<<0, ASSUMED_BAD 1<<1, DENIED 1<<2,
#: UNKNOWN 1<<31)
EV_STATE_BIT: Final = (1 << 0, 1 << 1, 1 << 2, 1 << 31)
#: the event mask a profile starts with: the two states the spec lets a profile monitor
EV_EVENT_MASK_DEFAULT: Final = EV_STATE_BIT[GOOD] | EV_STATE_BIT[ASSUMED_BAD]


@dataclass(slots=True, frozen=True)
class EvEntry:
    ev: int  # the entropy value (flow label / uSID path id ...); opaque to the engine
    port: int  # plane port, 0-based in this prototype (mrc_ctl.h numbers ports from 1)


@dataclass(slots=True, frozen=True)
class EvField:
    """One field of a generated EV (`mrc_ctl.h` GEN mode): `width` bits starting from `init_val`; the
    bits set in `mask` are overwritten by the generator; with a mask, the field's value must lie in
    [min_val, max_val]. A fixed part (an SRv6 locator) is a field with init_val and mask = 0."""

    width: int
    init_val: int = 0
    min_val: int = 0
    max_val: int = 0
    mask: int = 0


def expand_ev(n: int, fields: list[EvField]) -> tuple[int, list[int]]:
    """Expand generator value `n` over `fields`: for each set mask bit, from the first field's most
    significant bit on, take the next most significant bit of `n` and place it there; then concatenate
    the fields. Returns (EV value, per-field values)."""
    bit = sum(bin(f.mask).count("1") for f in fields) - 1
    ev = 0
    vals = []
    for f in fields:
        v = f.init_val
        for pos in range(f.width - 1, -1, -1):
            if f.mask >> pos & 1:
                v = (v & ~(1 << pos)) | (((n >> bit) & 1) << pos)
                bit -= 1
        v &= (1 << f.width) - 1
        vals.append(v)
        ev = (ev << f.width) | v
    return ev, vals


@dataclass(slots=True, frozen=True)
class EvEvent:
    """An EV state change reported on the EV event queue (`mrc_ctl_poll_ev_event`)."""

    time_ns: int
    profile_id: int
    qpn: int
    ev_index: int
    ev: int
    port: int
    state: EvState
    lost: int  # packets lost on this EV (this QP) since its previous event
    # EV events dropped from the EV event CQ (full) between the previous event delivered and this one
    # (mrc_ctl_ev_event.drop_count, precise: MRC_CTL_OPT_CAP_EV_EVENT_PRECISE_DROP_CNT); 0 off a CQ
    drop_count: int = 0


class EvEventCq:
    """`mrc_ctl_create_ev_event_cq`: a bounded queue of EV events. It does not overrun as a CQ does: an
    event that finds it full is dropped and counted, and the next event delivered carries how many were
    dropped before it (`drop_count`), so a controller that polls too slowly learns that it missed some
    instead of the engine's memory growing with every path change."""

    __slots__ = ("_q", "channel", "cq_context", "cqn", "depth", "dropped", "dropped_total")

    def __init__(self, cqn: int, depth: int, cq_context: Any = None) -> None:
        if not 1 <= depth <= 1 << 22:
            raise ValueError(f"EV event CQ depth must be 1..{1 << 22}, got {depth}")
        self.cqn = cqn
        self.depth = depth
        self.channel = None  # EV event CQs raise no completion events (a controller polls them)
        self.cq_context = cq_context
        self.dropped = 0  # since the last event delivered
        self.dropped_total = 0
        self._q: deque[EvEvent] = deque()

    def push(self, e: EvEvent) -> bool:
        if len(self._q) >= self.depth:
            self.dropped += 1
            self.dropped_total += 1
            return False
        if self.dropped:
            e = replace(e, drop_count=self.dropped)
            self.dropped = 0
        self._q.append(e)
        return True

    def poll(self, max_entries: int = 1 << 30) -> list[EvEvent]:
        """`mrc_ctl_poll_ev_event`: up to `max_entries` events, oldest first."""
        q = self._q
        return [q.popleft() for _ in range(min(max_entries, len(q)))]

    def __len__(self) -> int:
        return len(self._q)


@dataclass(slots=True, frozen=True)
class ProbeResult:
    time_ns: int
    qpn: int
    ev_index: int
    port: int
    ok: bool
    rtt_ns: int  # service-time adjusted; -1 on timeout


class EvProfile:
    """An EV profile: an array of (EV, port) entries shared by the QPs attached to it.

    `ev_min_active` (default count/4) is the floor of GOOD EVs below which the engine stops marking
    EVs ASSUMED_BAD. DENIED is the controller's: `deny` / `allow` apply to every attached QP."""

    def __init__(
        self,
        profile_id: int,
        entries: list[EvEntry],
        *,
        mode: EvMode = EvMode.EXP,
        ev_min_active: int | None = None,
    ) -> None:
        if not entries:
            raise ValueError("an EV profile needs at least one entry")
        if len(entries) > 1 << 14:
            raise ValueError("an EV profile holds at most 16384 entries (14-bit EV index)")
        self.profile_id = profile_id
        self.entries = list(entries)
        self.mode = mode
        self.ev_min_active = max(1, len(entries) // 4) if ev_min_active is None else ev_min_active
        self.denied: set[int] = set()
        self.paths: list[PathSet] = []
        # which state changes raise EV events (MRC_CTL_EV_PROFILE_EVENT_MASK; GOOD / ASSUMED_BAD bits)
        self.event_mask = EV_EVENT_MASK_DEFAULT
        self.fmt_profile_id = 0  # the EV format profile its values follow (0: none, AUTO / Python API)

    @classmethod
    def even(
        cls, profile_id: int, count: int, ports: int, *, ev_base: int = 0, ev_min_active: int | None = None
    ) -> EvProfile:
        """`count` EVs split evenly over `ports` planes, interleaved (index i -> port i % ports)."""
        if ports < 1 or count < ports:
            raise ValueError("need at least one EV per port")
        entries = [EvEntry(ev_base + i, i % ports) for i in range(count)]
        return cls(profile_id, entries, mode=EvMode.GEN, ev_min_active=ev_min_active)

    @classmethod
    def generate(
        cls,
        profile_id: int,
        fields: list[EvField],
        count: int,
        ports: int,
        *,
        ev_min_active: int | None = None,
    ) -> EvProfile:
        """GEN mode: the first `count` EVs the field descriptions allow (values outside a masked field's
        [min_val, max_val] are skipped), assigned to ports round robin."""
        nbits = sum(bin(f.mask).count("1") for f in fields)
        entries: list[EvEntry] = []
        for n in range(1 << nbits):
            ev, vals = expand_ev(n, fields)
            if all(not f.mask or f.min_val <= v <= f.max_val for f, v in zip(fields, vals, strict=True)):
                entries.append(EvEntry(ev, len(entries) % ports))
                if len(entries) == count:
                    break
        if len(entries) < count:
            raise ValueError(f"the field descriptions allow {len(entries)} EVs, {count} requested")
        return cls(profile_id, entries, mode=EvMode.GEN, ev_min_active=ev_min_active)

    @property
    def ports(self) -> int:
        return max(e.port for e in self.entries) + 1

    def deny(self, indices: list[int], now: int = 0) -> None:
        for i in indices:
            self.entries[i]  # IndexError for a bad index
            self.denied.add(i)
        for p in self.paths:
            p.set_denied(indices, True, now)

    def allow(self, indices: list[int], now: int = 0) -> None:
        for i in indices:
            self.denied.discard(i)
        for p in self.paths:
            p.set_denied(indices, False, now)


class PathSet:
    """One QP's EV states, steering penalties and probe schedule (hot path: `next_ev`)."""

    def __init__(self, profile: EvProfile, qpn: int, attr_probe: tuple[int, int, int, int]) -> None:
        self.profile = profile
        self.qpn = qpn
        n = len(profile.entries)
        self.n = n
        self.nports = profile.ports
        self.ev_port = [e.port for e in profile.entries]
        self.state = [DENIED if i in profile.denied else GOOD for i in range(n)]
        self.pen = [0] * n
        self.npen = 0  # EVs with a penalty (of any state)
        self.skip = [0] * n
        self.drops = [0] * n  # losses since the EV's last event
        self.good_count = sum(1 for s in self.state if s == GOOD)
        self.min_active = profile.ev_min_active
        self.port_evs: list[list[int]] = [[] for _ in range(self.nports)]
        self.port_rr = [0] * self.nports
        self.pattern: list[int] = []
        self.pat_pos = 0
        self.seq: list[int] = []
        self.seq_pos = 0
        self.dirty = False
        self.since_rebuild = 0
        self.tx_packets = [0] * n
        self.port_bytes = [0] * self.nports
        self.ctl_rr = 0  # turn of the control-packet EV choice (ctl_ev)
        # probes: per ASSUMED_BAD EV: next probe time, current interval, consecutive successes
        self.probe_interval, self.probe_max, self.probe_timeout, self.probe_good = attr_probe
        self.probe_at: dict[int, int] = {}
        self.probe_ivl: dict[int, int] = {}
        self.probe_ok: dict[int, int] = {}
        self.probe_wait: dict[int, tuple[int, int, int]] = {}  # request id -> (ev index, deadline, sent)
        # the peer's plane ports reported down (PORT_STATUS): their EVs are DENIED for this QP and one
        # of them is probed every probe_max; `probe_good` answers show the port is up after all
        self.peer_epoch: dict[int, int] = {}  # port -> last epoch accepted
        self.peer_down: set[int] = set()
        self.peer_probe_at: dict[int, int] = {}  # port -> next probe time
        self.peer_probe_ok: dict[int, int] = {}
        self.next_probe_deadline = 1 << 62
        # where events go while the context has no EV event CQ, and the probe results, until polled
        # (`Context.poll_ev_events`, `poll_probe_results`); at MAX_UNPOLLED each, a newer one is dropped
        # and counted (`events_dropped`, `probe_results_dropped`), as an EV event CQ drops what finds it
        # full: a harness or application that never polls (the simulator, a QP probing a dead plane for
        # hours) must not grow them without end (~15,000 probe results per virtual second with a plane
        # down)
        self.events: list[EvEvent] = []
        self.ev_cqs: list[EvEventCq] = []  # the context's EV event CQs (the QP shares the context's list)
        self.probe_results: list[ProbeResult] = []
        self.events_dropped = 0
        self.probe_results_dropped = 0
        self.losses = 0
        self.marked_bad = 0
        #: per EV: the transmission whose loss made it ASSUMED_BAD, its send time and PSN (`refute`)
        self.bad_sent = [0] * n
        self.bad_psn = [-1] * n
        self.refuted = 0  # EVs made GOOD again by `refute`
        self._rebuild()
        profile.paths.append(self)

    # ------------------------------------------------------------------ spraying

    def _rebuild(self) -> None:
        """Recompute the GOOD EV lists per port (after a state change), then the spraying order."""
        state = self.state
        lists: list[list[int]] = [[] for _ in range(self.nports)]
        for i in range(self.n):
            if state[i] == GOOD:
                lists[self.ev_port[i]].append(i)
        self._sync_rr(lists)
        for p in range(self.nports):
            self.port_evs[p] = lists[p]
            if self.port_rr[p] >= len(lists[p]):
                self.port_rr[p] = 0
        self._refresh()

    def _sync_rr(self, lists: list[list[int]]) -> None:
        """Leaving the current cycle (a rebuild, or penalties): each port's round-robin pointer moves to
        the first EV of that port the cycle had not reached yet, so the next order goes on from there.
        Restarting every cycle from the first EVs instead made a sender that retires EVs one by one
        (a failed link) spray the low EV indices over and over and reach the last dead EVs only a few
        cycles later (one plane: the last of 32 dead EVs after ~200 us instead of one cycle)."""
        seq = self.seq
        if not seq:
            return
        n = len(seq)
        pos = self.seq_pos
        where = [{i: j for j, i in enumerate(evs)} for evs in lists]
        todo = {p for p in range(self.nports) if lists[p]}
        ev_port = self.ev_port
        for k in range(n):
            i = seq[(pos + k) % n]
            p = ev_port[i]
            if p in todo:
                j = where[p].get(i)
                if j is not None:
                    self.port_rr[p] = j
                    todo.discard(p)
                    if not todo:
                        break

    def _refresh(self) -> None:
        """The spraying order: with no GOOD EV penalised, a fixed cycle (fast path); otherwise the
        weighted port pattern that the slow path of `next_ev` walks."""
        pen = self.pen
        self.dirty = False
        self.since_rebuild = 0
        self.seq_pos = 0
        if any(pen[i] for evs in self.port_evs for i in evs):
            self.seq = []
            self._build_pattern()
            return
        # One cycle uses every GOOD EV once, ports interleaved in proportion to their GOOD EV counts
        # (EV j of k on a port sits at virtual time (j + 0.5) / k).
        keyed = []
        for p, evs in enumerate(self.port_evs):
            k = len(evs)
            rr = self.port_rr[p]
            for j in range(k):
                keyed.append(((j + 0.5) / k, p, evs[(rr + j) % k]))
        keyed.sort()
        self.seq = [i for _, _, i in keyed]
        self.pattern = []

    def _build_pattern(self) -> None:
        """Smooth weighted round robin over ports, weight = sum of 1 / (1 + penalty) of its GOOD EVs."""
        pen = self.pen
        weights = [sum(1.0 / (1 + pen[i]) for i in evs) for evs in self.port_evs]
        total = sum(weights)
        pattern: list[int] = []
        if total > 0:
            cur = [0.0] * self.nports
            for _ in range(_PATTERN_SLOTS_PER_PORT * self.nports):
                best = -1
                for p in range(self.nports):
                    if weights[p] > 0:
                        cur[p] += weights[p]
                        if best < 0 or cur[p] > cur[best]:
                            best = p
                cur[best] -= total
                pattern.append(best)
        self.pattern = pattern
        self.pat_pos %= max(1, len(pattern))

    def next_ev(self) -> int:
        """The EV index for the next packet (-1 when no EV is usable)."""
        seq = self.seq
        if seq:
            pos = self.seq_pos
            i = seq[pos]
            pos += 1
            self.seq_pos = 0 if pos == len(seq) else pos
            return i
        if self.dirty and self.since_rebuild >= _REBUILD_EVERY:
            self._refresh()
            if self.seq:
                return self.next_ev()
        pattern = self.pattern
        if not pattern:
            return -1
        self.since_rebuild += 1
        pos = self.pat_pos
        p = pattern[pos]
        pos += 1
        self.pat_pos = 0 if pos == len(pattern) else pos
        evs = self.port_evs[p]
        k = len(evs)
        rr = self.port_rr[p]
        pen, skip = self.pen, self.skip
        for _ in range(k * (PEN_MAX + 1)):
            i = evs[rr]
            rr += 1
            if rr >= k:
                rr = 0
            if pen[i]:
                s = skip[i] - 1
                if s > 0:
                    skip[i] = s
                    continue
                skip[i] = pen[i] + 1
            break
        self.port_rr[p] = rr
        return i

    def other_ev(self, avoid: int) -> int:
        """An EV for a retransmission: the next one, but not `avoid` where another exists."""
        i = self.next_ev()
        if i == avoid and self.good_count > 1:
            i = self.next_ev()
            if i == avoid:
                i = self.next_ev()
        return i

    def ctl_ev(self, port: int, echo: int = -1) -> int:
        """EV index for a control packet (SACK/NACK/probe reply) leaving on `port` in answer to a packet
        that came on EV index `echo`.

        The echo first, when it is GOOD here and on that port: profiles are built alike at both ends, so
        index `echo` names the same plane and spine back, a path the peer is using right now (it retires
        an EV whose packets are lost, and then no packet echoes it). Otherwise the port's GOOD EVs in
        turn: acknowledgements are cumulative, so spread over the port's paths the loss of one path costs
        a fraction of them, never all (one fixed EV per port put every SACK of a port on one spine's
        links). Then, when the port has no GOOD EV, the GOOD EVs of the other ports in turn (the port's
        own EVs are suspect or denied: a reply sent there could be lost and the path never restored);
        then a not-DENIED EV of the port; EV 0 only when nothing else is left."""
        if 0 <= echo < self.n and self.state[echo] == GOOD and self.ev_port[echo] == port:
            return echo
        evs = self.port_evs[port] if port < self.nports else ()
        k = self.ctl_rr = self.ctl_rr + 1
        if evs:
            return evs[k % len(evs)]
        others = [i for other in self.port_evs for i in other]
        if others:
            return others[k % len(others)]
        for i in range(self.n):
            if self.ev_port[i] == port and self.state[i] != DENIED:
                return i
        return 0

    def penalise(self, i: int) -> None:
        """ECN-echo or trim on EV i: lower its preference (steer away); the window is untouched."""
        if not self.pen[i]:
            self.npen += 1
        p = self.pen[i] + PEN_STEP
        self.pen[i] = PEN_MAX if p > PEN_MAX else p
        self.skip[i] = self.pen[i] + 1
        self.dirty = True
        if self.seq:
            self._sync_rr(self.port_evs)
            self.seq = []  # leave the fast path until penalties decay
            self.since_rebuild = _REBUILD_EVERY  # build the weighted pattern at the next pick

    def relieve(self, i: int) -> None:
        """A clean acknowledgement of EV i: one step of its penalty back."""
        p = self.pen[i] - 1
        self.pen[i] = p
        if not p:
            self.npen -= 1
        self.dirty = True

    def hot_spot(self, i: int) -> bool:
        """EV i is already penalised while at most a quarter of the GOOD EVs are: one hot path among
        clean ones, which steering is moving traffic off, not a congested QP."""
        return self.pen[i] >= PEN_STEP and 4 * self.npen <= self.good_count

    # ------------------------------------------------------------------ state machine

    def loss(self, i: int, now: int, sent: int = -1, psn: int = -1) -> None:
        """A packet (PSN `psn`) sent on EV i at `sent` (-1: not known) was lost (not trimmed): retire the
        EV unless at the floor."""
        self.losses += 1
        self.drops[i] += 1
        if self.state[i] == GOOD:
            if self.good_count > self.min_active:
                self._set(i, ASSUMED_BAD, now)
                self.marked_bad += 1
                self.bad_sent[i] = sent if sent >= 0 else now
                self.bad_psn[i] = psn
                self.probe_at[i] = now + self.probe_interval
                self.probe_ivl[i] = self.probe_interval
                self.probe_ok[i] = 0
                if now + self.probe_interval < self.next_probe_deadline:
                    self.next_probe_deadline = now + self.probe_interval
            else:
                self.penalise(i)

    def refute(self, i: int, sent: int, psn: int, now: int) -> bool:
        """The transmission of `psn` on EV i at `sent` was delivered: its acknowledgement came back at
        `now`. When that is the transmission whose loss made i ASSUMED_BAD, or one sent after it, the
        call was wrong: the path delivered what it was said to have lost. i is GOOD again at once, as
        after its probes, and its probes stop. A path that really failed delivers nothing sent after the
        failure; a delivery sent before the transmission that retired i (or at the same time: one burst
        shares a timestamp) says nothing about the path since, and one acknowledged later than a probe
        may be answered is a path too slow to use (its probes would fail): neither is taken."""
        if self.state[i] != ASSUMED_BAD or now - sent > self.probe_timeout:
            return False
        b = self.bad_sent[i]
        if sent < b or (sent == b and psn != self.bad_psn[i]):
            return False
        # no more probes; one in flight is still awaited, so that its reply is not taken for a stray
        self.probe_at.pop(i, None)
        self.probe_ivl.pop(i, None)
        self.probe_ok.pop(i, None)
        self._set(i, GOOD, now)
        self.refuted += 1
        self._recompute_probe_deadline()
        return True

    def _set(self, i: int, state: int, now: int) -> None:
        old = self.state[i]
        if old == state:
            return
        self.state[i] = state
        if old == GOOD:
            self.good_count -= 1
        if state == GOOD:
            self.good_count += 1
            if self.pen[i]:
                self.npen -= 1
                self.pen[i] = 0
        if (old, state) in ((GOOD, ASSUMED_BAD), (ASSUMED_BAD, GOOD)) and (
            self.profile.event_mask & EV_STATE_BIT[state]
        ):
            e = self.profile.entries[i]
            pid = self.profile.profile_id
            ev = EvEvent(now, pid, self.qpn, i, e.ev, e.port, EvState(state), self.drops[i])
            self.drops[i] = 0
            if self.ev_cqs:
                for cq in self.ev_cqs:
                    cq.push(ev)
            elif len(self.events) < MAX_UNPOLLED:
                self.events.append(ev)
            else:
                self.events_dropped += 1
        self._rebuild()

    def set_denied(self, indices: list[int], denied: bool, now: int) -> None:
        for i in indices:
            if denied:
                self._forget_probe(i)
                self._set(i, DENIED, now)
            elif self.state[i] == DENIED and self.ev_port[i] not in self.peer_down:
                self._set(i, GOOD, now)
        self._recompute_probe_deadline()

    def peer_port(self, port: int, up: bool, now: int) -> None:
        """The peer says its plane port `port` is down or up (PORT_STATUS, or probes answered)."""
        idx = [i for i in range(self.n) if self.ev_port[i] == port]
        if up:
            self.peer_down.discard(port)
            self.peer_probe_at.pop(port, None)
            self.peer_probe_ok.pop(port, None)
            self.set_denied([i for i in idx if i not in self.profile.denied], False, now)
            return
        if port in self.peer_down:
            # already down and being probed: a repeat (a newer epoch from a flapping port, or a forger's
            # stream of them) neither pushes the next probe back nor forgets the one in flight, which
            # would keep the port from ever being probed and run the QP out of paths
            return
        self.peer_down.add(port)
        self.peer_probe_ok[port] = 0
        self.peer_probe_at[port] = now + self.probe_max
        self.set_denied(idx, True, now)

    def detach(self) -> None:
        """Leave the profile (the QP is destroyed or reset): its deny/allow no longer reach this set."""
        self.stop_probes()
        if self in self.profile.paths:
            self.profile.paths.remove(self)

    def stop_probes(self) -> None:
        """No more probes of any kind (the QP is in ERROR)."""
        self.probe_at.clear()
        self.probe_wait.clear()
        self.peer_probe_at.clear()
        self.next_probe_deadline = 1 << 62

    def set_state(self, i: int, state: EvState, now: int) -> None:
        """Controller override (MODIFY_EV_STATE)."""
        if state == EvState.DENIED:
            self.set_denied([i], True, now)
            return
        self._forget_probe(i)
        self._set(i, int(state), now)
        if state == EvState.ASSUMED_BAD:
            # the controller's mark: no delivery of what was sent before it refutes it (`refute`)
            self.bad_sent[i] = now + 1
            self.bad_psn[i] = -1
            self.probe_at[i] = now + self.probe_interval
            self.probe_ivl[i] = self.probe_interval
            self.probe_ok[i] = 0
        self._recompute_probe_deadline()

    def _forget_probe(self, i: int) -> None:
        self.probe_at.pop(i, None)
        self.probe_ivl.pop(i, None)
        self.probe_ok.pop(i, None)
        for rid in [r for r, w in self.probe_wait.items() if w[0] == i]:
            del self.probe_wait[rid]

    def _recompute_probe_deadline(self) -> None:
        d = 1 << 62
        for t in self.probe_at.values():
            d = min(d, t)
        for _, t, _ in self.probe_wait.values():
            d = min(d, t)
        for t in self.peer_probe_at.values():
            d = min(d, t)
        self.next_probe_deadline = d

    # ------------------------------------------------------------------ probes

    def _probe_result(self, r: ProbeResult) -> None:
        if len(self.probe_results) < MAX_UNPOLLED:
            self.probe_results.append(r)
        else:
            self.probe_results_dropped += 1

    def due_probes(self, now: int, next_request_id: int) -> list[tuple[int, int]]:
        """Handle probe timeouts and return [(request_id, ev index)] to send now (with timestamp
        `now`): ASSUMED_BAD EVs, and one EV of each peer port reported down."""
        out: list[tuple[int, int]] = []
        for rid, (i, deadline, _) in list(self.probe_wait.items()):
            if deadline <= now:
                del self.probe_wait[rid]
                port = self.ev_port[i]
                self._probe_result(ProbeResult(now, self.qpn, i, port, False, -1))
                if port in self.peer_down and self.state[i] == DENIED:
                    self.peer_probe_ok[port] = 0
                    self.peer_probe_at[port] = now + self.probe_max
                    continue
                if self.state[i] != ASSUMED_BAD:
                    # a peer port's probe that the port's return (or a controller) overtook: the EV
                    # is GOOD or DENIED now and is not probed again
                    continue
                self.probe_ok[i] = 0
                ivl = min(self.probe_ivl.get(i, self.probe_interval) * 2, self.probe_max)
                self.probe_ivl[i] = ivl
                self.probe_at[i] = now + ivl
        rid = next_request_id
        busy = set(self.probe_wait)
        for i, t in list(self.probe_at.items()):
            if t > now:
                continue
            # due: probed now while ASSUMED_BAD, else dropped (left in place, it would keep the
            # deadline due for ever: the driver's loop would spin)
            del self.probe_at[i]
            if self.state[i] == ASSUMED_BAD:
                while rid in busy or not rid:
                    rid = (rid + 1) & 0xFFFF
                self.probe_wait[rid] = (i, now + self.probe_timeout, now)
                out.append((rid, i))
                rid = (rid + 1) & 0xFFFF
        for port, t in list(self.peer_probe_at.items()):
            if t > now:
                continue
            del self.peer_probe_at[port]
            ok = self.peer_probe_ok.get(port, 0)
            evs = [i for i in range(self.n) if self.ev_port[i] == port and i not in self.profile.denied]
            if not evs:
                continue
            i = evs[ok % len(evs)]
            while rid in busy or not rid:
                rid = (rid + 1) & 0xFFFF
            self.probe_wait[rid] = (i, now + self.probe_timeout, now)
            out.append((rid, i))
            rid = (rid + 1) & 0xFFFF
        self._recompute_probe_deadline()
        return out

    def probe_reply(self, request_id: int, echo_ev: int, echo_ts: int, rtt_ns: int, now: int) -> bool:
        """A probe reply: it must echo the EV and send time of a probe still awaited (False: stray or
        forged, nothing changes)."""
        w = self.probe_wait.get(request_id)
        if w is None or w[0] != echo_ev or w[2] != echo_ts:
            return False
        del self.probe_wait[request_id]
        i = w[0]
        port = self.ev_port[i]
        self._probe_result(ProbeResult(now, self.qpn, i, port, True, rtt_ns))
        if port in self.peer_down and self.state[i] == DENIED:
            ok = self.peer_probe_ok.get(port, 0) + 1
            if ok >= self.probe_good:
                self.peer_epoch.pop(port, None)  # whatever epoch said down, the port answers
                self.peer_port(port, True, now)
            else:
                self.peer_probe_ok[port] = ok
                self.peer_probe_at[port] = now + self.probe_interval // 4
            self._recompute_probe_deadline()
            return True
        if self.state[i] != ASSUMED_BAD:
            self._recompute_probe_deadline()
            return True
        ok = self.probe_ok.get(i, 0) + 1
        if ok >= self.probe_good:
            self._forget_probe(i)
            self._set(i, GOOD, now)
        else:
            self.probe_ok[i] = ok
            self.probe_at[i] = now + self.probe_interval // 4
        self._recompute_probe_deadline()
        return True

    def counts(self) -> dict[str, list[int]]:
        """EV state counts per port: {state name: [count on port 0, port 1, ...]}."""
        out = {s.name: [0] * self.nports for s in EvState}
        for i in range(self.n):
            out[EvState(self.state[i]).name][self.ev_port[i]] += 1
        return out
