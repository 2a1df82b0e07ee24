"""The proof: many agents, many rounds, random faults, and not one call hangs.

Starts the fault server in a thread, then:

Phase A  32 agents hold 5-round conversations that grow every round, all through ONE shared
         `stallproof.Client`. Each call draws a fault (about half are healthy, some of those
         slow; the rest cover every fault the server knows, and its listener that never
         accepts) and stream or not. Faults hold
         their socket for 30 s, ten times the 3 s budget, so an unbounded client really
         would hang. An outer watchdog times every call: a call that does not finish within
         its budget + 0.5 s counts as hung.
Phase B  One call per fault and mode through plain ``httpx.AsyncClient`` with the same
         per-phase timeouts, capped by a watchdog, to show which of them would have hung.
Phase C  The openai SDK as people run it today (``openai.AsyncOpenAI(timeout=5)``, its
         default retries) next to the same SDK hardened (stallproof's engine as its
         ``http_client``, the 3 s budget, no SDK retries), one call each per stall, all at
         once under the same kind of watchdog.

Exit status 1 if any stallproof call hung, ran more than 0.1 s over its budget, or raised an
error outside stallproof's exception tree.

    python scripts/proof_demo.py [--agents 32] [--rounds 5] [--seed 7] [--no-baseline]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

import fault_server
import stallproof

MODEL = "fault-model"
HOLD = 30.0  # how long a fault keeps its socket stalled: ten times the budget.
BUDGET = stallproof.Timeouts(connect=1, read=2, write=2, pool=2, first_token=1.5, idle=1, total=3)
# A call is hung if it has not finished this long after its budget ran out...
HUNG_AFTER = 0.5
# ...and late (a failure too, but a smaller one) past this.
LATE_AFTER = 0.1
# The outer watchdog that stops a hung call so the demo itself cannot hang.
WATCHDOG = 5.0
# Phase B: the same per-phase bounds in httpx's terms, and its watchdog.
HTTPX_TIMEOUT = httpx.Timeout(connect=1, read=2, write=2, pool=2)
HTTPX_WATCHDOG = 8.0
# Phase C: the openai SDK as it is usually configured, and its watchdog.
SDK_TIMEOUT = 5.0
SDK_WATCHDOG = 8.0
# A body cap well under what huge_body sends, so that fault ends in milliseconds.
LIMITS = stallproof.Limits(max_response_bytes=4 * 1024 * 1024)
HUGE = 8 * 1024 * 1024
# The harness's pacer, replaced by stallproof's: agents take turns, 429s shrink the limit
# (never below 16) and the wait counts against each call's 3 s budget.
PACER = stallproof.Pacer(max_concurrent=32, min_concurrent=16)


@dataclasses.dataclass(frozen=True, slots=True)
class Variant:
    """One row of the fault mix: a label, the X-Fault spec and its share of the calls."""

    label: str
    spec: str  # the X-Fault header; BLACKHOLE for the listener that never accepts
    weight: float


BLACKHOLE = "blackhole"
_FAULTS = (
    ("half_open", "half_open"),
    ("stall_headers", "stall_headers"),
    ("trickle_body", "trickle_body;interval=0.5"),
    ("sse_keepalive", "sse_keepalive;interval=0.5"),
    ("sse_stall", "sse_stall;after=2"),
    ("sse_empty_deltas", "sse_empty_deltas;interval=0.3"),
    ("reset before", "reset;when=before"),
    ("reset mid", "reset;when=mid"),
    ("close_mid_body", "close_mid_body"),
    ("content_length_lie", "content_length_lie"),
    ("status 500", "status;code=500"),
    ("status 429", "status;code=429;retry_after=1"),
    ("status 503", "status;code=503"),
    ("malformed_json", "malformed_json"),
    ("huge_body 8 MiB", f"huge_body;size={HUGE}"),
    ("no_done", "no_done"),
    ("blackhole (connect)", BLACKHOLE),
)

# About half healthy (some slow, but well inside the budget), the rest spread evenly over
# every fault the server implements.
MIX: tuple[Variant, ...] = (
    Variant("healthy", "healthy;tokens=24", 32),
    Variant("healthy, slow", "healthy;delay=0.3;token_interval=0.04;tokens=12", 18),
    *(
        Variant(label, spec if spec == BLACKHOLE else f"{spec};hold={HOLD:g}", 50 / len(_FAULTS))
        for label, spec in _FAULTS
    ),
)

SYSTEM = (
    "You are agent {i} of a multi-agent harness. Read the messages you are given, write "
    "the files you are asked to, then analyse them and save a summary."
)
_WORDS = (
    "router",
    "prefill",
    "decode",
    "engine",
    "kernel",
    "batch",
    "token",
    "cache",
    "request",
    "latency",
    "queue",
    "harness",
    "message",
    "summary",
    "context",
    "window",
    "metric",
    "trace",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    """One planned call: the user's new message, the fault and the mode."""

    user: str
    variant: Variant
    stream: bool


