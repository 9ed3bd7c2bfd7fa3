"""The mrcd control protocol: every operation's request fields and response shape, in one table that the
client (`mrc.dataplane.client`) and the server (`mrc.ctl.daemon`) both validate against.

Why one table: before it, each handler read `req[...]` with `int()` / `str()` and the dispatcher guessed
from the exception type whether the client or the handler was at fault, so a handler's KeyError came
back as "bad request" and a typo'd field (``qnp=``) was silently ignored. With the schema checked first,
everything wrong with the request itself is known before the handler runs; what the handler raises
after that is either a refusal (`MrcError` / `ValueError`: unknown QPN, no such plane) or a bug.

Wire format (unchanged from before the table): one JSON object per line, ``{"id", "op", ...fields}``;
one reply per line, ``{"id", "ok": value}`` or ``{"id", "error": message, "kind": kind}`` where `kind`
is one of `ErrorKind` (older mrcds send no `kind`). The protocol version is ``MAJOR.MINOR``: `hello`
carries the client's in `protocol` and answers with mrcd's; a different major is refused, a newer
minor on either side is fine (minors only add optional fields and ops).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from mrc.errors import MrcError
from mrc.wire.consts import MAX_PAYLOAD, MIN_PAYLOAD

#: The protocol this code speaks. Bump MINOR when adding an optional field or an op, MAJOR when a request
#: that was valid before would be read differently.
PROTOCOL_MAJOR: Final = 1
# 1.1: create_qp answers `mtu`, connect takes it. 1.2: reg_mr's memfd must be sealed against shrinking
# (F_SEAL_SHRINK; dataplane/shm.py): an unsealed one is refused with a message that says so -- a minor
# bump, since a client of 1.1 is told exactly what to change rather than refused outright
PROTOCOL_MINOR: Final = 2
PROTOCOL_VERSION: Final = f"{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"

#: Keys every request may carry besides its op's fields.
ENVELOPE: Final = frozenset({"id", "op"})

U32: Final = (1 << 32) - 1
U64: Final = (1 << 64) - 1

#: The longest request line mrcd reads (without its newline); a longer one is refused `too_long` and
#: skipped. The client checks its own requests against it before sending (`encode_request`), so that an
#: over-long request fails at once with a message instead of with mrcd's id-less refusal.
MAX_REQUEST_BYTES: Final = 1 << 16
#: The longest `from` of a link_status report: a host name (mrc.hostconfig allows 63 characters). The
#: reporter is kept per denied link until that link is restored, and shown in the controller's log, so
#: an unbounded one let a forged report make mrcd hold (and answer `actions` with) megabytes per line.
MAX_REPORTER_LEN: Final = 64


class ErrorKind(StrEnum):
    """Who is at fault, as the client is told (the `kind` of an error reply)."""

    BAD_REQUEST = "bad_request"  # malformed JSON, missing / ill-typed field, unknown op
    UNKNOWN_FIELD = "unknown_field"  # a field the op does not take
    REFUSED = "refused"  # a valid request that mrcd declines (unknown QPN, protocol major mismatch)
    INTERNAL = "internal"  # a bug in mrcd's handler; mrcd logs it and goes on


class RejectReason(StrEnum):
    """Why mrcd refused a control-socket request: the closed set of `mrc_control_rejected_total{reason}`
    (published at 0 from the first scrape, so a rate sees the first refusal)."""

    TOO_LONG = "too_long"  # a line longer than the request limit
    BAD_JSON = "bad_json"  # not JSON, nested too deeply, NaN / Infinity
    NOT_OBJECT = "not_object"  # JSON, but not an object
    BAD_OP = "bad_op"  # no string `op`
    UNKNOWN_OP = "unknown_op"
    UNKNOWN_FIELD = "unknown_field"
    BAD_FIELD = "bad_field"  # a missing, ill-typed or out-of-range field
    VERSION = "version"  # a protocol major version mrcd does not speak
    INVALID = "invalid"  # a valid request mrcd declines (unknown QPN, a state that does not allow it)
    INTERNAL = "internal"  # a bug in mrcd's handler
    TOO_MANY_FDS = "too_many_fds"  # descriptors beyond a request's limit, closed unused
    ACCEPT_FAILED = "accept_failed"  # a connection mrcd could not accept (out of descriptors)
    TOO_MANY_CLIENTS = "too_many_clients"  # a connection beyond mrcd's limit, refused at once
    QUEUE_FULL = "queue_full"  # a post beyond the QP's queue or the client's work-request budget


class ProtocolError(MrcError):
    """A request that fails the schema (raised locally by the client, or by mrcd before dispatch), or an
    error reply from mrcd. `reason` keys mrcd's `mrc_control_rejected_total{reason}`; `kind` is what the
    client is told."""

    def __init__(self, kind: ErrorKind, reason: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class Field:
    """One request field. `type` is one of ``int``, ``bool``, ``str``, ``int_list``, ``str_pair``; `lo` /
    `hi` bound an int (each element of an int_list); `choices` bounds a str, `max_len` its length (for
    what mrcd keeps). An optional field may be sent as null (the client sends its defaults, e.g.
    ``evs=None``, rather than leaving them out): null means the op's default, as if left out."""

    name: str
    type: str
    required: bool = True
    lo: int | None = None
    hi: int | None = None
    choices: tuple[str, ...] | None = None
    max_len: int | None = None

    def expected(self) -> str:
        """The expected type in words, for error messages and docs."""
        base = {"int": "an integer", "bool": "a boolean", "str": "a string",
                "int_list": "a list of integers", "str_pair": "a list of two strings"}[self.type]
        if self.lo is not None and self.hi is not None:
            base += f" in {self.lo}..{self.hi}"
        if self.choices:
            base += " (" + " or ".join(self.choices) + ")"
        if self.max_len is not None:
            base += f" of at most {self.max_len} characters"
        return base + ("" if self.required else " or null")


