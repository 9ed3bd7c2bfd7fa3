"""mrcctl's daemon-facing commands without a testbed or root: usage errors and the error document."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mrc.ctl.bench import parse_fail_link
from mrc.ctl.cli import main
from mrc.dataplane.client import MrcClient
from mrc.errors import MrcError


@pytest.fixture(autouse=True)
def empty_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MRC_RUN_DIR", str(tmp_path))


@pytest.mark.parametrize("args", [["ev", "show"], ["qp"], ["stats"], ["port", "show"],
                                  ["bench", "write", "--src", "h0", "--dst", "h2", "--size", "1M"],
                                  ["bench", "incast", "--dst", "h2"]])
def test_no_testbed_is_one_json_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-j", *args]) != 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert "no testbed" in json.loads(out)["error"]


def test_bench_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "write", "--src", "h0", "--dst", "h2", "--size", "1M", "-b", "4K"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["bench", "write", "--src", "h0", "--dst", "h2", "--heal-after", "1"]) == 2
    assert "--fail-link" in capsys.readouterr().err
    assert main(["bench", "write", "--src", "h0", "--dst", "h2", "--planes", "x"]) == 2


def test_parse_fail_link() -> None:
    assert parse_fail_link("p0l0:p0s0@1.5") == ("p0l0", "p0s0", 1.5)
    with pytest.raises(MrcError):
        parse_fail_link("p0l0-p0s0")


def test_client_without_daemon_says_so(tmp_path: Path) -> None:
    with pytest.raises(MrcError, match="no mrcd is listening"):
        MrcClient(tmp_path / "none.sock")


def test_stats_text_shows_the_control_socket_and_leaves_it_out_for_an_older_mrcd() -> None:
    from mrc.ctl.cmd_stats import _render

    plane = {"tx_packets": 1, "tx_bytes": 2, "rx_packets": 3, "rx_bytes": 4, "rx_ce": 0, "rx_trimmed": 0}
    base = {"qps": 1, "controller": {}, "engine_drops": {}, "denied_links": [],
            "dataplane": {"planes": {"0": plane}}}
    text = _render({"hosts": {
        "h0": {**base, "control": {"clients": 2, "rejected": {"too_many_fds": 24, "invalid": 1},
                                   "paused": 3}},
        "h1": base}})
    h0, h1 = (ln for ln in text.splitlines() if ln.startswith(("h0:", "h1:")))
    assert h0.endswith("; control: 2 clients, rejected invalid=1 too_many_fds=24, paused 3")
    assert "control:" not in h1 and h1.endswith("denied links -")


def test_an_empty_failure_row_says_why() -> None:
    """`bench write --fail-link` prints "detect -" when nothing could be detected; the row now says why,
    so a link the QP never crossed is not read as a failure the transport missed."""
    from mrc.ctl.cmd_bench import failure_notes

    cfg = {"src": "h0", "dst": "h1", "heal_after_s": 1.5}
    base = {"link": "p0l0-p0s0", "completed_before_failure": False, "evs_through_link": 16,
            "healed_during_transfer": True}
    assert failure_notes(base, cfg) == []
    assert "completed before the link failed" in failure_notes(
        {**base, "completed_before_failure": True}, cfg)[0]
    (unused,) = failure_notes({**base, "evs_through_link": 0}, cfg)
    assert "no path of the QP h0 -> h1 crosses p0l0-p0s0" in unused
    (late,) = failure_notes({**base, "healed_during_transfer": False}, cfg)
    assert "healed after the transfer ended" in late
    assert failure_notes({**base, "healed_during_transfer": False}, {**cfg, "heal_after_s": None}) == []


class _Answering:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def call(self, op: str, **_args: object) -> object:
        return self.answer


def _fleet(monkeypatch: pytest.MonkeyPatch, down: dict[str, str]) -> None:
    """mrcctl's fleet reads against three hosts whose mrcds answer, except those in `down`."""
    import contextlib

    from mrc.ctl import api

    monkeypatch.setattr(api, "hosts", lambda name, host: ("tb", ["h0", "h1", "h2"]))

    @contextlib.contextmanager
    def client(tb: str, host: str) -> Iterator[_Answering]:
        if host in down:
            raise MrcError(down[host])
        yield _Answering({"qps": 0, "controller": {}, "engine_drops": {}, "denied_links": [],
                          "dataplane": {"planes": {}}})

    monkeypatch.setattr(api, "client", client)


def test_a_fleet_read_with_one_mrcd_down_reports_it_and_fails(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """With one mrcd down, `stats` used to leave that host out silently (exit 0) after a SIGTERM, or
    fail for every host after a SIGKILL (its socket left behind). Every host is asked: the others'
    answers are printed, the one that failed is named (`unreachable`; stderr in text), exit status 1."""
    _fleet(monkeypatch, {"h1": "/run/mrc/tb-h1.sock: no mrcd is listening"})
    assert main(["-j", "stats"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    doc = json.loads(out)
    assert sorted(doc["hosts"]) == ["h0", "h2"]
    assert doc["unreachable"] == {"h1": "/run/mrc/tb-h1.sock: no mrcd is listening"}
    assert main(["stats"]) == 1
    cap = capsys.readouterr()
    assert "h0:" in cap.out and "h2:" in cap.out
    assert cap.err == "mrcctl: error: h1: /run/mrc/tb-h1.sock: no mrcd is listening\n"
    _fleet(monkeypatch, {})
    assert main(["-j", "stats"]) == 0
    assert "unreachable" not in json.loads(capsys.readouterr().out)


def test_hosts_include_those_whose_mrcd_was_started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose mrcd `testbed up --with-daemons` started is asked even when its socket is gone (a
    stopped mrcd removes it), so that the read reports it instead of leaving it out."""
    from mrc.ctl import api, daemons
    from mrc.dataplane import testbed as tbmod

    class Topo:
        def host_names(self) -> list[str]:
            return ["h0", "h1", "h2"]

    class Tb:
        name = "tb"
        topo = Topo()

        def ns(self, h: str) -> str:
            return f"tb-{h}"

    monkeypatch.setattr(tbmod, "names", lambda: ["tb"])
    monkeypatch.setattr(tbmod, "resolve_name", lambda name: "tb")
    monkeypatch.setattr(tbmod.Testbed, "load", staticmethod(lambda name: Tb()))
    monkeypatch.setattr(api, "socket_path", lambda ns: tmp_path / f"{ns}.sock")
    (tmp_path / "tb-h0.sock").touch()
    assert api.hosts(None, None) == ("tb", ["h0"])
    daemons.record_path("tb").parent.mkdir(parents=True)
    daemons.record_path("tb").write_text(json.dumps({"testbed": "tb", "daemons": {"h1": {"pid": 1}}}))
    assert api.hosts(None, None) == ("tb", ["h0", "h1"])


def test_port_stats_on_a_real_host_points_at_its_mrcd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """On a host whose mrcd runs from its configuration (no testbed), `mrcctl port` said "no testbed is
    up; bring one up", which is no help there: it names what does answer, the local mrcd's commands."""
    monkeypatch.setenv("MRC_SOCKET", str(tmp_path / "mrcd.sock"))
    assert main(["-j", "port"]) == 1
    assert "'mrcctl port show'" in json.loads(capsys.readouterr().out)["error"]
