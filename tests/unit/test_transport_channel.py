"""Completion channels and CQ depth: an armed CQ raises one event per arming, a pollable fd for
`selectors`, and an overrun CQ puts the completing QP in ERROR with a CQ_ERR event (never a lost
completion)."""

from __future__ import annotations

import selectors

import numpy as np
import pytest

from mrc.dataplane.channel import FdCompletionChannel
from mrc.sim.loopback import LoopbackConfig, build, run_transfer
from mrc.transport import AsyncEventKind, CompletionChannel, CompletionQueue, QpState, WcStatus
from mrc.transport.verbs import WcOpcode, WorkCompletion


def _wc(i: int) -> WorkCompletion:
    return WorkCompletion(i, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 0x100)


def test_an_armed_cq_raises_one_event_per_arming() -> None:
    ch = CompletionChannel()
    cq = CompletionQueue(0, 8, ch)
    cq.push(_wc(1))
    assert ch.get_cq_event() is None  # not armed: no event
    cq.req_notify()
    cq.push(_wc(2))
    cq.push(_wc(3))
    assert ch.get_cq_event() is cq and ch.get_cq_event() is None  # one event, not one per completion
    with pytest.raises(ValueError, match="ack of 2 events of CQ 0, 1 got"):
        ch.ack_cq_events(cq, 2)
    ch.ack_cq_events(cq, 1)
    assert [w.wr_id for w in cq.poll()] == [1, 2, 3]
    with pytest.raises(ValueError, match="no completion channel"):
        CompletionQueue(1).req_notify()


def test_the_channel_fd_is_readable_on_a_completion_and_works_with_selectors() -> None:
    with FdCompletionChannel() as ch:
        r = build(LoopbackConfig(size=1 << 20, seed=1))
        cq = r.a.create_cq(channel=ch)
        assert cq.channel is ch and cq.cqn in r.a.cqs
        sel = selectors.DefaultSelector()
        sel.register(ch, selectors.EVENT_READ)
        try:
            assert sel.select(timeout=0) == []
            cq.req_notify()
            cq.push(_wc(7))
            ready = sel.select(timeout=0)
            assert [k.fileobj for k, _ in ready] == [ch]
            assert ch.get_cq_event() is cq
            assert sel.select(timeout=0) == []  # drained: not readable any more
            ch.ack_cq_events(cq, 1)
        finally:
            sel.close()
    with pytest.raises(ValueError, match="closed"):
        ch.fileno()


def test_a_transfer_raises_its_completion_event() -> None:
    r = build(LoopbackConfig(size=1 << 20, seed=1))
    ch = CompletionChannel()
    r.qa.send_cq.channel = ch
    r.qa.send_cq.req_notify()
    doc = run_transfer(r)
    assert doc["completed"] and doc["bit_exact"]
    assert ch.get_cq_event() is r.qa.send_cq


def test_an_overrun_cq_errors_the_qp_instead_of_losing_a_completion() -> None:
    r = build(LoopbackConfig(size=64 << 10, seed=1))
    cq = r.qa.send_cq
    cq.depth = 1
    cq.push(_wc(99))  # the application has not polled: the CQ is full
    src = np.ones(4096, dtype=np.uint8)
    smr = r.a.reg_mr(src)
    dmr = r.b.reg_mr(np.zeros(4096, dtype=np.uint8))
    r.qa.post_send(1, smr, 0, 4096, dmr.addr, dmr.rkey)
    r.fabric.kick(0)
    r.fabric.run(until_ns=10_000_000)
    assert cq.overruns >= 1 and r.qa.state == QpState.ERROR
    kinds = [e.kind for e in r.a.poll_async_events()]
    assert kinds == [AsyncEventKind.CQ_ERR, AsyncEventKind.QP_FATAL]  # the cause, then the QP
    assert [w.wr_id for w in cq.poll()] == [99]
    with pytest.raises(ValueError, match="depth must be"):
        CompletionQueue(0, 0)