@dataclass(frozen=True)
class Response:
    """The shape of an op's `ok` value: ``object`` with at least `keys`, ``list`` (of objects with at least
    `keys`), or ``null``."""

    kind: str
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class OpSpec:
    name: str
    fields: tuple[Field, ...]
    response: Response
    doc: str
    fds: bool = False  # the request carries file descriptors (SCM_RIGHTS)

    def field_list(self) -> str:
        return ", ".join(f.name for f in self.fields) or "no fields"


def _i(name: str, lo: int, hi: int, *, required: bool = True) -> Field:
    return Field(name, "int", required, lo, hi)


def _op(name: str, doc: str, response: Response, *fields: Field, fds: bool = False) -> OpSpec:
    return OpSpec(name, tuple(fields), response, doc, fds)


_NULL: Final = Response("null")
_EV_SELECT: Final = (Field("peer", "str"), Field("evs", "int_list", False, 0, 0xFFFF),
                     _i("plane", 0, 255, required=False), Field("link", "str", False))

#: Every operation mrcd serves. `tests/unit/test_protocol.py` checks this against mrcd's `op_*` methods.
OPS: Final[Mapping[str, OpSpec]] = {s.name: s for s in (
    _op("hello", "mrcd's identity; exchanges protocol versions",
        Response("object", ("host", "testbed", "gid", "planes", "evs", "pid", "version", "peers",
                            "link_rate_bps")),  # `protocol` too, from 1.0 on
        Field("protocol", "str", False)),
    _op("reg_mr", "register the memfd sent with the request (SCM_RIGHTS) as a memory region",
        Response("object", ("handle", "rkey", "addr", "length")), _i("length", 1, U64), fds=True),
    _op("create_qp", "a QP toward host `peer`, optionally restricted to `evs` EVs on `planes`",
        Response("object", ("qpn", "peer_gid")),
        Field("peer", "str"), _i("evs", 1, 0xFFFF, required=False),
        Field("planes", "int_list", False, 0, 255), Field("cc", "str", False, choices=("nscc", "null"))),
    _op("connect", "connect this client's QP to the peer's QP (whose payload per packet is `mtu`)", _NULL,
        _i("qpn", 0, U32), _i("peer_qpn", 0, U32), _i("mtu", MIN_PAYLOAD, MAX_PAYLOAD, required=False)),
    _op("destroy_qp", "destroy this client's QP", _NULL, _i("qpn", 0, U32)),
    _op("post_send", "RDMA write (with immediate if `imm`) from region `mr`", _NULL,
        _i("qpn", 0, U32), _i("wr_id", 0, U64), _i("mr", 0, U32), _i("offset", 0, U64), _i("length", 0, U64),
        _i("remote_addr", 0, U64), _i("rkey", 0, U32), _i("imm", 0, U32, required=False)),
    _op("post_recv", "post a receive for a write with immediate", _NULL,
        _i("qpn", 0, U32), _i("wr_id", 0, U64)),
    _op("qp_stats", "one QP's counters (any client's)", Response("object", ("qpn", "peer", "time_ns")),
        _i("qpn", 0, U32)),
    _op("qp_show", "every QP of the host", Response("list", ("host", "qpn", "peer", "state"))),
    _op("ev_show", "the EV table per peer, optionally only EVs in `state`",
        Response("object", ("host", "peers", "denied_links")), Field("state", "str", False)),
    _op("ev_deny", "DENY EVs toward `peer` (indices, a plane or a link A-B)",
        Response("object", ("host", "peer", "denied")), *_EV_SELECT),
    _op("ev_restore", "restore EVs toward `peer`", Response("object", ("host", "peer", "restored")),
        *_EV_SELECT),
    _op("port_show", "the host's ports", Response("list", ("host", "port", "ifname", "enabled", "failed"))),
    _op("port_set", "enable / disable a port", Response("object", ("host", "port", "enabled")),
        _i("port", 0, 255), Field("enabled", "bool")),
    _op("link_status", "a peer mrcd reports a fabric link down / up", Response("object", ("host", "result")),
        Field("link", "str_pair"), Field("state", "str", choices=("down", "up")),
        Field("from", "str", False, max_len=MAX_REPORTER_LEN)),
    _op("actions", "the controller's actions and EV events since `since_ns`",
        Response("object", ("actions", "events")), _i("since_ns", 0, U64, required=False)),
    _op("stats", "engine, driver, controller and dataplane counters",
        Response("object", ("host", "engine_drops", "driver", "qps", "controller", "denied_links"))),
)}


