"""PyTorch DDP ranks whose gradients cross MRC (docs/collective.md §6): one rank process per testbed host,
a gloo process group between them, and `mrc_hook` running the compressed ring over an `MrcTransport`
(WRITE-with-immediate through the host's mrcd).

    python -m mrc.ctl.ddp_rank --rank R --hosts h0,h1 --ns NS --store tcp://127.0.0.1:PORT

The rank stays in the root namespace (like the all-reduce ranks, ctl/allreduce_rank.py): the process group
(gloo, rendezvous in the launcher's TCPStore on 127.0.0.1) is its control path — DDP's parameter
broadcast, the warm-up iterations' uncompressed all_reduce, the reported loss — and its data path for the
compressed buckets is its host's mrcd (control socket `$MRC_RUN_DIR/<testbed>-<host>.sock`). It joins the
group, opens the MrcTransport (slots sized by `allreduce_mrc.slot_bytes` for the whole model as one
bucket: no DDP bucket is larger), says ``{"ready": ...}`` on stdout, then follows commands from stdin, one
JSON object per line:

    {"op": "train", "steps": N, "hook": true, "transport": "mrc"|"gloo", "bits": 4, ...}
        train the model (a 16-H-1 tanh MLP regressing a fixed teacher, this rank's own data shard, SGD)
        from the same initial weights with plain DDP (hook false) or with mrc_hook over MRC or over the
        process group itself (gloo p2p); answer {"ok": {"losses", "wire_bytes", "messages", "iters",
        "params_sha256", "time_s"}} (losses: the global mean loss of every step, the same on every rank)
    {"op": "compare", "cfg": {...}, "mrc": true|false}
        one run of the hook comparison (mrc.collective.train_compare.train_rank: a task on real data, one
        hook); mrc's hooks run their ring over MRC when "mrc" is true (and the rank has a transport),
        otherwise over the process group; answer {"ok": {"losses", "evals", "wire_bytes", ...}}
    {"op": "quit"}  (or end of stdin: the launcher went away)  -> close the transport and the group, exit

`--ns ""` starts a rank without an MrcTransport: the local ranks of `mrcctl ddp bench --transport inproc`
(processes on this machine, gloo on 127.0.0.1, mrc's ring over gloo p2p; no testbed needed).
`--slot-params N` sizes the MRC slots for a model of N parameters (default: the MLP's).

`DdpRanks` is the launcher (used by `mrcctl ddp train`, `mrcctl ddp bench` and tests/netns/test_ddp_mrc.py):
it serves the store, starts the ranks through `allreduce_mrc.RankProcesses` (own sessions, ended by PID on
every exit path) and collects their answers; `DdpRanks(None, n)` starts n local ranks without a testbed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from mrc.errors import MrcError

from .allreduce_mrc import RankProcesses, rank_env, serve_store, slot_bytes
from .rank_proc import leave_on_sigterm, rank_parser, say

if TYPE_CHECKING:
    import torch

INPUTS: Final = 16
HIDDEN: Final = 64
TRAIN_KEYS: Final = ("steps", "batch", "lr", "hook", "transport", "bits", "scheme", "partial_sums", "seed",
                     "start_iter", "error_feedback", "correlation")
TRAIN_DEFAULTS: Final[dict[str, Any]] = {
    "steps": 60, "batch": 64, "lr": 0.1, "hook": True, "transport": "mrc", "bits": 4.0,
    "scheme": "eden-unbiased", "partial_sums": "aware", "seed": 7, "start_iter": 2, "error_feedback": False,
    "correlation": 0.0,
}


# -- the rank
def make_model(hidden: int = HIDDEN) -> torch.nn.Module:
    import torch
    from torch import nn

    torch.manual_seed(0)  # the same initial weights on every rank and for every run
    return nn.Sequential(nn.Linear(INPUTS, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def shard(rank: int, steps: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data: inputs of its own seed, targets from one teacher shared by all ranks."""
    import torch

    g = torch.Generator().manual_seed(1234)
    teacher = torch.randn(INPUTS, 1, generator=g)
    gx = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(steps * batch, INPUTS, generator=gx)
    y = torch.tanh(x @ teacher) + 0.05 * torch.randn(steps * batch, 1, generator=gx)
    return x, y


def model_slot_bytes(world: int, hidden: int = HIDDEN) -> int:
    """MrcTransport's slot for this model: the largest ring chunk of a bucket holding every parameter."""
    n = sum(p.numel() for p in make_model(hidden).parameters())
    return slot_bytes(4 * n, world, "ring")


