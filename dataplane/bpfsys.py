"""The few bpf(2) commands mrc needs, through ctypes: map lookup/update/delete/next-key, pin and get
pinned objects, and BPF_PROG_LOAD with prog_flags (BCC 0.26 cannot pass BPF_F_XDP_HAS_FRAGS, which veth
needs for XDP at MTU 9000). Working on plain fds keeps map access independent of BCC: `mrcctl fault set`
opens the pinned maps of programs another process loaded."""

from __future__ import annotations

import ctypes as ct
import errno
import os
import platform
from functools import cache
from pathlib import Path
from typing import Final

from mrc.errors import MrcError

# bpf(2) has a different number on each architecture (the kernel's syscall tables: x86_64 in
# arch/x86/entry/syscalls/syscall_64.tbl; arm64, riscv64 and loongarch64 share the generic
# include/uapi/asm-generic/unistd.h; the others in their own syscall.tbl). The wheel is py3-none-any, so
# the number is chosen at run time for the machine and the width of this Python (a 32-bit userland on a
# 64-bit kernel uses the 32-bit table), and an architecture not listed is refused with a clear error.
BPF_SYSCALL_NUMBERS: Final[dict[tuple[str, int], int]] = {
    ("x86_64", 64): 321, ("amd64", 64): 321,
    ("x86_64", 32): 357, ("amd64", 32): 357,
    ("i386", 32): 357, ("i486", 32): 357, ("i586", 32): 357, ("i686", 32): 357,
    ("aarch64", 64): 280, ("arm64", 64): 280, ("riscv64", 64): 280, ("loongarch64", 64): 280,
    ("aarch64", 32): 386, ("arm64", 32): 386,
    ("armv6l", 32): 386, ("armv7l", 32): 386, ("armv8l", 32): 386,
    ("ppc64le", 64): 361, ("ppc64", 64): 361,
    ("s390x", 64): 351,
}


def syscall_number(machine: str | None = None, pointer_bits: int | None = None) -> int:
    """The bpf(2) syscall number for `machine` (default `platform.machine()`) and a userland of
    `pointer_bits` (default this Python's); MrcError for an architecture mrc does not know."""
    m = (platform.machine() if machine is None else machine).lower()
    bits = 8 * ct.sizeof(ct.c_void_p) if pointer_bits is None else pointer_bits
    try:
        return BPF_SYSCALL_NUMBERS[(m, bits)]
    except KeyError:
        known = ", ".join(sorted({a for a, _ in BPF_SYSCALL_NUMBERS}))
        raise MrcError(f"bpf(2): unsupported architecture {m!r} ({bits}-bit userland): mrc does not know "
                       f"its syscall number (known: {known})") from None


@cache
def _nr_bpf() -> int:
    return syscall_number()


BPF_MAP_LOOKUP_ELEM: Final = 1
BPF_MAP_UPDATE_ELEM: Final = 2
BPF_MAP_DELETE_ELEM: Final = 3
BPF_MAP_GET_NEXT_KEY: Final = 4
BPF_PROG_LOAD: Final = 5
BPF_OBJ_PIN: Final = 6
BPF_OBJ_GET: Final = 7
BPF_PROG_TEST_RUN: Final = 10
BPF_OBJ_GET_INFO_BY_FD: Final = 15
BPF_ANY: Final = 0
BPF_F_XDP_HAS_FRAGS: Final = 1 << 5
BPF_PROG_TYPE_SCHED_CLS: Final = 3
BPF_PROG_TYPE_XDP: Final = 6

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


class _MapElemAttr(ct.Structure):
    _fields_ = [("map_fd", ct.c_uint32), ("pad", ct.c_uint32), ("key", ct.c_uint64), ("value", ct.c_uint64),
                ("flags", ct.c_uint64)]


class _ObjAttr(ct.Structure):
    _fields_ = [("pathname", ct.c_uint64), ("bpf_fd", ct.c_uint32), ("file_flags", ct.c_uint32),
                ("path_fd", ct.c_int32), ("pad", ct.c_uint32)]


class _ProgLoadAttr(ct.Structure):
    _fields_ = [
        ("prog_type", ct.c_uint32), ("insn_cnt", ct.c_uint32), ("insns", ct.c_uint64),
        ("license", ct.c_uint64),
        ("log_level", ct.c_uint32), ("log_size", ct.c_uint32), ("log_buf", ct.c_uint64),
        ("kern_version", ct.c_uint32), ("prog_flags", ct.c_uint32), ("prog_name", ct.c_char * 16),
        ("prog_ifindex", ct.c_uint32), ("expected_attach_type", ct.c_uint32), ("rest", ct.c_uint8 * 64),
    ]


def _bpf(cmd: int, attr: ct.Structure) -> int:
    rc = int(_libc.syscall(_nr_bpf(), cmd, ct.byref(attr), ct.sizeof(attr)))
    if rc < 0:
        e = ct.get_errno()
        raise OSError(e, os.strerror(e))
    return rc


