"""Where is it stuck? The live view of every call in flight.

Each `Client` keeps a registry of its running calls. ``client.inflight()`` returns a frozen
record per call: its phase (from httpcore's trace extension, not guessed), how long it
has been there, which attempt it is on, what it has received, how long since it last made
progress, how much of its deadline is left, and whether it is **stalled** (no progress for
longer than a threshold while its deadline has not yet fired: stuck, not slow).

Progress means: a phase change (connected, request sent, headers received), a content
chunk of a stream, or body bytes of a non-stream answer. SSE comments, pings and empty
deltas are not progress.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import signal
import socket
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import FrameType, MappingProxyType
from typing import IO, Any, Protocol, TypeVar

from ._exceptions import InvalidRequestError

__all__ = ["InflightCall", "current_tags", "dump_on_signal", "format_inflight", "tag"]

#: Phases in the order a call passes through them.


class HasInflight(Protocol):
    """Anything with an in-flight view: `Client`, a face, a transport."""

    def inflight(self, *, stalled_after: float = ...) -> tuple[InflightCall, ...]: ...


PHASES = (
    "pacer queue",
    "pool wait",
    "connecting",
    "tls handshake",
    "sending",
    "awaiting headers",
    "receiving body",
    "streaming",
    "retry wait",
)


@dataclasses.dataclass(frozen=True, slots=True)
class InflightCall:
    """One call in progress, as `Client.inflight` saw it."""

    request_id: str
    server_request_id: str | None
    agent: str | None
    labels: Mapping[str, str]
    model: str
    stream: bool
    phase: str
    time_in_phase: float
    attempt: int
    max_attempts: int
    bytes_received: int
    content_chunks: int
    since_progress: float
    elapsed: float
    deadline_left: float
    stalled: bool
    #: Where the call's fleet limits and circuit came from: "redis", or "local (why)" when
    #: Redis did not answer in time (docs/fleet.md); None without shared state.
    shared: str | None = None
    #: The process the call runs in (`stallproof top` shows calls of many processes).
    pid: int = dataclasses.field(default_factory=os.getpid)
    #: The host of that process, when the record came from another one (`stallproof top`);
    #: None for the calls of this process.
    host: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The record as JSON-ready values: what `stallproof top --json` prints per call.

        Durations are seconds with an ``_s`` suffix (``since_progress_s``, ``left_s``...),
        rounded to the millisecond; ``host`` is this host's name for this process's calls.
        """
        return {
            "host": self.host if self.host is not None else HOST,
            "pid": self.pid,
            "request_id": self.request_id,
            "server_request_id": self.server_request_id,
            "agent": self.agent,
            "labels": dict(self.labels),
            "model": self.model,
            "stream": self.stream,
            "phase": self.phase,
            "time_in_phase_s": round(self.time_in_phase, 3),
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "bytes_received": self.bytes_received,
            "content_chunks": self.content_chunks,
            "since_progress_s": round(self.since_progress, 3),
            "elapsed_s": round(self.elapsed, 3),
            "left_s": round(self.deadline_left, 3),
            "stalled": self.stalled,
            "shared": self.shared,
        }

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> InflightCall:
        """The record `as_json` made (in another process), checked field by field.

        Raises:
            ValueError: a field is missing or of the wrong type.
        """
        try:
            labels = row["labels"]
            if not isinstance(labels, dict):
                raise TypeError("labels")
            return cls(
                request_id=_typed(row["request_id"], str),
                server_request_id=_optional(row["server_request_id"], str),
                agent=_optional(row["agent"], str),
                labels=MappingProxyType({str(k): str(v) for k, v in labels.items()}),
                model=_typed(row["model"], str),
                stream=_typed(row["stream"], bool),
                phase=_typed(row["phase"], str),
                time_in_phase=_number(row["time_in_phase_s"]),
                attempt=_typed(row["attempt"], int),
                max_attempts=_typed(row["max_attempts"], int),
                bytes_received=_typed(row["bytes_received"], int),
                content_chunks=_typed(row["content_chunks"], int),
                since_progress=_number(row["since_progress_s"]),
                elapsed=_number(row["elapsed_s"]),
                deadline_left=_number(row["left_s"]),
                stalled=_typed(row["stalled"], bool),
                shared=_optional(row["shared"], str),
                pid=_typed(row["pid"], int),
                host=_typed(row["host"], str),
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not an in-flight record: bad or missing {e}") from None


#: This host's name, on the records of this process's calls in other processes' views.
HOST = socket.gethostname()

T = TypeVar("T")


def _typed(value: object, kind: type[T]) -> T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(repr(value)[:40])
    return value


def _optional(value: object, kind: type[T]) -> T | None:
    return None if value is None else _typed(value, kind)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(repr(value)[:40])
    return float(value)


_TAGS: contextvars.ContextVar[tuple[str | None, Mapping[str, str]]] = contextvars.ContextVar(
    "stallproof_tags", default=(None, MappingProxyType({}))
)


@contextlib.contextmanager
def tag(agent: str | None = None, **labels: str) -> Iterator[None]:
    """Tag every call made inside the block with an agent name and labels.

    Tags nest: inner labels add to outer ones and an inner agent replaces the outer one.
    ``create(..., agent=..., labels=...)`` wins over both. Tags appear on errors' ids, in
    spans, log lines and ``client.inflight()``.

    Example:
        >>> with stallproof.tag(agent="planner", round="3"):
        ...     await client.chat.completions.create(...)
    """
    outer_agent, outer_labels = _TAGS.get()
    merged = MappingProxyType({**outer_labels, **{k: str(v) for k, v in labels.items()}})
    token = _TAGS.set((agent if agent is not None else outer_agent, merged))
    try:
        yield
    finally:
        _TAGS.reset(token)


def current_tags() -> tuple[str | None, Mapping[str, str]]:
    """The agent and labels that `tag` blocks around this point set."""
    return _TAGS.get()


def format_inflight(calls: Iterable[InflightCall], *, now_label: str = "") -> str:
    """A human-readable table of in-flight calls, what needs attention first, with a phase
    summary.

    The first line counts calls by phase (``3 calls in flight (2 stalled) | awaiting
    headers 2, streaming 1``); then one row per call: request id, agent, model, phase,
    time in phase, attempt n/m, bytes, content chunks, time without progress, deadline
    left, and ``STALLED`` or ``ok``. Stalled calls come first, then the longest without
    progress, then the nearest deadline. When the calls come from more than one process
    (`stallproof top`), a first column says which: ``host:pid``. docs/debugging.md shows
    a real dump.
    """
    rows = sorted(calls, key=attention)
    head = f"{summary_line(rows)}"
    if now_label:
        head = f"{now_label}: {head}"
    lines = [head]
    if not rows:
        return lines[0]
    where = len({(c.host, c.pid) for c in rows}) > 1 or any(c.host is not None for c in rows)
    header = (
        *(("process",) if where else ()),
        "request_id",
        "agent",
        "model",
        "phase",
        "in phase",
        "attempt",
        "bytes",
        "chunks",
        "no progress",
        "left",
        "state",
    )
    table = [header]
    for c in rows:
        table.append(
            (
                *((f"{c.host or HOST}:{c.pid}",) if where else ()),
                c.request_id,
                c.agent or "-",
                c.model,
                c.phase,
                f"{c.time_in_phase:.2f}s",
                f"{c.attempt}/{c.max_attempts}",
                str(c.bytes_received),
                str(c.content_chunks),
                f"{c.since_progress:.2f}s",
                f"{c.deadline_left:.2f}s",
                "STALLED" if c.stalled else "ok",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def attention(call: InflightCall) -> tuple[bool, float, float]:
    """Sort key, what needs attention first: stalled calls, then the longest without
    progress, then the nearest deadline."""
    return (not call.stalled, -call.since_progress, call.deadline_left)


def by_phase(calls: Iterable[InflightCall]) -> dict[str, int]:
    """How many calls are in each phase, in the order a call passes through them."""
    counts = Counter(c.phase for c in calls)
    order = {p: i for i, p in enumerate(PHASES)}
    return {p: counts[p] for p in sorted(counts, key=lambda p: (order.get(p, 99), p))}


def summary_line(calls: Iterable[InflightCall]) -> str:
    """``3 calls in flight (2 stalled) | awaiting headers 2, streaming 1``."""
    rows = list(calls)
    stalled = sum(c.stalled for c in rows)
    head = f"{len(rows)} calls in flight ({stalled} stalled)"
    if not rows:
        return head
    return head + " | " + ", ".join(f"{p} {n}" for p, n in by_phase(rows).items())


def dump_on_signal(
    *clients: HasInflight,
    signum: int | None = None,
    file: IO[str] | None = None,
    stalled_after: float = 5.0,
) -> Callable[[], None]:
    """Write every client's in-flight table to ``file`` (stderr) when ``signum`` arrives.

    Opt-in, like Go's SIGQUIT goroutine dump: ``kill -USR1 <pid>`` answers "which calls
    are live, and where is each one stuck?" without stopping the process. Must be called
    from the main thread. ``signum`` defaults to SIGUSR1 (name one where there is none).
    Returns a function that restores the previous handler.
    """
    if signum is None:
        if not hasattr(signal, "SIGUSR1"):
            raise InvalidRequestError("this platform has no SIGUSR1: pass signum=")
        signum = signal.SIGUSR1

    def handler(sig: int, frame: FrameType | None) -> None:
        out = file if file is not None else sys.stderr
        for client in clients:
            out.write(
                format_inflight(
                    client.inflight(stalled_after=stalled_after), now_label=repr(client)
                )
                + "\n"
            )
        out.flush()

    previous: Any = signal.signal(signum, handler)

    def restore() -> None:
        signal.signal(signum, previous)

    return restore