def train(rank: int, transport: Any, cfg: dict[str, Any], hidden: int = HIDDEN) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from mrc.collective.ddp import MrcHookState, mrc_hook

    steps, batch = int(cfg["steps"]), int(cfg["batch"])
    ddp = DDP(make_model(hidden))
    state: MrcHookState | None = None
    sent0 = sum(getattr(transport, "send_seq", {}).values())
    if cfg["hook"]:
        if cfg["transport"] not in ("mrc", "gloo"):
            raise MrcError(f"transport {cfg['transport']!r}: mrc or gloo")
        state = MrcHookState(bits=float(cfg["bits"]), scheme=str(cfg["scheme"]), seed=int(cfg["seed"]),
                             start_iter=int(cfg["start_iter"]), error_feedback=bool(cfg["error_feedback"]),
                             partial_sums=str(cfg["partial_sums"]), correlation=float(cfg["correlation"]),
                             transport=transport if cfg["transport"] == "mrc" else None)
        ddp.register_comm_hook(state, mrc_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=float(cfg["lr"]))
    x, y = shard(rank, steps, batch)
    losses = []
    t0 = time.monotonic()
    for s in range(steps):
        xb, yb = x[s * batch : (s + 1) * batch], y[s * batch : (s + 1) * batch]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(xb), yb)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t)  # the global mean loss, identical on every rank
        losses.append(float(t) / dist.get_world_size())
    secs = time.monotonic() - t0
    h = hashlib.sha256()
    for p in ddp.module.parameters():
        h.update(p.detach().numpy().tobytes())
    return {"losses": losses, "wire_bytes": state.wire_bytes if state is not None else 0,
            "messages": sum(getattr(transport, "send_seq", {}).values()) - sent0,
            "iters": state.iter if state is not None else 0, "params_sha256": h.hexdigest(),
            "time_s": secs}


def main(argv: list[str] | None = None) -> int:
    ap = rank_parser("mrc.ctl.ddp_rank", "mrc-ddp")  # --store: tcp://HOST:PORT, the launcher's TCPStore
    ap.add_argument("--hidden", type=int, default=HIDDEN)
    ap.add_argument("--slot-params", type=int, default=0,
                    help="size the MRC slots for a model of this many parameters (0: the MLP's)")
    a = ap.parse_args(argv)
    leave_on_sigterm()
    hosts = a.hosts.split(",")
    if not a.store.startswith("tcp://"):
        say({"error": f"rank {a.rank}: --store must be tcp://HOST:PORT (a TCPStore), not {a.store!r}"})
        return 2
    import datetime

    import torch
    import torch.distributed as dist

    from mrc.dataplane.collective import MrcTransport, open_store

    torch.set_num_threads(1)
    host, _, port = a.store[len("tcp://"):].rpartition(":")
    timeout = datetime.timedelta(seconds=a.timeout)
    transport = None
    try:
        try:
            tcp = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)  # type: ignore[attr-defined]
            pg_store = dist.PrefixStore(f"{a.prefix}/pg", tcp)  # type: ignore[attr-defined]
            dist.init_process_group("gloo", store=pg_store, rank=a.rank, world_size=len(hosts),
                                    timeout=timeout)
            if a.ns:  # a testbed rank: its compressed buckets cross MRC through its host's mrcd
                slot = (slot_bytes(4 * a.slot_params, len(hosts), "ring") if a.slot_params > 0
                        else model_slot_bytes(len(hosts), a.hidden))
                transport = MrcTransport(open_store(a.store, a.timeout), a.rank, hosts, a.ns, slot,
                                         timeout_s=a.timeout, prefix=f"{a.prefix}/mrc")
        except (MrcError, OSError, RuntimeError, ValueError) as e:
            say({"error": f"rank {a.rank} ({hosts[a.rank]}): {str(e).splitlines()[0] if str(e) else e!r}"})
            return 1
        say({"ready": {"rank": a.rank, "host": hosts[a.rank],
                        "slot_bytes": transport.slot_bytes if transport is not None else 0,
                        "qpn": {p: q.qpn for p, q in transport.qps.items()} if transport is not None
                        else {}}})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd.get("op") == "quit":
                break
            if cmd.get("op") not in ("train", "compare"):
                say({"error": f"unknown op {cmd.get('op')!r}"})
                continue
            try:
                if cmd["op"] == "compare":
                    from mrc.collective.train_compare import train_rank

                    use = transport if cmd.get("mrc") else None
                    if cmd.get("mrc") and transport is None:
                        raise MrcError("this rank has no MRC transport (started without --ns)")
                    say({"ok": train_rank(a.rank, len(hosts), dict(cmd.get("cfg", {})), use)})
                    continue
                if transport is None and cmd.get("transport", "mrc") == "mrc" and cmd.get("hook", True):
                    raise MrcError("this rank has no MRC transport (started without --ns): transport gloo")
                cfg = {**TRAIN_DEFAULTS, **{k: v for k, v in cmd.items() if k in TRAIN_KEYS}}
                say({"ok": train(a.rank, transport, cfg, a.hidden)})
            except Exception as e:  # any failure is one answer line; then leave
                say({"error": f"rank {a.rank} ({hosts[a.rank]}): {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}"})
                return 1
    finally:
        if transport is not None:
            transport.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


