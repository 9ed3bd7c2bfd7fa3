"""Loading, pinning, attaching and detaching mrc's eBPF programs (docs/design.md §5).

* **Compile once per process**: `program(kind)` compiles `bpf/<kind>.c` with BCC (`src_file`, `-I` the
  include folder, `-D` flags) the first time and hands out the same `Program` afterwards. One loaded
  program serves every namespace of a testbed: its maps are keyed by namespace cookie, port MAC or ids
  (see mrc_abi.h), so nothing is compiled per port.
* **Typed maps**: every map is a `Map` over a plain fd with the ctypes types of `mrc.dataplane.abi`.
* **Pinned-state record**: at load, every map is pinned under ``/sys/fs/bpf/mrc/<object>/`` and a record
  ``/run/mrc/dataplane/<object>.json`` lists the pins, the ids handed out and every attachment (namespace,
  interface, hook, and what was created for it). Another process (`mrcctl port|fault`) opens the maps
  from the pins; `detach_everything()` (`mrcctl prog detach --all`) removes what a crashed process left.
* **Detach on every exit path**: `Program.close()` runs from context managers, `atexit`, and SIGTERM/SIGHUP
  (turned into SystemExit so `finally` blocks run) unless the program was made persistent (`persist()`:
  an operator's `mrcctl prog attach`, whose attachments outlive the command by design).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes as ct
import errno
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from mrc.errors import MrcError

from . import abi, bpfsys, netns
from .sources import bpf_include_dir, bpf_source

TC_EGRESS_PARENT: Final = "ffff:fff3"
XDP_FLAGS_UPDATE_IF_NOEXIST: Final = 1
XDP_FLAGS_DRV_MODE: Final = 4
XDP_FLAGS_SKB_MODE: Final = 2
#: XDP attach modes: native (in the driver; veth has it) or generic (in the stack, any device)
XDP_MODES: Final = {"native": XDP_FLAGS_DRV_MODE, "generic": XDP_FLAGS_SKB_MODE}
SO_NETNS_COOKIE: Final = 71


def pin_root() -> Path:
    return Path(os.environ.get("MRC_BPF_PIN_ROOT", "/sys/fs/bpf/mrc"))


def ensure_bpffs() -> None:
    """Pins need a bpf filesystem under the pin root; mount /sys/fs/bpf when nothing is mounted there
    (systemd does this on most machines; containers often do not). The mount is left in place: it is
    the standard location and other BPF tools expect it."""
    root = pin_root()
    base = Path("/sys/fs/bpf")
    if base not in (root, *root.parents):
        return
    mounts = Path("/proc/mounts").read_text().splitlines()
    mounted = any(line.split()[1:3] == [str(base), "bpf"] for line in mounts)
    if mounted:
        return
    libc = ct.CDLL(None, use_errno=True)
    if libc.mount(b"bpf", str(base).encode(), b"bpf", 0, None) != 0:
        e = ct.get_errno()
        raise MrcError(f"cannot mount the bpf filesystem on {base}: {os.strerror(e)}")


def record_dir() -> Path:
    return Path(os.environ.get("MRC_RUN_DIR", "/run/mrc")) / "dataplane"


@dataclass(frozen=True)
class MapSpec:
    key: type[ct._SimpleCData[Any]] | type[ct.Structure]
    value: type[ct._SimpleCData[Any]] | type[ct.Structure]
    percpu: bool = False


@dataclass(frozen=True)
class ProgramSpec:
    source: str
    hook: str  # "tc-egress" or "xdp"
    maps: dict[str, MapSpec]


PROGRAMS: Final[dict[str, ProgramSpec]] = {
    "host_egress": ProgramSpec("host_egress.c", "tc-egress", {
        "mrc_paths": MapSpec(abi.PathKey, abi.PathEntry),
        "mrc_hosts": MapSpec(ct.c_uint64, ct.c_uint32),
        "mrc_egress_tx": MapSpec(ct.c_uint32, abi.Counter, percpu=True),
        "mrc_egress_drops": MapSpec(ct.c_uint32, abi.Counter, percpu=True),
    }),
    "host_ingress": ProgramSpec("host_ingress.c", "xdp", {
        "mrc_in_ports": MapSpec(ct.c_uint64, abi.InPort),
        "mrc_allowed_qps": MapSpec(abi.QpKey, ct.c_uint32),
        "mrc_ingress_ev": MapSpec(ct.c_uint32, abi.EvCounters, percpu=True),
        "mrc_ingress_drops": MapSpec(ct.c_uint32, abi.Counter, percpu=True),
    }),
    "switch_port": ProgramSpec("switch_port.c", "tc-egress", {
        "mrc_sw_ports": MapSpec(ct.c_uint64, abi.SwPort),
        "mrc_sw_vq": MapSpec(ct.c_uint32, abi.Vq),
        "mrc_sw_faults": MapSpec(ct.c_uint32, abi.Fault),
        "mrc_sw_actions": MapSpec(ct.c_uint32, abi.Counter, percpu=True),
    }),
}


# ------------------------------------------------------------------------------------------------ maps


class Map:
    """Typed access to one BPF map through its fd (ours: a pin or BCC's table, dup'ed)."""

    def __init__(self, name: str, fd: int, spec: MapSpec) -> None:
        self.name = name
        self.fd = fd
        self.spec = spec
        self._slot = (ct.sizeof(spec.value) + 7) // 8 * 8

    def _key(self, key: Any) -> Any:
        return key if isinstance(key, ct._SimpleCData | ct.Structure) else self.spec.key(key)

    def get(self, key: Any) -> Any:
        """The value (a fresh ctypes object), or None when absent. Per-CPU maps: use `cpus`/`total`."""
        assert not self.spec.percpu, f"{self.name} is per-CPU"
        v = self.spec.value()
        return v if bpfsys.lookup(self.fd, self._key(key), v) else None

    def cpus(self, key: Any) -> list[Any]:
        buf = (ct.c_uint8 * (self._slot * bpfsys.possible_cpus()))()
        if not bpfsys.lookup(self.fd, self._key(key), buf):
            return []
        return [self.spec.value.from_buffer_copy(buf, i * self._slot) for i in range(bpfsys.possible_cpus())]

    def total(self, key: Any) -> Any:
        """A per-CPU counter row summed over the CPUs."""
        out = self.spec.value()
        for v in self.cpus(key):
            for fname, _t in v._fields_:
                setattr(out, fname, getattr(out, fname) + getattr(v, fname))
        return out

    def set(self, key: Any, value: Any) -> None:
        if self.spec.percpu:
            buf = (ct.c_uint8 * (self._slot * bpfsys.possible_cpus()))()
            for i in range(bpfsys.possible_cpus()):
                ct.memmove(ct.addressof(buf) + i * self._slot, ct.addressof(value), ct.sizeof(value))
            bpfsys.update(self.fd, self._key(key), buf)
        else:
            bpfsys.update(self.fd, self._key(key), value)

    def delete(self, key: Any) -> bool:
        return bpfsys.delete(self.fd, self._key(key))

    def keys(self) -> Iterator[Any]:
        cur: Any = None
        while True:
            nxt = self.spec.key()
            if not bpfsys.next_key(self.fd, cur, nxt):
                return
            yield nxt
            cur = nxt

    def clear(self) -> None:
        for k in list(self.keys()):
            self.delete(k)

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


# ------------------------------------------------------------------------------------------- programs


def netns_cookie(ns: str | None) -> int:
    """The network namespace cookie bpf_get_netns_cookie() returns for packets in `ns`."""
    if ns is None:
        sk = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    else:
        sk = netns.socket_in(ns, socket.AF_INET6, socket.SOCK_DGRAM)
    with sk:
        return int.from_bytes(sk.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8), "little")


class Program:
    """One loaded eBPF program with its maps, pins, record and attachments."""

    def __init__(self, kind: str, name: str, maps: dict[str, Map], prog_fd: int, record: dict[str, Any],
                 owned: bool, bcc: Any = None) -> None:
        self.kind = kind
        self.name = name
        self.spec = PROGRAMS[kind]
        self.maps = maps
        self.prog_fd = prog_fd
        self.record = record
        self.owned = owned
        self._bcc = bcc
        self.persistent = bool(record.get("persistent"))
        self.closed = False
        self._record_dir = record_dir()  # fixed at load: a later change of $MRC_RUN_DIR moves nothing

    # -- loading
    @classmethod
    def load(cls, kind: str, cflags: tuple[str, ...] = ()) -> Program:
        if kind not in PROGRAMS:
            raise MrcError(f"no eBPF program {kind!r} (known: {', '.join(PROGRAMS)})")
        if os.geteuid() != 0:
            raise MrcError("loading eBPF programs needs root")
        try:
            from bcc import BPF, lib
        except ImportError:
            raise MrcError("BCC is not importable (apt-get install python3-bpfcc; the venv needs "
                           "--system-site-packages)") from None
        spec = PROGRAMS[kind]
        src = bpf_source(spec.source)
        flags = [f"-I{bpf_include_dir()}", "-Wno-unused-function", *cflags]
        try:
            b = BPF(src_file=str(src).encode(), cflags=flags)
        except Exception as e:
            kdir = f"/lib/modules/{os.uname().release}"
            raise MrcError(f"compiling {src}: {e} (kernel headers at {kdir}/build and /source?)") from None
        fname = kind.encode()
        start = lib.bpf_function_start(b.module, fname)
        size = lib.bpf_function_size(b.module, fname)
        if not start:
            raise MrcError(f"{src}: no function {kind}")
        if spec.hook == "xdp":
            prog_type, pflags = bpfsys.BPF_PROG_TYPE_XDP, bpfsys.BPF_F_XDP_HAS_FRAGS
        else:
            prog_type, pflags = bpfsys.BPF_PROG_TYPE_SCHED_CLS, 0
        prog_fd = bpfsys.prog_load(prog_type, ct.cast(start, ct.c_void_p).value or 0, size, kind,
                                   prog_flags=pflags)
        name = f"{kind}-{os.getpid()}-{int(time.time() * 1000) % 10**9}"
        pdir = pin_root() / name
        record: dict[str, Any] = {
            "name": name, "kind": kind, "pid": os.getpid(), "prog_id": bpfsys.prog_id(prog_fd),
            "created": time.time(), "pin_dir": str(pdir),
            "cflags": list(cflags), "persistent": False, "maps": {}, "ids": {}, "attachments": [],
        }
        maps: dict[str, Map] = {}
        prog = cls(kind, name, maps, prog_fd, record, owned=True, bcc=b)
        _register(prog)
        try:
            ensure_bpffs()
            pdir.mkdir(parents=True, exist_ok=False)
            for mname, mspec in spec.maps.items():
                fd = os.dup(b.get_table(mname.encode()).map_fd)
                maps[mname] = Map(mname, fd, mspec)
                bpfsys.pin(fd, pdir / mname)
                record["maps"][mname] = str(pdir / mname)
            prog.save()
        except BaseException:
            prog.close()
            raise
        return prog

    @classmethod
    def open(cls, record_path: Path) -> Program:
        """A program another process loaded, through its record and pinned maps (no BCC needed)."""
        try:
            record = json.loads(record_path.read_text())
        except (OSError, ValueError) as e:
            raise MrcError(f"{record_path}: unreadable dataplane record: {e}") from None
        kind = record["kind"]
        maps = {}
        for mname, mspec in PROGRAMS[kind].maps.items():
            try:
                maps[mname] = Map(mname, bpfsys.get_pinned(record["maps"][mname]), mspec)
            except (OSError, KeyError) as e:
                for m in maps.values():
                    m.close()
                raise MrcError(f"{record['name']}: pinned map {mname} is gone ({e}); "
                               "clean up with 'mrcctl prog detach --all'") from None
        return cls(kind, record["name"], maps, -1, record, owned=False)

    # -- record
    @property
    def record_path(self) -> Path:
        return self._record_dir / f"{self.name}.json"

    def save(self) -> None:
        d = self._record_dir
        d.mkdir(parents=True, exist_ok=True)
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.record, indent=1) + "\n")
        tmp.replace(self.record_path)

    def persist(self) -> None:
        """Leave programs, pins and record in place when this process ends (operator attach)."""
        self.persistent = True
        self.record["persistent"] = True
        self.save()

    def allocate_id(self, space: str, key: str) -> int:
        """A small id (counter row) for `key`, stable for this program's life; 0 is never handed out."""
        ids = self.record["ids"].setdefault(space, {})
        if key not in ids:
            limit = abi.MAX_HOSTS if space == "host" else abi.MAX_PORTS
            used = set(ids.values())
            free = next((i for i in range(1, limit) if i not in used), None)
            if free is None:
                raise MrcError(f"{self.name}: no free {space} id (table holds {limit - 1})")
            ids[key] = free
            self.save()
        return int(ids[key])

    # -- attaching
    def attach(self, ns: str, ifname: str, **meta: Any) -> dict[str, Any]:
        """Attach to `ifname` in namespace `ns` at this program's hook; recorded before it is done, so a
        crash half-way still leaves something `detach_everything()` can remove."""
        if self.prog_fd < 0:
            raise MrcError(f"{self.name} was opened from its pins: only its loader attaches it")
        xdp_mode = str(meta.pop("xdp_mode", "native"))
        if xdp_mode not in XDP_MODES:
            raise MrcError(f"XDP mode must be one of {', '.join(XDP_MODES)}, got {xdp_mode!r}")
        att = {"netns": ns, "ifname": ifname, "hook": self.spec.hook, "prog_name": self.kind,
               "prog_id": self.record.get("prog_id"), "created_clsact": False, **meta}
        if self.spec.hook == "xdp":
            att["xdp_mode"] = xdp_mode
        if ns == netns.HERE:
            att["netns_inode"] = list(netns.own_inode())
        self.record["attachments"].append(att)
        self.save()
        ours = False  # whether anything at the hook is ours to undo if this fails half-way
        try:
            with contextlib.closing(netns.ipr(ns)) as ipr:
                found = ipr.link_lookup(ifname=ifname)
                if not found:
                    raise MrcError(f"no interface {ifname} in namespace {ns}")
                idx = int(found[0])
                att["ifindex"] = idx
                if self.spec.hook == "xdp":
                    try:
                        _set_xdp(ipr, idx, self.prog_fd, XDP_MODES[xdp_mode] | XDP_FLAGS_UPDATE_IF_NOEXIST)
                    except Exception as e:
                        if getattr(e, "code", None) == errno.EBUSY:
                            raise MrcError(f"{ns + '/' if ns else ''}{ifname} already has an XDP program "
                                           "(mrcctl prog show)") from None
                        raise
                    ours = True
                else:
                    try:
                        ipr.tc("add", "clsact", idx)
                        att["created_clsact"] = ours = True
                        self.save()
                    except Exception as e:
                        if getattr(e, "code", None) != errno.EEXIST:
                            raise
                        if _tc_egress_filters(ipr, idx):
                            raise MrcError(f"{ns}/{ifname} already has a tc egress program "
                                           "(mrcctl prog show)") from None
                    ipr.tc("add-filter", "bpf", idx, ":1", fd=self.prog_fd, name=self.kind,
                           parent=TC_EGRESS_PARENT, classid=1, direct_action=True)
                    ours = True
        except BaseException:
            if ours:
                with contextlib.suppress(Exception):
                    _detach_one(att)
            self.record["attachments"].remove(att)
            self.save()
            raise
        self.save()
        return att

    def detach(self, att: dict[str, Any]) -> None:
        _detach_one(att)
        with contextlib.suppress(ValueError):
            self.record["attachments"].remove(att)
        if not self.closed:
            self.save()

    def attachments(self, **match: Any) -> list[dict[str, Any]]:
        return [a for a in self.record["attachments"] if all(a.get(k) == v for k, v in match.items())]

    # -- ending
    def close(self) -> None:
        """Owned and not persistent: detach everything, unpin, remove the record. Always: close fds."""
        if self.closed:
            return
        if self.owned and os.getpid() != self.record["pid"]:
            return  # a forked child (pyroute2 forks to open namespace sockets) owns nothing
        try:
            if self.owned and not self.persistent:
                for att in list(self.record["attachments"]):
                    with contextlib.suppress(Exception):
                        self.detach(att)
                _unpin(Path(self.record["pin_dir"]))
                remove_pin_root_if_empty()
                with contextlib.suppress(FileNotFoundError):
                    self.record_path.unlink()
        finally:
            self.closed = True
            for m in self.maps.values():
                m.close()
            if self.prog_fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self.prog_fd)
                self.prog_fd = -1
            if self._bcc is not None:
                with contextlib.suppress(Exception):
                    self._bcc.cleanup()
                self._bcc = None
            _LIVE.pop(id(self), None)
            for k, v in list(_CACHE.items()):
                if v is self:
                    del _CACHE[k]

    def __enter__(self) -> Program:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _set_xdp(ipr: Any, idx: int, fd: int, flags: int) -> None:
    """Attach (fd) or detach (-1) XDP with `flags`, as the nested IFLA_XDP attribute: pyroute2's
    ``xdp_fd=`` / ``xdp_flags=`` keywords drop the flags silently (no generic mode, no
    UPDATE_IF_NOEXIST, so an XDP program already there was replaced without a word)."""
    ipr.link("set", index=idx, IFLA_XDP={"attrs": [("IFLA_XDP_FD", fd), ("IFLA_XDP_FLAGS", flags)]})


