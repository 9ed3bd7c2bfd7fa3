"""deploy/systemd/mrcd.service and deploy/install.sh (docs/deploy.md, "systemd").

The unit: `systemd-analyze verify` clean once ExecStart= names this environment's mrcd (the shipped
file names /usr/local/bin/mrcd, pip's place for a system-wide install), its `systemd-analyze security`
exposure no higher than measured, and the settings the issue asked for (readiness, preserved runtime
directory, no detach before a restart). install.sh: staged with --root into a temporary folder, every
file lands there with the right content, nothing outside it; --dry-run changes nothing; --uninstall."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "mrcd.service"
INSTALL = DEPLOY / "install.sh"
SHIPPED_MRCD = "/usr/local/bin/mrcd"
SHIPPED_MRCCTL = "/usr/local/bin/mrcctl"
# `systemd-analyze security --offline=true` of the unit on Debian 12's systemd 252 (the issue's target
# is 4.0: what stays exposed is what BPF and netlink need; the unit's comments say which and why)
MEASURED_EXPOSURE = 2.1
TARGET_EXPOSURE = 4.0

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None,
                                   reason="systemd-analyze not installed (Debian package systemd)")


def _bin(name: str) -> str:
    """This environment's console script: next to the interpreter (the venv), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed in this environment (pip install -e .)")
    return found


def _word(path: str) -> str:
    """`path` as install.sh writes it into a command line of the unit: double-quoted when it has a blank."""
    return f'"{path}"' if " " in path else path


def _settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def _local_unit(tmp_path: Path) -> Path:
    """The unit with this environment's mrcd and mrcctl, as mrcd.service in tmp_path."""
    text = UNIT.read_text()
    assert f"ExecStart={SHIPPED_MRCD} " in text
    text = text.replace(SHIPPED_MRCD + " ", _word(_bin("mrcd")) + " ")
    text = text.replace(SHIPPED_MRCCTL + " ", _word(_bin("mrcctl")) + " ")
    out = tmp_path / "mrcd.service"
    out.write_text(text)
    return out


def _systemd_version() -> int:
    assert ANALYZE is not None
    r = subprocess.run([ANALYZE, "--version"], capture_output=True, text=True, timeout=30)
    m = re.match(r"systemd (\d+)", r.stdout)
    return int(m.group(1)) if m else 0


def _verify(unit: Path) -> None:
    assert ANALYZE is not None
    r = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    about_it = [ln for ln in r.stderr.splitlines() if unit.name in ln or str(unit) in ln]
    assert r.returncode == 0 and not about_it, f"rc {r.returncode}\n{r.stderr}"


# ------------------------------------------------------------------------------------------- the unit


def test_unit_settings() -> None:
    s = _settings(UNIT.read_text())
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    assert s["ExecStart"] == [f"{SHIPPED_MRCD} --config /etc/mrc/mrcd.toml"]
    assert s["RuntimeDirectory"] == ["mrc"] and s["RuntimeDirectoryPreserve"] == ["yes"]
    assert s["Restart"] == ["on-failure"]
    assert "After" in s and "network-online.target" in s["After"][0]
    assert "network-online.target" in s["Wants"][0]
    caps = s["CapabilityBoundingSet"][0].split()
    assert {"CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"} <= set(caps)
    # no detach before a restart: the one cleanup left runs only after a stop that had to SIGKILL mrcd
    for cmd in s.get("ExecStopPost", []):
        assert "$$SERVICE_RESULT" in cmd and "= timeout" in cmd, cmd
    assert "ExecStop" not in s
    # a watchdog only with a ping to answer it: mrcd's loop is watched through sdnotify.start_watchdog
    assert int(s["WatchdogSec"][0]) > 0


@needs_analyze
def test_unit_verifies_clean(tmp_path: Path) -> None:
    _verify(_local_unit(tmp_path))


