"""mrc.ctl: the operator side (mrcctl CLI, and later the mrcd daemon, control socket, metrics).

Lives in the `ctl/` folder and imports as `mrc.ctl` (docs/design.md §2)."""
