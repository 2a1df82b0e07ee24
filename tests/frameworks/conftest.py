"""Helpers for the framework recipes (docs/frameworks.md), each run against the fault server.

The tests here carry the ``frameworks`` marker, which the default run deselects: they need
the heavy ``stallproof[frameworks]`` extra, installed by ``make test-frameworks`` into a
venv of its own. Each test module imports its framework inside a fixture, so collecting
this folder without the extra costs nothing and a missing framework is a skip that says why.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from types import ModuleType
from typing import Any

import openai
import pytest

import stallproof
import stallproof.openai
from stallproof import Timeouts

from ..support.clients import OPENAI_HTTP
from ..support.timing import MARGIN, stopwatch

# litellm (and dspy through it) fetches its model price map from the network at import
# unless told to use the copy it ships; this machine has no network to wait for.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# The budget every recipe gets: tight, so a stall ends fast; the faults hold 20 s.
BUDGET = Timeouts(connect=2, read=2, write=2, pool=2, first_token=0.8, idle=0.5, total=1.5)
HOLD = 20
# For healthy answers, which test what a framework does with one, not a bound: roomy, so a
# framework slow to consume a stream on a busy machine is not cut off by total.
ROOMY = Timeouts(total=30)
MODEL = "fault-model"
KEY = "sk-test-frameworks"
# How late past the budget a framework's call may end, measured around the whole framework
# call: its own work before the request (building messages, a lazy import on first use) and
# after the engine gave up (building its error) is in that measure, not in the bound's.
LATE = MARGIN + 0.2


def require(module: str, reason: str) -> ModuleType:
    """Import ``module`` or skip the test, saying why it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.skip(f"{reason} ({e})")


def stallproof_cause(error: BaseException) -> stallproof.TimeoutException:
    """The stallproof bound behind what a framework raised: its cause chain holds it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, stallproof.TimeoutException):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    raise AssertionError(f"no stallproof timeout behind {error!r}") from error


class Hardened:
    """One recipe's stallproof HTTP client, checked for leaks when the test ends."""

    def __init__(self) -> None:
        self.clients: list[Any] = []

    def http_client2(self, budget: Timeouts = BUDGET) -> Any:
        """What the recipes pass to openai 3 (httpx2)."""
        http = stallproof.http_client2(timeout=budget, retry=None)
        self.clients.append(http)
        return http

    def http_client(self) -> Any:
        """What the recipes pass where a framework builds its client on plain httpx."""
        http = stallproof.http_client(timeout=BUDGET, retry=None)
        self.clients.append(http)
        return http

    def openai(self, base_url: str, budget: Timeouts = BUDGET) -> openai.AsyncOpenAI:
        """The hardened SDK client: the engine underneath, the SDK's own retries off."""
        return openai.AsyncOpenAI(
            base_url=base_url, api_key=KEY, http_client=self.http_client2(budget), max_retries=0
        )

    def sync_http_client(self, budget: Timeouts = BUDGET) -> Any:
        """The sync http client of the library the installed openai runs on (httpx2 on
        openai 3, httpx on openai 2): what sync recipes hand ``openai.OpenAI``."""
        make = (
            stallproof.sync_http_client2
            if OPENAI_HTTP.__name__ == "httpx2"
            else (stallproof.sync_http_client)
        )
        http = make(timeout=budget, retry=None)
        self.clients.append(http)
        return http

    def async_http_client(self, budget: Timeouts = BUDGET) -> Any:
        """The same for ``openai.AsyncOpenAI``."""
        if OPENAI_HTTP.__name__ == "httpx2":
            return self.http_client2(budget)
        http = stallproof.http_client(timeout=budget, retry=None)
        self.clients.append(http)
        return http

    def sync_face(self, base_url: str, budget: Timeouts = BUDGET) -> Any:
        """``stallproof.openai.OpenAI``: the SDK's sync client, hardened."""
        face = stallproof.openai.OpenAI(base_url=base_url, api_key=KEY, timeout=budget, retry=None)
        self.clients.append(face._client)
        return face

    def async_face(self, base_url: str, budget: Timeouts = BUDGET) -> Any:
        """``stallproof.openai.AsyncOpenAI``: the SDK's async client, hardened."""
        face = stallproof.openai.AsyncOpenAI(
            base_url=base_url, api_key=KEY, timeout=budget, retry=None
        )
        self.clients.append(face._client)
        return face

    def held(self, *, sync_only: bool = False) -> list[Any]:
        """What any client this test made still holds: calls in flight, pool stats with a
        connection held (every sync client only: an async client's views need its loop)."""
        held: list[Any] = []
        for http in self.clients:
            if sync_only and hasattr(http, "aclose"):
                continue
            transport = http._transport  # sync or async: its views work from any thread
            stats = transport.engine.pool.stats()
            held += [*transport.inflight(), *([] if stats.nothing_held else [stats])]
        return held

    def assert_released(self, *, sync_only: bool = False) -> None:
        """Nothing in flight and no connection held, in every client this test made. A
        framework that runs a sync turn in a worker thread of its own (crewai's
        kickoff_async) gets STEP_LATE for that thread's call to end at the deadline too."""
        give_up = time.monotonic() + STEP_LATE
        while (held := self.held(sync_only=sync_only)) and time.monotonic() < give_up:
            time.sleep(0.01)
        assert held == []


