"""The engine's fast path: the bulk data path's per-packet work fused into one function per direction.

The pure path (``MRC_FASTPATH=0``) is the reference: `Context.receive` -> `wire.packet.parse_write` ->
`Responder.on_write` on the receive side, `Requester._send_new` -> `wire.packet.write_packet` on the
send side, one Python call per layer and per packet, the fields passed as a tuple or 14 arguments. The
fast path runs the same steps, in the same order, with the same results, inlined into one function:

* `receive`: a data packet of the common case (a well-formed WRITE with a good ICRC, in the receive
  window, new, for a valid memory region, inside a message already under way that it does not complete,
  no immediate) is parsed, checked, placed and acknowledged here; anything else -- the first or the last
  packet of a message, duplicates, trims, control packets, every rejection -- goes to the pure path
  before any state has changed, so the rare cases have one implementation;
* `send_new`: `Requester._send_new` with `write_packet` inlined (header pack, ICRC from the context's
  cached start value, one join), the same packets byte for byte.

Wire bytes, counters and timers are identical on both paths (tests/unit/test_fastpath.py runs loopback
scenarios on both and compares every datagram). No numba here: a compiled kernel per packet would take
the packet and the QP's state (a Python int bitmap, dicts of messages and memory regions) across a call
boundary per packet; what costs is the interpreter's call and argument overhead between the layers,
which fusion removes (docs/transport.md, "Fast path"). A driver with batches of datagrams gets the
compiled version, one call per run of packets: `Context.receive_batch` (rxbatch.py), which falls back
to `receive` and `sack` below for everything but the common packet.

The switch: the environment variable ``MRC_FASTPATH`` is read once, when this module is first imported
(``0`` = the pure path, anything else or unset = the fast path) into `ENABLED`; each `Context` takes the
value of `ENABLED` when it is constructed (tests flip `ENABLED` to build both kinds in one process).
"""

from __future__ import annotations

import os
import struct
from types import MethodType
from typing import TYPE_CHECKING, Any, Final

from mrc.wire.consts import (
    DEFAULT_PKEY,
    EV_INDEX_MAX,
    EV_SPORT_BASE,
    ICRC_LEN,
    MAX_PAYLOAD,
    MXH_VERSION,
    PKEY_PARTITION,
    PSN_MASK,
    QPN_MASK,
    SACK_MAX_WORDS,
    UDP_LEN,
    MxhFlag,
    Opcode,
    SackFlag,
)
from mrc.wire.control import Sack
from mrc.wire.crc import crc32, isal_crc32_address
from mrc.wire.icrc import _BTH4_ZERO, _ICRC, _PREFIX_CACHE_MAX, CRC32_RESIDUE
from mrc.wire.packet import _WRITE, _WRITE_IMM, CTRL_HDR_LEN, WRITE_HDR_LEN, WRITE_IMM_HDR_LEN

from .qpcore import _ACKED, _CE, _HALF, _INFLIGHT, _LOST, _RETX, _RTS, _S_DUP, NEVER, Datagram
from .recovery import RACK_CALM
from .verbs import QpState

if TYPE_CHECKING:
    from .engine import Context
    from .qp import QueuePair
    from .requester import Requester
    from .responder import Responder
    from .verbs import SendWr

ENV: Final = "MRC_FASTPATH"
#: True unless MRC_FASTPATH=0 was set when this module was imported; read by `Context.__init__`.
ENABLED: bool = os.environ.get(ENV, "1").strip() != "0"
#: False with MRC_FASTPATH=py: the fast path in Python only, without the C module (`_compiled`); read by
#: `install`, per context, like `ENABLED`
C_ENABLED: bool = os.environ.get(ENV, "1").strip() != "py"

_RTR: Final = QpState.RTR
_TRIMMED: Final = int(MxhFlag.TRIMMED)
_ACK_NOW: Final = int(MxhFlag.ACK_REQ_NOW)
_S_RETX: Final = int(SackFlag.RETX)
_FIRST: Final = int(MxhFlag.FIRST)
_LAST: Final = int(MxhFlag.LAST)
_ACKREQ_BIT: Final = 1 << 31
_OP_WRITE: Final = 0x0A
_OP_WRITE_IMM: Final = 0x0B
_ZERO8: Final = bytes(8)
_ZERO4: Final = b"\x00\x00\x00\x00"
_new_tuple: Final = tuple.__new__
_pack_write: Final = _WRITE.pack
_pack_write_imm: Final = _WRITE_IMM.pack
_unpack_write: Final = _WRITE.unpack_from
_unpack_write_imm: Final = _WRITE_IMM.unpack_from
_pack_icrc: Final = _ICRC.pack_into
#: a SACK's BTH, MXH and fixed body in one Struct (wire.packet's _CTRL, then wire.control's SACK_STRUCT)
_SACK_HDR: Final = struct.Struct("!BBHII" "BBHIIIQ" "IHBBQI")
_OP_SACK: Final = int(Opcode.SACK)
assert _SACK_HDR.size == CTRL_HDR_LEN + 20
_unpack_sack: Final = _SACK_HDR.unpack_from
#: the longest SACK (the most bitmap words)
_SACK_RX_MAX: Final = _SACK_HDR.size + 8 * SACK_MAX_WORDS + ICRC_LEN


