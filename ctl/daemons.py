"""Starting and stopping one `mrcd` per host of a testbed (``mrcctl testbed up --with-daemons``).

Each mrcd is started with ``--ready-fd`` and waited for; its PID, control socket, metrics address and log
file are recorded in ``$MRC_RUN_DIR/mrcd/<testbed>.json`` so that ``testbed down``, the tests and
``mrcctl`` find them. Stopping is by recorded PID only (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

from mrc.dataplane import bpf
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import socket_path
from mrc.dataplane.fabric import FabricDataplane
from mrc.errors import MrcError

DEFAULT_METRICS_BASE: Final = 9470
READY_TIMEOUT_S: Final = 60.0
DAEMON_NICE: Final = -10  # testbed mrcds run ahead of ordinary processes (see _niced)


def record_path(name: str) -> Path:
    return Path(os.environ.get("MRC_RUN_DIR", "/run/mrc")) / "mrcd" / f"{name}.json"


def records(name: str) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(record_path(name).read_text())
        return doc
    except (OSError, ValueError):
        return {"testbed": name, "daemons": {}, "attached": False}


def _save(name: str, doc: dict[str, Any]) -> None:
    p = record_path(name)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(p)


def attach_dataplane(name: str) -> bool:
    """The three programs on the testbed, persistent, with the allowed-QP filter on; False when some
    are attached already (then they are used as they are)."""
    if any(a.get("testbed") == name for r in bpf.records() for a in r.get("attachments", [])):
        return False
    fd = FabricDataplane.attach(name, qp_filter=True)
    for p in (fd.egress, fd.ingress, fd.switch):
        if p is not None:
            p.persist()
    return True


def _niced() -> list[str]:
    """`nice -n DAEMON_NICE` (which execs mrcd in place: same PID, every thread at that priority) when
    we may raise priority. mrcd stands in for a NIC's transport engine, which never waits for the
    host's other work: on a busy machine its acknowledgements and loss detection must not queue behind
    user processes (two busy loops on the two cores: first detection 9-20 ms at nice 0)."""
    tool = shutil.which("nice")
    if tool is None or os.geteuid() != 0:
        return []
    return [tool, "-n", str(DAEMON_NICE)]


def start(name: str, hosts: list[str] | None = None, *, metrics_base: int | None = DEFAULT_METRICS_BASE,
          metrics_addr: str = "127.0.0.1", evs: int | None = None, attach: bool = True) -> dict[str, Any]:
    """Start one mrcd per host (all hosts by default) and wait until each serves its socket."""
    tb = tbmod.Testbed.load(name)
    doc = records(name)
    if attach and attach_dataplane(name):
        doc["attached"] = True
        _save(name, doc)
    logdir = record_path(name).parent
    logdir.mkdir(parents=True, exist_ok=True)
    started: list[tuple[str, subprocess.Popen[bytes], int]] = []
    try:
        for h in hosts or tb.topo.host_names():
            old = doc["daemons"].get(h)
            if old and _is_mrcd(int(old["pid"])):  # (a zombie or a recycled PID is not)
                raise MrcError(f"testbed {name}: mrcd for {h} runs already (pid {old['pid']})")
            r, w = os.pipe()
            cmd = [*_niced(), sys.executable, "-m", "mrc.ctl.daemon", "--testbed", name, "--host", h,
                   "--ready-fd", str(w)]
            metrics = None
            if metrics_base is not None:
                metrics = f"{metrics_addr}:{metrics_base + tb.topo.host_index(h)}"
                cmd += ["--metrics", metrics]
            if evs is not None:
                cmd += ["--evs", str(evs)]
            log = logdir / f"{tb.ns(h)}.log"
            with open(log, "ab") as lf:
                p = subprocess.Popen(cmd, pass_fds=(w,), stdout=lf, stderr=lf, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
            os.close(w)
            started.append((h, p, r))
            doc["daemons"][h] = {"pid": p.pid, "socket": str(socket_path(tb.ns(h))), "metrics": metrics,
                                 "log": str(log), "started": time.time()}
            _save(name, doc)
        deadline = time.monotonic() + READY_TIMEOUT_S
        for h, p, r in started:
            ok = False
            while time.monotonic() < deadline:
                rl, _, _ = select.select([r], [], [], 0.2)
                if rl:
                    ok = os.read(r, 64).startswith(b"ready")
                    break
                if p.poll() is not None:
                    break
            os.close(r)
            if not ok:
                tail = Path(doc["daemons"][h]["log"]).read_text(errors="replace").strip().splitlines()[-3:]
                raise MrcError(f"mrcd for {h} did not become ready: {' | '.join(tail) or 'no output'}")
    except BaseException:
        if hosts is None:
            stop(name)
        else:  # some hosts of a running testbed (start_missing): the others keep theirs
            _terminate([p.pid for _h, p, _r in started])
            for h, _p, _r in started:
                doc["daemons"].pop(h, None)
            _save(name, doc)
        raise
    return doc


def status(name: str) -> dict[str, dict[str, Any]]:
    """The testbed's recorded mrcds, each with `running` (its PID is a live mrcd now): host -> {pid,
    running, socket, metrics, log}; {} when none was started."""
    return {h: {"pid": int(d["pid"]), "running": _is_mrcd(int(d["pid"])), "socket": d.get("socket"),
                "metrics": d.get("metrics"), "log": d.get("log")}
            for h, d in records(name).get("daemons", {}).items()}


def start_missing(name: str, host: str | None = None) -> dict[str, Any]:
    """Start an mrcd for each host of the testbed that has none running (`host`: that one only), as
    `testbed up --with-daemons` did: after one exited or was killed. Its metrics address is the one
    recorded for the testbed's mrcds (the same base), the default otherwise. {"started": [hosts], ...}."""
    tb = tbmod.Testbed.load(name)
    names = tb.topo.host_names()
    if host is not None and host not in names:
        raise MrcError(f"testbed {name}: no host {host!r} (hosts: {', '.join(names)})")
    doc = records(name)
    running = {h for h, d in doc["daemons"].items() if _is_mrcd(int(d["pid"]))}
    todo = [h for h in ([host] if host is not None else names) if h not in running]
    base: int | None = DEFAULT_METRICS_BASE
    for h, d in doc["daemons"].items():
        if h in names and d.get("metrics"):
            base = int(str(d["metrics"]).rpartition(":")[2]) - tb.topo.host_index(h)
            break
    else:
        if doc["daemons"]:
            base = None  # started without metrics
    if todo:
        doc = start(name, todo, metrics_base=base)
    return {"testbed": name, "started": todo, "running": sorted(running),
            "daemons": {h: doc["daemons"][h] for h in todo}}


