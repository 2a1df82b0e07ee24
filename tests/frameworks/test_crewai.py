"""crewai (openai 2): its native OpenAI LLM building stallproof's SDK faces, a crew's
``kickoff()`` (sync) and ``kickoff_async()`` inside ``stallproof.deadline()``.

What not to use: ``LLM(client_params={"http_client": ...})``. crewai hands the same
``client_params`` to both ``openai.OpenAI`` and ``openai.AsyncOpenAI``, which it builds
at once, so a sync http client fails the async one (and the LLM) at construction.
Override the two builders instead (``_build_sync_client`` / ``_build_async_client``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from .conftest import (
    BUDGET,
    KEY,
    MODEL,
    TURN_STALLS,
    Hardened,
    Stall,
    aturn_ends_in_time,
    require,
    turn_ends_in_time,
)

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.anyio,
    # crewai's lazy modules (crewai.rag) on import.
    pytest.mark.filterwarnings("ignore:Cannot set an attribute on 'crewai:ImportWarning"),
    # crewai 1.15 warns about its own fields and those of its dependencies, none of which
    # this recipe sets.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

# No telemetry to a host this machine cannot reach.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")


@pytest.fixture
def crewai() -> Any:
    require("crewai", "crewai is not installed (stallproof[frameworks-openai2])")
    import crewai
    from crewai.llms.providers.openai.completion import OpenAICompletion

    return crewai, OpenAICompletion


def recipe(crewai: Any, hardened: Hardened, base_url: str) -> Any:
    import stallproof.openai

    crewai, openai_completion = crewai

    class HardenedOpenAI(openai_completion):  # type: ignore[misc,valid-type]
        # crewai's OpenAI clients, built as stallproof's faces: the engine underneath,
        # the SDK's own retries off.
        def _build_sync_client(self) -> Any:
            params = {**self._get_client_params(), "timeout": BUDGET, "max_retries": 0}
            client = stallproof.openai.OpenAI(**params)
            hardened.clients.append(client._client)
            return client

        def _build_async_client(self) -> Any:
            params = {**self._get_client_params(), "timeout": BUDGET, "max_retries": 0}
            client = stallproof.openai.AsyncOpenAI(**params)
            hardened.clients.append(client._client)
            return client

    llm = HardenedOpenAI(model=MODEL, base_url=base_url, api_key=KEY)
    agent = crewai.Agent(
        role="helper", goal="answer", backstory="brief", llm=llm, max_retry_limit=0
    )
    task = crewai.Task(description="hello there", expected_output="a reply", agent=agent)
    return crewai.Crew(agents=[agent], tasks=[task], verbose=False)


def test_healthy_sync(crewai: Any, hardened_sync: Hardened, fault_scope: Any) -> None:
    out = recipe(crewai, hardened_sync, fault_scope.url()).kickoff()
    assert "echo:" in str(out.raw)


async def test_healthy_async(crewai: Any, hardened: Hardened, fault_scope: Any) -> None:
    out = await recipe(crewai, hardened, fault_scope.url()).kickoff_async()
    assert "echo:" in str(out.raw)


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
def test_sync_turn_ends_in_time(
    crewai: Any, hardened_sync: Hardened, fault_scope: Any, stall: Stall
) -> None:
    crew = recipe(crewai, hardened_sync, stall.url(fault_scope))
    turn_ends_in_time(crew.kickoff, "crewai kickoff")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
async def test_async_turn_ends_in_time(
    crewai: Any, hardened: Hardened, fault_scope: Any, stall: Stall
) -> None:
    crew = recipe(crewai, hardened, stall.url(fault_scope))
    await aturn_ends_in_time(crew.kickoff_async, "crewai kickoff_async")
