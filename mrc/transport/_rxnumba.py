"""rxbatch.py's kernel in numba (``MRC_RX_KERNEL=numba``, or where mrc/transport/_fastc.c is not built):
the same checks and state row as `_fastc.rx_run`, which is the default. Imported only when used: numba
and its compiler cost a process ~120 MB of memory, and a fresh checkout seconds of compiling.

The ICRC is ISA-L's CRC-32 from python-isal's own library and the placement libc's memcpy, both called
by address (`rxbatch.FNS`, through the `_call3` intrinsic): an address passed in keeps the kernel in
numba's cache, where a ctypes global would make every process compile it (~2.4 s)."""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit
from numba.extending import intrinsic

from .rxbatch import (
    CTX,
    DONE,
    FNS,
    FULL,
    OTHER_QP,
    PURE,
    S_COAL,
    S_CUM,
    S_ECN,
    S_END,
    S_EV,
    S_FLAGS,
    S_LAST,
    S_LEV,
    S_LPORT,
    S_LPSN,
    S_LTS,
    S_MDONE,
    S_MLEN,
    S_MRADDR,
    S_MRLEN,
    S_MSN,
    S_NEED_EV,
    S_NEED_MSN,
    S_NEED_RKEY,
    S_OFF,
    S_PORT,
    S_PSN,
    S_QPN,
    S_RKEY,
    S_RXB,
    S_RXP,
    S_TS,
    S_UNACK,
    S_WD,
    SACK,
    ST_LEN,
)


def _intrinsic(fn: Any) -> Any:
    """numba's `intrinsic`, typed Any: called from jitted code without the typing context argument."""
    return intrinsic(fn)


@_intrinsic
def _call3(typingctx: Any, fn: Any, a: Any, b: Any, c: Any) -> Any:
    """Call the C function at address `fn` with (uint32, uint64, uint64) or (uint64, uint64, uint64)
    arguments, returning the first argument's type (ISA-L's crc32_gzip_refl; libc's memcpy)."""
    sig = a(fn, a, b, c)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        f, x, y, z = args
        fnty = ir.FunctionType(x.type, [x.type, y.type, z.type])
        return builder.call(builder.inttoptr(f, fnty.as_pointer()), [x, y, z])

    return sig, codegen


@njit(nogil=True)
def _u16(a: Any, o: int) -> Any:
    return (np.int64(a[o]) << 8) | np.int64(a[o + 1])

@njit(nogil=True)
def _u32(a: Any, o: int) -> Any:
    return ((np.int64(a[o]) << 24) | (np.int64(a[o + 1]) << 16) | (np.int64(a[o + 2]) << 8)
            | np.int64(a[o + 3]))

