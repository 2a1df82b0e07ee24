"""Never run: mypy --strict reads it to check the API from a user's side (see `make typecheck`)."""

from __future__ import annotations

import stallproof


async def user_code() -> None:
    timeouts = stallproof.Timeouts(connect=2, total=30).replace(idle=10)
    async with stallproof.Client(base_url="http://127.0.0.1:8000/v1", timeout=timeouts) as client:
        resp = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], temperature=0.1
        )
        text: str | None = resp.choices[0].message.content
        calls = resp.choices[0].message.tool_calls or []
        names: list[str | None] = [c.function.name for c in calls]
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
