"""instructor: a hardened AsyncOpenAI, patched by ``instructor.from_openai``."""

from __future__ import annotations

from typing import Any

import openai
import pydantic
import pytest

from ..support.timing import stopwatch
from .conftest import (
    BUDGET,
    LATE,
    MID_STREAM,
    MODEL,
    ROOMY,
    STALLS,
    Hardened,
    Stall,
    require,
    stallproof_cause,
)

pytestmark = [pytest.mark.frameworks, pytest.mark.anyio]
MESSAGES = [{"role": "user", "content": "hello there"}]


class Echo(pydantic.BaseModel):
    text: str  # the fault server answers a tool call with {"text": ...}


@pytest.fixture
def instructor() -> Any:
    return require("instructor", "instructor is not installed (stallproof[frameworks])")


def recipe(instructor: Any, client: openai.AsyncOpenAI) -> Any:
    return instructor.from_openai(client)


async def run(structured: Any, stream: bool) -> str:
    if not stream:
        echo = await structured.chat.completions.create(
            model=MODEL, response_model=Echo, messages=MESSAGES, max_retries=0
        )
        return str(echo.text)
    last = None
    async for partial in structured.chat.completions.create_partial(
        model=MODEL, response_model=Echo, messages=MESSAGES, max_retries=0
    ):
        last = partial
    return str(last.text if last is not None else "")


@pytest.mark.parametrize("stream", [False, True])
async def test_healthy_answer(
    instructor: Any, hardened: Hardened, fault_scope: Any, stream: bool
) -> None:
    structured = recipe(instructor, hardened.openai(fault_scope.url(), ROOMY))
    assert (await run(structured, stream)).startswith("echo:")


@pytest.mark.parametrize("stall", STALLS, ids=repr)
async def test_stall_ends_within_budget(
    instructor: Any, hardened: Hardened, fault_scope: Any, attempts: Any, stall: Stall
) -> None:
    structured = recipe(instructor, hardened.openai(stall.url(fault_scope)))
    # instructor wraps what the SDK raised in its InstructorRetryException, even with no
    # retries; a stall mid-stream comes through as the transport's timeout.
    errors = require("instructor.core", "instructor is not installed")
    retry = errors.InstructorRetryException
    error = retry if not stall.mid_stream else (retry, *MID_STREAM)
    with stopwatch() as elapsed, pytest.raises(error) as info:
        await run(structured, stall.stream)
    assert elapsed[0] <= BUDGET.total + LATE
    assert stallproof_cause(info.value).bound == stall.bound
    assert attempts(fault_scope) == 1
