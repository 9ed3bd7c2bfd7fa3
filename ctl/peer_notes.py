"""Lines from this mrcd to peer mrcds (the controller's `TellPeer` effects: a fabric link failed or
came back), on non-blocking AF_UNIX sockets in mrcd's selector.

Why here and not inline: a peer mrcd that is slow, stopped or gone must never delay the local controller's
DENY / REPLACE of a failed link. `PeerNotifier.send` only queues; the loop calls `pump` and `on_writable`
after the engine work of its turn, and nothing here blocks.
"""

from __future__ import annotations

import contextlib
import errno
import json
import selectors
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

#: how long a `link_status` line to a peer mrcd is retried (its listen backlog full) before it is dropped
PEER_NOTE_NS: Final = 1_000_000_000


def link_status_line(link: Iterable[str], state: str, sender: str) -> bytes:
    """The `link_status` request one mrcd sends the others: fabric link `link` is `state` (down / up),
    as `sender` found (mrc.dataplane.protocol's schema; on a real fabric this is the controllers' own
    channel)."""
    return (json.dumps({"id": 0, "op": "link_status", "link": sorted(link), "state": state,
                        "from": sender}) + "\n").encode()


@dataclass
class PeerNote:
    """One line on its way to one peer mrcd's control socket (`PeerNotifier`)."""

    path: str
    data: bytes
    deadline: int
    sock: socket.socket | None = None
    connected: bool = False


class PeerNotifier:
    """Lines to peer mrcds (the controller's `TellPeer`) on non-blocking AF_UNIX sockets in mrcd's
    selector, so that no peer can hold up mrcd's loop: `send` only queues; `pump` connects without
    blocking (a peer whose listen backlog is full, EAGAIN, is retried on later turns); a connected note
    is written when the selector reports it writable (`on_writable`) and closed once sent. A peer whose
    socket is missing or refuses, or that stays unreachable for `patience_ns`, is dropped and counted
    (`tally`: sent / dropped, in mrcd's `stats` as peer_notes)."""

    def __init__(self, sel: selectors.BaseSelector, *, patience_ns: int = PEER_NOTE_NS) -> None:
        self.sel = sel
        self.patience_ns = patience_ns
        self.pending: list[PeerNote] = []  # not connected yet
        self.tally: dict[str, int] = {"sent": 0, "dropped": 0}

    def send(self, path: str, data: bytes, now: int) -> None:
        self.pending.append(PeerNote(path, data, now + self.patience_ns))

    def pump(self, now: int) -> None:
        """Try to connect every pending note once (never blocks)."""
        keep: list[PeerNote] = []
        for n in self.pending:
            if n.sock is None:
                n.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                n.sock.setblocking(False)
            err = n.sock.connect_ex(n.path)
            if err in (0, errno.EISCONN):
                n.connected = True
                self.sel.register(n.sock, selectors.EVENT_WRITE, n)
            elif err in (errno.EAGAIN, errno.EINPROGRESS, errno.EALREADY) and now < n.deadline:
                keep.append(n)
            else:
                self._drop(n)
        self.pending = keep

    def on_writable(self, n: PeerNote, now: int) -> None:
        """The note's socket is writable: write what is left of the line; when it is all sent (or the
        peer failed), close."""
        assert n.sock is not None
        try:
            sent = n.sock.send(n.data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(n)
            return
        n.data = n.data[sent:]
        if not n.data:
            self.tally["sent"] += 1
            self._close(n)
        elif now >= n.deadline:
            self._drop(n)

    def busy(self) -> bool:
        """Anything still queued or in the selector."""
        return bool(self.pending) or any(isinstance(k.data, PeerNote) for k in self.sel.get_map().values())

    def close(self) -> None:
        for n in self.pending + [k.data for k in self.sel.get_map().values() if isinstance(k.data, PeerNote)]:
            self._close(n)
        self.pending = []

    def _close(self, n: PeerNote) -> None:
        if n.sock is not None:
            if n.connected:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(n.sock)
            n.sock.close()
            n.sock = None

    def _drop(self, n: PeerNote) -> None:
        self.tally["dropped"] += 1
        self._close(n)
