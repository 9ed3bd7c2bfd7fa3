"""Emulated real machines for mrcd's configuration-file mode: a pytest helper around
tests/netns/machines.sh (not a test module).

``machines.sh`` builds plain network namespaces with NIC-like ports (eth1..eth4) and, for the Clos, kernel
SRv6 switches configured with iproute2 commands only (no mrc.dataplane.testbed, no topology builder), and
writes each machine's host configuration file (docs/deploy.md). This module brings them up for a test,
parses ``DIR/env`` and always takes them down again::

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with machines("clos") as m:
        a = m["A"]                         # machine mA: a.netns, a.config, a.mrc_address, a.socket ...
        subprocess.run(a.exec("mrcd", "--config", str(a.config)))
        assert m.check().ok                # (before mrcd runs: its XDP program takes check's packets)
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().with_name("machines.sh")
SHAPES = ("b2b", "clos")
KSFT_SKIP = 4  # machines.sh's exit code when this host lacks something
UP_TIMEOUT_S = 120
CHECK_TIMEOUT_S = 300


class MachinesError(RuntimeError):
    """machines.sh failed (its stderr is in the message)."""


@dataclass(frozen=True)
class Machine:
    """One emulated machine: a network namespace whose ports are named like NIC ports."""

    letter: str  # "A"
    label: str  # "mA": the node name in machines.sh (`link DIR mA eth1 down`)
    name: str  # host.name in its configuration file: "ma"
    netns: str  # "mA-1f2e"
    config: Path  # DIR/mA.toml
    mrc_address: ipaddress.IPv6Address  # for mrcd to install (machines.sh does not)
    metrics: str  # "[::1]:9471": inside the machine's namespace
    socket: Path  # the control socket of its mrcd: DIR/mA.sock
    ports: tuple[str, ...]  # plane order: ("eth1", "eth2", ...)
    addresses: tuple[ipaddress.IPv6Interface, ...]  # each port's address, plane order
    gateways: tuple[ipaddress.IPv6Address, ...]  # clos: each plane's leaf; back to back: ()

    def exec(self, *argv: str) -> list[str]:
        """The command line that runs `argv` inside this machine."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass(frozen=True)
class CheckResult:
    """What ``machines.sh check`` printed: one line per probe and the summary."""

    passed: tuple[str, ...]
    failed: tuple[str, ...]
    summary: str
    returncode: int

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.failed and bool(self.passed)


@dataclass(frozen=True)
class Machines:
    shape: str  # "b2b" or "clos"
    suffix: str  # every namespace is <node>-<suffix>
    dir: Path
    machines: dict[str, Machine]  # by letter: "A", "B", ...
    switches: tuple[str, ...]  # the switches' namespaces (clos), e.g. "p0l0-1f2e"

    def __getitem__(self, letter: str) -> Machine:
        return self.machines[letter]

    def __iter__(self) -> Iterator[Machine]:
        return iter(self.machines.values())

    def namespaces(self) -> list[str]:
        return [m.netns for m in self] + list(self.switches)

    def check(self) -> CheckResult:
        """``machines.sh check``: every plane (back to back) or every micro-SID path (clos), both ways."""
        proc = _script("check", str(self.dir), timeout=CHECK_TIMEOUT_S)
        return parse_check(proc.stdout, proc.returncode)

    def link(self, node: str, port: str, how: str) -> None:
        """Fail (``down``) or repair (``up``, which also puts the fabric's routes back) one cable end:
        `node` is a machine's label (``mA``) or a switch (``p0s1``)."""
        _run("link", str(self.dir), node, port, how)


def parse_env(text: str) -> dict[str, str]:
    """DIR/env: ``KEY=VALUE`` lines in shell quoting, ``#`` comments."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        key, sep, value = words[0].partition("=")
        if not sep or len(words) != 1:
            raise MachinesError(f"env: not KEY=VALUE: {line!r}")
        out[key] = value
    return out


def parse_check(stdout: str, returncode: int) -> CheckResult:
    lines = stdout.splitlines()
    summary = next((x for x in reversed(lines) if x.startswith("check: ")), "")
    return CheckResult(tuple(x[5:] for x in lines if x.startswith("PASS ")),
                       tuple(x[5:] for x in lines if x.startswith("FAIL ")), summary, returncode)


def load(directory: Path) -> Machines:
    """The machines that ``machines.sh up`` left in `directory` (from its env file)."""
    env = parse_env((directory / "env").read_text())

    def words(key: str) -> list[str]:
        return env.get(key, "").split()

    ms = {}
    for x in words("MACHINES"):
        ns = env[f"NS_{x}"]
        ms[x] = Machine(x, ns.rsplit("-", 1)[0], env[f"NAME_{x}"], ns, Path(env[f"CONFIG_{x}"]),
                        ipaddress.IPv6Address(env[f"MRC_{x}"]), env[f"METRICS_{x}"], Path(env[f"SOCKET_{x}"]),
                        tuple(words(f"PORTS_{x}")),
                        tuple(ipaddress.IPv6Interface(a) for a in words(f"ADDRS_{x}")),
                        tuple(ipaddress.IPv6Address(g) for g in words(f"GATEWAYS_{x}")))
    return Machines(env["SHAPE"], env["SUFFIX"], Path(env["DIR"]), ms, tuple(words("SWITCHES")))


@contextlib.contextmanager
def machines(shape: str) -> Iterator[Machines]:
    """Bring up `shape` ("b2b": mA and mB, four planes back to back; "clos": mA..mD on two planes of
    2 leaves + 2 spines) in a fresh short directory under /tmp, and always take it down on exit (an
    exception included), removing the directory. Skips the test when machines.sh says this host cannot
    run it."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}: one of {', '.join(SHAPES)}")
    directory = Path(tempfile.mkdtemp(prefix="mrcm-", dir="/tmp"))
    try:
        proc = _script("up", shape, str(directory), timeout=UP_TIMEOUT_S)
        if proc.returncode == KSFT_SKIP:
            pytest.skip(_skip_text(proc.stderr))
        if proc.returncode != 0:
            raise MachinesError(f"machines.sh up {shape} {directory}: exit {proc.returncode}: "
                                f"{proc.stderr.strip()}")
        yield load(directory)
    finally:
        down = _script("down", str(directory), timeout=UP_TIMEOUT_S)
        shutil.rmtree(directory, ignore_errors=True)
    if down.returncode != 0:  # (after an exception in the test, that one is reported instead)
        raise MachinesError(f"machines.sh down {directory}: exit {down.returncode}: {down.stderr.strip()}")


@functools.cache
def skip_reason() -> str | None:
    """Why this host cannot run the machines (not root, no `ip`, no seg6local NEXT-C-SID, tried once in
    a throwaway namespace), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "no 'ip' command (apt-get install iproute2)"
    proc = _script("probe", timeout=60)
    if proc.returncode == KSFT_SKIP:
        return _skip_text(proc.stderr)
    if proc.returncode != 0:
        return f"machines.sh probe failed (exit {proc.returncode}): {proc.stderr.strip()}"
    return None


def _script(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def _run(*args: str) -> None:
    proc = _script(*args, timeout=UP_TIMEOUT_S)
    if proc.returncode != 0:
        raise MachinesError(f"machines.sh {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")


def _skip_text(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if "SKIP: " in x]
    return lines[-1].split("SKIP: ", 1)[1] if lines else f"machines.sh skipped: {stderr.strip()}"
