"""haystack: ``OpenAIChatGenerator`` given stallproof's SDK faces as its ``client`` and
``async_client``, run with ``.run`` (sync) and ``.run_async`` (async), each inside
``stallproof.deadline()``.

What not to use: ``http_client_kwargs={"transport": ...}``. haystack builds both of its
clients from those kwargs, an ``httpx.Client`` and an ``httpx.AsyncClient``, so one
transport lands under the wrong kind of client and breaks that side (an async transport
under the sync client breaks ``.run()``). Set the two clients instead: the generator builds
its own only when they are None (``warm_up`` / ``warm_up_async``).
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import (
    KEY,
    MODEL,
    TURN_STALLS,
    Hardened,
    Stall,
    aturn_ends_in_time,
    require,
    turn_ends_in_time,
)

pytestmark = [pytest.mark.frameworks, pytest.mark.anyio]


@pytest.fixture
def haystack() -> Any:
    require("haystack", "haystack-ai is not installed (stallproof[frameworks])")
    import haystack.components.generators.chat
    import haystack.dataclasses
    import haystack.utils

    return haystack


def recipe(haystack: Any, hardened: Hardened, base_url: str) -> Any:
    generator = haystack.components.generators.chat.OpenAIChatGenerator(
        model=MODEL,
        api_base_url=base_url,
        api_key=haystack.utils.Secret.from_token(KEY),
        max_retries=0,
    )
    generator.client = hardened.sync_face(base_url)  # .run
    generator.async_client = hardened.async_face(base_url)  # .run_async
    return generator


def messages(haystack: Any) -> list[Any]:
    return [haystack.dataclasses.ChatMessage.from_user("hello there")]


def test_healthy_sync(haystack: Any, hardened_sync: Hardened, fault_scope: Any) -> None:
    out = recipe(haystack, hardened_sync, fault_scope.url()).run(messages(haystack))
    assert str(out["replies"][0].text).startswith("echo:")


async def test_healthy_async(haystack: Any, hardened: Hardened, fault_scope: Any) -> None:
    out = await recipe(haystack, hardened, fault_scope.url()).run_async(messages(haystack))
    assert str(out["replies"][0].text).startswith("echo:")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
def test_sync_turn_ends_in_time(
    haystack: Any, hardened_sync: Hardened, fault_scope: Any, stall: Stall
) -> None:
    generator = recipe(haystack, hardened_sync, stall.url(fault_scope))
    turn_ends_in_time(lambda: generator.run(messages(haystack)), "haystack run")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
async def test_async_turn_ends_in_time(
    haystack: Any, hardened: Hardened, fault_scope: Any, stall: Stall
) -> None:
    generator = recipe(haystack, hardened, stall.url(fault_scope))
    await aturn_ends_in_time(lambda: generator.run_async(messages(haystack)), "haystack run")