@needs_analyze
def test_unit_security_exposure(tmp_path: Path) -> None:
    assert ANALYZE is not None
    unit = _local_unit(tmp_path)
    r = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager", str(unit)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0 and "offline" in r.stderr:
        pytest.skip(f"this systemd-analyze has no --offline (systemd >= 250): {r.stderr.strip()}")
    m = re.search(r"Overall exposure level for mrcd\.service: (\d+\.\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    exposure = float(m.group(1))
    # systemd's scoring changes between versions: the measured figure holds on 252, the target on all
    limit = MEASURED_EXPOSURE if _systemd_version() == 252 else TARGET_EXPOSURE
    assert exposure <= limit, r.stdout


# ------------------------------------------------------------------------------------------ install.sh


def _install(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "MRCD": _bin("mrcd"), "MRCCTL": _bin("mrcctl"), **(env or {})}
    return subprocess.run(["bash", str(INSTALL), *args], capture_output=True, text=True, timeout=120, env=e)


def _destinations() -> list[str]:
    """The files install.sh would write on this host (its --dry-run, no --root)."""
    r = _install("--dry-run")
    assert r.returncode == 0, r.stderr
    dests = re.findall(r"^would write: (\S+) ", r.stdout, flags=re.M)
    if "/etc/mrc/mrcd.toml" not in dests:  # this host has one already: kept, but a fresh root gets it
        assert "kept /etc/mrc/mrcd.toml" in r.stdout, r.stdout
        dests.append("/etc/mrc/mrcd.toml")
    grafana = re.search(r"^would run: sh .+/grafana/install\.sh", r.stdout, flags=re.M)
    assert dests and grafana, r.stdout
    return [*dests, "/etc/grafana/provisioning/datasources/mrc.yaml",
            "/etc/grafana/provisioning/dashboards/mrc.yaml",
            "/var/lib/grafana/dashboards/mrc/mrc-overview.json"]


def _snapshot(paths: list[str]) -> dict[str, tuple[int, int] | None]:
    out: dict[str, tuple[int, int] | None] = {}
    for p in paths:
        for q in (Path(p), *Path(p).parents):
            try:
                st = q.stat()
                out[str(q)] = (st.st_mtime_ns, st.st_size) if q == Path(p) else (0, 0)
            except FileNotFoundError:
                out[str(q)] = None
    return out


def test_install_dry_run_changes_nothing() -> None:
    dests = _destinations()
    assert "/etc/systemd/system/mrcd.service" in dests and "/etc/mrc/mrcd.toml" in dests
    before = _snapshot(dests)
    r = _install("--dry-run")
    assert r.returncode == 0, r.stderr
    # daemon-reload only where PID 1 is systemd (and then only said, not done)
    assert ("would run: systemctl daemon-reload" in r.stdout) == os.path.isdir("/run/systemd/system")
    assert _snapshot(dests) == before


def test_install_into_a_root(tmp_path: Path) -> None:
    dests = _destinations()
    before = _snapshot(dests)
    root = tmp_path / "root"
    r = _install("--root", str(root), "--prometheus-url", "http://prom.example:9090")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "systemctl" not in r.stdout.replace("systemctl restart grafana-server", ""), r.stdout
    # everything it wrote is under root, and exactly what the dry run announced
    written = sorted("/" + str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert written == sorted(dests), (written, dests)
    assert _snapshot(dests) == before, "install.sh --root wrote outside its root"

    unit = (root / "etc/systemd/system/mrcd.service").read_text()
    s = _settings(unit)
    assert s["ExecStart"] == [f"{_word(_bin('mrcd'))} --config /etc/mrc/mrcd.toml"]
    assert SHIPPED_MRCD not in unit and SHIPPED_MRCCTL not in unit
    assert all(f"exec {_word(_bin('mrcctl'))} prog detach --all" in c for c in s["ExecStopPost"])
    # the rest of the unit as shipped
    shipped = unit.replace(_word(_bin("mrcd")) + " ", SHIPPED_MRCD + " ")
    shipped = shipped.replace(_word(_bin("mrcctl")) + " ", SHIPPED_MRCCTL + " ")
    assert shipped.replace("ProtectHome=read-only", "ProtectHome=yes") == UNIT.read_text()
    assert (root / "etc/mrc/mrcd.toml").read_bytes() == (DEPLOY / "mrcd.example.toml").read_bytes()
    targets = (root / "etc/prometheus/mrc/mrcd-targets.yml").read_text()
    assert re.search(r'^- targets: \["127\.0\.0\.1:9470"\]$', targets, flags=re.M), targets
    assert (root / "etc/prometheus/mrc/mrc.rules.yml").read_bytes() == \
        (DEPLOY / "prometheus/mrc.rules.yml").read_bytes()
    provider = (root / "etc/grafana/provisioning/dashboards/mrc.yaml").read_text()
    assert re.search(r"^\s+path: /var/lib/grafana/dashboards/mrc$", provider, flags=re.M), provider
    source = (root / "etc/grafana/provisioning/datasources/mrc.yaml").read_text()
    assert re.search(r"^\s+url: http://prom\.example:9090$", source, flags=re.M)
    assert (root / "var/lib/grafana/dashboards/mrc/mrc-overview.json").read_bytes() == \
        (DEPLOY / "grafana/dashboards/mrc-overview.json").read_bytes()
    for f in root.rglob("*"):
        if f.is_file():
            assert f.stat().st_mode & 0o777 == 0o644, f

    # an existing configuration is never replaced
    cfg = root / "etc/mrc/mrcd.toml"
    cfg.write_text("[host]\nname = 'mine'\n\n[metrics]\naddress = '[fd00::1]:9470'\n")
    r = _install("--root", str(root))
    assert r.returncode == 0, r.stderr
    assert "name = 'mine'" in cfg.read_text() and "kept" in r.stdout
    assert '["[fd00::1]:9470"]' in (root / "etc/prometheus/mrc/mrcd-targets.yml").read_text()

    if ANALYZE is not None:  # the installed unit, as systemd would read it
        _verify(root / "etc/systemd/system/mrcd.service")

    # --uninstall: everything but the configuration; --purge: that too
    r = _install("--root", str(root), "--uninstall")
    assert r.returncode == 0, r.stderr
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == ["etc/mrc/mrcd.toml"]
    r = _install("--root", str(root), "--uninstall", "--purge")
    assert r.returncode == 0, r.stderr
    assert not any(p.is_file() for p in root.rglob("*"))
    assert _snapshot(dests) == before


def test_install_refuses_what_systemd_cannot_run(tmp_path: Path) -> None:
    for bad, why in (("relative/mrcd", "absolute"), ("/opt/my$mrc/bin/mrcd", "one of $"),
                     (str(tmp_path / "missing"), "not an executable")):
        r = _install("--root", str(tmp_path / "root"), env={"MRCD": bad})
        assert r.returncode != 0 and why in r.stderr, (bad, r.stderr)
    r = _install("--root", "relative")
    assert r.returncode != 0 and "absolute" in r.stderr
    r = _install("--bogus")
    assert r.returncode == 2 and "unknown argument" in r.stderr
    assert not (tmp_path / "root").exists()


def _staged(tmp_path: Path, folder: str) -> tuple[str, str]:
    """This environment's mrcd and mrcctl, linked into tmp_path/FOLDER/bin: (mrcd, mrcctl)."""
    d = tmp_path / folder / "bin"
    d.mkdir(parents=True)
    for name in ("mrcd", "mrcctl"):
        (d / name).symlink_to(_bin(name))
    return str(d / "mrcd"), str(d / "mrcctl")


def test_install_writes_a_path_with_blanks_quoted_and_systemd_reads_it_as_one_word(tmp_path: Path) -> None:
    mrcd, mrcctl = _staged(tmp_path, "opt with blanks")
    root = tmp_path / "root"
    r = _install("--root", str(root), env={"MRCD": mrcd, "MRCCTL": mrcctl})
    assert r.returncode == 0, r.stdout + r.stderr
    unit = root / "etc/systemd/system/mrcd.service"
    s = _settings(unit.read_text())
    assert s["ExecStart"] == [f'"{mrcd}" --config /etc/mrc/mrcd.toml']
    assert all(f'exec "{mrcctl}" prog detach --all' in c for c in s["ExecStopPost"])
    if ANALYZE is not None:  # systemd's own parser: one executable, found, no complaint about the line
        _verify(unit)


@pytest.mark.parametrize("folder", ["a$HOME", "50%", "it's", 'say"', "back\\slash", "tab\there", "a|b", "a&b",
                                    "a`b`"])
def test_install_refuses_a_path_systemd_would_read_otherwise(tmp_path: Path, folder: str) -> None:
    mrcd, mrcctl = _staged(tmp_path, folder)
    r = _install("--dry-run", env={"MRCD": mrcd, "MRCCTL": mrcctl})
    assert r.returncode != 0
    assert f"mrcd '{mrcd}' has a quote, backslash, tab or newline" in r.stderr, r.stderr
