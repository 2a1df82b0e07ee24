"""What the catalogue tests (the client's and the SDKs') share: the budget, the fault
parameters, and how an SDK's error is named (its class / the stallproof error behind it)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

import stallproof

# total leaves 0.5 s after first_token + idle: a content event that a loaded machine delivers
# just before first_token fires still ends in IdleTimeout, not in total (at 1.2 the margin was
# 0.1 s, and a busy CI runner crossed it).
BUDGET = stallproof.Timeouts(
    connect=1, read=1, write=1, pool=1, first_token=0.6, idle=0.5, total=1.6
)
# A case pinned to end at total (the faults that keep a body coming: endless_body,
# endless_line, the keep-alives non-stream) has one bound that could fire before it:
# first_token, which the fault's first byte (non-stream) or content event (stream) ends,
# at once or one `interval` in (sse_keepalive: 0.2 s, see PARAMS). From then on its bytes
# (non-stream: a newline or ping every 0.5 s at most) or content (stream: endless_body, every 10 ms)
# come at least twice as often as read (1 s between bytes) or idle (0.5 s between content
# events) asks, and a non-stream call arms no idle: only total is left. So its total keeps
# BUDGET's 0.5 s past the bound before it, first_token: 1.1 s, not 1.6 s. Not a budget for
# every non-stream call: the ReadTimeout cases end ~1.01 s in (read, 1 s after a last byte
# sent at once), which a total of 1.1 s would race; nor can read come down, as it must
# stay clear of first_token, which stall_headers and half_open end at (0.4 s apart now).
AT_TOTAL = BUDGET.replace(total=1.1)
LIMITS = stallproof.Limits(max_response_bytes=2 * 1024 * 1024, max_line_bytes=256 * 1024)
PARAMS: dict[str, dict[str, Any]] = {
    "huge_body": {"size": 8 * 1024 * 1024},
    "token_rate": {"tps": 50},
    # Slices of 32 bytes: a few hundred writes, which a loaded machine schedules within the
    # budget (8-byte slices, a thousand sleeps, did not always).
    "slicer": {"interval": 0.001, "size": 32},
    "rate_limit": {"limit": 1000},  # one shared bucket for every case here: never empty
    # Its first byte (non-stream: a newline) 0.4 s before first_token, not 0.1 s (the
    # default interval, 0.5 s): a starved server thread sending it late must not turn the
    # pinned TotalTimeout into a FirstTokenTimeout. (Stream: comments, never content.)
    "sse_keepalive": {"interval": 0.2},
}
TOOLS = [{"type": "function", "function": {"name": "save", "parameters": {"type": "object"}}}]
TOOL_FAULTS = {"tool_split", "index_gap", "tool_args_unclosed"}

OK = "ok"
T = "APITimeoutError/"
C = "APIConnectionError/"
# fault: (non-stream, stream) -> the SDK's error class / the stallproof error as its cause.
# stallproof's errors are openai's classes too: one the SDK lets through unwrapped is
# reported under the openai class it is an instance of.
_SDK_CLASSES = (openai.APITimeoutError, openai.APIConnectionError, openai.APIError)


def budget_for(outcome: str) -> stallproof.Timeouts:
    """The budget of a case pinned to ``outcome``: `AT_TOTAL` for one that ends at total
    (``TotalTimeout``, or a name ending with it), else `BUDGET`."""
    return AT_TOTAL if outcome.endswith("TotalTimeout") else BUDGET


def outcome_of(error: BaseException) -> str:
    if isinstance(error, stallproof.StallproofError):
        sdk = next(c for c in _SDK_CLASSES if isinstance(error, c))
        return f"{sdk.__name__}/{type(error).__name__}"
    cause = error.__cause__
    named = type(cause).__name__ if isinstance(cause, stallproof.StallproofError) else ""
    return f"{type(error).__name__}/{named}"


def named_error(error: BaseException | None) -> BaseException | None:
    """The stallproof error that ended a call: ``error`` itself, or its cause. Its repr in
    a timing assertion's message says what the engine measured (its ``elapsed``), so a
    late reading tells the engine's time from the caller's."""
    if error is None or isinstance(error, stallproof.StallproofError):
        return error
    return error.__cause__


def limit_of(error: BaseException, default: float) -> float:
    named = named_error(error)
    return named.limit if isinstance(named, stallproof.TimeoutException) else default


def warm_sdk_types(base_url: str, *, chat_only: bool = False) -> None:
    """One healthy call of each kind the SDK tests time (openai chat and Responses, plain
    and stream; anthropic Messages, plain and stream), through the faces, so that their
    timed calls do not pay the SDKs' first-use costs.

    The SDKs build their pydantic models lazily, on the first response of each kind: ~0.8 s
    of CPU for the Responses events on an idle machine, several seconds on a loaded one. A
    call whose events arrive during that work sees its deadline pass while the caller's own
    code holds the event loop, which no bound can preempt. Runs its own event loop:
    call it where none runs (a sync fixture). ``chat_only``: openai chat alone, what
    `stallproof.Client` times (the rest costs a test process ~2 s of CPU: anthropic's import
    and the Responses events).
    """
    import anyio

    import stallproof.openai

    if not chat_only:
        import stallproof.anthropic

    from .clients import KEY

    messages: Any = [{"role": "user", "content": "hi"}]

    async def calls() -> None:
        with anyio.fail_after(60):
            async with stallproof.openai.AsyncOpenAI(api_key=KEY, base_url=base_url) as ai:
                await ai.chat.completions.create(model="m", messages=messages)
                async for _ in await ai.chat.completions.create(
                    model="m", messages=messages, stream=True
                ):
                    pass
                if chat_only:
                    return
                await ai.responses.create(model="m", input="hi")
                async for _ in await ai.responses.create(model="m", input="hi", stream=True):
                    pass
            claude_url = base_url.removesuffix("/v1")
            async with stallproof.anthropic.AsyncAnthropic(api_key=KEY, base_url=claude_url) as a:
                await a.messages.create(model="m", max_tokens=16, messages=messages)
                async for _ in await a.messages.create(
                    model="m", max_tokens=16, messages=messages, stream=True
                ):
                    pass

    anyio.run(calls)


@pytest.fixture(scope="session", autouse=True)
def sdk_types_built(fault_server: Any) -> None:
    """Autouse in the integration group (its conftest imports it): once per test process,
    before the first timed call, `warm_sdk_types`."""
    warm_sdk_types(fault_server.url())


@pytest.fixture(scope="session", autouse=True)
def chat_types_built(fault_server: Any) -> None:
    """Autouse in the client group (its conftest imports it): `warm_sdk_types` for chat."""
    warm_sdk_types(fault_server.url(), chat_only=True)
