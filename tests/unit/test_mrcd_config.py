"""mrcd from a host configuration file, the parts that need no root: `--check-config` (validate, print
what would be installed, change nothing; a bad file is exit 2 with FILE:LINE: key: problem), the
controller on a configuration file's fabric (`ConfigView`: access links, paths, a failed spine link denied
and its EVs replaced on the other spine), and mrcctl's choice of the local mrcd."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrc import hostconfig
from mrc.ctl import api
from mrc.ctl.bench_remote import server_for
from mrc.ctl.controller import Controller, Deny, QpSample, SetPath
from mrc.ctl.daemon import main as mrcd_main
from mrc.ctl.site import ConfigView
from mrc.errors import MrcError
from mrc.transport import EvEvent, EvState

ROOT = Path(__file__).resolve().parents[2]
B2B = ROOT / "deploy" / "mrcd.example.toml"

CLOS = """
[host]
name = "ma"
mrc_address = "fd00:0:0:1::1"
mrc_prefix = "fd00::/48"

[[plane]]
interface = "eth1"
address = "fc00:0:100::1/64"
gateway = "fc00:0:100::2"

[[plane]]
interface = "eth2"
address = "fc00:0:200::1/64"
gateway = "fc00:0:200::2"

[fabric]
shape = "clos"

[[peer]]
name = "mc"
mrc_address = "fd00:0:0:3::1"

[[peer.plane]]
address = "fc00:0:101::1"
paths = [[0x0100, 0x0110, 0x0101, 0x0103], [0x0100, 0x0111, 0x0101, 0x0103]]

[[peer.plane]]
address = "fc00:0:201::1"
paths = [[0x0200, 0x0210, 0x0201, 0x0203], [0x0200, 0x0211, 0x0201, 0x0203]]

[engine]
evs = 8
"""


def test_check_config_prints_the_plan_and_needs_no_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert mrcd_main(["--check-config", str(B2B)]) == 0
    out = capsys.readouterr().out
    for plane in range(4):
        assert f"plane {plane}: interface eth{plane + 1}" in out
    assert "peer gpu2" in out and "mrc0: host_egress" in out


def test_check_config_names_file_line_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(B2B.read_text().replace('interface = "eth2"', 'interfaec = "eth2"'))
    assert mrcd_main(["--check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    line = next(i for i, t in enumerate(bad.read_text().splitlines(), 1) if "interfaec" in t)
    assert f"{bad}:{line}: plane[1].interfaec: unknown key" in err and "interface" in err


def test_config_and_testbed_modes_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        mrcd_main(["--config", str(B2B), "--host", "h0"])
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_config_view_gives_the_controller_its_fabric(tmp_path: Path) -> None:
    cfg = hostconfig.loads(CLOS, "clos.toml")
    view = ConfigView(cfg)
    assert view.planes == 2 and view.peer_names() == ["mc"]
    assert view.access_link(0) == frozenset(("ma", "p0:0100"))
    assert view.access_link(1) == frozenset(("ma", "p1:0200"))
    ctl = Controller(view, "ma", 8)
    effects = ctl.add_peer("mc")
    paths = [e.path for e in effects if isinstance(e, SetPath)]
    assert len(paths) == 8 and {p.plane for p in paths} == {0, 1}
    assert {p.spine for p in paths if p.plane == 0} == {0, 1}  # EVs spread over both spines of a plane
    # plane 0's spine 0 (uSID 0x0110) fails: its EVs go ASSUMED_BAD on a busy QP; the controller denies
    # the link and moves all but one of them to spine 1
    ctl.add_qp(7, "mc")
    via = [i for i, p in enumerate(paths) if p.plane == 0 and p.spine == 0]
    now = 10_000_000
    out = ctl.on_ev_events([EvEvent(now, 1, 7, i, i, 0, EvState.ASSUMED_BAD, 1) for i in via])
    for t in range(5):
        out += ctl.tick(now + t * 2_000_000, [None, None], {7: _sample(100 + t)})
    denied = [e for e in out if isinstance(e, Deny)]
    assert denied and set(denied[0].evs) == set(via)
    moved = [e for e in out if isinstance(e, SetPath)]
    assert moved and all(e.path.plane == 0 and e.path.spine == 1 for e in moved)
    assert {a.kind for a in ctl.log} >= {"deny", "replace"}


def _sample(tx: int) -> QpSample:
    return QpSample(tx, True)


def test_mrcctl_talks_to_the_socket_it_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MRC_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("MRC_SOCKET", raising=False)
    monkeypatch.setenv("MRC_SOCKET", str(tmp_path / "none.sock"))
    assert api.local_socket() == tmp_path / "none.sock"
    with pytest.raises(MrcError, match="no mrcd is listening"):
        api.hosts(None, None)


@pytest.mark.parametrize(("dst", "endpoint"), [("gpu2", "gpu2:18515"), ("gpu2:9000", "gpu2:9000"),
                                               ("fc00::2", "[fc00::2]:18515"), ("[fc00::2]:1", "[fc00::2]:1"),
                                               ("/run/x.sock", "/run/x.sock")])
def test_bench_dst_on_a_real_host_names_its_server(dst: str, endpoint: str) -> None:
    assert server_for(dst) == endpoint


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed SystemExit
def test_a_sigterm_swallowed_during_set_up_still_stops_mrcd(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SIGTERM handler ends set-up by raising SystemExit; raised inside a finaliser (here a __del__
    that runs in the middle of set-up, as a weakref callback did under load), Python only reports it and
    set-up carried on: mrcd then served forever. The request must still stand once set-up returns."""
    import os
    import signal

    from mrc import hostconfig as hc
    from mrc.ctl import daemon as dmod
    from mrc.dataplane import sdnotify

    events: list[str] = []

    class Finaliser:
        def __del__(self) -> None:
            signal.raise_signal(signal.SIGTERM)  # the handler's SystemExit is swallowed here

    class FakeSite:
        name = "fake"

        def __init__(self, *_a: object, **_k: object) -> None:
            Finaliser()  # collected at once: __del__ runs inside set-up

        def close(self) -> None:
            events.append("site closed")

    class FakeDaemon:
        def __init__(self, site: object, metrics: object = None) -> None:
            events.append("daemon made")

        def start(self) -> None:
            events.append("started")

        def run(self, _ready: object) -> None:
            events.append("served")

        def close(self) -> None:
            events.append("daemon closed")

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(hc, "load", lambda _p: type("C", (), {"metrics": None})())
    monkeypatch.setattr(dmod, "serving_pid", lambda _cfg: None)
    monkeypatch.setattr(dmod, "ConfigSite", FakeSite)
    monkeypatch.setattr(dmod, "Daemon", FakeDaemon)
    monkeypatch.setattr(sdnotify, "stopping", lambda: None)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        with pytest.raises(SystemExit):
            mrcd_main(["--config", str(B2B)])
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    assert "served" not in events and events[-1] == "daemon closed", events