def _addr(obj: ct._CData | None) -> int:
    return 0 if obj is None else ct.addressof(obj)


def lookup(fd: int, key: ct._CData, value: ct._CData) -> bool:
    """Fill `value` from the map; False when the key is absent."""
    try:
        _bpf(BPF_MAP_LOOKUP_ELEM, _MapElemAttr(map_fd=fd, key=_addr(key), value=_addr(value)))
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


def update(fd: int, key: ct._CData, value: ct._CData, flags: int = BPF_ANY) -> None:
    _bpf(BPF_MAP_UPDATE_ELEM, _MapElemAttr(map_fd=fd, key=_addr(key), value=_addr(value), flags=flags))


def delete(fd: int, key: ct._CData) -> bool:
    try:
        _bpf(BPF_MAP_DELETE_ELEM, _MapElemAttr(map_fd=fd, key=_addr(key)))
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


def next_key(fd: int, key: ct._CData | None, out: ct._CData) -> bool:
    try:
        _bpf(BPF_MAP_GET_NEXT_KEY, _MapElemAttr(map_fd=fd, key=_addr(key), value=_addr(out)))
    except OSError as e:
        if e.errno == errno.ENOENT:
            return False
        raise
    return True


def pin(fd: int, path: str | Path) -> None:
    raw = ct.create_string_buffer(os.fsencode(str(path)))
    _bpf(BPF_OBJ_PIN, _ObjAttr(pathname=ct.addressof(raw), bpf_fd=fd))


def get_pinned(path: str | Path) -> int:
    raw = ct.create_string_buffer(os.fsencode(str(path)))
    return _bpf(BPF_OBJ_GET, _ObjAttr(pathname=ct.addressof(raw)))


def prog_load(prog_type: int, insns: int, insn_bytes: int, name: str, *, prog_flags: int = 0,
              license: bytes = b"GPL") -> int:
    """Load already relocated instructions (address `insns`, `insn_bytes` long); the verifier's log is
    in the error message when it refuses."""
    lic = ct.create_string_buffer(license)
    log = ct.create_string_buffer(1 << 20)
    attr = _ProgLoadAttr(prog_type=prog_type, insn_cnt=insn_bytes // 8, insns=insns,
                         license=ct.addressof(lic), log_level=0, log_size=0, log_buf=0, prog_flags=prog_flags,
                         prog_name=name.encode()[:15])
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except OSError:
        attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ct.addressof(log)
        try:
            return _bpf(BPF_PROG_LOAD, attr)
        except OSError as e:
            tail = log.value.decode(errors="replace").strip().splitlines()[-8:]
            raise OSError(e.errno, f"loading {name}: {e.strerror}: " + " | ".join(tail)) from None


class _TestRunAttr(ct.Structure):
    _fields_ = [
        ("prog_fd", ct.c_uint32), ("retval", ct.c_uint32), ("data_size_in", ct.c_uint32),
        ("data_size_out", ct.c_uint32), ("data_in", ct.c_uint64), ("data_out", ct.c_uint64),
        ("repeat", ct.c_uint32), ("duration", ct.c_uint32), ("ctx_size_in", ct.c_uint32),
        ("ctx_size_out", ct.c_uint32), ("ctx_in", ct.c_uint64), ("ctx_out", ct.c_uint64),
        ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32), ("pad", ct.c_uint32),
    ]


def test_run(prog_fd: int, data: bytes, repeat: int = 1) -> tuple[int, bytes, int]:
    """BPF_PROG_TEST_RUN: run the program on `data` (a frame) without any interface. Returns (return
    code, the frame as the program left it, mean ns per run)."""
    inp = ct.create_string_buffer(bytes(data), len(data))
    out = ct.create_string_buffer(len(data) + 256)
    attr = _TestRunAttr(prog_fd=prog_fd, data_size_in=len(data), data_size_out=len(out),
                        data_in=ct.addressof(inp), data_out=ct.addressof(out), repeat=repeat)
    _bpf(BPF_PROG_TEST_RUN, attr)
    return int(attr.retval), out.raw[: attr.data_size_out], int(attr.duration)


class _InfoAttr(ct.Structure):
    _fields_ = [("bpf_fd", ct.c_uint32), ("info_len", ct.c_uint32), ("info", ct.c_uint64)]


def prog_id(fd: int) -> int:
    """The kernel's id of a loaded program (what `bpftool prog show` lists)."""
    info = (ct.c_uint8 * 256)()
    _bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=fd, info_len=len(info), info=ct.addressof(info)))
    return int.from_bytes(bytes(info[4:8]), "little")  # struct bpf_prog_info: type, id, ...


@cache
def possible_cpus() -> int:
    """Per-CPU map values have one slot per possible CPU."""
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += (int(hi) if hi else int(lo)) - int(lo) + 1
    return n
