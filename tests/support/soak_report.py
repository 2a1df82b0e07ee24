"""How a chaos soak's calls ended (see `tests.support.soak`): each outcome classified, the
event loop's own lag beside them, what was left behind, and the table.

Lateness is read against the loop as well: a call that ends late while the loop itself was
held up (a busy machine, a garbage collection, another thread holding the GIL) is late by
the loop's lag, which no bound can preempt. A call late by more than all the lag the loop
showed between its deadline and its end is late by stallproof (`Report.late_beyond_lag`);
one late by more than the loop's longest single stall there is too, unless every turn of
the loop was slow (`Report.late_beyond_stall`).
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import anthropic
import anyio
import openai

import stallproof

from .soak_plan import Plan, Settings

__all__ = [
    "CANCELLED",
    "HANG",
    "OUTCOMES",
    "SUCCESS",
    "TYPED",
    "UNTYPED",
    "GcPauses",
    "Leaks",
    "LoopLag",
    "Report",
    "Result",
    "by_total",
    "classify",
    "fd_census",
]

SUCCESS, TYPED, CANCELLED, UNTYPED, HANG = "success", "typed", "cancelled", "untyped", "hang"
OUTCOMES = (SUCCESS, TYPED, CANCELLED, UNTYPED, HANG)


def classify(error: BaseException) -> tuple[str, str]:
    """(`TYPED` or `UNTYPED`, a name for the error: its class / the stallproof cause)."""
    name = type(error).__name__
    if isinstance(error, stallproof.StallproofError):
        return TYPED, name
    if isinstance(error, (openai.APIError, anthropic.APIError)):
        cause = error.__cause__
        named = type(cause).__name__ if isinstance(cause, stallproof.StallproofError) else ""
        return TYPED, f"{type(error).__module__.split('.')[0]}.{name}/{named}"
    return UNTYPED, f"{type(error).__module__}.{type(error).__qualname__}: {error!r:.300}"


def by_total(error: BaseException) -> bool:
    """Whether the call ended by its total (so its overshoot is the total's)."""
    named = error if isinstance(error, stallproof.StallproofError) else error.__cause__
    return isinstance(named, stallproof.TotalTimeout)


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """How one call ended: its outcome, the error's name, and when (``time.monotonic``)."""

    plan: Plan
    outcome: str
    detail: str
    start: float
    end: float
    by_deadline: bool  # ended by its total or its cancellation

    @property
    def elapsed(self) -> float:
        return self.end - self.start

    @property
    def overshoot(self) -> float:
        """Seconds past its deadline (negative: before it)."""
        return self.elapsed - self.plan.deadline


class LoopLag:
    """The event loop's own lag through the run: a task sleeps `TICK` again and again and
    notes how much longer each sleep took. Calls share the loop with it, so what held it
    up held them up too."""

    TICK = 0.005

    def __init__(self) -> None:
        self.ends: list[float] = []  # when each tick ended (increasing)
        self.lags: list[float] = []  # how late it ended

    async def run(self, now: Callable[[], float]) -> None:
        while True:
            before = now()
            await anyio.sleep(self.TICK)
            after = now()
            self.ends.append(after)
            self.lags.append(max(0.0, after - before - self.TICK))

    def held_up(self, start: float, end: float) -> float:
        """How long the loop was held up between ``start`` and ``end``: the lags of the
        ticks that ended in that span (and of the one after, which a call's own last turns
        may have delayed). A loop busy with other calls is late on every turn; a call that
        needs a few turns to end after its deadline is late by their sum."""
        return sum(self._span(start, end))

    def worst(self, start: float, end: float) -> float:
        """The loop's longest single stall between ``start`` and ``end`` (a garbage
        collection, another thread holding the GIL): what delayed the call's timer."""
        return max(self._span(start, end), default=0.0)

    def _span(self, start: float, end: float) -> list[float]:
        i = bisect.bisect_left(self.ends, start)
        j = bisect.bisect_right(self.ends, end) + 1
        return self.lags[i:j]

    def percentile(self, q: float) -> float:
        return _percentile(self.lags, q)


class GcPauses:
    """The garbage collector's pauses while the soak runs (``gc.callbacks``): a full
    collection holds every thread, so it shows in the loop's lag."""

    def __init__(self) -> None:
        self.pauses: list[float] = []
        self.full: list[float] = []  # the pauses of full (generation 2) collections
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        pause = time.perf_counter() - self._began
        self.pauses.append(pause)
        if info.get("generation") == 2:
            self.full.append(pause)

    def describe(self) -> str:
        return (
            f"garbage collections: {len(self.pauses)}, {_ms(sum(self.pauses))} in all; "
            f"{len(self.full)} full, longest {_ms(max(self.full, default=0.0))}"
        )

    @contextmanager
    def watching(self) -> Iterator[GcPauses]:
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)


