"""Nothing stays behind: a loader killed with SIGKILL leaves its programs attached (the kernel keeps them),
and `mrcctl prog detach --all` removes every one, with the devices, rules, pins and records made for
them; a loader stopped with SIGTERM cleans up by itself."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mrc import topology
from mrc.dataplane import bpf, netns
from mrc.dataplane import testbed as tb

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="loads eBPF programs, builds namespaces"),
              pytest.mark.netns, pytest.mark.bpf, pytest.mark.slow]

TOPOS = Path(__file__).resolve().parents[2] / "deploy" / "topologies"

CHILD = """
import json, sys, time
from mrc.dataplane.fabric import FabricDataplane
fd = FabricDataplane.attach(sys.argv[1])
progs = [p for p in (fd.egress, fd.ingress, fd.switch) if p]
print(json.dumps({"prog_ids": [p.record["prog_id"] for p in progs],
                  "attachments": [a for p in progs for a in p.record["attachments"]]}), flush=True)
time.sleep(120)
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A private run dir and pin root: detach --all here touches nothing of the test session's."""
    e = {"MRC_RUN_DIR": str(tmp_path / "run"),
         "MRC_BPF_PIN_ROOT": f"/sys/fs/bpf/mrc-t-{secrets.token_hex(4)}"}
    for k, v in e.items():
        monkeypatch.setenv(k, v)
    name = "c" + secrets.token_hex(4)
    try:
        tb.up(topology.load(TOPOS / "small.toml"), name=name)
        yield {**os.environ, **e, "TB": name}
    finally:
        bpf.detach_everything()
        tb.teardown(name)


def start(env: dict[str, str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, env["TB"]], env=env, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"loader failed (rc {proc.wait()})"
    return proc, json.loads(line)


def kernel_ids() -> set[int]:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True).stdout
    return {int(p["id"]) for p in json.loads(out)}


def gone(ids: list[int], timeout: float = 5.0) -> bool:
    """Program release is RCU-deferred: poll."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not set(ids) & kernel_ids():
            return True
        time.sleep(0.1)
    return False


def clsacts(name: str) -> list[str]:
    """Interfaces of testbed `name` that still have a clsact qdisc."""
    out = []
    for ns in tb.Testbed.load(name).namespaces():
        with netns.ipr(ns) as ipr:
            for q in ipr.get_qdiscs():
                if q.get_attr("TCA_KIND") == "clsact":
                    out.append(f"{ns}/{q['index']}")
    return out


def assert_clean(env: dict[str, str], info: dict[str, Any]) -> None:
    for att in info["attachments"]:
        assert not bpf.kernel_view(att)["present"], att
    assert clsacts(env["TB"]) == []
    with netns.ipr(f"{env['TB']}-h0") as ipr:
        assert not ipr.link_lookup(ifname="mrc0")
        assert not [r for r in ipr.get_rules(family=10) if r.get_attr("FRA_TABLE") == 4791]
    assert not Path(env["MRC_BPF_PIN_ROOT"]).exists()
    assert not list((Path(env["MRC_RUN_DIR"]) / "dataplane").glob("*.json"))
    assert gone(info["prog_ids"])


def test_detach_all_after_a_crash(env: dict[str, str]) -> None:
    proc, info = start(env)
    assert len(info["prog_ids"]) == 3
    assert len(clsacts(env["TB"])) == 16 + 2  # switch_port on 16 fabric ports, host_egress on 2 x mrc0
    proc.kill()
    proc.wait()
    # the crash left everything in place: attachments, pins, records
    assert all(bpf.kernel_view(a)["present"] for a in info["attachments"])
    assert set(info["prog_ids"]) <= kernel_ids()
    assert len(list((Path(env["MRC_RUN_DIR"]) / "dataplane").glob("*.json"))) == 3
    out = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", "prog", "detach", "--all"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["records_removed"] == 3 and doc["attachments_removed"] == len(info["attachments"])
    assert_clean(env, info)


def test_sigterm_cleans_up(env: dict[str, str]) -> None:
    proc, info = start(env)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) != 0
    assert_clean(env, info)


def mrcctl(env: dict[str, str], *args: str) -> Any:
    out = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", *args], env=env, capture_output=True,
                         text=True, timeout=120)
    doc = json.loads(out.stdout) if out.stdout.strip() else {}
    assert out.returncode == 0, (args, out.stdout, out.stderr)
    return doc


def test_operator_commands(env: dict[str, str]) -> None:
    """attach in one process, then show / port / fault from others through the pinned maps, detach."""
    name = env["TB"]
    doc = mrcctl(env, "prog", "attach", "--name", name)
    assert {p["kind"] for p in doc["programs"]} == {"host_egress", "host_ingress", "switch_port"}
    shown = mrcctl(env, "prog", "show")["programs"]
    assert len(shown) == 3 and all(p["persistent"] and not p["loader_alive"] for p in shown)
    assert all(a["attached"] for p in shown for a in p["attachments"])
    cfg = mrcctl(env, "port", "set", "p0l1", "h1", "--rate", "10mbit", "--ecn-k", "8KiB", "--trim-t", "16KiB",
                 "--buffer", "32KiB")
    assert cfg == {"node": "p0l1", "port": "h1", "rate_bps": 10_000_000, "ecn_k": 8192, "trim_t": 16384,
                   "buffer": 32768}
    faults = mrcctl(env, "fault", "set", "p0l0", "p0s0", "--drop", "0.5", "--ev", "4")["faults"]
    assert {(f["node"], f["port"], f["drop"], f["ev"]) for f in faults} == {
        ("p0l0", "p0s0", 0.5, 4), ("p0s0", "p0l0", 0.5, 4)}
    stats = mrcctl(env, "port", "stats", "p0l1")
    assert stats["ports"]["p0l1"]["h1"]["config"]["buffer"] == 32768
    assert mrcctl(env, "fault", "clear")["cleared"] == 2
    assert mrcctl(env, "fault")["faults"] == []
    gone_ids = [p["prog_id"] for p in shown]
    out = mrcctl(env, "prog", "detach", "--name", name)
    assert out["records_removed"] == 3
    assert mrcctl(env, "prog")["programs"] == []
    assert gone(gone_ids)
