"""Build script for the one compiled part of mrc: the engine's fast path in C (mrc/transport/_fastc.c).

Everything else is declared in pyproject.toml. The extension is optional: where it does not build (no C
compiler or no Python headers: apt-get install gcc python3-dev), mrc installs and runs the same fast
path in Python (mrc/transport/fastpath.py), with identical wire bytes, only slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mrc.transport._fastc",
            ["mrc/transport/_fastc.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall"],
        )
    ]
)
