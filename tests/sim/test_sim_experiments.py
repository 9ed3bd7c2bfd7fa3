"""The unmodified engines on the fabric, the baseline, the derivations, and determinism by seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mrc import topology
from mrc.sim import derive
from mrc.sim.experiments import (
    FabricSpec,
    RunSpec,
    efficiency,
    failover,
    incast,
    permutation,
    without_machine_figures,
)
from mrc.sim.fabric import Fabric, FabricParams, spine_of_ev
from mrc.sim.hosts import Flow, HostParams, Traffic
from mrc.transport import EvState

ROOT = Path(__file__).resolve().parents[2]


def _run(variant: str, flows: list[Flow], until: int, topo: topology.Topology | None = None,
         fail: tuple[str, str, int] | None = None) -> tuple[Fabric, Traffic]:
    topo = topo or topology.generate(2, 2, 2, 2)
    fab = Fabric(topo, FabricParams())
    tr = Traffic(fab, variant, flows, HostParams(), until)
    if fail is not None:
        li = fab.link(fail[0], fail[1])
        fab.at(fail[2], lambda t: fab.set_link(li, False, t))
    def done() -> bool:
        tr.poll(fab.now)
        return any(f.size for f in flows) and tr.all_done()

    fab.run(until_ns=until, stop=done, check_every=1024)
    tr.poll(fab.now)
    return fab, tr


def test_mrc_flow_reaches_the_nic_rate_over_two_planes() -> None:
    # h0 -> h2 (other leaf), 2 planes x 100 Gb/s: payload capacity 2 x 100e9/8 x 4096/4278 bytes/s
    until = 150_000
    fab, tr = _run("mrc", [Flow(0, 2, None)], until)
    cap = 2 * 100e9 / 8 * efficiency(4096)
    frac = tr.delivered()[0] / (cap * until / 1e9)
    assert 0.93 <= frac <= 1.0  # includes the first RTT of the run
    assert not fab.drops and tr.counters()["retx_packets"] == 0


def test_finite_write_over_the_fabric_is_bit_exact() -> None:
    _fab, tr = _run("mrc", [Flow(0, 3, 300_000), Flow(1, 2, 200_000)], 5_000_000)
    assert tr.status == ["SUCCESS", "SUCCESS"]
    for (sb, db), f in zip(tr.bufs, tr.flows, strict=True):
        assert np.array_equal(sb[: f.size], db)


def test_failure_retires_exactly_the_evs_through_the_dead_link() -> None:
    # 128 EVs over 2 planes x 2 spines: EV v -> plane v % 2, spine (v // 2) % 2; the link p0l0-p0s1 is on
    # the 32 EVs of plane 0 / spine 1. A long flow h0 -> h2 retires those and only those.
    P, S = 2, 2
    _fab, tr = _run("mrc", [Flow(0, 2, None)], 400_000, fail=("p0l0", "p0s1", 100_000))
    qa = tr.qps[0][0]
    bad = {i for i, s in enumerate(qa.paths.state) if s == EvState.ASSUMED_BAD}
    on_link = {i for i, e in enumerate(qa.paths.profile.entries)
               if e.port == 0 and spine_of_ev(e.ev, P, S) == 1}
    assert len(on_link) == 32 and bad == on_link
    assert tr.counters()["rto_count"] == 0


def test_ecmp_baseline_pins_a_connection_to_one_spine() -> None:
    fab, tr = _run("ecmp", [Flow(0, 2, None)], 100_000)
    for c in tr.conns[0]:
        spine = tr.routing.spine(0, 2, c.sport, c.plane)
        assert spine is not None
        used = fab.port_tx_bytes[fab.port_of(f"p{c.plane}l0", f"p{c.plane}s{spine}")]
        unused = fab.port_tx_bytes[fab.port_of(f"p{c.plane}l0", f"p{c.plane}s{1 - spine}")]
        assert used > 0 and unused == 0


def test_ecmp_finite_transfer_completes_and_recovers_by_go_back_n() -> None:
    # two connections per plane collide on one 100 Gb/s path with a small buffer: drops, NAKs, rewinds
    topo = topology.generate(1, 2, 1, 2)
    fab = Fabric(topo, FabricParams(buffer_bytes=24 * 1024, ecn_bytes=16 * 1024, trim_bytes=None))
    flows = [Flow(0, 2, 1 << 20), Flow(1, 3, 1 << 20)]
    tr = Traffic(fab, "ecmp", flows, HostParams(), 50_000_000)
    fab.run(until_ns=50_000_000)
    tr.poll(fab.now)
    assert tr.status == ["SUCCESS", "SUCCESS"]
    assert tr.delivered() == [1 << 20, 1 << 20]


def test_maxmin_and_uplink_bound_by_hand() -> None:
    # flows 0 and 1 share link 10, flow 2 shares link 11 with flow 1: flow 1 and 0 get 1/2, flow 2 1/2
    assert derive.maxmin([[10], [10, 11], [11]]) == [0.5, 0.5, 0.5]
    assert derive.maxmin([[10], [10], [10], [11]]) == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])
    # 8 connections on 8 uplinks: E[busy] = 8 (1 - (7/8)^8)
    assert derive.uplink_bound(8, 8) == pytest.approx(1 - (7 / 8) ** 8)
    assert derive.uplink_bound(1, 4) == 1.0
    # everybody on one spine: per leaf the uplink carries all 2 cross-leaf flows
    share = derive.ecmp_plane_share(2, 2, [2, 3, 0, 1], [0, 0, 0, 0])
    assert share == pytest.approx(0.5)


def test_plane_share_is_the_set_based_water_filling() -> None:
    """ecmp_plane_share (vectorized water-filling) against the set-based maxmin over the same flows, on
    random permutations and hash draws, with connections inside a leaf (they run at line rate)."""
    import random

    rng = random.Random(11)
    for leaves, hpl, spines in ((2, 2, 2), (4, 8, 4), (16, 8, 8)):
        n = leaves * hpl
        for _ in range(20):
            perm = derive.derangement(n, rng)
            spine_of: list[int | None] = [rng.randrange(spines) for _ in range(n)]
            flows: list[list[int]] = []
            for src in range(n):
                ls, ld, sp = src // hpl, perm[src] // hpl, spine_of[src]
                if ls == ld or sp is None:
                    flows.append([])
                else:
                    flows.append([2 * ((ls << 16) | sp), 2 * ((ld << 16) | sp) + 1])
            want = sum(derive.maxmin(flows)) / n
            assert derive.ecmp_plane_share(leaves, hpl, perm, spine_of) == pytest.approx(want, abs=1e-12)
    # every connection inside its leaf: nothing shared, the whole capacity
    assert derive.ecmp_plane_share(2, 2, [1, 0, 3, 2], [0, 0, 0, 0]) == 1.0


SMALL = FabricSpec(planes=2, leaves=2, spines=2, hosts_per_leaf=2)


def test_same_seed_same_result_different_seed_different_draw() -> None:
    spec = RunSpec(fabric=SMALL, variants=("ecmp", "mrc"), seed=5)
    a = permutation(spec, duration_ns=40_000, warmup_ns=10_000)
    b = permutation(spec, duration_ns=40_000, warmup_ns=10_000)
    assert without_machine_figures(a) == without_machine_figures(b)
    c = permutation(RunSpec(fabric=SMALL, variants=("ecmp",), seed=6), duration_ns=40_000, warmup_ns=10_000)
    assert without_machine_figures(c)["results"]["ecmp"] != without_machine_figures(a)["results"]["ecmp"]
    f1 = failover(RunSpec(fabric=SMALL, variants=("mrc",)), duration_ns=300_000, fail_ns=100_000)
    f2 = failover(RunSpec(fabric=SMALL, variants=("mrc",)), duration_ns=300_000, fail_ns=100_000)
    assert without_machine_figures(f1) == without_machine_figures(f2)


def test_variants_in_worker_processes_give_the_same_results() -> None:
    """The experiments' variants run in forked workers (mrcctl's default): same documents as in one
    process, the speed summed over both runs, with two workers."""
    from mrc.ctl.workers import ForkMap

    spec = RunSpec(fabric=SMALL, variants=("ecmp", "mrc"), seed=3)
    a = permutation(spec, duration_ns=40_000, warmup_ns=10_000)
    b = permutation(spec, duration_ns=40_000, warmup_ns=10_000, run_all=ForkMap(2))
    assert a["workers"] == 1 and b["workers"] == 2
    assert without_machine_figures(a) == without_machine_figures(b)
    assert b["packet_hops"] == sum(r["packet_hops"] for r in b["results"].values()) > 0
    assert b["hops_per_s"] > 0 and b["hops_per_loop_s"] > 0
    i1 = incast(RunSpec(fabric=SMALL, variants=("mrc", "mrc-notrim")), senders=2, size=64 << 10)
    i2 = incast(RunSpec(fabric=SMALL, variants=("mrc", "mrc-notrim")), senders=2, size=64 << 10,
                run_all=ForkMap(2))
    assert without_machine_figures(i1) == without_machine_figures(i2)
    assert i1["results"]["mrc"]["completed"] == 2


def test_incast_with_trimming_recovers_without_timeouts() -> None:
    spec = RunSpec(fabric=FabricSpec(planes=2, leaves=2, spines=2, hosts_per_leaf=4, buffer_bytes=128 << 10,
                                     ecn_bytes=32 << 10, trim_bytes=64 << 10),
                   variants=("mrc", "mrc-notrim"))
    doc = incast(spec, senders=4, size=256 << 10)
    r = doc["results"]
    assert r["mrc"]["completed"] == 4 and r["mrc-notrim"]["completed"] == 4
    assert r["mrc"]["trims"] > 0 and r["mrc"]["rto_count"] == 0
    assert r["mrc-notrim"]["trims"] == 0 and r["mrc-notrim"]["drops"]


def test_a_trimmed_header_is_trimmed_and_counted_once() -> None:
    """A header trimmed at one congested hop and congested again at the next used to be trimmed (a no-op)
    and counted again: 36,257 `trims` for 13,653 real ones here. Each trim is one packet cut, which
    the receiver NACKs once."""
    fs = FabricSpec(planes=2, leaves=5, spines=2, hosts_per_leaf=8, rate_gbps=100.0, delay_ns=500,
                      buffer_bytes=65536, ecn_bytes=1, trim_bytes=1)
    doc = incast(RunSpec(fabric=fs, variants=("mrc",), seed=1, evs=128, timeout=8), 32, 64 << 10,
                   50_000_000)
    r = doc["results"]["mrc"]
    assert r["trims"] > 1000 and r["trims"] == r["nack_trim_rx"]


def test_retransmitted_bytes_are_the_bytes_sent_again() -> None:
    """`retx_bytes` was retx_packets x MTU: two 1-byte messages reported 81,920 retransmitted bytes. It is
    what went out again, for both variants."""
    fs = FabricSpec(planes=1, leaves=2, spines=1, hosts_per_leaf=2, rate_gbps=0.000001, delay_ns=500)
    doc = incast(RunSpec(fabric=fs, variants=("mrc", "ecmp"), seed=1, evs=128, timeout=8), 2, 1,
                   5_000_000)
    for v, r in doc["results"].items():
        assert r["retx_packets"] > 0, v
        assert r["retx_bytes"] == r["retx_packets"], v  # every packet carries the message's one byte


def test_degraded_slows_the_link_as_the_topology_has_it(tmp_path: Path) -> None:
    """The degraded link was set to the fabric's rate x factor: a file's [[link_override]] slowing it to
    1 Mbit/s came back at 5 Gbit/s with factor 0.5, and a product below 1 bit/s (both options within
    their ranges) ended in a worker's traceback. It is the link's own rate x factor, its own delay kept,
    and too slow a product is refused before any run."""
    from mrc.sim.experiments import degraded_link

    text = (ROOT / "deploy" / "topologies" / "default.toml").read_text()
    f = tmp_path / "slow.toml"
    f.write_text(text + '\n[[link_override]]\na = "p0l0"\nb = "p0s0"\nrate = "1mbit"\ndelay = "3us"\n')
    spec = RunSpec(fabric=FabricSpec.from_file(str(f)), variants=("mrc",))
    assert degraded_link(spec, None, 0.5) == ("p0l0", "p0s0", 500_000, 3_000)
    assert degraded_link(spec, ("p0l0", "p0s1"), 0.5)[2:] == (int(spec.fabric.rate_gbps * 1e9 * 0.5), None)
    tiny = RunSpec(fabric=FabricSpec(rate_gbps=0.000001), variants=("mrc",))
    with pytest.raises(ValueError, match="at least 1 bit/s"):
        degraded_link(tiny, None, 0.000001)


def test_a_connection_still_stalled_at_the_end_has_not_recovered() -> None:
    """One plane, two spines, spine 0's link of leaf 0 down: an ECMP connection hashed onto it stalls to
    the end of the run. Its reroute and recovery times were reported as 0.0 (the best value); they are
    None, with the connections still stalled counted. MRC sprays around the link and recovers."""
    fs = FabricSpec(planes=1, leaves=2, spines=2, hosts_per_leaf=2)
    doc = failover(RunSpec(fabric=fs, variants=("ecmp", "mrc")), duration_ns=400_000, fail_ns=100_000,
                   link=("p0l0", "p0s0"))
    ecmp, mrc = doc["results"]["ecmp"], doc["results"]["mrc"]
    assert ecmp["connections_not_recovered"] >= 1
    assert ecmp["recovered_s"] is None and ecmp["reroute_s"] is None
    assert ecmp["max_stall_s"] >= 250e-6
    assert mrc["connections_not_recovered"] == 0 and mrc["recovered_s"] is not None


def test_a_failed_link_off_the_flows_paths_takes_no_share_of_them() -> None:
    """Failover's flows run from leaf 0 to leaf 1; a link of leaf 2 carries none of them. It used to be
    charged 1 / (planes x spines) of their paths all the same (0.5 here), lowering the required fraction
    to 0.45 for a failure the flows never see. Its share is 0; a link of leaf 1's is still one path's."""
    fs = FabricSpec(planes=1, leaves=3, spines=2, hosts_per_leaf=2)
    off = failover(RunSpec(fabric=fs, variants=("mrc",)), duration_ns=200_000, fail_ns=100_000,
                   link=("p0l2", "p0s0"))
    assert off["config"]["failed_share_of_paths"] == 0.0
    assert off["results"]["mrc"]["required_fraction"] == 0.9
    assert off["results"]["mrc"]["lost_on_failed_link"] == 0
    on = failover(RunSpec(fabric=fs, variants=("mrc",)), duration_ns=200_000, fail_ns=100_000,
                  link=("p0l1", "p0s0"))
    assert on["config"]["failed_share_of_paths"] == 0.5


def test_the_priority_queue_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """128 senders onto one spine with trimming, with quick adapt left to SACKs alone (how the engine
    was: the senders' windows never shrank, since no SACK came): every retransmission was trimmed again
    while the headers alone filled the line, and a port's backlog reached 12x its buffer (the priority
    queue had no bound). It holds at most a buffer of its own on top of the data queue's; what finds
    both full is dropped and counted (`prio_buffer`)."""
    from mrc.sim.fabric import PRIO_BUFFER_SHARE
    from mrc.transport.cc import Nscc

    monkeypatch.setattr(Nscc, "_qa_due", lambda self, now: None)
    fs = FabricSpec(planes=1, leaves=3, spines=1, hosts_per_leaf=64)
    doc = incast(RunSpec(fabric=fs, variants=("mrc",)), 128, 16 << 10, 300_000)
    r = doc["results"]["mrc"]
    assert r["trims"] > 0 and r["drops"].get("prio_buffer", 0) > 0
    assert r["queue_max_bytes"] <= (1 + PRIO_BUFFER_SHARE) * fs.buffer_bytes + 9000


def test_a_deep_incast_with_trimming_completes() -> None:
    """The same incast with the engine as it is: a window's worth of trims with no SACK ends NSCC's
    quick-adapt period as a SACK does, so senders whose every packet is trimmed cut their windows to what
    got through. Before, none of the
    128 transfers completed in 1 ms (67,761 trims); now all do, near the receiver port's serialization
    time, with far fewer trims and no retransmission timeout, ahead of the same incast without trimming
    (whose drops wait for timeouts)."""
    fs = FabricSpec(planes=1, leaves=3, spines=1, hosts_per_leaf=64)
    doc = incast(RunSpec(fabric=fs, variants=("mrc", "mrc-notrim")), 128, 16 << 10, 1_000_000)
    r, nt = doc["results"]["mrc"], doc["results"]["mrc-notrim"]
    assert r["completed"] == 128 and nt["completed"] == 128
    assert r["rto_count"] == 0 and 0 < r["trims"] < 10_000
    assert r["max_s"] < 2 * r["ideal_s"] and r["max_s"] < nt["max_s"]
