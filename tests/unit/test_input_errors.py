"""Input errors (issue 20): bad topology files name the file, the line and the problem; bad `mrcctl sim`
options are usage errors naming the option and its range, never tracebacks; every size, rate and count
that input controls is bounded, in the CLI and in the simulator's config objects alike (a library user
gets a ValueError, not an allocation storm)."""

from __future__ import annotations

import json
import math
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mrc import topology
from mrc.ctl.cli import main
from mrc.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
[topology]
planes = 2
leaves = 2
spines = 1

[link]
rate = "100mbit"
delay = "0us"
mtu = 9000
buffer = "128KiB"

[[hosts]]
name = "a"
leaf = 0

[[hosts]]
name = "b"
leaf = 1
"""


def _load_error(tmp_path: Path, content: str | bytes) -> str:
    f = tmp_path / "t.toml"
    if isinstance(content, bytes):
        f.write_bytes(content)
    else:
        f.write_text(content)
    with pytest.raises(ConfigError) as e:
        topology.load(f)
    return str(e.value)


# ---------------------------------------------------------------------------------- topology: lines


def test_every_semantic_error_names_the_line_of_its_key(tmp_path: Path) -> None:
    """Not only the [[hosts]] headers: a plain key of a plain table gets its own line."""
    msg = _load_error(tmp_path, GOOD.replace('rate = "100mbit"', 'rate = "5tbit"'))
    assert msg.startswith(f"{tmp_path / 't.toml'}:7: link.rate: must be 1kbit..1600gbit"), msg
    msg = _load_error(tmp_path, GOOD.replace("planes = 2", "planes = 0"))
    assert msg.startswith(f"{tmp_path / 't.toml'}:2: topology.planes: must be 1..16"), msg
    # a key inside an inline table is reported at the line that holds it
    doc = 'hosts = [{name = "a", leaf = 0},\n  {name = "b", leaf = 7}]\n' + GOOD.split("[[hosts]]")[0]
    msg = _load_error(tmp_path, doc)
    assert msg.startswith(f"{tmp_path / 't.toml'}:2: hosts[1].leaf: leaf 7 does not exist"), msg


def test_lines_are_found_past_multiline_strings_arrays_and_quoted_keys() -> None:
    text = ('x = """\n[topology]\nplanes = 9\n"""\n'  # lines 1-4: a string, not a table
            'y = [\n  1,\n  "]",\n]\n'  # 5-8: an array over lines
            '[ "topology" ]\n'  # 9
            '"planes" = 2  # comment\n'  # 10
            "[[hosts]]\n[[ hosts ]]\nleaf=1\n")  # 11-13
    lines = topology.key_lines(text)
    assert lines["topology"] == 9 and lines["topology.planes"] == 10
    assert lines["hosts"] == 11 and lines["hosts[0]"] == 11 and lines["hosts[1]"] == 12
    assert lines["hosts[1].leaf"] == 13 and lines["x"] == 1 and lines["y"] == 5
    assert topology.key_line(lines, "hosts[1].name") == 12  # missing: its entry's header
    assert topology.key_line(lines, "link.mtu") is None


# ------------------------------------------------------------------------------ topology: empty file


@pytest.mark.parametrize("content", ["", "\n\n", "# nothing but a comment\n"])
def test_an_empty_file_says_what_a_topology_needs(tmp_path: Path, content: str) -> None:
    """The same message every time (it used to name whichever missing key a set yielded first)."""
    msg = _load_error(tmp_path, content)
    assert msg == (f"{tmp_path / 't.toml'}: empty topology: needs [topology] with planes, leaves and "
                   "spines, and two or more [[hosts]] tables with name and leaf (docs/testbed.md, "
                   '"Topology files")')


def test_missing_fields_are_reported_in_a_fixed_order(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, "[topology]\n")
    assert msg == f"{tmp_path / 't.toml'}:1: topology.planes: missing field"
    msg = _load_error(tmp_path, "[link]\nmtu = 9000\n")
    assert msg.startswith(f"{tmp_path / 't.toml'}: topology: missing table"), msg


# ---------------------------------------------------------------------------------- topology: bytes


def test_non_utf8_names_the_file_line_and_byte_offset(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, GOOD.encode().replace(b'"a"', b'"\xe9"'))
    offset = GOOD.encode().index(b'"a"') + 1
    assert msg == (f"{tmp_path / 't.toml'}:13: not UTF-8 text: byte 0xe9 at offset {offset} "
                   "(TOML files are UTF-8)")


def test_testbed_up_reports_a_non_utf8_file_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "bin.toml"
    f.write_bytes(b"\x00\xff\xfe garbage")
    rc = main(["testbed", "up", str(f), "-j"])
    out, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in err
    assert json.loads(out)["error"].startswith(f"{f}:1: not UTF-8 text: byte 0xff at offset 1")


def test_syntax_errors_give_the_line_first(tmp_path: Path) -> None:
    msg = _load_error(tmp_path, GOOD.replace("spines = 1", "spines = = 1"))
    assert msg.startswith(f"{tmp_path / 't.toml'}:4: not valid TOML: "), msg


# ---------------------------------------------------------------------------------- topology: ranges


@pytest.mark.parametrize(("old", "new", "key", "needle"), [
    ('rate = "100mbit"', "rate = 999", "link.rate", "1kbit..1600gbit"),
    ('rate = "100mbit"', 'rate = "1601gbit"', "link.rate", "1kbit..1600gbit"),
    ('rate = "100mbit"', "rate = " + "9" * 400, "link.rate", "rate"),  # overflows a float
    ('rate = "100mbit"', 'rate = "' + "9" * 400 + 'mbit"', "link.rate", "rate"),
    ('delay = "0us"', 'delay = "2s"', "link.delay", "0..1s"),
    ('buffer = "128KiB"', 'buffer = "2G"', "link.buffer", "at most 1 GiB"),
    ("mtu = 9000", "mtu = 70000", "link.mtu", "1280..65535"),
    ("mtu = 9000", "mtu = 9000.5", "link.mtu", "must be an integer"),
    ("leaves = 2", "leaves = 257", "topology.leaves", "1..256"),
    ("spines = 1", "spines = 300", "topology.spines", "0..256"),
])
def test_every_link_and_shape_key_has_a_range(tmp_path: Path, old: str, new: str, key: str,
                                              needle: str) -> None:
    line = next(n for n, text in enumerate(GOOD.splitlines(), start=1) if text == old)
    msg = _load_error(tmp_path, GOOD.replace(old, new))
    assert msg.startswith(f"{tmp_path / 't.toml'}:{line}: {key}: "), msg
    assert needle in msg, msg


def test_override_rates_and_delays_have_the_same_ranges(tmp_path: Path) -> None:
    base = GOOD + '\n[[link_override]]\na = "p0l0"\nb = "p0s0"\n'
    msg = _load_error(tmp_path, base + 'rate = "2tbit"\n')
    assert msg.startswith(f"{tmp_path / 't.toml'}:23: link_override[0].rate: must be 1kbit..1600gbit"), msg
    msg = _load_error(tmp_path, base + "delay = 1000001\n")
    assert msg.startswith(f"{tmp_path / 't.toml'}:23: link_override[0].delay: must be 0..1s"), msg


def test_too_many_hosts_fail_before_the_model_is_built(tmp_path: Path) -> None:
    hosts = "".join(f'[[hosts]]\nname = "h{i}"\nleaf = 0\n' for i in range(2049))
    msg = _load_error(tmp_path, GOOD.split("[[hosts]]")[0] + hosts)
    assert msg == f"{tmp_path / 't.toml'}:12: hosts: need 2..2048 hosts, got 2049"  # the first [[hosts]]


def test_the_shipped_topologies_still_load() -> None:
    for f in sorted((ROOT / "deploy" / "topologies").glob("*.toml")):
        topology.load(f)


# ------------------------------------------------------------------------- topology: random documents

_keys = st.sampled_from(["topology", "planes", "leaves", "spines", "link", "rate", "delay", "mtu", "buffer",
                         "addressing", "usid_block", "hosts", "name", "leaf", "link_override", "a", "b",
                         "x"])
_scalars = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70), st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["100mbit", "1e12", "nan", "fcbb::/32", "fd00::/48", "h0", "p0l0", "p0s0", "128KiB",
                     "9" * 400, "", "-1"]),
    st.text(string.printable, max_size=12),
)
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                         st.dictionaries(_keys, inner, max_size=5)),
                       max_leaves=12)
_docs = st.dictionaries(_keys, _values, max_size=6)


def _toml(v: Any) -> str:
    """A value as TOML inline syntax (tomllib reads; nothing in the standard library writes)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"