def _bad(reason: str, message: str) -> ProtocolError:
    return ProtocolError(ErrorKind.BAD_REQUEST, reason, message)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(op: str, f: Field, v: Any) -> None:
    def wrong() -> ProtocolError:
        return _bad(RejectReason.BAD_FIELD, f"bad request: {op}: field {f.name!r} must be {f.expected()}, "
                                 f"got {type(v).__name__} {_short(v)}")

    if f.type == "int":
        if not _is_int(v):
            raise wrong()
        if (f.lo is not None and v < f.lo) or (f.hi is not None and v > f.hi):
            raise wrong()
    elif f.type == "bool":
        if not isinstance(v, bool):
            raise wrong()
    elif f.type == "str":
        if not isinstance(v, str) or (f.choices and v not in f.choices):
            raise wrong()
        if f.max_len is not None and len(v) > f.max_len:
            raise _bad(RejectReason.BAD_FIELD, f"bad request: {op}: field {f.name!r} must be {f.expected()}, "
                                               f"got {len(v)} characters")
    elif f.type == "int_list":
        if not isinstance(v, list) or not all(_is_int(x) for x in v):
            raise wrong()
        if any((f.lo is not None and x < f.lo) or (f.hi is not None and x > f.hi) for x in v):
            raise wrong()
    elif f.type == "str_pair":
        if not isinstance(v, list) or len(v) != 2 or not all(isinstance(x, str) for x in v):
            raise wrong()
    else:  # pragma: no cover - the table above uses only the types listed
        raise AssertionError(f"field type {f.type!r}")


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def validate_request(req: Mapping[str, Any]) -> OpSpec:
    """Check one request (its `op` a string) against the schema; returns the op's spec or raises
    `ProtocolError`: unknown op, unknown field (named, with the op's field list), missing or ill-typed
    field (named, with the expected type and range)."""
    op = req["op"]
    spec = OPS.get(op)
    if spec is None:
        raise _bad(RejectReason.UNKNOWN_OP, f"unknown operation {op[:64]!r} (operations: {', '.join(OPS)})")
    known = {f.name for f in spec.fields}
    extra = sorted(str(k) for k in req if k not in known and k not in ENVELOPE)
    if extra:
        raise ProtocolError(ErrorKind.UNKNOWN_FIELD, RejectReason.UNKNOWN_FIELD,
                            f"{op}: unknown field {extra[0][:64]!r} (it takes: {spec.field_list()})")
    for f in spec.fields:
        if f.name not in req or (req[f.name] is None and not f.required):
            if f.required:
                raise _bad(RejectReason.BAD_FIELD,
                           f"bad request: {op}: missing field {f.name!r} ({f.expected()})")
            continue
        _check(op, f, req[f.name])
    return spec