def receive(
    self: Context, data: bytes | bytearray | memoryview, now: int, ecn: bool = False, port: int = 0,
    src: bytes | None = None,
) -> None:
    """`Context.receive` with the common data packet handled inline (see the module docstring); every
    other packet, and every check that fails, goes to `Context.receive` itself before anything changed."""
    n = len(data)
    if n < WRITE_HDR_LEN + ICRC_LEN or type(data) is memoryview or now < 0:
        _pure_receive(self, data, now, ecn, port, src)
        return
    op = data[0]
    qp: QueuePair | None = self.qps.get((data[5] << 16) | (data[6] << 8) | data[7])
    if qp is None:
        _pure_receive(self, data, now, ecn, port, src)
        return
    state = qp.state
    if (state is not _RTS and state is not _RTR) or (src is not None and src != qp.peer_gid):
        _pure_receive(self, data, now, ecn, port, src)
        return
    # ---- parse_write, inlined
    imm: int | None
    if op == _OP_WRITE:
        hl = WRITE_HDR_LEN
        (_, b1, pkey, qw, pw, va, rkey, dlen, ver, flags, ev, msn, mlen, moff, ts) = _unpack_write(data)
        imm = None
    elif op == _OP_SACK:
        _sack_rx(self, qp, data, n, now, ecn, port, src)
        return
    else:  # WRITE with immediate (a message's last packet: the pure path completes it), other control
        _pure_receive(self, data, now, ecn, port, src)
        return
    if (
        pkey & PKEY_PARTITION != PKEY_PARTITION or b1 & 0x0F or qw > QPN_MASK or ver != MXH_VERSION
        or flags & _TRIMMED or dlen > MAX_PAYLOAD or ev > EV_INDEX_MAX
    ):
        _pure_receive(self, data, now, ecn, port, src)
        return
    pad = (b1 >> 4) & 3
    end = hl + dlen + pad
    if (dlen + pad) & 3 or n != end + ICRC_LEN or moff + dlen > mlen:
        _pure_receive(self, data, now, ecn, port, src)
        return
    ic = qp.rx_icrc
    sport = EV_SPORT_BASE | (ev & EV_INDEX_MAX)
    v = ic._start.get((sport << 32) | end)
    if v is None:
        v = ic.start(end, sport)
    if crc32(data, v) != CRC32_RESIDUE:
        _pure_receive(self, data, now, ecn, port, src)
        return
    # ---- on_write, the common case inlined; the rest before any change of state to the pure one
    psn = pw & PSN_MASK
    d = (psn - qp.rcv_cum) & PSN_MASK
    bit = 1 << d
    rbits = qp.rbits
    mr = qp.mrs.get(rkey)
    m = qp.msgs.get(msn)
    off = va - mr.addr if mr is not None else -1
    if (
        d >= _HALF or d >= qp.Wd or rbits & bit or mr is None or not mr.remote_write or off < 0
        or off + dlen > mr.length or m is None or m[0] + dlen >= m[2]
    ):
        qp.on_write(
            (psn, (pw & _ACKREQ_BIT) != 0, va, rkey, dlen, imm, flags, ev, msn, mlen, ts,
             memoryview(data)[hl : hl + dlen]), now, ecn, port, self._out,
        )
        return
    mr.view[off : off + dlen] = memoryview(data)[hl : hl + dlen]
    rbits |= bit
    if d == 0:
        t = (rbits ^ (rbits + 1)).bit_length() - 1
        rbits >>= t
        qp.rcv_cum = (qp.rcv_cum + t) & PSN_MASK
    qp.rbits = rbits
    qp.rx_packets += 1
    qp.rx_bytes += dlen
    m[0] += dlen
    # acknowledgement policy (Responder.on_write's)
    if ecn:
        qp.c["ecn_rx"] += 1
    u = qp.unacked + 1
    if ecn or pw & _ACKREQ_BIT or u >= qp.ack_coalesce or flags & (_ACK_NOW | _RETX):
        ef = (_CE if ecn else 0) | (_S_RETX if flags & _RETX else 0)
        sack(qp, now, self._out, psn, ev, ts, ef, 0, port)
    else:
        qp.unacked = u
        qp.last_rx = (psn, ev, ts, 0, now, port)
        if qp.ack_deadline == NEVER:
            qp.ack_deadline = now + qp.attr.ack_delay_ns