def plan(agents: int, rounds: int, seed: int) -> list[list[Turn]]:
    """Every agent's turns, drawn up front so the run is the same for a seed whatever the
    scheduling. User turns carry a 'file' of 100-400 words: contexts grow every round."""
    rng = random.Random(seed)
    weights = [v.weight for v in MIX]
    out: list[list[Turn]] = []
    for i in range(agents):
        turns = []
        for r in range(rounds):
            words = " ".join(rng.choices(_WORDS, k=rng.randint(100, 400)))
            user = f"round {r + 1}: here is notes_{i}_{r}.txt, analyse it and save.\n{words}"
            variant = rng.choices(MIX, weights)[0]
            turns.append(Turn(user, variant, stream=rng.random() < 0.5))
        out.append(turns)
    return out


# -- outcomes ------------------------------------------------------------------------------

HUNG = "HUNG"


@dataclasses.dataclass(slots=True)
class Outcome:
    label: str
    stream: bool
    result: str  # "ok", an error class name, or HUNG
    elapsed: float


@dataclasses.dataclass(slots=True)
class Progress:
    """What the live view shows; updated by the calls, read by the renderer."""

    title: str
    total: int
    started: float = dataclasses.field(default_factory=time.monotonic)
    done: int = 0
    in_flight: int = 0
    results: Counter[str] = dataclasses.field(default_factory=Counter)
    finished: bool = False
    # The clients whose live in-flight view is shown (phase A only).
    clients: tuple[stallproof.Client, ...] = ()

    def phases(self) -> str:
        """Calls in flight by phase, straight from ``client.inflight()``."""
        calls = [c for client in self.clients for c in client.inflight(stalled_after=1.0)]
        if not calls:
            return ""
        by_phase = Counter(c.phase for c in calls)
        stalled = sum(c.stalled for c in calls)
        parts = ", ".join(f"{phase} {n}" for phase, n in by_phase.most_common())
        return f"in flight by phase: {parts} ({stalled} stalled > 1s)"

    def line(self) -> str:
        return (
            f"{self.title}: {self.done}/{self.total} calls done, {self.in_flight} in flight, "
            f"{time.monotonic() - self.started:5.1f}s elapsed"
        )

    def tally(self) -> str:
        errors = {k: n for k, n in self.results.items() if k != "ok"}
        parts = [f"ok {self.results['ok']}"]
        parts += [f"{k} {n}" for k, n in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))]
        return ", ".join(parts)


