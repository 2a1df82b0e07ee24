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
from collections.abc import Iterator, Mapping
from types import TracebackType

from ._journal import ConnectionRecord
from ._mix import Mix
from ._scenarios import Rule
from ._scope import FaultScope
from ._server import MAX_CONNECTIONS, FaultServer
from ._spec import FaultSpec, ParamValue
from ._stats import KeyStats, ServerStats
from ._verdict import Verdict

__all__ = ["ServerThread", "running"]

_START_TIMEOUT = 10.0  # bounds start(): binding and filling the blackhole take milliseconds.
_STOP_TIMEOUT = 5.0  # bounds stop(); aclose() itself takes under a second.


class ServerThread:
    """A handle on a `FaultServer` that runs in a daemon thread; same URLs and stats.

    Args:
        host, port, max_hold, upstream, max_connections, control_token: as for
            `FaultServer`.

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
        )
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

    # -- the same surface as FaultServer; pure or lock-guarded, so thread-safe -----------

    @property
    def server(self) -> FaultServer:
        """The `FaultServer` itself; only its URL and stats methods are safe off its loop."""
        return self._server

    @property
    def max_hold(self) -> float:
        """The cap on every fault's ``hold``, in seconds."""
        return self._server.max_hold

    @property
    def upstream(self) -> str | None:
        """The real server's base URL in proxy mode, else None."""
        return self._server.upstream

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

    def url(self, fault: str | None = None, /, **params: ParamValue) -> str:
        """As `FaultServer.url`."""
        return self._server.url(fault, **params)

    def stats(self) -> ServerStats:
        """As `FaultServer.stats`."""
        return self._server.stats()

    def key_stats(self, key: str) -> KeyStats:
        """As `FaultServer.key_stats`."""
        return self._server.key_stats(key)

    def reset_stats(self) -> None:
        """As `FaultServer.reset_stats`."""
        self._server.reset_stats()

    def reset(self) -> None:
        """As `FaultServer.reset`."""
        self._server.reset()

    def scenario(
        self,
        fault: str | FaultSpec = "healthy",
        /,
        *,
        times: int | None = None,
        key: str | None = None,
        path: str | None = None,
        method: str | None = None,
        stream: bool | None = None,
        model: str | None = None,
        rule_id: str | None = None,
        **params: ParamValue,
    ) -> Rule:
        """As `FaultServer.scenario`."""
        return self._server.scenario(
            fault,
            times=times,
            key=key,
            path=path,
            method=method,
            stream=stream,
            model=model,
            rule_id=rule_id,
            **params,
        )

    def scenarios(self, key: str | None = None) -> tuple[Rule, ...]:
        """As `FaultServer.scenarios`."""
        return self._server.scenarios(key)

    def clear_scenarios(self, key: str | None = None) -> int:
        """As `FaultServer.clear_scenarios`."""
        return self._server.clear_scenarios(key)

    def set_mix(
        self,
        weights: Mapping[str, float] | Mapping[FaultSpec, float],
        *,
        seed: int = 0,
        key: str | None = None,
    ) -> Mix:
        """As `FaultServer.set_mix`."""
        return self._server.set_mix(weights, seed=seed, key=key)

    def clear_mix(self) -> None:
        """As `FaultServer.clear_mix`."""
        self._server.clear_mix()

    @property
    def mix(self) -> Mix | None:
        """As `FaultServer.mix`."""
        return self._server.mix

    def journal(
        self,
        key: str | None = None,
        *,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[ConnectionRecord, ...]:
        """As `FaultServer.journal`."""
        return self._server.journal(key, request_id=request_id, idempotency_key=idempotency_key)

    def verdict(
        self,
        key: str | None = None,
        *,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Verdict:
        """As `FaultServer.verdict`."""
        return self._server.verdict(key, request_id=request_id, idempotency_key=idempotency_key)

    def forget(self, key: str) -> dict[str, int]:
        """As `FaultServer.forget`."""
        return self._server.forget(key)

    def scope(self, key: str) -> FaultScope:
        """As `FaultServer.scope`."""
        return FaultScope(self, key)


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
    )
    thread.start()
    try:
        yield thread
    finally:
        thread.stop()
