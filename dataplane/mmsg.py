"""sendmmsg / recvmmsg through ctypes: many UDP datagrams per system call, with the control messages the
socket driver reads (IPV6_TCLASS -> ECN, IPV6_PKTINFO -> the interface a datagram arrived on).

Python's socket module has no sendmmsg/recvmmsg. Here each batch is a fixed set of preallocated memory
regions (`bytearray`s whose addresses ctypes gives us): the `struct mmsghdr` array, the iovecs, one data
slot per datagram, and (receive) one control buffer and one source address per datagram. The headers
are read and written with `struct` at fixed offsets, never through ctypes structure attributes, so the
Python work per datagram is a slice copy and one or two `struct` calls; the system call is one per batch.

Linux, 64-bit (LP64) only: `available()` says whether this process can use it. Layouts (LP64):

* ``struct msghdr`` (56 bytes): msg_name @0, msg_namelen @8, msg_iov @16, msg_iovlen @24, msg_control @32,
  msg_controllen @40, msg_flags @48; ``struct mmsghdr`` adds msg_len @56 (64 bytes);
* ``struct iovec`` (16): iov_base @0, iov_len @8; ``struct sockaddr_in6`` (28): family, port, flowinfo,
  address @8, scope id @24; ``struct cmsghdr`` (16): cmsg_len (size_t), cmsg_level, cmsg_type, data @16.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import struct
import sys
from typing import Any, Final

MSG_DONTWAIT: Final = 0x40
IPV6_PKTINFO: Final = 50
HDR: Final = 64
IOV: Final = 16
SIN6: Final = 28
#: control space per received datagram: IPV6_TCLASS (int) + IPV6_PKTINFO (struct in6_pktinfo)
CTL: Final = socket.CMSG_SPACE(4) + socket.CMSG_SPACE(20)
BUFSIZE: Final = 9216

_HDR_FMT: Final = "=QI4xQQQQi4xI4x"  # one struct mmsghdr
_CMSG = struct.Struct("=Qii")
_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
_I32 = struct.Struct("=i")
_TCLASS: Final = socket.IPV6_TCLASS
_IPPROTO_IPV6: Final = socket.IPPROTO_IPV6

_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        for name in ("sendmmsg", "recvmmsg"):
            f = getattr(lib, name)
            f.restype = ctypes.c_int
        lib.sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
        lib.recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
        _libc = lib
    return _libc


def available() -> bool:
    """sendmmsg/recvmmsg usable here: Linux, LP64, a libc that has both."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    try:
        _lib()
    except (OSError, AttributeError):
        return False
    return True


def _region(n: int) -> tuple[bytearray, int, Any]:
    """A zeroed bytearray of `n` bytes, its address, and the ctypes view that keeps the export alive
    (the bytearray can then never be resized: every write into it is a same-length slice copy)."""
    ba = bytearray(n)
    view = (ctypes.c_char * n).from_buffer(ba)
    return ba, ctypes.addressof(view), view


def _raise(what: str) -> None:
    e = ctypes.get_errno()
    raise OSError(e, f"{what}: {os.strerror(e)}")


def sockaddr_in6(addr: bytes, port: int) -> bytes:
    """The 28 bytes of a `struct sockaddr_in6` for the 16-byte address `addr` and `port`."""
    return struct.pack("=HHI16sI", socket.AF_INET6, socket.htons(port), 0, addr, 0)