def _sack_rx(
    self: Context, qp: QueuePair, data: bytes | bytearray, n: int, now: int, ecn: bool, port: int,
    src: bytes | None,
) -> None:
    """A SACK as `parse` accepts it with a good ICRC (BTH byte 1 and 4 zero, as endpoints send it),
    parsed in one unpack into the `Sack` `parse` builds and given to `Requester.sack_rx` (what `on_sack`
    reads of the packet: its PSN and body); anything else to the pure path."""
    if n <= _SACK_RX_MAX:
        (_, b1, pkey, qw, pw, ver, flags, ev, _, _, _, _, cum, eev, eflags, words, ets, svc) = (
            _unpack_sack(data)
        )
        end = _SACK_HDR.size + 8 * words
        if (
            not b1 and pkey & PKEY_PARTITION == PKEY_PARTITION and qw <= QPN_MASK and ver == MXH_VERSION
            and not flags & _TRIMMED and words >= 1 and n == end + ICRC_LEN and ev <= EV_INDEX_MAX
        ):
            ic = qp.rx_icrc
            sport = EV_SPORT_BASE | (ev & EV_INDEX_MAX)
            v = ic._start.get((sport << 32) | end)
            if crc32(data, ic.start(end, sport) if v is None else v) == CRC32_RESIDUE:
                bits = int.from_bytes(data[_SACK_HDR.size : end], "little")
                qp.sack_rx(pw & PSN_MASK, Sack(cum & PSN_MASK, eev, eflags, ets, svc, bits, 64 * words), now)
                return
    _pure_receive(self, data, now, ecn, port, src)


def sack(
    self: Responder, now: int, out: list[Datagram], psn: int, ev: int, ts: int, eflags: int, svc: int,
    port: int,
) -> None:
    """`Responder._sack` with `build_sack` inlined: the same SACK, byte for byte, and the same state."""
    bm = self.rbits >> 1
    words = (bm.bit_length() + 63) >> 6 or 1
    if words > SACK_MAX_WORDS:  # the pure path's error (pack_sack refuses it)
        self._sack(now, out, psn, ev, ts, eflags, svc, port)
        return
    paths = self.paths
    cev = paths.ctl_ev(port, -1 if eflags & _S_DUP else ev)
    hdr = _SACK_HDR.pack(
        _OP_SACK, 0, DEFAULT_PKEY, self.peer_qpn & QPN_MASK, psn & PSN_MASK, MXH_VERSION, 0, cev, 0, 0, 0,
        now, self.rcv_cum & PSN_MASK, ev, eflags, words, ts, svc,
    )
    bmb = bm.to_bytes(8 * words, "little")
    end = _SACK_HDR.size + 8 * words
    # BTH byte 4 is zero (the QPN is masked): the ICRC is one CRC from the context's start value
    ic = self.tx_icrc
    sport = EV_SPORT_BASE | (cev & EV_INDEX_MAX)
    v = ic._start.get((sport << 32) | end)
    crc = crc32(bmb, crc32(hdr, ic.start(end, sport) if v is None else v))
    buf = bytearray().join((hdr, bmb, _ZERO4))
    _pack_icrc(buf, end, crc)
    if not eflags & _S_DUP:  # as Responder._sack: a duplicate's answer leaves the ACK policy's state
        self.unacked = 0
        self.ack_coalesce = self.ack_coalesce_sum - self.ack_coalesce
        self.ack_deadline = NEVER
    self.c["sack_tx"] += 1
    out.append(_new_tuple(Datagram, (buf, paths.ev_port[cev], cev, self.peer_gid)))


