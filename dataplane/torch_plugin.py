"""The `torch.backends` entry point of the package (pyproject.toml): torch calls `autoload` at the end of
`import torch` (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0), and it registers the `mrc` torch.distributed
backend (mrc.dataplane.torch_backend, docs/collective.md "torch.distributed backend").

A module of its own, importing nothing at the top: when the program imported
`mrc.dataplane.torch_backend` first, torch's import (from inside it) calls this while that module is still
being initialised; importing it again here then returns the unfinished module without error, and it
registers the backend itself when it finishes. A problem is a warning: mrc never makes `import torch` fail.
"""

from __future__ import annotations

import warnings


def autoload() -> None:
    try:
        import mrc.dataplane.torch_backend  # noqa: F401  (registers the backend on import)
    except Exception as e:
        warnings.warn(f"mrc: torch.distributed backend 'mrc' not registered: {e}", stacklevel=2)


__all__ = ["autoload"]