class SendBatch:
    """Up to `capacity` datagrams per sendmmsg. `load(j, data, name)` copies one datagram into slot `j`
    (to the destination whose sockaddr `name(addr, port)` gave), `send(fd, start, count)` sends slots
    start..start+count-1 and returns how many the kernel took (OSError on an error before the first,
    BlockingIOError when the socket buffer is full and the socket is non-blocking)."""

    def __init__(self, capacity: int = 64, bufsize: int = BUFSIZE) -> None:
        self.capacity = capacity
        self.bufsize = bufsize
        self.data, dbase, self._keep_d = _region(capacity * bufsize)
        self.iov, ibase, self._keep_i = _region(capacity * IOV)
        self.hdrs, self.hbase, self._keep_h = _region(capacity * HDR)
        for j in range(capacity):
            struct.pack_into("=QQ", self.iov, j * IOV, dbase + j * bufsize, 0)
            struct.pack_into(_HDR_FMT, self.hdrs, j * HDR, 0, SIN6, ibase + j * IOV, 1, 0, 0, 0, 0)
        self._names: dict[tuple[bytes, int], tuple[int, Any]] = {}
        self._send = _lib().sendmmsg

    def name(self, addr: bytes, port: int) -> int:
        """The address of a (cached) sockaddr_in6 for (addr, port)."""
        k = (addr, port)
        v = self._names.get(k)
        if v is None:
            if len(self._names) >= 4096:
                self._names.clear()  # the slots loaded since refer to live buffers only through `v`
            buf = ctypes.create_string_buffer(sockaddr_in6(addr, port), SIN6)
            v = self._names[k] = (ctypes.addressof(buf), buf)
        return v[0]

    def load(self, j: int, data: bytes | bytearray | memoryview, name: int) -> None:
        n = len(data)
        if n > self.bufsize:
            raise ValueError(f"datagram of {n} bytes exceeds the batch slot ({self.bufsize})")
        off = j * self.bufsize
        self.data[off:off + n] = data
        _U64.pack_into(self.iov, j * IOV + 8, n)
        _U64.pack_into(self.hdrs, j * HDR, name)

    def send(self, fd: int, start: int, count: int, flags: int = 0) -> int:
        r = int(self._send(fd, self.hbase + start * HDR, count, flags))
        if r < 0:
            _raise("sendmmsg")
        return r


class RecvBatch:
    """Up to `capacity` datagrams per recvmmsg (non-blocking), each with its source address, traffic
    class and arrival interface. After `recv(fd)` returned k, `datagram(j)` for j < k gives slot j."""

    def __init__(self, capacity: int = 64, bufsize: int = BUFSIZE, control: bool = True) -> None:
        self.capacity = capacity
        self.bufsize = bufsize
        self.data, dbase, self._keep_d = _region(capacity * bufsize)
        ctl = CTL if control else 0
        self.ctl, cbase, self._keep_c = _region(max(1, capacity * ctl))
        self.names, nbase, self._keep_n = _region(capacity * SIN6)
        self.iov, ibase, self._keep_i = _region(capacity * IOV)
        self.hdrs, self.hbase, self._keep_h = _region(capacity * HDR)
        for j in range(capacity):
            struct.pack_into("=QQ", self.iov, j * IOV, dbase + j * bufsize, bufsize)
            struct.pack_into(_HDR_FMT, self.hdrs, j * HDR, nbase + j * SIN6, SIN6, ibase + j * IOV, 1,
                             cbase + j * ctl if ctl else 0, ctl, 0, 0)
        # the kernel overwrites msg_namelen / msg_controllen / msg_len: one copy restores all of them
        self._pristine = bytes(self.hdrs)
        self.dview = memoryview(self.data)
        self.nview = memoryview(self.names)
        self._recv = _lib().recvmmsg

    def recv(self, fd: int, count: int | None = None, flags: int = MSG_DONTWAIT) -> int:
        """Datagrams received (0 when none is waiting, EAGAIN / EINTR); OSError on other errors."""
        self.hdrs[:] = self._pristine
        r = int(self._recv(fd, self.hbase, self.capacity if count is None else min(count, self.capacity),
                           flags, None))
        if r < 0:
            if ctypes.get_errno() in (errno.EAGAIN, errno.EINTR):
                return 0
            _raise("recvmmsg")
        return r

    def arrays(self) -> tuple[Any, Any, Any, Any, Any]:
        """numpy views of the batch (no copies): the data slots (capacity x bufsize), the sources
        (capacity x 16), and the headers and control buffers as flat bytes (for `parse_controls`)."""
        import numpy as np

        data = np.frombuffer(self.data, dtype=np.uint8).reshape(self.capacity, self.bufsize)
        names = np.frombuffer(self.names, dtype=np.uint8).reshape(self.capacity, SIN6)[:, 8:24]
        return (data, names, np.frombuffer(self.hdrs, dtype=np.uint8),
                np.frombuffer(self.ctl, dtype=np.uint8), CTL)

    def length(self, j: int) -> int:
        return int(_U32.unpack_from(self.hdrs, j * HDR + 56)[0])

    def payload(self, j: int) -> bytes:
        off = j * self.bufsize
        return bytes(self.dview[off:off + self.length(j)])

    def source(self, j: int) -> bytes:
        """The 16-byte source address of slot j."""
        off = j * SIN6 + 8
        return bytes(self.nview[off:off + 16])

    def control(self, j: int) -> tuple[int, int]:
        """(traffic class or -1, arrival ifindex or 0) of slot j, from its IPV6_TCLASS / IPV6_PKTINFO."""
        tclass = -1
        ifindex = 0
        clen = int(_U64.unpack_from(self.hdrs, j * HDR + 40)[0])
        base = j * CTL
        off = 0
        ctl = self.ctl
        while off + 16 <= clen:
            n, level, kind = _CMSG.unpack_from(ctl, base + off)
            if n < 16:
                break
            if level == _IPPROTO_IPV6:
                if kind == _TCLASS and n >= 20:
                    tclass = _I32.unpack_from(ctl, base + off + 16)[0]
                elif kind == IPV6_PKTINFO and n >= 36:
                    ifindex = _U32.unpack_from(ctl, base + off + 32)[0]
            off += (n + 7) & ~7
        return tclass, ifindex


