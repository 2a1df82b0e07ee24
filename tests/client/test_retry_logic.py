"""Backoff, budget and breaker logic on virtual time (trio's MockClock) and fixed numbers.

Nothing here sleeps for real: a 30 s open circuit costs nothing.
"""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

import anyio
import pytest
import trio.testing

import stallproof
from stallproof._breaker import Circuit
from stallproof._call import Call
from stallproof._retry import RetryTokens, make_retrying

virtual_time = pytest.mark.parametrize(
    "anyio_backend",
    [
        pytest.param(
            ("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}), id="trio-mockclock"
        )
    ],
)


# -- Retry policy --------------------------------------------------------------------------


def test_full_jitter_windows_double_up_to_the_cap() -> None:
    r = stallproof.Retry(backoff_base=0.5, backoff_max=8.0)
    assert [r.backoff(n, 0.999999) for n in range(1, 8)] == pytest.approx(
        [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0], rel=1e-5
    )
    assert r.backoff(3, 0.0) == 0.0
    assert r.backoff(3, 0.5) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": 2.5}, "attempts"),
        ({"backoff_base": -1}, "backoff_base"),
        ({"backoff_max": float("inf")}, "backoff_max"),
        ({"statuses": {99}}, "statuses"),
        ({"statuses": {"503"}}, "statuses"),
    ],
)
def test_retry_validates(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match=match):
        stallproof.Retry(**kwargs)


def _status(code: int, **headers: str) -> stallproof.APIStatusError:
    cls = stallproof._exceptions.status_error_class(code)
    return cls("x", status_code=code, body=None, headers=headers)


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (_status(503), True),
        (_status(529), True),
        (_status(429), True),
        (_status(409), True),
        (_status(400), False),
        (_status(422), False),
        (_status(404, **{"x-should-retry": "true"}), False),
        (_status(418, **{"x-should-retry": "true"}), True),
        (_status(503, **{"x-should-retry": "false"}), False),
        (stallproof.ConnectError("x"), True),
        (stallproof.ConnectionLost("x"), True),
        (stallproof.TruncatedResponse("x"), True),
        (stallproof.FirstTokenTimeout(limit=1, elapsed=1), True),
        (stallproof.PoolTimeout(limit=1, elapsed=1), True),
        (stallproof.TotalTimeout(limit=1, elapsed=1), False),
        (stallproof.MalformedResponse("x"), False),
        (stallproof.ResponseTooLarge("x", limit=1), False),
        (stallproof.CircuitOpen("x", upstream="u", retry_in=1), False),
        (stallproof.InvalidRequestError("x"), False),
        (ValueError("not ours"), False),
    ],
)
def test_what_is_retryable(error: BaseException, retryable: bool) -> None:
    assert stallproof.Retry().retryable(error) is retryable


# -- Retry budget --------------------------------------------------------------------------


def test_budget_allows_four_retries_from_full_then_recovers_with_successes() -> None:
    bucket = RetryTokens(stallproof.RetryBudget(max_tokens=10, token_ratio=0.1))
    assert [bucket.record_failure() for _ in range(6)] == [True] * 4 + [False] * 2
    assert bucket.tokens == 4
    for _ in range(10):
        bucket.record_success()
    assert bucket.tokens == pytest.approx(5.0)
    assert bucket.record_failure() is False  # 4.0: still at or under half
    for _ in range(30):
        bucket.record_success()
    assert bucket.tokens == pytest.approx(7.0)
    assert bucket.record_failure() is True
    for _ in range(1000):
        bucket.record_success()
    assert bucket.tokens == 10  # never above max


def test_budget_validates() -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="token_ratio"):
        stallproof.RetryBudget(token_ratio=0)


# -- The tenacity loop on virtual time -------------------------------------------------------


@virtual_time
async def test_backoff_sleeps_are_the_seeded_jitter(anyio_backend: Any) -> None:
    policy = stallproof.Retry(attempts=4, backoff_base=1.0, backoff_max=10.0)
    call = Call(stallproof.Timeouts(total=100), "sp-test", stream=False)
    starts: list[float] = []

    async def attempt() -> str:
        starts.append(anyio.current_time())
        if len(starts) < 4:
            raise stallproof.ConnectionLost("reset")
        return "ok"

    rng = random.Random(7)
    twin = random.Random(7)
    expected_u = [twin.random() for _ in range(3)]
    retrying = make_retrying(policy, call, None, rng=rng)
    assert await retrying(attempt) == "ok"
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == pytest.approx([policy.backoff(n + 1, u) for n, u in enumerate(expected_u)])


@virtual_time
async def test_retry_after_is_clamped_and_must_fit(anyio_backend: Any) -> None:
    policy = stallproof.Retry(attempts=3, retry_after_max=10)
    call = Call(stallproof.Timeouts(total=14), "sp-test", stream=False)
    starts: list[float] = []

    async def attempt() -> str:
        starts.append(anyio.current_time())
        if len(starts) == 1:
            raise _status_with_retry_after(503, 120.0)  # clamped to 10, fits in 14
        if len(starts) == 2:
            raise _status_with_retry_after(429, 5.0)  # 4 s left: cannot fit
        return "ok"

    retrying = make_retrying(policy, call, None, rng=random.Random(0))
    with pytest.raises(stallproof.RetryWouldExceedDeadline) as info:
        await retrying(attempt)
    assert starts[1] - starts[0] == pytest.approx(10.0)
    assert info.value.retry_after == 5.0
    assert info.value.remaining == pytest.approx(4.0)
    assert anyio.current_time() - starts[1] < 1e-6  # failed at once, no sleep


