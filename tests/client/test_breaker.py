"""The circuit breaker over real sockets: fail fast while open, one probe, cancellation."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam

import stallproof

from ..support.clients import MakeClient

pytestmark = pytest.mark.anyio

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


def fault(spec: str, key: str) -> dict[str, str]:
    return {"X-Fault": f"{spec};key={key}"}


async def _fail_calls(client: stallproof.Client, n: int, key: str) -> None:
    for _ in range(n):
        with pytest.raises(stallproof.InternalServerError):
            await client.chat.completions.create(
                model="m", messages=MSGS, extra_headers=fault("status;code=503", key)
            )


async def test_open_circuit_fails_fast_without_touching_the_server(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(
        fault_server.url(), breaker=stallproof.Breaker(fail_max=3, reset_timeout=30)
    )
    await _fail_calls(client, 3, fault_key)
    (circuit,) = client.circuits().values()
    assert circuit.state == "open" and circuit.failures >= 3
    before = fault_server.stats()
    # How fast a refusal is, is for benchmarks/breaker.py; here, that none reaches the server.
    for _ in range(200):
        with pytest.raises(stallproof.CircuitOpen) as info:
            await client.chat.completions.create(
                model="m", messages=MSGS, extra_headers=fault("status;code=503", fault_key)
            )
    assert 29 < info.value.retry_in <= 30
    after = fault_server.stats()
    assert after.connections_accepted == before.connections_accepted
    assert after.requests == before.requests
    assert fault_server.key_stats(fault_key).requests == 3


async def test_after_the_open_time_exactly_one_probe_reaches_the_server(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(
        fault_server.url(), breaker=stallproof.Breaker(fail_max=2, reset_timeout=0.5)
    )
    await _fail_calls(client, 2, fault_key)
    await anyio.sleep(0.6)
    outcomes: list[str] = []

    async def one() -> None:
        try:
            # The probe finds a slow but healthy server; everyone else arrives meanwhile.
            await client.chat.completions.create(
                model="m",
                messages=MSGS,
                extra_headers={"X-Fault": f"healthy;delay=0.3;key={fault_key}"},
            )
            outcomes.append("ok")
        except stallproof.CircuitOpen:
            outcomes.append("open")

    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(one)
    assert sorted(outcomes) == ["ok"] + ["open"] * 9
    assert fault_server.key_stats(fault_key).requests == 3
    (circuit,) = client.circuits().values()
    assert circuit.state == "closed"
    # Closed again: calls flow.
    await client.chat.completions.create(model="m", messages=MSGS)


async def test_cancelling_calls_does_not_open_it(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(
        fault_server.url("half_open", hold=10), breaker=stallproof.Breaker(fail_max=2)
    )
    for _ in range(6):
        with anyio.move_on_after(0.1):
            await client.chat.completions.create(model="m", messages=MSGS)
    (circuit,) = client.circuits().values()
    assert circuit.state == "closed" and circuit.failures == 0


async def test_total_deadline_on_a_stalled_server_counts_as_a_failure(
    fault_server: Any, make_client: MakeClient
) -> None:
    client = make_client(
        fault_server.url("half_open", hold=10), breaker=stallproof.Breaker(fail_max=2)
    )
    for _ in range(2):
        with pytest.raises(stallproof.TotalTimeout):
            await client.chat.completions.create(model="m", messages=MSGS, timeout=0.2)
    with pytest.raises(stallproof.CircuitOpen):
        await client.chat.completions.create(model="m", messages=MSGS, timeout=0.2)


async def test_429_retry_after_holds_the_circuit_open(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), breaker=stallproof.Breaker(fail_max=5))
    with pytest.raises(stallproof.RateLimitError):
        await client.chat.completions.create(
            model="m",
            messages=MSGS,
            extra_headers=fault("status;code=429;retry_after=20", fault_key),
        )
    with pytest.raises(stallproof.CircuitOpen) as info:
        await client.chat.completions.create(model="m", messages=MSGS)
    assert 19 < info.value.retry_in <= 20


async def test_circuits_can_be_per_model(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(fault_server.url(), breaker=stallproof.Breaker(fail_max=1, per_model=True))
    with pytest.raises(stallproof.InternalServerError):
        await client.chat.completions.create(
            model="big", messages=MSGS, extra_headers=fault("status;code=503", fault_key)
        )
    with pytest.raises(stallproof.CircuitOpen):
        await client.chat.completions.create(model="big", messages=MSGS)
    resp = await client.chat.completions.create(model="small", messages=MSGS)
    assert resp.choices
    states = {k.split("model=")[1]: v.state for k, v in client.circuits().items()}
    assert states == {"big": "open", "small": "closed"}


async def test_retries_stop_at_an_open_circuit(
    fault_server: Any, fault_key: str, make_client: MakeClient
) -> None:
    client = make_client(
        fault_server.url(),
        retry=stallproof.Retry(attempts=5, backoff_base=0.01),
        breaker=stallproof.Breaker(fail_max=2, reset_timeout=30),
    )
    with pytest.raises(stallproof.CircuitOpen):
        await client.chat.completions.create(
            model="m", messages=MSGS, extra_headers=fault("status;code=503", fault_key)
        )
    assert fault_server.key_stats(fault_key).requests == 2
