"""`AsyncAnthropic` and `Anthropic`: the anthropic SDK's own clients, made impossible to hang.

A subclass of ``anthropic.AsyncAnthropic`` (anthropic >= 2, which runs on httpx2 only):
every resource, helper, type and error of the SDK works as before. Every request goes
through stallproof's engine (an `AsyncTransport2` under the SDK's ``httpx2.AsyncClient``),
the SDK's own retry loop is off (the engine retries inside the one total deadline), and a
bound that fires reaches you as ``anthropic.APITimeoutError`` whose ``__cause__`` is the
stallproof error (bound, elapsed, phase), a connection fault as
``anthropic.APIConnectionError`` — mid-stream too, where the stock SDK lets the raw httpx2
error through. ``first_token`` and ``idle`` count content-bearing events only:
``ping`` events and empty deltas do not reset them.

Example:
    >>> from stallproof.anthropic import AsyncAnthropic
    >>> client = AsyncAnthropic(timeout=stallproof.Timeouts(total=60, idle=20))

`Anthropic` is the same for ``anthropic.Anthropic``, the sync client: its requests run on
stallproof's engine loop (a daemon thread, see docs/sync.md), the calling thread released
when a bound fires.

Needs ``pip install 'stallproof[anthropic]'``.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2

from ._config import UNSET, Limits, Timeouts, Unset
from ._engine import Engine
from ._faces._arguments import check_sdk_arguments
from ._faces._compat import http_library
from ._faces._sdk import FaceMixin, Hardening, TranslatingDecoder, harden, rebind
from ._faces._sync_sdk import SyncFaceMixin
from ._policies import Breaker, Pacer, Retry, RetryBudget

__all__ = ["Anthropic", "AsyncAnthropic"]

# httpx2 for anthropic >= 1, httpx for 0.x: the library of the client built below.
_HTTP = http_library(anthropic)


class _AnthropicFace(FaceMixin):
    """The constructor and SSE decoder `AsyncAnthropic` and `Anthropic` share; the SDK's client
    class comes after this one in theirs (``super()`` is the SDK's)."""

    def __init__(
        self,
        *,
        timeout: Timeouts | float | httpx2.Timeout | Any | None = UNSET,
        retry: Retry | Unset | None = UNSET,
        max_retries: int | Unset = UNSET,
        retry_budget: RetryBudget | Unset | None = UNSET,
        breaker: Breaker | Unset | None = UNSET,
        pacer: Pacer | Unset | None = UNSET,
        limits: Limits | Unset = UNSET,
        engine: Engine | None = None,
        http_client: httpx2.AsyncClient | httpx2.Client | None = None,
        _hardening: Hardening | None = None,
        **kwargs: Any,
    ) -> None:
        check_sdk_arguments(
            kwargs,
            base_url_env="ANTHROPIC_BASE_URL",
            secrets={"api_key": "ANTHROPIC_API_KEY", "auth_token": "ANTHROPIC_AUTH_TOKEN"},
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
                    "provider_name": "anthropic",
                },
                engine=engine,
                sdk=anthropic,
                either_library=False,
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
        return TranslatingDecoder(decoder, anthropic.APITimeoutError, anthropic.APIConnectionError)


class AsyncAnthropic(_AnthropicFace, anthropic.AsyncAnthropic):
    """``anthropic.AsyncAnthropic`` with stallproof's engine under it.

    Takes the same stallproof arguments as `stallproof.openai.AsyncOpenAI` (``timeout``,
    ``retry`` or ``max_retries``, ``retry_budget``, ``breaker``, ``pacer``, ``limits``,
    ``engine``, ``http_client`` from `stallproof.http_client2()` or your own
    ``httpx2.AsyncClient``, kept, with the engine as its transport); every other argument is
    ``anthropic.AsyncAnthropic``'s, ``base_url``, ``api_key``, ``auth_token``,
    ``default_headers`` and ``default_query`` checked first as `AsyncOpenAI` checks its own
    (an `InvalidRequestError` that names the argument and never shows a secret).
    """


class Anthropic(SyncFaceMixin, _AnthropicFace, anthropic.Anthropic):
    """``anthropic.Anthropic`` (the sync client) with stallproof's engine under it.

    Takes the arguments of `AsyncAnthropic`; ``http_client`` is one built by
    `stallproof.sync_http_client2()`. Every call runs on stallproof's engine loop; the
    calling thread is released with ``anthropic.APITimeoutError`` (the stallproof error as
    its ``__cause__``) when a bound fires.
    """
