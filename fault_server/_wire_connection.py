"""One accepted connection: read requests with h11, pick each one's fault, run it, repeat.

Bounds, all from the server's ``max_hold``: waiting for a request (keep-alive idle), reading
one request (head and body together), and running one fault (its ``hold``, never more than
``max_hold``). A client that misbehaves gets an HTTP error where one can still be sent; a
client that leaves ends its exchange; nothing here raises into the server.

Every bound is an anyio cancel scope around code that runs in the connection's own task,
never ``asyncio.wait_for``: before Python 3.12 that runs its coroutine in a task of its own,
and when the caller is cancelled it cancels that task and waits for it without ever reading
its outcome, so a fault that ended with `PeerGone` as the server shut down was reported as
"Task exception was never retrieved". The only other task is the `PeerWatcher`'s, which is
cancelled and awaited when the fault ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import sys
import time
from collections.abc import AsyncIterator

import anyio
import h11

from ._answer import LocalSource, UpstreamBroken
from ._bounded import SeenKeys
from ._catalogue import BEHAVIOURS, CONNECTION_BEHAVIOURS
from ._control_api import METRICS, PREFIX
from ._formats import lenient_request, parse_request, path_error, route
from ._journal import ConnLog, RequestLog
from ._metrics import Flight
from ._openai import ChatRequest, RequestError, Whole, error
from ._scenarios import RequestInfo, Rule
from ._spec import GENERIC_PARAMS, FaultSpec, FaultSpecError, parse_fault
from ._state import ServerState
from ._wire_exchange import (
    Exchange,
    Outcome,
    PeerGone,
    PeerWatcher,
    Source,
    whole_bytes,
)

__all__ = ["MAX_BODY", "Connection"]

logger = logging.getLogger("fault_server")

MAX_BODY = 8 * 1024 * 1024  # larger request bodies get a 413.
_MAX_HEAD = 64 * 1024  # larger request heads get a 431 (h11's status hint).
_READ_SIZE = 65536
_LINGER = 1.0  # bounds the drain of an unread body after an early error answer.
_CLOSE_FLUSH = 1.0  # bounds the flush of a graceful close before it becomes an abort.


class _Closed(Exception):
    """The connection must end: the client left, timed out, or broke the protocol."""

    def __init__(self, by: str, how: str) -> None:
        super().__init__(f"closed by {by}: {how}")
        self.by = by
        self.how = how


class Connection:
    """Serves the requests of one accepted connection until it must close."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        state: ServerState,
        log: ConnLog,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._state = state
        self._counters = state.counters
        self._max_hold = state.max_hold
        self._log = log
        self._conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEAD)
        self._keys_seen = SeenKeys()
        self._request: h11.Request | None = None
        self._fields: dict[bytes, bytes] = {}  # the request's headers, first value of each.
        self._current: RequestLog | None = None  # the journal entry of the request being read.

    async def serve(self) -> None:
        """Serve until the connection ends; closes it in every case.

        Ends with a FIN (its flush bounded by `_CLOSE_FLUSH`), except when the client is
        already gone, a fault aborted, or the server is shutting down: then at once.
        """
        graceful = False
        try:
            await self._accept_slowly()
            graceful = await self._serve()
        except _Closed as exc:
            graceful = exc.how != "refused"  # else an RST; a FIN for an idle keep-alive client.
            self._log.close(exc.by, exc.how)
        except PeerGone:
            self._log.close("client", "rst")
        except asyncio.CancelledError:
            self._log.close("server", "shutdown")
            raise
        finally:
            self._log.close("server", "done")
            if graceful:
                await self._close()
            else:
                self._writer.transport.abort()

    async def _accept_slowly(self) -> None:
        """Apply an armed connection-level fault (``slow_accept``, ``refuse``) before any
        request is read; `_Closed` when it refuses the connection."""
        await self._connection_fault(self._state.scenarios.take_connection())

    async def _connection_fault(self, rule: Rule | None) -> None:
        """Apply ``rule``'s connection-level fault, if any; `_Closed` when it refuses."""
        if rule is None:
            return
        self._log.fault = str(rule.spec)
        behaviour = CONNECTION_BEHAVIOURS[rule.spec.name]
        with self._state.flights.holding(rule.spec.name):
            accepted = await behaviour(self._reader, self._writer, rule.spec, self._max_hold)
        if not accepted:
            raise _Closed("server", "refused")  # serve() then aborts: an RST.

    async def _serve(self) -> bool:
        """Serve requests; True when the connection may be closed gracefully."""
        while True:
            request = await self._next_request()
            outcome = await self._handle(request)
            if outcome is not Outcome.KEEP:
                return outcome is Outcome.CLOSE
            conn = self._conn
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return True
            conn.start_next_cycle()

    # -- reading -----------------------------------------------------------------------

    async def _next_request(self) -> h11.Request:
        """The next request head; `_Closed` when the client is done with the connection."""
        deadline = time.monotonic() + self._max_hold
        while True:
            event = await self._next_event(deadline, idle=True)
            if isinstance(event, h11.Request):
                return event
            if isinstance(event, h11.ConnectionClosed):
                raise _Closed("client", "fin")

    async def _read_body(self, deadline: float) -> bytes | None:
        """The request body, or None after answering 413 (the connection then closes)."""
        length = self._header(b"content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            await self._refuse_body()
            return None
        if self._conn.they_are_waiting_for_100_continue:
            await self._write(
                self._conn.send(h11.InformationalResponse(status_code=100, headers=[]))
            )
        body = bytearray()
        while True:
            event = await self._next_event(deadline)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    await self._refuse_body()
                    return None
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            elif isinstance(event, h11.ConnectionClosed):
                raise _Closed("client", "fin")

    async def _next_event(self, deadline: float, *, idle: bool = False) -> h11.Event:
        while True:
            try:
                if idle:
                    _check_head_size(self._conn)
                event = self._conn.next_event()
            except h11.RemoteProtocolError as exc:
                await self._answer_broken_request(exc)
                raise _Closed("server", "done") from exc
            if isinstance(event, h11.Event):
                return event
            if event is h11.PAUSED:
                # only after a protocol switch, which we never accept.
                raise _Closed("server", "done")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Closed("server", "idle" if idle else "hold")
            try:
                async with _read_bound(remaining):
                    data = await self._reader.read(_READ_SIZE)
            except TimeoutError as exc:
                raise _Closed("server", "idle" if idle else "hold") from exc
            except (ConnectionError, OSError) as exc:
                raise _Closed("client", "rst") from exc
            self._conn.receive_data(data)

    def _header(self, name: bytes) -> str | None:
        """The first value of the request's header ``name`` (lower case), if any."""
        value = self._fields.get(name)
        return None if value is None else value.decode("latin-1").strip()

    # -- answering ---------------------------------------------------------------------

    async def _handle(self, request: h11.Request) -> Outcome:
        self._request = request
        # Once per request: h11's headers are a Sequence read item by item in Python, and
        # six lookups by scanning them cost more than the answer's JSON.
        self._fields = {}
        for name, value in request.headers:
            self._fields.setdefault(name, value)
        deadline = time.monotonic() + self._max_hold
        method = request.method.decode("ascii", "replace")
        target = request.target.decode("ascii", "replace")
        path, _, query = target.partition("?")
        request_id = self._request_id()
        self._current = None
        if path.startswith(PREFIX) or path == METRICS:
            body = await self._read_body(deadline)
            if body is None:
                return Outcome.CLOSE
            answer = await self._state.control.answer(
                method, path, query, body, self._state, request.headers
            )
            return await self._send(answer, request_id)
        self._counters.request()
        log = self._current = self._log.request(method, path)
        log.request_id = self._header(b"x-request-id")
        log.idempotency_key = self._header(b"idempotency-key")
        try:
            with self._state.flights.request() as flight:
                return await self._answer(method, path, query, request_id, log, deadline, flight)
        except _Closed as exc:  # while reading the body: the client left, or was too slow.
            if exc.by == "client":
                self._log.end_request(log, "client_closed" if exc.how == "fin" else "client_reset")
            elif exc.how == "refused":  # a keyed `refuse`: the connection is reset.
                self._log.end_request(log, "server_reset")
            else:
                self._log.end_request(log, "hold_expired")
            raise
        except PeerGone:
            self._log.end_request(log, "client_reset")
            raise
        finally:
            if log.ended is None:  # refused with an error status, or ended by the shutdown.
                self._log.end_request(log, "complete" if log.status else "shutdown")

    async def _answer(
        self,
        method: str,
        path: str,
        query: str,
        request_id: str,
        log: RequestLog,
        deadline: float,
        flight: Flight,
    ) -> Outcome:
        spec_text: str | None = None
        if path.startswith("/fault/"):
            spec_text, _, rest = path[len("/fault/") :].partition("/")
            path = "/" + rest
        log.path = path
        header_text = self._header(b"x-fault")
        source = "header" if header_text else "path" if spec_text else "default"
        given = header_text or spec_text
        try:
            spec = parse_fault(given) if given else FaultSpec()
        except FaultSpecError as exc:
            invalid = path_error(path, 400, str(exc), code="invalid_fault")
            return await self._refuse(invalid, request_id, log)
        if spec.info.scope == "connection":
            message = (
                f"fault {spec.name!r} acts on a connection before any request is read: arm it "
                "with a scenario (FaultServer.scenario, or PUT /_fault/scenarios)"
            )
            invalid = path_error(path, 400, message, code="invalid_fault")
            return await self._refuse(invalid, request_id, log)
        key = spec.key or self._header(b"x-fault-key")
        if key is not None and self._log.total == 1 and self._log.fault is None:
            log.key = key
            # A connection-level fault armed for this key (a test's scope) takes the
            # connection whose first request carries it, and no other test's.
            await self._connection_fault(self._state.scenarios.take_connection(key=key))
        body: bytes | None = None
        if source != "header":  # a header is the test's explicit word: nothing overrides it.
            info = RequestInfo(key=key, path=path, method=method)
            if self._state.scenarios.needs_body(info):
                body = await self._read_body(deadline)
                if body is None:
                    return Outcome.CLOSE
                info = _with_body(info, body)
            spec, source = self._armed(spec, source, info)
        spec = self._count_key(spec, key, source)
        log.fault, log.source, log.key = str(spec), source, key
        upstream = self._state.upstream
        target: str | None = None
        if upstream is None:
            routed = route(method, path)
        else:
            target = upstream.target(path, query)
            routed = (
                None if target else error(404, f"the proxy forwards /v1/... only, not {path!r}")
            )
        if routed is not None:
            if body is not None:
                return await self._send(routed, request_id, log=log)
            return await self._refuse(routed, request_id, log)
        if spec.name == "half_open" and body is None:  # never read past the head.
            hold = self._hold(spec)
            return await self._run(spec, None, LocalSource(None, 0), request_id, hold, log, flight)
        if body is None:
            body = await self._read_body(deadline)
            if body is None:
                return Outcome.CLOSE
        chat: ChatRequest | None = None
        answers: Source
        if upstream is not None and target is not None:
            chat = lenient_request(path, body)
            headers = self._request.headers if self._request is not None else []
            answers = upstream.source(method, target, list(headers), body, chat)
        else:
            try:
                chat = parse_request(path, body)
            except RequestError as exc:
                whole = path_error(path, 400, str(exc), param=exc.param)
                return await self._send(whole, request_id, log=log)
            if chat is not None and self._state.fixtures:
                chat, spec = self._fixture(chat, spec, key, path, log)
            answers = LocalSource(chat, spec.integer("tokens"))
        hold = self._hold(spec)
        return await self._run(spec, chat, answers, request_id, hold, log, flight)

    def _hold(self, spec: FaultSpec) -> float:
        """How long ``spec`` may keep the connection: its ``hold``, at most max_hold."""
        hold = spec.get("hold")
        return self._max_hold if hold is None else min(self._max_hold, spec.number("hold"))

    def _fixture(
        self, chat: ChatRequest, spec: FaultSpec, key: str | None, path: str, log: RequestLog
    ) -> tuple[ChatRequest, FaultSpec]:
        """``chat`` answered by the first matching fixture, and the fault that delivers it:
        the fixture's, unless an ``X-Fault`` header or a scenario rule chose one."""
        headers = {
            k.decode("latin-1"): v.decode("latin-1").strip() for k, v in self._fields.items()
        }
        fixture = self._state.fixtures.take(chat, key, path, headers)
        if fixture is None:
            return chat, spec
        if fixture.fault is not None and log.source not in ("header", "scenario"):
            # Counted as faulted once: the mix's draw and a path's own fault already were.
            counted = log.source == "mix" or (log.source == "path" and _is_fault(spec))
            if key is not None and not counted:
                self._counters.key_faulted(key)
            spec = _merged(fixture.fault, spec)
            log.fault, log.source = str(spec), "fixture"
        return fixture.answer(chat), spec

    def _armed(self, spec: FaultSpec, source: str, info: RequestInfo) -> tuple[FaultSpec, str]:
        """The fault armed on the server for this request, if any: a matching scenario rule
        first, else (when the request named no fault) the mix; with the source that chose."""
        rule = self._state.scenarios.take(info)
        if rule is not None:
            return _merged(rule.spec, spec), "scenario"
        if spec.name == "healthy":
            drawn, _ = self._state.mix.draw(info.key)
            if drawn is not None:
                return _merged(drawn, spec), "mix"
        return spec, source

    def _count_key(self, spec: FaultSpec, key: str | None, source: str) -> FaultSpec:
        """Count the request under its key. A spec the request named itself applies to the
        first ``first`` such requests only: past them, serve healthy. A spec that carries
        nothing but the key is not a fault: it does not count as faulted."""
        if key is None:
            return spec
        ordinal = self._counters.key_request(key, self._keys_seen)
        if source in ("header", "path"):
            first = spec.first
            if first is not None and ordinal > first:
                return FaultSpec()
            if _is_fault(spec):
                self._counters.key_faulted(key)
        elif source in ("scenario", "mix"):
            self._counters.key_faulted(key)
        return spec

    async def _run(
        self,
        spec: FaultSpec,
        chat: ChatRequest | None,
        answers: Source,
        request_id: str,
        hold: float,
        log: RequestLog,
        flight: Flight,
    ) -> Outcome:
        """Run the fault's behaviour for at most ``hold`` seconds; ``flight`` waits during
        its ``delay``, then is answered."""
        watcher = PeerWatcher(self._reader, self._conn)
        exchange = Exchange(
            conn=self._conn,
            writer=self._writer,
            watcher=watcher,
            spec=spec,
            chat=chat,
            request_id=request_id,
            source=answers,
            log=log,
            buckets=self._state.buckets,
        )
        behaviour = BEHAVIOURS[spec.name]
        try:
            with anyio.move_on_after(hold):
                flight.queued(spec.name)
                # Even without a delay this yields once: a client pipelining requests must
                # not keep the loop from the other connections.
                await exchange.sleep(spec.number("delay"))
                flight.answering(spec.name)
                outcome = await behaviour(exchange)
                if outcome is Outcome.KEEP:
                    self._log.end_request(log, "complete")
                elif outcome is Outcome.CLOSE:
                    self._log.end_request(log, "server_closed")
                    self._log.close("server", "fault")
                else:
                    self._log.end_request(log, "server_reset")
                    self._log.close("server", "fault")
                return outcome
            self._log.end_request(log, "hold_expired")
            self._log.close("server", "hold")
            return Outcome.CLOSE  # hold ran out.
        except PeerGone:
            # The watcher tells FIN from RST; when it never ran (the answer went out at
            # once), the reader knows whether a FIN came.
            how = watcher.how or ("fin" if self._reader.at_eof() else "rst")
            self._log.end_request(log, "client_closed" if how == "fin" else "client_reset")
            self._log.close("client", how)
            return Outcome.ABORTED
        except UpstreamBroken:
            # The real answer broke off: so does ours, with a FIN and no end of body.
            self._log.end_request(log, "server_closed")
            self._log.close("server", "fault")
            return Outcome.CLOSE
        finally:
            await watcher.stop()
            await answers.aclose()

    async def _refuse(self, whole: Whole, request_id: str, log: RequestLog) -> Outcome:
        """Answer an error before the body was read: read (and drop) it first."""
        if await self._read_body(time.monotonic() + self._max_hold) is None:
            return Outcome.CLOSE
        return await self._send(whole, request_id, log=log)

    async def _send(
        self,
        whole: Whole,
        request_id: str,
        *,
        close: bool = False,
        log: RequestLog | None = None,
    ) -> Outcome:
        if log is not None:
            log.status = whole.status
        headers = [("x-request-id", request_id)]
        if close:
            headers.append(("connection", "close"))
        head_only = self._request is not None and self._request.method == b"HEAD"
        try:
            await self._write(whole_bytes(self._conn, whole, headers, head_only=head_only))
        except PeerGone:
            return Outcome.ABORTED
        return Outcome.CLOSE if close else Outcome.KEEP

    async def _refuse_body(self) -> None:
        """Answer 413, then drain what the client still sends, briefly, before closing.

        Closing with unread data would send an RST that can destroy the 413 in flight.
        """
        whole = error(413, f"request body larger than {MAX_BODY} bytes")
        outcome = await self._send(whole, self._request_id(), close=True, log=self._current)
        if outcome is Outcome.ABORTED:
            raise _Closed("client", "rst")
        with anyio.move_on_after(_LINGER), contextlib.suppress(Exception):
            self._writer.write_eof()
            while await self._reader.read(_READ_SIZE):
                pass

    async def _answer_broken_request(self, exc: h11.RemoteProtocolError) -> None:
        """A 4xx for a request h11 cannot parse, if a response can still be sent."""
        if self._conn.our_state not in {h11.IDLE, h11.SEND_RESPONSE}:
            return
        whole = error(exc.error_status_hint, f"malformed HTTP request: {exc}")
        headers = [("x-request-id", self._request_id()), ("connection", "close")]
        with contextlib.suppress(PeerGone, h11.LocalProtocolError):
            await self._write(whole_bytes(self._conn, whole, headers))

    def _request_id(self) -> str:
        """The client's ``x-request-id`` when it sent a sane one, else a new ``req_<hex>``."""
        given = self._header(b"x-request-id")
        if given and len(given) <= 200 and given.isprintable():
            return given
        return f"req_{_ID_PREFIX}{next(_ids):016x}"

    async def _write(self, data: bytes | None) -> None:
        if not data:
            return
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise PeerGone from exc

    async def _close(self) -> None:
        """Close with a FIN after flushing; abort if the flush takes over `_CLOSE_FLUSH`."""
        transport = self._writer.transport
        if transport.is_closing():
            transport.abort()
            return
        self._writer.close()
        try:
            with anyio.fail_after(_CLOSE_FLUSH):
                await self._writer.wait_closed()
        except (TimeoutError, ConnectionError, OSError):
            transport.abort()
        except asyncio.CancelledError:
            transport.abort()
            raise


if sys.version_info >= (3, 11):
    # A read bounded by asyncio's own timeout: the read is a leaf (no scope inside it), and
    # at two reads a request, anyio's scope (its backend looked up each time) cost ~25 us
    # of a ~250 us request.
    _read_bound = asyncio.timeout
else:  # pragma: no cover - Python 3.10 has no asyncio.timeout.

    @contextlib.asynccontextmanager
    async def _read_bound(seconds: float) -> AsyncIterator[None]:
        with anyio.fail_after(seconds):
            yield


# Request ids the server makes up: random per process, then counted (a urandom per
# request was a system call on the hot path).
_ID_PREFIX = secrets.token_hex(8)
_ids = itertools.count(1)


def _check_head_size(conn: h11.Connection) -> None:
    """Refuse a request head longer than `_MAX_HEAD` bytes, blank line included.

    h11's own limit (``max_incomplete_event_size``) looks only at an incomplete head, so a
    longer head that arrived whole with the bytes read after it (up to ~2 x 64 KiB) passed.

    Raises:
        h11.RemoteProtocolError: with status hint 431.
    """
    buffered, _ = conn.trailing_data
    if len(buffered) <= _MAX_HEAD:
        return
    if buffered.find(b"\n\n", 0, _MAX_HEAD) < 0 and buffered.find(b"\n\r\n", 0, _MAX_HEAD) < 0:
        raise h11.RemoteProtocolError(
            f"request head larger than {_MAX_HEAD} bytes", error_status_hint=431
        )


def _with_body(info: RequestInfo, body: bytes) -> RequestInfo:
    """``info`` with the ``stream`` and ``model`` of the request in ``body``, if any."""
    chat = lenient_request(info.path, body)
    if chat is None:
        return info
    return RequestInfo(info.key, info.path, info.method, chat.stream, chat.model)


def _is_fault(spec: FaultSpec) -> bool:
    """Whether a request's own spec is a fault: more than ``healthy`` with a key."""
    return spec.name != "healthy" or bool(set(spec.params) - {"key"})


def _merged(chosen: FaultSpec, requested: FaultSpec) -> FaultSpec:
    """``chosen`` (by a scenario or the mix), with the generic parameters the request gave
    itself (key, hold, delay, tokens...) where ``chosen`` does not set them; never ``first``,
    which belongs to the request's own spec."""
    params = {
        name: value
        for name, value in requested.params.items()
        if name in GENERIC_PARAMS and name != "first" and name not in chosen.params
    }
    if not params:
        return chosen
    return FaultSpec(chosen.name, {**chosen.params, **params})