@pytest.fixture
async def hardened() -> AsyncIterator[Hardened]:
    h = Hardened()
    yield h
    h.assert_released()
    for http in h.clients:
        if hasattr(http, "aclose"):
            await http.aclose()
        else:
            http.close()


@pytest.fixture
def hardened_sync() -> Iterator[Hardened]:
    """`hardened` for a sync test: its sync clients closed at the end (an async one a
    recipe built for its async path was never used there, so holds nothing)."""
    h = Hardened()
    yield h
    h.assert_released(sync_only=True)
    for http in h.clients:
        if not hasattr(http, "aclose"):
            http.close()


@pytest.fixture
def anyio_backend() -> str:
    # The frameworks run on asyncio (litellm, langchain, autogen, dspy and openai-agents
    # need it); the engine's trio support is proven by the main suite.
    return "asyncio"


@pytest.fixture
def attempts(fault_server: Any) -> Any:
    """``attempts(scope)``: how many requests the server saw with the scope's key."""

    def count(scope: Any) -> int:
        return int(fault_server.key_stats(scope.key).requests)

    return count


class Stall:
    """One stall a recipe must end: the fault, whether the call streams, the bound that
    fires, and whether it fires before the SDK returned (so the SDK maps it to its own
    ``APITimeoutError``) or mid-stream (where the SDK lets the transport's error through)."""

    def __init__(self, fault: str, stream: bool, bound: str, mid_stream: bool, **params: Any):
        self.fault, self.stream, self.bound, self.mid_stream = fault, stream, bound, mid_stream
        self.params = {"hold": HOLD, **params}

    def __repr__(self) -> str:
        return f"{self.fault}-{'stream' if self.stream else 'call'}"

    def url(self, scope: Any) -> str:
        return str(scope.url(self.fault, **self.params))


# No byte after the headers; keep-alive comments and never a token; a stream cut off after
# two tokens with the socket held open.
HALF_OPEN = Stall("half_open", stream=False, bound="first_token", mid_stream=False)
KEEPALIVE = Stall("sse_keepalive", stream=True, bound="first_token", mid_stream=False, interval=0.1)
SSE_STALL = Stall("sse_stall", stream=True, bound="idle", mid_stream=True, after=2)
STALLS = [HALF_OPEN, KEEPALIVE, SSE_STALL]
# A stall mid-stream reaches the caller as the transport's timeout (a
# stallproof.TimeoutException that is also an httpx2.TimeoutException) through openai < 3.4,
# which lets it through its stream iterator; later 3.x wrap it in APITimeoutError.
MID_STREAM: tuple[type[Exception], ...] = (openai.APITimeoutError, stallproof.TimeoutException)


# One agent turn, as the recipes must end it: a body trickled a byte at a time, SSE
# keep-alives and never a token, a server that never sends its headers. Each recipe runs
# the turn inside `stallproof.deadline(STEP)`, so the framework's own work before and
# between requests counts, and must end within STEP + STEP_LATE, measured around the block.
TRICKLE = Stall("trickle_body", stream=False, bound="total", mid_stream=False, interval=0.2)
NO_HEADERS = Stall("stall_headers", stream=False, bound="first_token", mid_stream=False)
TURN_STALLS = [TRICKLE, KEEPALIVE, NO_HEADERS]
STEP = BUDGET.total
STEP_LATE = 0.25


def turn_ends_in_time(
    turn: Callable[[], object], name: str, *, reported: Callable[[Any], bool] | None = None
) -> object:
    """Run a sync ``turn`` inside ``deadline(STEP)``; it must end within STEP + STEP_LATE,
    raising with a stallproof error in the chain. ``reported``, for a framework that
    reports a failed turn in its result instead, or raises an error of its own without the
    chain: what it returned or raised must say the turn failed."""
    with stopwatch() as elapsed:
        try:
            with stallproof.deadline(STEP, name=name):
                result: object = turn()
        except Exception as e:
            result = e
    return _ended(result, elapsed[0], reported)


async def aturn_ends_in_time(
    turn: Callable[[], Awaitable[object]],
    name: str,
    *,
    reported: Callable[[Any], bool] | None = None,
) -> object:
    """`turn_ends_in_time` for an async turn."""
    with stopwatch() as elapsed:
        try:
            with stallproof.deadline(STEP, name=name):
                result: object = await turn()
        except Exception as e:
            result = e
    return _ended(result, elapsed[0], reported)


def _ended(result: object, elapsed: float, reported: Callable[[Any], bool] | None) -> object:
    assert elapsed <= STEP + STEP_LATE, (elapsed, result)
    if isinstance(result, BaseException):
        # The stallproof error in the chain; or, for a framework that drops the chain, an
        # error that says the turn failed (the deadline's own DeadlineExceeded included).
        if reported is None or not reported(result):
            stallproof_cause(result)
    else:
        assert reported is not None, f"the turn did not fail: {result!r}"
        assert reported(result), result
    return result
