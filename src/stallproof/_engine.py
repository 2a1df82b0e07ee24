"""`Engine`: the one implementation of what makes a call stallproof.

Every face of stallproof — its own `Client`, the httpx and httpx2 transports, the SDK
faces built on them — hands requests to an `Engine`, which:

1. opens a `CallScope` (telemetry, in-flight registry entry; later the pacer permit and
   the breaker ticket) and a total deadline, clipped by any enclosing `deadline()` block;
2. refuses at once while the upstream's circuit is open, then waits for the pacer inside
   the deadline;
3. makes attempts through its connection pool until one succeeds, retrying inside the
   deadline only while nothing has reached the caller: a non-stream body is read whole
   inside the attempt, an event stream up to its first content event;
4. hands back an `Incoming`: status, headers and a `ResponseBody` that stays bounded
   while the caller reads it, and ends the call when it is closed.

A non-2xx answer that is not retried (or that used up its attempts) is returned as a
response with its body read (capped at ``max_error_body_bytes``), so a transport gives the
SDK the response it expects; ``Incoming.error`` carries the matching `APIStatusError` for
faces that raise it themselves.

The layers, one concern each (httpx's ``send → _send_handling_auth → ...``), none longer
than a screen: `send` owns the call, its redirects (each hop inside the one deadline, at
most ``Limits.max_redirects``: see `stallproof._redirects`) and each hop's first attempt
(`_open` does what comes before its first await: `_open_call` makes its state,
`_prepare_headers` what every attempt sends), `_retry` the retry loop after a retryable
failure, `_attempt` one request in its span
(`_pool_request` builds it, `_answer` reads what came back: `_head` the head,
`_error_body` a non-2xx answer, `_read_whole` a body). What a call stalled in flight holds
is counted: thousands may be, and the garbage collector walks every coroutine of each
(docs/pool.md), so a layer that only wraps an await is folded into its caller.
"""

from __future__ import annotations

import dataclasses
import random
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import httpcore2
import httpx2

from . import _exceptions as exc
from ._body import ResponseBody, aclose_iterator, close_pool_response, closes_at_once
from ._breaker import BreakerRegistry, Circuit, CircuitState
from ._call import Call
from ._callscope import CallScope
from ._config import UNSET, Limits, Timeouts, Unset
from ._deadline import current_deadline
from ._decoding import (
    BadEncoding,
    ContentDecoder,
    TooLarge,
    Truncated,
    accept_encoding,
    content_encodings,
    decoded_headers,
    typed_errors,
)
from ._fleet import Stores
from ._inflight import InflightCall, current_tags
from ._json import OFF_LOOP_BYTES, loads
from ._pacer import PacerRuntime, PacerState
from ._policies import Breaker, Pacer, Retry, RetryBudget
from ._progress import Outcome
from ._redact import check_headers
from ._redirects import BadLocation, next_hop, redirect_location
from ._registry import register, snapshot
from ._retry import RetryTokens, make_retrying
from ._status import status_error_from_body
from ._telemetry import CallTelemetry, Instruments
from ._wire import Pool, Wire
from ._wire._messages import new_request
from ._wire._proxy import ProxyTypes

__all__ = ["CallOptions", "Engine", "Incoming", "Outgoing", "new_request_id"]

_NO_RETRY = Retry(attempts=1)
# A request body larger than this is not parsed for its model and message sizes.
_PEEK_LIMIT = 4 * 1024 * 1024
_PHASES = ("connect", "read", "write", "pool")


def new_request_id() -> str:
    return f"sp-{secrets.token_hex(12)}"


@dataclasses.dataclass(frozen=True, slots=True)
class CallOptions:
    """What a face tells the engine about one call, beyond the HTTP request itself.

    Every field is optional: a bare transport knows none of them and the engine reads what
    it needs (model, stream, messages) from the JSON body.
    """

    timeouts: Timeouts | None = None
    retry: Retry | Unset | None = UNSET
    agent: str | None = None
    labels: Mapping[str, str] | None = None
    body: Mapping[str, Any] | None = None
    upstream: str | None = None
    operation: str | None = None
    credentials: frozenset[str] = frozenset()
    """Header names (lower-case) that carry a credential, beyond those stallproof always
    treats so (an SDK's ``auth_headers``): dropped on a redirect to another origin."""


