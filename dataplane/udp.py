"""UDP sockets as MRC uses them (docs/design.md §3): port 4791, UDP checksum 0 both ways (UDP_NO_CHECK6_TX /
UDP_NO_CHECK6_RX; integrity comes from the ICRC), ECT(0) in the inner traffic class so that a CE mark
from the fabric survives decapsulation (RFC 6040, done by host_ingress), and the traffic class of each
datagram readable (IPV6_RECVTCLASS)."""

from __future__ import annotations

import socket
from typing import Final

from mrc.wire import ROCEV2_UDP_PORT

from . import netns

UDP_NO_CHECK6_TX: Final = 101
UDP_NO_CHECK6_RX: Final = 102
ECN_MASK: Final = 3
ECN_ECT0: Final = 2
ECN_CE: Final = 3


def mrc_socket(ns: str | None, addr: str, port: int = ROCEV2_UDP_PORT, *, ect: bool = True,
               rcvbuf: int = 8 << 20) -> socket.socket:
    """A UDP socket bound to `addr` (the host's MRC address) and `port`, in namespace `ns`."""
    if ns is None:
        sk = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    else:
        sk = netns.socket_in(ns, socket.AF_INET6, socket.SOCK_DGRAM)
    try:
        sk.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_TX, 1)
        sk.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
        sk.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
        if ect:
            sk.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, ECN_ECT0)
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sk.bind((addr, port))
    except BaseException:
        sk.close()
        raise
    return sk


def recv_with_tclass(sk: socket.socket, bufsize: int = 9216) -> tuple[bytes, tuple[str, int], int]:
    """One datagram, its source (address, port) and the traffic class it arrived with."""
    data, anc, _flags, addr = sk.recvmsg(bufsize, socket.CMSG_SPACE(4))
    tclass = 0
    for level, kind, value in anc:
        if level == socket.IPPROTO_IPV6 and kind == socket.IPV6_TCLASS and len(value) >= 4:
            tclass = int.from_bytes(value[:4], "little")
    return data, (addr[0], addr[1]), tclass
