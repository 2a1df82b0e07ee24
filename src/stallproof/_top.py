"""``stallproof top``: every call in flight across the fleet, live.

The calls come from the tables processes publish: through Redis
(`stallproof.publish_inflight`, read with ``--redis URL --prefix P``), or through local
Unix sockets (`stallproof.serve_inflight`: ``--socket PATH``, ``--pid PID``, or every
socket of this user's when neither Redis nor a socket is named). Each table says which
process it is (host, pid); `fetch` gathers them into one `Snapshot`, `render` draws it as
`format_inflight` does (what needs attention first, a summary line by phase), and `run`
redraws it every ``interval`` seconds until Ctrl-C.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import shutil
import sys
import time
from typing import IO, Any
from urllib.parse import urlsplit

from ._fleet import SharedStore
from ._inflight import InflightCall, attention, by_phase, format_inflight
from ._local_socket import find_sockets, read_socket, socket_dir
from ._policies import RedisState
from ._publish import read_tables
from ._registry import ProcessTable

__all__ = ["Snapshot", "Source", "fetch", "render", "run", "snapshot_json"]

_CLEAR = "\x1b[H\x1b[2J"


class SourceError(Exception):
    """The calls could not be read: Redis did not answer, no socket answered."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Where `fetch` reads the fleet's tables: Redis, the given sockets, or the sockets
    found in `socket_dir` (neither given)."""

    redis: RedisState | None = None
    sockets: tuple[str, ...] = ()
    timeout: float = 2.0

    def describe(self) -> str:
        if self.redis is not None:
            parts = urlsplit(self.redis.url)
            host = parts.netloc.rpartition("@")[2]  # never the password
            return f"{parts.scheme}://{host}{parts.path} prefix {self.redis.prefix}"
        if self.sockets:
            return "socket " + ", ".join(self.sockets)
        return f"sockets in {socket_dir()}"


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The tables read at one moment, and what could not be read."""

    source: str
    at: float  # wall-clock time of the read
    tables: tuple[ProcessTable, ...]
    #: Processes that publish (through Redis there may be more than were read).
    processes: int
    problems: tuple[str, ...] = ()

    @property
    def calls(self) -> list[InflightCall]:
        """Every call read, what needs attention first."""
        return sorted((c for t in self.tables for c in t.calls), key=attention)

    @property
    def hidden(self) -> int:
        """Calls in flight that the tables did not carry (past `MAX_ROWS` per process)."""
        return sum(t.total - len(t.calls) for t in self.tables)


async def fetch(source: Source, store: SharedStore | None = None) -> Snapshot:
    """Read every table once, each read bounded (``op_timeout`` for Redis, ``timeout``
    per socket).

    Raises:
        SourceError: Redis did not answer, or sockets were named and none answered.
    """
    at = time.time()
    if source.redis is not None:
        try:
            tables, count = await read_tables(source.redis, store=store)
        except Exception as e:  # SharedStateUnavailable, and whatever redis-py raised
            raise SourceError(f"cannot read the fleet's calls from Redis: {e}") from None
        return Snapshot(source.describe(), at, tuple(tables), count)
    paths = source.sockets or tuple(find_sockets())
    tables = []
    problems = []
    for path in paths:
        try:
            tables.append(await asyncio.to_thread(read_socket, path, timeout=source.timeout))
        except (ConnectionRefusedError, FileNotFoundError) as e:
            if source.sockets:  # named: say so; found: a process that has ended since
                problems.append(f"{path}: {type(e).__name__}: {e}")
        except (OSError, ValueError) as e:
            problems.append(f"{path}: {type(e).__name__}: {e}")
    if source.sockets and not tables:
        raise SourceError("no socket answered: " + "; ".join(problems))
    return Snapshot(source.describe(), at, tuple(tables), len(tables), tuple(problems))


def snapshot_json(snap: Snapshot) -> dict[str, Any]:
    """What ``top --once --json`` prints: the calls (one object each, what needs attention
    first; `InflightCall.as_json` plus the table's ``age_s``), the processes, counts."""
    ages: dict[tuple[str | None, int], float] = {(t.host, t.pid): t.age for t in snap.tables}
    calls = snap.calls
    return {
        "at": _iso(snap.at),
        "source": snap.source,
        "processes": [
            {"host": t.host, "pid": t.pid, "calls": t.total, "age_s": t.age} for t in snap.tables
        ],
        "calls_in_flight": len(calls) + snap.hidden,
        "stalled": sum(c.stalled for c in calls),
        "by_phase": by_phase(calls),
        "problems": list(snap.problems),
        "calls": [{**c.as_json(), "age_s": ages.get((c.host, c.pid), 0.0)} for c in calls],
    }


def render(snap: Snapshot, *, height: int | None = None) -> str:
    """The table ``top`` draws: a title, the summary line by phase, then the calls, what
    needs attention first; cut to ``height`` lines with a count of the rest."""
    stamp = datetime.datetime.fromtimestamp(snap.at).strftime("%H:%M:%S")
    procs = f"{snap.processes} process{'es' if snap.processes != 1 else ''}"
    title = f"stallproof top | {snap.source} | {procs} | {stamp}"
    body = format_inflight(snap.calls).splitlines()
    lines = [title, *body[:1]]
    if snap.hidden:
        lines.append(f"({snap.hidden} more calls not published: past 500 per process)")
    lines += [f"! {p}" for p in snap.problems]
    rows = body[1:]
    if height is not None and len(lines) + len(rows) > height:
        keep = max(2, height - len(lines) - 1)  # the header row and at least one call
        lines += [*rows[:keep], f"... {len(rows) - keep} more rows (resize, or --once)"]
    else:
        lines += rows
    return "\n".join(lines)


async def run(
    source: Source, *, interval: float, out: IO[str] = sys.stdout, frames: int | None = None
) -> None:
    """Redraw every ``interval`` seconds until cancelled (Ctrl-C) or ``frames`` are drawn.

    A terminal gets each frame over the last (ANSI clear); anything else gets frames one
    after another. A read that fails is shown in the frame; the next one tries again.
    """
    tty = out.isatty()
    store = SharedStore(source.redis) if source.redis is not None else None
    drawn = 0
    try:
        while frames is None or drawn < frames:
            started = time.monotonic()
            try:
                text = render(
                    await fetch(source, store),
                    height=shutil.get_terminal_size().lines - 1 if tty else None,
                )
            except SourceError as e:
                text = f"stallproof top | {source.describe()} | {e}"
            out.write((_CLEAR if tty else "\n") + text + "\n")
            out.flush()
            drawn += 1
            if frames is None or drawn < frames:
                await asyncio.sleep(max(0.1, interval - (time.monotonic() - started)))
    finally:
        if store is not None:
            await store.aclose()


def _iso(at: float) -> str:
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat(
        timespec="milliseconds"
    )