def _tc_egress_filters(ipr: Any, idx: int) -> list[Any]:
    try:
        return [f for f in ipr.get_filters(index=idx, parent=0xFFFFFFF3) if f.get_attr("TCA_KIND") == "bpf"]
    except Exception:
        return []


def _detach_one(att: dict[str, Any]) -> None:
    """Undo one attachment (idempotent; a namespace or interface that is gone is fine). Only what is
    ours goes: an XDP program only if it is the recorded one, a clsact only if we created it (else just
    our filter), a device and rule only if we made them."""
    ns = attachment_netns(att)
    if ns is None or not netns.exists(ns):
        return
    with contextlib.closing(netns.ipr(ns)) as ipr:
        found = ipr.link_lookup(ifname=att["ifname"])
        if found:
            idx = int(found[0])
            if att["hook"] == "xdp":
                xdp = ipr.get_links(idx)[0].get_attr("IFLA_XDP")
                kid = xdp.get_attr("IFLA_XDP_PROG_ID") if xdp is not None else None
                if kid and (att.get("prog_id") is None or kid == att["prog_id"]):
                    with contextlib.suppress(Exception):
                        _set_xdp(ipr, idx, -1, XDP_MODES[att.get("xdp_mode", "native")])
            elif att.get("created_dev"):
                with contextlib.suppress(Exception):
                    ipr.link("del", index=idx)  # takes its clsact and routes along
            elif att.get("created_clsact", True):
                with contextlib.suppress(Exception):
                    ipr.tc("del", "clsact", idx)
            else:
                for f in _tc_egress_filters(ipr, idx):
                    opts = f.get_attr("TCA_OPTIONS")
                    if opts is not None and opts.get_attr("TCA_BPF_NAME") == att.get("prog_name"):
                        with contextlib.suppress(Exception):
                            ipr.tc("del-filter", "bpf", idx, f["handle"], parent=TC_EGRESS_PARENT,
                                   prio=f["info"] >> 16)
        rule = att.get("rule")
        if rule:
            with contextlib.suppress(Exception):
                ipr.rule("del", family=socket.AF_INET6, **rule)


