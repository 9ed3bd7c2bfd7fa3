"""Two real engines joined by their socket drivers over ::1 (dataplane/lopair.py): every send path of the
driver (a sendto per datagram, batch I/O, the send ring; paced and unpaced) carries a WRITE intact
through the kernel's UDP stack, also when a small receive buffer drops most of each burst. The testbed
tests (tests/netns) run the same drivers inside mrcds, where the kernel has SRv6; these need neither."""

from __future__ import annotations

import socket

import pytest

from mrc.dataplane import lopair, mmsg

pytestmark = pytest.mark.skipif(not mmsg.available() or not socket.has_ipv6, reason="needs Linux LP64, IPv6")

#: (batch_io, tx_ring) of the sending driver
MODES = {"sendto": (False, False), "batch": (True, False), "ring": (False, True), "ring+batch": (True, True)}


@pytest.mark.parametrize("rate_bps", [0, 2_000_000_000], ids=["unpaced", "paced"])
@pytest.mark.parametrize("mode", list(MODES))
def test_every_send_path_moves_a_write_intact(mode: str, rate_bps: int) -> None:
    batch_io, tx_ring = MODES[mode]
    r = lopair.run(lopair.PairConfig(size=4 << 20, rate_bps=rate_bps, batch_io=batch_io, tx_ring=tx_ring))
    assert r["ok"], r
    assert r["driver"]["tx_ring"] == int(tx_ring) and r["driver"]["batch_io"] == int(batch_io)
    assert r["driver"]["send_errors"] == 0
    assert r["driver"]["tx_datagrams"] >= r["tx_packets"]  # every data packet left through the socket
    if rate_bps:
        assert r["driver"]["paced"] > 0  # the buckets held some back


@pytest.mark.parametrize("mode", ["sendto", "ring"])
def test_losses_from_a_full_receive_buffer_are_recovered(mode: str) -> None:
    """A 64 KiB receive buffer holds a few 8 KiB datagrams of each unpaced burst; the rest is dropped
    by the kernel, as a congested fabric would, and recovered by the engine."""
    batch_io, tx_ring = MODES[mode]
    r = lopair.run(lopair.PairConfig(size=2 << 20, rcvbuf=64 << 10, batch_io=batch_io, tx_ring=tx_ring))
    assert r["ok"], r
    assert r["retx"] > 0 and r["qp"]["data_retx_bytes"] > 0
    assert r["driver"]["send_errors"] == 0
