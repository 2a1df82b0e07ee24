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
