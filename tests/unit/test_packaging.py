"""The wheel carries the mrc.* namespace mapped from dataplane/, ctl/ and bpf/, and the eBPF sources are
found at run time from an installed wheel, not only from the editable checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
         str(ROOT)],
        capture_output=True, text=True, timeout=300, env={"TMPDIR": str(build), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheels = list(out.glob("mrc-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_maps_folders_into_one_namespace(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "mrc/__init__.py",
        "mrc/wire/packet.py",
        "mrc/dataplane/sources.py",
        "mrc/ctl/cli.py",
        "mrc/_bpf/include/mrc_abi.h",
        "mrc/py.typed",
    ):
        assert expected in names, f"{expected} missing from {wheel.name}"
    # no generic top-level packages leak out of the mapping
    assert not any(n.startswith(("dataplane/", "ctl/", "bpf/")) for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "mrcctl = mrc.ctl.cli:main" in text


def test_bpf_sources_found_from_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)
    # -S: no site-packages, so the editable finder of the checkout cannot answer instead of the wheel.
    code = "from mrc.dataplane import bpf_source; print(bpf_source('include/mrc_abi.h'))"
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path,
        env={"PYTHONPATH": str(target)}, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    found = Path(proc.stdout.strip())
    assert found == target / "mrc" / "_bpf" / "include" / "mrc_abi.h"
    assert "MRC_UDP_PORT 4791" in found.read_text()


def test_example_topologies_found_from_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    """`mrcctl testbed up` without FILE reads default.toml from `default_topology_dir()`, and the fluid
    simulator's --cluster examples live under it: from a wheel the lookup pointed into site-packages'
    parent, where no deploy/ exists (a pip user's `testbed up` failed with "cannot read")."""
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = sorted(p.relative_to(ROOT / "deploy" / "topologies").as_posix()
                     for p in (ROOT / "deploy" / "topologies").rglob("*.toml"))
    assert shipped and all(f"mrc/_topologies/{n}" in names for n in shipped), shipped
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)
    code = ("from mrc import topology; from mrc.sim.cluster import cluster_dir, load_cluster;"
            " d = topology.default_topology_dir(); t = topology.load(d / 'default.toml');"
            " load_cluster(cluster_dir() / 'cluster-8k.toml'); print(d, len(t.hosts))")
    proc = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path,
        env={"PYTHONPATH": f"{target}:{':'.join(p for p in sys.path if 'site-packages' in p)}"}, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    where, hosts = proc.stdout.split()
    assert Path(where) == target / "mrc" / "_topologies" and int(hosts) > 0


def test_wheel_declares_its_license(wheel: Path) -> None:
    """The metadata said Apache-2.0 while the repository had no LICENSE: the wheel now carries both, in
    the SPDX form (the deprecated `license = {text = ...}` table is gone)."""
    z = zipfile.ZipFile(wheel)
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
    assert "License-Expression: Apache-2.0" in text
    lic = [n for n in z.namelist() if n.endswith("licenses/LICENSE")]
    assert lic and b"Apache License" in z.read(lic[0]) and b"Version 2.0" in z.read(lic[0])
    assert (ROOT / "LICENSE").read_bytes() == z.read(lic[0])


def test_changelog_names_the_released_and_the_current_version() -> None:
    import mrc

    log = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in log and "## [0.1.0]" in log
    v = mrc.__version__
    # a released version has its section; between releases main carries a development version
    assert f"## [{v}]" in log or ".dev" in v, v
    assert v != "0.1.0"  # 200 commits past the 0.1.0 release still called themselves 0.1.0
