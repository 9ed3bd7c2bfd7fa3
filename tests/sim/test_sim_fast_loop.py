"""The fabric's fast event loop (`Fabric._run_fast`, the default: in C where mrc/sim/_simc.c is built,
else in Python, MRC_SIM_FAST=py) against its reference loop (MRC_SIM_FAST=0, `Fabric._run_ref`): the
same experiment gives the same document, every figure but the wall-clock ones, on runs that take every
branch of the loop (ECN marks, trims, buffer drops, a failed and a degraded link, no route, runs in
chunks with stop and progress callbacks); and the ECMP baseline's figures of a fixed seed are pinned (they
depend on nothing but the simulator: no engine runs there). No timing is asserted."""

from __future__ import annotations

import gc
import sys
import types
from typing import Any

import pytest

from mrc import topology
from mrc.sim import fabric as fabric_mod
from mrc.sim.experiments import (
    FabricSpec,
    RunSpec,
    degraded,
    failover,
    incast,
    permutation,
    without_machine_figures,
)
from mrc.sim.fabric import WIRE_OVERHEAD, Fabric, FabricParams

C_BUILT = fabric_mod._SIMC is not None
#: the loops: (FAST, LOOP_C) -- the reference loop, the fast loop in Python, the fast loop in C
LOOPS: dict[str, tuple[bool, bool]] = {"ref": (False, False), "py": (True, False), "c": (True, True)}


def _set_loop(monkeypatch: pytest.MonkeyPatch, loop: str) -> None:
    fast, c = LOOPS[loop]
    monkeypatch.setattr(fabric_mod, "FAST", fast)
    monkeypatch.setattr(fabric_mod, "LOOP_C", c)


def _loops() -> list[str]:
    return ["ref", "py", "c"] if C_BUILT else ["ref", "py"]


