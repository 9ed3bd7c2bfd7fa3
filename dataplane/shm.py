"""Shared memory one process hands another: memfds sealed against shrinking.

A process that maps a file takes SIGBUS, and dies, when it touches a page past the file's end. If the
process that created a memfd could still shrink it (`ftruncate`) after handing it over, it could kill
every process that mapped it, at will: one mrc client could end mrcd for all the others (reproduced:
register a region, truncate the memfd to 0, post a send from it), and one rank the co-located rank that
writes into its receive area. So the creator seals the memfd (F_SEAL_SHRINK, then F_SEAL_SEAL so that no
seal can be added or removed later) before it passes the descriptor, and the receiver checks the seals
and the size before it maps anything (`map_received`). Growing the file stays allowed: pages past the
mapping's end are never touched. The seals are the kernel's own guarantee (memfd_create(2), fcntl(2)
"File Sealing"); the same as Wayland compositors ask of their clients' buffers.

Registration also pins, as `ibv_reg_mr` does: the creator allocates every page of a region when it makes
it (MADV_POPULATE_WRITE, charged to the creator), and the receiver fills in its page tables for all of
them when it maps the region (MAP_POPULATE), so the data path takes no page faults. Without it the
receiving mrcd took one minor fault per 4 KiB page it wrote (262,144 for a 1 GiB WRITE) inside its
placement copy. The receiver populates only a memfd whose pages all exist already (st_blocks): on a
sparse one, populating would allocate the sender's memory in the receiver (and charge it there), so
that one is mapped as it is and faults on first touch. Populating runs inside mrcd's one loop (~0.1 s
per GiB), so a region larger than `MAX_POPULATE_BYTES` is mapped as it is too: one client's huge
registration must not stall everyone's timers. ``MRC_MR_POPULATE=0`` (read at import) turns
both off, for side-by-side runs.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from typing import Final

from mrc.errors import MrcError

#: the seals a region's memfd must carry (F_SEAL_SHRINK) and the one that freezes them (F_SEAL_SEAL)
SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
#: madvise(2) advice (Linux 5.14): fault every page of the range in, writable; not in Python 3.11's mmap
MADV_POPULATE_WRITE: Final = getattr(mmap, "MADV_POPULATE_WRITE", 23)
#: the largest region whose page tables the receiver fills at registration (~0.1 s of its loop)
MAX_POPULATE_BYTES: Final = 1 << 30
#: False when MRC_MR_POPULATE=0: regions are neither allocated up front nor their page tables filled
POPULATE: bool = os.environ.get("MRC_MR_POPULATE", "1").strip() != "0"


def populate(buf: mmap.mmap) -> bool:
    """Allocate and map every page of a shared writable mapping now (MADV_POPULATE_WRITE); False where the
    kernel has no such advice (before 5.14), and the pages come on first touch as before."""
    if not POPULATE:
        return False
    try:
        buf.madvise(MADV_POPULATE_WRITE)
    except OSError:
        return False
    return True


def fully_allocated(fd: int, length: int) -> bool:
    """Whether every page of the first `length` bytes of `fd` exists (st_blocks counts 512-byte units)."""
    return os.fstat(fd).st_blocks * 512 >= length


def create(name: str, size: int) -> tuple[int, mmap.mmap]:
    """A new memfd of `size` bytes, sealed against shrinking, every page allocated (module doc), and a
    shared writable mapping of it. The caller owns the descriptor (close it when the peer has it, or keep
    it)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        buf = mmap.mmap(fd, size)
        populate(buf)
        return fd, buf
    except BaseException:
        os.close(fd)
        raise


def map_received(fd: int, length: int, what: str) -> mmap.mmap:
    """Map the first `length` bytes of a descriptor another process sent, shared and writable, after
    checking that it is a memfd sealed against shrinking and at least that long; any other descriptor is
    an MrcError that starts with `what` and says what to do instead. Its page tables are filled in now
    when all its pages exist (module doc). The descriptor stays the caller's."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as e:  # EINVAL: a file that cannot be sealed (a regular file, a pipe, a socket)
        raise MrcError(f"{what}: the descriptor is not a sealable memfd ({e.strerror}); create the region "
                       f"with memfd_create(MFD_ALLOW_SEALING) and seal it with F_SEAL_SHRINK") from None
    if not seals & fcntl.F_SEAL_SHRINK:
        raise MrcError(f"{what}: the memfd is not sealed against shrinking: add F_SEAL_SHRINK "
                       f"(fcntl F_ADD_SEALS) before passing it (a memfd that can be truncated under a "
                       f"mapping kills the process that touches it)")
    if length <= 0:
        raise MrcError(f"{what}: length {length} must be positive")
    size = os.fstat(fd).st_size
    if length > size:
        raise MrcError(f"{what}: length {length} is more than the memfd's {size} bytes")
    flags = mmap.MAP_SHARED | (
        mmap.MAP_POPULATE if POPULATE and length <= MAX_POPULATE_BYTES and fully_allocated(fd, length) else 0)
    try:
        return mmap.mmap(fd, length, flags=flags)
    except (OSError, ValueError) as e:  # e.g. F_SEAL_WRITE: a region must be writable
        raise MrcError(f"{what}: cannot map the memfd shared and writable: {e}") from None
