"""`mrcctl wire`: the MRC wire format for operators.

    mrcctl wire [show]                              opcodes, header sizes, flags and codes
    mrcctl wire sample --out FILE.pcap [--count N] [--seed S]
                                                    a capture of every packet type, as on the fabric
    mrcctl wire decode FILE                         one row per packet, rejects counted by reason
                                                    (classic pcap or pcapng; Ethernet, raw IP, Linux
                                                    cooked; snaplen-cut frames decoded from headers)

`-j` may come before the object (`mrcctl -j wire ...`) or after the verb (`mrcctl wire decode F -j`).

`decode` never stops at a bad packet: a frame that is not MRC is counted under the `WireError.reason`
the parser gave (non-IPv6 or non-4791 frames as `bad_ip`), the way the receive path counts them, so
the totals always account for every frame. Only a file that is not a readable pcap or pcapng is an
error. A frame the capture's snaplen cut (`editcap -s 200`) is decoded from its headers, with the
lengths it had on the wire, `truncated` true and ICRC "truncated": it is not a bad packet.
Frame numbers start at 1, as in Wireshark, so rows can be matched with `tshark -r FILE`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable
from typing import Any, Final

import click

from mrc.wire import MrcPacket, WireError
from mrc.wire import consts as C
from mrc.wire.capture import LINKTYPE_ETHERNET, parse_captured, read_capture, split_captured
from mrc.wire.control import Nack, PortStatus, Probe, ProbeReply, Sack
from mrc.wire.packet import OPCODE_NAMES, header_len
from mrc.wire.pcap import Record, write_pcap
from mrc.wire.samples import ROUND, sample_frames

from .output import Output, json_option, table

#: Timestamp of the first sample frame (2023-11-14T22:13:20Z); fixed so a seed gives the same file.
SAMPLE_EPOCH: Final = 1_700_000_000.0
SAMPLE_GAP: Final = 1e-6
#: Most rounds `wire sample` builds (8 frames each, up to ~10 KB per round in memory).
MAX_ROUNDS: Final = 10_000
#: Decode reports progress on stderr every this many frames (text mode only).
PROGRESS_EVERY: Final = 100_000

_KNOWN_FLAGS: Final = sum(int(f) for f in C.MxhFlag)

_LAYOUTS: Final[dict[int, str]] = {
    C.Opcode.RDMA_WRITE_ONLY: "BTH RETH MXH payload [pad] ICRC",
    C.Opcode.RDMA_WRITE_ONLY_IMM: "BTH RETH ImmDt MXH payload [pad] ICRC",
    C.Opcode.SACK: "BTH MXH SACK ICRC",
    C.Opcode.NACK: "BTH MXH NACK ICRC",
    C.Opcode.PROBE: "BTH MXH PROBE ICRC",
    C.Opcode.PROBE_REPLY: "BTH MXH PROBE_REPLY ICRC",
    C.Opcode.PORT_STATUS: "BTH MXH PORT_STATUS ICRC",
}
_BODIES: Final[dict[int, str]] = {
    C.Opcode.RDMA_WRITE_ONLY: f"payload 0..{C.MAX_PAYLOAD}",
    C.Opcode.RDMA_WRITE_ONLY_IMM: f"payload 0..{C.MAX_PAYLOAD}",
    C.Opcode.SACK: f"{C.SACK_FIXED_LEN} + 8 x words (1..{C.SACK_MAX_WORDS})",
    C.Opcode.NACK: str(C.NACK_LEN),
    C.Opcode.PROBE: str(C.PROBE_LEN),
    C.Opcode.PROBE_REPLY: str(C.PROBE_REPLY_LEN),
    C.Opcode.PORT_STATUS: str(C.PORT_STATUS_LEN),
}


def flag_names(flags: int) -> str:
    """MXH flags as `TRIMMED|LAST` (bit order); reserved bits as hex; empty string for none."""
    names = [f.name for f in C.MxhFlag if flags & f and f.name]
    rest = flags & ~_KNOWN_FLAGS
    if rest:
        names.append(f"{rest:#04x}")
    return "|".join(names)


def packet_kind(pkt: MrcPacket) -> str:
    """The kind used in sample/decode counts: the opcode name, WRITE_TRIMMED for a trimmed WRITE."""
    return f"{pkt.opcode_name}_TRIMMED" if pkt.trimmed else pkt.opcode_name


def _body_doc(pkt: MrcPacket) -> dict[str, Any] | None:
    if pkt.body is None:
        return None
    doc = dataclasses.asdict(pkt.body)
    if isinstance(pkt.body, Sack):
        # Bitmaps reach 1024 bits: hex keeps the JSON portable; the PSNs are what operators want.
        doc["bitmap"] = f"{pkt.body.bitmap:#x}"
        doc["acked_psns"] = pkt.body.acked_psns()
    if pkt.opcode == C.Opcode.NACK:
        doc["code_name"] = C.NackCode(doc["code"]).name
    if pkt.opcode == C.Opcode.PORT_STATUS:
        doc["state_name"] = C.PortState(doc["state"]).name
    return doc


def _info(pkt: MrcPacket) -> str:
    """One short human summary of what a packet says, for the table's last column."""
    b = pkt.body
    if isinstance(b, Sack):
        return f"cum={b.cum_psn} acked={len(b.acked_psns())} echo_ev={b.echo_ev_index}"
    if isinstance(b, Nack):
        return f"{C.NackCode(b.code).name} cum={b.cum_psn} echo_ev={b.echo_ev_index}"
    if isinstance(b, Probe):
        return f"id={b.request_id} reply_qpn={b.reply_qpn:#x}"
    if isinstance(b, ProbeReply):
        return f"id={b.request_id} echo_ev={b.echo_ev_index} svc={b.service_time_ns}ns"
    if isinstance(b, PortStatus):
        return f"port={b.port} {C.PortState(b.state).name} epoch={b.epoch}"
    info = f"va={pkt.va:#x} rkey={pkt.rkey:#x}"
    return info if pkt.imm is None else f"{info} imm={pkt.imm:#010x}"


