"""eBPF C sources (BCC dialect), shipped as package data of `mrc._bpf`; see mrc.dataplane.sources."""
