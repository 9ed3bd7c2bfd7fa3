"""Collectives over an abstract transport (docs/design.md §9, docs/collective.md): ring all-reduce
(reduce-scatter + all-gather) of float32 buffers with compressed chunks — naive or partial-sum-aware
re-quantization — and the one-shot all-gather baseline; an in-process transport for tests and many
ranks. The PyTorch DDP hook is `mrc.collective.ddp` (imports torch lazily; this package never does).

    results = run_inproc(4, lambda t: allreduce(t, buffers[t.rank], Config("eden-unbiased", 2, "aware")))
"""

from .ring import ALGORITHMS, COMPRESSIONS, PARTIAL_SUMS, Config, Result, allreduce, chunk_bounds, vnmse
from .transport import InProcHub, InProcTransport, Transport, TransportError, run_inproc

__all__ = [
    "ALGORITHMS", "COMPRESSIONS", "PARTIAL_SUMS", "Config", "InProcHub", "InProcTransport", "Result",
    "Transport", "TransportError", "allreduce", "chunk_bounds", "run_inproc", "vnmse",
]
