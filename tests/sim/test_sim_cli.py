"""`mrcctl sim run`: JSON documents, tables, plots, input errors."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from mrc.ctl.cli import main

SMALL = ["--planes", "2", "--spines", "2"]


def _json(capsys: pytest.CaptureFixture[str], args: list[str]) -> Any:
    rc = main(["sim", "run", *args, "-j"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == "", err
    return json.loads(out)


def test_permutation_json(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, ["permutation", "--hosts", "8", *SMALL, "--duration", "40us", "--warmup", "10us",
                         "--variants", "ecmp,mrc,mrc-1plane"])
    assert doc["experiment"] == "permutation"
    assert set(doc["results"]) == {"ecmp", "mrc", "mrc-1plane"}
    for r in doc["results"].values():
        # bytes are counted per packet placed: over a 30 us window a flow at line rate may count one
        # packet per plane more than the window holds (4 KiB of ~360 KiB per plane, 1.1 %)
        assert 0 < r["capacity_fraction"] <= 1.011
    assert doc["results"]["mrc-1plane"]["capacity_fraction"] <= 0.5  # one plane of two
    e = doc["results"]["ecmp"]
    assert {"derived_expected", "derived_this_draw", "uplink_only_bound"} <= set(e)
    assert doc["events_per_s"] > 0 and doc["hops_per_s"] > 0


def test_failover_on_every_link_of_a_leaf_reports_each_and_the_worst(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = _json(capsys, ["failover", *SMALL, "--duration", "200us", "--fail-at", "50us", "--variants", "mrc",
                         "--link", "all-of-leaf0"])
    assert doc["experiment"] == "failover-sweep"
    assert [r["link"] for r in doc["runs"]] == [["p0l0", "p0s0"], ["p0l0", "p0s1"]]
    w = doc["worst"]["mrc"]
    during = [r["results"]["mrc"]["goodput_fraction_during_failure"] for r in doc["runs"]]
    assert w["goodput_fraction_during_failure"]["value"] == min(during)
    assert w["all_meet_required"] and w["zero_bins"] == 0
    assert main(["sim", "run", "failover", *SMALL, "--link", "all-of-p9l9"]) == 2
    assert "no leaf-spine link touches" in capsys.readouterr().err


def test_failover_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, ["failover", *SMALL, "--duration", "300us", "--fail-at", "100us", "--bin", "10us",
                         "--link", "p1l0-p1s0", "--variants", "mrc,ecmp", "--reconverge", "100us"])
    assert doc["config"]["link"] == ["p1l0", "p1s0"]
    for v in ("mrc", "ecmp"):
        r = doc["results"][v]
        assert {"goodput_fraction_during_failure", "reroute_s", "max_stall_s", "retx_bytes"} <= set(r)
    assert len(doc["timeline"]["goodput_fraction"]["mrc"]) == 30
    rc = main(["sim", "run", "failover", *SMALL, "--duration", "200us", "--fail-at", "50us", "--flap", "40us",
               "--variants", "mrc"])
    out, err = capsys.readouterr()
    assert rc == 0 and "flapping every 40 us" in out and "REROUTE US" in out and "failover mrc" in err


def test_failover_text_says_when_a_connection_never_recovered(capsys: pytest.CaptureFixture[str]) -> None:
    """One plane, one spine: the failed link carries every path, so the connection stays stalled. The
    table printed a REROUTE time (when the sender last sent into the dead link) and nothing else; its
    NOT RECOVERED column now counts the connections still stalled at the end."""
    rc = main(["sim", "run", "failover", "--planes", "1", "--spines", "1", "--hosts-per-leaf", "1",
               "--leaves", "2", "--duration", "1ms", "--fail-at", "200us", "--variants", "mrc",
               "--jobs", "1"])
    out, _ = capsys.readouterr()
    head, row = [ln for ln in out.splitlines() if ln.startswith(("VARIANT", "mrc "))]
    assert rc == 0 and "NOT RECOVERED" in head
    assert row[head.index("NOT RECOVERED"):].split()[0] == "1", row


def test_incast_text(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sim", "run", "incast", "--senders", "3", "--size", "64K", *SMALL, "--hosts-per-leaf", "2"])
    out, _ = capsys.readouterr()
    assert rc == 0
    assert "P99 US" in out and "mrc-notrim" in out and "hops/s" in out


def test_topology_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    small = Path(__file__).resolve().parents[2] / "deploy" / "topologies" / "small.toml"
    doc = _json(capsys, ["permutation", "--topology", str(small), "--duration", "2ms", "--warmup", "500us",
                         "--timeout", "13"])
    f = doc["config"]["fabric"]
    assert (f["planes"], f["leaves"], f["spines"], f["hosts_per_leaf"]) == (2, 2, 1, 1)
    assert f["rate_gbps"] == 0.1 and f["buffer_bytes"] == 131072 and f["ecn_bytes"] == 131072 // 4
    # two hosts on one leaf and none on the other: not an experiment's shape
    odd = tmp_path / "odd.toml"
    odd.write_text(small.read_text().replace("leaf = 1", "leaf = 0"))
    rc = main(["sim", "run", "incast", "--topology", str(odd), "-j"])
    out, _ = capsys.readouterr()
    assert rc != 0 and "leaf by leaf" in json.loads(out)["error"]
    # a buffer the testbed takes (1280-byte MTU) but smaller than the simulator's data packet: named
    # where the file says it, as every file error is (it named neither file nor line)
    tiny = tmp_path / "tiny.toml"
    text = small.read_text()
    assert 'buffer = "128KiB"' in text
    tiny.write_text(text.replace('buffer = "128KiB"', 'buffer = "1344"').replace("mtu = 9000", "mtu = 1280"))
    rc = main(["sim", "run", "permutation", "--topology", str(tiny), "-j"])
    err = json.loads(capsys.readouterr().out)["error"]
    line = next(i for i, ln in enumerate(tiny.read_text().splitlines(), 1) if ln.startswith("buffer"))
    assert rc == 2 and err.startswith(f"{tiny}:{line}: link.buffer: buffer_bytes 1344 cannot hold"), err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="matplotlib (the optional 'plot' extra) is not installed")
def test_plot_is_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    png = tmp_path / "incast.png"
    doc = _json(capsys, ["incast", "--senders", "2", "--size", "32K", *SMALL, "--hosts-per-leaf", "2",
                         "--plot", str(png)])
    assert doc["plot"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["permutation", "--hosts", "10", "--spines", "4"], "multiple of hosts per leaf"),
        (["permutation", "--variants", "tcp"], "unknown variant"),
        (["permutation", "--hosts", "8", "--duration", "10us", "--warmup", "20us", *SMALL], "warmup"),
        (["failover", "--link", "p0l0-h0"], "leaf-spine"),
        (["failover", "--link", "p0l0-p9s0"], "no link"),
        (["failover", "--fail-at", "5ms"], "inside the run"),
        (["incast", "--senders", "40", "--leaves", "2"], "senders need"),
        (["incast", "--ecn", "1M", "--buffer", "512K"], "must not exceed"),
        (["incast", "--size", "lots"], "not a size"),
    ],
)
def test_bad_input(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    rc = main(["sim", "run", *args, "-j"])
    out, _ = capsys.readouterr()
    assert rc != 0 and needle in json.loads(out)["error"]


def test_degraded_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, ["degraded", "--hosts", "8", *SMALL, "--hosts-per-leaf", "2", "--duration", "60us",
                         "--warmup", "20us", "--factor", "0.2", "--link", "p1l0-p1s1"])
    assert doc["experiment"] == "degraded" and doc["config"]["link"] == ["p1l0", "p1s1"]
    assert doc["config"]["factor"] == 0.2 and set(doc["results"]) == {"ecmp", "mrc"}
    for r in doc["results"].values():
        assert {"worst_flow_of_fair_share", "slow_link_load", "worst_flow_through_slow_link"} <= set(r)
    assert main(["sim", "run", "degraded", "--hosts", "8", *SMALL, "--hosts-per-leaf", "2",
                 "--link", "h0-p0l0"]) == 2
    assert "leaf-spine" in capsys.readouterr().err
    assert main(["sim", "run", "degraded", "--hosts", "8", *SMALL, "--hosts-per-leaf", "2",
                 "--factor", "0"]) == 2


def test_permutation_beyond_256_hosts(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, ["permutation", "--hosts", "320", "--planes", "1", "--spines", "16",
                         "--variants", "mrc", "--jobs", "1", "--duration", "20us", "--warmup", "10us"])
    assert doc["config"]["fabric"]["leaves"] == 20
    r = doc["results"]["mrc"]
    assert len(r["flow_fractions"]) == 320 and r["capacity_fraction"] > 0.8  # hosts 256..319 deliver too
    assert r["flow_fractions"][0] > 0.5
    assert main(["sim", "run", "permutation", "--hosts", "2064", "--spines", "16"]) == 2
    assert "'--hosts': must be 2..2048" in capsys.readouterr().err
    assert main(["sim", "run", "permutation", "--hosts", "2048", "--spines", "4", "--leaves", "1024"]) == 2
    assert "'--leaves': must be 1..256" in capsys.readouterr().err
