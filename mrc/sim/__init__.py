"""Simulation drivers of the MRC engine. `loopback`: two engines over an in-memory multi-plane fabric
with impairments on a virtual clock. `fabric`: the discrete-event multi-plane Clos simulator (micro-SID
forwarding, queues with ECN/trimming/drops, failures) with `hosts` running the engines or the ECMP
single-path baseline (`roce`), and the `experiments` of `mrcctl sim run` (docs/sim.md)."""

from .fabric import Fabric, FabricParams
from .hosts import Flow, HostParams, Traffic
from .loopback import (
    Blackhole,
    FabricConfig,
    LoopbackConfig,
    LoopbackFabric,
    LoopbackRun,
    build,
    loopback,
    run_transfer,
)

__all__ = [
    "Blackhole",
    "Fabric",
    "FabricConfig",
    "FabricParams",
    "Flow",
    "HostParams",
    "LoopbackConfig",
    "LoopbackFabric",
    "LoopbackRun",
    "Traffic",
    "build",
    "loopback",
    "run_transfer",
]
