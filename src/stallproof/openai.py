"""`AsyncOpenAI` and `OpenAI`: the openai SDK's own clients, made impossible to hang.

A subclass of ``openai.AsyncOpenAI``: every resource, type, helper and error of the SDK
works as before (responses, embeddings, ``parse``, ``with_raw_response``...). What changes:

- every request goes through stallproof's engine (an `AsyncTransport2` under the SDK's
  ``httpx2.AsyncClient`` on openai >= 3, an `AsyncTransport` under an ``httpx.AsyncClient``
  on openai 1.x/2.x, which run on plain httpx): one total deadline over the whole call
  including the engine's retries, per-phase bounds, ``first_token`` and ``idle`` counted
  on content-bearing SSE events, the breaker, the pacer and the in-flight view;
- the SDK's own retry loop is off (``max_retries=0``): the engine retries inside the
  deadline, so retries never multiply the budget;
- a bound that fires reaches you as ``openai.APITimeoutError`` whose ``__cause__`` is the
  stallproof error (which bound, the elapsed time, the phase); a connection fault as
  ``openai.APIConnectionError``, its cause the stallproof error too — before the first
  byte and mid-stream alike, whatever the openai version (some let a transport error met
  mid-stream through raw).

Example:
    >>> from stallproof.openai import AsyncOpenAI
    >>> client = AsyncOpenAI(timeout=stallproof.Timeouts(total=30, first_token=10))
    >>> r = await client.chat.completions.create(model="gpt-4.1", messages=[...])

`OpenAI` is the same for ``openai.OpenAI``, the sync client: its requests run on
stallproof's engine loop (a daemon thread, see docs/sync.md) with the same bounds, retries
and errors, and the calling thread is released when a bound fires.

Needs ``pip install 'stallproof[openai]'``: openai >= 1.109, tested on 2.x and 3.x.
"""

from __future__ import annotations

from typing import Any

import httpx
import httpx2
import openai

from ._config import UNSET, Limits, Timeouts, Unset
from ._engine import Engine
from ._faces._arguments import check_sdk_arguments
from ._faces._compat import http_library
from ._faces._sdk import FaceMixin, Hardening, TranslatingDecoder, harden, rebind
from ._faces._sync_sdk import SyncFaceMixin
from ._policies import Breaker, Pacer, Retry, RetryBudget

__all__ = ["AsyncOpenAI", "OpenAI"]

# httpx2 for openai >= 3, httpx for 1.x/2.x: the library of the client built below.
_HTTP = http_library(openai)


class _OpenAIFace(FaceMixin):
    """The constructor and SSE decoder `AsyncOpenAI` and `OpenAI` share; the SDK's client
    class comes after this one in theirs (``super()`` is the SDK's)."""

    def __init__(
        self,
        *,
        timeout: Timeouts | float | httpx2.Timeout | httpx.Timeout | Any | None = UNSET,
        retry: Retry | Unset | None = UNSET,
        max_retries: int | Unset = UNSET,
        retry_budget: RetryBudget | Unset | None = UNSET,
        breaker: Breaker | Unset | None = UNSET,
        pacer: Pacer | Unset | None = UNSET,
        limits: Limits | Unset = UNSET,
        engine: Engine | None = None,
        http_client: httpx2.AsyncClient
        | httpx.AsyncClient
        | httpx2.Client
        | httpx.Client
        | None = None,
        _hardening: Hardening | None = None,
        **kwargs: Any,
    ) -> None:
        check_sdk_arguments(
            kwargs, base_url_env="OPENAI_BASE_URL", secrets={"api_key": "OPENAI_API_KEY"}
        )
        if _hardening is not None:  # a copy(): its parent's settings, already mapped
            self._stallproof = rebind(_hardening, http_client)
        else:
            self._stallproof, http_client = harden(
                http_client,
                timeout=timeout,
                retry=retry,
                max_retries=max_retries,
                settings={
                    "retry_budget": retry_budget,
                    "breaker": breaker,
                    "pacer": pacer,
                    "limits": limits,
                },
                engine=engine,
                sdk=openai,
                either_library=True,
                sync=self._sync,
            )
        super().__init__(  # type: ignore[call-arg]  # the SDK's client, next in the MRO
            timeout=self._stallproof.sdk_timeout(_HTTP),
            max_retries=0,
            http_client=http_client,
            **kwargs,
        )

    def _make_sse_decoder(self, *args: Any, **kwargs: Any) -> Any:
        decoder = super()._make_sse_decoder(*args, **kwargs)  # type: ignore[misc]
        return TranslatingDecoder(decoder, openai.APITimeoutError, openai.APIConnectionError)


class AsyncOpenAI(_OpenAIFace, openai.AsyncOpenAI):
    """``openai.AsyncOpenAI`` with stallproof's engine under it.

    Args:
        timeout: a `Timeouts`; a number (the total budget of a call); an
            ``httpx2.Timeout`` (its connect/read/write/pool); or None (the defaults:
            stallproof never disables a bound). Per call, ``create(..., timeout=...)``
            tightens this client's bounds the same way.
        retry: the engine's `Retry` policy (None: never retry). Default `Retry()`.
        max_retries: the SDK's argument, kept for compatibility: ``N`` means
            ``Retry(attempts=N + 1)``. Not both.
        retry_budget: the engine's `RetryBudget` (see `Engine`).
        breaker: the engine's `Breaker`.
        pacer: the engine's `Pacer`.
        limits: the engine's `Limits`.
        engine: an `Engine` to share with other clients, instead of those settings.
        http_client: optional; one built by `stallproof.http_client2()` (or, the legacy
            path, `stallproof.http_client()`), whose engine this client then uses; or your
            own ``httpx2.AsyncClient`` / ``httpx.AsyncClient``, kept with its headers,
            auth, event hooks and proxies, with a new engine installed as its transport
            (a warning, once, says its connections are then pooled by httpcore).
        **kwargs: every other argument of ``openai.AsyncOpenAI`` (``api_key``,
            ``base_url``, ``default_headers``...).

    Raises:
        InvalidRequestError: a bad setting, or an ``http_client`` that is not an httpx2 or
            httpx client; a bad SDK argument, checked before the SDK sees it
            (`stallproof._faces._arguments`): a ``base_url`` that is not an absolute
            http(s) URL or holds credentials or a query, an ``api_key`` or a
            ``default_headers`` value HTTP cannot carry (named, never shown).
    """


class OpenAI(SyncFaceMixin, _OpenAIFace, openai.OpenAI):
    """``openai.OpenAI`` (the sync client) with stallproof's engine under it.

    Takes the arguments of `AsyncOpenAI`; ``http_client`` is one built by
    `stallproof.sync_http_client2()` (or `stallproof.sync_http_client()`), whose engine
    this client then uses. A caller's own ``httpx2.Client`` is refused: its transports
    block, and the engine cannot send through them.

    Every call runs on stallproof's engine loop; the calling thread waits for it and is
    released with ``openai.APITimeoutError`` (the stallproof error as its ``__cause__``)
    when a bound fires, its socket closed. Safe to use from many threads at once.

    Raises:
        InvalidRequestError: a bad setting, or an ``http_client`` not built by stallproof.
    """
