"""torchrun jobs for the `mrc` backend tests: one launcher process (`python -m torch.distributed.run`) per
emulated machine, c10d rendezvous on 127.0.0.1, the ranks running tests/unit/_torch_backend_worker.py.

Every process started here is ended by PID on every exit path (`Job.close`, also from `__exit__` on a
failure): the launchers (SIGTERM, then SIGKILL), then any rank left behind (torchrun starts its ranks in
their own sessions, so a launcher killed hard would orphan them; they are found by `MRC_TEST_OUT=<dir>`
in their environment, which is this job's own directory).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("_torch_backend_worker.py")
ENTRY_POINT = "mrc = mrc.dataplane.torch_plugin:autoload"


def entry_point_dir(base: Path) -> Path:
    """A directory for PYTHONPATH holding a distribution that declares the package's `torch.backends`
    entry point, so the ranks get the backend the way an installed mrc gives it (an editable install
    made before the entry point existed does not declare it yet; two declarations register once)."""
    d = base / "mrc_torch_backend_ep-0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: mrc-torch-backend-ep\nVersion: 0\n")
    (d / "entry_points.txt").write_text(f"[torch.backends]\n{ENTRY_POINT}\n")
    return base


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _proc_has(pid: int, name: str, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return False


def _pids(name: str, needle: bytes) -> list[int]:
    return [int(d.name) for d in Path("/proc").iterdir()
            if d.name.isdigit() and int(d.name) != os.getpid() and _proc_has(int(d.name), name, needle)]


class Job:
    """`len(nodes)` launchers of `nproc` ranks each; `nodes[i]` is machine i's extra environment."""

    def __init__(self, out: Path, nodes: list[dict[str, str]], nproc: int, env: dict[str, str]) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.run_id = f"mrc-test-{secrets.token_hex(6)}"
        self.world = len(nodes) * nproc
        port = free_port()
        ep = entry_point_dir(out / "ep")
        base = {**os.environ, **env, "MRC_TEST_OUT": str(out), "GLOO_SOCKET_IFNAME": "lo",
                "OMP_NUM_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ep), os.environ.get("PYTHONPATH", "")) if p)}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        try:
            for i, extra in enumerate(nodes):
                log = out / f"launcher{i}.log"
                self.logs.append(log)
                cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(nodes)),
                       "--nproc-per-node", str(nproc), "--node-rank", str(i), "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", self.run_id,
                       "--rdzv-conf", f"is_host={1 if i == 0 else 0}", "--max-restarts", "0",
                       "--monitor-interval", "0.5", str(WORKER)]
                with log.open("wb") as f:
                    self.procs.append(subprocess.Popen(cmd, env={**base, **extra}, stdout=f,
                                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                       start_new_session=True))
        except BaseException:
            self.close()
            raise

    def wait(self, timeout_s: float) -> list[int | None]:
        """The launchers' exit codes (None: still running after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
        return [p.poll() for p in self.procs]

    def results(self) -> dict[int, dict[str, Any]]:
        out = {}
        for r in range(self.world):
            f = self.out / f"rank{r}.json"
            if f.exists():
                out[r] = json.loads(f.read_text())
        return out

    def log_tail(self, chars: int = 4000) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}"
                         for log in self.logs if log.exists())

    def rank_pids(self) -> list[int]:
        return _pids("environ", f"MRC_TEST_OUT={self.out}\0".encode())

    def launcher_pids(self) -> list[int]:
        return _pids("cmdline", self.run_id.encode())

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            left = self.rank_pids()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 15
            while left and time.monotonic() < deadline:
                time.sleep(0.1)
                left = self.rank_pids()
            if not left:
                break

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