def _status_with_retry_after(code: int, seconds: float) -> stallproof.APIStatusError:
    cls = stallproof._exceptions.status_error_class(code)
    return cls("x", status_code=code, body=None, headers={}, retry_after=seconds)


@virtual_time
async def test_last_attempt_reraises_its_own_error(anyio_backend: Any) -> None:
    call = Call(stallproof.Timeouts(total=30), "sp-test", stream=False)

    async def attempt() -> str:
        raise _status_with_retry_after(503, 1.0)

    retrying = make_retrying(stallproof.Retry(attempts=2), call, None, rng=random.Random(0))
    with pytest.raises(stallproof.InternalServerError):
        await retrying(attempt)


# -- Breaker state machine on virtual time ---------------------------------------------------


def _circuit(**kwargs: Any) -> Circuit:
    return Circuit("http://up/v1", stallproof.Breaker(**kwargs))


async def _a_cancellation() -> BaseException:
    """A real cancellation exception of the running backend (trio's has no constructor)."""
    caught: list[BaseException] = []
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as e:
            caught.append(e)
            raise
    return caught[0]


async def _fail(circuit: Circuit, error: BaseException | None = None) -> None:
    (await circuit.admit(deadline=math.inf)).failure(
        error or stallproof.ConnectionLost("x"), deadline_expired=False
    )


@virtual_time
async def test_breaker_opens_after_fail_max_then_lets_exactly_one_probe(
    anyio_backend: Any,
) -> None:
    circuit = _circuit(fail_max=3, reset_timeout=30)
    for _ in range(3):
        await _fail(circuit)
    assert circuit.state == "open"
    with pytest.raises(stallproof.CircuitOpen) as info:
        await circuit.admit(deadline=math.inf)
    assert info.value.retry_in == pytest.approx(30)
    await anyio.sleep(29.9)
    with pytest.raises(stallproof.CircuitOpen):
        await circuit.admit(deadline=math.inf)
    await anyio.sleep(0.2)
    probe = await circuit.admit(deadline=math.inf)
    assert probe.probe and circuit.state == "half-open"
    for _ in range(5):  # everyone else waits for the probe's verdict
        with pytest.raises(stallproof.CircuitOpen) as info:
            await circuit.admit(deadline=math.inf)
        assert info.value.retry_in == 0
    probe.success()
    assert circuit.state == "closed"
    (await circuit.admit(deadline=math.inf)).success()


@virtual_time
async def test_failed_probe_reopens_for_another_reset_timeout(anyio_backend: Any) -> None:
    circuit = _circuit(fail_max=1, reset_timeout=10)
    await _fail(circuit)
    await anyio.sleep(10)
    await _fail(circuit)  # the probe
    assert circuit.state == "open"
    assert circuit.snapshot().retry_in == pytest.approx(10)


@virtual_time
async def test_cancellation_and_caller_errors_do_not_open_it(anyio_backend: Any) -> None:
    circuit = _circuit(fail_max=2)
    cancelled = await _a_cancellation()
    for _ in range(10):
        (await circuit.admit(deadline=math.inf)).failure(cancelled, deadline_expired=False)
        (await circuit.admit(deadline=math.inf)).failure(_status(400), deadline_expired=False)
        (await circuit.admit(deadline=math.inf)).failure(_status(422), deadline_expired=False)
    assert circuit.state == "closed"
    # Our own deadline expiring is the upstream being too slow: that counts.
    (await circuit.admit(deadline=math.inf)).failure(cancelled, deadline_expired=True)
    (await circuit.admit(deadline=math.inf)).failure(cancelled, deadline_expired=True)
    assert circuit.state == "open"


@virtual_time
async def test_cancelled_probe_frees_the_probe_slot(anyio_backend: Any) -> None:
    circuit = _circuit(fail_max=1, reset_timeout=5)
    await _fail(circuit)
    await anyio.sleep(5)
    probe = await circuit.admit(deadline=math.inf)
    probe.failure(await _a_cancellation(), deadline_expired=False)
    assert circuit.state == "half-open"
    (await circuit.admit(deadline=math.inf)).success()  # a new probe may go
    assert circuit.state == "closed"


@virtual_time
async def test_429_with_retry_after_opens_for_that_long(anyio_backend: Any) -> None:
    circuit = _circuit(fail_max=5, reset_timeout=30, max_open=100)
    (await circuit.admit(deadline=math.inf)).failure(
        _status_with_retry_after(429, 7.0), deadline_expired=False
    )
    assert circuit.state == "open"
    assert circuit.snapshot().retry_in == pytest.approx(7.0)
    await anyio.sleep(7)
    (await circuit.admit(deadline=math.inf)).success()
    assert circuit.state == "closed"
    (await circuit.admit(deadline=math.inf)).failure(
        _status_with_retry_after(429, 1000.0), deadline_expired=False
    )
    assert circuit.snapshot().retry_in == pytest.approx(100)  # clamped to max_open


def test_breaker_validates() -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="fail_max"):
        stallproof.Breaker(fail_max=0)
    with pytest.raises(stallproof.InvalidRequestError, match="reset_timeout"):
        stallproof.Breaker(reset_timeout=float("nan"))
