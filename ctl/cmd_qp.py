"""`mrcctl qp`: queue pairs of each host's mrcd (docs/daemon.md).

    mrcctl qp [show] [--host H]
"""

from __future__ import annotations

from typing import Any

import click

from . import api
from .cli import PrefixChoice
from .cmd_testbed import name_option
from .output import Output, json_option, table


def _render(doc: dict[str, Any]) -> str:
    rows = []
    for q in doc["qps"]:
        e = q["evs"]
        cuts = q.get("cc_cuts") or {}  # an mrcd before cc_cuts: blank
        rows.append({**q, "srtt_ms": round(q["srtt_ns"] / 1e6, 3),
                     "ev_states": f"{e['good']}/{e['assumed_bad']}/{e['denied']}",
                     "cuts": f"{cuts['ecn']}/{cuts['quick_adapt']}" if cuts else ""})
    if not rows:
        return "no QPs"
    return table(rows, [("host", "HOST"), ("qpn", "QPN"), ("peer", "PEER"), ("peer_qpn", "PEER QPN"),
                        ("state", "STATE"), ("cwnd", "CWND"), ("cuts", "CUTS ECN/QA"),
                        ("srtt_ms", "SRTT[ms]"),
                        ("inflight", "INFLIGHT"),
                        ("data_tx", "DATA TX"), ("data_rx", "DATA RX"), ("ev_states", "EVs GOOD/BAD/DENIED"),
                        ("restricted", "RESTRICTED")])


@click.command()
@click.argument("verb", required=False, type=PrefixChoice(["show"]))
@click.option("--host", default=None, help="Only this host's mrcd.")
@name_option
@json_option
@click.pass_obj
def qp(out: Output, verb: str | None, host: str | None, name: str | None) -> None:
    """Queue pairs of every host's mrcd: peer, state, window (and its cuts by ECN and by quick adapt), RTT,
    EV states."""
    res = api.ask_all(name, host, "qp_show")
    res.emit(out, {"qps": [q for qs in res.answers.values() for q in qs]}, _render)
