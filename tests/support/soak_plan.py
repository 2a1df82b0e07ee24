"""What a chaos soak runs (see `tests.support.soak`): the fault mix, the settings, and every
call drawn up front from the seed (`draw`), so a run is replayed by its seed whatever the
scheduling."""

from __future__ import annotations

import dataclasses
import random
import sys
from collections.abc import Mapping

__all__ = [
    "BLACKHOLE",
    "CANCELS",
    "FACES",
    "FAULTS",
    "REFUSED",
    "SERVER",
    "Fault",
    "Plan",
    "Settings",
    "Targets",
    "draw",
]

FACES = ("client", "openai", "anthropic", "openai-sync")
"""`stallproof.Client`, `stallproof.openai.AsyncOpenAI`, `stallproof.anthropic.AsyncAnthropic`
and `stallproof.openai.OpenAI` (sync, called from worker threads)."""

MIB = 1024 * 1024
SERVER, BLACKHOLE, REFUSED = "server", "blackhole", "refused"


@dataclasses.dataclass(frozen=True, slots=True)
class Fault:
    """One row of the mix: its group, the ``X-Fault`` spec, its weight, where it is sent."""

    group: str
    spec: str
    weight: float
    target: str = SERVER


def _rows(group: str, weight: float, *specs: str) -> tuple[Fault, ...]:
    return tuple(Fault(group, spec, weight) for spec in specs)


# Every request-level fault of the catalogue but the tool-call ones (they need tools= in the
# request) and rate_limit (one bucket for every call); a third of the calls healthy.
FAULTS: tuple[Fault, ...] = (
    *_rows("healthy", 16, "healthy;tokens=8", "healthy;delay=0.1;token_interval=0.02;tokens=8"),
    *_rows(
        "stall",
        2,
        "half_open",
        "stall_headers",
        "stall_in_headers",
        "sse_stall;after=2",
        "slow_first_token;wait=5",
        "done_then_hold",
        "chunked_no_end",
        "content_length_lie",
    ),
    *_rows(
        "trickle",
        2,
        "trickle_headers;interval=0.2",
        "trickle_body;interval=0.2",
        "endless_body;interval=0.01",
        "endless_line;interval=0.05",
        "token_rate;tps=20",
        "slicer;interval=0.001;size=64",
    ),
    *_rows(
        "flood",
        3,
        "sse_keepalive;interval=0.02",
        "sse_pings;interval=0.02",
        "sse_empty_deltas;interval=0.01",
    ),
    *_rows(
        "reset",
        1.5,
        "reset;when=before",
        "reset;when=mid",
        "close_mid_body",
        "half_close",
        "cut_after;bytes=100;then=close",
        "cut_after;bytes=300;then=reset",
        "cut_after;bytes=200;then=stall",
    ),
    *_rows(
        "bad body",
        1,
        "malformed_json",
        f"huge_body;size={4 * MIB}",
        f"sse_long_line;size={MIB}",
        "bad_usage;mode=null",
        "data_after_done",
        "json_for_stream",
        "error_event",
        "error_event;event=true",
        "no_done",
        "sse_crlf;eol=cr",
        "sse_multiline",
    ),
    *_rows(
        "status",
        1,
        "status;code=500",
        "status;code=503",
        "status;code=429;retry_after=1",
        "status;code=400",
        "status;code=401",
        "status;code=404",
    ),
    Fault("connect", "blackhole", 3, BLACKHOLE),
    Fault("connect", "refused", 1, REFUSED),
)


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """The size and shape of a soak.

    ``totals``: each call's total is drawn uniformly in this range (seconds). ``cancel``:
    the share of calls given a cancellation. ``guard``: a call not over by its total + this
    is a hang. ``hold``: how long a fault keeps its socket (far past any total). ``limit``:
    the whole run's bound in seconds (calls still running then count as hangs).
    """

    calls: int
    seed: int
    faces: tuple[str, ...] = FACES
    concurrency: int = 32
    totals: tuple[float, float] = (0.2, 1.5)
    cancel: float = 0.1
    stream: float = 0.5
    guard: float = 3.0
    hold: float = 10.0
    threads: int = 8
    limit: float = 600.0

    def __post_init__(self) -> None:
        unknown = set(self.faces) - set(FACES)
        if unknown or not self.faces:
            raise ValueError(f"faces must be some of {FACES}, got {self.faces!r}")
        lo, hi = self.totals
        if not 0 < lo <= hi or self.hold <= hi + self.guard:
            raise ValueError(f"bad totals {self.totals!r} for hold {self.hold!r}")
        if self.calls < 1 or self.concurrency < 1 or not 0 <= self.cancel <= 1:
            raise ValueError(f"bad soak size: {self!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Targets:
    """Where the calls go: the fault server's ``/v1`` URL, its listener that never accepts,
    and a port where nothing listens."""

    server: str
    blackhole: str
    refused: str

    def url(self, target: str) -> str:
        return {SERVER: self.server, BLACKHOLE: self.blackhole, REFUSED: self.refused}[target]


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """One call, drawn from the seed: face, fault, mode, total and cancellation."""

    index: int
    face: str
    fault: Fault
    stream: bool
    read: int | None  # a stream: events read before closing it early; None: all of them
    total: float
    cancel: str | None  # how it is cancelled (see `CANCELS`); None: not cancelled
    cancel_at: float  # seconds after the call starts

    @property
    def deadline(self) -> float:
        """Seconds after its start by which the call must be over (or is late)."""
        return min(self.total, self.cancel_at) if self.cancel else self.total

    def __str__(self) -> str:
        mode = "non-stream"
        if self.stream:
            mode = "stream" if self.read is None else f"stream, closed after {self.read}"
        cancel = f", {self.cancel} at {self.cancel_at:.3f}s" if self.cancel else ""
        return (
            f"#{self.index} {self.face} {self.fault.spec!r} {mode}, total {self.total:.3f}s{cancel}"
        )


CANCELS: Mapping[str, tuple[str, ...]] = {
    "asyncio": (
        "Task.cancel",
        *(("asyncio.timeout",) if sys.version_info >= (3, 11) else ()),
        "anyio.move_on_after",
        "anyio.CancelScope",
    ),
    "trio": ("trio.move_on_after", "trio.CancelScope"),
}


def draw(settings: Settings, backend: str) -> list[Plan]:
    """Every call of the run, from ``settings.seed`` alone."""
    rng = random.Random(settings.seed)
    weights = [f.weight for f in FAULTS]
    plans: list[Plan] = []
    for index in range(settings.calls):
        face = rng.choice(settings.faces)
        fault = rng.choices(FAULTS, weights)[0]
        stream = rng.random() < settings.stream
        read = rng.choice((None, None, None, 1, 3)) if stream else None
        total = round(rng.uniform(*settings.totals), 3)
        cancel = None
        if face != "openai-sync" and rng.random() < settings.cancel:
            cancel = rng.choice(CANCELS[backend])
        cancel_at = round(rng.uniform(0, total), 3)
        plans.append(Plan(index, face, fault, stream, read, total, cancel, cancel_at))
    return plans