def _check_only_config_errors(tmp_path: Path, data: bytes) -> None:
    f = tmp_path / "fuzz.toml"
    f.write_bytes(data)
    try:
        topology.load(f)
    except ConfigError as e:
        assert str(e).startswith(str(f)), str(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=_docs)
def test_random_toml_documents_raise_only_file_naming_config_errors(tmp_path: Path, doc: dict[str, Any]
                                                                    ) -> None:
    text = "".join(f"{k} = {_toml(v)}\n" for k, v in doc.items())
    _check_only_config_errors(tmp_path, text.encode())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.binary(max_size=200),
                      st.builds(lambda i, b: GOOD.encode()[:i] + b + GOOD.encode()[i:],
                                st.integers(0, len(GOOD)), st.binary(min_size=1, max_size=8))))
def test_random_bytes_raise_only_file_naming_config_errors(tmp_path: Path, data: bytes) -> None:
    _check_only_config_errors(tmp_path, data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.sampled_from(["planes", "leaves", "spines", "rate", "delay", "mtu", "buffer", "name", "leaf"]),
       value=_scalars)
def test_any_value_of_a_known_key_raises_only_config_errors(tmp_path: Path, key: str, value: Any) -> None:
    lines = GOOD.splitlines(keepends=True)
    i = next(n for n, text in enumerate(lines) if text.startswith(f"{key} ="))
    lines[i] = f"{key} = {_toml(value)}\n"
    _check_only_config_errors(tmp_path, "".join(lines).encode())


