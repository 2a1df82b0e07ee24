"""mirascope 2 (openai 2): an OpenAI completions provider whose ``client`` and
``async_client`` are stallproof's SDK faces, registered for ``openai/``; ``Model.call``
(sync) and ``Model.call_async`` inside ``stallproof.deadline()``.

mirascope builds its provider's two openai clients in the provider's constructor and
takes no http client: set the two clients on the provider, then register it.
"""

from __future__ import annotations

from collections.abc import Iterator
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
def mirascope() -> Iterator[Any]:
    require("mirascope.llm", "mirascope is not installed (stallproof[frameworks-openai2])")
    from mirascope import llm
    from mirascope.llm.providers import provider_registry
    from mirascope.llm.providers.openai.completions.provider import OpenAICompletionsProvider

    yield llm, OpenAICompletionsProvider
    provider_registry.reset_provider_registry()


def recipe(mirascope: Any, hardened: Hardened, base_url: str) -> Any:
    llm, provider_class = mirascope
    provider = provider_class(api_key=KEY, base_url=base_url)
    provider.client = hardened.sync_face(base_url)  # Model.call
    provider.async_client = hardened.async_face(base_url)  # Model.call_async
    llm.register_provider(provider, scope="openai/")
    return llm.Model(f"openai/{MODEL}")


def test_healthy_sync(mirascope: Any, hardened_sync: Hardened, fault_scope: Any) -> None:
    model = recipe(mirascope, hardened_sync, fault_scope.url())
    assert model.call("hello there").text().startswith("echo:")


async def test_healthy_async(mirascope: Any, hardened: Hardened, fault_scope: Any) -> None:
    model = recipe(mirascope, hardened, fault_scope.url())
    assert (await model.call_async("hello there")).text().startswith("echo:")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
def test_sync_turn_ends_in_time(
    mirascope: Any, hardened_sync: Hardened, fault_scope: Any, stall: Stall
) -> None:
    model = recipe(mirascope, hardened_sync, stall.url(fault_scope))
    turn_ends_in_time(lambda: model.call("hello there"), "mirascope call")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
async def test_async_turn_ends_in_time(
    mirascope: Any, hardened: Hardened, fault_scope: Any, stall: Stall
) -> None:
    model = recipe(mirascope, hardened, stall.url(fault_scope))
    await aturn_ends_in_time(lambda: model.call_async("hello there"), "mirascope call_async")