async def show_progress(progress: Progress, tty: bool) -> None:
    """Redraw a few lines at ~4 Hz on a terminal; print a line a second otherwise."""
    drawn = 0
    last_print = 0.0
    while True:
        if tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            lines = [progress.line(), *_wrap(progress.tally(), width, indent="  ")]
            if phases := progress.phases():
                lines.append("  " + phases)
            out = f"\x1b[{drawn}F\x1b[J" if drawn else ""
            out += "".join(line[:width] + "\n" for line in lines)
            sys.stdout.write(out)
            sys.stdout.flush()
            drawn = len(lines)
        elif time.monotonic() - last_print >= 1.0 or progress.finished:
            last_print = time.monotonic()
            print(f"[{progress.line()}] {progress.tally()}", flush=True)
            if phases := progress.phases():
                print(f"    {phases}", flush=True)
        if progress.finished:
            return
        await anyio.sleep(0.25)


def _wrap(text: str, width: int, indent: str) -> list[str]:
    lines: list[str] = []
    cur = indent
    for part in text.split(", "):
        piece = part if cur == indent else ", " + part
        if len(cur) + len(piece) > width and cur != indent:
            lines.append(cur + ",")
            cur = indent + part
        else:
            cur += piece
    return [*lines, cur]


async def timed(
    label: str,
    stream: bool,
    progress: Progress,
    call: Callable[[], Awaitable[str | None]],
    watchdog: float,
    on_reply: Callable[[str], None] | None = None,
) -> Outcome:
    """Run one call under an outer watchdog and classify how it ended."""
    progress.in_flight += 1
    start = time.monotonic()
    result = HUNG
    with anyio.move_on_after(watchdog):
        try:
            reply = await call()
        except stallproof.StallproofError as e:
            result = type(e).__name__
        except Exception as e:  # an error that escaped the client's tree, or a baseline one
            result = _name(e)
        else:
            result = "ok"
            if on_reply is not None and reply is not None:
                on_reply(reply)
    elapsed = time.monotonic() - start
    progress.in_flight -= 1
    progress.done += 1
    progress.results[result] += 1
    return Outcome(label, stream, result, elapsed)


def _name(e: BaseException) -> str:
    if isinstance(e.__cause__, stallproof.StallproofError) and not isinstance(
        e, stallproof.StallproofError
    ):  # an SDK's own error for one of ours: name both
        return f"{_name_of(e)}({type(e.__cause__).__name__})"
    return _name_of(e)


def _name_of(e: BaseException) -> str:
    module = type(e).__module__
    if module.startswith("stallproof"):
        return type(e).__name__
    if module.startswith("httpx"):
        return f"httpx.{type(e).__name__}"
    return type(e).__name__


# -- phase A: stallproof -------------------------------------------------------------------


async def stallproof_call(
    client: stallproof.Client, messages: list[ChatCompletionMessageParam], turn: Turn
) -> str:
    headers = {"X-Fault": turn.variant.spec}  # agents are tagged by run_agent's tag()
    if turn.stream:
        parts: list[str] = []
        stream = await client.chat.completions.create(
            model=MODEL, messages=messages, stream=True, extra_headers=headers
        )
        async with stream:
            async for chunk in stream:
                for choice in chunk.choices or ():
                    if choice.delta and choice.delta.content:
                        parts.append(choice.delta.content)
        return "".join(parts)
    resp = await client.chat.completions.create(
        model=MODEL, messages=messages, extra_headers=headers
    )
    # stallproof's models type every field as optional (servers omit fields), so strict
    # typing has to say what an absent message means.
    message = resp.choices[0].message if resp.choices else None
    return (message.content if message else None) or ""


async def run_agent(
    i: int,
    turns: Sequence[Turn],
    clients: tuple[stallproof.Client, stallproof.Client],
    progress: Progress,
    outcomes: list[Outcome],
) -> None:
    with stallproof.tag(agent=f"agent-{i}"):
        await _agent_rounds(i, turns, clients, progress, outcomes)


