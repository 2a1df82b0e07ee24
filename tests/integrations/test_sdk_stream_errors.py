"""What a caller of an SDK face catches when a bound fires or the connection fails
mid-stream: exactly the SDK's ``APITimeoutError`` / ``APIConnectionError``, its
``__cause__`` the stallproof error — whatever the SDK version (openai < 3.4 lets the
transport's error through its stream iterator; later versions wrap it), the same for both
faces, and the same as before the first byte.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

import stallproof
import stallproof.anthropic
import stallproof.openai

from ..support.clients import KEY, sdk_pool_held
from ..support.sdk_catalogue import BUDGET
from ..support.timing import MARGIN, SentClock

pytestmark = pytest.mark.anyio
MSGS: Any = [{"role": "user", "content": "hi"}]
# fault (with its parameters) -> the SDK class's name, and the stallproof cause.
MID_STREAM = {
    "sse_stall": ({"after": 2}, "APITimeoutError", stallproof.IdleTimeout),
    "cut_after": ({"bytes": 1500}, "APIConnectionError", stallproof.TruncatedResponse),
}


async def stream_openai(url: str) -> Any:
    client = stallproof.openai.AsyncOpenAI(api_key=KEY, base_url=url, timeout=BUDGET, retry=None)
    clock = SentClock(client)
    events = 0
    async with client:
        try:
            async for _ in await client.chat.completions.create(
                model="m", messages=MSGS, stream=True
            ):
                events += 1
        except Exception as e:
            assert events > 0, "the failure came before the stream was returned"
            assert sdk_pool_held(client) == {"requests": 0, "active": 0}
            return e, clock.elapsed()
    raise AssertionError("the stream ended without an error")


async def stream_anthropic(url: str) -> Any:
    client = stallproof.anthropic.AsyncAnthropic(
        api_key=KEY, base_url=url.removesuffix("/v1"), timeout=BUDGET, retry=None
    )
    clock = SentClock(client)
    events = 0
    async with client:
        try:
            async for _ in await client.messages.create(
                model="claude-test", max_tokens=64, messages=MSGS, stream=True
            ):
                events += 1
        except Exception as e:
            assert events > 0, "the failure came before the stream was returned"
            assert sdk_pool_held(client) == {"requests": 0, "active": 0}
            return e, clock.elapsed()
    raise AssertionError("the stream ended without an error")


@pytest.mark.parametrize("sdk", [openai, anthropic], ids=["openai", "anthropic"])
@pytest.mark.parametrize("fault", sorted(MID_STREAM))
async def test_a_mid_stream_failure_is_the_sdks_own_class(
    fault: str, sdk: Any, fault_server: Any
) -> None:
    params, name, cause = MID_STREAM[fault]
    url = fault_server.url(fault, hold=10, **params)
    error, elapsed = await (stream_openai if sdk is openai else stream_anthropic)(url)
    assert type(error) is getattr(sdk, name)  # the SDK's class itself, not a subclass
    assert isinstance(error.__cause__, cause)
    assert elapsed <= BUDGET.total + MARGIN