def _terminate(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM to those of `pids` that are mrcds, SIGKILL to any still running after `grace_s`."""
    alive = [pid for pid in pids if _is_mrcd(pid)]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for pid in alive:
        while time.monotonic() < deadline and _is_mrcd(pid):
            _reap(pid)
            time.sleep(0.02)
        if _is_mrcd(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _reap(pid)


def stop(name: str, grace_s: float = 5.0, *, detach: bool = True) -> dict[str, Any]:
    """Stop the testbed's mrcds by recorded PID; detach the programs if `start` attached them."""
    doc = records(name)
    stopped = [(h, int(d["pid"])) for h, d in doc.get("daemons", {}).items() if _is_mrcd(int(d["pid"]))]
    _terminate([pid for _h, pid in stopped], grace_s)
    detached = False
    if detach and doc.get("attached"):
        bpf.detach_everything(name)
        detached = True
    with contextlib.suppress(FileNotFoundError):
        record_path(name).unlink()
    return {"testbed": name, "stopped": [h for h, _ in stopped], "detached": detached}


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _is_mrcd(pid: int) -> bool:
    """`pid` is alive and is an mrcd (so a recycled PID is never signalled)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return b"mrc.ctl.daemon" in cmd and stat.rsplit(")", 1)[1].split()[0] != "Z"


def hosts_with_daemons(name: str) -> list[str]:
    tb = tbmod.Testbed.load(name)
    return [h for h in tb.topo.host_names() if socket_path(tb.ns(h)).exists()]
