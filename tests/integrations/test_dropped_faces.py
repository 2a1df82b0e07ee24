"""A face stream dropped unread (or half read) gives back its pacer permit and its pool slot
at once, without a garbage collection.

The SDK's own stream object sat in a reference cycle (openai's ``AsyncStream`` holds a
generator that holds it), so a dropped one waited for a full collection, and with it the
call's permit: with ``max_concurrent=1``, 0 of 29 later calls got through. The collector is
off during these tests: what comes back, comes back by reference counting.
"""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import pytest

import stallproof
import stallproof.anthropic
import stallproof.openai

from ..support.clients import KEY, sdk_pool_held
from ..support.timing import wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.filterwarnings("ignore::ResourceWarning")]

MSGS: Any = [{"role": "user", "content": "hi"}]
DROPS = 29


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _face(face: str, url: str) -> tuple[Any, Callable[..., Awaitable[Any]]]:
    pacer = stallproof.Pacer(max_concurrent=1)
    if face == "openai":
        oa = stallproof.openai.AsyncOpenAI(
            api_key=KEY, base_url=url, timeout=2, retry=None, pacer=pacer
        )
        return oa, lambda **kw: oa.chat.completions.create(model="m", messages=MSGS, **kw)
    an = stallproof.anthropic.AsyncAnthropic(
        api_key=KEY, base_url=url.removesuffix("/v1"), timeout=2, retry=None, pacer=pacer
    )
    return an, lambda **kw: an.messages.create(model="m", max_tokens=5, messages=MSGS, **kw)


async def _open_and_drop(call: Callable[..., Awaitable[Any]], *, read: int) -> None:
    """A stream in a frame of its own, ``read`` events read, then dropped unclosed."""
    stream = await call(stream=True)
    for _ in range(read):
        await stream.__anext__()


@pytest.mark.parametrize("read", [0, 1], ids=["unread", "half-read"])
@pytest.mark.parametrize("face", ["openai", "anthropic"])
async def test_dropped_face_streams_give_their_permit_back_without_gc(
    face: str, read: int, fault_server: Any, no_gc: None
) -> None:
    client, call = _face(face, fault_server.url("healthy", tokens=4))
    async with client:
        through = 0
        for _ in range(DROPS):
            await _open_and_drop(call, read=read)
            await anyio.lowlevel.checkpoint()  # a half-read one is finalised on the loop
            await call()  # a PacerTimeout (after 2 s) while the dropped one holds the permit
            through += 1
        assert through == DROPS
        state = client.pacer_state()
        assert state is not None and state.in_use == 0, state
        await wait_until(
            lambda: sdk_pool_held(client) == {"requests": 0, "active": 0},
            what="no connection held",
        )
        assert gc.isenabled() is False  # nothing was collected behind the test's back
