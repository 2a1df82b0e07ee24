"""agno: an Agent on ``OpenAIChat`` given stallproof's SDK faces as its clients, run with
``.run`` (sync: ``client``) and ``.arun`` (async: ``async_client``), each turn inside
``stallproof.deadline()``. agno does not raise for a failed run: it returns its result with
status error and the SDK's message as content.

What not to use: ``OpenAIChat(http_client=...)`` takes one plain-httpx client for one side
only (an ``httpx.Client`` for ``.run`` or an ``httpx.AsyncClient`` for ``.arun``); an
``httpx2`` client (``stallproof.http_client2()``), or the other side's kind, is ignored
with a log line and the SDK's default client, unbounded, is used. The test below proves
that for ``http_client2()``.
"""

from __future__ import annotations

from typing import Any

import pytest

import stallproof

from .conftest import (
    KEY,
    MODEL,
    NO_HEADERS,
    TURN_STALLS,
    Hardened,
    Stall,
    aturn_ends_in_time,
    require,
    turn_ends_in_time,
)

pytestmark = [pytest.mark.frameworks, pytest.mark.anyio]


@pytest.fixture
def agno() -> Any:
    require("agno.agent", "agno is not installed (stallproof[frameworks])")
    import agno.agent
    import agno.models.openai

    return agno


def recipe(agno: Any, hardened: Hardened, base_url: str) -> Any:
    model = agno.models.openai.OpenAIChat(
        id=MODEL,
        base_url=base_url,
        api_key=KEY,
        client=hardened.sync_face(base_url),  # .run
        async_client=hardened.async_face(base_url),  # .arun
    )
    return agno.agent.Agent(model=model, telemetry=False)


def failed(out: Any) -> bool:
    # agno reports a failed run in its result (a log line, no exception): status "ERROR",
    # the SDK's error message as content ("Request timed out.").
    status = getattr(out, "status", None)
    return str(getattr(status, "value", "")).lower() == "error" and "timed out" in str(out.content)


def test_healthy_sync(agno: Any, hardened_sync: Hardened, fault_scope: Any) -> None:
    out = recipe(agno, hardened_sync, fault_scope.url()).run("hello there")
    assert str(out.content).startswith("echo:")


async def test_healthy_async(agno: Any, hardened: Hardened, fault_scope: Any) -> None:
    out = await recipe(agno, hardened, fault_scope.url()).arun("hello there")
    assert str(out.content).startswith("echo:")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
def test_sync_turn_ends_in_time(
    agno: Any, hardened_sync: Hardened, fault_scope: Any, stall: Stall
) -> None:
    agent = recipe(agno, hardened_sync, stall.url(fault_scope))
    turn_ends_in_time(lambda: agent.run("hello there"), "agno run", reported=failed)


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
async def test_async_turn_ends_in_time(
    agno: Any, hardened: Hardened, fault_scope: Any, stall: Stall
) -> None:
    agent = recipe(agno, hardened, stall.url(fault_scope))
    await aturn_ends_in_time(lambda: agent.arun("hello there"), "agno arun", reported=failed)


def test_an_httpx2_http_client_is_ignored(agno: Any, fault_scope: Any) -> None:
    # What not to use: agno checks for plain httpx and drops anything else.
    model = agno.models.openai.OpenAIChat(
        id=MODEL,
        base_url=NO_HEADERS.url(fault_scope),
        api_key=KEY,
        http_client=stallproof.sync_http_client2(timeout=1),
    )
    client = model.get_client()
    assert client._client._transport.__class__.__module__.split(".")[0] != "stallproof"
    client.close()
