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
    assert msg.startswith(f"{tmp_path / 't.toml'}:1: hosts[1].leaf: leaf 7 does not exist"), msg


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
    assert "hosts: need 2..2048 hosts, got 2049" in msg


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
