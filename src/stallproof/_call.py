"""The runtime state of one call: its clock, its phase, and which bound is armed.

A call runs its awaits inside anyio cancel scopes whose deadline is the earliest of the
bounds that apply right now (total, and first_token or idle). `Call` remembers which bound
set that deadline, so when the cancel scope fires we raise the error that names it. Phases come
from httpcore's ``trace`` request extension, not from guessing.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import anyio
import h11
import httpcore2

from . import _exceptions as exc
from ._clock import is_asyncio_clock, is_trio_clock, loop_clock
from ._config import Timeouts
from ._deadline import ActiveDeadline
from ._inflight import InflightCall
from ._native_scope import NativeCancelScope
from ._wire._pool import DeadlinePassed

if TYPE_CHECKING:
    import trio

    _Scope = anyio.CancelScope | NativeCancelScope | trio.CancelScope

__all__ = ["Call", "PhaseListener"]


class PhaseListener(Protocol):
    """Told of every phase change of a call (the call's telemetry, `CallTelemetry`)."""

    def phase_changed(self, old: str, new: str) -> None: ...


# httpcore trace event -> the phase the call enters when it is emitted.
_TRACE_PHASES = {
    "connection.connect_tcp.started": "connecting",
    "connection.connect_unix_socket.started": "connecting",
    "connection.start_tls.started": "tls handshake",
    "http11.send_request_headers.started": "sending",
    "http2.send_request_headers.started": "sending",
    "http11.receive_response_headers.started": "awaiting headers",
    "http2.receive_response_headers.started": "awaiting headers",
    "http11.receive_response_body.started": "receiving body",
    "http2.receive_response_body.started": "receiving body",
}
_SENT_EVENTS = frozenset({"http11.send_request_body.complete", "http2.send_request_body.complete"})


E = TypeVar("E", bound=exc.StallproofError)

# Tasks count the cancellations asked of them (what `NativeCancelScope` relies on) from 3.11.
_COUNTED_CANCELS = sys.version_info >= (3, 11)


class Call:
    """Clock, phase and armed bound of one logical call. Not shared between calls."""

    __slots__ = (
        "_bound",
        "_cancel_scope",
        "_deferred",
        "_on_trio",
        "agent",
        "attempt",
        "bytes_received",
        "content_chunks",
        "enclosing",
        "headers_received",
        "labels",
        "last_progress",
        "max_attempts",
        "method",
        "model",
        "now",
        "phase",
        "phase_since",
        "request_id",
        "sent_at",
        "server_request_id",
        "shared",
        "started",
        "status_code",
        "stream",
        "telemetry",
        "timeouts",
        "total_deadline",
        "url",
    )

    def __init__(
        self,
        timeouts: Timeouts,
        request_id: str,
        *,
        stream: bool,
        model: str = "",
        agent: str | None = None,
        labels: Mapping[str, str] | None = None,
        max_attempts: int = 1,
        enclosing: ActiveDeadline | None = None,
        method: str = "POST",
        url: str | None = None,
    ) -> None:
        self.timeouts = timeouts
        self.method = method
        self.url = url  # without credentials: errors expose it as ``request.url``
        self.request_id = request_id
        self.stream = stream
        self.model = model
        self.agent = agent
        self.labels: Mapping[str, str] = labels or {}
        #: The event loop's clock (`anyio.current_time`'s value, without its lookup).
        self.now = loop_clock()
        self.started = self.now()
        self.total_deadline = self.started + timeouts.total
        # A `deadline()` block around the call that ends before its own total clips it.
        # (The block may have been entered on another clock: sync code, another loop.)
        enclosing_when = (
            enclosing.when_on(self.now) if enclosing is not None else self.total_deadline
        )
        self.enclosing = enclosing if enclosing_when < self.total_deadline else None
        if self.enclosing is not None:
            self.total_deadline = enclosing_when
        self.phase = "pool wait"
        self.phase_since = self.started
        self.last_progress = self.started
        self.sent_at: float | None = None
        self.headers_received = False
        self.status_code: int | None = None
        self.server_request_id: str | None = None
        self.attempt = 1
        self.max_attempts = max_attempts
        self.bytes_received = 0
        self.content_chunks = 0
        self.shared: str | None = None  # fleet state: "redis", "local (why)"; None: unshared
        self.telemetry: PhaseListener | None = None
        self._cancel_scope: _Scope | None = None
        self._deferred: _Bounded | None = None  # a `bounded` block not started yet
        # On trio, a bound is trio's own cancel scope: anyio's wraps one (`_Bounded`).
        self._on_trio = is_trio_clock(self.now)
        self._bound = "total"

    # -- the in-flight view (the engine's registry holds the call; `CallScope.end` removes it)

    def snapshot(self, now: float, stalled_after: float) -> InflightCall:
        since_progress = now - self.last_progress
        left = self.total_deadline - now
        return InflightCall(
            request_id=self.request_id,
            server_request_id=self.server_request_id,
            agent=self.agent,
            labels=MappingProxyType(dict(self.labels)),
            model=self.model,
            stream=self.stream,
            phase=self.phase,
            time_in_phase=now - self.phase_since,
            attempt=self.attempt,
            max_attempts=self.max_attempts,
            bytes_received=self.bytes_received,
            content_chunks=self.content_chunks,
            since_progress=since_progress,
            elapsed=now - self.started,
            deadline_left=left,
            stalled=since_progress > stalled_after and left > 0,
            shared=self.shared,
        )

    def progress(self, nbytes: int = 0, *, content: bool | int = False) -> None:
        """Record received bytes; ``content`` (or any byte of a non-stream body) is progress.

        ``content``: a content chunk arrived, or how many arrived (in one read) if an int.
        """
        self.bytes_received += nbytes
        if content:
            self.content_chunks += content
        if content or (nbytes and not self.stream):
            self.last_progress = self.now()

    # -- clock ---------------------------------------------------------------------------

    def elapsed(self) -> float:
        return self.now() - self.started

    def remaining(self) -> float:
        return self.total_deadline - self.now()

    def set_phase(self, phase: str) -> None:
        if phase != self.phase:
            old = self.phase
            self.phase = phase
            self.phase_since = self.last_progress = self.now()
            if self.telemetry is not None:
                self.telemetry.phase_changed(old, phase)

    # -- bounds --------------------------------------------------------------------------

    def within_total(self) -> _Bounded:
        """Run the body under the call's total deadline; raise `TotalTimeout` when it fires.

        Around what awaits outside an attempt's own `bounded` block: the retries and their
        waits, a shared circuit's admission, a large body parsed in a thread. A
        cancellation from outside (the caller's own cancel scope) passes through untouched.
        """
        return _Bounded(self, self.total_deadline, "total", translate=False)

    def bounded(self, *, native: bool = False, deferred: bool = False) -> _Bounded | _NativeBounded:
        """Run an attempt under total and a phase bound (first_token or idle), whichever
        is first, in one cancel scope whose deadline `rearm` moves (total alone at first);
        the pool's errors are translated to ours (`_translate`).

        ``native``: nothing inside awaits in a shielded region (the engine's own pool on
        the asyncio wire), so on asyncio the cancel scope may be a `NativeCancelScope`, on
        the task's own cancellation, for a fraction of anyio's cost.

        The block raises the error of the bound that fired: a phase bound fails one
        attempt (which a retry may repeat), `TotalTimeout` ends the call. One cancel scope,
        not a phase one inside a total one: the first attempt, the only one most calls make,
        needs no other (retries run inside `within_total`, which also bounds their waits).

        ``deferred``: on trio, the cancel scope is entered only at `start_bounds`, when the
        pool has a connection for the attempt; until then the pool bounds its wait itself
        (`wait_deadline`), as thousands of calls may be waiting (`stallproof._wire._pool`
        keeps their deadlines in one task). A wait that ends there raises the call's
        timeout error from the block, as the scope would have.
        """
        if native and _COUNTED_CANCELS and is_asyncio_clock(self.now):
            return _NativeBounded(self, self.total_deadline, None, translate=True)
        return _Bounded(
            self, self.total_deadline, None, translate=True, deferred=deferred and self._on_trio
        )

    @property
    def wait_deadline(self) -> float | None:
        """When a `deferred` block not started yet ends (None: none is waiting to start)."""
        return self.total_deadline if self._deferred is not None else None

    def start_bounds(self) -> None:
        """Start the `deferred` block waiting to (a no-op if none is)."""
        if self._deferred is not None:
            self._deferred.start()

    def step(self, bound: str, deadline: float) -> _Bounded:
        """One block for one step of a stream: total and a phase bound, whichever is first.

        `within_total` + `bounded` in a single cancel scope, errors translated as in
        `bounded`; a stream step is never retried, so the two bounds need not
        be told apart by nesting.
        """
        if deadline >= self.total_deadline:
            bound, deadline = "total", self.total_deadline
        return _Bounded(self, deadline, bound, translate=True)

    async def read_before(
        self, read: Callable[[float], Awaitable[bytes | None]], bound: str, deadline: float
    ) -> bytes | None:
        """One stream read bounded by a loop timer in the wire instead of a cancel scope:
        ``read(until)`` (the asyncio wire's ``read_before``) raises `TimeoutError` when
        ``until`` passes. Total and ``bound``, whichever is first, as `step`; the wire's
        errors are translated as there; a cancellation from outside passes through."""
        if deadline >= self.total_deadline:
            bound, deadline = "total", self.total_deadline
        if deadline <= self.now():
            # Already past (a flood of events without content used up idle): fail now. The
            # wire's timer alone could lose to data arriving in the same loop turn, each
            # turn, where a cancel scope's cancellation would not.
            raise self.timeout_error(bound)
        try:
            return await read(deadline)
        except TimeoutError:
            raise self.timeout_error(bound) from None
        except exc.StallproofError:
            raise
        except Exception as e:
            raise self._translate(e)  # noqa: B904 - _translate chains it, or hides it on purpose

    def rearm(self, bound: str | None, deadline: float | None = None) -> None:
        """Change the phase bound of the running `bounded` block (None: total alone)."""
        if self._cancel_scope is not None:
            self._arm(bound, deadline)

    def _arm(self, bound: str | None, deadline: float | None) -> None:
        assert self._cancel_scope is not None
        if self._cancel_scope.cancel_called:
            return  # the bound already fired: keep the name of the one that did
        if bound is None or deadline is None or deadline >= self.total_deadline:
            bound, deadline = "total", self.total_deadline
        if self._cancel_scope.deadline != deadline:  # (each change is a new timer: skip no-ops)
            self._cancel_scope.deadline = deadline
        self._bound = bound

    def start_attempt(self, attempt: int) -> None:
        """Reset what one attempt learns (a retry starts from the pool again)."""
        self.attempt = attempt
        self.sent_at = None
        self.headers_received = False
        self.status_code = None
        self.server_request_id = None
        self.set_phase("pool wait")

    def timeout_error(self, bound: str, limit: float | None = None) -> exc.TimeoutException:
        if bound == "total" and self.enclosing is not None:
            return exc.DeadlineExceeded(
                limit=self.enclosing.seconds,
                elapsed=self.elapsed(),
                phase=self.phase,
                name=self.enclosing.name,
                request_id=self.request_id,
                server_request_id=self.server_request_id,
                method=self.method,
                url=self.url,
            )
        cls = exc.TIMEOUT_CLASSES[bound]
        return cls(
            limit=getattr(self.timeouts, bound) if limit is None else limit,
            elapsed=self.elapsed(),
            phase=self.phase,
            request_id=self.request_id,
            server_request_id=self.server_request_id,
            method=self.method,
            url=self.url,
        )

    def error(self, cls: type[E], message: str, **kw: Any) -> E:
        """An error of ``cls`` stamped with this call's ids, elapsed time and phase."""
        return cls(
            message,
            request_id=self.request_id,
            server_request_id=self.server_request_id,
            elapsed=self.elapsed(),
            phase=self.phase,
            method=self.method,
            url=self.url,
            **kw,
        )

    # -- httpcore trace extension --------------------------------------------------------

    async def trace(self, event: str, info: dict[str, Any]) -> None:
        phase = _TRACE_PHASES.get(event)
        if phase == "receiving body" and self.stream:
            phase = "streaming"
        if phase is not None:
            self.set_phase(phase)
        if event in _SENT_EVENTS:
            self.sent_at = self.now()
            self.set_phase("awaiting headers")
            # From here until content arrives, first_token applies as well as total.
            self.rearm("first_token", self.sent_at + self.timeouts.first_token)

    # -- one boundary for httpx's errors --------------------------------------------------

    def _translate(self, e: Exception) -> exc.InvalidRequestError:
        """Raise ``e`` as ours (``from e``), or return a refusal that shows no context.

        The one boundary for the pool's errors, called from the ``except`` clauses of
        `bounded`, `step` and `read_before`.
        """
        t = self.timeouts
        if isinstance(
            e, (httpcore2.UnsupportedProtocol, httpcore2.LocalProtocolError, h11.LocalProtocolError)
        ):
            # (h11's own error is what the pool lets through unmapped while sending a body
            # that does not match the caller's content-length.) Its text may quote a
            # header value (h11: "Illegal header value b'Bearer sk-...'"): keep only the
            # words before the first quote. The refusal is raised from
            # `_Bounded.__exit__`, where Python makes the pool's error its __context__
            # whatever we do, so that error keeps no text and its frames no locals (the
            # headers among them), and the refusal does not show it.
            said = re.split(r"""['"]""", str(e), maxsplit=1)[0].strip(" :")
            e.args = ()
            traceback.clear_frames(e.__traceback__)
            refusal = self.error(
                exc.InvalidRequestError, f"request cannot be sent: {said or type(e).__name__}"
            )
            refusal.__suppress_context__ = True
            return refusal
        if isinstance(e, httpcore2.ConnectTimeout):
            raise self.timeout_error("connect", t.connect) from e
        if isinstance(e, httpcore2.ReadTimeout):
            raise self.timeout_error("read", t.read) from e
        if isinstance(e, httpcore2.WriteTimeout):
            raise self.timeout_error("write", t.write) from e
        if isinstance(e, httpcore2.PoolTimeout):
            raise self.timeout_error("pool", t.pool) from e
        if isinstance(e, (httpcore2.ConnectError, httpcore2.ProxyError)):
            raise self.error(exc.ConnectError, f"could not connect: {_describe(e)}") from e
        if isinstance(e, httpcore2.RemoteProtocolError):
            if self.headers_received:
                raise self.error(
                    exc.TruncatedResponse, f"response ended early: {_describe(e)}"
                ) from e
            raise self.error(
                exc.ConnectionLost, f"connection lost {self._where()}: {_describe(e)}"
            ) from e
        if isinstance(e, (httpcore2.ReadError, httpcore2.WriteError, httpcore2.NetworkError)):
            raise self.error(
                exc.ConnectionLost, f"connection lost {self._where()}: {_describe(e)}"
            ) from e
        if isinstance(e, (httpcore2.TimeoutException, httpcore2.ProtocolError)):
            raise self.error(exc.TransportError, _describe(e)) from e
        if isinstance(e, OSError):
            # A socket error the pool did not map (e.g. raised while closing).
            raise self.error(
                exc.ConnectionLost, f"connection lost {self._where()}: {_describe(e)}"
            ) from e
        raise e

    def _where(self) -> str:
        return f"while {self.phase}"


class _Bounded:
    """A cancel scope that raises the call's timeout error when it fires itself.

    A cancellation from outside (the caller's own cancel scope, an enclosing bound) passes
    through untouched. With ``translate``, the pool's errors are raised as ours
    (`Call._translate`). ``bound`` None: the phase bound `Call.rearm` last armed (its
    cancel scope is the call's ``_cancel_scope`` until it exits).

    A class, not a generator context manager: thousands of calls may be in flight at
    once, each holding one or two of these, and a generator with its context manager is
    four more objects per block for the garbage collector to walk. On asyncio's own
    cancellation the block and its scope are one object (`_NativeBounded`). On trio an
    attempt's block may be *deferred* (`Call.bounded`): its scope is made and entered by
    `start`, once the pool has a connection for it, and the pool bounds the wait before.
    """

    __slots__ = ("_bound", "_call", "_deadline", "_translate", "cancel_scope")

    def __init__(
        self,
        call: Call,
        deadline: float,
        bound: str | None,
        *,
        translate: bool,
        deferred: bool = False,
    ):
        self._call = call
        self._bound = bound
        self._translate = translate
        self._deadline = deadline
        # On trio, trio's own cancel scope: anyio's on trio wraps one, an object more per
        # call in flight and frames more per block, for the same job.
        self.cancel_scope: _Scope | None
        if deferred:
            self.cancel_scope = None  # made and entered by `start` (trio: `Call.bounded`)
        elif call._on_trio:
            self.cancel_scope = sys.modules["trio"].CancelScope(deadline=deadline)
        else:
            self.cancel_scope = anyio.CancelScope(deadline=deadline)

    def __enter__(self) -> None:
        scope = self.cancel_scope
        if scope is None:
            self._call._deferred = self
            self._call._bound = "total"  # what is armed until the scope starts
            return
        scope.__enter__()
        _entered(self._call, self._bound, scope)

    def start(self) -> None:
        """Enter the deferred cancel scope (trio's), in the task that entered the block."""
        call = self._call
        call._deferred = None
        self.cancel_scope = scope = sys.modules["trio"].CancelScope(deadline=self._deadline)
        scope.__enter__()
        _entered(call, self._bound, scope)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        scope = self.cancel_scope
        call = self._call
        if scope is None:
            # Deferred and never started: the wait for a connection ended the block.
            call._deferred = None  # (and the cycle through it)
            _exited(call, self._bound, self._translate, None, False, error)
            return
        # (trio's also returns True when the body ended without an exception.)
        swallowed = scope.__exit__(exc_type, error, tb)
        _exited(call, self._bound, self._translate, scope, swallowed, error)


class _NativeBounded(NativeCancelScope):
    """`_Bounded` on asyncio's own cancellation: the block is its own cancel scope."""

    __slots__ = ("_bound", "_call", "_translate")

    def __init__(self, call: Call, deadline: float, bound: str | None, *, translate: bool):
        super().__init__(deadline)
        self._call = call
        self._bound = bound
        self._translate = translate

    def __enter__(self) -> None:  # type: ignore[override]  # (as _Bounded: no value)
        NativeCancelScope.__enter__(self)
        _entered(self._call, self._bound, self)

    def __exit__(  # type: ignore[override]  # (as _Bounded: raises, never swallows)
        self,
        exc_type: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        swallowed = NativeCancelScope.__exit__(self, exc_type, error, tb)
        _exited(self._call, self._bound, self._translate, self, swallowed, error)


def _entered(call: Call, bound: str | None, cancel_scope: _Scope) -> None:
    if bound is None:
        call._cancel_scope = cancel_scope
        call._arm(None, None)


def _exited(
    call: Call,
    bound: str | None,
    translate: bool,
    cancel_scope: _Scope | None,
    swallowed: bool | None,
    error: BaseException | None,
) -> None:
    """The end of a bounded block: its own deadline's timeout raised, the pool's errors
    translated, anything else (a cancellation from outside among them) left to go on."""
    if bound is None:
        call._cancel_scope = None
        bound = call._bound
    # Our own deadline fired: the scope caught its cancellation, or (a deferred block whose
    # scope never started) the pool ended the wait for a connection at it.
    fired = isinstance(error, DeadlinePassed) or (
        swallowed and cancel_scope is not None and cancel_scope.cancelled_caught
    )
    if fired:
        # The frames the cancellation went through have all
        # returned, but anyio and asyncio keep the exception in a local of one of
        # them: a cycle with its own traceback that would hold the whole call (its
        # request, scope, telemetry) until the garbage collector runs. Their locals go;
        # the traceback, kept as the timeout's ``__context__``, still names every
        # frame and line. (Frames still running are left as they are.)
        if error is not None:
            traceback.clear_frames(error.__traceback__)
        raise call.timeout_error(bound)
    if translate and isinstance(error, Exception) and not isinstance(error, exc.StallproofError):
        raise call._translate(error)  # the translated error, or a refusal


def _describe(e: BaseException) -> str:
    text = str(e)
    cause = e.__context__
    if not text and cause is not None:
        text = str(cause) or type(cause).__name__
    return text or type(e).__name__
