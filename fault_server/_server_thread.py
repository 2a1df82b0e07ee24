"""Run a `FaultServer` on its own asyncio loop in a daemon thread.

For sync tests, trio tests and scripts: the server's loop never shares a thread with the
code under test, so a client that blocks its own thread (or its own trio loop) cannot stall
the server that is misbehaving at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from types import TracebackType

from ._control_surface import ServerControls
from ._server import MAX_CONNECTIONS, FaultServer
from ._spec import ParamValue

__all__ = ["ServerThread", "running"]

_START_TIMEOUT = 10.0  # bounds start(): binding and filling the blackhole take milliseconds.
_STOP_TIMEOUT = 5.0  # bounds stop(); aclose() itself takes under a second.


class ServerThread(ServerControls):
    """A handle on a `FaultServer` that runs in a daemon thread; same URLs and stats.

    Args:
        host, port, max_hold, upstream, max_connections, control_token, fixtures,
            insecure_open_control, replay_speed: as for `FaultServer`.

    Example:
        >>> with fault_server.running() as srv:  # doctest: +SKIP
        ...     openai.OpenAI(base_url=srv.url("reset"), api_key="x")
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
        self._server = FaultServer(
            host=host,
            port=port,
            max_hold=max_hold,
            upstream=upstream,
            tls=tls,
            record=record,
            replay=replay,
            max_connections=max_connections,
            control_token=control_token,
            fixtures=fixtures,
            insecure_open_control=insecure_open_control,
            replay_speed=replay_speed,
        )
        self._state = self._server._state  # the same thread-safe state: the same controls.
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        """Start the thread and wait (at most 10 s) until the server listens.

        Raises:
            RuntimeError: if already started, or the server did not start in time.
            OSError: if the address cannot be bound.
        """
        if self._thread is not None:
            raise RuntimeError("ServerThread.start() may be called once")
        self._thread = threading.Thread(target=self._main, name="fault_server", daemon=True)
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT):
            raise RuntimeError(f"fault_server did not start within {_START_TIMEOUT} s")
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        """End every fault, close the server and join the thread (at most 5 s)."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended.
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(_STOP_TIMEOUT)
            if thread.is_alive():
                raise RuntimeError(f"fault_server did not stop within {_STOP_TIMEOUT} s")

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to start(), never lost in the thread.
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            await self._server.start()
        except BaseException as exc:
            self._error = exc
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self._server.aclose()

    # -- the listener's URLs are the FaultServer's; the rest is `ServerControls` ----------

    @property
    def server(self) -> FaultServer:
        """The `FaultServer` itself; only its URL and stats methods are safe off its loop."""
        return self._server

    @property
    def port(self) -> int:
        """The bound port."""
        return self._server.port

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT``, without ``/v1``."""
        return self._server.base_url

    @property
    def blackhole_url(self) -> str:
        """``http://HOST:PORT2/v1`` of a listener that never accepts."""
        return self._server.blackhole_url

    @property
    def refused_url(self) -> str:
        """``http://HOST:PORT3/v1`` of a port where nothing listens: connects are refused."""
        return self._server.refused_url

    @property
    def tls_cert(self) -> str:
        """As `FaultServer.tls_cert`."""
        return self._server.tls_cert

    def tls_url(self, fault: str | None = None, /, **params: ParamValue) -> str:
        """As `FaultServer.tls_url`."""
        return self._server.tls_url(fault, **params)


@contextlib.contextmanager
def running(
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
) -> Iterator[ServerThread]:
    """Run a `FaultServer` in a daemon thread for the duration of a ``with`` block.

    Example:
        >>> with running(port=0) as srv:  # doctest: +SKIP
        ...     httpx.get(srv.url() + "/models")
    """
    thread = ServerThread(
        host=host,
        port=port,
        max_hold=max_hold,
        upstream=upstream,
        tls=tls,
        record=record,
        replay=replay,
        max_connections=max_connections,
        control_token=control_token,
        fixtures=fixtures,
        insecure_open_control=insecure_open_control,
        replay_speed=replay_speed,
    )
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()
