"""mrc: a Linux prototype of the MRC (Multipath Reliable Connection) transport.

Pure-Python core. `mrc.wire` (packet formats), and later `mrc.transport`, `mrc.quant`,
`mrc.collective` and `mrc.sim` never touch the kernel; `mrc.dataplane` (the `dataplane/`
folder) and `mrc.ctl` (`ctl/`) do. Imports only flow `mrc.ctl -> mrc.dataplane -> mrc.*`.
"""

__version__ = "0.2.0.dev0"  # 0.1.0 = tag v0.1.0 (455353a); CHANGELOG.md "Unreleased" since
