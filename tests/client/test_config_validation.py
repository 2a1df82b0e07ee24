"""Every configuration object validates through one module (`stallproof._validate`): the
same rules (no bools for numbers, every number finite) and one message shape that names the
parameter, what it must be and the value given."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

import stallproof
from stallproof import Breaker, Limits, Pacer, Retry, RetryBudget, Timeouts

BAD: list[tuple[Any, dict[str, Any], str]] = [
    (Timeouts, {"connect": 0}, "Timeouts.connect"),
    (Timeouts, {"total": math.inf}, "Timeouts.total"),
    (Timeouts, {"read": True}, "Timeouts.read"),
    (Limits, {"max_connections": 0}, "Limits.max_connections"),
    (Limits, {"max_line_bytes": 1.5}, "Limits.max_line_bytes"),
    (Limits, {"keepalive_expiry": math.nan}, "Limits.keepalive_expiry"),
    (Retry, {"attempts": 0}, "Retry.attempts"),
    (Retry, {"attempts": True}, "Retry.attempts"),
    (Retry, {"backoff_base": math.nan}, "Retry.backoff_base"),
    (Retry, {"retry_after_max": -1}, "Retry.retry_after_max"),
    (Retry, {"statuses": frozenset({700})}, "Retry.statuses"),
    (RetryBudget, {"max_tokens": 0}, "RetryBudget.max_tokens"),
    (RetryBudget, {"token_ratio": math.inf}, "RetryBudget.token_ratio"),
    (Pacer, {"max_concurrent": 0}, "Pacer.max_concurrent"),
    (Pacer, {"requests_per_minute": math.inf}, "Pacer.requests_per_minute"),
    (Pacer, {"adaptive": 1}, "Pacer.adaptive"),
    (Pacer, {"max_concurrent": 2, "min_concurrent": 3}, "Pacer.min_concurrent"),
    (Pacer, {"decrease_factor": 1}, "Pacer.decrease_factor"),
    (Pacer, {"weights": {"a": 1000}}, "Pacer.weights"),
    (Breaker, {"fail_max": False}, "Breaker.fail_max"),
    (Breaker, {"reset_timeout": math.inf}, "Breaker.reset_timeout"),
    (Breaker, {"per_model": "yes"}, "Breaker.per_model"),
]


@pytest.mark.parametrize(("cls", "kwargs", "name"), BAD, ids=[b[2] for b in BAD])
def test_bad_config_names_the_parameter_and_the_value(
    cls: Any, kwargs: dict[str, Any], name: str
) -> None:
    with pytest.raises(stallproof.InvalidRequestError) as caught:
        cls(**kwargs)
    message = str(caught.value)
    assert message.startswith(name) or f" {name}" in message
    assert " must be " in message
    assert repr(next(iter(kwargs.values()))) in message or "got" in message


def test_good_config_is_accepted_as_given() -> None:
    assert Timeouts(connect=1).connect == 1.0
    assert Limits(max_connections=2, max_keepalive_connections=2).max_connections == 2
    assert Retry(attempts=1, retry_after_max=0).retry_after_max == 0
    assert Pacer(max_concurrent=2, min_concurrent=2, weights={"a": 100}).min_concurrent == 2
    assert Breaker(fail_max=1, reset_timeout=0.5).reset_timeout == 0.5


def test_the_pool_keeps_every_connection_it_may_open_idle_by_default() -> None:
    # 64 agents calling at once must not close and reopen connections every round (at the
    # old default of 20 idle, 44 of 64 were closed each round).
    assert Limits().max_keepalive_connections is None
    assert Limits().idle_connections == Limits().max_connections == 100
    assert Limits(max_connections=10).idle_connections == 10
    assert Limits(max_connections=10, max_keepalive_connections=3).idle_connections == 3
    assert dataclasses.replace(Limits(), max_connections=5).idle_connections == 5
    with pytest.raises(stallproof.InvalidRequestError, match="max_keepalive_connections"):
        Limits(max_connections=10, max_keepalive_connections=11)
