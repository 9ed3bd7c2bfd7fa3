"""Simulation drivers of the MRC engine. `loopback`: two engines over an in-memory multi-plane fabric
with impairments on a virtual clock (the seed of the discrete-event fabric simulator)."""

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
    "FabricConfig",
    "LoopbackConfig",
    "LoopbackFabric",
    "LoopbackRun",
    "build",
    "loopback",
    "run_transfer",
]
