"""`FaultServer`: the asyncio listener, its connections, its stats, and its URLs."""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from types import TracebackType

import anyio

from ._blackhole import Blackhole
from ._connection import Connection
from ._faults import FaultSpec, ParamValue
from ._stats import Counters, KeyStats, ServerStats

__all__ = ["FaultServer"]

logger = logging.getLogger("fault_server")

_SHUTDOWN = 0.5  # bounds how long aclose() waits for cancelled connections to finish.
_BACKLOG = 512


class FaultServer:
    """An OpenAI-compatible HTTP/1.1 server that misbehaves on request, below HTTP if asked.

    Each request picks its fault from its path (``/fault/<name>;k=v/v1/...``) or an
    ``X-Fault`` header; see `FAULTS`. Every fault ends by itself within its ``hold``, which
    never exceeds ``max_hold``; `aclose` ends all of them at once.

    Args:
        host: address to bind; loopback by default. The URLs use the bound numeric address.
        port: port to bind; 0 lets the kernel choose.
        max_hold: most seconds any fault, request read or idle keep-alive connection may
            last before the server closes the connection itself.

    Raises:
        ValueError: for a port outside 0..65535 or a max_hold that is not a positive number.

    Example:
        >>> async with FaultServer() as srv:  # doctest: +SKIP
        ...     client = openai.AsyncOpenAI(base_url=srv.url("sse_stall"), api_key="x")
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, max_hold: float = 30.0) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an integer in 0..65535, got {port!r}")
        if (
            isinstance(max_hold, bool)
            or not isinstance(max_hold, (int, float))
            or not math.isfinite(max_hold)
            or max_hold <= 0
        ):
            raise ValueError(f"max_hold must be a finite number of seconds > 0, got {max_hold!r}")
        self._host = host
        self._port = port
        self._max_hold = float(max_hold)
        self._counters = Counters()
        self._server: asyncio.Server | None = None
        self._address: tuple[str, int] | None = None
        self._blackhole: Blackhole | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and start serving; also opens the never-accepting listener.

        Raises:
            RuntimeError: if already started.
            OSError: if the address cannot be bound.
        """
        if self._server is not None or self._closing:
            raise RuntimeError("FaultServer.start() may be called once")
        sock = _bind(self._host, self._port)
        host, port = sock.getsockname()[:2]
        try:
            self._server = await asyncio.start_server(self._on_connect, sock=sock)
            self._blackhole = Blackhole(host)
            await self._blackhole.open()
        except BaseException:
            await self.aclose()
            sock.close()
            raise
        self._address = (host, port)

    async def aclose(self) -> None:
        """Stop listening and end every connection and fault now (well under a second)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            # Connection tasks never end with an exception (_on_connect catches them all),
            # so waiting for them is enough: there is no outcome left to retrieve.
            _, pending = await asyncio.wait(tasks, timeout=_SHUTDOWN)
            if pending:
                logger.warning(
                    "fault_server: %d connection(s) still ending after %s s",
                    len(pending),
                    _SHUTDOWN,
                )
        if self._blackhole is not None:
            self._blackhole.close()
        if self._server is not None:
            with anyio.move_on_after(_SHUTDOWN) as scope:
                await self._server.wait_closed()
            if scope.cancelled_caught:
                logger.warning("fault_server: listener did not report closed in time")

    async def __aenter__(self) -> FaultServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self._closing or task is None:
            writer.transport.abort()
            return
        self._tasks.add(task)
        self._counters.connection_opened()
        try:
            await Connection(reader, writer, self._counters, self._max_hold).serve()
        except asyncio.CancelledError:
            # Only aclose() cancels us, and it waits for us without reading our outcome:
            # ending quietly also spares the start_server done-callback of some Python
            # versions, which calls task.exception() and so fails on a cancelled task.
            pass
        except Exception:
            logger.exception("fault_server: connection handler failed")
        finally:
            self._counters.connection_closed()
            self._tasks.discard(task)

    # -- URLs --------------------------------------------------------------------------

    @property
    def max_hold(self) -> float:
        """The cap on every fault's ``hold``, in seconds."""
        return self._max_hold

    @property
    def port(self) -> int:
        """The bound port."""
        return self._bound()[1]

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT``, without ``/v1``."""
        host, port = self._bound()
        return f"http://{_url_host(host)}:{port}"

    @property
    def blackhole_url(self) -> str:
        """``http://HOST:PORT2/v1`` of a listener that never accepts: connects time out."""
        host, _ = self._bound()
        if self._blackhole is None:
            raise RuntimeError("the FaultServer is not started: await start() first")
        return f"http://{_url_host(host)}:{self._blackhole.port}/v1"

    def url(self, fault: str | None = None, /, **params: ParamValue) -> str:
        """The ``base_url`` for an OpenAI client that should meet ``fault``.

        Args:
            fault: a name from `FAULTS`; None (or ``"healthy"`` without params) gives the
                plain ``/v1`` URL.
            **params: the fault's parameters and the generic ones (``key``, ``first``,
                ``hold``, ``delay``, ``token_interval``, ``tokens``).

        Raises:
            FaultSpecError: for an unknown fault, parameter or bad value, before any request.

        Example:
            >>> srv.url("trickle_body", interval=0.5)  # doctest: +SKIP
            'http://127.0.0.1:41000/fault/trickle_body;interval=0.5/v1'
        """
        spec = FaultSpec(fault or "healthy", params)
        if spec.name == "healthy" and not spec.params:
            return f"{self.base_url}/v1"
        return f"{self.base_url}/fault/{spec}/v1"

    def _bound(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError("the FaultServer is not started: await start() first")
        return self._address

    # -- stats -------------------------------------------------------------------------

    def stats(self) -> ServerStats:
        """Counts since start or the last `reset_stats`. Safe from any thread."""
        return self._counters.snapshot()

    def key_stats(self, key: str) -> KeyStats:
        """Counts for requests that carried ``key``; zeros for a key never seen."""
        return self._counters.key(key)

    def reset_stats(self) -> None:
        """Zero the counts and the per-key sequences (``first=N`` starts over)."""
        self._counters.reset()


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on the first address ``host`` resolves to."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    if not infos:
        raise OSError(f"cannot resolve {host!r}")
    family, type_, proto, _, address = infos[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
