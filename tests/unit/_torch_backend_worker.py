"""One rank of the `mrc` torch.distributed backend checks (tests/unit/test_torch_backend_local.py,
tests/netns/test_torch_backend.py), launched by torchrun: `init_process_group("mrc")` with nothing imported
from mrc (the backend comes from the `torch.backends` entry point), then every collective on the mrc group
and on a gloo group of the same job, compared; a few DDP steps on each, and on the mrc group once more with
mrc's compressed DDP hook over the group's transport (the one place it imports mrc). Writes
`$MRC_TEST_OUT/rank<R>.json`.

Environment: MRC_TEST_OUT (required), MRC_TEST_SIZES (comma-separated all_reduce sizes), MRC_TEST_STEPS
(DDP steps), MRC_TEST_TIMEOUT (seconds, the process groups' timeout).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

OUT = Path(os.environ["MRC_TEST_OUT"])
SIZES = [int(s) for s in os.environ.get("MRC_TEST_SIZES", "1,7,1000,65537").split(",") if s]
STEPS = int(os.environ.get("MRC_TEST_STEPS", "8"))
TIMEOUT = float(os.environ.get("MRC_TEST_TIMEOUT", "120"))


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bits(a) == bits(b)


def ints(n: int, seed: int, lo: int = -1000, hi: int = 1000) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi, (n,), generator=g).to(torch.float32)


def both(fn: Any, x: torch.Tensor, gloo: Any) -> tuple[torch.Tensor, torch.Tensor]:
    a, b = x.clone(), x.clone()
    fn(a, None)
    fn(b, gloo)
    return a, b


def train(rank: int, world: int, pg: Any, gloo: Any, steps: int, hook: bool = False) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
    t0 = time.monotonic()
    ddp = DDP(model, process_group=pg)
    init_s = time.monotonic() - t0
    state = None
    if hook:  # mrc's compressed ring (4-bit EDEN) over the mrc group's own transport: the opt-in part
        from mrc.collective.ddp import MrcHookState, mrc_hook

        state = MrcHookState(bits=4, scheme="eden-unbiased", seed=7, start_iter=2,
                             transport=dist.group.WORLD.transport)  # type: ignore[union-attr]
        ddp.register_comm_hook(state, mrc_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1234)
    teacher = torch.randn(16, 1, generator=g)
    gx = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(64, 16, generator=gx)
        y = torch.tanh(x @ teacher)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        t = loss.detach().clone()
        dist.all_reduce(t, group=gloo)
        losses.append(float(t) / world)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(bits(p))
    return {"losses": losses, "params_sha256": h.hexdigest(), "init_s": init_s,
            "hook_messages": state.messages if state is not None else 0}


def checks(rank: int, world: int, gloo: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"identical": {}, "close": {}, "errors": {}}
    ok = out["identical"]

    def ar(op: Any) -> Any:
        return lambda t, g: dist.all_reduce(t, op=op, group=g)

    t0 = time.monotonic()
    for n in SIZES:  # integer-valued float32: exact in any summation order
        a, b = both(ar(dist.ReduceOp.SUM), ints(n, 1000 * rank + n), gloo)
        ok[f"all_reduce_sum_{n}"] = same(a, b)
    out["all_reduce_s"] = time.monotonic() - t0
    # random floats: another summation order than gloo's, so close, not identical
    g = torch.Generator().manual_seed(7 + rank)
    a, b = both(ar(dist.ReduceOp.SUM), torch.randn(10007, generator=g), gloo)
    out["close"]["all_reduce_random"] = float((a - b).abs().max() / b.abs().max())
    # every rank holds the same bits (what DDP needs), whatever the order
    got = [torch.empty_like(a) for _ in range(world)]
    dist.all_gather(got, a, group=gloo)
    ok["all_reduce_random_same_on_all_ranks"] = all(same(x, got[0]) for x in got)
    x = ints(4099, 55 + rank)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    dist.all_reduce(b, group=gloo)
    ok["all_reduce_avg"] = same(a, b / world)
    for name in ("MAX", "MIN"):
        a, b = both(ar(getattr(dist.ReduceOp, name)), ints(3001, 77 + rank), gloo)
        ok[f"all_reduce_{name.lower()}"] = same(a, b)
    a, b = both(ar(dist.ReduceOp.PRODUCT), ints(513, 99 + rank, -2, 3), gloo)
    ok["all_reduce_product"] = same(a, b)
    gi = torch.Generator().manual_seed(5 + rank)
    xi = torch.randint(-(1 << 40), 1 << 40, (1001,), generator=gi, dtype=torch.int64)
    a, b = both(ar(dist.ReduceOp.SUM), xi, gloo)
    ok["all_reduce_int64"] = same(a, b)
    a, b = both(ar(dist.ReduceOp.SUM), ints(700, 3 + rank).to(torch.float64), gloo)
    ok["all_reduce_float64"] = same(a, b)
    m = ints(64 * 33, 11 + rank).reshape(64, 33).t()  # not contiguous
    a, b = both(ar(dist.ReduceOp.SUM), m, gloo)
    ok["all_reduce_non_contiguous"] = same(a, b)
    for root in range(world):
        x = ints(70001, 500 + rank) if rank == root else torch.zeros(70001)
        a, b = both(lambda t, g, root=root: dist.broadcast(t, root, group=g), x, gloo)
        ok[f"broadcast_from_{root}"] = same(a, b) and same(a, ints(70001, 500 + root))
    x = ints(33333, 900 + rank)
    ga = [torch.empty_like(x) for _ in range(world)]
    gb = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(ga, x)
    dist.all_gather(gb, x, group=gloo)
    ok["all_gather"] = all(same(p, q) for p, q in zip(ga, gb, strict=True))
    ta, tb = torch.empty(world * 1000), torch.empty(world * 1000)
    x = ints(1000, 1500 + rank)
    gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # 2.13 renamed it
    gather_single(ta, x)
    gather_single(tb, x, group=gloo)
    ok["all_gather_into_tensor"] = same(ta, tb)
    x = ints(world * 257, 2000 + rank)
    ra, rb = torch.empty(257), torch.empty(257)
    scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter_single(ra, x)
    try:
        scatter_single(rb, x, group=gloo)
    except RuntimeError:  # gloo may lack it: the whole sum, this rank's part
        s = x.clone()
        dist.all_reduce(s, group=gloo)
        rb = s[rank * 257 : (rank + 1) * 257].clone()
    ok["reduce_scatter_tensor"] = same(ra, rb)
    if world >= 3:  # a sub-group (ranks 1 and 2: on two hosts when there are two) of each backend
        sub_m, sub_g = dist.new_group([1, 2], backend="mrc"), dist.new_group([1, 2], backend="gloo")
        if rank in (1, 2):
            a, b = both(lambda t, g: dist.all_reduce(t, group=sub_m if g is None else g), ints(5003, rank),
                        sub_g)
            ok["sub_group_all_reduce"] = same(a, b)
    # the caller's tensors stay resizable (FSDP frees its unsharded parameters by resizing their storage
    # to 0 after the collectives; Tensor.numpy() of them had made that raise)
    used = {"float32": torch.ones(300), "int64": torch.ones(300, dtype=torch.int64)}
    for t in used.values():
        dist.all_reduce(t)
    used["broadcast"] = torch.ones(300)
    dist.broadcast(used["broadcast"], 0)
    used["all_gather_out"] = torch.empty(world * 10)
    gather_single(used["all_gather_out"], torch.ones(10))
    for name, t in used.items():
        t.untyped_storage().resize_(0)
        ok[f"resizable_after_{name}"] = t.untyped_storage().nbytes() == 0
    # everything torch keys by the group's name: the name itself, functional collectives (torch.compile,
    # DTensor), DeviceMesh (FSDP2, tensor parallel), destroying a subgroup
    import torch.distributed._functional_collectives as fcol
    from torch.distributed.device_mesh import init_device_mesh

    world_pg = dist.group.WORLD
    assert world_pg is not None
    ok["group_name"] = bool(world_pg.group_name)
    x = ints(1001, 3100 + rank)
    fa = fcol.all_reduce(x.clone(), "sum", world_pg)
    fb = x.clone()
    dist.all_reduce(fb, group=gloo)
    ok["functional_all_reduce"] = same(fcol.wait_tensor(fa), fb)  # type: ignore[no-untyped-call]
    ok["device_mesh"] = init_device_mesh("cpu", (world,)).size() == world
    sub = dist.new_group(list(range(world)), backend="mrc")
    t = torch.ones(5)
    dist.all_reduce(t, group=sub)
    dist.destroy_process_group(sub)
    ok["destroy_sub_group"] = bool((t == world).all())
    t0 = time.monotonic()
    for _ in range(3):
        dist.barrier()
    out["barrier_s"] = (time.monotonic() - t0) / 3
    ok["barrier"] = True
    try:
        dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND)
    except Exception as e:  # bitwise ops need integer tensors
        out["errors"]["band_float"] = str(e).splitlines()[0]
    try:  # refused before any message (was torch's "not implemented" after the all-gather); through
        # the process group, since dist.all_reduce itself refuses complex MAX before any backend
        opts: Any = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        pg = dist.distributed_c10d._get_default_group()
        pg.allreduce([torch.ones(2, dtype=torch.complex64)], opts).wait()
    except Exception as e:
        out["errors"]["max_complex"] = str(e).splitlines()[0]
    # ops the backend does not do: each refused by name, the group still usable after them
    t = torch.ones(4)
    peer = (rank + 1) % world
    refused: dict[str, Callable[[], Any]] = {
        "send": lambda: dist.send(t, peer),
        "recv": lambda: dist.recv(t, peer),
        "isend": lambda: dist.isend(t, peer),
        "scatter": lambda: dist.scatter(t, [torch.ones(4)] * world if rank == 0 else None, src=0),
        "gather": lambda: dist.gather(t, [torch.ones(4) for _ in range(world)] if rank == 0 else None, dst=0),
        "all_to_all": lambda: dist.all_to_all([torch.ones(1) for _ in range(world)],
                                              [torch.ones(1) for _ in range(world)]),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.ones(world), torch.ones(world)),
    }
    for name, call in refused.items():
        try:
            call()
        except Exception as e:
            out["errors"][f"refused_{name}"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    after = torch.ones(3)
    dist.all_reduce(after)
    ok["usable_after_refusals"] = bool((after == world).all())
    return out


def main() -> int:
    rank = int(os.environ["RANK"])
    res: dict[str, Any] = {"rank": rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}
    try:
        dist.init_process_group("mrc", timeout=timedelta(seconds=TIMEOUT))
        world = dist.get_world_size()
        pg = dist.group.WORLD
        res["backend"] = dist.get_backend()
        res["pg_type"] = type(pg).__name__
        res["host"] = getattr(pg, "host", None)
        res["hosts"] = getattr(pg, "hosts", None)
        gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=TIMEOUT))
        res.update(checks(rank, world, gloo))
        t0 = time.monotonic()
        res["ddp_mrc"] = train(rank, world, None, gloo, STEPS)
        res["ddp_mrc"]["time_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        res["ddp_gloo"] = train(rank, world, gloo, gloo, STEPS)
        res["ddp_gloo"]["time_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        res["ddp_hook"] = train(rank, world, None, gloo, STEPS, hook=True)
        res["ddp_hook"]["time_s"] = time.monotonic() - t0
        res["stats"] = dict(getattr(pg, "stats", {}))
        dist.barrier()
        dist.destroy_process_group()
        res["ok"] = True
    except BaseException as e:
        res["ok"] = False
        res["error"] = f"{type(e).__name__}: {e}"
        res["traceback"] = traceback.format_exc()
    tmp = OUT / f".rank{rank}.json.tmp"
    tmp.write_text(json.dumps(res))
    tmp.replace(OUT / f"rank{rank}.json")
    sys.stdout.flush()
    sys.stderr.flush()
    # torch 2.13's gloo sometimes aborts in the interpreter's teardown (tests/unit/_ddp_worker.py)
    os._exit(0 if res["ok"] else 1)


if __name__ == "__main__":
    main()