def attached_here(prog: Program, site: str, node: str) -> bool:
    """Whether `prog`'s record, as on disk now (whoever attached it rewrites it atomically), still lists
    an attachment on `node` of `site` (a testbed's name, or a real host's `host:<name>`). `mrcctl prog
    detach` removes or rewrites the record while its loader's copy, and its map fds, live on: only the
    file tells."""
    try:
        rec = json.loads(prog.record_path.read_text())
    except (OSError, ValueError):
        return False
    return any(a.get("testbed") == site and a.get("node") == node for a in rec.get("attachments", []))


def attachment_netns(att: dict[str, Any]) -> str | None:
    """The namespace of a recorded attachment as seen from here: a name, HERE, or None when it was made in
    an unnamed namespace that is not the caller's (nothing here can reach it safely)."""
    ino = att.get("netns_inode")
    if att["netns"] == netns.HERE and ino is not None:
        return netns.name_of((int(ino[0]), int(ino[1])))
    return str(att["netns"])


def _unpin(pdir: Path) -> None:
    if pdir.is_dir():
        for p in pdir.iterdir():
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
        with contextlib.suppress(OSError):
            pdir.rmdir()


# ------------------------------------------------------------------------------ per-process registry

_CACHE: dict[tuple[str, tuple[str, ...]], Program] = {}
_LIVE: dict[int, Program] = {}
_HANDLERS_INSTALLED = False


