"""Time in tests: the margin a loaded runner honours, a stopwatch, the clock of a call
(`SentClock`: from where the engine takes it), bounded waits for state."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

from stallproof._engine import Engine

# How far past its bound a call may end, measured from the moment the bound started. The
# bounds are anyio deadlines, so on an idle machine calls end within a few ms; the margin is
# what a 2-core runner whose cores are both busy with other work honours (scripts/
# stress_tests.py: the suite under two busy loops saw up to ~0.15 s of scheduling delay).
MARGIN = float(os.environ.get("STALLPROOF_TEST_MARGIN", "0.3"))


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    """`with stopwatch() as t: ...` then `t[0]` is the elapsed wall time in seconds."""
    box = [0.0]
    start = time.monotonic()
    try:
        yield box
    finally:
        box[0] = time.monotonic() - start


async def wait_until(
    condition: Callable[[], bool], *, timeout: float = 5.0, what: str = "the condition"
) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail the test after ``timeout`` s.

    For state that another thread (the fault server) or task changes: waiting for it with
    a fixed sleep is either too short on a busy machine or wasted time on an idle one.
    """
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not hold within {timeout}s")
        await anyio.sleep(0.01)


def wait_until_sync(
    condition: Callable[[], bool], *, timeout: float = 5.0, what: str = "the condition"
) -> None:
    """`wait_until` for sync tests."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not hold within {timeout}s")
        time.sleep(0.01)


class SentClock:
    """Seconds since stallproof's engine took a client's call: where its bounds start.

    Marks when `Engine.send` is entered, before it runs a line: the engine opens the call
    (its start, and the total deadline counted from it) a few checks later (the body's
    JSON peeked, the headers checked), with no await between. Not where the SDK starts
    (its first call looks up the platform in a thread), nor its ``request`` event hook,
    nor the transport's entry: on a starved process the SDK and httpx may hold a request
    there for half a second before the engine gets it, and a sync transport hands it to
    the engine loop's thread. A mark later than `Engine.send`'s entry could hide lateness;
    this one is only those checks early, so a bound read from it is read from its start
    or before (tests/integrations/test_sent_clock.py checks both sides).

    ``client``: an SDK client (openai's, anthropic's: sync or async, stallproof's faces or
    the SDK over ``stallproof.http_client*``), an httpx/httpx2 client over a stallproof
    transport, or a `stallproof.Client`. Each call through its engine moves the mark.
    """

    def __init__(self, client: Any) -> None:
        #: `time.monotonic` when the engine last took a call.
        self.sent: float | None = None
        #: When the caller last got an event of a stream (`saw`): where idle has begun, at
        #: the latest (it starts at the last content event).
        self.last_event: float | None = None
        engine = engine_of(client)
        send = engine.send

        async def send_marked(out: Any) -> Any:
            self.sent = time.monotonic()
            return await send(out)

        engine.send = send_marked  # this engine's calls only: the instance's, not the class's

    def elapsed(self) -> float:
        assert self.sent is not None, "no request reached the engine"
        return time.monotonic() - self.sent

    def saw(self) -> None:
        """The caller got a stream event now."""
        self.last_event = time.monotonic()

    def in_bound(self, outcome: str) -> float:
        """Seconds from where the bound behind ``outcome`` (an error's class name, or a
        name that ends with it) began, as far as the caller can tell: idle from the last
        event it got, any other from the engine taking the call. (From the call's start,
        idle would count the connect and the events before the last: a starved test
        process spends up to half a second there.)"""
        if outcome.endswith("IdleTimeout") and self.last_event is not None:
            return time.monotonic() - self.last_event
        return self.elapsed()


def engine_of(client: Any) -> Any:
    """The `Engine` a client sends through (see `SentClock` for the clients it knows)."""
    engine = getattr(client, "_engine", None)  # a stallproof.Client
    if engine is None:
        http = getattr(client, "_client", client)  # an SDK client holds its http client there
        engine = getattr(getattr(http, "_transport", None), "engine", None)
    assert isinstance(engine, Engine), f"{client!r} does not send through a stallproof engine"
    return engine
