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
import signal
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import FrameType, MappingProxyType
from typing import IO, Any, Protocol

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
    """A human-readable table of in-flight calls, stalled ones first, with a phase summary.

    The first line counts calls by phase (``3 calls in flight (2 stalled) | awaiting
    headers 2, streaming 1``); then one row per call: request id, agent, model, phase,
    time in phase, attempt n/m, bytes, content chunks, time without progress, deadline
    left, and ``STALLED`` or ``ok``. docs/debugging.md shows a real dump.
    """
    rows = sorted(calls, key=lambda c: (not c.stalled, -c.since_progress))
    by_phase = Counter(c.phase for c in rows)
    order = {p: i for i, p in enumerate(PHASES)}
    summary = ", ".join(
        f"{p} {by_phase[p]}" for p in sorted(by_phase, key=lambda p: order.get(p, 99))
    )
    stalled = sum(c.stalled for c in rows)
    head = f"{len(rows)} calls in flight ({stalled} stalled)"
    if now_label:
        head = f"{now_label}: {head}"
    lines = [f"{head} | {summary}" if rows else head]
    if not rows:
        return lines[0]
    header = (
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
