"""pydantic-ai: a hardened AsyncOpenAI handed to its OpenAI provider."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from ..support.timing import stopwatch
from .conftest import (
    BUDGET,
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
def pai() -> Any:
    return require("pydantic_ai", "pydantic-ai is not installed (stallproof[frameworks])")


def recipe(client: openai.AsyncOpenAI) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client))
    return Agent(model, instructions="Answer briefly.")


async def run(agent: Any, stream: bool) -> str:
    if not stream:
        return str((await agent.run("hello there")).output)
    async with agent.run_stream("hello there") as result:
        return "".join([part async for part in result.stream_text(delta=True)])


@pytest.mark.parametrize("stream", [False, True])
async def test_healthy_answer(pai: Any, hardened: Hardened, fault_scope: Any, stream: bool) -> None:
    assert (await run(recipe(hardened.openai(fault_scope.url())), stream)).startswith("echo:")


@pytest.mark.parametrize("stall", STALLS, ids=repr)
async def test_stall_ends_within_budget(
    pai: Any, hardened: Hardened, fault_scope: Any, attempts: Any, stall: Stall
) -> None:
    from pydantic_ai.exceptions import ModelAPIError

    agent = recipe(hardened.openai(stall.url(fault_scope)))
    # pydantic-ai turns the SDK's APITimeoutError into its ModelAPIError; mid-stream the
    # transport's timeout comes through as it is.
    error = ModelAPIError if not stall.mid_stream else (ModelAPIError, *MID_STREAM)
    with stopwatch() as elapsed, pytest.raises(error) as info:
        await run(agent, stall.stream)
    assert elapsed[0] <= BUDGET.total + LATE
    assert stallproof_cause(info.value).bound == stall.bound
    assert attempts(fault_scope) == 1
