"""The rendezvous interface the rank transports share (MRC ranks, co-located ranks): a key-value store
whose `get` blocks until the key is set. Implementations (torch TCPStore, JSON files) are in
`mrc.dataplane.collective`."""

from __future__ import annotations

from typing import Protocol


class Store(Protocol):
    """The rendezvous: set a key once, get blocks until it is set (or raises after the store's timeout)."""

    def set(self, key: str, value: str) -> None: ...

    def get(self, key: str) -> str: ...

    def check(self) -> None:
        """Raise if the rendezvous has failed (a peer said it could not start); called while waiting for
        something other than a key (co-located ranks connecting). A no-op for stores without such word."""
