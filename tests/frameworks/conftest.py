"""Helpers for the framework recipes (docs/frameworks.md), each run against the fault server.

The tests here carry the ``frameworks`` marker, which the default run deselects: they need
the heavy ``stallproof[frameworks]`` extra, installed by ``make test-frameworks`` into a
venv of its own. Each test module imports its framework inside a fixture, so collecting
this folder without the extra costs nothing and a missing framework is a skip that says why.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import openai
import pytest

import stallproof
from stallproof import Timeouts

from ..support.timing import MARGIN

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

    def assert_released(self) -> None:
        """Nothing in flight and no connection held, in every client this test made."""
        for http in self.clients:
            transport = http._transport
            assert transport.inflight() == ()
            stats = transport.engine.pool.stats()
            assert stats.nothing_held, stats


@pytest.fixture
async def hardened() -> AsyncIterator[Hardened]:
    h = Hardened()
    yield h
    h.assert_released()
    for http in h.clients:
        await http.aclose()


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
