"""smolagents (sync only): ``OpenAIModel`` building its ``openai.OpenAI`` on stallproof's
sync http client (``client_kwargs``), an agent step inside ``stallproof.deadline()``."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import (
    KEY,
    MODEL,
    TURN_STALLS,
    Hardened,
    Stall,
    require,
    turn_ends_in_time,
)

pytestmark = [pytest.mark.frameworks]


@pytest.fixture
def smolagents() -> Any:
    return require("smolagents", "smolagents is not installed (stallproof[frameworks])")


def recipe(smolagents: Any, hardened: Hardened, base_url: str) -> Any:
    return smolagents.OpenAIModel(
        model_id=MODEL,
        api_base=base_url,
        api_key=KEY,
        client_kwargs={
            "http_client": hardened.sync_http_client(),  # sync_http_client2() on openai 3
            "max_retries": 0,  # the SDK's retries would each restart the budget
        },
    )


def test_healthy_answer(smolagents: Any, hardened_sync: Hardened, fault_scope: Any) -> None:
    model = recipe(smolagents, hardened_sync, fault_scope.url())
    reply = model.generate([smolagents.ChatMessage(role="user", content="hello there")])
    assert str(reply.content).startswith("echo:")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
def test_agent_step_ends_in_time(
    smolagents: Any, hardened_sync: Hardened, fault_scope: Any, stall: Stall
) -> None:
    model = recipe(smolagents, hardened_sync, stall.url(fault_scope))
    agent = smolagents.ToolCallingAgent(tools=[], model=model, max_steps=1, verbosity_level=0)
    turn_ends_in_time(lambda: agent.run("hello there"), "smolagents run")
