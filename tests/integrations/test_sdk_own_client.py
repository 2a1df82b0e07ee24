"""An SDK face given the caller's own httpx2 (or httpx) client keeps it, and every bound.

Changing only ``openai.AsyncOpenAI(...)`` to ``stallproof.openai.AsyncOpenAI(...)`` must
keep every line working, ``http_client=httpx2.AsyncClient(...)`` with its headers, event
hooks and mounts included: the face installs the engine as that client's transport.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import anthropic
import httpx
import httpx2
import openai
import pytest

import stallproof
import stallproof._wire._httpx_pool
import stallproof.anthropic
import stallproof.openai

from ..support.clients import KEY, sdk_pool_held
from ..support.sdk_catalogue import BUDGET
from ..support.timing import MARGIN, SentClock

pytestmark = pytest.mark.anyio
MSGS: Any = [{"role": "user", "content": "hi"}]
T = TypeVar("T")


class CountingTransport(httpx2.AsyncHTTPTransport):
    """A real httpx2 transport that counts what it sends (as a proxy mount would)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.sent += 1
        return await super().handle_async_request(request)


def quietly(build: Callable[[], T]) -> T:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the once-per-process pool warning
        return build()


async def test_the_callers_client_keeps_its_headers_and_hooks(fault_server: Any) -> None:
    seen: list[str | None] = []

    async def hook(request: httpx2.Request) -> None:
        seen.append(request.headers.get("x-team"))

    own = httpx2.AsyncClient(headers={"x-team": "search"}, event_hooks={"request": [hook]})
    client = quietly(
        lambda: stallproof.openai.AsyncOpenAI(
            api_key=KEY, base_url=fault_server.url(), http_client=own, timeout=BUDGET
        )
    )
    async with client:
        assert client._client is own
        r = await client.chat.completions.create(model="m", messages=MSGS)
        assert r.choices[0].message.content
        assert seen == ["search"]
        assert isinstance(own._transport, stallproof.AsyncTransport2)
        assert client.engine is own._transport.engine
    assert own.is_closed


async def test_a_stall_through_the_callers_client_ends_on_time(fault_server: Any) -> None:
    own = httpx2.AsyncClient()
    client = quietly(
        lambda: stallproof.openai.AsyncOpenAI(
            api_key=KEY,
            base_url=fault_server.url("sse_stall", after=1, hold=10),
            http_client=own,
            timeout=BUDGET,
            retry=None,
        )
    )
    clock = SentClock(client)
    async with client:
        with pytest.raises(openai.APITimeoutError) as info:
            async for _ in await client.chat.completions.create(
                model="m", messages=MSGS, stream=True
            ):
                pass
        assert isinstance(info.value.__cause__, stallproof.IdleTimeout)
        assert clock.elapsed() <= BUDGET.first_token + BUDGET.idle + MARGIN
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}


async def test_requests_go_through_the_callers_mounts(fault_server: Any) -> None:
    mount = CountingTransport()
    own = httpx2.AsyncClient(mounts={"http://": mount})
    client = quietly(
        lambda: stallproof.anthropic.AsyncAnthropic(
            api_key=KEY,
            base_url=fault_server.url("half_open", hold=10).removesuffix("/v1"),
            http_client=own,
            timeout=BUDGET,
            retry=None,
        )
    )
    clock = SentClock(client)
    async with client:
        with pytest.raises(anthropic.APITimeoutError) as info:
            await client.messages.create(model="claude-test", max_tokens=16, messages=MSGS)
        assert isinstance(info.value.__cause__, stallproof.FirstTokenTimeout)
        assert clock.elapsed() <= BUDGET.first_token + MARGIN
        assert mount.sent == 1
        assert sdk_pool_held(client) == {"requests": 0, "active": 0}


async def test_the_legacy_httpx_client_too(fault_server: Any) -> None:
    own = httpx.AsyncClient(headers={"x-team": "search"})
    client = quietly(
        lambda: stallproof.openai.AsyncOpenAI(
            api_key=KEY, base_url=fault_server.url(), http_client=own, timeout=BUDGET
        )
    )
    async with client:
        r = await client.chat.completions.create(model="m", messages=MSGS)
        assert r.choices[0].message.content


def test_the_pool_warning_is_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stallproof._wire._httpx_pool, "_warned", False)
    with pytest.warns(RuntimeWarning, match="every bound holds") as caught:
        stallproof.openai.AsyncOpenAI(api_key=KEY, http_client=httpx2.AsyncClient())
    assert caught[0].filename == __file__  # it points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stallproof.openai.AsyncOpenAI(api_key=KEY, http_client=httpx2.AsyncClient())


def test_anything_but_an_httpx_client_is_refused() -> None:
    with pytest.raises(stallproof.InvalidRequestError, match=r"httpx2\.AsyncClient"):
        stallproof.openai.AsyncOpenAI(api_key=KEY, http_client=object())  # type: ignore[arg-type]
    with pytest.raises(stallproof.InvalidRequestError, match=r"httpx2\.AsyncClient"):
        stallproof.anthropic.AsyncAnthropic(api_key=KEY, http_client=httpx.AsyncClient())  # type: ignore[arg-type]