def decode_frame(
    index: int, ts: float | None, frame: bytes, orig_len: int | None = None, linktype: int = LINKTYPE_ETHERNET
) -> dict[str, Any]:
    """One captured frame as a JSON-ready row; raises WireError when it is not MRC.

    `orig_len` is the frame's length on the wire when the capture kept less (snaplen): the headers are
    then decoded from what was kept and every length reported is the on-the-wire one (`payload_len`
    4096 for a 4096-byte WRITE cut to 200 bytes), with `truncated` true and ICRC "truncated" (it
    cannot be checked), rather than the frame being rejected."""
    c = split_captured(Record(ts, frame, len(frame) if orig_len is None else orig_len, linktype))
    pkt, icrc = parse_captured(c)
    f = c.frame
    # The payload on the wire (DMA length), not what the capture kept; a trimmed packet carries none.
    payload_len = pkt.dma_len if pkt.is_data and not pkt.trimmed else 0
    return {
        "index": index,
        "time": ts,
        "opcode": pkt.opcode_name,
        "kind": packet_kind(pkt),
        "opcode_value": pkt.opcode,
        "qpn": pkt.dqpn,
        "psn": pkt.psn,
        "ev": pkt.ev_index,
        "flags": flag_names(pkt.flags),
        "flags_value": pkt.flags,
        "ackreq": pkt.ackreq,
        "payload_len": payload_len,
        "dma_len": pkt.dma_len,
        "pad": pkt.pad,
        "va": f"{pkt.va:#x}" if pkt.is_data else None,
        "rkey": f"{pkt.rkey:#x}" if pkt.is_data else None,
        "imm": pkt.imm,
        "msn": pkt.msn,
        "msg_len": pkt.msg_len,
        "msg_offset": pkt.msg_offset,
        "timestamp_ns": pkt.timestamp_ns,
        "mrc_len": pkt.length,
        "outer_len": f.outer.payload_len if f.outer else None,
        "inner_len": f.inner.payload_len,
        "frame_len": c.wire_len,
        "captured_len": len(frame),
        "truncated": c.truncated,
        "sport": f.sport,
        "src": f.inner.src_str,
        "dst": f.inner.dst_str,
        "container": f.outer.dst_str if f.outer else None,
        "flow_label": f.outer.flow_label if f.outer else None,
        "ecn": f.outer.ecn if f.outer else f.inner.ecn,
        "icrc": icrc,
        "body": _body_doc(pkt),
        "info": _info(pkt) if pkt.is_data or pkt.body is not None else "body not captured",
    }


