"""langgraph: a graph whose model node is langchain's ChatOpenAI on stallproof clients, run
with ``.invoke`` (sync: ``http_client``) and ``.ainvoke`` (async: ``http_async_client``),
each turn inside ``stallproof.deadline()``."""

from __future__ import annotations

from typing import Any

import pytest

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

pytestmark = [pytest.mark.frameworks, pytest.mark.anyio]


@pytest.fixture
def libs() -> Any:
    require("langgraph.graph", "langgraph is not installed (stallproof[frameworks])")
    require("langchain_openai", "langchain-openai is not installed (stallproof[frameworks])")
    import langchain_core.runnables
    import langchain_openai
    import langgraph.graph

    return langgraph.graph, langchain_openai, langchain_core.runnables


def recipe(libs: Any, hardened: Hardened, base_url: str) -> Any:
    graph_lib, langchain_openai, runnables = libs
    llm = langchain_openai.ChatOpenAI(
        model=MODEL,
        base_url=base_url,
        api_key=KEY,
        http_client=hardened.sync_http_client(),  # .invoke
        http_async_client=hardened.async_http_client(),  # .ainvoke
        max_retries=0,  # the SDK's retries would each restart the budget
    )

    def call(state: Any) -> Any:
        return {"messages": [llm.invoke(state["messages"])]}

    async def acall(state: Any) -> Any:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    graph = graph_lib.StateGraph(graph_lib.MessagesState)
    graph.add_node("model", runnables.RunnableLambda(call, afunc=acall))
    graph.add_edge(graph_lib.START, "model")
    graph.add_edge("model", graph_lib.END)
    return graph.compile()


TURN = {"messages": [("user", "hello there")]}


def test_healthy_sync(libs: Any, hardened_sync: Hardened, fault_scope: Any) -> None:
    out = recipe(libs, hardened_sync, fault_scope.url()).invoke(TURN)
    assert str(out["messages"][-1].content).startswith("echo:")


async def test_healthy_async(libs: Any, hardened: Hardened, fault_scope: Any) -> None:
    out = await recipe(libs, hardened, fault_scope.url()).ainvoke(TURN)
    assert str(out["messages"][-1].content).startswith("echo:")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
def test_sync_turn_ends_in_time(
    libs: Any, hardened_sync: Hardened, fault_scope: Any, stall: Stall
) -> None:
    app = recipe(libs, hardened_sync, stall.url(fault_scope))
    turn_ends_in_time(lambda: app.invoke(TURN), "langgraph invoke")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
async def test_async_turn_ends_in_time(
    libs: Any, hardened: Hardened, fault_scope: Any, stall: Stall
) -> None:
    app = recipe(libs, hardened, stall.url(fault_scope))
    await aturn_ends_in_time(lambda: app.ainvoke(TURN), "langgraph ainvoke")