async def _agent_rounds(
    i: int,
    turns: Sequence[Turn],
    clients: tuple[stallproof.Client, stallproof.Client],
    progress: Progress,
    outcomes: list[Outcome],
) -> None:
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": SYSTEM.format(i=i)}]
    for turn in turns:
        messages.append({"role": "user", "content": turn.user})
        snapshot = list(messages)

        # Every call goes through the one shared client, except those to the blackhole
        # listener, which is a different address.
        client = clients[turn.variant.spec == BLACKHOLE]

        async def call(
            snapshot: list[ChatCompletionMessageParam] = snapshot,
            turn: Turn = turn,
            client: stallproof.Client = client,
        ) -> str:
            return await stallproof_call(client, snapshot, turn)

        def keep(reply: str) -> None:
            messages.append({"role": "assistant", "content": reply})

        # On an error the agent moves on to its next round, as a harness would; the failed
        # user turn stays in its history.
        outcomes.append(
            await timed(
                turn.variant.label,
                turn.stream,
                progress,
                call,
                BUDGET.total + WATCHDOG,
                on_reply=keep,
            )
        )


async def phase_a(
    url: str, blackhole_url: str, plans: list[list[Turn]], tty: bool
) -> list[Outcome]:
    progress = Progress("phase A, stallproof", sum(len(p) for p in plans))
    outcomes: list[Outcome] = []
    kw: dict[str, Any] = {"api_key": "demo", "timeout": BUDGET, "limits": LIMITS}
    async with (
        stallproof.Client(base_url=url, pacer=PACER, **kw) as client,
        stallproof.Client(base_url=blackhole_url, **kw) as blackhole,
        anyio.create_task_group() as outer,
    ):
        progress.clients = (client, blackhole)
        outer.start_soon(show_progress, progress, tty)
        async with anyio.create_task_group() as tg:
            for i, turns in enumerate(plans):
                tg.start_soon(run_agent, i, turns, (client, blackhole), progress, outcomes)
        progress.finished = True
    return outcomes


# -- phase B: plain httpx ------------------------------------------------------------------


async def httpx_call(
    http: httpx.AsyncClient, url: str, messages: list[dict[str, Any]], spec: str, stream: bool
) -> str:
    """What a harness written against plain httpx does: per-phase timeouts, nothing more."""
    headers = {"Authorization": "Bearer demo"}
    if spec != BLACKHOLE:
        headers["X-Fault"] = spec
    body: dict[str, Any] = {"model": MODEL, "messages": messages}
    if not stream:
        r = await http.post(url, json=body, headers=headers)
        r.raise_for_status()
        return str(r.json()["choices"][0]["message"]["content"])
    body["stream"] = True
    parts: list[str] = []
    async with http.stream("POST", url, json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            for choice in json.loads(data).get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


async def phase_b(url: str, blackhole_url: str, tty: bool, seed: int) -> list[Outcome]:
    """One call per fault and mode, all at once, each with a 3-round conversation."""
    calls = [(v, stream) for v in MIX for stream in (False, True)]
    turns = plan(1, 3, seed)[0]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM.format(i=0)}]
    for t in turns:
        messages += [{"role": "user", "content": t.user}, {"role": "assistant", "content": "ok"}]
    messages.append({"role": "user", "content": "now save the summary."})
    progress = Progress("phase B, plain httpx", len(calls))
    outcomes: list[Outcome] = []

    async def one(variant: Variant, stream: bool) -> None:
        base = blackhole_url if variant.spec == BLACKHOLE else url
        endpoint = base.rstrip("/") + "/chat/completions"

        async def call() -> str:
            return await httpx_call(http, endpoint, messages, variant.spec, stream)

        outcomes.append(await timed(variant.label, stream, progress, call, HTTPX_WATCHDOG))

    async with httpx.AsyncClient(timeout=HTTPX_TIMEOUT) as http, anyio.create_task_group() as outer:
        outer.start_soon(show_progress, progress, tty)
        async with anyio.create_task_group() as tg:
            for variant, stream in calls:
                tg.start_soon(one, variant, stream)
        progress.finished = True
    return outcomes


# -- phase C: the openai SDK, as people run it and hardened ----------------------------------