def _both(monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """run() with the reference loop, then with each fast loop; the fast loops' documents must be
    identical (wall-clock figures aside), and the last one is returned with the reference's."""
    docs = []
    for loop in _loops():
        _set_loop(monkeypatch, loop)
        docs.append(run())
    for d in docs[2:]:
        assert without_machine_figures(d) == without_machine_figures(docs[1])
    return docs[0], docs[-1]


def test_the_c_loop_is_built_where_setup_ran() -> None:
    """`make setup` builds mrc/sim/_simc.c (gcc and python3-dev are in its apt list): a checkout whose
    virtualenv was made by it runs the C loop, so the comparisons below cover it."""
    if not C_BUILT:
        pytest.skip("mrc/sim/_simc.c is not built here (gcc and python3-dev: make setup)")
    fab = Fabric(topology.generate(1, 2, 1, 2), fast=True)
    assert fab._loop_c is fabric_mod._SIMC


def _congested() -> FabricSpec:
    # 4 hosts per leaf over 2 spines (2:1 oversubscribed) and small buffers: marks, trims and drops
    return FabricSpec(planes=2, leaves=4, spines=2, hosts_per_leaf=4, buffer_bytes=48 * 1024,
                      ecn_bytes=12 * 1024, trim_bytes=24 * 1024)


def _small() -> FabricSpec:
    return FabricSpec(planes=2, leaves=2, spines=2, hosts_per_leaf=2)


def test_permutation_is_the_same_on_both_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = RunSpec(fabric=_congested(), variants=("ecmp", "mrc", "mrc-notrim"), seed=3)
    ref, fast = _both(monkeypatch, lambda: permutation(spec, duration_ns=60_000, warmup_ns=20_000))
    assert without_machine_figures(ref) == without_machine_figures(fast)
    res = fast["results"]
    # the run reached the general code of the fast loop: every threshold of a switch port
    assert res["mrc"]["trims"] > 0 and res["mrc"]["ecn_marks"] > 0
    assert res["ecmp"]["ecn_marks"] > 0 and sum(res["ecmp"]["drops"].values()) > 0
    assert sum(res["mrc-notrim"]["drops"].values()) > 0


def test_failover_with_flaps_is_the_same_on_both_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = RunSpec(fabric=_small(), variants=("ecmp", "mrc"), reconverge_ns=50_000)
    ref, fast = _both(monkeypatch, lambda: failover(spec, duration_ns=400_000, fail_ns=100_000,
                                                    heal_ns=300_000, flap_ns=60_000, bin_ns=50_000))
    assert without_machine_figures(ref) == without_machine_figures(fast)
    lost = [r["lost_on_failed_link"] + r["dropped_at_failed_link"] for r in fast["results"].values()]
    assert all(x > 0 for x in lost)  # packets lost on the link (epochs) and dropped at its down port


def test_degraded_link_is_the_same_on_both_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = RunSpec(fabric=_small(), variants=("ecmp", "mrc"))
    ref, fast = _both(monkeypatch, lambda: degraded(spec, factor=0.2, duration_ns=60_000, warmup_ns=20_000))
    assert without_machine_figures(ref) == without_machine_figures(fast)


def test_incast_is_the_same_on_both_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = RunSpec(fabric=_congested(), variants=("ecmp", "mrc"))
    ref, fast = _both(monkeypatch, lambda: incast(spec, senders=8, size=64 * 1024, time_limit_ns=2_000_000))
    assert without_machine_figures(ref) == without_machine_figures(fast)


class _Sender:
    """Sends `count` data packets to `dst` at t = 0 over EVs 0, 1, 2 in turn (`size` UDP bytes, 17,000 on
    EV 2); records what it receives."""

    def __init__(self, count: int = 0, size: int = 0, dst: int = 0) -> None:
        self.todo, self.size, self.dst = count, size, dst
        self.got: list[tuple[int, bool, int]] = []

    def receive(
        self, data: Any, now: int, ecn: bool = False, port: int = 0, src: bytes | None = None
    ) -> None:
        self.got.append((now, ecn, len(data)))

    def handle_timer(self, now: int) -> None:
        pass

    def datagrams_to_send(self, now: int) -> list[Any]:
        # EV k % 3; every third packet (EV 2) is larger than the fast hop's size table
        out = [(bytearray([0x0A]) + bytearray((self.size if k % 3 < 2 else 17_000) - 1), 0, k % 3, self.dst)
               for k in range(self.todo)]
        self.todo = 0
        return out

    def next_deadline(self) -> int | None:
        return None


def _fabric_run(
    monkeypatch: pytest.MonkeyPatch, loop: str
) -> tuple[list[Any], dict[str, int], int, list[int]]:
    _set_loop(monkeypatch, loop)
    topo = topology.generate(1, 2, 1, 2)  # 1 plane, 2 leaves, 1 spine, 2 hosts per leaf
    fab = Fabric(topo, FabricParams(buffer_bytes=40_000, ecn_bytes=10_000, trim_bytes=20_000))
    # EV 0 and EV 2: the real path to host 2 (its spine-leaf link slowed down: the general code of both
    # loops); EV 1: a container whose next micro-SID no switch knows (no route)
    good = fab.path_container(0, 2, 0, 0)
    bad = (good[0], good[1] ^ (0x7777 << 64))
    rows = {2: [good, bad, good]}
    fab.set_link_rate(fab.link("p0s0", "p0l1"), 50_000_000_000)
    a, b = _Sender(60, 4000 - WIRE_OVERHEAD, 2), _Sender()
    fab.attach(0, a, rows)
    fab.attach(2, b, {})
    fab.kick(0, 0)
    fab.run()
    return b.got, dict(fab.drops), fab.hops, list(fab.port_max_backlog)


def test_fabric_corner_cases_are_the_same_on_both_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    ref, *fasts = (_fabric_run(monkeypatch, loop) for loop in _loops())
    assert all(f == ref for f in fasts)
    fast = fasts[-1]
    got, drops, _, _ = fast
    assert drops.get("no_route", 0) == 20 and got and any(ecn for _, ecn, _ in got)
    assert any(n > 16_384 for _, _, n in got) and any(n < 4000 for _, _, n in got)  # huge ones; trims


def test_ecmp_figures_of_a_fixed_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline runs only simulator code: its figures for this seed (with buffer drops, NAKs and
    timeouts) are pinned, on both loops: a change to the fabric, the baseline hosts or ECMP routing that
    moves any of them fails here. (The values are those of the simulator before the fast loop.)"""
    fs = FabricSpec(planes=2, leaves=4, spines=2, hosts_per_leaf=4, buffer_bytes=32 * 1024,
                    ecn_bytes=12 * 1024, trim_bytes=24 * 1024)
    spec = RunSpec(fabric=fs, variants=("ecmp",), seed=7)
    for loop in _loops():
        _set_loop(monkeypatch, loop)
        doc = permutation(spec, duration_ns=300_000, warmup_ns=20_000)
        r = doc["results"]["ecmp"]
        assert (doc["events"], doc["packet_hops"]) == (104_480, 104_441)
        assert {k: r[k] for k in PINNED} == PINNED


PINNED: dict[str, Any] = {
    "capacity_fraction": 0.6123,
    "flow_fractions": [0.0177, 0.2512, 0.2787, 0.2805, 0.3624, 0.437, 0.4431, 0.5335, 0.7126, 0.7615, 0.866,
                       0.957, 0.9626, 0.9717, 0.9754, 0.9852],
    "drops": {"buffer": 516},
    "ecn_marks": 8321,
    "retx_packets": 976,
    "rto_count": 6,
    "naks": 58,
    "derived_this_draw": 0.6458,
}


class _Echo(_Sender):
    """Answers every packet with a 64-byte control packet to `peer` over EV 0 (and every tenth with a
    1,200-byte data packet over EV 1), and from a timer every 7 us sends a 100-byte packet, until 600 us:
    deliveries and timers that send (the loop's own send path), control packets in the priority queue."""

    def __init__(self, peer: int) -> None:
        super().__init__()
        self.peer = peer
        self.pending: list[Any] = []
        self.timer = 7_000

    def receive(
        self, data: Any, now: int, ecn: bool = False, port: int = 0, src: bytes | None = None
    ) -> None:
        super().receive(data, now, ecn, port, src)
        self.pending.append((bytearray([0xC0]) + bytearray(63), 0, 0, self.peer))
        if len(self.got) % 10 == 0:
            self.pending.append((bytearray([0x0A]) + bytearray(1199), 0, 1, self.peer))

    def handle_timer(self, now: int) -> None:
        if now >= self.timer:
            self.pending.append((bytearray([0xC1]) + bytearray(99), 0, 2, self.peer))
            self.timer = now + 7_000

    def datagrams_to_send(self, now: int) -> list[Any]:
        out, self.pending = self.pending, []
        return out

    def next_deadline(self) -> int | None:
        return self.timer if self.timer < 600_000 else None


def _chunked(monkeypatch: pytest.MonkeyPatch, loop: str) -> dict[str, Any]:
    """A fabric run in chunks of simulated time, with a link failed and healed by scheduled calls, a
    stop callback and a progress callback at every check (progress_every_s=0): what each callback saw,
    and the fabric's state after each chunk."""
    _set_loop(monkeypatch, loop)
    topo = topology.generate(1, 2, 1, 2)
    fab = Fabric(topo, FabricParams(buffer_bytes=40_000, ecn_bytes=10_000, trim_bytes=20_000))
    rows = {2: [fab.path_container(0, 2, 0, 0)] * 3}
    a, b = _Sender(3000, 1500, 2), _Echo(0)
    fab.attach(0, a, rows)
    fab.attach(2, b, {0: [fab.path_container(2, 0, 0, 0)] * 3})
    fab.kick(0, 0)
    fab.fail_link("p0s0", "p0l1", 200_000, 400_000)
    seen: dict[str, list[Any]] = {"stop": [], "progress": [], "chunks": []}

    def stop() -> bool:
        seen["stop"].append((fab.now, len(b.got)))
        return False

    def progress(f: Fabric) -> None:
        seen["progress"].append((f.now, f.events, f.hops, list(f.busy), list(f.port_tx_bytes)))

    for until in (100_000, 250_000, 900_000, 10_000_000):
        events = fab.run(until_ns=until, stop=stop, check_every=1024, progress=progress, progress_every_s=0.0)
        seen["chunks"].append((events, fab.now, fab.events, fab.hops, dict(fab.drops), list(fab.lost_on_link),
                               list(fab.port_max_backlog), fab.pending(), list(fab.port_tx_bytes),
                               list(fab.busy), fab.ecn_marks, fab.trims))
    seen["got"] = list(b.got)
    seen["echoed"] = list(a.got)
    return seen


def test_runs_in_chunks_with_callbacks_are_the_same_on_every_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    ref, *fasts = (_chunked(monkeypatch, loop) for loop in _loops())
    py = fasts[0]
    for f in fasts[1:]:  # the C loop against the Python fast loop: callbacks at the same events
        assert f == py
    # against the reference loop: the same packets and state (its checks fall on other events, as it
    # counts hops otherwise)
    assert ref["got"] == py["got"] and ref["echoed"] == py["echoed"]
    assert [c[1:] for c in ref["chunks"]] == [c[1:] for c in py["chunks"]]
    assert len(py["stop"]) > 3 and len(py["progress"]) > 3  # both callbacks ran, in more than one chunk
    last = py["chunks"][-1]
    assert sum(last[5]) > 0 and last[10] > 0  # packets lost on the failed link; ECN marks
    assert any(n == 64 for _, _, n in py["echoed"]) and any(n == 100 for _, _, n in py["echoed"])


def test_a_stale_c_loop_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-place build of another version of _simc.c (another ABI number) or one written against
    other constants is refused: the loop then runs in Python."""
    for stale in (types.SimpleNamespace(ABI=fabric_mod._SIMC_ABI + 1, consts=lambda: {}),
                  types.SimpleNamespace(ABI=fabric_mod._SIMC_ABI, consts=lambda: {"_SHIFT": 6})):
        monkeypatch.setitem(sys.modules, "mrc.sim._simc", stale)
        monkeypatch.setattr(sys.modules["mrc.sim"], "_simc", stale, raising=False)
        assert fabric_mod._load_simc() is None


class _Later(_Sender):
    """Sends `count` packets of `size` bytes to `dst` over EVs 0 to 2 from its timer at `at_ns`, so that
    the loop under test files every one of their events (none is made by `kick`, none by the Python
    helpers of the hops the fast path leaves to them)."""

    def __init__(self, count: int, size: int, dst: int, at_ns: int) -> None:
        super().__init__(count, size, dst)
        self.at_ns = at_ns

    def datagrams_to_send(self, now: int) -> list[Any]:
        if now < self.at_ns:
            return []
        out = [(bytearray([0x0A]) + bytearray(self.size - 1), 0, k % 3, self.dst) for k in range(self.todo)]
        self.todo = 0
        return out

    def next_deadline(self) -> int | None:
        return self.at_ns if self.todo else None


def test_the_c_loop_keeps_packets_in_flight_off_the_collectors_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """The events of packets in flight that the C loop files, and the route chains they carry, hold no
    object the garbage collector tracks, and are not tracked themselves: a collector pass does not walk
    every packet in flight (at 256 hosts those passes were a tenth of a permutation run)."""
    if not C_BUILT:
        pytest.skip("mrc/sim/_simc.c is not built here (gcc and python3-dev: make setup)")
    _set_loop(monkeypatch, "c")
    fab = Fabric(topology.generate(1, 2, 1, 2))
    good = fab.path_container(0, 2, 0, 0)
    a, b = _Later(40, 2000, 2, at_ns=1_000), _Sender()
    fab.attach(0, a, {2: [good, good, good]})
    fab.attach(2, b, {})
    fab.kick(0, 0)
    tracked: list[bool] = []

    def look(t: int) -> None:
        events = list(fab.cur) + [e for bucket in fab.future.values() for e in bucket]
        tracked.extend(gc.is_tracked(e) for e in events if e[1] >= 0)  # packet events (port index >= 0)
        tracked.extend(gc.is_tracked(ch) for ch in (e[3] for e in events if e[1] >= 0) if ch)

    for t in range(1_500, 40_000, 1_000):
        fab.at(t, look)
    fab.run()
    assert len(b.got) == 40  # every packet arrived
    assert len(tracked) > 40 and not any(tracked)
