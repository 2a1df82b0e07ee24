"""A listener that never calls accept(), with its backlog filled so that connects time out.

On Linux a listening socket completes handshakes by itself until its accept queue is full:
``listen(0)`` still queues one connection (the kernel's test is ``queued > backlog``). After
that, new SYNs are dropped (with ``tcp_abort_on_overflow = 0``, the default) and the client's
``connect()`` retransmits its SYN until its own timeout: the connect phase hangs. So at
start-up we connect to it ourselves and hold those connections, until the kernel's
``TCP_INFO`` for the listener (``tcpi_unacked`` = queued, ``tcpi_sacked`` = backlog) says the
queue is full. Measured on the 6.x kernels here: one filler connection, then every connect
times out. Where ``TCP_INFO`` cannot be read we keep connecting until one connect does not
complete within `_PROBE_TIMEOUT`.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import anyio

__all__ = ["Blackhole"]

_MAX_FILLERS = 8
_PROBE_TIMEOUT = 1.0  # bounds each filler connect; only reached where TCP_INFO is missing.
_SETTLE = 0.2  # bounds the wait for the kernel to queue a completed filler.


class Blackhole:
    """A never-accepting listener on ``host``, port chosen by the kernel."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._listener: socket.socket | None = None
        self._fillers: list[socket.socket] = []

    @property
    def port(self) -> int:
        """The listener's port."""
        if self._listener is None:
            raise RuntimeError("the blackhole listener is not open")
        return int(self._listener.getsockname()[1])

    @property
    def fillers(self) -> int:
        """How many connections we hold to fill its backlog."""
        return len(self._fillers)

    async def open(self) -> None:
        """Listen, then fill the accept queue. Takes milliseconds on Linux."""
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.bind((self._host, 0))
            listener.listen(0)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        address = listener.getsockname()
        loop = asyncio.get_running_loop()
        for _ in range(_MAX_FILLERS):
            if _queue_full(listener) is True:
                break
            filler = socket.socket(family, socket.SOCK_STREAM)
            filler.setblocking(False)
            try:
                with anyio.fail_after(_PROBE_TIMEOUT):
                    await loop.sock_connect(filler, address)
            except (TimeoutError, OSError):
                filler.close()
                break
            self._fillers.append(filler)
            await _settle(listener, len(self._fillers))

    def close(self) -> None:
        """Close the listener and the filler connections."""
        for sock in self._fillers:
            sock.close()
        self._fillers.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def _queue(listener: socket.socket) -> tuple[int, int] | None:
    """(queued, backlog) of a listening socket, from Linux TCP_INFO; None elsewhere."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        info = listener.getsockopt(socket.IPPROTO_TCP, option, 104)
    except OSError:
        return None
    if len(info) < 32:
        return None
    queued, backlog = struct.unpack_from("II", info, 24)
    return int(queued), int(backlog)


def _queue_full(listener: socket.socket) -> bool | None:
    queue = _queue(listener)
    return None if queue is None else queue[0] > queue[1]


async def _settle(listener: socket.socket, expected: int) -> None:
    """Wait (at most `_SETTLE`) until the kernel has queued ``expected`` connections."""
    deadline = time.monotonic() + _SETTLE
    while time.monotonic() < deadline:
        queue = _queue(listener)
        if queue is None or queue[0] >= expected:
            return
        await asyncio.sleep(0.001)
