"""llama-index: a hardened AsyncOpenAI handed to its OpenAI LLM.

llama-index-llms-openai cannot be installed next to openai 3 today (its newest release pins
``openai<3``; older ones pin llama-index-core 0.10, which pins ``tenacity<9`` against
stallproof's ``tenacity>=9``), so the ``frameworks`` extra leaves it out and these tests skip
saying so. The recipe is written for the openai 2.x it runs on (plain httpx); they run as
they are wherever it is installed.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from ..support.timing import stopwatch
from .conftest import BUDGET, HALF_OPEN, KEY, LATE, Hardened, require, stallproof_cause

pytestmark = [pytest.mark.frameworks, pytest.mark.anyio]
NOT_WITH_OPENAI_3 = (
    "llama-index-llms-openai needs openai<3 (and its older releases tenacity<9): it cannot "
    "be installed with openai 3 and stallproof, see docs/frameworks.md"
)


@pytest.fixture
def llama_openai() -> Any:
    return require("llama_index.llms.openai", NOT_WITH_OPENAI_3)


def recipe(llama_openai: Any, hardened: Hardened, base_url: str) -> Any:
    # openai 2.x runs on plain httpx: the httpx flavour of the engine.
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key=KEY, http_client=hardened.http_client(), max_retries=0
    )
    return llama_openai.OpenAI(
        model="gpt-4o-mini",  # a name llama-index knows; the fault server answers any
        api_base=base_url,
        api_key=KEY,
        async_openai_client=client,
        max_retries=0,  # llama-index's own retry decorator
    )


async def test_healthy_answer(llama_openai: Any, hardened: Hardened, fault_scope: Any) -> None:
    llm = recipe(llama_openai, hardened, fault_scope.url())
    assert str((await llm.acomplete("hello there")).text).startswith("echo:")


async def test_stall_ends_within_budget(
    llama_openai: Any, hardened: Hardened, fault_scope: Any, attempts: Any
) -> None:
    llm = recipe(llama_openai, hardened, HALF_OPEN.url(fault_scope))
    with stopwatch() as elapsed, pytest.raises(openai.APITimeoutError) as info:
        await llm.acomplete("hello there")
    assert elapsed[0] <= BUDGET.total + LATE
    assert stallproof_cause(info.value).bound == HALF_OPEN.bound
    assert attempts(fault_scope) == 1
