"""A completion channel that `selectors` can wait on: the engine's `CompletionChannel` (pure, in
`mrc.transport`) plus an eventfd that becomes readable when a CQ event is queued, as the fd of an
`ibv_comp_channel` does. The engine stays free of file descriptors; this is the driver's half."""

from __future__ import annotations

import contextlib
import os

from mrc.transport import CompletionChannel, CompletionQueue


class FdCompletionChannel(CompletionChannel):
    """`fileno()` is readable while events are pending; `get_cq_event` returns them oldest first and
    drains the fd once none is left. `close()` releases the fd (also on garbage collection of a
    `with` block)."""

    __slots__ = ("_fd",)

    def __init__(self) -> None:
        super().__init__()
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.on_event = self._signal

    def _signal(self) -> None:
        os.eventfd_write(self._fd, 1)

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("completion channel is closed")
        return self._fd

    def get_cq_event(self) -> CompletionQueue | None:
        cq = super().get_cq_event()
        if not len(self) and self._fd >= 0:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._fd)  # nothing pending: the fd is not readable any more
        return cq

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FdCompletionChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
