"""litellm: it calls the openai SDK's internals, so stallproof reaches it from below: a
stallproof httpx client as ``litellm.aclient_session`` (every OpenAI-compatible call), or a
hardened AsyncOpenAI as ``client=`` (one call)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..support.timing import stopwatch
from .conftest import (
    BUDGET,
    KEY,
    LATE,
    MODEL,
    STALLS,
    Hardened,
    Stall,
    require,
    stallproof_cause,
)

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.anyio,
    # litellm's stream chunks use a TypedDict pydantic warns about, on every stream.
    pytest.mark.filterwarnings(
        "ignore:Item '.*' on TypedDict class .* is using the .ReadOnly. qualifier:UserWarning"
    ),
]
MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture
def litellm() -> Iterator[Any]:
    lib: Any = require("litellm", "litellm is not installed (stallproof[frameworks])")
    before = lib.aclient_session
    lib.suppress_debug_info = True  # no "Give Feedback" banner on every error
    yield lib
    lib.aclient_session = before


@pytest.fixture(params=["aclient_session", "client"])
def route(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def run(litellm: Any, hardened: Hardened, route: str, base_url: str, stream: bool) -> str:
    kwargs: dict[str, Any] = {"api_base": base_url, "api_key": KEY, "max_retries": 0}
    if route == "aclient_session":
        # litellm builds its openai clients on plain httpx: the httpx flavour of the engine.
        litellm.aclient_session = hardened.http_client()
    else:
        kwargs["client"] = hardened.openai(base_url)
    response = await litellm.acompletion(
        model=f"openai/{MODEL}", messages=MESSAGES, stream=stream, **kwargs
    )
    if not stream:
        return str(response.choices[0].message.content)
    return "".join([c.choices[0].delta.content or "" async for c in response if c.choices])


@pytest.mark.parametrize("stream", [False, True])
async def test_healthy_answer(
    litellm: Any, hardened: Hardened, fault_scope: Any, route: str, stream: bool
) -> None:
    assert (await run(litellm, hardened, route, fault_scope.url(), stream)).startswith("echo:")


@pytest.mark.parametrize("stall", STALLS, ids=repr)
async def test_stall_ends_within_budget(
    litellm: Any, hardened: Hardened, fault_scope: Any, attempts: Any, route: str, stall: Stall
) -> None:
    # litellm maps the SDK's timeout to its own Timeout (an openai.APITimeoutError); a stall
    # mid-stream becomes its MidStreamFallbackError. The stallproof error is in the chain.
    errors = require("litellm.exceptions", "litellm is not installed")
    error = errors.Timeout if not stall.mid_stream else errors.MidStreamFallbackError
    with stopwatch() as elapsed, pytest.raises(error) as info:
        await run(litellm, hardened, route, stall.url(fault_scope), stall.stream)
    assert elapsed[0] <= BUDGET.total + LATE
    assert stallproof_cause(info.value).bound == stall.bound
    assert attempts(fault_scope) == 1