# (label, X-Fault spec, stream): one healthy call, then stalls that per-phase timeouts miss.
SDK_ROWS = (
    ("healthy", "healthy;tokens=24", False),
    ("half_open", f"half_open;hold={HOLD:g}", False),
    ("trickle_body", f"trickle_body;interval=0.5;hold={HOLD:g}", False),
    ("sse_keepalive", f"sse_keepalive;interval=0.5;hold={HOLD:g}", True),
    ("sse_empty_deltas", f"sse_empty_deltas;interval=0.3;hold={HOLD:g}", True),
    ("sse_stall", f"sse_stall;after=2;hold={HOLD:g}", True),
)
PLAIN, HARDENED = "openai SDK, timeout=5", "same SDK + stallproof"


def sdk_clients(url: str) -> tuple[openai.AsyncOpenAI, openai.AsyncOpenAI]:
    """The SDK as people configure it, and the same SDK with stallproof's engine under it.
    (With the SDK face, the second is ``stallproof.openai.AsyncOpenAI(..., timeout=BUDGET)``.)"""
    plain = openai.AsyncOpenAI(base_url=url, api_key="demo", timeout=SDK_TIMEOUT)
    hardened = openai.AsyncOpenAI(
        base_url=url,
        api_key="demo",
        http_client=stallproof.http_client2(timeout=BUDGET, limits=LIMITS),
        max_retries=0,  # the engine retries inside the budget; the SDK's would restart it
    )
    return plain, hardened


async def sdk_call(client: openai.AsyncOpenAI, messages: list[Any], spec: str, stream: bool) -> str:
    headers = {"X-Fault": spec}
    if not stream:
        resp = await client.chat.completions.create(
            model=MODEL, messages=messages, extra_headers=headers
        )
        return resp.choices[0].message.content or ""
    parts: list[str] = []
    chunks = await client.chat.completions.create(
        model=MODEL, messages=messages, stream=True, extra_headers=headers
    )
    async with chunks:
        async for chunk in chunks:
            parts.extend(c.delta.content or "" for c in chunk.choices)
    return "".join(parts)


async def phase_c(url: str, tty: bool) -> list[Outcome]:
    """Each row once through each client, everything at once: the phase takes one watchdog."""
    messages: list[Any] = [{"role": "user", "content": "now save the summary."}]
    progress = Progress("phase C, openai SDK", 2 * len(SDK_ROWS))
    outcomes: list[Outcome] = []
    plain, hardened = sdk_clients(url)

    async def one(
        client: openai.AsyncOpenAI, who: str, label: str, spec: str, stream: bool
    ) -> None:
        async def call() -> str:
            return await sdk_call(client, messages, spec, stream)

        outcome = await timed(f"{who}|{label}", stream, progress, call, SDK_WATCHDOG)
        outcomes.append(outcome)

    async with plain, hardened, anyio.create_task_group() as outer:
        outer.start_soon(show_progress, progress, tty)
        async with anyio.create_task_group() as tg:
            for label, spec, stream in SDK_ROWS:
                tg.start_soon(one, plain, PLAIN, label, spec, stream)
                tg.start_soon(one, hardened, HARDENED, label, spec, stream)
        progress.finished = True
    return outcomes