# -- the launcher
class DdpRanks:
    """One DDP rank process per host of `testbed` (hosts 0..ranks-1), ready to train; `close` ends them
    (also on any failure while starting)."""

    def __init__(self, testbed: str | None, ranks: int, *, timeout_s: float = 120.0, hidden: int = HIDDEN,
                 slot_params: int = 0, progress: Any = lambda _m: None) -> None:
        from mrc.dataplane import testbed as tbmod

        self.testbed = testbed
        self.tb = tbmod.Testbed.load(testbed) if testbed is not None else None
        if self.tb is None:  # local ranks: no namespaces, no mrcd, mrc's ring over the process group
            if ranks < 2:
                raise MrcError("at least 2 local DDP ranks")
            hosts = [f"local{r}" for r in range(ranks)]
        else:
            hosts = self.tb.topo.host_names()
        if not 2 <= ranks <= len(hosts):
            raise MrcError(f"testbed {testbed} has {len(hosts)} hosts: 2..{len(hosts)} DDP ranks over MRC "
                           "(one rank per host)")
        self.hosts = hosts[:ranks]
        self.timeout_s = timeout_s
        self.store: Any = None
        base = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self.rundir = Path(tempfile.mkdtemp(prefix="mrc-ddp-", dir=base))
        self.ranks = RankProcesses(self.hosts, self.rundir)
        self.procs = self.ranks.procs
        self.ready: list[Any] = []
        try:
            self.store, url, _ = serve_store("tcpstore", self.rundir, timeout_s)
            progress(f"  {ranks} DDP rank processes on {', '.join(self.hosts)} "
                     f"({'gloo + MRC' if self.tb is not None else 'gloo'}, rendezvous {url})")
            env = {**rank_env(), "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
            for r, h in enumerate(self.hosts):
                self.ranks.start([sys.executable, "-m", "mrc.ctl.ddp_rank", "--rank", str(r), "--hosts",
                                  ",".join(self.hosts), "--ns", self.tb.ns(h) if self.tb is not None else "",
                                  "--store", url, "--hidden", str(hidden), "--slot-params", str(slot_params),
                                  "--timeout", str(timeout_s), "--prefix", f"ddp{os.getpid()}"], env)
            self.ready = self.ranks.wait_ready()
        except BaseException:
            self.close()
            raise

    def train(self, **cfg: Any) -> dict[str, Any]:
        """Train once on every rank; the answers of all ranks (rank order) and whether their parameters
        ended bit-identical."""
        bad = set(cfg) - set(TRAIN_KEYS)
        if bad:
            raise MrcError(f"unknown training options: {', '.join(sorted(bad))}")
        full = {**TRAIN_DEFAULTS, **cfg}
        for r in range(len(self.procs)):
            self.ranks.send(r, {"op": "train", **full})
        # a stall fails inside the rank within its timeout; the whole run scales with the steps
        limit = 2 * self.timeout_s + 5.0 * int(full["steps"])
        answers: list[dict[str, Any]] = self.ranks.answers(limit)  # the first failure ends every rank
        return {"config": full, "ranks": answers,
                "params_identical": len({a["params_sha256"] for a in answers}) == 1}

    def compare(self, cfg: dict[str, Any], *, mrc: bool, limit_s: float) -> list[dict[str, Any]]:
        """One run of the hook comparison (mrc.collective.train_compare.train_rank) on every rank; the
        answers in rank order. `mrc`: mrc's hooks run their ring over MRC (testbed ranks only)."""
        if mrc and self.tb is None:
            raise MrcError("local ranks have no MRC transport: mrc=False")
        for r in range(len(self.procs)):
            self.ranks.send(r, {"op": "compare", "cfg": cfg, "mrc": mrc})
        answers: list[dict[str, Any]] = self.ranks.answers(limit_s)  # the first failure ends every rank
        return answers

    def close(self) -> None:
        self.ranks.close()
        self.store = None
        shutil.rmtree(self.rundir, ignore_errors=True)

    def __enter__(self) -> DdpRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    try:
        code = main()
    except SystemExit as e:  # SIGTERM, argparse
        code = e.code if isinstance(e.code, int) else 1
    # the transport and the process group are closed; torch 2.13's gloo sometimes aborts in the
    # interpreter's teardown afterwards (tests/unit/_ddp_worker.py): leave without that teardown
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