def _register(prog: Program) -> None:
    global _HANDLERS_INSTALLED, _OWNER_PID
    _LIVE[id(prog)] = prog
    if not _HANDLERS_INSTALLED:
        _HANDLERS_INSTALLED = True
        _OWNER_PID = os.getpid()
        atexit.register(close_all)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):  # not the main thread
                if signal.getsignal(sig) in (signal.SIG_DFL, None):
                    signal.signal(sig, _on_signal)


_OWNER_PID = os.getpid()


def _on_signal(signum: int, _frame: object) -> None:
    if os.getpid() != _OWNER_PID:  # a forked child inherited the handler: behave as if it had none
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise SystemExit(128 + signum)  # unwinds through `finally` and context managers; atexit runs too


def close_all() -> None:
    if os.getpid() != _OWNER_PID:
        return
    for prog in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            prog.close()


def program(kind: str, cflags: tuple[str, ...] = ()) -> Program:
    """The process's loaded `kind` program: compiled and loaded on first use, then reused."""
    key = (kind, tuple(cflags))
    prog = _CACHE.get(key)
    if prog is None or prog.closed:
        prog = Program.load(kind, cflags)
        _CACHE[key] = prog
    return prog


# ------------------------------------------------------------------------------ records of everyone


def records() -> list[dict[str, Any]]:
    d = record_dir()
    out = []
    if d.is_dir():
        for p in sorted(d.glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(p.read_text()))
    return out


