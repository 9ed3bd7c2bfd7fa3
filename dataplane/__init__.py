"""mrc.dataplane: everything that touches the kernel (BCC, pyroute2 netlink, sockets).

Lives in the `dataplane/` folder and imports as `mrc.dataplane` (docs/design.md §2). Nothing outside this
package imports bcc or pyroute2; bcc is imported lazily so the rest of mrc works without it.
"""

from .sources import bpf_include_dir, bpf_source

__all__ = ["bpf_include_dir", "bpf_source"]
