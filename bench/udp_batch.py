"""Per-datagram cost of the socket calls the MRC socket driver could use (docs/daemon.md, "The socket
driver"): sendto vs sendmmsg (ctypes, batches of 32) and recvmsg_into vs recvmmsg (+ the copy out), with
4164-byte datagrams (a 4 KiB WRITE) on ::1. Prints one line; no root needed.

    .venv/bin/python bench/udp_batch.py [--count 20000]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import socket
import time
from typing import Any

SIZE = 4164
BATCH = 32
MSG_DONTWAIT = 0x40


class IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class MsgHdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.POINTER(IoVec)), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", MsgHdr), ("msg_len", ctypes.c_uint)]


def _vectors(bufs: list[Any], size: int) -> tuple[Any, Any]:
    iovs = (IoVec * len(bufs))(*[IoVec(ctypes.addressof(b), size) for b in bufs])
    msgs = (MMsgHdr * len(bufs))()
    for j in range(len(bufs)):
        msgs[j].msg_hdr.msg_iov = ctypes.pointer(iovs[j])
        msgs[j].msg_hdr.msg_iovlen = 1
    return iovs, msgs


def _drain(rx: socket.socket) -> None:
    rx.setblocking(False)
    try:
        while True:
            rx.recv(9216)
    except BlockingIOError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=20000)
    n = ap.parse_args().count // BATCH * BATCH
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    rx.bind(("::1", 0))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    tx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
    dst = rx.getsockname()[:2]
    pkts = [bytearray(os.urandom(SIZE)) for _ in range(BATCH)]

    t0 = time.perf_counter_ns()
    for _ in range(n // BATCH):
        for p in pkts:
            tx.sendto(p, dst)
    send_one = (time.perf_counter_ns() - t0) / n
    _drain(rx)

    tx.connect(dst)
    bufs = [(ctypes.c_char * SIZE).from_buffer(p) for p in pkts]
    _iovs, msgs = _vectors(bufs, SIZE)
    t0 = time.perf_counter_ns()
    for _ in range(n // BATCH):
        libc.sendmmsg(tx.fileno(), msgs, BATCH, 0)
    send_batch = (time.perf_counter_ns() - t0) / n

    def fill() -> None:
        _drain(rx)
        for _ in range(n // BATCH):
            for p in pkts:
                tx.send(p)

    fill()
    buf = bytearray(9216)
    rx.setblocking(False)
    got_one = 0
    t0 = time.perf_counter_ns()
    try:
        while True:
            rx.recvmsg_into([buf], 64)
            got_one += 1
    except BlockingIOError:
        pass
    recv_one = (time.perf_counter_ns() - t0) / max(got_one, 1)

    fill()
    rbufs = [(ctypes.c_char * 9216)() for _ in range(BATCH)]
    _riovs, rmsgs = _vectors(rbufs, 9216)
    got_batch = 0
    t0 = time.perf_counter_ns()
    while True:
        k = libc.recvmmsg(rx.fileno(), rmsgs, BATCH, MSG_DONTWAIT, None)
        if k <= 0:
            break
        for j in range(k):
            ctypes.string_at(rbufs[j], rmsgs[j].msg_len)
        got_batch += k
    recv_batch = (time.perf_counter_ns() - t0) / max(got_batch, 1)
    print(f"{SIZE}-byte datagrams on ::1, per datagram: sendto {send_one / 1000:.2f} us, sendmmsg x{BATCH} "
          f"{send_batch / 1000:.2f} us; recvmsg_into {recv_one / 1000:.2f} us ({got_one} received), "
          f"recvmmsg x{BATCH} + copy {recv_batch / 1000:.2f} us ({got_batch} received)")


if __name__ == "__main__":
    main()
