"""The deploy/ files that use mrcd's exporter (no root, no kernel, no running Prometheus or Grafana): every
metric and label value the Grafana dashboard and the alert rules reference is one the exporter emits; the
dashboard is structurally sound (ids, layout, data source, one unit per panel) and its install script
puts the provisioning where it says; every alert has a description and a runbook section and is tested
by `promtool test rules` (firing and not firing); Prometheus' own checker accepts the scrape config and the
rules. The exporter itself: test_metrics_exporter.py; the systemd unit and deploy/install.sh:
test_systemd_unit.py.

The YAML files are read with regular expressions (PyYAML is no dependency of mrc): their layout is the
one written here, and promtool parses them for real."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mrc.ctl.metrics import EGRESS_DROP_REASONS, INGRESS_DROP_REASONS, METRICS
from mrc.transport import EvState, QpState
from mrc.transport.drops import EngineDrop
from mrc.wire.errors import REASONS as WIRE_REASONS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROM = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
RULES = PROM / "mrc.rules.yml"
RULE_TESTS = PROM / "mrc.rules.test.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
DASHBOARD = GRAFANA / "dashboards" / "mrc-overview.json"
promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                              reason="promtool (Debian prometheus) not installed")


def _referenced(text: str) -> set[str]:
    names = set(re.findall(r"\b(mrc_[a-z0-9_]+)", text))
    return {re.sub(r"_(sum|count|bucket)$", "", n) for n in names}


def _dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def _exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p["targets"]]


def _alerts() -> dict[str, str]:
    """alert name -> its block of mrc.rules.yml."""
    blocks = re.split(r"\n(?=      - alert: )", RULES.read_text())
    out = {}
    for b in blocks[1:]:
        m = re.match(r"      - alert: (\w+)\n", b)
        assert m, b[:80]
        out[m.group(1)] = b
    return out


def _engine_drop_reasons() -> set[str]:
    """Every reason the engine can count: the closed `EngineDrop` set, which every `drop(...)` call of the
    engine must use (a string literal there would be a reason outside the set)."""
    src = " ".join(p.read_text() for p in (ROOT / "mrc" / "transport").glob("*.py"))
    calls = re.findall(r"\b(?:drop|_unmatched)\(([^()]*)\)", src)
    literal = [c for c in calls if re.search(r"""["'][a-z_]+["']""", c)]
    assert not literal, f"drop reasons outside EngineDrop: {literal}"
    reasons = {r.value for r in EngineDrop}
    assert set(WIRE_REASONS) <= reasons  # what `parse` rejects is counted under its own name
    return reasons


#: (metric, label) -> every value the exporter can give it (the closed sets the rules and panels may name)
LABEL_VALUES: dict[tuple[str, str], set[str]] = {
    ("mrc_evs", "state"): {s.name.lower() for s in EvState},
    ("mrc_qps", "state"): {s.name.lower() for s in QpState},
    ("mrc_ingress_drops_total", "reason"): {r.label for r in INGRESS_DROP_REASONS},
    ("mrc_egress_drops_total", "reason"): {r.label for r in EGRESS_DROP_REASONS},
    ("mrc_engine_drops_total", "reason"): _engine_drop_reasons(),
}


def _matchers(expr: str) -> list[tuple[str, str, str, str]]:
    """(metric, label, operator, value) of every label matcher in a PromQL expression."""
    out = []
    for metric, body in re.findall(r"\b(mrc_[a-z0-9_]+)\{([^}]*)\}", expr):
        for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', body):
            out.append((metric, label, op, value))
    return out


def test_dashboard_and_rules_reference_only_exported_metrics_and_label_values() -> None:
    rules = RULES.read_text()
    refs = _referenced(" ".join(_exprs())) | _referenced(rules)
    assert refs, "no metric referenced"
    missing = refs - set(METRICS)
    assert not missing, f"referenced but not exported: {sorted(missing)}"
    # every value a matcher names (each alternative of a regex) is one the exporter emits: no dead filters
    # (the old `reason!~"buffer"` named a reason no host program emits)
    exprs = _exprs() + re.findall(r"expr: (?:\|\n)?((?:.+\n)+?)\s+for:", rules)
    for expr in exprs:
        for metric, label, _op, value in _matchers(expr):
            known = LABEL_VALUES.get((metric, label))
            if known is None or value.startswith("$"):
                continue
            for alt in value.split("|"):
                assert any(re.fullmatch(alt, k) for k in known), (metric, label, alt, sorted(known))


def test_every_alert_has_description_severity_and_a_runbook_section() -> None:
    alerts = _alerts()
    assert {"MrcdDown", "MrcEngineDown", "MrcQpError", "MrcEngineDrops", "MrcDataplaneDrops"} <= set(alerts)
    runbook = RUNBOOK.read_text()
    sections = re.findall(r"^## (\S+)$", runbook, flags=re.M)
    assert sorted(sections) == sorted(alerts), "one runbook section per alert, none stale"
    for name, block in alerts.items():
        assert re.search(r"severity: (critical|warning)", block), name
        assert re.search(r"\n          summary: \S", block), name
        desc = re.search(r"\n          description: >-\n((?:            .+\n)+)", block)
        assert desc and len(desc.group(1).split()) >= 15, f"{name}: no real description"
        url = re.search(r'\n          runbook_url: "([^"]+)"', block)
        assert url and url.group(1) == f"docs/runbook.md#{name.lower()}", name
        section = runbook.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Means:**", "**Check:**", "**Do:**"):
            assert part in section, (name, part)
        assert "mrcctl " in section, f"{name}: the runbook says how to check with mrcctl"
    assert "queue pair" in alerts["MrcQpError"] and 'mrc_qps{state="error"}' in alerts["MrcQpError"]
    assert "mrc_engine_drops_total" in alerts["MrcEngineDrops"]


def test_every_alert_has_a_promtool_case_that_fires_and_one_that_does_not() -> None:
    text = RULE_TESTS.read_text()
    assert re.search(r"^rule_files:\n  - mrc\.rules\.yml$", text, flags=re.M)
    cases = re.findall(r"alertname: (\w+)\n\s+exp_alerts:( \[\]|\n\s+- exp_labels: \{[^}]*\})", text)
    fires = {a for a, exp in cases if exp != " []"}
    quiet = {a for a, exp in cases if exp == " []"}
    assert fires == set(_alerts()) and quiet == set(_alerts()), (fires, quiet)
    # each firing case names the host (or instance) that fires; the test's input has another that does not
    for block in re.split(r"\n  - name: ", text)[1:]:
        name = block.split("\n", 1)[0]
        hosts = set(re.findall(r'(?:host|instance)="([^"]+)"', block))
        assert len(hosts) >= 2 or name == "MrcPlaneDown", (name, hosts)


@promtool
def test_promtool_accepts_config_and_rules_and_their_unit_tests() -> None:
    for args in (["check", "config", str(PROM / "prometheus.yml")],
                 ["check", "rules", str(RULES)],
                 ["test", "rules", str(RULE_TESTS)]):
        r = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


@promtool
def test_promtool_rule_tests_catch_a_broken_alert(tmp_path: Path) -> None:
    """The unit tests are not vacuous: the same tests against rules with one threshold changed fail."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    rules = RULES.read_text()
    broken = rules.replace("mrc_denied_links > 0", "mrc_denied_links > 1")
    assert broken != rules
    (tmp_path / RULES.name).write_text(broken)
    r = subprocess.run(["promtool", "test", "rules", str(tmp_path / RULE_TESTS.name)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "MrcLinkDenied" in r.stdout + r.stderr


def _unit_class(expr: str) -> str:
    """What a panel query measures: bytes, seconds or a count, and "/s" when it is a rate. A histogram's
    quantile is in its unit; a rate of its buckets (observations above a bound per second) is a count
    per second, whatever the histogram measures."""
    names = _referenced(expr)
    if "histogram_quantile" in expr:
        kind = "seconds" if any(n.endswith("_seconds") for n in names) else "count"
        return kind
    per_s = "/s" if "rate(" in expr and "increase(" not in expr else ""
    if re.search(r"mrc_[a-z0-9_]+_bucket\b", expr):
        return "count" + per_s
    if any(n.endswith("_seconds") for n in names):
        return "seconds" + per_s
    if any(n.endswith(("_bytes", "_bytes_total")) for n in names):
        return "bytes" + per_s
    return "count" + per_s


#: the Grafana units each kind of query may be shown in (bytes per second as bits: the query's * 8)
UNITS_FOR = {"seconds": {"s", "ms"}, "bytes": {"bytes"}, "bytes/s": {"bps", "Bps"},
             "count": {"short", "none"}, "count/s": {"pps", "ops", "reqps"}}


def test_dashboard_structure() -> None:
    dash = _dashboard()
    assert dash["uid"] == "mrc-overview" and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["host"]["query"] == "label_values(mrc_up, host)"
    panels = dash["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: dict[tuple[int, int], int] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"panels {cells[(x, y)]} and {p['id']} overlap"
                cells[(x, y)] = p["id"]
        assert p["type"] in {"timeseries", "stat", "gauge", "table"} and p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["expr"].strip()
            for metric in re.findall(r"\b(mrc_[a-z0-9_]+)\{", t["expr"]):
                assert re.search(metric + r'\{[^}]*host=~"\$host"', t["expr"]), (p["title"], metric)
        # one quantity per axis: queries of another kind than the panel's unit need an override each
        assert p["fieldConfig"]["defaults"].get("unit"), p["title"]
        overridden = {o["matcher"]["options"] for o in p["fieldConfig"].get("overrides", [])
                      if o.get("matcher", {}).get("id") == "byFrameRefID"
                      and any(pr.get("id") == "unit" for pr in o.get("properties", []))}
        kinds = {t["refId"]: _unit_class(t["expr"]) for t in p["targets"] if t["refId"] not in overridden}
        assert len(set(kinds.values())) <= 1, f"panel {p['id']} {p['title']!r} mixes {kinds} on one axis"
        # and each query is shown in a unit of its kind (a rate of turns is not a time)
        for t in p["targets"]:
            unit = next((pr["value"] for o in p["fieldConfig"].get("overrides", [])
                         if o.get("matcher", {}).get("id") == "byFrameRefID"
                         and o["matcher"]["options"] == t["refId"]
                         for pr in o.get("properties", []) if pr.get("id") == "unit"),
                        p["fieldConfig"]["defaults"]["unit"])
            kind = _unit_class(t["expr"])
            assert unit in UNITS_FOR[kind], f"panel {p['id']} {t['refId']}: a {kind} query in unit {unit}"
    units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in panels}
    assert units["Congestion window per QP"] == "bytes" and units["Smoothed RTT per QP"] == "s"
    titles = " ".join(p["title"].lower() for p in panels)
    for what in ("plane", "trim", "ecn", "retransmit", "ev states"):
        assert what in titles


def test_grafana_install_script_puts_the_provisioning_in_place(tmp_path: Path) -> None:
    prov, dash = tmp_path / "provisioning", tmp_path / "dashboards" / "mrc"
    r = subprocess.run(["sh", str(GRAFANA / "install.sh"), "--provisioning", str(prov), "--dashboards",
                        str(dash), "--prometheus", "http://prom.example:9090"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (dash / "mrc-overview.json").read_bytes() == DASHBOARD.read_bytes()
    provider = (prov / "dashboards" / "mrc.yaml").read_text()
    assert "type: file" in provider and "apiVersion: 1" in provider
    assert re.search(rf"^\s+path: {re.escape(str(dash))}$", provider, flags=re.M)
    source = (prov / "datasources" / "mrc.yaml").read_text()
    assert re.search(r"^\s+url: http://prom\.example:9090$", source, flags=re.M)
    assert "type: prometheus" in source
    for f in (prov / "dashboards" / "mrc.yaml", prov / "datasources" / "mrc.yaml",
              dash / "mrc-overview.json"):
        assert f.stat().st_mode & 0o777 == 0o644, f
    bad = subprocess.run(["sh", str(GRAFANA / "install.sh"), "--provisioning", str(prov), "--dashboards",
                          "relative/dir"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "absolute" in bad.stderr