def decode_frames(
    name: str, frames: Iterable[Record | tuple[float, bytes]], out: Output | None = None
) -> dict[str, Any]:
    """The `wire decode` document for `frames` (capture records, or (time, Ethernet frame) pairs):
    parsed rows, rejects by reason, ICRC totals ("truncated": snaplen-cut packets whose ICRC the
    capture did not keep)."""
    packets: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    rejected: Counter[str] = Counter()
    icrc: Counter[str] = Counter({"ok": 0, "bad": 0, "ignored": 0, "truncated": 0})
    total = 0
    for total, item in enumerate(frames, 1):
        rec = item if isinstance(item, Record) else Record(item[0], item[1], len(item[1]), LINKTYPE_ETHERNET)
        try:
            row = decode_frame(total, rec.time, rec.data, rec.orig_len, rec.linktype)
        except WireError as e:
            rejected[e.reason] += 1
            errors.append({
                "index": total, "time": rec.time, "reason": e.reason, "detail": str(e),
                "len": rec.orig_len, "captured_len": len(rec.data),
            })
        else:
            icrc[row["icrc"]] += 1
            packets.append(row)
        if out is not None and total % PROGRESS_EVERY == 0:
            out.progress(f"decoded {total} frames")
    return {
        "file": name,
        "packets": packets,
        "errors": errors,
        "total": total,
        "parsed": len(packets),
        "rejected": dict(sorted(rejected.items())),
        "icrc": dict(icrc),
    }


# -------------------------------------------------------------------------------------------- commands





@click.group(invoke_without_command=True)
def wire() -> None:
    """The MRC wire format: show it, write a sample capture, decode a capture."""


@wire.command()
@json_option
@click.pass_obj
def show(out: Output) -> None:
    """Opcodes, header sizes, MXH flags, NACK codes and port states of the wire format."""
    doc: dict[str, Any] = {
        "udp_dport": C.ROCEV2_UDP_PORT,
        "udp_sport": f"{C.EV_SPORT_BASE:#06x} | EV index ({C.EV_INDEX_BITS} bits)",
        "psn_bits": C.PSN_BITS,
        "mxh_version": C.MXH_VERSION,
        "default_payload": C.DEFAULT_PAYLOAD,
        "max_payload": C.MAX_PAYLOAD,
        "headers": [
            {"name": n, "bytes": b}
            for n, b in (
                ("IPv6 (outer)", C.IPV6_LEN), ("IPv6 (inner)", C.IPV6_LEN), ("UDP", C.UDP_LEN),
                ("BTH", C.BTH_LEN), ("RETH", C.RETH_LEN), ("ImmDt", C.IMMDT_LEN), ("MXH", C.MXH_LEN),
                ("ICRC", C.ICRC_LEN),
            )
        ],
        "opcodes": [
            {
                "name": OPCODE_NAMES[op],
                "value": int(op),
                "hex": f"{op:#04x}",
                "layout": _LAYOUTS[op],
                "header_bytes": header_len(op),
                "body_bytes": _BODIES[op],
            }
            for op in C.Opcode
        ],
        "mxh_flags": [{"name": f.name, "value": int(f), "hex": f"{f:#04x}"} for f in C.MxhFlag],
        "sack_flags": [{"name": f.name, "value": int(f), "hex": f"{f:#04x}"} for f in C.SackFlag],
        "nack_codes": [
            {"name": c.name, "value": int(c), "fatal": c in C.FATAL_NACK_CODES} for c in C.NackCode
        ],
        "port_states": [{"name": s.name, "value": int(s)} for s in C.PortState],
    }

    def render(d: dict[str, Any]) -> str:
        parts = [
            f"MRC wire format: UDP dport {d['udp_dport']}, sport {d['udp_sport']}, {d['psn_bits']}-bit PSN, "
            f"MXH version {d['mxh_version']}, payload {d['default_payload']} (max {d['max_payload']}) bytes",
            "",
            table(d["opcodes"], [("hex", "OPCODE"), ("name", "NAME"), ("header_bytes", "HDR"),
                                 ("body_bytes", "BODY"), ("layout", "LAYOUT")]),
            "",
            table(d["headers"], [("name", "HEADER"), ("bytes", "BYTES")]),
            "",
            table(d["mxh_flags"], [("hex", "MXH FLAG"), ("name", "NAME")]),
            "",
            table(d["sack_flags"], [("hex", "SACK FLAG"), ("name", "NAME")]),
            "",
            table(d["nack_codes"], [("value", "NACK CODE"), ("name", "NAME"), ("fatal", "FATAL")]),
            "",
            table(d["port_states"], [("value", "PORT STATE"), ("name", "NAME")]),
        ]
        return "\n".join(parts)

    out.emit(doc, render)


