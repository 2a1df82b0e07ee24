"""The SDKs' fragile details in one place, whatever major is installed.

Like openai-python's own ``_compat.py``: what differs between the majors of openai and
anthropic, and how their settings become ours, is read here and nowhere else. Every SDK
face, the transports and the native `Client` use it.

- `http_library`: the HTTP library an installed SDK runs on. openai >= 3 and
  anthropic >= 1 run on ``httpx2``; openai 1.x/2.x and anthropic 0.x on ``httpx``. It is
  read from the class the SDK builds its own client from (``DefaultAsyncHttpxClient``,
  public in every major), not from a version number.
- `is_not_given`: the SDKs' "leave it out" values (``NOT_GIVEN``, ``omit``). Each SDK has
  classes of its own with these names, so they are known by name.
- `timeouts_from`: an SDK's ``timeout=`` (a number, an ``httpx.Timeout`` /
  ``httpx2.Timeout``, None) as our `Timeouts`.
- `retry_from`: ``max_retries=`` (with our ``retry=``) as our `Retry`.
- `phase_timeout`: our connect/read/write/pool the other way, as the HTTP library's
  ``Timeout`` for the SDK's own client: equal to ours, so it never tightens them.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

import httpx
import httpx2

from .._config import UNSET, Timeouts, Unset
from .._exceptions import InvalidRequestError
from .._policies import Retry
from .._validate import is_int, seconds

__all__ = [
    "http_library",
    "is_not_given",
    "phase_timeout",
    "retry_from",
    "timeouts_from",
]

PHASES = ("connect", "read", "write", "pool")
_LIBRARIES = (httpx2, httpx)


def http_library(sdk: ModuleType) -> ModuleType:
    """``httpx2`` or ``httpx``: the one ``sdk`` (the imported ``openai`` or ``anthropic``
    module) builds its clients on, and so the one whose client it accepts.

    Raises:
        InvalidRequestError: an SDK on neither (a major this stallproof does not know).
    """
    default = getattr(sdk, "DefaultAsyncHttpxClient", None)
    for lib in _LIBRARIES:
        if isinstance(default, type) and issubclass(default, lib.AsyncClient):
            return lib
    version = getattr(sdk, "__version__", "?")
    raise InvalidRequestError(
        f"{sdk.__name__} {version} runs on neither httpx nor httpx2: "
        "this version of stallproof does not know it"
    )


def is_not_given(value: object) -> bool:
    """Our ``UNSET`` or an SDK's ``NOT_GIVEN`` / ``omit`` (openai's and anthropic's, every
    major): "leave it out", which frameworks pass by default."""
    return value is UNSET or type(value).__name__ in ("NotGiven", "Omit")


def timeouts_from(value: object, base: Timeouts, *, refuse_none: bool = False) -> Timeouts:
    """An SDK's ``timeout=`` value in stallproof's terms, on top of ``base``.

    - a `Timeouts`: used as is;
    - a number: the total budget (``base``'s other bounds stay);
    - an ``httpx.Timeout`` or ``httpx2.Timeout``: the phases it sets (connect, read, write,
      pool) replace ``base``'s; it has no total, so ``total`` stays;
    - not given (`is_not_given`): ``base``;
    - None: the SDKs' "no timeout". stallproof never runs a call unbounded, so ``base``
      applies; with ``refuse_none`` (the native `Client`'s constructor, where None can only
      be a mistake) it is refused.

    Raises:
        InvalidRequestError: any other kind of value, a bad number (naming the phase), or
            None with ``refuse_none``.
    """
    if isinstance(value, Timeouts):
        return value
    if is_not_given(value) or (value is None and not refuse_none):
        return base
    if isinstance(value, (httpx2.Timeout, httpx.Timeout)):
        phases = {
            name: seconds(f"timeout.{name}", v)
            for name in PHASES
            if (v := getattr(value, name)) is not None
        }
        return dataclasses.replace(base, **phases)
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return Timeouts.coerce(value, base=base)  # None refused there, with its reason
    raise InvalidRequestError(
        "timeout must be a number of seconds (the total budget), a stallproof.Timeouts or "
        f"an httpx2.Timeout / httpx.Timeout, got {type(value).__name__}"
    )


def retry_from(retry: object, max_retries: object) -> Retry | Unset | None:
    """Our ``retry=`` and the SDK's ``max_retries=`` as one policy.

    ``max_retries=N`` means ``Retry(attempts=N + 1)`` (0: None, never retry). UNSET when
    neither is given (the engine's default policy); None: never retry.

    Raises:
        InvalidRequestError: both given, a ``max_retries`` that is not an int >= 0, or a
            ``retry`` that is not a `Retry` or None.
    """
    retry = UNSET if is_not_given(retry) else retry
    if retry is not UNSET and retry is not None and not isinstance(retry, Retry):
        raise InvalidRequestError(f"retry must be a stallproof.Retry or None, got {retry!r}")
    if is_not_given(max_retries) or max_retries is None:
        return retry
    if not is_int(max_retries) or max_retries < 0:
        raise InvalidRequestError(f"max_retries must be an int >= 0, got {max_retries!r}")
    if retry is not UNSET:
        raise InvalidRequestError(
            "pass retry= or max_retries=, not both (max_retries=N means Retry(attempts=N + 1))"
        )
    return None if max_retries == 0 else Retry(attempts=max_retries + 1)


def phase_timeout(lib: ModuleType, timeouts: Timeouts) -> Any:
    """``lib.Timeout`` (httpx's or httpx2's) with our four phase bounds: what the SDK's own
    client is given, so its per-phase timeouts match the engine's and never tighten them."""
    return lib.Timeout(**{name: getattr(timeouts, name) for name in PHASES})
