"""google-adk: an ``LlmAgent`` on ``LiteLlm`` (litellm's openai provider), litellm's
``aclient_session`` a stallproof httpx client, run with ``Runner.run_async`` and with the
sync ``Runner.run``, each inside ``stallproof.deadline()``.

ADK's ``Runner.run`` runs the async agent with ``asyncio.run`` in a new thread, in a copy of
the caller's context (so a sync ``deadline()`` reaches it), on a new event loop each time:
an engine belongs to the loop of its first call, so give each ``run()`` a fresh
``aclient_session``, or call ``run_async`` from one loop of your own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import stallproof

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

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.anyio,
    # litellm's own typing shims, as in test_litellm.py.
    pytest.mark.filterwarnings(
        "ignore:Item '.*' on TypedDict class .* is using the .ReadOnly. qualifier:UserWarning"
    ),
]
APP, USER = "recipes", "user"


@pytest.fixture
def adk() -> Iterator[Any]:
    require("google.adk", "google-adk is not installed (stallproof[frameworks])")
    os.environ.setdefault("ADK_DISABLE_TELEMETRY", "1")
    import google.adk.agents
    import google.adk.models.lite_llm
    import google.adk.runners
    import google.genai.types
    import litellm

    before = litellm.aclient_session
    litellm.suppress_debug_info = True
    yield google
    litellm.aclient_session = before


def recipe(adk: Any, hardened: Hardened, base_url: str) -> Any:
    import litellm

    # litellm builds its openai clients on plain httpx: the httpx flavour of the engine.
    litellm.aclient_session = hardened.http_client()
    model = adk.adk.models.lite_llm.LiteLlm(
        model=f"openai/{MODEL}", api_base=base_url, api_key=KEY, max_retries=0
    )
    agent = adk.adk.agents.LlmAgent(name="helper", model=model, instruction="Answer briefly.")
    return adk.adk.runners.InMemoryRunner(agent=agent, app_name=APP)


def timed_out(error: Any) -> bool:
    # ADK re-raises litellm's error from its worker without the cause chain: litellm.Timeout
    # (an openai.APITimeoutError), or the deadline's own DeadlineExceeded.
    return isinstance(error, (openai.APITimeoutError, stallproof.DeadlineExceeded))


def message(adk: Any) -> Any:
    types = adk.genai.types
    return types.Content(role="user", parts=[types.Part(text="hello there")])


def text_of(events: list[Any]) -> str:
    parts = [p.text for e in events if e.content for p in e.content.parts or [] if p.text]
    return "".join(parts)


async def run_async(adk: Any, runner: Any) -> str:
    session = await runner.session_service.create_session(app_name=APP, user_id=USER)
    events = [
        e
        async for e in runner.run_async(
            user_id=USER, session_id=session.id, new_message=message(adk)
        )
    ]
    return text_of(events)


def run_sync(adk: Any, runner: Any, session_id: str) -> str:
    events = list(runner.run(user_id=USER, session_id=session_id, new_message=message(adk)))
    return text_of(events)


async def new_session(runner: Any) -> str:
    return str((await runner.session_service.create_session(app_name=APP, user_id=USER)).id)


async def test_healthy_async(adk: Any, hardened: Hardened, fault_scope: Any) -> None:
    assert (await run_async(adk, recipe(adk, hardened, fault_scope.url()))).startswith("echo:")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
async def test_async_turn_ends_in_time(
    adk: Any, hardened: Hardened, fault_scope: Any, stall: Stall
) -> None:
    runner = recipe(adk, hardened, stall.url(fault_scope))
    await aturn_ends_in_time(lambda: run_async(adk, runner), "adk run_async", reported=timed_out)


def test_healthy_sync(adk: Any, hardened_sync: Hardened, fault_scope: Any) -> None:
    import anyio

    runner = recipe(adk, hardened_sync, fault_scope.url())
    session_id = anyio.run(new_session, runner)
    assert run_sync(adk, runner, session_id).startswith("echo:")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
def test_sync_turn_ends_in_time(
    adk: Any, hardened_sync: Hardened, fault_scope: Any, stall: Stall
) -> None:
    import anyio

    runner = recipe(adk, hardened_sync, stall.url(fault_scope))
    session_id = anyio.run(new_session, runner)
    turn_ends_in_time(lambda: run_sync(adk, runner, session_id), "adk run", reported=timed_out)
