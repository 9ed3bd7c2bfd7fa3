"""mrcd's control-socket operations: the `op_*` handlers of the protocol's ops (`mrc.dataplane.protocol.OPS`,
docs/daemon.md "Control protocol") over the host's `HostEngine`, plus what belongs to clients: which
client owns which QP (its work completions are pushed to it) and the memory regions it registered.

The `ControlServer` frames, validates and dispatches; a handler here may assume a request that passed the
schema, raises MrcError / ValueError to refuse it, and anything else is a bug (`internal`).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from mrc import __version__ as mrc_version
from mrc.dataplane import shm
from mrc.dataplane.client import MAX_LINE
from mrc.dataplane.protocol import PROTOCOL_VERSION, check_version, optional
from mrc.errors import MrcError
from mrc.transport import EvState, MemoryRegion, QueueFull, QueuePair, WorkCompletion

from .control_server import Client, Operation, push
from .controller import Action, link_name
from .host_engine import HostEngine

#: The most QPs and memory regions one mrcd holds, all clients together. Each QP costs ~70 KiB of mrcd's
#: memory (docs/daemon.md, "Memory per QP") and each region a mapping (the kernel allows 65,530 per
#: process, vm.max_map_count): a client that leaks them in a loop is refused with a message, instead of
#: running mrcd out of memory or mappings for every other client.
MAX_QPS: Final = 16384
MAX_MRS: Final = 16384
#: Work requests one client may hold in mrcd over all its QPs (sends posted and not completed, receives
#: posted and not consumed): each QP bounds its own queues (max_send_wr / max_recv_wr), this bounds what
#: a client with many QPs makes mrcd hold. One more post is refused queue_full, like a full queue.
MAX_CLIENT_WRS: Final = 1 << 16
#: The most bytes of JSON one `actions` reply carries, its actions and its events each half of it: the
#: controller keeps up to 100,000 of each (MAX_LOG), more than the client reads in one line (MAX_LINE,
#: 16 MiB), and the client refused the whole reply. The newest entries since `since_ns` are answered; the
#: reply's `omitted` counts the older ones left out (ask again with a later `since_ns` for the rest).
MAX_ACTIONS_REPLY_BYTES: Final = MAX_LINE // 4


def _no_io_stats() -> dict[str, Any]:
    return {}


class Operations:
    """The `Handler` of mrcd's `ControlServer`."""

    def __init__(self, engine: HostEngine, *, site: str, port_ifname: list[str], link_rate_bps: int,
                 io_stats: Callable[[], dict[str, Any]] = _no_io_stats) -> None:
        self.e = engine
        self.site = site  # the testbed's name, or the host configuration file's
        self.port_ifname = port_ifname
        self.link_rate_bps = link_rate_bps
        self.io_stats = io_stats  # driver, peer notes and dataplane counters, for op_stats
        self.qp_owner: dict[int, Client] = {}
        self.mrs: dict[int, MemoryRegion] = {}
        self._next_mr = 1

    # -- Handler
    def greeting(self) -> dict[str, Any]:
        return {"mrcd": mrc_version, "host": self.e.host, "protocol": PROTOCOL_VERSION}

    def operation(self, op: str) -> Operation:
        fn: Operation = getattr(self, f"op_{op}")
        return fn

    def client_gone(self, c: Client) -> None:
        for q in list(c.qps):
            self._destroy_qp(q)
        c.qps.clear()
        for h, (mr, mm) in list(c.mrs.items()):
            self.e.ctx.dereg_mr(mr)
            self.mrs.pop(h, None)
            with contextlib.suppress(BufferError):
                mm.close()
        c.mrs.clear()

    def deliver_wcs(self) -> None:
        """Push every completion of the host's CQ to the client that owns its QP."""
        for wc in self.e.cq.poll(1 << 16):
            owner = self.qp_owner.get(wc.qp_num)
            if owner is not None:
                push(owner, wc_doc(wc))

    # -- operations: applications
    def op_hello(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        """mrcd's identity and protocol version; a client whose protocol major differs is refused here,
        with the versions in the message, rather than failing later on a field it reads differently."""
        protocol = optional("hello", req, "protocol", None)
        if protocol is not None:
            check_version(protocol, side="client")
        return {"protocol": PROTOCOL_VERSION, "host": self.e.host, "testbed": self.site,
                "gid": str(ipaddress.IPv6Address(self.e.gid)),
                "planes": self.e.planes, "evs": self.e.evs, "pid": os.getpid(), "version": mrc_version,
                "peers": self.e.peer_names(), "link_rate_bps": self.link_rate_bps}

    def op_reg_mr(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        if not c.fds:
            raise MrcError("reg_mr: no file descriptor came with the request")
        fd = c.fds.popleft()
        try:
            if len(self.mrs) >= MAX_MRS:
                raise MrcError(f"reg_mr: mrcd holds {MAX_MRS} memory regions, the most it takes (a region "
                               f"goes with the client that registered it)")
            length = int(req["length"])
            mm = shm.map_received(fd, length, "reg_mr")
        finally:
            os.close(fd)
        mr = self.e.ctx.reg_mr(mm)
        h = self._next_mr
        self._next_mr += 1
        self.mrs[h] = mr
        c.mrs[h] = (mr, mm)
        return {"handle": h, "rkey": mr.rkey, "addr": mr.addr, "length": length}

    def op_create_qp(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        if len(self.e.ctx.qps) >= MAX_QPS:
            raise MrcError(f"create_qp: mrcd holds {MAX_QPS} QPs, the most it takes (destroy some, or close "
                           f"the clients that hold them)")
        peer = str(req["peer"])
        evs, planes = optional("create_qp", req, "evs", None), optional("create_qp", req, "planes", None)
        qp = self.e.create_qp(peer, evs=None if evs is None else int(evs),
                              planes=None if planes is None else [int(p) for p in planes],
                              null_cc=optional("create_qp", req, "cc", "nscc") == "null")
        self.qp_owner[qp.qpn] = c
        c.qps.add(qp.qpn)
        return {"qpn": qp.qpn, "peer_gid": str(ipaddress.IPv6Address(self.e.peers[peer].gid)), "mtu": qp.mtu}

    def _qp(self, c: Client | None, req: dict[str, Any]) -> QueuePair:
        qpn = int(req["qpn"])
        qp = self.e.ctx.qps.get(qpn)
        if qp is None or (c is not None and qpn not in c.qps):
            raise MrcError(f"no QP {qpn} of this client")
        return qp

    def op_connect(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        # the peer QP's payload per packet (protocol 1.1): ours becomes it if smaller
        mtu = optional("connect", req, "mtu", None)
        qp.connect(self.e.peers[self.e.qp_peer[qp.qpn]].gid, int(req["peer_qpn"]),
                   path_mtu=None if mtu is None else int(mtu))

    def op_destroy_qp(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        c.qps.discard(qp.qpn)
        self._destroy_qp(qp.qpn)

    def _destroy_qp(self, qpn: int) -> None:
        self.e.destroy_qp(qpn)
        self.qp_owner.pop(qpn, None)

    def _take_wr(self, c: Client) -> None:
        """Count one post against the client's budget (MAX_CLIENT_WRS) or refuse it. `c.wr_bound` only
        grows with posts, so it bounds what is outstanding; it is recounted exactly (over the client's
        QPs) only when it reaches the limit."""
        if c.wr_bound >= MAX_CLIENT_WRS:
            qps = self.e.ctx.qps
            c.wr_bound = sum(len(q.wrs_out) + len(q.recv_q) for n in c.qps if (q := qps.get(n)) is not None)
            if c.wr_bound >= MAX_CLIENT_WRS:
                raise QueueFull(f"this client holds {MAX_CLIENT_WRS} work requests in mrcd, the most it "
                                f"takes: poll completions before posting more")
        c.wr_bound += 1

    def op_post_send(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        self._take_wr(c)
        h = int(req["mr"])
        if h not in c.mrs:
            raise MrcError(f"no memory region {h} of this client")
        imm = req.get("imm")  # the hot path: the schema checked it (an int or null)
        qp.post_send(int(req["wr_id"]), c.mrs[h][0], int(req["offset"]), int(req["length"]),
                     int(req["remote_addr"]), int(req["rkey"]), imm=None if imm is None else int(imm))

    def op_post_recv(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        self._take_wr(c)
        qp.post_recv(int(req["wr_id"]))

    # -- operations: operator
    def op_qp_stats(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        qp = self._qp(None, req)
        # the congestion controller's own state (NSCC: window cuts by ECN and by quick adapt, the
        # smoothed queuing delay it acts on), which says why a QP's window is where it is
        return {"qpn": qp.qpn, "peer": self.e.qp_peer.get(qp.qpn), "time_ns": time.monotonic_ns(),
                **qp.stats(), "cc": qp.cc.stats()}

    def op_qp_show(self, c: Client, req: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for qpn, qp in sorted(self.e.ctx.qps.items()):
            st = qp.paths.state
            cc = qp.cc.stats()
            out.append({"host": self.e.host, "qpn": qpn, "peer": self.e.qp_peer.get(qpn),
                        "state": qp.state.name,
                        "peer_qpn": getattr(qp, "peer_qpn", None), "cwnd": qp.cc.cwnd, "srtt_ns": qp.srtt,
                        "inflight": qp.inflight, "data_tx": qp.serial, "data_rx": qp.rx_packets,
                        "evs": {s.name.lower(): sum(1 for x in st if x == int(s)) for s in EvState},
                        "restricted": qpn in self.e.pinned_qps,
                        # window cuts so far: by ECN (multiplicative decrease) and by quick adapt
                        "cc_cuts": {"ecn": int(cc.get("md_count", 0)),
                                    "quick_adapt": int(cc.get("qa_count", 0))}})
        return out

    def op_ev_show(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        want = optional("ev_show", req, "state", None)
        peers = {}
        live = self.e.ctx.qps
        for peer, t in sorted(self.e.peers.items()):
            qps = [q for q, p in self.e.qp_peer.items() if p == peer and q not in self.e.pinned_qps]
            rows = []
            for i, path in enumerate(t.paths):
                if i in t.profile.denied:
                    state = "DENIED"
                else:
                    states = {EvState(live[q].paths.state[i]).name for q in qps if q in live}
                    state = "ASSUMED_BAD" if "ASSUMED_BAD" in states else ("GOOD" if states or not qps else
                                                                            "UNKNOWN")
                    if "DENIED" in states and "ASSUMED_BAD" not in states:
                        state = "DENIED"
                if want and state.lower() != str(want).lower():
                    continue
                rows.append({"ev_index": i, "port": i % self.e.planes, "plane": path.plane,
                             "spine": path.spine, "via": "-".join(path.hops[1:-1]), "state": state})
            peers[peer] = rows
        return {"host": self.e.host, "peers": peers,
                "denied_links": sorted(link_name(lk) for lk in self.e.controller.denied)}

    def _indices(self, op: str, req: dict[str, Any]) -> tuple[str, list[int]]:
        peer = str(req["peer"])
        t = self.e.peer_table(peer)
        idx: list[int] = list(optional(op, req, "evs", []))
        plane = optional(op, req, "plane", None)
        if plane is not None:
            idx += [i for i, p in enumerate(t.paths) if p.plane == plane]
        link = optional(op, req, "link", "")
        if link:
            a, b = link.split("-", 1) if "-" in link else (link, "")
            on_link = t.by_link.get(frozenset((a, b)), [])
            if not on_link:
                raise MrcError(f"link {link!r}: no path to {peer} crosses it (a link is written A-B, as "
                               "'mrcctl ev show' prints the hops, e.g. p0l0-p0s0)")
            idx += on_link
        if not idx:
            raise MrcError("nothing selected: give EV indices, a plane or a link A-B")
        for i in idx:
            if not 0 <= i < self.e.evs:
                raise MrcError(f"EV index {i} out of range 0..{self.e.evs - 1}")
        return peer, sorted(set(idx))

    def op_ev_deny(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        peer, idx = self._indices("ev_deny", req)
        self.e.carry_out(self.e.controller.deny_manual(peer, idx, time.monotonic_ns()))
        return {"host": self.e.host, "peer": peer, "denied": len(idx)}

    def op_ev_restore(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        peer, idx = self._indices("ev_restore", req)
        self.e.carry_out(self.e.controller.restore_manual(peer, idx, time.monotonic_ns()))
        return {"host": self.e.host, "peer": peer, "restored": len(idx)}

    def op_port_show(self, c: Client, req: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"host": self.e.host, "port": p, "ifname": self.port_ifname[p],
                 "enabled": self.e.ctx.port_enabled[p],
                 "failed": p in self.e.controller.ports_down} for p in range(self.e.planes)]

    def op_port_set(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        p = int(req["port"])
        if not 0 <= p < self.e.planes:
            raise MrcError(f"no port {p} (ports 0..{self.e.planes - 1})")
        enabled = bool(req["enabled"])
        self.e.ctx.modify_port(p, enabled, time.monotonic_ns())
        self.e.controller.act(Action(time.monotonic_ns(), "port_up" if enabled else "port_down",
                                   self.port_ifname[p], 0, "operator"))
        return {"host": self.e.host, "port": p, "enabled": enabled}

    def op_link_status(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        a, b = (str(x) for x in req["link"])
        state = str(req["state"])
        if state not in ("down", "up"):
            raise MrcError(f"link_status: state must be down or up, got {state!r}")
        reporter = optional("link_status", req, "from", "?")  # a null `from` is "?", not "None"
        res, effects = self.e.controller.on_link_status(frozenset((a, b)), state, reporter,
                                                      time.monotonic_ns())
        self.e.carry_out(effects)
        return {"host": self.e.host, "result": res}

    def op_actions(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        """The controller's actions and EV events since `since_ns` (null: all), the newest that fit in
        MAX_ACTIONS_REPLY_BYTES; `omitted` counts the older ones left out."""
        since: int = optional("actions", req, "since_ns", 0)
        ctl = self.e.controller
        actions, n_a = _newest((a.to_dict() for a in reversed(ctl.log) if a.time_ns >= since),
                               MAX_ACTIONS_REPLY_BYTES // 2)
        events, n_e = _newest((e for e in reversed(ctl.events) if e["time_ns"] >= since),
                              MAX_ACTIONS_REPLY_BYTES // 2)
        return {"actions": actions, "events": events, "omitted": {"actions": n_a, "events": n_e}}

    def op_stats(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        ctl = self.e.controller
        return {"host": self.e.host, "engine_drops": dict(self.e.ctx.drops), "qps": len(self.e.ctx.qps),
                "controller": dict(ctl.counts), "ev_events": dict(ctl.event_counts),
                "probe_results": dict(ctl.probe_stats), "reporters_refused": ctl.reporters_refused,
                "denied_links": sorted(link_name(lk) for lk in ctl.denied), **self.io_stats()}


def _newest(rows: Iterator[dict[str, Any]], budget: int) -> tuple[list[dict[str, Any]], int]:
    """From `rows`, newest first: the leading ones whose JSON fits in `budget` bytes, oldest first, and how
    many rows did not fit. Each row is measured as it is taken, so the cost is bounded by `budget`, not by
    the log's length (the rest are only counted)."""
    out: list[dict[str, Any]] = []
    for row in rows:
        budget -= len(json.dumps(row, separators=(",", ":"))) + 1
        if budget < 0:
            return out[::-1], 1 + sum(1 for _ in rows)
        out.append(row)
    return out[::-1], 0


def wc_doc(wc: WorkCompletion) -> dict[str, Any]:
    return {"push": "wc", "qpn": wc.qp_num, "wr_id": wc.wr_id, "status": wc.status.name,
            "opcode": wc.opcode.name, "byte_len": wc.byte_len, "imm": wc.imm_data,
            "time_ns": time.monotonic_ns()}
