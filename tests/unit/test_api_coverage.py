"""docs/api.md cannot drift from the OCP headers or from the code.

The items are every function, every enum member (attribute masks, capabilities, states, modes,
operations: the enums that define behaviour) and every field of the device attribute structs and of
the EV event of `mrc.h` and `mrc_ctl.h` (OCP-Multipath-Reliable-Connection). Their list is vendored in
tests/data/ocp/api_items.txt, extracted by `header_items` below from the headers at the commit named
there: the headers themselves are not vendored, because each carries an NVIDIA proprietary licence
notice (SPDX LicenseRef-NvidiaProprietary) although the repository's LICENSE is BSD-2-Clause, and
identifiers are what the check needs. Where the OCP mirror is on this machine, a test re-extracts the
list from it and compares (nothing is fetched at test time).

docs/api.md has one row per item: status (implemented / partly / not), the Python name, `file:line`
of the implementation (the line must name the Python symbol), the test that covers it (it must
exist), and for anything not implemented the reason.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ITEMS = ROOT / "tests" / "data" / "ocp" / "api_items.txt"
API_MD = ROOT / "docs" / "api.md"
MIRROR = Path("/work/.mirror/opencomputeproject+OCP-Multipath-Reliable-Connection/repo")
HEADERS = ("mrc.h", "mrc_ctl.h")
#: structs whose fields are items: they have no attribute mask, so their fields are the attributes
FIELD_STRUCTS = ("mrc_device_attr", "mrc_ctl_device_attr", "mrc_ctl_ev_event")
STATUSES = ("implemented", "partly", "not")
TARGET = 0.85


def _strip(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def _fields(body: str, prefix: str) -> list[str]:
    """Leaf field names of a struct body, nested anonymous structs as `outer.inner`."""
    out: list[str] = []
    i = 0
    while i < len(body):
        m = re.compile(r"\s*struct\s*\{").match(body, i)
        if m:
            depth, j = 1, m.end()
            while depth:
                depth += {"{": 1, "}": -1}.get(body[j], 0)
                j += 1
            name = re.compile(r"\s*(\w+)\s*;").match(body, j)
            assert name is not None, body[j : j + 40]
            out += _fields(body[m.end() : j - 1], f"{prefix}{name.group(1)}.")
            i = name.end()
            continue
        semi = body.find(";", i)
        if semi < 0:
            break
        decl = body[i:semi].strip()
        if decl:
            name_m = re.search(r"(\w+)\s*(\[[^\]]*\])?\s*$", decl)
            assert name_m is not None, decl
            out.append(prefix + name_m.group(1))
        i = semi + 1
    return out


def header_items(text: str) -> list[str]:
    """Functions, enum members and the FIELD_STRUCTS' fields of one header, in header order."""
    src = _strip(text)
    found: list[tuple[int, str]] = []
    for m in re.finditer(r"\benum\s+\w+\s*\{(.*?)\}", src, flags=re.S):
        for member in m.group(1).split(","):
            name = member.split("=")[0].strip()
            if name:
                found.append((m.start(), name))
    for m in re.finditer(r"^[a-z][\w \t\*]*?\b(mrc_\w+)\s*\(", src, flags=re.M):
        found.append((m.start(), m.group(1)))
    for m in re.finditer(r"\bstruct\s+(\w+)\s*\{", src):
        if m.group(1) not in FIELD_STRUCTS:
            continue
        depth, j = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            j += 1
        found += [(m.start(), f) for f in _fields(src[m.end() : j - 1], m.group(1) + ".")]
    return [name for _, name in sorted(found, key=lambda x: x[0])]


def vendored_items() -> tuple[str, list[tuple[str, str]]]:
    """(source commit, [(header, item)]) from tests/data/ocp/api_items.txt."""
    commit = ""
    items: list[tuple[str, str]] = []
    for line in ITEMS.read_text().splitlines():
        if line.startswith("# commit "):
            commit = line.split()[2]
        elif line and not line.startswith("#"):
            header, item = line.split()
            items.append((header, item))
    return commit, items