def report_c(outcomes: Sequence[Outcome]) -> tuple[int, int]:
    """Print phase C's table; return how many calls of each client hung or ended late,
    each against the limit its user set (5 s for the plain SDK, the 3 s budget for ours)."""
    by = {o.label: o for o in outcomes}
    limits = {PLAIN: SDK_TIMEOUT, HARDENED: BUDGET.total}

    def bad(o: Outcome, limit: float) -> bool:
        return o.result == HUNG or o.elapsed > limit + LATE_AFTER

    def cell(o: Outcome, limit: float) -> str:
        if o.result == HUNG:
            return f"HUNG, stopped by the watchdog at {o.elapsed:.1f}s"
        return f"{o.result} {o.elapsed:.2f}s" + (" LATE" if bad(o, limit) else "")

    rows = []
    count = {PLAIN: 0, HARDENED: 0}
    for label, _spec, stream in SDK_ROWS:
        row = [label, "stream" if stream else "call"]
        for who, limit in limits.items():
            o = by[f"{who}|{label}"]
            row.append(cell(o, limit))
            count[who] += bad(o, limit)
        rows.append(row)
    rows.append(["", "", *(f"{count[who]} hung or late" for who in limits)])
    print(
        f"\nPhase C: the openai SDK as people run it (AsyncOpenAI(timeout={SDK_TIMEOUT:g}), "
        f"its default retries) and the same SDK with stallproof's engine as its http_client "
        f"(budget {BUDGET.total:g}s, max_retries=0); watchdog {SDK_WATCHDOG:g}s per call"
    )
    print(_table(["fault", "mode", PLAIN, HARDENED], rows, right=set()))
    print(
        "late: past the limit its caller set (the plain SDK's timeout, stallproof's budget). "
        "(cause) is the stallproof error\nbehind the SDK's own; the plain SDK's timeout "
        "restarts with every byte and every retry."
    )
    return count[PLAIN], count[HARDENED]


# -- reports -------------------------------------------------------------------------------


def _by_label(outcomes: Sequence[Outcome]) -> dict[str, list[Outcome]]:
    rows: dict[str, list[Outcome]] = {v.label: [] for v in MIX}
    for o in outcomes:
        rows[o.label].append(o)
    return {k: v for k, v in rows.items() if v}


def _errors(outcomes: Sequence[Outcome], brief: bool = False) -> str:
    counts = Counter(o.result for o in outcomes if o.result not in ("ok", HUNG))
    if brief:
        return f"{sum(counts.values())} errors of {len(counts)} types" if counts else "-"
    return (
        ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        or "-"
    )


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: Sequence[str]) -> str:
        cells = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(r) for r in rows[:-1]), rule, fmt(rows[-1])])


def report_a(outcomes: Sequence[Outcome]) -> tuple[int, int, int, float]:
    """Print phase A's table; return (hung, late, untyped, worst elapsed)."""
    limit = BUDGET.total
    rows = []

    def row(label: str, group: Sequence[Outcome]) -> list[str]:
        worst = max(o.elapsed for o in group)
        hung = sum(o.result == HUNG or o.elapsed > limit + HUNG_AFTER for o in group)
        ok = sum(o.result == "ok" for o in group)
        streams = sum(o.stream for o in group)
        return [
            label,
            str(len(group)),
            str(streams),
            str(ok),
            _errors(group, brief=label == "all"),
            f"{worst:.2f}s",
            str(hung),
        ]

    for label, group in _by_label(outcomes).items():
        rows.append(row(label, group))
    rows.append(row("all", outcomes))
    print(
        f"\nPhase A: stallproof.Client, budget total={limit:g}s "
        f"(first_token={BUDGET.first_token:g}, idle={BUDGET.idle:g}, read={BUDGET.read:g}, "
        f"connect={BUDGET.connect:g}); faults hold the socket {HOLD:g}s"
    )
    header = ["fault", "calls", "stream", "ok", "errors", f"worst/{limit:g}s", "hung"]
    print(_table(header, rows, right={1, 2, 3, 5, 6}))
    hung = sum(o.result == HUNG or o.elapsed > limit + HUNG_AFTER for o in outcomes)
    late = sum(o.elapsed > limit + LATE_AFTER for o in outcomes)
    untyped = sum(o.result not in ("ok", HUNG) and not _is_ours(o.result) for o in outcomes)
    worst = max(o.elapsed for o in outcomes)
    return hung, late, untyped, worst


def _is_ours(name: str) -> bool:
    obj = getattr(stallproof, name, None)
    return isinstance(obj, type) and issubclass(obj, stallproof.StallproofError)