_NO_OPTIONS = CallOptions()


@dataclasses.dataclass(slots=True)
class Outgoing:
    """A request as the engine sends it: already encoded, body in memory (retries resend it)."""

    method: bytes
    scheme: bytes
    host: bytes
    port: int | None
    target: bytes
    headers: list[tuple[bytes, bytes]]
    content: bytes = b""
    timeout: Mapping[str, float | None] | None = None
    options: CallOptions = _NO_OPTIONS
    body: Mapping[str, Any] | None = None
    """The JSON body ``content`` encodes, if the face has it as a mapping: `Engine.send`
    reads what it needs (model, stream, messages) as the call starts and drops it."""

    @property
    def url(self) -> str:
        """The URL without credentials, for spans and messages."""
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.scheme.decode()}://{self.host.decode()}{port}{self.target.decode()}"


@dataclasses.dataclass(slots=True)
class Incoming:
    """A response the engine hands back: its body is bounded while it is read."""

    status: int
    headers: list[tuple[bytes, bytes]]
    extensions: dict[str, Any]
    body: ResponseBody
    call: Call
    error: exc.APIStatusError | None = None

    def header(self, name: str) -> str | None:
        key = name.lower().encode()
        for k, v in self.headers:
            if k.lower() == key:
                return v.decode("latin-1")
        return None


class _StatusFailure(Exception):
    """Internal: a non-2xx answer, carried through the retry loop with its response."""

    def __init__(self, error: exc.APIStatusError, incoming: Incoming) -> None:
        super().__init__(error.message)
        self.error = error
        self.incoming = incoming


