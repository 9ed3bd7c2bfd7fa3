"""dataplane/bpfsys.py issues bpf(2) with the number of the architecture it runs on (the wheel is
py3-none-any), and refuses an architecture it does not know with a clear error instead of calling
whatever syscall 321 is there."""

from __future__ import annotations

import ctypes as ct
import os
import platform
import re
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest

from mrc.dataplane import bpfsys
from mrc.errors import MrcError

# From the kernel's syscall tables (arch/*/entry/syscalls/syscall*.tbl, asm-generic/unistd.h).
KERNEL_TABLES = {
    ("x86_64", 64): 321, ("x86_64", 32): 357, ("i686", 32): 357,
    ("aarch64", 64): 280, ("riscv64", 64): 280, ("loongarch64", 64): 280,
    ("aarch64", 32): 386, ("armv7l", 32): 386,
    ("ppc64le", 64): 361, ("s390x", 64): 351,
}


class FakeLibc:
    """Stands in for libc: records the syscalls instead of making them."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def syscall(self, nr: int, cmd: int, _attr: object, _size: int) -> int:
        self.calls.append((nr, cmd))
        return 0


@pytest.fixture
def fake_libc(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLibc]:
    fake = FakeLibc()
    monkeypatch.setattr(bpfsys, "_libc", fake)
    bpfsys._nr_bpf.cache_clear()
    yield fake
    bpfsys._nr_bpf.cache_clear()  # the real machine's number again for whatever runs next


@pytest.mark.parametrize(("arch", "number"), sorted(KERNEL_TABLES.items()))
def test_syscall_number_per_architecture(arch: tuple[str, int], number: int) -> None:
    assert bpfsys.syscall_number(*arch) == number


def test_this_machine_matches_its_kernel_headers() -> None:
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    bits = 8 * ct.sizeof(ct.c_void_p)
    hdr = Path("/usr/include") / multiarch / "asm" / f"unistd_{bits}.h"
    if not multiarch or not hdr.is_file():
        hdr = Path("/usr/include") / multiarch / "asm" / "unistd.h"
    m = re.search(r"^#define __NR_bpf (\d+)$", hdr.read_text(), re.M) if hdr.is_file() else None
    if m is None:
        pytest.skip(f"no plain __NR_bpf in the system's headers ({hdr})")
    assert bpfsys.syscall_number() == int(m.group(1))


@pytest.mark.parametrize(("machine", "number"), [("aarch64", 280), ("x86_64", 321), ("riscv64", 280)])
def test_the_syscall_made_uses_the_machines_number(fake_libc: FakeLibc, monkeypatch: pytest.MonkeyPatch,
                                                   machine: str, number: int) -> None:
    monkeypatch.setattr(platform, "machine", lambda: machine)
    key = ct.c_uint32(1)
    assert bpfsys.delete(3, key) is True
    assert fake_libc.calls == [(number, bpfsys.BPF_MAP_DELETE_ELEM)]


@pytest.mark.parametrize("machine", ["sparc64", "mips64", "alpha"])
def test_unknown_architecture_is_refused_before_any_syscall(fake_libc: FakeLibc,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            machine: str) -> None:
    monkeypatch.setattr(platform, "machine", lambda: machine)
    with pytest.raises(MrcError, match=rf"bpf\(2\): unsupported architecture '{machine}'"):
        bpfsys.lookup(3, ct.c_uint32(1), ct.c_uint64())
    with pytest.raises(MrcError, match="unsupported architecture"):
        bpfsys.syscall_number(machine, 64)
    assert fake_libc.calls == []


def test_a_loader_killed_before_attaching_leaves_nothing_behind(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """mrcd killed between loading a program and attaching it leaves a record that names no attachment
    (and, on a real host, its pinned maps). Cleaning up one testbed's or host's records skipped it, as
    belonging to none, so no later mrcd ever removed it. A record of no attachment whose process is gone
    is now taken by every clean-up; a live loader's, and another testbed's, are left alone."""
    import json
    import subprocess

    from mrc.dataplane import bpf

    monkeypatch.setenv("MRC_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("MRC_BPF_PIN_ROOT", str(tmp_path / "pins"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    rd = bpf.record_dir()
    rd.mkdir(parents=True)

    def record(name: str, pid: int, atts: list[dict[str, str]]) -> Path:
        pins = bpf.pin_root() / name
        pins.mkdir(parents=True)
        (pins / "mrc_map").write_text("")
        (rd / f"{name}.json").write_text(json.dumps({"name": name, "kind": "host_ingress", "pid": pid,
                                                     "pin_dir": str(pins), "attachments": atts}))
        return pins

    orphan = record("host_ingress-orphan", dead.pid, [])
    loading = record("host_ingress-loading", os.getpid(), [])
    other = record("switch_port-other", dead.pid, [{"testbed": "elsewhere", "kind": "none"}])
    done = bpf.detach_everything(testbed="mine")
    assert done["records_removed"] == 1
    assert not orphan.exists() and not (rd / "host_ingress-orphan.json").exists()
    assert loading.exists() and other.exists()