_parse: Any = None


def parse_controls(kernel: str | None = None) -> Any:
    """A kernel `parse(hdrs, ctl, k, ctl_size, port_of_ifindex, lens, ecn, ports) -> CE count`: for the
    first k slots of a received batch, the datagram's length, whether its traffic class says ECN-CE and
    the plane port of its arrival interface (`port_of_ifindex[ifindex]`, 0 for one beyond the table), as
    `RecvBatch.control` reads them, without a Python call per datagram. The engine's batch receive's
    kind (`rxbatch.KERNEL`, or `kernel`): `_fastc.rx_parse` in C, else this numba one, compiled on first
    use (numba is imported only where it is the kernel)."""
    from mrc.transport import fastpath, rxbatch

    if (kernel if kernel is not None else rxbatch.KERNEL) == "c":
        c = fastpath._compiled()
        assert c is not None
        return c.rx_parse
    global _parse
    if _parse is None:
        import numpy as np
        from numba import njit

        @njit(nogil=True, cache=True)
        def parse(hdrs: Any, ctl: Any, k: int, csize: int, table: Any, lens: Any, ecn: Any,
                  ports: Any) -> int:
            ce = 0
            for j in range(k):
                h = j * 64
                n = np.int64(0)
                for b in range(4):
                    n |= np.int64(hdrs[h + 56 + b]) << (8 * b)
                clen = np.int64(0)
                for b in range(8):
                    clen |= np.int64(hdrs[h + 40 + b]) << (8 * b)
                lens[j] = n
                tclass = np.int64(-1)
                ifindex: Any = np.int64(0)
                base = j * csize
                off: Any = 0
                while off + 16 <= clen and base + off + 16 <= ctl.shape[0]:
                    ln = np.int64(0)
                    for b in range(8):
                        ln |= np.int64(ctl[base + off + b]) << (8 * b)
                    if ln < 16:
                        break
                    level = np.int64(ctl[base + off + 8]) | (np.int64(ctl[base + off + 9]) << 8)
                    kind = np.int64(ctl[base + off + 12]) | (np.int64(ctl[base + off + 13]) << 8)
                    if level == 41:  # IPPROTO_IPV6
                        if kind == 67 and ln >= 20:  # IPV6_TCLASS
                            tclass = np.int64(ctl[base + off + 16]) | (np.int64(ctl[base + off + 17]) << 8)
                        elif kind == 50 and ln >= 36:  # IPV6_PKTINFO: in6_pktinfo's ifindex
                            ifindex = 0
                            for b in range(4):
                                ifindex |= np.int64(ctl[base + off + 32 + b]) << (8 * b)
                    off += (ln + 7) & ~7
                e = tclass >= 0 and (tclass & 3) == 3
                ecn[j] = e
                if e:
                    ce += 1
                ports[j] = table[ifindex] if ifindex < table.shape[0] else 0
            return ce

        _parse = parse
    return _parse


assert socket.IPPROTO_IPV6 == 41 and socket.IPV6_TCLASS == 67 and IPV6_PKTINFO == 50