class Engine:
    """Bounds, retries, breaker, pacer, in-flight view and telemetry for every face.

    Args:
        timeout: the default `Timeouts` of every call (a face may pass its own per call).
        limits: size caps and the pool's size (`Limits`).
        retry: the default `Retry` policy; None never retries.
        retry_budget: the `RetryBudget` shared by every call; None: no budget.
        breaker: a `Breaker` policy, one circuit per upstream; None: no breaker.
        pacer: a `Pacer` every call waits for (inside its deadline); None: no pacing.
        pool: the connection pool to send through; default: stallproof's own, built from
            ``limits`` (see `stallproof._wire._pool`).
        trust_env: the default pool sends through the proxies ``HTTP_PROXY``,
            ``HTTPS_PROXY``, ``ALL_PROXY`` name, bar ``NO_PROXY`` (as httpx does).
        proxy: a proxy URL (``http://user:pass@host:3128``, ``socks5://...``) or an
            ``httpx.Proxy`` for every call of the default pool, instead of the environment.
        provider_name: ``gen_ai.provider.name``, as for `Client`.
        record_content: put prompts and completions on spans, as for `Client`.
        tracer_provider: the OpenTelemetry tracer provider, as for `Client`.
        meter_provider: the OpenTelemetry meter provider, as for `Client`.

    One engine belongs to one event loop, as its client does: the state its calls share
    (budget, circuits, pacer, registry) changes without awaiting, and takes no lock.
    """

    def __init__(
        self,
        *,
        timeout: Timeouts = Timeouts(),  # noqa: B008 - frozen and immutable
        limits: Limits = Limits(),  # noqa: B008 - frozen and immutable
        retry: Retry | None = Retry(),  # noqa: B008 - frozen and immutable
        retry_budget: RetryBudget | None = RetryBudget(),  # noqa: B008 - frozen and immutable
        breaker: Breaker | None = None,
        pacer: Pacer | None = None,
        pool: Wire | None = None,
        trust_env: bool = True,
        proxy: ProxyTypes | None = None,
        provider_name: str | None = None,
        record_content: bool = False,
        tracer_provider: Any = None,
        meter_provider: Any = None,
    ) -> None:
        if not isinstance(timeout, Timeouts):
            raise exc.InvalidRequestError(f"timeout must be a Timeouts, got {timeout!r}")
        if not isinstance(limits, Limits):
            raise exc.InvalidRequestError(f"limits must be a Limits, got {limits!r}")
        if retry is not None and not isinstance(retry, Retry):
            raise exc.InvalidRequestError(f"retry must be a Retry or None, got {retry!r}")
        if pacer is not None and not isinstance(pacer, Pacer):
            raise exc.InvalidRequestError(f"pacer must be a Pacer or None, got {pacer!r}")
        if breaker is not None and not isinstance(breaker, Breaker):
            raise exc.InvalidRequestError(f"breaker must be a Breaker or None, got {breaker!r}")
        self.timeout = timeout
        self.limits = limits
        self.retry = retry or _NO_RETRY
        self._retry_tokens = RetryTokens(retry_budget) if retry_budget is not None else None
        # Fleet state on Redis, if the policies share any.
        self.stores = stores = Stores(meter_provider)
        self._breakers = BreakerRegistry(breaker, stores=stores) if breaker is not None else None
        self._pacing = PacerRuntime(pacer, stores=stores) if pacer is not None else None
        self._owns_pool = pool is None
        if pool is None:
            from ._wire._pool import open_pool

            pool = open_pool(limits, trust_env=trust_env, proxy=proxy)
        self.pool: Wire = pool
        # An attempt may be bounded on asyncio's own cancellation (`Call.bounded`).
        self._native_bounds = isinstance(pool, Pool) and pool.unshielded
        # stallproof's pool builds an attempt's request once it has a connection for it.
        self._own_wire = pool if isinstance(pool, Pool) else None
        self._rng = random.Random()
        # Headers already found fine (`check_headers`): a client sends the same on every call.
        self._known_headers: set[tuple[bytes, bytes]] = set()
        self._calls: dict[int, Call] = {}
        register(self, self._calls)  # in `stallproof.inflight()` while this engine lives
        self._instruments = Instruments(
            provider_name=provider_name,
            record_content=record_content,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            circuits=self.circuits,
        )
        # Outcomes of whole bodies are parsed only when someone will use them.
        self._wants_outcome = record_content or (
            pacer is not None and pacer.tokens_per_minute is not None
        )

    # -- views -----------------------------------------------------------------------------

    def inflight(self, *, stalled_after: float = 5.0) -> tuple[InflightCall, ...]:
        """Every call in progress right now, longest-running first (see `Client.inflight`)."""
        calls = snapshot(self._calls, stalled_after)  # from any thread
        return tuple(sorted(calls, key=lambda c: -c.elapsed))

    @property
    def retry_tokens(self) -> float | None:
        return self._retry_tokens.tokens if self._retry_tokens is not None else None

    def pacer_state(self) -> PacerState | None:
        return self._pacing.snapshot() if self._pacing is not None else None

    def circuits(self) -> dict[str, CircuitState]:
        return self._breakers.snapshot() if self._breakers is not None else {}

    async def aclose(self) -> None:
        """Close the pool's connections (a pool passed in is left to its owner)."""
        for shared in (self._pacing, self._breakers):
            if shared is not None:
                await shared.aclose()  # fleet state on Redis, if any (bounded)
        if self._owns_pool:
            with anyio.move_on_after(5.0, shield=True):
                await self.pool.aclose()

    # -- the call --------------------------------------------------------------------------

    async def send(self, out: Outgoing) -> Incoming:
        """Make one logical call: pace, attempt (and retry), follow redirects, and hand back
        the response.

        Redirects: every hop runs inside the call's one deadline, pacer permit and span; the
        call fails with `TooManyRedirects` past ``Limits.max_redirects``. A face's HTTP
        client is never handed a redirect, so it never follows one with a fresh deadline.

        Each hop's first attempt runs on its own, under the one scope that bounds it
        (`bounded`: total and its phase bounds): most calls succeed at once, and tenacity's
        machinery (its loop, its state, closures per call) and the total scope around
        retries and their waits are built only when a failure may be retried (`_retry`). A
        non-2xx answer goes through that loop as its `APIStatusError` (the policy decides on
        those); when the loop gives up on one, the response itself is handed back. The hops
        and the first attempt are awaited from here, not from layers of their own: a call
        stalled in flight holds a coroutine less for each (thousands may be in flight, and
        every full collection walks them all).

        Raises:
            StallproofError: a bound fired (`TimeoutException`), the connection failed
                (`TransportError`), the answer was unacceptable (`ProtocolError`), the
                circuit is open (`CircuitOpen`), the redirects went past their limit
                (`TooManyRedirects`) or the request cannot be sent (`InvalidRequestError`).
                Non-2xx answers are returned, not raised.
        """
        scope, policy, circuit, estimated = self._open(out)
        call = scope.call
        limit = self.limits.max_redirects
        hops = 0
        try:
            if call.remaining() <= 0:
                raise call.timeout_error("total")
            if self._pacing is not None:
                await scope.pace(self._pacing, estimated, circuit)
            while True:
                first: BaseException | None = None
                try:
                    incoming = await self._attempt(out, scope, circuit, 1, policy.attempts)
                except BaseException as e:
                    # (Kept only until the retry loop takes it: an error a frame of its
                    # own traceback holds is a cycle.)
                    if policy.attempts == 1 or not policy.retryable(
                        e.error if isinstance(e, _StatusFailure) else e
                    ):
                        raise  # what tenacity would do: nothing to decide, no budget drawn
                    first = e
                if first is not None:
                    try:
                        with call.within_total():
                            incoming = await self._retry(out, scope, policy, circuit, first)
                    finally:
                        del first  # no cycle through this frame's traceback
                location = redirect_location(incoming.status, incoming.headers)
                if location is None:
                    break
                if hops >= limit:
                    raise call.error(
                        exc.TooManyRedirects,
                        f"HTTP {incoming.status}: more than max_redirects={limit} redirects",
                        limit=limit,
                    )
                hops += 1
                out = _redirected(out, incoming.status, location, call)
        except _StatusFailure as failure:
            # Out of attempts (or not retryable): the caller gets the response itself.
            scope.end(failure.error)
            incoming = failure.incoming
            incoming.error = failure.error
            return incoming
        except BaseException as e:
            scope.end(e)
            raise
        if self._retry_tokens is not None:
            self._retry_tokens.record_success()
        return incoming

    def _open(self, out: Outgoing) -> tuple[CallScope, Retry, Circuit | None, int]:
        """Everything a call does before its first await: its `Call` and scope (telemetry
        started, in the registry), its retry policy, its circuit (checked), the tokens it
        counts against a pacer, and its headers as every attempt sends them."""
        opts = out.options
        body = out.body if out.body is not None else opts.body
        out.body = None  # read once, here: not held while the call runs (thousands may)
        meta = body if body is not None else _peek_json(out)
        policy = self._resolve_retry(opts.retry)
        # Refused by name before anything is sent: the HTTP layer's own error would quote
        # the value, and the value of a bad Authorization header is the key. (Checked
        # before the call adds its own x-request-id, which is fine by construction.)
        problem = check_headers(out.headers, self._known_headers) or _port_problem(out.port)
        call = self._open_call(out, meta, policy)
        if problem is not None:
            raise call.error(exc.InvalidRequestError, problem)
        circuit: Circuit | None = None
        if self._breakers is not None:
            circuit = self._breakers.circuit(opts.upstream or _origin(out), call.model)
            circuit.check()  # while open, fail before doing any work at all
        _prepare_headers(out, call.request_id, policy)
        scope = CallScope(call, self._start_telemetry(out, call, meta), self._calls)
        estimated = _estimate(self._pacing.policy, meta) if self._pacing is not None else 0
        return scope, policy, circuit, estimated

    def _open_call(self, out: Outgoing, meta: Mapping[str, Any], policy: Retry) -> Call:
        """The call's runtime state: its id (the caller's ``x-request-id``, else a new one,
        sent), its bounds clipped by any enclosing `deadline()`, its tags."""
        opts = out.options
        model = meta.get("model")
        tag_agent, tag_labels = current_tags()
        request_id = _header(out.headers, b"x-request-id")
        if request_id is None:
            request_id = new_request_id()
            out.headers.append((b"x-request-id", request_id.encode()))
        return Call(
            self._resolve_timeouts(opts.timeouts, out.timeout),
            request_id,
            stream=meta.get("stream") is True
            or "text/event-stream" in (_header(out.headers, b"accept") or ""),
            model=model if isinstance(model, str) else "",
            agent=opts.agent if opts.agent is not None else tag_agent,
            labels={**tag_labels, **(opts.labels or {})},
            max_attempts=policy.attempts,
            enclosing=current_deadline(),
            method=out.method.decode("ascii", "replace"),
            url=out.url,
        )

    def _start_telemetry(self, out: Outgoing, call: Call, meta: Mapping[str, Any]) -> CallTelemetry:
        instruments = self._instruments
        if instruments.quiet():
            return instruments.start_quiet(call)  # nothing to record: no attributes to build
        return instruments.start(
            call,
            meta,
            operation=out.options.operation or _operation(out.target),
            server_address=out.host.decode("ascii", "replace"),
            server_port=out.port or (443 if out.scheme == b"https" else 80),
            path=out.target.decode("ascii", "replace"),
        )

    async def _retry(
        self,
        out: Outgoing,
        scope: CallScope,
        policy: Retry,
        circuit: Circuit | None,
        first: BaseException,
    ) -> Incoming:
        """tenacity's loop after a retryable first failure, which it sees as attempt 1."""
        call = scope.call
        retrying = make_retrying(
            policy,
            call,
            self._retry_tokens,
            rng=self._rng,
            on_retry=scope.telemetry.retry_scheduled,
        )
        last: _StatusFailure | None = None
        n = 0
        try:
            async for attempt in retrying:
                with attempt:
                    n += 1
                    try:
                        if n == 1:
                            raise first
                        return await self._attempt(out, scope, circuit, n, policy.attempts)
                    except _StatusFailure as failure:
                        last = failure
                        raise failure.error from None
        except exc.APIStatusError as e:
            if last is not None and e is last.error:
                raise last from None
            raise
        finally:
            del last, retrying, first  # no cycle through this frame's traceback
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover

    async def _attempt(
        self, out: Outgoing, scope: CallScope, circuit: Circuit | None, n: int, of: int
    ) -> Incoming:
        """One request in its span: send, check the status, read the body or the stream's
        first content (`_answer`)."""
        call = scope.call
        call.start_attempt(n)
        telemetry = scope.telemetry
        carrier, token = telemetry.enter_attempt(n, call.url or out.url)
        try:
            if circuit is not None:
                with call.within_total():  # a shared circuit asks Redis: inside the deadline
                    await scope.admit(circuit)
            own = self._own_wire
            pool_response: httpcore2.Response | None = None
            try:
                with call.bounded(native=self._native_bounds, deferred=own is not None):
                    if own is not None:
                        pool_response = await own.send(_Planned(out, call, n, of, carrier))
                    else:
                        request = _pool_request(out, call, n, of, carrier)
                        pool_response = await self.pool.send(request)
                    status, headers, body = await self._answer(scope, pool_response)
            except _StatusFailure as failure:
                scope.attempt_ended(failure.error, failure.error.status_code)
                await _release(pool_response)
                raise
            except BaseException as e:
                scope.attempt_ended(e)
                await _release(pool_response)
                raise
            if not body.is_stream:
                await self._close_read(pool_response)
            scope.attempt_ended(None, status)
            return Incoming(status, headers, _extensions(pool_response), body, call)
        finally:
            telemetry.exit_attempt(token)

    async def _answer(
        self, scope: CallScope, pool_response: httpcore2.Response
    ) -> tuple[int, list[tuple[bytes, bytes]], ResponseBody]:
        """What came back, inside the attempt's bounds: an error body read (capped), an
        event stream read up to its first content (discarded here if that fails), or a
        whole body."""
        call = scope.call
        status, headers, decoder = self._head(call, pool_response)
        if status >= 300:
            body = await self._error_body(scope, pool_response, headers, decoder)
        elif call.stream and _is_event_stream(pool_response.headers):
            # An event stream is read as one only when one was asked for: an answer that
            # streams to a plain request is a whole body, bounded by total.
            body = ResponseBody(scope, self.limits, pool_response=pool_response, decoder=decoder)
            try:
                await body.prefetch()
            except BaseException:
                await body.discard()  # its iterator and connection; the call goes on
                raise
        else:
            content = await self._read_whole(pool_response, call, decoder, error=False)
            body = ResponseBody(
                scope,
                self.limits,
                content=content,
                parse_outcome=_parse_outcome if self._wants_outcome else None,
            )
        return status, headers, body

    def _head(
        self, call: Call, pool_response: httpcore2.Response
    ) -> tuple[int, list[tuple[bytes, bytes]], ContentDecoder]:
        """The answer's head, noted on the call; the decoder its body is read through.

        The body is decoded here, counted as it is decoded; the headers handed back say
        nothing of its Content-Encoding, so no face decodes it a second time.
        """
        call.headers_received = True
        call.status_code = status = pool_response.status
        call.server_request_id = _header(pool_response.headers, b"x-request-id") or _header(
            pool_response.headers, b"request-id"
        )
        error_body = status >= 300
        cap = self.limits.max_error_body_bytes if error_body else self.limits.max_response_bytes
        with typed_errors(call, cap):
            try:
                decoder = ContentDecoder(content_encodings(pool_response.headers), cap)
            except BadEncoding:
                if not error_body:
                    raise
                # The status is the answer: its body is kept as it came.
                decoder = ContentDecoder((), cap)
        headers = (
            pool_response.headers if decoder.identity else decoded_headers(pool_response.headers)
        )
        return status, headers, decoder

    async def _error_body(
        self,
        scope: CallScope,
        pool_response: httpcore2.Response,
        headers: list[tuple[bytes, bytes]],
        decoder: ContentDecoder,
    ) -> ResponseBody:
        """A non-2xx answer's body, read (capped); raised as `_StatusFailure`, carrying the
        matching `APIStatusError`, unless it is a redirect, which `send` follows."""
        call = scope.call
        status = pool_response.status
        content = await self._read_whole(pool_response, call, decoder, error=True)
        body = ResponseBody(scope, self.limits, content=content)
        if redirect_location(status, headers) is None:
            error = status_error_from_body(call, status, headers, content)
            incoming = Incoming(status, headers, _extensions(pool_response), body, call)
            raise _StatusFailure(error, incoming)
        return body

    async def _read_whole(
        self, pool_response: httpcore2.Response, call: Call, decoder: ContentDecoder, *, error: bool
    ) -> bytes:
        """Read and decode a whole body under the attempt's bounds, capped once decoded.

        An error body is cut at ``max_error_body_bytes`` (the rest is not read: the
        connection is closed instead). A success body over ``max_response_bytes`` fails.
        Decoding runs in pieces with a checkpoint between them, so the deadline fires in
        the middle of a body that decodes to far more than was sent.
        """
        limits = self.limits
        cap = limits.max_error_body_bytes if error else limits.max_response_bytes
        declared = _header(pool_response.headers, b"content-length")
        if not error and declared is not None and declared.isdigit() and int(declared) > cap:
            raise call.error(
                exc.ResponseTooLarge,
                f"Content-Length {declared} is over max_response_bytes={cap}",
                limit=cap,
            )
        buf = bytearray()
        first = True
        raw = pool_response.stream.__aiter__()  # type: ignore[union-attr]
        exhausted = False
        try:
            with typed_errors(call, cap):
                try:
                    async for part in raw:
                        call.progress(len(part))
                        if first:
                            # The first body byte ends first_token; total still applies.
                            call.rearm(None)
                            first = False
                        for piece in decoder.feed(part):
                            buf += piece
                            if not decoder.identity:
                                await anyio.lowlevel.checkpoint()
                    exhausted = True
                    decoder.finish()
                except TooLarge as over:
                    if not error:
                        raise
                    buf += over.head
                except (BadEncoding, Truncated):
                    if not error:
                        raise
                    # An error body that does not decode: the status is the answer, with
                    # what decoded before the fault.
        finally:
            if exhausted and closes_at_once(pool_response):
                await aclose_iterator(raw)  # no I/O, never suspends: nothing to shield
            elif exhausted and self._closes_bounded():
                # Closing an iterator that ran to its end is local: no timer for it.
                with anyio.CancelScope(shield=True):
                    await aclose_iterator(raw)
            else:
                with anyio.move_on_after(5.0, shield=True):
                    await aclose_iterator(raw)
        return bytes(buf)

    def _closes_bounded(self) -> bool:
        # stallproof's own pool bounds every close itself, shielded (see `_pool.Pool`).
        return isinstance(self.pool, Pool)

    async def _close_read(self, pool_response: httpcore2.Response) -> None:
        """Give back the connection of a body read to its end."""
        if closes_at_once(pool_response):
            await pool_response.aclose()  # no I/O, never suspends: nothing to shield
        elif self._closes_bounded():
            # Our pool bounds its own closing (shielded, with a timeout where there is
            # I/O): no second timer per call for a body that is already read.
            with anyio.CancelScope(shield=True):
                await pool_response.aclose()
        else:
            await close_pool_response(pool_response)

    # -- resolving per-call settings ---------------------------------------------------------

    def _resolve_timeouts(
        self, timeouts: Timeouts | None, phases: Mapping[str, float | None] | None
    ) -> Timeouts:
        base = timeouts if timeouts is not None else self.timeout
        if not phases:
            return base
        # An HTTP client's own per-phase timeouts may only tighten ours, never loosen them.
        changes = {
            name: float(value)
            for name in _PHASES
            if isinstance(value := phases.get(name), (int, float))
            and 0 < value < getattr(base, name)
        }
        return base.replace(**changes) if changes else base

    def _resolve_retry(self, retry: Retry | Unset | None) -> Retry:
        if retry is UNSET:
            return self.retry
        if retry is None:
            return _NO_RETRY
        if not isinstance(retry, Retry):
            raise exc.InvalidRequestError(f"retry must be a Retry or None, got {retry!r}")
        return retry


