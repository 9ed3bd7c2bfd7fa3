"""Shared memory handed between processes (`mrc.dataplane.shm`): a region's memfd must be sealed against
shrinking, because a process touching a mapped page past the file's end dies of SIGBUS (mrcd's side of
it: tests/unit/test_daemon_requests.py)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from mrc.dataplane import shm
from mrc.errors import MrcError


def _unsealed(size: int) -> int:
    fd = os.memfd_create("test-unsealed", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


def test_a_created_region_cannot_shrink_but_can_grow_and_maps_in_the_receiver() -> None:
    fd, buf = shm.create("test", 8192)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & shm.SEALS == shm.SEALS
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)  # the kernel refuses: a mapping can never lose its pages
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)  # F_SEAL_SEAL: seals are final
        os.ftruncate(fd, 3 * 4096)  # growing is harmless
        buf[:5] = b"hello"
        peer = shm.map_received(fd, 8192, "test")
        assert peer[:5] == b"hello"
        peer[8191] = 7
        assert buf[8191] == 7
        peer.close()
    finally:
        buf.close()
        os.close(fd)


@pytest.mark.parametrize("case, words", [
    ("unsealed", "not sealed against shrinking"),
    ("file", "not a sealable memfd"),
    ("pipe", "not a sealable memfd"),
    ("short", "is more than the memfd's 4096 bytes"),
    ("zero", "must be positive"),
    ("write_sealed", "cannot map the memfd shared and writable"),
])
def test_map_received_refuses_what_its_sender_could_pull_away_and_says_why(
    case: str, words: str, tmp_path: Path
) -> None:
    closers: list[int] = []
    length = 4096
    if case == "unsealed":
        fd = _unsealed(4096)
    elif case == "file":
        f = tmp_path / "region"
        f.write_bytes(bytes(4096))
        fd = os.open(f, os.O_RDWR)
    elif case == "pipe":
        fd, w = os.pipe()
        closers.append(w)
    elif case == "write_sealed":
        fd = os.memfd_create("test-ro", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 4096)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE)
    else:
        fd, buf = shm.create("test", 4096)
        buf.close()
        length = 8192 if case == "short" else 0
    closers.append(fd)
    try:
        with pytest.raises(MrcError, match="^reg_mr: .*" + words):
            shm.map_received(fd, length, "reg_mr")
    finally:
        for x in closers:
            os.close(x)


def _write_faults(buf: memoryview, pages: int) -> int:
    """Minor page faults this thread takes writing one byte into each of `pages` 4 KiB pages of `buf`."""
    import resource

    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for p in range(pages):
        buf[p * 4096] = 1
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def test_a_registered_region_is_pinned_as_ibv_reg_mr_pins_so_placement_takes_no_page_fault() -> None:
    """The receiving mrcd's placement copy took one fault per page written (262,144 for a 1 GiB WRITE,
    ~5 us per 8 KiB packet); the creator allocates every page and the receiver maps them all."""
    pages = 512
    fd, buf = shm.create("test", pages * 4096)
    try:
        if not shm.POPULATE:
            pytest.skip("MRC_MR_POPULATE=0 turns registration's pinning off")
        if not shm.populate(buf):
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14)")
        assert shm.fully_allocated(fd, pages * 4096)
        peer = shm.map_received(fd, pages * 4096, "test")
        view = memoryview(peer)
        try:
            assert _write_faults(view, pages) <= 8  # a few for the interpreter's own pages, not 512
        finally:
            view.release()
            peer.close()
    finally:
        buf.close()
        os.close(fd)


def test_a_sparse_region_is_mapped_without_allocating_the_senders_memory_in_the_receiver() -> None:
    """Populating a memfd whose pages do not exist would allocate them in (and charge them to) mrcd."""
    size = 64 << 20
    fd = os.memfd_create("test-sparse", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, shm.SEALS)
        assert not shm.fully_allocated(fd, size)
        peer = shm.map_received(fd, size, "test")
        try:
            assert os.fstat(fd).st_blocks == 0
            peer[size - 1] = 1  # still usable: the page comes on first touch
            assert os.fstat(fd).st_blocks * 512 == 4096
        finally:
            peer.close()
    finally:
        os.close(fd)