def test_environment_switches_back_to_the_older_loss_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """mrcd's A/B switches: MRC_SAME_PORT_RACK=0 and MRC_EV_REFUTE=0 turn those rules off in the QP
    attributes mrcd creates its QPs with; unset (or anything else), they stay on."""
    from mrc.ctl.daemon import qp_attr_overrides
    from mrc.transport import QpAttr

    for var in ("MRC_SAME_PORT_RACK", "MRC_EV_REFUTE", "MRC_ACK_REQ_FLOOR"):
        monkeypatch.delenv(var, raising=False)
    attr = qp_attr_overrides(QpAttr())
    assert attr.same_port_rack and attr.ev_refute
    monkeypatch.setenv("MRC_EV_REFUTE", "0")
    attr = qp_attr_overrides(QpAttr())
    assert attr.same_port_rack and not attr.ev_refute
    monkeypatch.setenv("MRC_SAME_PORT_RACK", "0")
    monkeypatch.setenv("MRC_EV_REFUTE", "1")
    attr = qp_attr_overrides(QpAttr())
    assert not attr.same_port_rack and attr.ev_refute


@pytest.mark.parametrize(("var", "field"), [("MRC_ACK_REQ_FLOOR", "ack_req_floor"),
                                            ("MRC_ACK_DELAY_NS", "ack_delay_ns")])
def test_integer_switches_set_their_attribute_or_stop_mrcd_naming_the_variable(
    var: str, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MRC_ACK_REQ_FLOOR and MRC_ACK_DELAY_NS (side-by-side runs of the acknowledgement policy): an
    integer in QpAttr's range sets the field; anything else is an error naming the variable, never a
    QP created with a value QpAttr.check refuses."""
    from mrc.ctl.daemon import qp_attr_overrides
    from mrc.errors import MrcError
    from mrc.transport import QpAttr

    monkeypatch.setenv(var, "64000")
    assert getattr(qp_attr_overrides(QpAttr()), field) == 64000
    monkeypatch.delenv(var)
    assert getattr(qp_attr_overrides(QpAttr()), field) == getattr(QpAttr(), field)
    for bad in ("-5", "1e3", "999999999999"):
        monkeypatch.setenv(var, bad)
        with pytest.raises(MrcError, match=var):
            qp_attr_overrides(QpAttr())
