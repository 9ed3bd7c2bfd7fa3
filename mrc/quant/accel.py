"""Which implementation runs the codec's hot path: the numba kernels (kernels.py) or the numpy
reference (rht.py, eden.py, bitpack.py). Both write and read the same wire format.

The environment variable MRC_QUANT_KERNELS is read once, when this module is first imported:

* ``numba``: the kernels (an error at first use if numba cannot be imported);
* ``numpy``: the numpy reference;
* unset or empty: numba when it can be imported, else numpy.

Every rank of a collective must run the same path to get bit-identical results (the two paths round
differently); ranks started from one environment do. `encode` / `decode` also take an explicit
``backend="numba"|"numpy"`` (tests compare the two in one process).
"""

from __future__ import annotations

import os
import warnings
from functools import cache
from types import ModuleType

ENV = "MRC_QUANT_KERNELS"
BACKENDS = ("numba", "numpy")


def _requested() -> str:
    value = os.environ.get(ENV, "").strip().lower()
    if value and value not in BACKENDS:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(BACKENDS)} (or unset)")
    return value or "auto"


REQUESTED = _requested()


@cache
def _load_numba(required: bool) -> ModuleType | None:
    try:
        from . import kernels
    except ImportError:
        if required:
            raise
        return None
    except Exception as e:  # numba present but broken (llvmlite, ...): say so, use numpy
        if required:
            raise
        warnings.warn(f"mrc.quant: numba kernels unavailable ({e!r}); using numpy", RuntimeWarning,
                      stacklevel=2)
        return None
    return kernels


def kernels(backend: str | None = None) -> ModuleType | None:
    """The kernels module for `backend` ('numba'), None for 'numpy'; None as `backend` means the
    process default chosen by MRC_QUANT_KERNELS."""
    if backend is None:
        if REQUESTED == "numpy":
            return None
        return _load_numba(REQUESTED == "numba")
    if backend == "numpy":
        return None
    if backend == "numba":
        return _load_numba(True)
    raise ValueError(f"unknown quant backend {backend!r} (expected one of {', '.join(BACKENDS)})")


def active(backend: str | None = None) -> str:
    """'numba' or 'numpy': the path `backend` (None: the process default) resolves to."""
    return "numpy" if kernels(backend) is None else "numba"


def prime(bits: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0)) -> str:
    """Compile (or load from numba's on-disk cache) the kernels the codec uses for float32 at these bit
    budgets, in this process; returns the active path. Launchers call it once before starting rank
    processes: ranks that all compile the same kernels at once on an empty cache spend tens of seconds
    (7 s of CPU each) competing for the cores, while ranks started after a primed cache load it in
    ~0.2 s. A no-op for the numpy path."""
    if kernels() is None:
        return "numpy"
    import numpy as np

    from .codec import decode, encode

    x = np.linspace(-1.0, 1.0, 4096, dtype=np.float32)
    for b in bits:
        decode(encode(x, "eden-unbiased", b, seed=1))
    return "numba"
