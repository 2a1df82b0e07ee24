"""A port where nothing listens, held so that connects to it are refused (ECONNREFUSED).

The socket is bound but never listens: the kernel answers every SYN to the port with an
RST, and while we hold the binding no other process can take the port and start
answering. The ``refuse`` fault of the catalogue is its connection-level sibling on the
server's own port: accepted, then reset before a byte is read.
"""

from __future__ import annotations

import socket

__all__ = ["RefusedPort"]


class RefusedPort:
    """A bound, never-listening TCP socket on ``host``, port chosen by the kernel."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._sock: socket.socket | None = None

    def open(self) -> None:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.bind((self._host, 0))
        except OSError:
            sock.close()
            raise
        self._sock = sock

    @property
    def port(self) -> int:
        if self._sock is None:
            raise RuntimeError("the refused port is not open")
        return int(self._sock.getsockname()[1])

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