# ------------------------------------------------------------------------------------ mrcctl sim


def _sim_error(capsys: pytest.CaptureFixture[str], args: list[str]) -> str:
    rc = main(["sim", *args, "-j"])
    out, err = capsys.readouterr()
    assert rc == 2 and "Traceback" not in err, err
    return str(json.loads(out)["error"])


@pytest.mark.parametrize(("args", "needle"), [
    (["--rate", "nan"], "Invalid value for '--rate': must be a finite number, got nan"),
    (["--rate", "inf"], "Invalid value for '--rate': must be a finite number, got inf"),
    (["--rate", "1e12"], "'--rate': must be in [1e-06, 1600] Gb/s"),
    (["--rate", "-1"], "'--rate': must be in [1e-06, 1600] Gb/s"),
    (["--seed", "-1"], "Invalid value for '--seed': must be 0..4294967295, got -1"),
    (["--seed", str(2**32)], "'--seed': must be 0..4294967295"),
    (["--size", "2G"], "'--size': must be 1..1073741824 bytes"),
    (["--size", "9" * 400], "out of range"),
    (["--planes", "65"], "'--planes': must be 1..64"),
    (["--evs", "99999"], "'--evs': must be 1..16384"),
    (["--mpr", "9"], "'--mpr': must be 1..8"),
    (["--trim", "nan"], "'--trim': must be a finite number"),
    (["--loss", "-0.1"], "'--loss': must be in [0, 1)"),
    (["--ecn-prob", "0"], "'--ecn-prob': must be in (0, 1]"),
    (["--ecn-plane", "-1"], "'--ecn-plane': must be 0..63"),
    (["--delay", "2s"], "'--delay': must be 0..1000000000 ns"),
    (["--jitter", "9" * 400], "'--jitter': bad time"),
    (["--settle", "11s"], "'--settle': must be 0..10000000000 ns"),
    ([arg for i in range(65) for arg in ("--blackhole-plane", f"0@{i + 1}us")], "must be 0..64, got 65"),
])
def test_loopback_options_are_ranged(capsys: pytest.CaptureFixture[str], args: list[str],
                                     needle: str) -> None:
    assert needle in _sim_error(capsys, ["loopback", *args])


