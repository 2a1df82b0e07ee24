"""llama-index (openai 2): its OpenAI LLM given stallproof's SDK faces as ``openai_client``
(``complete``, sync) and ``async_openai_client`` (``acomplete``), each inside
``stallproof.deadline()``.

llama-index-llms-openai 0.8 pins ``openai<3``: it runs in the openai 2 venv of
``make test-frameworks`` (the ``frameworks-openai2`` extra), where the faces build their
clients on plain httpx.
"""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import (
    KEY,
    TURN_STALLS,
    Hardened,
    Stall,
    aturn_ends_in_time,
    require,
    turn_ends_in_time,
)

pytestmark = [pytest.mark.frameworks, pytest.mark.anyio]


@pytest.fixture
def llama_openai() -> Any:
    return require(
        "llama_index.llms.openai",
        "llama-index-llms-openai is not installed (stallproof[frameworks-openai2], openai < 3)",
    )


def recipe(llama_openai: Any, hardened: Hardened, base_url: str) -> Any:
    return llama_openai.OpenAI(
        model="gpt-4o-mini",  # a name llama-index knows; the fault server answers any
        api_base=base_url,
        api_key=KEY,
        openai_client=hardened.sync_face(base_url),  # complete / chat
        async_openai_client=hardened.async_face(base_url),  # acomplete / achat
        max_retries=0,  # llama-index's own retry decorator
    )


def test_healthy_sync(llama_openai: Any, hardened_sync: Hardened, fault_scope: Any) -> None:
    llm = recipe(llama_openai, hardened_sync, fault_scope.url())
    assert str(llm.complete("hello there").text).startswith("echo:")


async def test_healthy_async(llama_openai: Any, hardened: Hardened, fault_scope: Any) -> None:
    llm = recipe(llama_openai, hardened, fault_scope.url())
    assert str((await llm.acomplete("hello there")).text).startswith("echo:")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
def test_sync_turn_ends_in_time(
    llama_openai: Any, hardened_sync: Hardened, fault_scope: Any, stall: Stall
) -> None:
    llm = recipe(llama_openai, hardened_sync, stall.url(fault_scope))
    turn_ends_in_time(lambda: llm.complete("hello there"), "llama-index complete")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
async def test_async_turn_ends_in_time(
    llama_openai: Any, hardened: Hardened, fault_scope: Any, stall: Stall
) -> None:
    llm = recipe(llama_openai, hardened, stall.url(fault_scope))
    await aturn_ends_in_time(lambda: llm.acomplete("hello there"), "llama-index acomplete")
