"""Agent frameworks take `stallproof.Client` itself where they take an ``openai.AsyncOpenAI``.

pydantic-ai, openai-agents and autogen-ext drive the client with their own arguments
(``NOT_GIVEN`` defaults, ``extra_headers``, ``stream_options``), check results against
openai's types and catch openai's errors; each runs a turn, streams a turn, and meets a
stalled server that the call's bound ends. All three are asyncio-only. (llama-index, the
fourth that takes an ``AsyncOpenAI``, cannot be installed next to openai 3:
test_llama_index.py says why.)
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

import stallproof

from ..support.clients import MakeClient, assert_pool_clean
from ..support.timing import MARGIN, stopwatch

pytestmark = [pytest.mark.frameworks, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # both frameworks run on asyncio only


MODEL = "fault-model"
ECHO = "echo: hello there"


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


async def test_pydantic_ai(fault_server: Any, make_client: MakeClient) -> None:
    from pydantic_ai import Agent

    try:
        from pydantic_ai.exceptions import ModelTimeoutError
    except ImportError:  # before pydantic-ai 2.39 it is a ModelAPIError, with ours behind
        from pydantic_ai.exceptions import ModelAPIError as ModelTimeoutError
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    def agent(client: stallproof.Client) -> Agent[None, str]:
        provider = OpenAIProvider(openai_client=client)  # type: ignore[arg-type, unused-ignore]
        return Agent(OpenAIChatModel(MODEL, provider=provider))

    client = make_client(fault_server.url())
    result = await agent(client).run("hello there")
    assert result.output.startswith(ECHO)
    async with agent(client).run_stream("hello there") as stream:
        assert (await stream.get_output()).startswith(ECHO)
    stalled = make_client(fault_server.url("stall_headers", hold=5), timeout=0.5)
    # pydantic-ai maps openai.APITimeoutError, which ours is, to its ModelTimeoutError.
    with stopwatch() as elapsed, pytest.raises(ModelTimeoutError) as info:
        await agent(stalled).run("hello there")
    assert elapsed[0] <= 0.5 + MARGIN
    assert any(isinstance(e, stallproof.TotalTimeout) for e in _chain(info.value))
    assert_pool_clean(client)
    assert_pool_clean(stalled)


async def test_openai_agents(fault_server: Any, make_client: MakeClient) -> None:
    from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner

    def agent(client: stallproof.Client) -> Agent[None]:
        model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)  # type: ignore[arg-type, unused-ignore]
        return Agent(name="a", instructions="be brief", model=model)

    config = RunConfig(tracing_disabled=True)
    client = make_client(fault_server.url())
    result = await Runner.run(agent(client), "hello there", run_config=config)
    assert str(result.final_output).startswith(ECHO)
    streamed = Runner.run_streamed(agent(client), "hello there", run_config=config)
    async for _ in streamed.stream_events():
        pass
    assert str(streamed.final_output).startswith(ECHO)
    stalled = make_client(fault_server.url("stall_headers", hold=5), timeout=0.5)
    with stopwatch() as elapsed, pytest.raises(openai.APITimeoutError) as info:
        await Runner.run(agent(stalled), "hello there", run_config=config)
    assert elapsed[0] <= 0.5 + MARGIN
    assert any(isinstance(e, stallproof.TotalTimeout) for e in _chain(info.value))
    assert_pool_clean(client)
    assert_pool_clean(stalled)


# autogen dumps the ParsedChatCompletion, whose generic ``parsed`` pydantic serialises with
# this warning: openai.AsyncOpenAI's own parse() result does the same.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_autogen_ext(fault_server: Any, make_client: MakeClient) -> None:
    """autogen-ext's `BaseOpenAIChatCompletionClient` takes the client as is; structured
    output goes through ``client.beta.chat.completions.parse``."""
    from autogen_core.models import CreateResult, ModelInfo, UserMessage
    from autogen_ext.models.openai import BaseOpenAIChatCompletionClient
    from pydantic import BaseModel

    class Answer(BaseModel):
        text: str

    info = ModelInfo(
        vision=False,
        function_calling=True,
        json_output=True,
        family="unknown",
        structured_output=True,
    )

    def model(client: stallproof.Client) -> Any:
        return BaseOpenAIChatCompletionClient(
            client,  # type: ignore[arg-type, unused-ignore]
            create_args={"model": MODEL},
            model_info=info,
        )

    messages = [UserMessage(content="hello there", source="user")]
    client = make_client(fault_server.url())
    result = await model(client).create(messages)
    assert str(result.content).startswith(ECHO)
    parts = [part async for part in model(client).create_stream(messages)]
    assert isinstance(parts[-1], CreateResult) and str(parts[-1].content).startswith(ECHO)
    structured = await model(client).create(messages, json_output=Answer)
    assert Answer.model_validate_json(str(structured.content))
    stalled = make_client(fault_server.url("stall_headers", hold=5), timeout=0.5)
    with stopwatch() as elapsed, pytest.raises(openai.APITimeoutError) as info_:
        await model(stalled).create(messages)
    assert elapsed[0] <= 0.5 + MARGIN
    assert any(isinstance(e, stallproof.TotalTimeout) for e in _chain(info_.value))
    assert_pool_clean(client)
    assert_pool_clean(stalled)
