"""The journal: what each connection did, request by request, for tests to read.

The server writes it on its event loop as things happen (a connection opens, a request head
is read, a status goes out, the client leaves...) and tests read frozen snapshots of it from
any thread: `journal()` returns `ConnectionRecord`s, and `verdict()` (in `_verdict`) judges
the client from them. One lock guards the containers; the live entries are small slotted
objects whose fields are plain assignments.

It is bounded: the last `connections` connections are kept (10,000 by default) and, per
connection, the last `per_connection` requests (256), so a benchmark with millions of
requests or 10,000 held sockets costs a few megabytes at most.

Times are seconds since the server started (`time.monotonic` based).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = [
    "ConnectionRecord",
    "ConnLog",
    "Journal",
    "RequestOutcome",
    "RequestLog",
    "RequestRecord",
]

# How a request ended, as the server saw it.
RequestOutcome = Literal[
    "running",  # not over yet.
    "complete",  # the response was sent whole and well framed.
    "client_closed",  # the client closed its side (FIN) before the response was complete.
    "client_reset",  # the client reset the connection (RST) before the response was complete.
    "hold_expired",  # the fault ran until its hold and the server closed: the client never left.
    "server_closed",  # the fault itself ended the connection with a FIN (close_mid_body...).
    "server_reset",  # the fault itself reset the connection (reset, cut_after;then=reset).
    "shutdown",  # the server stopped while the request was running.
]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request, as the server saw it.

    Attributes:
        connection: id of the connection it came on (`ConnectionRecord.id`).
        index: its position on that connection, from 1.
        method, path: as sent, with the ``/fault/<spec>`` prefix removed.
        fault: the spec that was applied (``"healthy"`` when none).
        source: what chose it: ``header``, ``path``, ``scenario``, ``mix`` or ``default``.
        key: the sequence key it carried (``key=`` in its spec, or an ``X-Fault-Key``).
        request_id: the client's ``x-request-id``, when it sent one.
        idempotency_key: the client's ``Idempotency-Key``, when it sent one.
        started: when its head was read.
        status: the status sent, or None when no response head went out.
        retry_after: the delay the response advised (``retry-after-ms`` or
            ``Retry-After``), in seconds, if any.
        bytes_sent: response bytes written to the socket.
        ended: when it ended, or None while running.
        outcome: how it ended (see `RequestOutcome`).
    """

    connection: int
    index: int
    method: str
    path: str
    fault: str
    source: str
    key: str | None
    request_id: str | None
    idempotency_key: str | None
    started: float
    status: int | None
    retry_after: float | None
    bytes_sent: int
    ended: float | None
    outcome: RequestOutcome

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ConnectionRecord:
    """One accepted connection and the requests it carried.

    Attributes:
        id: increasing from 1 in the order connections were accepted.
        peer: the client's ``host:port``.
        opened, closed: when it was accepted and closed (None while open).
        closed_by: ``client``, ``server``, or None while open.
        how: for the client, ``fin`` or ``rst``; for the server, ``fault`` (the fault
            closed it), ``hold`` (a fault's hold ran out), ``idle`` (no request within
            max_hold), ``done`` (it answered ``Connection: close`` or an unusable
            request), or ``shutdown``.
        requests: its last requests (at most 256), oldest first.
        requests_total: every request it carried, dropped ones included.
        fault: the connection-level fault it met (``slow_accept;pause=1``), if any.
    """

    id: int
    peer: str
    opened: float
    closed: float | None
    closed_by: str | None
    how: str | None
    requests: tuple[RequestRecord, ...]
    requests_total: int
    fault: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["requests"] = [r.as_dict() for r in self.requests]
        return out


class RequestLog:
    """The live, mutable entry of one request; `Journal.snapshot` freezes it."""

    __slots__ = (
        "bytes_sent",
        "ended",
        "fault",
        "idempotency_key",
        "index",
        "key",
        "method",
        "outcome",
        "path",
        "request_id",
        "retry_after",
        "source",
        "started",
        "status",
    )

    def __init__(self, index: int, method: str, path: str, started: float) -> None:
        self.index = index
        self.method = method
        self.path = path
        self.started = started
        self.fault = "healthy"
        self.source = "default"
        self.key: str | None = None
        self.request_id: str | None = None
        self.idempotency_key: str | None = None
        self.status: int | None = None
        self.retry_after: float | None = None
        self.bytes_sent = 0
        self.ended: float | None = None
        self.outcome: RequestOutcome = "running"