# -- leaks ------------------------------------------------------------------------------------


def _socket_ports() -> dict[str, int]:
    """Socket inode -> its local port, for every TCP socket of the machine."""
    ports: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            ports[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    return ports


def fd_census(server_ports: frozenset[int]) -> Counter[str]:
    """This process's open file descriptors by kind, leaving out the sockets of an
    in-process fault server (local port one of ``server_ports``): they close on its own
    schedule, when each fault's hold runs out."""
    ports = _socket_ports()
    census: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the directory's own fd, closed since
        if link.startswith("socket:["):
            port = ports.get(link[8:-1])
            if port in server_ports:
                continue
            census["tcp socket" if port is not None else "other socket"] += 1
        else:
            census[link.split(":", 1)[0] if ":" in link else "file"] += 1
    return census


@dataclasses.dataclass(frozen=True, slots=True)
class Leaks:
    """What the run left behind: held pool slots and pacer permits per client (clients
    open), then file descriptors and asyncio tasks (clients closed), against before; and
    the exceptions raised where nobody could catch them (finalisers, callbacks)."""

    pools: Mapping[str, str]  # client -> its pool stats, where something is held
    permits: Mapping[str, str]  # client -> its pacer state, where a permit is held
    fds: Mapping[str, int]  # fd kind -> how many more than before
    tasks: int  # asyncio tasks more than before
    unraisable: Sequence[str]

    def problems(self) -> list[str]:
        out = [f"pool of {k} holds {v}" for k, v in self.pools.items()]
        out += [f"pacer of {k} holds {v}" for k, v in self.permits.items()]
        out += [f"{n} more fds of kind {k!r}" for k, n in self.fds.items() if n > 0]
        if self.tasks > 0:
            out.append(f"{self.tasks} asyncio tasks left")
        out += [f"unraisable: {u}" for u in self.unraisable]
        return out


# -- the report -------------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclasses.dataclass(frozen=True, slots=True)
class Report:
    """A run's results and leaks, with the counts the tests assert and the table printed."""

    settings: Settings
    backend: str
    results: Sequence[Result]
    leaks: Leaks
    lag: LoopLag
    gc: GcPauses
    wall: float
    not_run: int  # calls never started (the run's limit came first)

    def count(self, outcome: str) -> int:
        return sum(r.outcome == outcome for r in self.results)

    def late(self, after: float) -> list[Result]:
        """Calls that ended more than ``after`` seconds past their deadline."""
        return [r for r in self.results if r.outcome != HANG and r.overshoot > after]

    def lag_at(self, result: Result) -> float:
        """How long the loop was held up between the call's deadline and its end."""
        return self.lag.held_up(result.start + result.plan.deadline, result.end)

    def late_beyond_lag(self, after: float) -> list[Result]:
        """Calls that ended more than ``after`` seconds past their deadline *and* past all
        the loop was held up around it: late by stallproof, not by the machine."""
        return [r for r in self.late(after) if r.overshoot > after + self.lag_at(r)]

    def late_beyond_stall(self, after: float) -> list[Result]:
        """Calls that ended more than ``after`` past their deadline and past the loop's
        longest single stall around it: on a loop that is not saturated, late by
        stallproof; on a saturated one (every turn slow), some are late by the machine."""
        return [
            r
            for r in self.late(after)
            if r.overshoot > after + self.lag.worst(r.start + r.plan.deadline, r.end)
        ]

    def failures(
        self, *, late_after: float, late_share: float, beyond_lag: float, against_loop: bool
    ) -> list[str]:
        """What fails the soak: hangs, untyped errors, leaks, calls not run; any call over
        ``beyond_lag`` past its deadline and all the loop's lag around it; and more than
        ``late_share`` of the calls over ``late_after`` past their deadline (``against_loop``:
        and past the loop's longest stall around it)."""
        out = [f"HANG {r.plan}: {r.detail}" for r in self.results if r.outcome == HANG]
        out += [f"UNTYPED {r.plan}: {r.detail}" for r in self.results if r.outcome == UNTYPED]
        out += [f"LEAK {p}" for p in self.leaks.problems()]
        if self.not_run:
            out.append(f"{self.not_run} calls not run within the run's limit")
        out += [f"LATE BEYOND LAG {self._late(r)}" for r in self.late_beyond_lag(beyond_lag)]
        late = self.late_beyond_stall(late_after) if against_loop else self.late(late_after)
        if len(late) > late_share * len(self.results):
            stall = " and the loop's longest stall" if against_loop else ""
            out.append(
                f"LATE: {len(late)} calls ({len(late) / len(self.results):.2%}) over "
                f"{late_after * 1000:.0f} ms past their deadline{stall}, more than {late_share:.1%}"
            )
            out += [f"LATE {self._late(r)}" for r in sorted(late, key=lambda r: -r.overshoot)]
        return out

    def _late(self, r: Result) -> str:
        stall = self.lag.worst(r.start + r.plan.deadline, r.end)
        return (
            f"by {r.overshoot:.3f}s (loop lag {self.lag_at(r):.3f}s, longest stall "
            f"{stall:.3f}s) {r.plan}: "
            f"{r.outcome} {r.detail}"
        )

    def summary(self) -> str:
        s = self.settings
        return (
            f"seed {s.seed} on {self.backend}: {len(self.results)} calls "
            f"({', '.join(s.faces)}), {s.concurrency} at once, totals "
            f"{s.totals[0]:g}-{s.totals[1]:g}s, {s.cancel:.0%} cancelled, {self.wall:.1f}s"
        )

    def table(self) -> str:
        """Outcomes per face, lateness, overshoot percentiles, the loop's lag and leaks."""
        faces = [f for f in self.settings.faces if any(r.plan.face == f for r in self.results)]
        groups = [[r for r in self.results if r.plan.face == f] for f in faces]
        groups.append(list(self.results))
        header = ["", *faces, "all"]
        rows: list[list[str]] = [["calls", *(str(len(g)) for g in groups)]]
        for outcome in OUTCOMES:
            rows.append([outcome, *(str(sum(r.outcome == outcome for r in g)) for g in groups)])
        for after in (0.1, 0.3):
            rows.append([f"late > {after * 1000:.0f} ms", *(_share(g, after) for g in groups)])
        beyond = [
            str(sum(r.outcome != HANG and r.overshoot > 0.1 + self.lag_at(r) for r in g))
            for g in groups
        ]
        rows.append(["late > 100 ms + loop lag", *beyond])
        stalled = {id(r) for r in self.late_beyond_stall(0.1)}
        rows.append(
            [
                "late > 100 ms + longest stall",
                *(str(sum(id(r) in stalled for r in g)) for g in groups),
            ]
        )
        for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
            rows.append(
                [
                    f"overshoot {name}",
                    *(
                        _ms(_percentile([r.overshoot for r in g if r.by_deadline], q))
                        for g in groups
                    ),
                ]
            )
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        lines = [
            "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
            for row in [header, *rows]
        ]
        leaks = "; ".join(self.leaks.problems()) or "none (pool slots, pacer permits, fds, tasks)"
        lines += [
            "overshoot: past the deadline (total, or the cancellation) of the calls it ended",
            f"loop lag (a {LoopLag.TICK * 1000:.0f} ms sleep's lateness): p50 "
            f"{_ms(self.lag.percentile(0.5))}, p99 {_ms(self.lag.percentile(0.99))}, max "
            f"{_ms(self.lag.percentile(1.0))}",
            self.gc.describe(),
            f"leaks: {leaks}",
        ]
        return "\n".join(lines)


def _share(group: Sequence[Result], after: float) -> str:
    if not group:
        return "-"
    late = sum(r.outcome != HANG and r.overshoot > after for r in group)
    return f"{late} ({late / len(group):.2%})"


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1000:.0f} ms"