SMALL = ["--planes", "2", "--spines", "2"]


@pytest.mark.parametrize(("args", "needle"), [
    (["permutation", "--rate", "1e12"], "'--rate': must be in [1e-06, 1600] Gb/s, got 1e+12 Gb/s"),
    (["permutation", "--rate", "nan"], "'--rate': must be a finite number"),
    (["permutation", "--seed", "-1"], "'--seed': must be 0..4294967295"),
    (["permutation", "--planes", "17"], "'--planes': must be 1..16"),
    (["permutation", "--spines", "0"], "'--spines': must be 1..256"),
    (["permutation", "--hosts-per-leaf", "0"], "'--hosts-per-leaf': must be 1..2048"),
    (["permutation", "--buffer", "2G"], "'--buffer': must be 1..1073741824 bytes"),
    (["permutation", "--buffer", "1K"], "cannot hold one"),
    (["permutation", "--ecn", "2G"], "'--ecn': must be 1..1073741824 bytes"),
    (["permutation", "--trim-at", "0"], "'--trim-at'"),
    (["permutation", "--timeout", "25"], "'--timeout': must be 0..24"),
    (["permutation", "--jobs", "0"], "'--jobs': must be 1..256"),
    (["permutation", "--duration", "11s"], "'--duration': must be 1..10000000000 ns"),
    (["permutation", "--duration", "0"], "'--duration': must be 1..10000000000 ns"),
    (["permutation", "--variants", "mrc,mrc"], "each at most once"),
    # the allocation storm: all hosts at the top rate for 10 s queue 2^38 bytes of WRITEs and more
    (["permutation", "--hosts", "2048", "--planes", "16", "--spines", "16", "--rate", "1600",
      "--duration", "10s"], "at most 256 GiB of simulated traffic per run"),
    (["degraded", "--factor", "nan"], "'--factor': must be a finite number"),
    (["degraded", "--factor", "1.5"], "'--factor': must be in (0, 1]"),
    (["failover", *SMALL, "--duration", "200us", "--fail-at", "5us"], "fail-at must leave two bins"),
    (["failover", *SMALL, "--duration", "200us", "--fail-at", "0"], "fail-at must lie inside the run"),
    (["failover", *SMALL, "--duration", "200us", "--fail-at", "100us", "--heal-at", "105us"],
     "must cover at least one whole bin"),
    (["failover", *SMALL, "--duration", "1s", "--bin", "1us"], "at most 100000 per run"),
    (["failover", *SMALL, "--flap", "1ns"], "at most 10000 link changes per run"),
    (["failover", "--reconverge", "2s"], "'--reconverge': must be 0..1000000000 ns"),
    (["incast", "--senders", "0"], "'--senders': must be 1..255"),
    (["incast", "--senders", "200", "--size", "1G"], "200 senders x 1073741824 bytes: at most 1 GiB"),
    (["incast", "--time-limit", "1000s"], "'--time-limit': must be 1..10000000000 ns"),
    (["allreduce", "--bits", "nan"], "'--bits': must be a finite number"),
    (["allreduce", "--bits", "9"], "'--bits': must be in (0, 8]"),
    (["allreduce", "--ranks", "1"], "'--ranks': must be 2..2048"),
    (["allreduce", "--ranks", "8", "--size", "512M"], "8 ranks x 536870912 bytes: at most 1 GiB"),
])
def test_sim_run_options_are_ranged(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    assert needle in _sim_error(capsys, ["run", *args])


def test_failover_with_the_failure_in_the_first_bins_used_to_crash_the_table(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Text output (the table formatted None before): now a usage error on stderr, exit 2."""
    rc = main(["sim", "run", "failover", *SMALL, "--duration", "200us", "--fail-at", "5us"])
    _, err = capsys.readouterr()
    assert rc == 2 and "fail-at must leave two bins (2 x --bin = 20000 ns)" in err and "Traceback" not in err


def test_a_topology_file_out_of_the_simulators_range_names_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    f = tmp_path / "t.toml"
    f.write_text(GOOD.replace('rate = "100mbit"', 'rate = "2tbit"'))
    assert _sim_error(capsys, ["run", "permutation", "--topology", str(f)]).startswith(
        f"{f}:7: link.rate: must be 1kbit..1600gbit")


# -------------------------------------------------------------------- mrc.sim as a library


def test_loopback_configs_refuse_out_of_range_fields() -> None:
    from mrc.sim.loopback import Blackhole, FabricConfig, LoopbackConfig, build

    for cfg, needle in [
        (LoopbackConfig(fabric=FabricConfig(rate_gbps=math.nan)), "rate_gbps must be a finite number"),
        (LoopbackConfig(fabric=FabricConfig(rate_gbps=1e12)), "rate_gbps must be in"),
        (LoopbackConfig(seed=-1), "seed must be 0..4294967295"),
        (LoopbackConfig(size=1 << 40), "size must be 1..1073741824 bytes"),
        (LoopbackConfig(evs=2), "evs must be 4..16384"),
        (LoopbackConfig(cc="cubic"), "cc must be nscc or null"),
        (LoopbackConfig(fabric=FabricConfig(loss=1.0)), "loss must be in [0, 1)"),
        (LoopbackConfig(fabric=FabricConfig(ecn={9: 0.5})), "ecn plane must be 0..3"),
        (LoopbackConfig(fabric=FabricConfig(jitter_ns=10**12)), "jitter_ns must be 0..1000000000 ns"),
        (LoopbackConfig(fabric=FabricConfig(blackholes=[Blackhole(0, 5, 5)])), "end_ns must be 6.."),
        (LoopbackConfig(fabric=FabricConfig(planes=0)), "planes must be 1..64"),
    ]:
        with pytest.raises(ValueError, match=re_escape(needle)):
            build(cfg)


def test_experiment_specs_refuse_out_of_range_fields() -> None:
    from mrc.sim import experiments as exps

    with pytest.raises(ValueError, match=re_escape("rate_gbps must be in [1e-06, 1600] Gb/s, got 1e+12")):
        exps.FabricSpec(rate_gbps=1e12)
    with pytest.raises(ValueError, match="rate_gbps must be a finite number"):
        exps.FabricSpec(rate_gbps=math.inf)
    with pytest.raises(ValueError, match=re_escape("seed must be 0..4294967295")):
        exps.RunSpec(seed=-1)
    with pytest.raises(ValueError, match=re_escape("ecn_bytes must be 1..1024 bytes")):
        exps.FabricSpec(buffer_bytes=1024, ecn_bytes=4096, trim_bytes=512)
    spec = exps.RunSpec(fabric=exps.FabricSpec(planes=2, leaves=2, spines=2, hosts_per_leaf=2))
    spec.fabric.rate_gbps = 1e12  # mutated after construction: the experiment checks again
    with pytest.raises(ValueError, match="rate_gbps must be in"):
        exps.permutation(spec, 10_000, 1_000)
    spec.fabric.rate_gbps = 100.0
    with pytest.raises(ValueError, match=r"fail_ns \(5000\) must lie inside the run and leave two bins"):
        exps.failover(spec, 200_000, 5_000)
    with pytest.raises(ValueError, match=re_escape("duration_ns must be 1..10000000000 ns")):
        exps.incast(spec, 1, 4096, 10**15)
    with pytest.raises(ValueError, match="at most 256 GiB"):
        exps.permutation(exps.RunSpec(fabric=exps.FabricSpec(planes=16, leaves=128, spines=16,
                                                             hosts_per_leaf=16, rate_gbps=1600)),
                         10_000_000_000, 0)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)
