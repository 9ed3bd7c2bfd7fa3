"""Two real engines joined by their socket drivers over ::1 (dataplane/lopair.py): every send path of the
driver (a sendto per datagram, batch I/O, the send ring; paced and unpaced) carries a WRITE intact
through the kernel's UDP stack, also when a small receive buffer drops most of each burst. The testbed
tests (tests/netns) run the same drivers inside mrcds, where the kernel has SRv6; these need neither."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

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


def test_the_default_drivers_carry_data_packets_without_numba() -> None:
    """With the C batch receive, batch I/O and the send ring are the drivers' defaults, and neither
    imports numba, whose import alone costs a process ~120 MB; the receiver's kernel took the data
    packets."""
    from mrc.transport import rxbatch

    if not rxbatch._c_kernel_ok():
        pytest.skip("mrc/transport/_fastc.c is not built here (make setup)")
    code = (
        "import sys\n"
        "from mrc.dataplane import lopair\n"
        "from mrc.dataplane.driver import batch_io_default, tx_ring_default\n"
        "assert batch_io_default() and tx_ring_default()\n"
        "r = lopair.run(lopair.PairConfig(size=2 << 20, batch_io=None, tx_ring=None, peer_batch_io=None,\n"
        "                                 peer_tx_ring=None))\n"
        "d, p = r['driver'], r['peer_driver']\n"
        "print(r['ok'], d['batch_io'], d['tx_ring'], p['rx_kernel_packets'], 'numba' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MRC_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    ok, batch, ring, taken, numba = out.stdout.split()
    assert (ok, batch, ring, numba) == ("True", "1", "1", "False")
    assert int(taken) > 128  # most of the 256 data packets went through the C kernel
