"""autogen-ext: OpenAIChatCompletionClient passing a stallproof httpx2 client to its SDK."""

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
def autogen() -> Any:
    return require("autogen_ext.models.openai", "autogen-ext[openai] is not installed")


def recipe(autogen: Any, base_url: str, http_client: Any) -> Any:
    from autogen_core.models import ModelInfo

    return autogen.OpenAIChatCompletionClient(
        model=MODEL,
        base_url=base_url,
        api_key=KEY,
        # Every keyword AsyncOpenAI takes is passed on to it: the engine goes underneath.
        http_client=http_client,
        max_retries=0,
        model_info=ModelInfo(
            vision=False,
            function_calling=True,
            json_output=False,
            family="unknown",
            structured_output=False,
        ),
    )


async def run(client: Any, stream: bool) -> str:
    from autogen_core.models import CreateResult, UserMessage

    messages = [UserMessage(content="hello there", source="user")]
    if not stream:
        return str((await client.create(messages)).content)
    parts = [p async for p in client.create_stream(messages)]
    assert isinstance(parts[-1], CreateResult)
    return str(parts[-1].content)


@pytest.mark.parametrize("stream", [False, True])
async def test_healthy_answer(
    autogen: Any, hardened: Hardened, fault_scope: Any, stream: bool
) -> None:
    client = recipe(autogen, fault_scope.url(), hardened.http_client2())
    assert (await run(client, stream)).startswith("echo:")
    await client.close()


@pytest.mark.parametrize("stall", STALLS, ids=repr)
async def test_stall_ends_within_budget(
    autogen: Any, hardened: Hardened, fault_scope: Any, attempts: Any, stall: Stall
) -> None:
    client = recipe(autogen, stall.url(fault_scope), hardened.http_client2())
    error = openai.APITimeoutError if not stall.mid_stream else MID_STREAM
    with stopwatch() as elapsed, pytest.raises(error) as info:
        await run(client, stall.stream)
    assert elapsed[0] <= BUDGET.total + LATE
    assert stallproof_cause(info.value).bound == stall.bound
    assert attempts(fault_scope) == 1
    await client.close()