def send_new(self: Requester, wr: SendWr, now: int, out: list[Datagram]) -> bool:
    """`Requester._send_new` with `write_packet` inlined: the same packets, state and counters."""
    W = self.W
    mtu = self.mtu
    psn = self.snd_nxt
    una = self.snd_una
    limit = una + self.wlim
    cwnd = self.cc.cwnd
    inflight = self.inflight
    ack_floor = self.ack_floor
    paths = self.paths
    ev_port = paths.ev_port
    port_bytes = paths.port_bytes
    tx_state, tx_len, tx_ev, tx_time = self.tx_state, self.tx_len, self.tx_ev, self.tx_time
    tx_serial, tx_wr, tx_off = self.tx_serial, self.tx_wr, self.tx_off
    tx_retx = self.tx_retx
    out_append = out.append
    icrc = self.tx_icrc
    starts = icrc._start
    start_of = icrc.start
    dqpn = self.peer_qpn & QPN_MASK
    gid = self.peer_gid
    serial = self.serial
    length = wr.length
    sent = wr.sent
    base = wr.offset
    view = wr.mr.view
    va0 = wr.remote_addr
    rkey, msn, imm = wr.rkey, wr.msn, wr.imm
    seq = paths.seq
    seq_len = len(seq)
    seq_pos = paths.seq_pos
    stamp = now + self.ts_off
    since = self.ackreq_since
    every = cwnd // self.ackreq_div if self.ackreq_div else 0
    if ack_floor and every >= ack_floor:
        every = 0
    if sent == 0:
        wr.first_psn = psn
    join = bytearray().join
    c = self.c
    ok = True
    while True:
        if psn >= limit:
            c["window_limited"] += 1
            ok = False
            break
        n = length - sent
        if n > mtu:
            n = mtu
        if inflight and inflight + n > cwnd:
            c["cwnd_limited"] += 1
            ok = False
            break
        if seq_len:
            ev = seq[seq_pos]
            seq_pos += 1
            if seq_pos == seq_len:
                seq_pos = 0
        else:
            ev = paths.next_ev()
            if ev < 0:
                if self.rto_deadline == NEVER:
                    self.rto_deadline = now + self._rto_interval()
                ok = False
                break
        off = sent
        sent = off + n
        last = sent == length
        flags = _FIRST if off == 0 else 0
        areq = last or inflight + n < ack_floor
        if every:
            since += n
            if areq or since >= every:
                areq = True
                since = 0
        # ---- write_packet, inlined
        if n > MAX_PAYLOAD:
            raise ValueError(f"payload of {n} bytes exceeds MAX_PAYLOAD {MAX_PAYLOAD}")
        pad = -n & 3
        w0 = (_ACKREQ_BIT if areq else 0) | (psn & PSN_MASK)
        if last:
            flags |= _LAST
        if last and imm is not None:
            hdr = _pack_write_imm(
                _OP_WRITE_IMM, pad << 4, DEFAULT_PKEY, dqpn, w0, va0 + off, rkey, n, imm & 0xFFFFFFFF,
                MXH_VERSION, flags, ev, msn, length, off, stamp,
            )
            end = WRITE_IMM_HDR_LEN + n + pad
        else:
            hdr = _pack_write(
                _OP_WRITE, pad << 4, DEFAULT_PKEY, dqpn, w0, va0 + off, rkey, n,
                MXH_VERSION, flags, ev, msn, length, off, stamp,
            )
            end = WRITE_HDR_LEN + n + pad
        lo = base + off
        payload = view[lo : lo + n]
        sport = EV_SPORT_BASE | (ev & EV_INDEX_MAX)
        v = starts.get((sport << 32) | end)
        crc = crc32(payload, crc32(hdr, start_of(end, sport) if v is None else v))
        if pad:
            crc = crc32(_ZERO4[:pad], crc)
        buf = join((hdr, payload, _ZERO8[: pad + ICRC_LEN]))
        _pack_icrc(buf, end, crc)
        # ---- bookkeeping (as _send_new)
        slot = psn % W
        tx_wr[slot] = wr
        tx_off[slot] = off
        tx_len[slot] = n
        tx_state[slot] = _INFLIGHT
        tx_ev[slot] = ev
        tx_time[slot] = now
        serial += 1
        tx_serial[slot] = serial
        tx_retx[slot] = False
        inflight += n
        port = ev_port[ev]
        port_bytes[port] += n
        out_append(_new_tuple(Datagram, (buf, port, ev, gid)))
        psn += 1
        if last:
            wr.last_psn = psn - 1
            self.cur = None
            break
    if seq_len:
        paths.seq_pos = seq_pos
    self.ackreq_since = since
    wr.sent = sent
    self.snd_nxt = psn
    self.serial = serial
    self.tx_bytes += inflight - self.inflight
    self.inflight = inflight
    if psn - una > self.max_outstanding:
        self.max_outstanding = psn - una
    if self.rto_deadline == NEVER and psn != una:
        self.rto_deadline = now + self._rto_interval()
    return ok


def _unset(*_: Any) -> None:
    raise AssertionError("fastpath.receive before fastpath.install")


