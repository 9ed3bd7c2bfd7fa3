"""Build script for the compiled parts of mrc: the engine's fast path in C (mrc/transport/_fastc.c) and
the packet simulator's event loop in C (mrc/sim/_simc.c).

Everything else is declared in pyproject.toml. Both extensions are optional: where they do not build (no
C compiler or no Python headers: apt-get install gcc python3-dev), mrc installs and runs the same code in
Python (mrc/transport/fastpath.py, `Fabric._run_fast` in mrc/sim/fabric.py), with identical results,
only slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mrc.transport._fastc",
            ["mrc/transport/_fastc.c"],
            depends=["mrc/_cint.h"],
            optional=True,
            extra_compile_args=["-O2", "-Wall"],
        ),
        Extension(
            "mrc.sim._simc",
            ["mrc/sim/_simc.c", "mrc/sim/_roce.c"],
            depends=["mrc/sim/_roce.h", "mrc/_cint.h"],
            optional=True,
            # no FMA contraction: the RoCE model's DCTCP update must round as Python's floats do
            extra_compile_args=["-O2", "-Wall", "-ffp-contract=off"],
        ),
    ]
)
