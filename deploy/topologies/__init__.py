"""The example topology and cluster files, shipped as package data of `mrc._topologies`: the same lookup
(`mrc.topology.default_topology_dir`) works from an editable checkout and from a wheel."""
