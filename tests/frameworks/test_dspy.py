"""dspy on its litellm engine: litellm's client session is a stallproof httpx client, and a
``stallproof.deadline()`` bounds a whole step, dspy's own retries included."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import stallproof

from ..support.timing import stopwatch
from .conftest import (
    BUDGET,
    HALF_OPEN,
    KEY,
    LATE,
    MODEL,
    Hardened,
    require,
    stallproof_cause,
)

pytestmark = [pytest.mark.frameworks, pytest.mark.anyio]


@pytest.fixture
def dspy(hardened: Hardened) -> Iterator[Any]:
    lib = require("dspy", "dspy is not installed (stallproof[frameworks])")
    litellm: Any = require("litellm", "litellm is not installed (stallproof[frameworks])")
    before = litellm.aclient_session
    litellm.suppress_debug_info = True
    litellm.aclient_session = hardened.http_client()  # dspy's litellm engine sends through it
    yield lib
    litellm.aclient_session = before


def recipe(dspy: Any, base_url: str, **settings: Any) -> Any:
    settings.setdefault("num_retries", 0)
    return dspy.LM(
        f"openai/{MODEL}",
        engine="litellm",  # the recipe reaches dspy through litellm; see docs/frameworks.md
        api_base=base_url,
        api_key=KEY,
        cache=False,
        **settings,
    )


async def test_healthy_answer(dspy: Any, fault_scope: Any) -> None:
    lm = recipe(dspy, fault_scope.url())
    answers = await lm.acall("hello there")
    assert str(answers[0]).startswith("echo:")


async def test_stall_ends_within_budget(dspy: Any, fault_scope: Any, attempts: Any) -> None:
    lm = recipe(dspy, HALF_OPEN.url(fault_scope))
    # dspy turns litellm's Timeout into its own LMTimeoutError.
    errors = require("dspy.utils.exceptions", "dspy is not installed")
    with stopwatch() as elapsed, pytest.raises(errors.LMTimeoutError) as info:
        await lm.acall("hello there")
    assert elapsed[0] <= BUDGET.total + LATE
    assert stallproof_cause(info.value).bound == HALF_OPEN.bound
    assert attempts(fault_scope) == 1


async def test_deadline_bounds_the_step_with_dspys_retries(
    dspy: Any, fault_scope: Any, attempts: Any
) -> None:
    # dspy's default: litellm retries 3 times with backoff; each attempt's budget is fresh.
    # The deadline over the step ends all of it.
    lm = recipe(dspy, HALF_OPEN.url(fault_scope), num_retries=3)
    step = 2.0
    with (
        stopwatch() as elapsed,
        pytest.raises(stallproof.DeadlineExceeded) as info,
        stallproof.deadline(step, name="dspy step"),
    ):
        await lm.acall("hello there")
    assert elapsed[0] <= step + LATE
    assert "dspy step" in str(info.value)
    assert attempts(fault_scope) >= 2  # dspy did retry, inside the step's budget
