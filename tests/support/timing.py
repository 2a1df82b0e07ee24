"""Time in tests: the margin a loaded runner honours, a stopwatch, bounded waits for state."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

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
    """Seconds since the SDK handed its request to the http client: the bounds start there,
    after the SDK's own preparation (its first call looks up the platform in a thread)."""

    def __init__(self, sdk_client: Any) -> None:
        self.sent: float | None = None
        #: When the caller last got an event of a stream (`saw`): where idle has begun, at
        #: the latest (it starts at the last content event).
        self.last_event: float | None = None
        is_async = hasattr(sdk_client._client, "aclose")  # a sync client's hooks are sync
        hook = self._mark if is_async else self._mark_sync
        sdk_client._client.event_hooks = {"request": [hook], "response": []}

    async def _mark(self, request: Any) -> None:
        self.sent = time.monotonic()

    def _mark_sync(self, request: Any) -> None:
        self.sent = time.monotonic()

    def elapsed(self) -> float:
        assert self.sent is not None, "no request was sent"
        return time.monotonic() - self.sent

    def saw(self) -> None:
        """The caller got a stream event now."""
        self.last_event = time.monotonic()

    def in_bound(self, outcome: str) -> float:
        """Seconds from where the bound behind ``outcome`` began, as far as the caller can
        tell: idle from the last event it got, any other from the send. (From the send,
        idle would count the connect and the events before the last: a starved test
        process spends up to half a second there.)"""
        if outcome.endswith("/IdleTimeout") and self.last_event is not None:
            return time.monotonic() - self.last_event
        return self.elapsed()
