"""One translation of the SDKs' settings (`stallproof._faces._compat`), whatever major of
openai is installed: the HTTP library each SDK runs on, and the same value of ``timeout=``
or ``max_retries=`` means the same thing, and fails with the same message, in every face,
transport and the native `Client`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

import stallproof
import stallproof.anthropic
import stallproof.openai
from stallproof._faces._compat import http_library

from ..support.clients import KEY, OPENAI_HTTP

URL = "http://127.0.0.1:9/v1"

# Every place a caller hands stallproof an SDK-style timeout, as the bounds it ends with.
MAKERS: dict[str, Callable[..., stallproof.Timeouts]] = {
    "Client": lambda **kw: stallproof.Client(base_url=URL, api_key=KEY, **kw).timeout,
    "openai face": lambda **kw: (
        stallproof.openai.AsyncOpenAI(base_url=URL, api_key=KEY, **kw).timeouts
    ),
    "anthropic face": lambda **kw: (
        stallproof.anthropic.AsyncAnthropic(base_url=URL, api_key=KEY, **kw).timeouts
    ),
    "http_client": lambda **kw: stallproof.http_client(**kw)._transport.engine.timeout,  # type: ignore[attr-defined]
    "http_client2": lambda **kw: stallproof.http_client2(**kw)._transport.engine.timeout,  # type: ignore[attr-defined]
}


def test_each_sdk_runs_on_the_library_of_its_major() -> None:
    assert http_library(openai) is OPENAI_HTTP
    anthropic_major = int(anthropic.__version__.split(".")[0])
    assert http_library(anthropic) is (httpx2 if anthropic_major >= 1 else httpx)


@pytest.mark.parametrize("where", sorted(MAKERS))
@pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
def test_an_httpx_timeout_sets_the_four_phases_everywhere(where: str, lib: Any) -> None:
    got = MAKERS[where](timeout=lib.Timeout(7, connect=2))
    assert (got.connect, got.read, got.write, got.pool) == (2, 7, 7, 7)
    assert got.total == stallproof.Timeouts().total  # an httpx timeout has no total


@pytest.mark.parametrize("where", sorted(MAKERS))
def test_a_number_is_the_total_everywhere(where: str) -> None:
    assert MAKERS[where](timeout=12) == stallproof.Timeouts(total=12)


@pytest.mark.parametrize("where", sorted(MAKERS))
@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("30", r"^timeout must be a number of seconds \(the total budget\), a stallproof"),
        (-1, r"^timeout must be"),
        (httpx2.Timeout(5, connect=-1), r"^timeout\.connect must be"),
    ],
)
def test_a_bad_timeout_gets_one_message_everywhere(where: str, value: object, match: str) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match=match):
        MAKERS[where](timeout=value)


def test_none_is_the_defaults_for_the_faces_and_refused_by_the_client_constructor() -> None:
    for where in ("openai face", "anthropic face"):
        assert MAKERS[where](timeout=None) == stallproof.Timeouts()
    for where in ("Client", "http_client", "http_client2"):
        with pytest.raises(stallproof.InvalidRequestError, match="would let a call run forever"):
            MAKERS[where](timeout=None)


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: stallproof.Client(base_url=URL, api_key=KEY, **kw),
        lambda **kw: stallproof.openai.AsyncOpenAI(base_url=URL, api_key=KEY, **kw),
        lambda **kw: stallproof.anthropic.AsyncAnthropic(base_url=URL, api_key=KEY, **kw),
    ],
    ids=["Client", "openai face", "anthropic face"],
)
def test_max_retries_is_read_the_same_everywhere(make: Callable[..., Any]) -> None:
    with pytest.raises(stallproof.InvalidRequestError, match=r"^max_retries must be an int >= 0"):
        make(max_retries=-1)
    with pytest.raises(stallproof.InvalidRequestError, match=r"^pass retry= or max_retries="):
        make(max_retries=2, retry=stallproof.Retry())
    with pytest.raises(stallproof.InvalidRequestError, match=r"^retry must be a stallproof.Retry"):
        make(retry=3)
