"""langchain-openai: ChatOpenAI building its AsyncOpenAI on a stallproof httpx2 client."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from ..support.timing import stopwatch
from .conftest import (
    BUDGET,
    KEY,
    LATE,
    MID_STREAM,
    MODEL,
    STALLS,
    Hardened,
    Stall,
    require,
    stallproof_cause,
)

pytestmark = [pytest.mark.frameworks, pytest.mark.anyio]


@pytest.fixture
def chat_openai() -> Any:
    lib = require("langchain_openai", "langchain-openai is not installed (stallproof[frameworks])")
    return lib.ChatOpenAI


def recipe(chat_openai: Any, base_url: str, http_client: Any) -> Any:
    return chat_openai(
        model=MODEL,
        base_url=base_url,
        api_key=KEY,
        http_async_client=http_client,  # async calls go through stallproof's engine
        max_retries=0,  # the SDK's retries would each restart the budget
    )


async def run(llm: Any, stream: bool) -> str:
    if not stream:
        return str((await llm.ainvoke("hello there")).content)
    return "".join([str(chunk.content) async for chunk in llm.astream("hello there")])


@pytest.mark.parametrize("stream", [False, True])
async def test_healthy_answer(
    chat_openai: Any, hardened: Hardened, fault_scope: Any, stream: bool
) -> None:
    llm = recipe(chat_openai, fault_scope.url(), hardened.http_client2())
    assert (await run(llm, stream)).startswith("echo:")


@pytest.mark.parametrize("stall", STALLS, ids=repr)
async def test_stall_ends_within_budget(
    chat_openai: Any, hardened: Hardened, fault_scope: Any, attempts: Any, stall: Stall
) -> None:
    llm = recipe(chat_openai, stall.url(fault_scope), hardened.http_client2())
    error = openai.APITimeoutError if not stall.mid_stream else MID_STREAM
    with stopwatch() as elapsed, pytest.raises(error) as info:
        await run(llm, stall.stream)
    assert elapsed[0] <= BUDGET.total + LATE
    assert stallproof_cause(info.value).bound == stall.bound
    assert attempts(fault_scope) == 1
