"""Cluster files for the fluid model (`deploy/topologies/cluster/*.toml`) and their address plan.

`mrc.topology` names every host and switch and gives each a 16-bit micro-SID node ID
``plane << 12 | role << 8 | index`` (hosts ≥ 256: ``plane << 12 | 0x800 | index``): 256 leaves, 256
spines and 2,048 hosts at most. A 131,072-host cluster cannot have a node ID per host port — 12 bits per
plane name 4,096 nodes — and it does not need one. The plan for clusters (`address_plan`):

* **Only switches have micro-SIDs.** Leaf j of plane p: ``p << 12 | j`` (j < 0x800); spine k:
  ``p << 12 | 0x800 | k``. A path's container is [source leaf, spine, destination leaf]; the destination
  leaf's SID is End.DT6 (decapsulate), and the inner packet goes to the host by its address, which the
  leaf holds as a connected route. 768 switches per plane at radix 512, 2,048 + 2,048 at most.
* **Host MRC addresses come from the /48**: ``mrc_prefix:<leaf>:<port>::1`` in the host's
  ``mrc_prefix:<leaf>:<port>::/80`` (16 bits of leaf, 16 of port under the /48: 65,536 leaves of 65,536
  hosts). Path addresses, which the testbed puts in a host's /64, are not needed: the EV picks the
  container.
* **Link underlay** ``link_prefix:<upper 16 bits>:<lower 16 bits>::/64`` as today, a host link named by
  (leaf SID, port) and a fabric link by (leaf SID, spine SID): spine SIDs have bit 11 set and ports are
  below 0x800, so the two kinds never share a /64.

`plan_collisions` computes every switch SID, host address and link prefix of a cluster and counts
duplicates (the test of the shipped cluster files asserts none). The fluid model itself needs only the
shape (`cluster_fabric`).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Final

import numpy as np

from mrc import topology

from .fluid import MAX_SCALE_HOSTS_PER_LEAF, MAX_SCALE_INDEX, FluidFabric

DEFAULT_MRC_PREFIX: Final = ipaddress.IPv6Network("fd00::/48")
DEFAULT_LINK_PREFIX: Final = ipaddress.IPv6Network("fc00::/32")
_KEYS: Final = {
    "cluster": {"planes", "leaves", "spines", "hosts_per_leaf", "radix", "rate_gbps"},
    "addressing": {"mrc_prefix", "link_prefix"},
}


#: the shape's keys and their largest values (FluidFabric's bounds: a 16-bit SID has 4 bits of plane and
#: 11 of leaf or spine index)
_BOUNDS: Final = {"planes": topology.MAX_PLANES, "leaves": MAX_SCALE_INDEX, "spines": MAX_SCALE_INDEX,
                  "hosts_per_leaf": MAX_SCALE_HOSTS_PER_LEAF}


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def cluster_dir() -> Path:
    """The example cluster files (``deploy/topologies/cluster``, shipped with the topologies)."""
    return topology.default_topology_dir() / "cluster"


def load_cluster(path: str | Path) -> tuple[FluidFabric, dict[str, Any]]:
    """(fabric, the parsed document) of a cluster file; ValueError as ``FILE:LINE: key: problem`` (the
    topology files' form): values of the wrong type are refused, not converted."""
    p = Path(path)
    try:
        text = topology.read_text(p)
        # the topology files' parser: syntax errors and nesting too deep for tomllib give their line
        doc = topology.parse_toml(text, str(p))
    except topology.FileError as e:
        raise ValueError(str(e)) from None
    lines = topology.key_lines(text)

    def fail(key: str, problem: str) -> ValueError:
        return ValueError(str(topology.FileError(str(p), key, problem, topology.key_line(lines, key))))

    for table, keys in doc.items():
        if table not in _KEYS:
            raise fail(table, "unknown table (cluster files have [cluster], [addressing])")
        if not isinstance(keys, dict):
            raise fail(table, f"must be a table ([{table}]), got {_show(keys)}")
        for k in keys:
            if k not in _KEYS[table]:
                raise fail(f"{table}.{k}", f"unknown key (known: {', '.join(sorted(_KEYS[table]))})")
    c = doc.get("cluster")
    if not isinstance(c, dict):
        raise ValueError(f"{p}: needs a [cluster] table")

    def whole(key: str, hi: int | None = None) -> int:
        if key not in c:
            raise fail(f"cluster.{key}", "missing")
        v = c[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise fail(f"cluster.{key}", f"must be a whole number, got {_show(v)}")
        if hi is not None and not 1 <= v <= hi:  # FluidFabric's bounds, checked here for the key's line
            raise fail(f"cluster.{key}", f"must be an integer 1..{hi}, got {v}")
        return v

    rate = c.get("rate_gbps", 100)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1e6:
        raise fail("cluster.rate_gbps", f"must be a number of Gbit/s in (0, 1e6], got {rate!r}")
    planes, leaves, spines, hpl = (whole(k, hi) for k, hi in _BOUNDS.items())
    try:
        fab = FluidFabric(planes, leaves, spines, hpl, float(rate) * 1e9)
    except ValueError as e:
        raise fail("cluster", str(e)) from None
    if "radix" in c:
        radix = whole("radix")
        if fab.hosts_per_leaf + fab.spines > radix or fab.leaves > radix:
            raise fail("cluster.radix", f"{radix}: a leaf needs {fab.hosts_per_leaf + fab.spines} ports "
                                        f"and a spine {fab.leaves}")
    prefixes = (("mrc_prefix", DEFAULT_MRC_PREFIX, 48), ("link_prefix", DEFAULT_LINK_PREFIX, 32))
    for key, default, plen in prefixes:
        try:
            _net(doc, key, default, plen)
        except (TypeError, ValueError) as e:
            raise fail(f"addressing.{key}", str(e).removeprefix(f"addressing.{key}: ")) from None
    return fab, doc


def _net(doc: dict[str, Any], key: str, default: ipaddress.IPv6Network, plen: int) -> ipaddress.IPv6Network:
    raw = doc.get("addressing", {}).get(key)
    if raw is not None and not isinstance(raw, str):
        raise ValueError(f"addressing.{key}: must be an IPv6 prefix string such as '{default}', got {raw!r}")
    net = default if raw is None else ipaddress.IPv6Network(raw)
    if net.prefixlen != plen:
        raise ValueError(f"addressing.{key}: {net} must be a /{plen}")
    return net


def address_plan(fab: FluidFabric, doc: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """Every switch micro-SID (16 bits, per plane), host MRC address (its upper 64 bits: the /48 and
    leaf, then port, as one 80-bit prefix split into (hi64, port)), and link /64 (upper 64 bits)."""
    doc = doc or {}
    mrc = _net(doc, "mrc_prefix", DEFAULT_MRC_PREFIX, 48)
    lnk = _net(doc, "link_prefix", DEFAULT_LINK_PREFIX, 32)
    if mrc.overlaps(lnk):
        raise ValueError(f"addressing: {mrc} overlaps {lnk}")
    P, L, S, H = fab.planes, fab.leaves, fab.spines, fab.hosts_per_leaf
    p = np.arange(P, dtype=np.uint64)[:, None]
    leaf_sid = (p << np.uint64(12)) | np.arange(L, dtype=np.uint64)[None, :]
    spine_sid = (p << np.uint64(12)) | np.uint64(0x800) | np.arange(S, dtype=np.uint64)[None, :]
    sids = np.concatenate([leaf_sid.ravel(), spine_sid.ravel()])
    mrc_hi = np.uint64(int(mrc.network_address) >> 80)  # the /48 as 48 bits
    h = np.arange(fab.hosts, dtype=np.uint64)
    host_hi = (mrc_hi << np.uint64(16)) | (h // np.uint64(H))  # /48 + leaf: upper 64 bits
    host_port = h % np.uint64(H)
    lp = np.uint64(int(lnk.network_address) >> 96)  # the /32 as 32 bits
    # host links: (leaf SID of plane p, port); fabric links: (leaf SID, spine SID)
    host_links = (
        (lp << np.uint64(32))
        | (np.repeat(leaf_sid, H, axis=1) << np.uint64(16))
        | np.tile(np.arange(H, dtype=np.uint64), L)[None, :]
    ).ravel()
    fab_links = (
        (lp << np.uint64(32)) | (leaf_sid[:, :, None] << np.uint64(16)) | spine_sid[:, None, :]
    ).ravel()
    return {
        "sids": sids,
        "host_hi": host_hi,
        "host_port": host_port,
        "links": np.concatenate([host_links, fab_links]),
    }


def plan_collisions(fab: FluidFabric, doc: dict[str, Any] | None = None) -> dict[str, int]:
    """Duplicates in each name space of `address_plan` (all 0 for a sound plan), and the counts."""
    a = address_plan(fab, doc)
    host_keys = np.stack([a["host_hi"], a["host_port"]], axis=1)
    n_host_dup = len(host_keys) - len(np.unique(host_keys, axis=0))
    return {
        "switch_sids": len(a["sids"]),
        "switch_sid_duplicates": len(a["sids"]) - len(np.unique(a["sids"])),
        "host_addresses": len(host_keys),
        "host_address_duplicates": n_host_dup,
        "link_prefixes": len(a["links"]),
        "link_prefix_duplicates": len(a["links"]) - len(np.unique(a["links"])),
        "sids_fit_16_bits": int(bool((a["sids"] < np.uint64(1 << 16)).all())),
    }
