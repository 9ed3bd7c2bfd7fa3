"""`mrcctl bench write` between machines, perftest-style: the destination runs `mrcctl bench serve`, the
source `mrcctl bench write --server ADDR:PORT`; each talks only to its own host's mrcd. A TCP side channel
(or an AF_UNIX path, for machines that share a filesystem) carries what RDMA's out-of-band exchange does:

    client -> server  {"op": "setup", "peer": <source host>, "size": N, "evs": E|null, "planes": [..]|null}
    server -> client  {"host": <destination host>, "qpn": Q, "addr": A, "rkey": K}
    client -> server  {"op": "connect", "qpn": <source QPN>}            (the server posts a receive)
    server -> client  {"ok": true}
    client -> server  {"op": "check", "wr": W}  (after the source's WRITE-with-immediate completed)
    server -> client  {"byte_len": B, "digest": <BLAKE2b of the first B bytes>}
    client -> server  {"op": "done"}

The time is the source's: from posting the WRITE to its completion (every PSN acknowledged, so every byte
is in the destination's memory); bit-exactness is the digest of the destination's buffer against the
source's. Every line is bounded (`MAX_LINE`), every read has a timeout, and the server serves one client at
a time, freeing its QP and memory region when the client goes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from mrc.dataplane.client import ClientQp, MrcClient, RemoteMr
from mrc.errors import MrcError

MAX_LINE: Final = 1 << 16
DEFAULT_PORT: Final = 18515  # perftest's
#: The largest buffer a client may make `serve` register (a memfd of that size): bounded, since anyone who
#: reaches the port can ask; `mrcctl bench serve --max-size` changes it.
MAX_SIZE: Final = 1 << 32


def parse_endpoint(text: str) -> tuple[int, Any]:
    """ADDR:PORT ([v6]:PORT, host:PORT, or :PORT for every address) -> (family, sockaddr); a path
    (containing '/') -> AF_UNIX."""
    if "/" in text:
        return socket.AF_UNIX, text
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise MrcError(f"{text!r}: expected ADDR:PORT, [V6ADDR]:PORT or a socket path")
    host = host.strip("[]") or "::"
    try:
        info = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise MrcError(f"{text}: {e.strerror}") from None
    fam, _t, _p, _c, addr = info[0]
    return fam, addr


def server_for(dst: str) -> str:
    """`--dst` on a real host: HOST, HOST:PORT, [V6]:PORT or a bare IPv6 address -> an endpoint (the
    default port is perftest's)."""
    import ipaddress

    with contextlib.suppress(ValueError):
        return f"[{ipaddress.IPv6Address(dst)}]:{DEFAULT_PORT}"
    if "/" in dst or dst.rpartition(":")[2].isdigit():
        return dst
    return f"{dst}:{DEFAULT_PORT}"


class Channel:
    """JSON lines on a stream socket, each read bounded in size and time."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        self.sock.settimeout(timeout_s)
        self.buf = b""

    def send(self, doc: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(doc) + "\n").encode())

    def recv(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise MrcError(f"bench peer: a line longer than {MAX_LINE} bytes")
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                raise MrcError("bench peer: no answer in time") from None
            if not data:
                raise MrcError("bench peer: closed the connection")
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            doc = json.loads(line)
        except ValueError:
            raise MrcError("bench peer: not JSON") from None
        if not isinstance(doc, dict):
            raise MrcError("bench peer: not a JSON object")
        if "error" in doc:
            raise MrcError(f"bench peer: {doc['error']}")
        return doc


def _digest(view: np.ndarray[Any, np.dtype[np.uint8]], n: int) -> str:
    return hashlib.blake2b(view[:n].tobytes(), digest_size=16).hexdigest()


@dataclass
class _Session:
    mr: RemoteMr
    qp: ClientQp
    view: np.ndarray[Any, np.dtype[np.uint8]]


def _serve_one(mrcd: MrcClient, ch: Channel, timeout_s: float, max_size: int) -> None:
    req = ch.recv()
    if req.get("op") != "setup":
        raise MrcError("bench peer: expected setup")
    size = int(req["size"])
    if not 0 < size <= max_size:
        raise MrcError(f"bench peer: size {size} out of range 1..{max_size} (bench serve --max-size)")
    mr = mrcd.reg_mr(size)
    qp = mrcd.create_qp(str(req["peer"]), evs=req.get("evs"), planes=req.get("planes"))
    s = _Session(mr, qp, np.frombuffer(mr.buf, dtype=np.uint8))
    try:
        ch.send({"host": mrcd.info["host"], "qpn": qp.qpn, "addr": mr.addr, "rkey": mr.rkey, "mtu": qp.mtu})
        while True:
            req = ch.recv()
            op = req.get("op")
            if op == "connect":
                mtu = req.get("mtu")
                mrcd.connect(qp, int(req["qpn"]), None if mtu is None else int(mtu))
                ch.send({"ok": True})
            elif op == "recv":
                s.view[:] = 0
                mrcd.post_recv(qp, int(req["wr"]))
                ch.send({"ok": True})
            elif op == "check":
                wc = mrcd.wait_wc(qp, int(req["wr"]), timeout=timeout_s)
                n = int(wc["byte_len"])
                ch.send({"byte_len": n, "status": wc["status"], "digest": _digest(s.view, n)})
            elif op == "done":
                return
            else:
                raise MrcError(f"bench peer: unknown op {op!r}")
    finally:
        del s.view
        with contextlib.suppress(Exception):
            mrcd.destroy_qp(qp)


def serve(listen: str, *, socket_path: Path | None = None, once: bool = False, timeout_s: float = 600.0,
          max_size: int = MAX_SIZE, log: Any = None) -> int:
    """Serve WRITE benchmarks to clients on `listen`, through the local mrcd; returns the number served."""
    fam, addr = parse_endpoint(listen)
    srv = socket.socket(fam, socket.SOCK_STREAM)
    served = 0
    try:
        if fam == socket.AF_UNIX:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(addr)
        else:
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(addr)
        srv.listen(4)
        if log is not None:
            log(f"bench serve: listening on {listen}")
        while True:
            conn, _ = srv.accept()
            with conn, _mrcd(socket_path) as mrcd:
                ch = Channel(conn, timeout_s)
                try:
                    _serve_one(mrcd, ch, timeout_s, max_size)
                    served += 1
                except (MrcError, OSError, KeyError, ValueError, TypeError) as e:
                    with contextlib.suppress(OSError):
                        ch.send({"error": str(e)})
                    if log is not None:
                        log(f"bench serve: {e}")
            if once:
                return served
    finally:
        srv.close()
        if fam == socket.AF_UNIX:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(addr)


@contextlib.contextmanager
def _mrcd(path: Path | None) -> Any:
    from .api import local_socket

    p = path or local_socket()
    if p is None:
        raise MrcError("no local mrcd: set $MRC_SOCKET or start mrcd (its socket: /run/mrc/mrcd.sock)")
    c = MrcClient(p, timeout=30.0)
    try:
        yield c
    finally:
        c.close()


def write(server: str, sizes: list[int], *, iters: int = 1, evs: int | None = None,
          planes: list[int] | None = None, seed: int = 1, socket_path: Path | None = None,
          timeout_s: float = 600.0) -> dict[str, Any]:
    """The WRITE benchmark against a `serve` at `server`, from the local mrcd."""
    fam, addr = parse_endpoint(server)
    biggest = max(sizes)
    with _mrcd(socket_path) as mrcd, socket.socket(fam, socket.SOCK_STREAM) as sk:
        sk.settimeout(30.0)
        try:
            sk.connect(addr)
        except OSError as e:
            raise MrcError(f"{server}: {os.strerror(e.errno or 0) or e} (is 'mrcctl bench serve' running "
                           "there?)") from None
        ch = Channel(sk, timeout_s)
        ch.send({"op": "setup", "peer": mrcd.info["host"], "size": biggest, "evs": evs, "planes": planes})
        far = ch.recv()
        try:
            dst, far_qpn, far_addr, far_rkey = (str(far["host"]), int(far["qpn"]), int(far["addr"]),
                                                int(far["rkey"]))
            far_mtu = None if far.get("mtu") is None else int(far["mtu"])  # a server before the path MTU
        except (KeyError, TypeError, ValueError):
            raise MrcError(f"{server}: not a bench serve reply: {far}") from None
        mr = mrcd.reg_mr(biggest)
        qp = mrcd.create_qp(dst, evs=evs, planes=planes)
        view = np.frombuffer(mr.buf, dtype=np.uint8)
        try:
            view[:] = np.random.default_rng(seed).integers(0, 256, biggest, dtype=np.uint8)
            mrcd.connect(qp, far_qpn, far_mtu)
            ch.send({"op": "connect", "qpn": qp.qpn, "mtu": qp.mtu})
            ch.recv()
            rows = []
            exact_all = True
            wr = 0
            for size in sizes:
                times = []
                st0 = mrcd.call("qp_stats", qpn=qp.qpn)
                for _ in range(iters):
                    wr += 1
                    ch.send({"op": "recv", "wr": wr})
                    ch.recv()
                    t0 = time.monotonic_ns()
                    mrcd.post_send(qp, wr_id=wr, mr=mr, offset=0, length=size, remote_addr=far_addr,
                                   rkey=far_rkey, imm=wr & 0xFFFFFFFF)
                    wc = mrcd.wait_wc(qp, wr, timeout=timeout_s)
                    times.append((int(wc["time_ns"]) - t0) / 1e9)
                    ch.send({"op": "check", "wr": wr})
                    got = ch.recv()
                    exact = got.get("byte_len") == size and got.get("digest") == _digest(view, size)
                    exact_all &= bool(exact)
                st1 = mrcd.call("qp_stats", qpn=qp.qpn)
                t = sum(times)
                pb0, pb1 = st0["port_bytes"], st1["port_bytes"]
                rows.append({"bytes": size, "iters": iters,
                             "bw_peak_gbps": round(size * 8 / min(times) / 1e9, 6),
                             "bw_avg_gbps": round(size * iters * 8 / t / 1e9, 6),
                             "msg_rate": round(iters / t, 3),
                             "plane_gbps": {str(p): round((pb1[p] - pb0[p]) * 8 / t / 1e9, 6)
                                            for p in range(len(pb1))},
                             "seconds": round(t, 4)})
            ch.send({"op": "done"})
        finally:
            del view
            with contextlib.suppress(Exception):
                mrcd.destroy_qp(qp)
    return {"src": mrcd.info["host"], "dst": dst, "server": server, "bit_exact": exact_all, "rows": rows}