#: `Context.receive`, the pure path every packet the fast one does not handle goes to (set by `install`)
_pure_receive: Any = _unset


def install(ctx: Any) -> None:
    """Set `ctx.fastpath` (a new `Context`) from `ENABLED` and, when it is on, give the context the fast
    receive path and `ctx.fast_send`, the send function its QPs take (`QpCore.fast`): the C module's
    when it is built and `C_ENABLED`, else this module's. Without the fast path `fast_send` is None."""
    global _pure_receive
    ctx.fastpath = ENABLED
    ctx.fast_send = None
    ctx.fast_acks = None
    ctx.fast_losses = None
    ctx.fast_rtt = None
    if not ENABLED:
        return
    if _pure_receive is _unset:
        _pure_receive = type(ctx).receive
    c = _compiled() if C_ENABLED else None
    if c is not None:
        ctx.receive = MethodType(c.receive, ctx)
        ctx.datagrams_to_send = MethodType(c.datagrams_to_send, ctx)
        ctx.datagrams_into = MethodType(c.datagrams_to_send, ctx)
        ctx.next_deadline = MethodType(c.next_deadline, ctx)
        ctx.fast_send = c.send_new
        ctx.fast_acks = c.ack_bits
        ctx.fast_losses = c.loss_scan
        ctx.fast_rtt = c.rtt_sample
    else:
        ctx.receive = receive.__get__(ctx)
        ctx.fast_send = send_new


#: `_fastc.ABI` of the _fastc.c this file works with
_FASTC_ABI: Final = 5
#: the C module once set up (`_compiled`), False when it cannot be used
_C: Any = None


def _compiled() -> Any:
    """`_fastc` set up for this process, or None: not built, no ISA-L CRC symbol to give it, or a wire
    constant it was compiled with that differs from mrc.wire.consts'."""
    global _C
    if _C is None:
        _C = _load_compiled() or False
    return _C or None


def _expected_consts() -> dict[str, int]:
    """What `_fastc.consts()` must return: the wire constants the C code was written against."""
    return {
        "WRITE_HDR_LEN": WRITE_HDR_LEN, "WRITE_IMM_HDR_LEN": WRITE_IMM_HDR_LEN, "ICRC_LEN": ICRC_LEN,
        "OP_WRITE": _OP_WRITE, "OP_WRITE_IMM": _OP_WRITE_IMM, "PKEY_PARTITION": PKEY_PARTITION,
        "DEFAULT_PKEY": DEFAULT_PKEY, "QPN_MASK": QPN_MASK, "PSN_MASK": PSN_MASK, "HALF": _HALF,
        "MXH_VERSION": MXH_VERSION, "MAX_PAYLOAD": MAX_PAYLOAD, "EV_INDEX_MAX": EV_INDEX_MAX,
        "EV_SPORT_BASE": EV_SPORT_BASE, "F_TRIMMED": _TRIMMED, "F_RETX": _RETX, "F_FIRST": _FIRST,
        "F_LAST": _LAST, "F_ACK_NOW": _ACK_NOW, "S_RETX": _S_RETX, "TX_INFLIGHT": _INFLIGHT, "TX_LOST": _LOST,
        "TX_ACKED": _ACKED,
        "CRC32_RESIDUE": CRC32_RESIDUE, "ACKREQ_BIT": _ACKREQ_BIT, "ICRC_LEN_": ICRC_LEN, "NEVER": NEVER,
        "UDP_LEN": UDP_LEN, "BTH4_ZERO": _BTH4_ZERO, "ICRC_CACHE_MAX": _PREFIX_CACHE_MAX,
        "RACK_CALM": RACK_CALM, "SACK_MAX_WORDS": SACK_MAX_WORDS,
    }


def _load_compiled() -> Any:
    try:
        from . import _fastc  # type: ignore[attr-defined]
    except ImportError:
        return None
    from mrc.wire.icrc import IcrcContext

    from .qp import QueuePair
    from .txring import SLOT as RING_SLOT
    from .txring import TxRing
    from .verbs import MemoryRegion, SendWr

    addr = isal_crc32_address()
    if not addr or getattr(_fastc, "ABI", None) != _FASTC_ABI or _fastc.consts() != _expected_consts():
        return None  # no ISA-L symbol, or a build of another version of _fastc.c (make setup rebuilds it)
    _fastc.setup(QueuePair, MemoryRegion, SendWr, IcrcContext, Datagram, _RTS, _RTR, receive, sack, send_new,
                 addr, Sack)
    _fastc.setup_ring(TxRing, RING_SLOT)
    return _fastc
