"""The journal: what each connection did, request by request, for tests to read.

The server writes it on its event loop as things happen (a connection opens, a request head
is read, a status goes out, the client leaves...) and tests read frozen snapshots of it from
any thread: `journal()` returns `ConnectionRecord`s, and `verdict()` (in `_verdict`) judges
the client from them. One lock guards the containers; the live entries are small slotted
objects whose fields are plain assignments.

It is bounded, and the oldest entries go first: at most `JournalLimits.requests` requests
(100,000 by default), `JournalLimits.connections` connections (10,000) and
`JournalLimits.bytes` (128 MiB) of charged memory, entries and their text included (a
request is charged about 1 KiB, plus its strings and indexed values; see `REQUEST_COST`; a
test measures that the charge covers what the entries really take).

It is indexed: the requests of a key, an ``x-request-id`` or an ``Idempotency-Key`` are
found without a scan, so a filtered query or a verdict costs O(matching requests), whatever
the journal holds; an unfiltered query is paged (`Journal.page`). `Journal.forget` drops a
key's requests at once.

Times are seconds since the server started (`time.monotonic` based).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any, Literal

__all__ = [
    "CONNECTION_COST",
    "INDEX_COST",
    "REQUEST_COST",
    "TEXT_COST",
    "ConnectionRecord",
    "ConnLog",
    "Journal",
    "JournalLimits",
    "RequestOutcome",
    "RequestLog",
    "RequestRecord",
]

# What an entry is charged, measured with tracemalloc on CPython 3.11 and rounded up: the
# slotted entry with its floats and its places in the containers; each string, its length
# plus `TEXT_COST`; each indexed value (key, x-request-id, Idempotency-Key) `INDEX_COST` more,
# what a value of its own costs in the index. Real use stays below the charge (a test checks).
REQUEST_COST = 500
CONNECTION_COST = 600
TEXT_COST = 50
INDEX_COST = 350
_FILTERS = ("key", "request_id", "idempotency_key")
# Entries dropped per hold of the lock by `Journal.clear` and `Journal.forget`: ~1 ms each.
_BATCH = 500

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
        # by hand: dataclasses.asdict deep-copies, several times slower for a journal page.
        return {name: getattr(self, name) for name in _REQUEST_FIELDS}


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
        requests: its requests still in the journal (all of them, or those of one page or
            filter), oldest first.
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
        out = {name: getattr(self, name) for name in _CONNECTION_FIELDS}
        out["requests"] = [r.as_dict() for r in self.requests]
        return out


_REQUEST_FIELDS = tuple(f.name for f in fields(RequestRecord))
_CONNECTION_FIELDS = tuple(f.name for f in fields(ConnectionRecord))


@dataclass(frozen=True, slots=True)
class JournalLimits:
    """How much the journal keeps; past any of them, the oldest entries are dropped.

    Attributes:
        requests: most requests kept.
        connections: most connections kept (with their requests).
        bytes: most estimated bytes (see `REQUEST_COST`, `CONNECTION_COST`).
    """

    requests: int = 100_000
    connections: int = 10_000
    bytes: int = 128 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("requests", "connections", "bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"journal limit {name!r} must be an integer >= 1, got {value!r}")


class RequestLog:
    """The live, mutable entry of one request; `Journal.snapshot` freezes it.

    ``key``, ``request_id`` and ``idempotency_key`` are indexed, and they and ``path`` and
    ``fault`` are charged to the journal's byte budget: assigning them updates both.
    """

    __slots__ = (
        "_fault",
        "_idempotency_key",
        "_key",
        "_path",
        "_request_id",
        "bytes_sent",
        "conn",
        "cost",
        "ended",
        "index",
        "method",
        "outcome",
        "retry_after",
        "seq",
        "source",
        "started",
        "status",
    )

    def __init__(self, conn: ConnLog, seq: int, index: int, method: str, path: str) -> None:
        self.conn = conn
        self.seq = seq  # its place in the whole journal; 0 when not journaled.
        self.index = index
        self.method = method
        self._path = path
        self.started = conn.journal.now()
        self._fault = "healthy"
        self.source = "default"
        self._key: str | None = None
        self._request_id: str | None = None
        self._idempotency_key: str | None = None
        self.status: int | None = None
        self.retry_after: float | None = None
        self.bytes_sent = 0
        self.ended: float | None = None
        self.outcome: RequestOutcome = "running"
        self.cost = REQUEST_COST + 3 * TEXT_COST + len(method) + len(path) + len(self._fault)

    @property
    def path(self) -> str:
        return self._path

    @path.setter
    def path(self, value: str) -> None:
        self.conn.journal.recharge(self, len(value) - len(self._path))
        self._path = value

    @property
    def fault(self) -> str:
        return self._fault

    @fault.setter
    def fault(self, value: str) -> None:
        self.conn.journal.recharge(self, len(value) - len(self._fault))
        self._fault = value

    @property
    def key(self) -> str | None:
        return self._key

    @key.setter
    def key(self, value: str | None) -> None:
        self.conn.journal.reindex(self, "key", self._key, value)
        self._key = value

    @property
    def request_id(self) -> str | None:
        return self._request_id

    @request_id.setter
    def request_id(self, value: str | None) -> None:
        self.conn.journal.reindex(self, "request_id", self._request_id, value)
        self._request_id = value

    @property
    def idempotency_key(self) -> str | None:
        return self._idempotency_key

    @idempotency_key.setter
    def idempotency_key(self, value: str | None) -> None:
        self.conn.journal.reindex(self, "idempotency_key", self._idempotency_key, value)
        self._idempotency_key = value

    def value(self, name: str) -> str | None:
        """The indexed field ``name``: ``key``, ``request_id`` or ``idempotency_key``."""
        value: str | None = getattr(self, name)
        return value


class ConnLog:
    """The live, mutable entry of one connection."""

    __slots__ = (
        "closed",
        "closed_by",
        "dropped",
        "fault",
        "how",
        "id",
        "journal",
        "opened",
        "peer",
        "requests",
        "total",
    )

    def __init__(self, journal: Journal, id: int, peer: str, opened: float) -> None:
        self.journal = journal
        self.id = id
        self.peer = peer
        self.opened = opened
        self.closed: float | None = None
        self.closed_by: str | None = None
        self.how: str | None = None
        self.fault: str | None = None
        self.requests: dict[int, RequestLog] = {}  # by index, oldest first.
        self.total = 0
        self.dropped = False  # evicted from the journal: its next requests are not kept.

    def request(self, method: str, path: str) -> RequestLog:
        """Start the entry of a new request on this connection."""
        self.total += 1
        return self.journal.add_request(self, method, path)

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


Filters = dict[str, str]


class Journal:
    """Bounded, indexed, thread-safe record of connections and their requests."""

    def __init__(self, limits: JournalLimits | None = None) -> None:
        self.lock = threading.Lock()
        self.limits = limits or JournalLimits()
        self._t0 = time.monotonic()
        self._conns: OrderedDict[int, ConnLog] = OrderedDict()
        self._requests: OrderedDict[int, RequestLog] = OrderedDict()  # by seq, oldest first.
        self._index: dict[tuple[str, str], dict[int, RequestLog]] = {}
        self._next_conn = 0
        self._next_seq = 0
        self._bytes = 0

    def now(self) -> float:
        """Seconds since the server started."""
        return time.monotonic() - self._t0

    @property
    def size(self) -> tuple[int, int, int]:
        """(connections, requests, estimated bytes) held now."""
        with self.lock:
            return len(self._conns), len(self._requests), self._bytes

    # -- writing (the server's loop) ----------------------------------------------------

    def open(self, peer: str) -> ConnLog:
        with self.lock:
            self._next_conn += 1
            log = ConnLog(self, self._next_conn, peer, self.now())
            self._conns[log.id] = log
            self._bytes += CONNECTION_COST + TEXT_COST + len(peer)
            self._trim()
        return log

    def add_request(self, conn: ConnLog, method: str, path: str) -> RequestLog:
        with self.lock:
            if conn.dropped:
                return RequestLog(conn, 0, conn.total, method, path)
            self._next_seq += 1
            log = RequestLog(conn, self._next_seq, conn.total, method, path)
            conn.requests[log.index] = log
            self._requests[log.seq] = log
            self._bytes += log.cost
            self._trim()
        return log

    def recharge(self, log: RequestLog, delta: int) -> None:
        with self.lock:
            log.cost += delta
            if log.seq in self._requests:
                self._bytes += delta
                self._trim()

    def reindex(self, log: RequestLog, name: str, old: str | None, new: str | None) -> None:
        if old == new:  # most requests carry no x-request-id, no Idempotency-Key.
            return
        with self.lock:
            delta = _indexed_cost(new) - _indexed_cost(old)
            log.cost += delta
            if log.seq not in self._requests:
                return
            if old is not None:
                self._unindex(log.seq, (name, old))
            if new is not None:
                self._index.setdefault((name, new), {})[log.seq] = log
            self._bytes += delta
            self._trim()

    def _unindex(self, seq: int, entry: tuple[str, str]) -> None:
        bucket = self._index.get(entry)
        if bucket is not None:
            bucket.pop(seq, None)
            if not bucket:
                del self._index[entry]

    def _drop_request(self, log: RequestLog) -> None:
        """Forget one request (the lock is held)."""
        if self._requests.pop(log.seq, None) is None:
            return
        conn = log.conn
        conn.requests.pop(log.index, None)
        if not conn.requests:
            conn.requests = {}  # a dict keeps its table when emptied: let it go.
        for name in _FILTERS:
            value = log.value(name)
            if value is not None:
                self._unindex(log.seq, (name, value))
        self._bytes -= log.cost

    def _drop_connection(self, conn: ConnLog) -> None:
        for log in list(conn.requests.values()):
            self._drop_request(log)
        del self._conns[conn.id]
        conn.dropped = True
        self._bytes -= CONNECTION_COST + TEXT_COST + len(conn.peer)

    def _trim(self) -> None:
        """Drop the oldest entries until every limit holds (the lock is held)."""
        limits = self.limits
        while len(self._conns) > limits.connections:
            self._drop_connection(next(iter(self._conns.values())))
        while len(self._requests) > limits.requests or (
            self._bytes > limits.bytes and self._requests
        ):
            oldest = next(iter(self._requests.values()))
            self._drop_request(oldest)
            conn = oldest.conn
            if conn.closed is not None and not conn.requests and not conn.dropped:
                self._drop_connection(conn)  # closed, and all its requests are gone.
        while self._bytes > limits.bytes and len(self._conns) > 1:
            self._drop_connection(next(iter(self._conns.values())))

    def clear(self) -> None:
        """Forget closed connections, and the past requests of open ones.

        In batches of `_BATCH` entries, the lock released between them, so that the
        server's loop (which writes under it) never waits for the whole of it."""
        with self.lock:
            logs = list(self._requests.values())
        for start in range(0, len(logs), _BATCH):
            with self.lock:
                for log in logs[start : start + _BATCH]:
                    self._drop_request(log)
        with self.lock:
            conns = list(self._conns.values())
        for start in range(0, len(conns), _BATCH):
            with self.lock:
                for conn in conns[start : start + _BATCH]:
                    if conn.closed is None:
                        for log in list(conn.requests.values()):  # started since.
                            self._drop_request(log)
                    elif not conn.dropped:
                        self._drop_connection(conn)

    def forget(self, key: str) -> int:
        """Drop every request of ``key``, and the closed connections left without one;
        returns how many requests. In batches, as `clear`."""
        with self.lock:
            logs = list(self._index.get(("key", key), {}).values())
        dropped = 0
        for start in range(0, len(logs), _BATCH):
            with self.lock:
                for log in logs[start : start + _BATCH]:
                    if log.seq in self._requests and log.key == key:
                        self._drop_request(log)
                        dropped += 1
        with self.lock:
            for conn in {log.conn.id: log.conn for log in logs}.values():
                if conn.closed is not None and not conn.requests and not conn.dropped:
                    self._drop_connection(conn)
        return dropped

    # -- reading (any thread) -----------------------------------------------------------

    def snapshot(
        self,
        *,
        key: str | None = None,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[ConnectionRecord, ...]:
        """Frozen records of the connections, oldest first; filtered, only those with a
        request that matches every filter given (and only those requests). Filtered, it
        costs O(matching requests); unfiltered, O(everything)."""
        filters = _filters(key, request_id, idempotency_key)
        records, _ = self.page(filters, None, None)
        return records

    def page(
        self, filters: Filters, after: tuple[int, int] | None, limit: int | None
    ) -> tuple[tuple[ConnectionRecord, ...], tuple[int, int] | None]:
        """Up to ``limit`` requests (None: all) past the cursor ``after`` (a connection id
        and a request index), grouped by connection; and the cursor of the next page, or
        None at the end. Connections without a request in the journal come in unfiltered
        pages, each counted as one request.

        The lock is held only to copy references (a filtered query: the smallest index's
        bucket; an unfiltered one: the page's own entries), never to freeze or match them:
        the server's loop writes under it."""
        if filters:
            with self.lock:
                candidates = list(self._smallest(filters))
            groups = _grouped(candidates, filters)
            chosen, cursor = _take_page(groups, after, limit)
        else:
            with self.lock:
                groups = [(conn, conn.requests) for conn in self._conns.values()]
                chosen, cursor = _take_page(groups, after, limit)
        frozen = []
        for i, (conn, logs) in enumerate(chosen):
            frozen.append(_freeze_connection(conn, logs))
            if i % 64 == 63:
                time.sleep(0)  # off the loop, let it take the GIL at once (`_control_worker`).
        return tuple(frozen), cursor

    def _smallest(self, filters: Filters) -> Iterable[RequestLog]:
        """The requests of the smallest index bucket among ``filters`` (the lock is held)."""
        buckets = [self._index.get((name, value), {}) for name, value in filters.items()]
        return min(buckets, key=len).values()


def _grouped(
    candidates: list[RequestLog], filters: Filters
) -> list[tuple[ConnLog, dict[int, RequestLog]]]:
    """The connections of the ``candidates`` that match every filter, each with only those
    requests, in connection order."""
    grouped: dict[int, tuple[ConnLog, dict[int, RequestLog]]] = {}
    for log in candidates:
        if all(log.value(name) == value for name, value in filters.items()):
            grouped.setdefault(log.conn.id, (log.conn, {}))[1][log.index] = log
    return [grouped[conn_id] for conn_id in sorted(grouped)]


def _take_page(
    conns: Iterable[tuple[ConnLog, dict[int, RequestLog]]],
    after: tuple[int, int] | None,
    limit: int | None,
) -> tuple[list[tuple[ConnLog, list[RequestLog]]], tuple[int, int] | None]:
    """The connections and requests of one page, and the next page's cursor (or None).

    A connection without a request counts as one; a page ends within a connection when
    that connection has more requests than the page has room for.
    """
    out: list[tuple[ConnLog, list[RequestLog]]] = []
    taken = 0
    cursor: tuple[int, int] | None = None
    for conn, requests in conns:
        if after is not None and conn.id < after[0]:
            continue
        logs = list(requests.values())
        if after is not None and conn.id == after[0]:
            logs = [log for log in logs if log.index > after[1]]
            if not logs:
                continue
        if limit is not None:
            if taken >= limit:
                return out, cursor
            logs = logs[: limit - taken]
        taken += max(1, len(logs))
        out.append((conn, logs))
        cursor = (conn.id, logs[-1].index if logs else 0)
    return out, None


def _indexed_cost(value: str | None) -> int:
    return 0 if value is None else len(value) + TEXT_COST + INDEX_COST


def _filters(key: str | None, request_id: str | None, idempotency_key: str | None) -> Filters:
    given = {"key": key, "request_id": request_id, "idempotency_key": idempotency_key}
    return {name: value for name, value in given.items() if value is not None}


def requests_of(records: Iterable[ConnectionRecord]) -> list[RequestRecord]:
    """Every request of ``records``, in the order they started."""
    return sorted((r for c in records for r in c.requests), key=lambda r: r.started)


def _freeze_connection(conn: ConnLog, logs: list[RequestLog]) -> ConnectionRecord:
    return ConnectionRecord(
        conn.id,
        conn.peer,
        conn.opened,
        conn.closed,
        conn.closed_by,
        conn.how,
        tuple(_freeze(conn.id, log) for log in logs),
        conn.total,
        conn.fault,
    )


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