def api_rows() -> dict[str, dict[str, str]]:
    """The coverage table of docs/api.md: item -> {status, python, where, test, reason}."""
    rows: dict[str, dict[str, str]] = {}
    for line in API_MD.read_text().splitlines():
        if not line.startswith("| `") or line.startswith("| `item"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 6, line
        item, status, python, where, test, reason = (c.strip("`") for c in cells)
        assert item not in rows, f"two rows for {item}"
        rows[item] = {"status": status, "python": python, "where": where, "test": test, "reason": reason}
    return rows


def test_vendored_list_is_the_headers_items() -> None:
    """The vendored list is what the parser extracts from the headers at the recorded commit."""
    commit, items = vendored_items()
    if not (MIRROR / "HEAD").exists() and not (MIRROR / ".git").exists():
        pytest.skip("OCP mirror not on this machine (the vendored list is used as is)")
    got: list[tuple[str, str]] = []
    for h in HEADERS:
        text = subprocess.run(
            ["git", "-C", str(MIRROR), "show", f"{commit}:{h}"], capture_output=True, text=True, check=True
        ).stdout
        got += [(h, i) for i in header_items(text)]
    assert got == items


def test_parser_reads_enums_functions_and_nested_fields() -> None:
    text = """
    /* a comment with enum fake { NOT_AN_ITEM } */
    enum e { A_ONE = 1 << 0, /* x */ A_TWO, };
    struct mrc_device_attr { uint32_t v; struct { uint16_t a; uint16_t b; } sub; uint32_t cap; };
    int mrc_do(struct mrc_context *c,
               int x);
    #if X
    void mrc_other(void);
    #endif
    """
    assert header_items(textwrap.dedent(text)) == [
        "A_ONE", "A_TWO", "mrc_device_attr.v", "mrc_device_attr.sub.a", "mrc_device_attr.sub.b",
        "mrc_device_attr.cap", "mrc_do", "mrc_other",
    ]


def test_every_item_has_one_row_and_no_row_is_extra() -> None:
    _, items = vendored_items()
    names = [i for _, i in items]
    assert len(names) == len(set(names))
    rows = api_rows()
    missing = [n for n in names if n not in rows]
    extra = [r for r in rows if r not in names]
    assert not missing, f"items without a row in docs/api.md: {missing}"
    assert not extra, f"rows of docs/api.md that are no header item: {extra}"


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_rows_point_at_real_code_and_real_tests() -> None:
    bad: list[str] = []
    for item, r in api_rows().items():
        if r["status"] not in STATUSES:
            bad.append(f"{item}: status {r['status']!r}")
            continue
        if r["status"] != "implemented" and not r["reason"]:
            bad.append(f"{item}: {r['status']} without a reason")
        if r["status"] == "not" and r["where"] in ("", "-"):
            continue
        m = re.fullmatch(r"([\w/.]+\.py):(\d+)", r["where"])
        if m is None:
            bad.append(f"{item}: where {r['where']!r} is not file:line")
            continue
        path, lineno = ROOT / m.group(1), int(m.group(2))
        if not path.exists():
            bad.append(f"{item}: {m.group(1)} does not exist")
            continue
        lines = path.read_text().splitlines()
        symbol = r["python"].split("(")[0].split(".")[-1]
        if not symbol or lineno > len(lines) or symbol not in lines[lineno - 1]:
            bad.append(f"{item}: {r['where']} does not name {symbol!r}")
        t = re.fullmatch(r"(tests/[\w/]+\.py)::(\w+)", r["test"])
        if t is None:
            bad.append(f"{item}: test {r['test']!r} is not tests/...py::name")
            continue
        tpath = ROOT / t.group(1)
        if not tpath.exists() or t.group(2) not in _defined_tests(tpath):
            bad.append(f"{item}: test {r['test']} does not exist")
    assert not bad, "\n".join(bad)


def coverage() -> tuple[int, int, int, int]:
    """(implemented, partly, not, total) over the header items."""
    rows = api_rows()
    st = [rows[i]["status"] for _, i in vendored_items()[1]]
    return st.count("implemented"), st.count("partly"), st.count("not"), len(st)


def test_coverage_target_and_the_stated_figure() -> None:
    """At least 85 % of the items implemented, and docs/api.md states the real figures."""
    impl, part, no, total = coverage()
    stated = f"{impl} of {total} items implemented ({100 * impl / total:.1f} %), {part} partly, {no} not"
    assert stated in API_MD.read_text(), f"docs/api.md must state: {stated}"
    assert impl / total >= TARGET, stated


if __name__ == "__main__":  # regenerate tests/data/ocp/api_items.txt from the mirror
    head = subprocess.run(["git", "-C", str(MIRROR), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    lines = [
        "# API items of the OCP MRC headers (functions, enum members, device-attribute and EV-event fields)",
        "# source: github.com/opencomputeproject/OCP-Multipath-Reliable-Connection",
        f"# commit {head}",
        "# extracted by tests/unit/test_api_coverage.py (header_items); names only, not the header text",
    ]
    for h in HEADERS:
        text = subprocess.run(["git", "-C", str(MIRROR), "show", f"HEAD:{h}"], capture_output=True, text=True,
                              check=True).stdout
        lines += [f"{h} {i}" for i in header_items(text)]
    ITEMS.write_text("\n".join(lines) + "\n")
    sys.stdout.write(f"{len(lines) - 4} items\n")
