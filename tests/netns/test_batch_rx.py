"""mrcd with batch I/O (`MRC_BATCH_IO=1`, root): recvmmsg batches go whole to the engine's compiled
receive (`Context.receive_batch`, mrc/transport/rxbatch.py) on a testbed of its own (default.toml, one
mrcd per host started with that environment). Behaviour: a WRITE and an incast through trimming ports
arrive bit-exact, and the receiver's kernel took most of the data packets (its counter in `stats`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mrc.transport import rxbatch

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="namespaces, eBPF programs, daemons"),
              pytest.mark.netns, pytest.mark.bpf,
              pytest.mark.skipif(not rxbatch.AVAILABLE, reason="python-isal without crc32_gzip_refl")]

try:
    import bcc  # noqa: F401
except ImportError:
    pytest.skip("BCC (python3-bpfcc) is not importable", allow_module_level=True)

from mrc.ctl.bench import BenchConfig, WriteBench, incast  # noqa: E402
from mrc.dataplane.client import MrcClient  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_daemon import bring_up_testbed  # noqa: E402


@pytest.fixture(scope="module")
def tb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield from bring_up_testbed(tmp_path_factory, {"MRC_BATCH_IO": "1", "MRC_RX_KERNEL": "1"}, "b")


def _driver(tb: dict[str, Any], host: str) -> dict[str, Any]:
    with MrcClient.for_host(tb["tb"].ns(host)) as c:
        return dict(c.call("stats")["driver"])


def test_batched_receive_is_bit_exact_and_taken_by_the_kernel(tb: dict[str, Any]) -> None:
    before = _driver(tb, "h2")
    assert before["batch_io"] == 1 and before["rx_kernel"] == 1
    doc = WriteBench(BenchConfig(tb["name"], "h0", "h2", [32 << 20], iters=1)).run()
    assert doc["bit_exact"]
    after = _driver(tb, "h2")
    data = (32 << 20) // 8192
    assert after["rx_kernel_packets"] - before["rx_kernel_packets"] >= data // 2, (before, after)


def test_batched_incast_through_trimming_ports(tb: dict[str, Any]) -> None:
    before = _driver(tb, "h2")
    doc = incast(tb["name"], "h2", ["h0", "h1", "h3"], 8 << 20, ecn_k=8 << 10, trim_t=16 << 10,
                 buffer=256 << 10)
    assert doc["bit_exact"] and doc["rto"] == 0
    after = _driver(tb, "h2")
    assert after["rx_kernel_packets"] - before["rx_kernel_packets"] >= 3 * (8 << 20) // 8192 // 2
