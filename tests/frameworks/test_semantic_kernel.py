"""semantic-kernel (async only): ``OpenAIChatCompletion`` given stallproof's async SDK face
as its ``async_client``, a kernel prompt inside ``stallproof.deadline()``."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import (
    MODEL,
    TURN_STALLS,
    Hardened,
    Stall,
    aturn_ends_in_time,
    require,
)

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.anyio,
    # semantic-kernel 1.45's own models use a pydantic hook pydantic 2.11 deprecated.
    pytest.mark.filterwarnings(
        "ignore:The `__get_pydantic_core_schema__` method:DeprecationWarning"
    ),
]


@pytest.fixture
def sk() -> Any:
    require("semantic_kernel", "semantic-kernel is not installed (stallproof[frameworks])")
    import semantic_kernel
    import semantic_kernel.connectors.ai.open_ai

    return semantic_kernel


def recipe(sk: Any, hardened: Hardened, base_url: str) -> Any:
    service = sk.connectors.ai.open_ai.OpenAIChatCompletion(
        ai_model_id=MODEL, async_client=hardened.async_face(base_url)
    )
    kernel = sk.Kernel()
    kernel.add_service(service)
    return kernel


async def test_healthy_answer(sk: Any, hardened: Hardened, fault_scope: Any) -> None:
    kernel = recipe(sk, hardened, fault_scope.url())
    assert str(await kernel.invoke_prompt("hello there")).startswith("echo:")


@pytest.mark.parametrize("stall", TURN_STALLS, ids=repr)
async def test_turn_ends_in_time(
    sk: Any, hardened: Hardened, fault_scope: Any, stall: Stall
) -> None:
    kernel = recipe(sk, hardened, stall.url(fault_scope))
    await aturn_ends_in_time(lambda: kernel.invoke_prompt("hello there"), "semantic-kernel")