def open_programs(kind: str | None = None, testbed: str | None = None) -> list[Program]:
    """Programs (any process's) whose maps are pinned, optionally of one kind / attached to a testbed."""
    out = []
    for rec in records():
        if kind is not None and rec.get("kind") != kind:
            continue
        if testbed is not None and not any(a.get("testbed") == testbed for a in rec.get("attachments", [])):
            continue
        out.append(Program.open(record_dir() / f"{rec['name']}.json"))
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def detach_everything(testbed: str | None = None) -> dict[str, Any]:
    """Remove what the records list (all of them, or those on one testbed): attachments, the devices and
    rules made for them, pins, records; then pin folders no record claims. Safe after a crash."""
    detached = pins = recs = 0
    claimed: set[str] = set()
    for rec in records():
        atts = rec.get("attachments", [])
        # a record of no attachment whose process is gone is an orphan of any testbed's: its loader was
        # killed between loading and attaching, and nothing else would ever remove its record and pins
        pid = int(rec.get("pid", 0))
        orphan = not atts and pid > 0 and not pid_alive(pid)
        if testbed is not None and not orphan and not any(a.get("testbed") == testbed for a in atts):
            claimed.add(rec.get("pin_dir", ""))
            continue
        for att in atts:
            with contextlib.suppress(Exception):
                _detach_one(att)
                detached += 1
        pdir = Path(rec.get("pin_dir", ""))
        if pdir.is_dir() and pdir.parent == pin_root():
            pins += len(list(pdir.iterdir()))
            _unpin(pdir)
        with contextlib.suppress(FileNotFoundError):
            (record_dir() / f"{rec['name']}.json").unlink()
        recs += 1
    if testbed is None and pin_root().is_dir():
        for pdir in pin_root().iterdir():
            if pdir.is_dir() and str(pdir) not in claimed:
                pins += len(list(pdir.iterdir()))
                _unpin(pdir)
    remove_pin_root_if_empty()
    return {"records_removed": recs, "attachments_removed": detached, "pins_removed": pins}