@wire.command()
@click.option("-o", "--out", "path", required=True, type=click.Path(dir_okay=False, writable=True),
              help="pcap file to write (classic pcap, Ethernet).")
@click.option("-n", "--count", default=1, show_default=True, type=click.IntRange(1, MAX_ROUNDS),
              help="Rounds of the eight packet kinds.")
@click.option("-s", "--seed", default=0, show_default=True, type=int, help="Seed for PSNs, EVs, sizes.")
@json_option
@click.pass_obj
def sample(out: Output, path: str, count: int, seed: int) -> None:
    """Write a capture of every MRC packet type, enveloped as on the fabric."""
    out.progress(f"building {count} round(s), {count * len(ROUND)} frames")
    frames = sample_frames(count, seed)
    # A file that cannot be written raises PcapError (an MrcError): mrcctl prints it, exits non-zero.
    n = write_pcap(path, ((SAMPLE_EPOCH + i * SAMPLE_GAP, f) for i, f in enumerate(frames)))
    # Count kinds by parsing what was built, so the report checks the frames as well as naming them.
    types: Counter[str] = Counter()
    for i, frame in enumerate(frames):
        row = decode_frame(i + 1, 0.0, frame)
        types[row["kind"]] += 1
    doc = {"file": path, "packets": n, "rounds": count, "seed": seed, "types": dict(types)}
    out.emit(doc, lambda d: f"wrote {d['packets']} packets to {d['file']}: "
             + ", ".join(f"{k} {v}" for k, v in d["types"].items()))


_DECODE_COLUMNS: Final = [
    ("index", "#"), ("opcode", "OPCODE"), ("qpn_hex", "QPN"), ("psn", "PSN"), ("ev", "EV"),
    ("flags_text", "FLAGS"), ("lens", "PAYLOAD/DMA"), ("ip_lens", "OUTER/UDP"), ("icrc", "ICRC"),
    ("container", "CONTAINER"), ("flow_label", "FLOW"), ("info", "INFO"),
]


@wire.command()
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
@click.pass_obj
def decode(out: Output, file: str) -> None:
    """Decode a pcap or pcapng capture: one row per MRC packet; what is not MRC is counted by reason."""
    # A missing or corrupt file raises PcapError (file, byte offset, block in the message).
    doc = decode_frames(file, read_capture(file), out)

    def render(d: dict[str, Any]) -> str:
        rows: list[dict[str, Any]] = []
        for p in d["packets"]:
            rows.append({
                **p,
                "qpn_hex": f"{p['qpn']:#08x}",
                "flags_text": p["flags"] or None,
                "lens": f"{p['payload_len']}/{p['dma_len']}",
                "ip_lens": f"{p['outer_len'] if p['outer_len'] is not None else '-'}/{p['inner_len']}",
            })
        for e in d["errors"]:
            rows.append({"index": e["index"], "opcode": "REJECTED", "info": e["detail"]})
        rows.sort(key=lambda r: int(r["index"]))
        rej = ", ".join(f"{k} {v}" for k, v in d["rejected"].items()) or "none"
        ic = d["icrc"]
        summary = (
            f"{d['file']}: {d['total']} frames, {d['parsed']} parsed, "
            f"{d['total'] - d['parsed']} rejected ({rej}); "
            f"ICRC ok {ic['ok']}, bad {ic['bad']}, ignored {ic['ignored']}"
            + (f", truncated {ic['truncated']} (cut by the capture's snaplen)" if ic["truncated"] else "")
        )
        return (table(rows, _DECODE_COLUMNS) + "\n" if rows else "") + summary

    out.emit(doc, render)
