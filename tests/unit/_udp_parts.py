"""A receiving UDP socket on ::1 for the socket driver's tests (test_driver.py, test_ringsend.py)."""

from __future__ import annotations

import socket

from mrc.dataplane.driver import IPV6_RECVPKTINFO


def rx_socket() -> socket.socket:
    """Bound to ::1 on a free port, an 8 MiB receive buffer, traffic class and arrival interface on."""
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.bind(("::1", 0))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVTCLASS, 1)
    s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
    return s