async def _release(pool_response: httpcore2.Response | None) -> None:
    """Give a failed attempt's connection back. (A stream `_answer` made is discarded
    there first; closing its response again is a no-op: every pool's response closes
    once.)"""
    if pool_response is not None:
        await close_pool_response(pool_response)


def _redirected(out: Outgoing, status: int, location: bytes, call: Call) -> Outgoing:
    """The request after a redirect (see `stallproof._redirects.next_hop`)."""
    url = httpx2.URL(
        scheme=out.scheme.decode("ascii"),
        host=out.host.decode("ascii"),
        port=out.port,
        raw_path=out.target,
    )
    try:
        method, target, headers, content = next_hop(
            out.method,
            url,
            out.headers,
            out.content,
            status=status,
            location=location,
            credentials=out.options.credentials,
        )
    except BadLocation as e:
        raise call.error(exc.MalformedResponse, f"HTTP {status}: {e}") from None
    nxt = Outgoing(
        method,
        target.raw_scheme,
        target.raw_host,
        target.port,
        target.raw_path,
        headers,
        content,
        timeout=out.timeout,
        options=out.options,
    )
    call.method = method.decode("ascii")
    call.url = nxt.url
    return nxt


class _Planned:
    """Attempt ``n`` of ``of`` as the pool's `RequestPlan`: what stallproof's pool needs to
    find it a connection; the request itself (`_pool_request`) is built once it has one. A
    call waiting in the pool's queue holds this, not the request's five objects (thousands
    may wait). On trio the attempt's bounds start when it is built (`Call.bounded`'s
    ``deferred``); until then the pool ends the wait at ``wait_deadline``."""

    __slots__ = ("_call", "_carrier", "_n", "_of", "_out", "pool_timeout")

    def __init__(
        self, out: Outgoing, call: Call, n: int, of: int, carrier: Mapping[str, str]
    ) -> None:
        self._out = out
        self._call = call
        self._n = n
        self._of = of
        self._carrier = carrier
        # Fixed now, when the wait for a connection starts.
        self.pool_timeout = _unless_total_first(
            call.timeouts.pool, call.total_deadline - call.now()
        )

    @property
    def scheme(self) -> bytes:
        return self._out.scheme

    @property
    def host(self) -> bytes:
        return self._out.host

    @property
    def port(self) -> int | None:
        return self._out.port

    @property
    def wait_deadline(self) -> float | None:
        return self._call.wait_deadline

    def build(self) -> httpcore2.Request:
        # Built, it is about to be sent: the attempt's bounds start if they were deferred
        # while it waited for a connection (`Call.bounded`), whoever builds it.
        self._call.start_bounds()
        return _pool_request(self._out, self._call, self._n, self._of, self._carrier)