def optional(op: str, req: Mapping[str, Any], name: str, default: Any) -> Any:
    """Optional field `name` of a request to `op`: `default` when it is left out or null, else its value,
    checked against the op's schema (`ProtocolError` naming the field). A handler reads its optional
    fields with this rather than ``int(req.get(name, default))``, which turned a null into an internal
    error (``int(None)``) and a null `from` into the reporter "None"."""
    v = req.get(name)
    if v is None:
        return default
    spec = OPS[op]
    f = next(x for x in spec.fields if x.name == name)
    _check(op, f, v)
    return v


def encode_request(doc: Mapping[str, Any]) -> bytes:
    """One request as the line the client sends (newline included), or `ProtocolError` (bad_request,
    too_long) when mrcd would refuse it for its length: mrcd cannot tell which request such a line
    was (it answers with id null), so the client checks it here, before sending anything."""
    data = json.dumps(doc, separators=(",", ":")).encode()
    if len(data) > MAX_REQUEST_BYTES:
        raise _bad(RejectReason.TOO_LONG,
                   f"bad request: {doc.get('op')}: the request is {len(data)} bytes encoded, longer "
                   f"than the {MAX_REQUEST_BYTES} bytes mrcd reads in one line")
    return data + b"\n"


def check_response(op: str, value: Any) -> None:
    """Raise MrcError when mrcd's `ok` value for `op` does not have the op's response shape (an mrcd
    speaking another protocol, or a handler bug), rather than failing later on a missing key."""
    r = OPS[op].response
    rows: list[Any]
    if r.kind == "null":
        if value is not None:
            raise MrcError(f"{op}: mrcd answered {type(value).__name__}, expected null")
        return
    if r.kind == "object":
        rows = [value]
    else:
        if not isinstance(value, list):
            raise MrcError(f"{op}: mrcd answered {type(value).__name__}, expected a list")
        rows = value
    for row in rows:
        if not isinstance(row, dict):
            raise MrcError(f"{op}: mrcd answered {type(row).__name__}, expected an object")
        missing = [k for k in r.keys if k not in row]
        if missing:
            raise MrcError(f"{op}: mrcd's answer lacks {', '.join(missing)}")


def parse_version(v: str) -> tuple[int, int]:
    """``"MAJOR.MINOR"`` -> (major, minor), or ProtocolError (bad_request)."""
    major, sep, minor = v.partition(".")
    # ASCII digits only ("²".isdigit() is true and int() refuses it), and short enough for int()
    if not (sep and 0 < len(major) <= 9 and 0 < len(minor) <= 9 and major.isascii() and minor.isascii()
            and major.isdigit() and minor.isdigit()):
        raise _bad(RejectReason.BAD_FIELD,
                   f"bad request: hello: protocol must be MAJOR.MINOR, got {_short(v)}")
    return int(major), int(minor)


def check_version(theirs: str, *, side: str) -> None:
    """Refuse a peer (`side`: "client" or "mrcd") whose protocol major differs from ours."""
    major, _minor = parse_version(theirs)
    if major != PROTOCOL_MAJOR:
        newer = "newer" if major > PROTOCOL_MAJOR else "older"
        fix = ("upgrade mrcd" if side == "client" else "upgrade the client") if newer == "newer" else \
            ("upgrade the client" if side == "client" else "upgrade mrcd")
        raise ProtocolError(ErrorKind.REFUSED, RejectReason.VERSION,
                            f"protocol version mismatch: the {side} speaks {theirs} ({newer} major), "
                            f"this side speaks {PROTOCOL_VERSION}: {fix}")