@njit(nogil=True, cache=True)
def _kernel(data: Any, lens: Any, ecn: Any, ports: Any, srcs: Any, peer: Any, j: int, k: int,
         st: Any, words: Any, mr: Any, starts: Any, fns: Any) -> tuple[int, int]:
    """Take packets j, j+1, ... < k for the QP of st[S_QPN] in fastpath.receive's order of checks;
    returns (what stopped it, the index where it stopped)."""
    nbits = words.shape[0] * 64
    while j < k:
        n = lens[j]
        row = data[j]
        if n < 56 or n > row.shape[0] or row[0] != 0x0A:
            return (OTHER_QP if n >= 56 and n <= row.shape[0] else PURE), j
        if ((np.int64(row[5]) << 16) | (np.int64(row[6]) << 8) | np.int64(row[7])) != st[S_QPN]:
            return OTHER_QP, j
        if srcs.shape[0]:
            for b in range(16):
                if srcs[j, b] != peer[b]:
                    return PURE, j
        b1 = np.int64(row[1])
        qw = _u32(row, 4)
        pw = _u32(row, 8)
        va = (_u32(row, 12) << 32) | _u32(row, 16)
        rkey = _u32(row, 20)
        dlen = _u32(row, 24)
        ver = np.int64(row[28])
        flags = np.int64(row[29])
        ev = _u16(row, 30)
        msn = _u32(row, 32)
        mlen = _u32(row, 36)
        moff = _u32(row, 40)
        if (b1 & 0x0F or _u16(row, 2) & 0x7FFF != 0x7FFF or qw > 0xFFFFFF or ver != 1 or flags & 0x01
                or dlen > 8192 or ev > 0x3FFF):
            return PURE, j
        pad = (b1 >> 4) & 3
        end = 52 + dlen + pad
        if (dlen + pad) & 3 or n != end + 4 or moff + dlen > mlen:
            return PURE, j
        if end != st[S_END] or rkey != st[S_RKEY] or msn != st[S_MSN] or starts[ev & 0x3FFF] < 0:
            st[S_NEED_RKEY] = rkey
            st[S_NEED_MSN] = msn
            st[S_NEED_EV] = ev
            st[S_END] = end
            return CTX, j
        crc = _call3(fns[0], np.uint32(starts[ev & 0x3FFF]), np.uint64(row.ctypes.data), np.uint64(n))
        if crc != 0x2144DF1C:
            return PURE, j
        psn = pw & 0xFFFFFF
        d = (psn - st[S_CUM]) & 0xFFFFFF
        if d >= 0x800000 or d >= st[S_WD]:
            return PURE, j
        i = st[S_OFF] + d
        if i >= nbits:
            return FULL, j
        w = i >> 6
        bit = np.uint64(1) << np.uint64(i & 63)
        off = va - st[S_MRADDR]
        if words[w] & bit or off < 0 or off + dlen > st[S_MRLEN] or st[S_MDONE] + dlen >= st[S_MLEN]:
            return PURE, j
        # ---- placement and accounting (fastpath.receive's)
        _call3(fns[1], np.uint64(mr.ctypes.data + off), np.uint64(row.ctypes.data + 52), np.uint64(dlen))
        words[w] |= bit
        if d == 0:
            t = i
            while t < nbits and words[t >> 6] & (np.uint64(1) << np.uint64(t & 63)):
                t += 1
            st[S_CUM] = (st[S_CUM] + t - i) & 0xFFFFFF
            st[S_OFF] = t
        st[S_RXP] += 1
        st[S_RXB] += dlen
        st[S_MDONE] += dlen
        e = ecn[j]
        if e:
            st[S_ECN] += 1
        ts = (_u32(row, 44) << 32) | _u32(row, 48)
        port = ports[j]
        j += 1
        u = st[S_UNACK] + 1
        if e or pw & 0x80000000 or u >= st[S_COAL] or flags & 0x12:
            st[S_PSN] = psn
            st[S_EV] = ev
            st[S_TS] = ts
            st[S_FLAGS] = flags
            st[S_PORT] = port
            return SACK, j
        st[S_UNACK] = u
        st[S_LPSN] = psn
        st[S_LEV] = ev
        st[S_LTS] = ts
        st[S_LPORT] = port
        st[S_LAST] = 1
    return DONE, j


def run(data: Any, lens: Any, ecn: Any, ports: Any, srcs: Any, peer: Any, j: int, k: int, st: Any, words: Any,
        mr: Any, starts: Any) -> tuple[int, int]:
    """`_fastc.rx_run`'s call: the kernel with the addresses of its callees."""
    why, j = _kernel(data, lens, ecn, ports, srcs, peer, j, k, st, words, mr, starts, FNS)
    return int(why), int(j)


_EMPTY = np.zeros(0, dtype=np.uint8)


def warm() -> None:
    """Compile (or load from numba's cache) the kernel for the array kinds drivers pass, so that the
    first batch does not wait for it: sources as a C array (or none), and as a strided view of
    recvmmsg's sockaddr_in6 slots."""
    st = np.zeros(ST_LEN, dtype=np.int64)
    one = np.zeros(1, dtype=np.int64)
    args = (np.zeros((1, 64), dtype=np.uint8), one, np.zeros(1, dtype=np.bool_), one)
    for srcs in (np.zeros((0, 16), dtype=np.uint8), np.zeros((1, 28), dtype=np.uint8)[:, 8:24]):
        run(*args, srcs, np.zeros(16, dtype=np.uint8), 0, 0, st, np.zeros(1, dtype=np.uint64), _EMPTY,
            np.zeros(1, dtype=np.int64))
