"""Odd values given to the constructors are `InvalidRequestError`s naming the parameter,
never a bare ValueError or TypeError from deep inside (found by fuzzing the constructors
of Client, Timeouts, Limits, Pacer and RedisState with values of every kind)."""

from __future__ import annotations

from typing import Any

import pytest

import stallproof

ODD: list[Any] = [-1, 0, float("nan"), float("inf"), "x", b"x", [], object(), True, 2**70]
IDS = [f"{type(v).__name__}-{i}" for i, v in enumerate(ODD)]  # the same on every worker


@pytest.mark.parametrize("value", ODD, ids=IDS)
def test_default_headers_that_are_not_a_mapping(value: Any) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match="default_headers must be"):
        stallproof.Client(base_url="http://127.0.0.1:9/v1", api_key="k", default_headers=value)


@pytest.mark.parametrize("value", ODD, ids=IDS)
def test_pacer_weights_that_are_not_a_mapping(value: Any) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match=r"Pacer\.weights must be"):
        stallproof.Pacer(max_concurrent=1, weights=value)


@pytest.mark.parametrize(
    "url",
    ["redis://[::1", "redis://h:99999/0", "redis://u:SECRET@h:99999/0", "http://h/", ""],
)
def test_a_redis_url_that_does_not_parse(url: str) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match=r"RedisState\.url must be") as e:
        stallproof.RedisState(url)
    assert "SECRET" not in str(e.value)


@pytest.mark.parametrize(
    "proxy", ["http://h:99999", "http://[::1", "socks9://h:1", "http://bad host:8"]
)
def test_a_proxy_url_that_cannot_be_used(proxy: str) -> None:
    with pytest.raises(stallproof.InvalidRequestError):
        stallproof.Client(base_url="http://127.0.0.1:9/v1", api_key="k", proxy=proxy)
