"""The fluid model (mrc.sim.fluid): max-min rates on fabrics solvable by hand, the ECMP hash mirroring
the packet simulator's, MRC's deny and steering, the cluster address plan, and agreement with the packet
simulator at 64 hosts (docs/sim.md, "Fluid model")."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from mrc.sim import experiments as exps
from mrc.sim import fluid as fl
from mrc.sim import fluid_exp
from mrc.sim.cluster import cluster_dir, load_cluster, plan_collisions
from mrc.sim.derive import ecmp_plane_share
from mrc.sim.derive import maxmin as derive_maxmin


def test_maxmin_by_hand() -> None:
    # f0 on link 0; f1 on links 0 and 1; f2 on links 1 and 2 (capacity 1/4): f2 = 1/4 at link 2,
    # then link 1 leaves 3/4 for f1, but link 0 fills first at 1/2 for f0 and f1
    inc = fl.from_lists([[0], [0, 1], [1, 2]])
    assert fl.maxmin(inc, np.array([1.0, 1.0, 0.25])).tolist() == [0.5, 0.5, 0.25]
    # the classic parking lot: a long flow over 3 links, one short flow on each: all 1/2
    inc = fl.from_lists([[0, 1, 2], [0], [1], [2]])
    assert fl.maxmin(inc, np.ones(3)).tolist() == [0.5, 0.5, 0.5, 0.5]
    # a flow with no path (a dead connection) gets 0; a failed link (capacity 0) freezes its flows at 0
    inc = fl.from_lists([[], [0], [0, 1]])
    assert fl.maxmin(inc, np.array([1.0, 0.0])).tolist() == [0.0, 1.0, 0.0]


def test_weighted_split_by_hand() -> None:
    # flow 0 split 3/4 on link 0, 1/4 on link 1; flow 1 on link 1 only; both capacity 1:
    # level t: link 0 fills at 4/3, link 1 at t/4 + t = 1 -> t = 4/5 first; both frozen at 4/5
    inc = fl.from_lists([[0, 1], [1]], [[0.75, 0.25], [1.0]])
    assert fl.maxmin(inc, np.ones(2)) == pytest.approx([0.8, 0.8], rel=1e-15)
    # dyadic: flow 0 half on each link, flow 1 on link 1 of capacity 3/4: t/2 + t = 3/4 -> 1/2
    inc = fl.from_lists([[0, 1], [1]], [[0.5, 0.5], [1.0]])
    assert fl.maxmin(inc, np.array([1.0, 0.75])).tolist() == [0.5, 0.5]


def test_maxmin_agrees_with_the_set_based_water_filling() -> None:
    rng = random.Random(5)
    for _ in range(30):
        flows = [rng.sample(range(25), rng.randint(1, 4)) for _ in range(50)]
        assert fl.maxmin(fl.from_lists(flows), np.ones(25)) == pytest.approx(derive_maxmin(flows), rel=1e-9)


def test_two_leaf_fabric_by_hand() -> None:
    # 1 plane, 2 leaves, 2 spines, 2 hosts per leaf; h0->h2 and h1->h3 cross; MRC sprays each flow half
    # over each spine: every uplink carries 1/2 + 1/2 = 1, all flows at line rate
    fab = fl.FluidFabric(1, 2, 2, 2)
    st = fl.LinkState(fab)
    src, dst = np.array([0, 1]), np.array([2, 3])
    r, _ = fl.mrc_rates(fab, st, src, dst, fl.mrc_paths(fab, src, dst, 4, 1))
    assert r.tolist() == [1.0, 1.0]
    # spine 1's link to leaf 0 fails: every EV through spine 1 is denied, both flows share spine 0
    st.fail_leaf_spine(0, 0, 1)
    r, _ = fl.mrc_rates(fab, st, src, dst, fl.mrc_paths(fab, src, dst, 4, 1))
    assert r.tolist() == [0.5, 0.5]
    # degraded to 1/2 instead: even split puts 1/2 of each flow on it (load t, capacity 1/2): t = 1/2;
    # steering moves traffic off it until the pool of 1.5 is shared: 3/4 each
    st = fl.LinkState(fab)
    st.degrade_leaf_spine(0, 0, 1, 0.5)
    paths = fl.mrc_paths(fab, src, dst, 4, 1)
    assert fl.mrc_rates(fab, st, src, dst, paths)[0].tolist() == [0.5, 0.5]
    steered, _ = fl.mrc_rates(fab, st, src, dst, paths, steer_rounds=40)
    assert steered == pytest.approx([0.75, 0.75], abs=0.02)


def test_ecmp_reconvergence_and_planes() -> None:
    fab = fl.FluidFabric(2, 2, 2, 1)  # h0 on leaf 0, h1 on leaf 1, 2 planes x 2 spines
    st = fl.LinkState(fab)
    src, dst = np.array([0]), np.array([1])
    inc = fl.ecmp_connections(fab, st, src, dst, 1)
    assert fl.flow_rates(inc, fl.maxmin(inc, st.cap)).tolist() == [2.0]  # one connection per plane
    st.fail_spine(0, 0)
    st.fail_spine(0, 1)  # plane 0 has no route: its connection is dead in every view
    inc = fl.ecmp_connections(fab, st, src, dst, 1)
    assert fl.flow_rates(inc, fl.maxmin(inc, st.cap)).tolist() == [1.0]
    # finite transfers split over the connections wait for the dead one: a stalled step
    assert fluid_exp.solve(fab, st, "ecmp", src, dst, 1, finite=True).tolist() == [0.0]
    assert fluid_exp.solve(fab, st, "mrc", src, dst, 1, evs=4).tolist() == [0.5]


def test_ecmp_hash_is_the_packet_simulators() -> None:
    # the fluid ECMP of the 64-host permutation is derive.py's max-min for the packet sim's own hash draw
    spec = exps.RunSpec(seed=1)
    fs = spec.fabric
    topo = fs.topology()
    from mrc.sim.fabric import Fabric
    from mrc.sim.hosts import EcmpRouting

    routing = EcmpRouting(Fabric(topo), 1, 0)
    perm = fl.sim_derangement(fs.hosts, 1)
    shares = []
    for p in range(fs.planes):
        spine_of = [
            routing.spine(i, int(perm[i]), 0xC000 | ((i * fs.planes + p + 1) & 0x3FFF), p)
            for i in range(fs.hosts)
        ]
        shares.append(ecmp_plane_share(fs.leaves, fs.hosts_per_leaf, perm.tolist(), spine_of))
    fab = fl.FluidFabric.from_topology(topo)
    st = fl.LinkState(fab)
    inc = fl.ecmp_connections(fab, st, np.arange(fs.hosts), perm, 1)
    r = fl.flow_rates(inc, fl.maxmin(inc, st.cap)) / fab.planes
    assert r.mean() == pytest.approx(sum(shares) / len(shares), rel=1e-12)


def test_the_cluster_files_have_collision_free_plans() -> None:
    files = sorted(cluster_dir().glob("cluster-*.toml"))
    assert [f.name for f in files] == ["cluster-131k.toml", "cluster-32k.toml", "cluster-8k.toml"]
    for f in files:
        fab, doc = load_cluster(f)
        c = plan_collisions(fab, doc)
        assert c["switch_sid_duplicates"] == c["host_address_duplicates"] == c["link_prefix_duplicates"] == 0
        assert c["sids_fit_16_bits"] == 1
        assert c["host_addresses"] == fab.hosts
    fab, _ = load_cluster(cluster_dir() / "cluster-131k.toml")
    assert (fab.planes, fab.leaves, fab.spines, fab.hosts) == (8, 512, 256, 131072)


def test_agreement_with_the_packet_simulator_at_64_hosts() -> None:
    """Permutation and degraded link, 64 hosts, 8 planes x 8 spines, seed 1: capacity within 0.03 and
    worst flow within 0.05 of the packet simulator (same permutation, same ECMP hash draw)."""
    spec = exps.RunSpec(seed=1)
    fab = fl.FluidFabric.from_topology(spec.fabric.topology())
    src = np.arange(fab.hosts)
    dst = fl.sim_derangement(fab.hosts, 1)
    pk = exps.permutation(spec, duration_ns=100_000, warmup_ns=30_000)["results"]
    st = fl.LinkState(fab)
    for v in ("ecmp", "mrc"):
        r = fluid_exp.solve(fab, st, v, src, dst, 1)
        assert abs(r.mean() - pk[v]["capacity_fraction"]) <= 0.03, v
        assert abs(r.min() - pk[v]["flow_fraction_min"]) <= 0.05, v
    dg = exps.degraded(spec, factor=0.1, duration_ns=100_000, warmup_ns=30_000)["results"]
    st = fl.LinkState(fab)
    st.degrade_leaf_spine(0, 0, 0, 0.1)
    for v in ("ecmp", "mrc"):
        r = fluid_exp.solve(fab, st, v, src, dst, 1, steer_rounds=20)
        assert abs(r.mean() - dg[v]["capacity_fraction"]) <= 0.03, v
        assert abs(r.min() - dg[v]["flow_fraction_min"]) <= 0.05, v


@pytest.mark.parametrize(("body", "where", "problem"), [
    ("planes = 1.9", ":2: cluster.planes", "must be a whole number, got 1.9"),
    ("planes = true", ":2: cluster.planes", "must be a whole number, got True"),
    ('planes = "2"', ":2: cluster.planes", "must be a whole number, got '2'"),
    ('planes = 2\nradix = "x"', ":6: cluster.radix", "must be a whole number"),
    ("planes = 2\nwidth = 3", ":6: cluster.width", "unknown key"),
    ('planes = 2\nrate_gbps = "fast"', ":6: cluster.rate_gbps", "number of Gbit/s"),
    ('planes = 2\n[addressing]\nmrc_prefix = "zz"', ":7: addressing.mrc_prefix", "zz"),
    ('planes = 2\n[addressing]\nmrc_prefix = 5', ":7: addressing.mrc_prefix", "IPv6 prefix string"),
])
def test_cluster_file_errors_name_the_line_and_refuse_wrong_types(tmp_path: Path, body: str, where: str,
                                                                  problem: str) -> None:
    f = tmp_path / "c.toml"
    first, _, rest = body.partition("\n")
    f.write_text(f"[cluster]\n{first}\nleaves = 4\nspines = 4\nhosts_per_leaf = 4\n{rest}\n")
    with pytest.raises(ValueError) as e:
        load_cluster(f)
    assert str(e.value).startswith(f"{f}{where}: ") and problem in str(e.value), str(e.value)


def test_derangements_of_two_hosts_end_and_of_one_are_refused() -> None:
    """Two hosts: the repair loop swapped both fixed points and back for ever (`sim fluid permutation`
    on a two-host cluster hung). One host has no derangement: refused, in both models."""
    import random

    import numpy as np
    import pytest

    from mrc.sim import derive, fluid

    assert fluid.derangement(2, np.random.default_rng(0)).tolist() == [1, 0]
    for n in (0, 1):
        with pytest.raises(ValueError, match="at least 2 hosts"):
            fluid.derangement(n, np.random.default_rng(0))
        with pytest.raises(ValueError, match="at least 2 hosts"):
            derive.derangement(n, random.Random(0))
    p = fluid.derangement(5, np.random.default_rng(3))
    assert sorted(p.tolist()) == list(range(5)) and all(p[i] != i for i in range(5))