class ConnLog:
    """The live, mutable entry of one connection."""

    __slots__ = (
        "closed",
        "closed_by",
        "fault",
        "how",
        "id",
        "journal",
        "opened",
        "peer",
        "requests",
        "total",
    )

    def __init__(self, journal: Journal, id: int, peer: str, opened: float, cap: int) -> None:
        self.journal = journal
        self.id = id
        self.peer = peer
        self.opened = opened
        self.closed: float | None = None
        self.closed_by: str | None = None
        self.how: str | None = None
        self.fault: str | None = None
        self.requests: deque[RequestLog] = deque(maxlen=cap)
        self.total = 0

    def request(self, method: str, path: str) -> RequestLog:
        """Start the entry of a new request on this connection."""
        self.total += 1
        log = RequestLog(self.total, method, path, self.journal.now())
        with self.journal.lock:
            self.requests.append(log)
        return log

    def end_request(self, log: RequestLog, outcome: RequestOutcome) -> None:
        if log.ended is None:
            log.ended = self.journal.now()
            log.outcome = outcome

    def close(self, by: str, how: str) -> None:
        """Record the end of the connection; the first call wins."""
        if self.closed is None:
            self.closed = self.journal.now()
            self.closed_by = by
            self.how = how


class Journal:
    """Bounded, thread-safe record of connections and their requests."""

    def __init__(self, connections: int = 10_000, per_connection: int = 256) -> None:
        self.lock = threading.Lock()
        self._t0 = time.monotonic()
        self._per_connection = per_connection
        self._conns: deque[ConnLog] = deque(maxlen=connections)
        self._next = 0

    def now(self) -> float:
        """Seconds since the server started."""
        return time.monotonic() - self._t0

    def open(self, peer: str) -> ConnLog:
        with self.lock:
            self._next += 1
            log = ConnLog(self, self._next, peer, self.now(), self._per_connection)
            self._conns.append(log)
        return log

    def clear(self) -> None:
        """Forget closed connections, and the past requests of open ones."""
        with self.lock:
            live = [c for c in self._conns if c.closed is None]
            self._conns.clear()
            for conn in live:
                conn.requests.clear()
                self._conns.append(conn)

    def snapshot(
        self,
        *,
        key: str | None = None,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[ConnectionRecord, ...]:
        """Frozen records of the connections, oldest first; filtered, only those with a
        request that matches every filter given (and only those requests)."""
        filtered = key is not None or request_id is not None or idempotency_key is not None
        out = []
        with self.lock:
            conns = [(c, list(c.requests)) for c in self._conns]
        for conn, logs in conns:
            requests = tuple(_freeze(conn.id, r) for r in logs)
            if filtered:
                requests = tuple(
                    r
                    for r in requests
                    if (key is None or r.key == key)
                    and (request_id is None or r.request_id == request_id)
                    and (idempotency_key is None or r.idempotency_key == idempotency_key)
                )
                if not requests:
                    continue
            out.append(
                ConnectionRecord(
                    conn.id,
                    conn.peer,
                    conn.opened,
                    conn.closed,
                    conn.closed_by,
                    conn.how,
                    requests,
                    conn.total,
                    conn.fault,
                )
            )
        return tuple(out)


def requests_of(records: Iterable[ConnectionRecord]) -> list[RequestRecord]:
    """Every request of ``records``, in the order they started."""
    return sorted((r for c in records for r in c.requests), key=lambda r: r.started)


def _freeze(connection: int, log: RequestLog) -> RequestRecord:
    return RequestRecord(
        connection=connection,
        index=log.index,
        method=log.method,
        path=log.path,
        fault=log.fault,
        source=log.source,
        key=log.key,
        request_id=log.request_id,
        idempotency_key=log.idempotency_key,
        started=log.started,
        status=log.status,
        retry_after=log.retry_after,
        bytes_sent=log.bytes_sent,
        ended=log.ended,
        outcome=log.outcome,
    )
