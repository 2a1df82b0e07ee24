"""Never run: mypy --strict reads it to check the API from a user's side (see `make typecheck`)."""

from __future__ import annotations

import httpx2

import stallproof


async def user_code() -> None:
    timeouts = stallproof.Timeouts(connect=2, total=30).replace(idle=10)
    async with stallproof.Client(base_url="http://127.0.0.1:8000/v1", timeout=timeouts) as client:
        resp = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.1
        )
        text: str | None = resp.choices[0].message.content
        calls = resp.choices[0].message.tool_calls or []
        names: list[str] = [c.function.name for c in calls if c.type == "function"]
        total: int | None = resp.usage.total_tokens if resp.usage else None

        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True, timeout=5.0
        )
        async with stream:
            async for chunk in stream:
                piece: str | None = chunk.choices[0].delta.content if chunk.choices else None
                del piece
        try:
            await client.chat.completions.create(model="m", messages=[])
        except stallproof.TimeoutException as e:
            bound: str = e.bound
            elapsed: float = e.elapsed
            del bound, elapsed
        except stallproof.APIStatusError as e:
            status: int = e.status_code
            del status
        del text, names, total


async def drop_in(client: stallproof.Client) -> None:
    """What code written for openai.AsyncOpenAI checks against: openai's own types."""
    import httpx
    import openai
    import pydantic
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

    class Transcript(pydantic.BaseModel):
        completion: ChatCompletion

    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    resp: ChatCompletion = await client.chat.completions.create(
        model="m", messages=messages, temperature=0.5, max_tokens=5
    )
    Transcript(completion=resp)
    content: str | None = resp.choices[0].message.content
    created: int = resp.created  # not Optional, as in openai
    # A typo is a mypy error, as with openai (and a TypeError at run time).
    await client.chat.completions.create(model="m", messages=messages, max_token=2)  # type: ignore[call-overload]
    await client.chat.completions.create(model="m", messages=messages, temperature="hot")  # type: ignore[call-overload]
    fast = client.with_options(max_retries=0, timeout=httpx.Timeout(5.0))
    raw = await fast.chat.completions.with_raw_response.create(model="m", messages=messages)
    del raw
    page = await client.models.list()
    ids: list[str] = [m.id for m in page.data]
    vectors = await client.embeddings.create(model="e", input=["a"])
    first: list[float] = vectors.data[0].embedding
    try:
        await client.chat.completions.create(model="m", messages=messages)
    except openai.RateLimitError as e:
        status: int = e.status_code
        server_id: str | None = e.request_id
        del status, server_id
    except openai.APITimeoutError as e:
        request: httpx2.Request = e.request
        del request
    # The stream helper without a response_format, as with openai: no annotation needed.
    async with client.chat.completions.stream(model="m", messages=messages) as events:
        async for event in events:
            del event
    await client.close()
    del content, created, ids, first


async def sdk_face_code() -> None:
    import openai
    from openai.types.chat import ChatCompletion

    import stallproof.anthropic
    import stallproof.openai

    client = stallproof.openai.AsyncOpenAI(
        api_key="sk-...", timeout=stallproof.Timeouts(total=30), retry=stallproof.Retry()
    )
    fast: stallproof.openai.AsyncOpenAI = client.with_options(timeout=5, max_retries=1)
    sdk: openai.AsyncOpenAI = fast  # still the SDK's own client
    resp: ChatCompletion = await sdk.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    calls: tuple[stallproof.InflightCall, ...] = client.inflight()
    engine: stallproof.Engine = client.engine
    claude = stallproof.anthropic.AsyncAnthropic(api_key="k", timeout=30)
    same: stallproof.Engine = claude.with_options(timeout=10).engine
    del resp, calls, engine, same


def sync_code() -> None:
    import httpx
    import openai
    from openai.types.chat import ChatCompletion

    import stallproof.anthropic
    import stallproof.openai

    client = stallproof.openai.OpenAI(api_key="sk-...", timeout=30)
    sdk: openai.OpenAI = client.with_options(timeout=5)
    with stallproof.deadline(60, name="turn"):
        resp: ChatCompletion = sdk.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    calls: tuple[stallproof.InflightCall, ...] = client.inflight()
    stock = openai.OpenAI(http_client=stallproof.sync_http_client2(timeout=30), max_retries=0)
    raw = httpx.Client(transport=stallproof.Transport(timeout=30))
    legacy: httpx.Client = stallproof.sync_http_client(timeout=30)
    claude: stallproof.Engine = stallproof.anthropic.Anthropic(api_key="k", timeout=30).engine
    del resp, calls, stock, raw, legacy, claude


async def fleet_code() -> None:
    shared = stallproof.RedisState("redis://127.0.0.1:6379/0", prefix="openai", fail="closed")
    client = stallproof.Client(
        base_url="http://127.0.0.1:8000/v1",
        pacer=stallproof.Pacer(requests_per_minute=600, shared=shared),
        breaker=stallproof.Breaker(fail_max=5, shared=shared),
    )
    try:
        await client.chat.completions.create(model="m", messages=[])
    except stallproof.SharedStateUnavailable as e:
        reason: str = e.reason
        del reason
    state = client.pacer_state()
    where: str | None = state.shared if state else None
    fleet: list[str | None] = [c.shared for c in client.inflight()]
    del where, fleet
    await client.aclose()
