"""openai-agents: a hardened AsyncOpenAI under its default Responses model class and under
the chat-completions one."""

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
def agents() -> Any:
    lib = require("agents", "openai-agents is not installed (pip install 'stallproof[frameworks]')")
    lib.set_tracing_disabled(True)  # no trace export to api.openai.com from a test
    return lib


def recipe(agents: Any, client: openai.AsyncOpenAI) -> Any:
    # For a server that speaks chat completions only: the chat-completions model class.
    model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    return agents.Agent(name="helper", instructions="Answer briefly.", model=model)


async def run(agents: Any, agent: Any, stream: bool) -> Any:
    if not stream:
        return await agents.Runner.run(agent, "hello there")
    result = agents.Runner.run_streamed(agent, "hello there")
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("stream", [False, True])
async def test_healthy_answer(
    agents: Any, hardened: Hardened, fault_scope: Any, stream: bool
) -> None:
    result = await run(agents, recipe(agents, hardened.openai(fault_scope.url())), stream)
    assert result.final_output.startswith("echo:")


@pytest.mark.parametrize("stall", STALLS, ids=repr)
async def test_stall_ends_within_budget(
    agents: Any, hardened: Hardened, fault_scope: Any, attempts: Any, stall: Stall
) -> None:
    agent = recipe(agents, hardened.openai(stall.url(fault_scope)))
    error = openai.APITimeoutError if not stall.mid_stream else MID_STREAM
    with stopwatch() as elapsed, pytest.raises(error) as info:
        await run(agents, agent, stall.stream)
    assert elapsed[0] <= BUDGET.total + LATE
    assert stallproof_cause(info.value).bound == stall.bound
    assert attempts(fault_scope) == 1


# -- the default: the Responses API ----------------------------------------------------


def responses_recipe(agents: Any, client: openai.AsyncOpenAI) -> Any:
    # The model class openai-agents uses by default (what `Agent(model="...")` builds
    # after `set_default_openai_client(client)`), over the hardened client.
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
    return agents.Agent(name="helper", instructions="Answer briefly.", model=model)


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_healthy_answer(
    agents: Any, hardened: Hardened, fault_scope: Any, stream: bool
) -> None:
    agent = responses_recipe(agents, hardened.openai(fault_scope.url()))
    result = await run(agents, agent, stream)
    assert result.final_output.startswith("echo:")


@pytest.mark.parametrize("stall", STALLS, ids=repr)
async def test_responses_stall_ends_within_budget(
    agents: Any, hardened: Hardened, fault_scope: Any, attempts: Any, stall: Stall
) -> None:
    agent = responses_recipe(agents, hardened.openai(stall.url(fault_scope)))
    error = openai.APITimeoutError if not stall.mid_stream else MID_STREAM
    with stopwatch() as elapsed, pytest.raises(error) as info:
        await run(agents, agent, stall.stream)
    assert elapsed[0] <= BUDGET.total + LATE
    assert stallproof_cause(info.value).bound == stall.bound
    assert attempts(fault_scope) == 1