def _pool_request(
    out: Outgoing, call: Call, n: int, of: int, carrier: Mapping[str, str]
) -> httpcore2.Request:
    """Attempt ``n`` of ``of`` as the wire sends it, with the trace context and the phase
    bounds httpcore2 applies per operation."""
    headers = [*out.headers, (b"x-stallproof-attempt", f"{n}/{of}".encode())]
    headers.extend((k.encode(), v.encode()) for k, v in carrier.items())
    t = call.timeouts
    left = call.total_deadline - call.now()
    timeout = {
        name: _unless_total_first(limit, left)
        for name, limit in (
            ("connect", t.connect),
            ("read", t.read),
            ("write", t.write),
            ("pool", t.pool),
        )
    }
    return new_request(  # httpcore2.Request without re-checking every header
        out.method,
        out.scheme,
        out.host,
        out.port,
        out.target,
        headers,
        out.content,
        {"timeout": timeout, "trace": call.trace},
    )


def _unless_total_first(limit: float, left: float) -> float | None:
    """A per-operation bound, or None when it cannot fire before total (``left`` seconds
    away): no timer of its own for every wait, read and connect; total, which never moves,
    ends the call first. (Each operation starts now or later, so it ends after total too.)"""
    return limit if limit <= left else None


def _prepare_headers(out: Outgoing, request_id: str, policy: Retry) -> None:
    """The headers every attempt sends: Host, the codings we can decode with a cap, and an
    idempotency key when the call may be retried."""
    if not any(k.lower() == b"host" for k, _ in out.headers):
        out.headers.insert(0, (b"host", _host_header(out)))
    # Ask only for the codings we can decode with a cap (httpx offers what it can).
    out.headers = [
        (k, accept_encoding(v) if k.lower() == b"accept-encoding" else v) for k, v in out.headers
    ]
    if policy.attempts > 1 and _header(out.headers, b"idempotency-key") is None:
        # The same key on every attempt lets a server drop a duplicate it already ran.
        out.headers.append((b"idempotency-key", f"stallproof-{request_id}".encode()))