def kernel_view(att: dict[str, Any]) -> dict[str, Any]:
    """What the kernel has at an attachment's hook now: program id and name, or nothing."""
    ns = attachment_netns(att)
    out: dict[str, Any] = {"present": False, "prog_id": None, "prog_name": None}
    if ns is None or not netns.exists(ns):
        return out
    with contextlib.closing(netns.ipr(ns)) as ipr:
        found = ipr.link_lookup(ifname=att["ifname"])
        if not found:
            return out
        idx = int(found[0])
        if att["hook"] == "xdp":
            link = ipr.get_links(idx)[0]
            xdp = link.get_attr("IFLA_XDP")
            pid = xdp.get_attr("IFLA_XDP_PROG_ID") if xdp is not None else None
            if pid:
                out.update(present=True, prog_id=int(pid))
        else:
            for f in _tc_egress_filters(ipr, idx):
                opts = f.get_attr("TCA_OPTIONS")
                name = opts.get_attr("TCA_BPF_NAME") if opts is not None else None
                # pyroute2 does not decode TCA_BPF_ID; the name says whose filter it is
                out.update(present=True, prog_name=name)
    return out


def remove_pin_root_if_empty() -> None:
    with contextlib.suppress(OSError):
        pin_root().rmdir()


__all__ = [
    "PROGRAMS", "Map", "MapSpec", "Program", "ProgramSpec", "close_all", "detach_everything", "kernel_view",
    "netns_cookie", "open_programs", "pid_alive", "pin_root", "program", "record_dir", "records",
    "remove_pin_root_if_empty",
]
