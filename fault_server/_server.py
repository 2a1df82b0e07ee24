"""`FaultServer`: the asyncio listener, its connections, its stats, and its URLs."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import os
import socket
from types import TracebackType

import anyio

from ._control_guard import ControlGuard
from ._control_surface import ServerControls
from ._fixtures import load_fixtures
from ._proxy import Upstream
from ._proxy_replay import Replay
from ._shutdown import collector_paused
from ._spec import ParamValue
from ._state import ServerState
from ._wire_accept import Acceptor
from ._wire_blackhole import Blackhole
from ._wire_connection import Connection
from ._wire_refused import RefusedPort
from ._wire_tls import TLS_SUPPORTED, TlsListener

__all__ = ["FaultServer", "is_loopback"]

logger = logging.getLogger("fault_server")

_SHUTDOWN = 0.5  # bounds how long aclose() waits for cancelled connections to finish.
MAX_CONNECTIONS = 20_000  # the default cap on connections served at once.
# Bursts of connects are queued, not dropped: the kernel caps it at net.core.somaxconn
# (4096 by default on Linux), which an operator can raise.
_BACKLOG = 65535


class FaultServer(ServerControls):
    """An OpenAI-compatible HTTP/1.1 server that misbehaves on request, below HTTP if asked.

    Each request picks its fault from its path (``/fault/<name>;k=v/v1/...``) or an
    ``X-Fault`` header; see `FAULTS`. Every fault ends by itself within its ``hold``, which
    never exceeds ``max_hold``; `aclose` ends all of them at once.

    Args:
        host: address to bind; loopback by default. The URLs use the bound numeric address.
        port: port to bind; 0 lets the kernel choose.
        max_hold: most seconds any fault, request read or idle keep-alive connection may
            last before the server closes the connection itself.
        upstream: proxy mode: the base URL (``http://host:port/v1``) of a real
            OpenAI-compatible server whose answers the faults deliver, instead of the
            answers the server makes up.
        tls: also serve HTTPS on a second port (`tls_url`), with a self-signed
            certificate made at start (`tls_cert`); Python 3.11+.
        record: proxy mode: write each complete exchange with the upstream to this file
            (JSON Lines, emptied at start), for ``replay``.
        replay_speed: with ``replay``, serve each answer with the timing it was recorded
            with (its head, each event), this many times faster: 1.0 as recorded, 4.0 four
            times faster; None (the default): as fast as the fault takes them.
        replay: serve the answers recorded in this file instead of making them up (or
            asking an upstream); faults apply to them as to a live upstream's.
        max_connections: most connections served at once; past it the server stops
            accepting until one closes, and new clients wait in the kernel's backlog.
        control_token: if given, every ``/_fault/`` control request over HTTP must carry it
            (``Authorization: Bearer <token>`` or ``X-Fault-Token``); see `ControlGuard`.
            Required to bind anything but loopback.
        fixtures: a JSON file of fixtures (canned answers for the requests that match,
            see `fault_server._fixtures`), loaded at once.
        insecure_open_control: bind beyond loopback without a control token: anyone who can
            reach the port can then arm faults and read the journal. Off by default.

    Raises:
        ValueError: for a port outside 0..65535, a max_hold that is not a positive number,
            an upstream that is not an http(s) URL, tls on Python 3.10, record without
            upstream, replay with upstream, a max_connections below 1, a control_token
            that is empty or not printable ASCII, a host beyond loopback without a control
            token (unless insecure_open_control), or a bad fixtures file (`FaultSpecError`).

    Example:
        >>> async with FaultServer() as srv:  # doctest: +SKIP
        ...     client = openai.AsyncOpenAI(base_url=srv.url("sse_stall"), api_key="x")
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        max_hold: float = 30.0,
        *,
        upstream: str | None = None,
        tls: bool = False,
        record: str | os.PathLike[str] | None = None,
        replay: str | os.PathLike[str] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        control_token: str | None = None,
        fixtures: str | os.PathLike[str] | None = None,
        insecure_open_control: bool = False,
        replay_speed: float | None = None,
    ) -> None:
        if control_token is None and not insecure_open_control and not is_loopback(host):
            raise ValueError(
                f"binding {host!r}, which is not loopback, without a control token would let "
                "anyone who can reach it arm faults and read the journal: give control_token= "
                "(fault-server --control-token), or insecure_open_control=True "
                "(--insecure-open-control) to accept that"
            )
        if record is not None and upstream is None:
            raise ValueError("record= needs upstream=: it records a real server's answers")
        if replay_speed is not None and (
            replay is None
            or isinstance(replay_speed, bool)
            or not isinstance(replay_speed, (int, float))
            or not math.isfinite(replay_speed)
            or replay_speed <= 0
        ):
            raise ValueError(
                f"replay_speed must be a finite number > 0, with replay=; got {replay_speed!r}"
            )
        if replay is not None and upstream is not None:
            raise ValueError("replay= serves recorded answers: give it or upstream=, not both")
        if tls and not TLS_SUPPORTED:
            raise ValueError("tls=True needs Python 3.11+ (asyncio.StreamWriter.start_tls)")
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
        if (
            isinstance(max_connections, bool)
            or not isinstance(max_connections, int)
            or max_connections < 1
        ):
            raise ValueError(f"max_connections must be an integer >= 1, got {max_connections!r}")
        self._max_connections = max_connections
        self._state = ServerState(
            self._max_hold,
            upstream=_upstream(upstream, record, replay, replay_speed),
            guard=ControlGuard(control_token),
        )
        if fixtures is not None:
            self._state.fixtures.add(load_fixtures(fixtures))
        self._counters = self._state.counters
        self._server: Acceptor | None = None
        self._address: tuple[str, int] | None = None
        self._blackhole: Blackhole | None = None
        self._refused: RefusedPort | None = None
        self._tls = tls
        self._tls_listener: TlsListener | None = None
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
            if self._state.upstream is not None:
                await self._state.upstream.start()
            self._server = Acceptor(sock, self._on_connect, self._max_connections)
            self._server.start()
            self._blackhole = Blackhole(host)
            await self._blackhole.open()
            self._refused = RefusedPort(host)
            self._refused.open()
            if self._tls:
                self._tls_listener = TlsListener(
                    host,
                    self._state.scenarios,
                    self._max_hold,
                    self._on_connect,
                    self._state.flights,
                )
                await self._tls_listener.open(_BACKLOG, self._max_connections)
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
        pending: set[asyncio.Task[None]] = set()
        with collector_paused():
            for task in tasks:
                task.cancel()
            if tasks:
                # Connection tasks never end with an exception (_on_connect catches them
                # all), so waiting for them is enough: there is no outcome left to retrieve.
                _, pending = await asyncio.wait(tasks, timeout=_SHUTDOWN)
        if pending:
            logger.warning(
                "fault_server: %d connection(s) still ending after %s s",
                len(pending),
                _SHUTDOWN,
            )
        self._state.control.close()
        if self._tls_listener is not None:
            await self._tls_listener.close()
        if self._blackhole is not None:
            self._blackhole.close()
        if self._refused is not None:
            self._refused.close()
        if self._state.upstream is not None:
            with anyio.move_on_after(_SHUTDOWN):
                await self._state.upstream.aclose()
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
        peer = writer.get_extra_info("peername")
        log = self._state.journal.open(_peer(peer))
        try:
            await Connection(reader, writer, self._state, log).serve()
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

    @property
    def refused_url(self) -> str:
        """``http://HOST:PORT3/v1`` of a port where nothing listens: connects are refused."""
        host, _ = self._bound()
        if self._refused is None:
            raise RuntimeError("the FaultServer is not started: await start() first")
        return f"http://{_url_host(host)}:{self._refused.port}/v1"

    @property
    def tls_cert(self) -> str:
        """The path of the TLS listener's self-signed certificate (PEM), for a client to
        trust: ``ssl.create_default_context(cafile=srv.tls_cert)``.

        Raises:
            RuntimeError: if the server was not made with ``tls=True``, or is not started.
        """
        return str(self._tls_started().cert)

    def tls_url(self, fault: str | None = None, /, **params: ParamValue) -> str:
        """As `url`, on the TLS listener: ``https://HOST:PORT4/...``.

        Raises:
            RuntimeError: if the server was not made with ``tls=True``, or is not started.
            FaultSpecError: as `url`.
        """
        listener = self._tls_started()
        host, _ = self._bound()
        plain = self.url(fault, **params)
        return f"https://{_url_host(host)}:{listener.port}" + plain[len(self.base_url) :]

    def _tls_started(self) -> TlsListener:
        if self._tls_listener is None or self._tls_listener.cert is None:
            raise RuntimeError("no TLS listener: make the FaultServer with tls=True and start it")
        return self._tls_listener

    def _bound(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError("the FaultServer is not started: await start() first")
        return self._address


def _upstream(
    url: str | None,
    record: str | os.PathLike[str] | None,
    replay: str | os.PathLike[str] | None,
    speed: float | None = None,
) -> Upstream | None:
    """Where answers come from: an upstream (maybe recorded), a replay file, or nowhere."""
    if replay is not None:
        return Replay(os.fspath(replay), None if speed is None else float(speed))
    if url is not None:
        return Upstream(url, None if record is None else os.fspath(record))
    return None


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


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``), the only ones the control
    API is open on without a token."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _peer(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{_url_host(str(peer[0]))}:{peer[1]}"
    return str(peer)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
