"""`mrcctl bench write --baseline udp` (root): the raw sendmmsg blaster through the testbed's eBPF
dataplane next to MRC, on test_daemon.py's module-scoped testbed (default.toml, one mrcd per host).

Behaviour only: the baseline row is there, the receiver's socket got bytes over the chosen planes' EVs,
the ratio is computed, the blaster's DestQP is no longer allowed at the destination afterwards and the
mrcds go on serving (a WRITE after it is bit-exact). The speed figures are in docs/daemon.md."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="namespaces, eBPF programs, daemons"),
              pytest.mark.netns, pytest.mark.bpf]

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_daemon import tb  # noqa: E402,F401  (the module-scoped testbed + mrcd fixture)

from mrc.ctl.bench import UDP_QPN, BenchConfig, WriteBench  # noqa: E402
from mrc.dataplane import abi  # noqa: E402
from mrc.dataplane.fabric import FabricDataplane  # noqa: E402


def test_udp_baseline(tb: dict[str, Any]) -> None:  # noqa: F811
    doc = WriteBench(BenchConfig(tb["name"], "h0", "h2", [4 << 20], planes=[1, 2], baseline="udp")).run()
    assert doc["bit_exact"]
    b = doc["baseline"]
    assert b["kind"] == "udp"
    assert b["planes"] == [1, 2] and b["evs"] > 0
    # the packet size of mrcd's QPs on default.toml (link MTU 9000): 8 KiB
    assert b["payload"] == 8192
    assert b["packets_sent"] == b["bytes"] // 8192 == 512
    assert b["received_bytes"] > 0 and b["packets_received"] > 0
    assert 0 < b["delivered"] <= 1.0
    assert b["goodput_gbps"] > 0
    assert b["ratio"] == pytest.approx(doc["goodput_gbps"] / b["goodput_gbps"], rel=0.01)
    with FabricDataplane.open(tb["name"]) as fd:
        assert fd.ingress is not None
        hid = fd._find_id(fd.ingress, "host", "h2")
        assert hid and fd.ingress.maps["mrc_allowed_qps"].get(abi.QpKey(hid, UDP_QPN)) is None
    after = WriteBench(BenchConfig(tb["name"], "h0", "h2", [1 << 20])).run()
    assert after["bit_exact"]


def _tx_packets(fd: FabricDataplane, host: str) -> int:
    return sum(int(r["tx_packets"]) for r in fd.host_stats(host)["planes"].values())


def test_mrcd_sends_the_largest_payload_the_links_carry(tb: dict[str, Any]) -> None:  # noqa: F811
    # default.toml's links have an MTU of 9000: 8 KiB payloads (payload_for_mtu), so a 4 MiB WRITE is
    # 512 data packets and some control packets (probes of EVs earlier tests left suspect, SACKs of
    # other traffic), where 4 KiB payloads (the engine's default) make 1024 data packets alone
    with FabricDataplane.open(tb["name"]) as fd:
        before = _tx_packets(fd, "h0")
        doc = WriteBench(BenchConfig(tb["name"], "h0", "h2", [4 << 20])).run()
        sent = _tx_packets(fd, "h0") - before
    assert doc["bit_exact"]
    assert 512 <= sent < 1000, sent