def _estimate(pacer: Pacer, meta: Mapping[str, Any]) -> int:
    """What the call counts against ``tokens_per_minute`` before it is sent."""
    max_tokens = meta.get("max_tokens") or meta.get("max_completion_tokens")
    return pacer.estimate_tokens(
        meta.get("messages") or meta.get("input"),
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
    )


def _peek_json(out: Outgoing) -> Mapping[str, Any]:
    """The request's JSON object, if it is one and small enough to parse; else empty."""
    content = out.content
    if not content or len(content) > _PEEK_LIMIT or content[:1] != b"{":
        return {}
    try:
        obj = loads(content)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def _parse_outcome(content: bytes) -> Outcome | None:
    # Runs on the loop as the body closes: only bodies small enough to parse at once.
    if len(content) > OFF_LOOP_BYTES or content[:1] != b"{":
        return None
    try:
        obj = loads(content)
    except ValueError:
        return None
    outcome = Outcome()
    outcome.note_body(obj)
    return outcome


def _header(headers: Sequence[tuple[bytes, bytes]], name: bytes) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def _is_event_stream(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    ctype = _header(headers, b"content-type")
    return ctype is not None and ctype.lower().startswith("text/event-stream")


def _extensions(pool_response: httpcore2.Response) -> dict[str, Any]:
    ext = pool_response.extensions
    return {k: ext[k] for k in ("http_version", "reason_phrase") if k in ext}


def _port_problem(port: int | None) -> str | None:
    if port is None or 0 < port < 65536:
        return None
    return f"port {port} is out of range (1-65535)"


def _host_header(out: Outgoing) -> bytes:
    default = 443 if out.scheme == b"https" else 80
    if out.port is None or out.port == default:
        return out.host
    return out.host + b":" + str(out.port).encode()


def _origin(out: Outgoing) -> str:
    port = out.port or (443 if out.scheme == b"https" else 80)
    return f"{out.scheme.decode()}://{out.host.decode('ascii', 'replace')}:{port}"


def _operation(target: bytes) -> str:
    path = target.split(b"?", 1)[0].rstrip(b"/")
    if path.endswith(b"/chat/completions") or path.endswith(b"/responses"):
        return "chat"
    if path.endswith(b"/messages"):
        return "chat"
    if path.endswith(b"/embeddings"):
        return "embeddings"
    if path.endswith(b"/completions"):
        return "text_completion"
    return path.rsplit(b"/", 1)[-1].decode("ascii", "replace") or "http"