def report_b(outcomes: Sequence[Outcome]) -> int:
    """Print phase B's table; return how many calls would have hung."""
    rows = []

    def row(label: str, group: Sequence[Outcome]) -> list[str]:
        hang = [o for o in group if o.result == HUNG]
        modes = {"stream" if o.stream else "non-stream" for o in hang}
        if label == "all" or not hang:
            would = str(len(hang))
        elif len(modes) == 2:
            would = f"{len(hang)} (both modes)"
        else:
            would = f"{len(hang)} ({modes.pop()})"
        return [
            label,
            str(len(group)),
            would,
            _errors(group, brief=label == "all"),
            str(sum(o.result == "ok" for o in group)),
            f"{max(o.elapsed for o in group):.2f}s",
        ]

    for label, group in _by_label(outcomes).items():
        rows.append(row(label, group))
    rows.append(row("all", outcomes))
    print(
        "\nPhase B: plain httpx.AsyncClient, Timeout(connect=1, read=2, write=2, pool=2), "
        f"watchdog {HTTPX_WATCHDOG:g}s per call"
    )
    header = ["fault", "calls", "would hang", "errors", "ok", "worst"]
    print(_table(header, rows, right={1, 4, 5}))
    print(
        f"would hang: still waiting when the {HTTPX_WATCHDOG:g}s watchdog stopped it. The fault "
        f"server gives up after its {HOLD:g}s hold;\na stuck production server never does."
    )
    return sum(o.result == HUNG for o in outcomes)


# -- main ----------------------------------------------------------------------------------


async def main(args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty()
    plans = plan(args.agents, args.rounds, args.seed)
    t0 = time.monotonic()
    with fault_server.running(port=0) as srv:
        url = srv.url()
        print(f"fault server on {url} (thread), seed {args.seed}")
        print(
            f"Phase A: {args.agents} agents x {args.rounds} rounds through one stallproof.Client, "
            f"{len(_FAULTS)} faults + healthy, stream and non-stream"
        )
        a = await phase_a(url, srv.blackhole_url, plans, tty)
        b: list[Outcome] = []
        c: list[Outcome] = []
        if not args.no_baseline:
            print(f"Phase B: one call per fault and mode ({2 * len(MIX)}) through plain httpx")
            b = await phase_b(url, srv.blackhole_url, tty, args.seed)
            print(f"Phase C: the openai SDK, plain and hardened, {len(SDK_ROWS)} faults")
            c = await phase_c(url, tty)
    hung, late, untyped, worst = report_a(a)
    healthy = [o for o in a if o.label.startswith("healthy")]
    summary = (
        f"stallproof: {len(a)} calls, {hung} hung, worst {worst:.2f}s of "
        f"{BUDGET.total:.2f}s budget, healthy "
        f"{sum(o.result == 'ok' for o in healthy)}/{len(healthy)} ok"
    )
    if late:
        summary += f", {late} over budget+{LATE_AFTER:g}s"
    if untyped:
        summary += f", {untyped} untyped errors"
    if b:
        would = report_b(b)
        summary += f" | httpx: {would} of {len(b)} would have hung"
    sdk_bad = 0
    if c:
        plain_bad, sdk_bad = report_c(c)
        summary += (
            f" | openai SDK: {plain_bad} of {len(SDK_ROWS)} hung or late, "
            f"hardened {sdk_bad} of {len(SDK_ROWS)}"
        )
    print(f"\n{summary}  ({time.monotonic() - t0:.0f}s)")
    return 1 if hung or late or untyped or sdk_bad else 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--agents", type=int, default=32, help="concurrent agents (default 32)")
    p.add_argument("--rounds", type=int, default=5, help="rounds per agent (default 5)")
    p.add_argument("--seed", type=int, default=7, help="seed of the fault mix (default 7)")
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip phases B and C (plain httpx and the plain openai SDK, for comparison)",
    )
    p.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = p.parse_args(argv)
    if args.agents < 1 or args.rounds < 1:
        p.error("--agents and --rounds must be >= 1")
    return args


if __name__ == "__main__":
    ns = parse_args()
    sys.exit(anyio.run(main, ns, backend=ns.backend))
