"""Policies: frozen, validated descriptions of how calls retry, pace and break, and where
they share state. What applies them lives elsewhere (the urllib3 split of ``util/retry.py``
from the pool that uses it):

=============== ===================================== ====================================
policy          what it says                          what applies it
=============== ===================================== ====================================
`Retry`         which failures get another attempt,   `_retry.make_retrying` (tenacity)
                how long to wait between them
`RetryBudget`   a client-wide cap on retries          `_retry.RetryTokens`
`Pacer`         concurrency, per-minute limits,       `_pacer.PacerRuntime`,
                fair turns, the adaptive limit        `_fleet.FleetPacer`
`Breaker`       when a circuit opens and closes       `_breaker.Circuit`,
                                                      `_fleet.FleetBreaker`
`RedisState`    where a fleet shares the two above    `_fleet.SharedStore`
=============== ===================================== ====================================

`Timeouts` and `Limits`, the bounds of one call, are next door in `_config`. Nothing here
imports a runtime module, so no import circle runs through a policy.
"""

from __future__ import annotations

import dataclasses
import math
import types
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from . import _exceptions as exc
from ._validate import check_bool, check_int, check_number, invalid

__all__ = [
    "DEFAULT_RETRY_STATUSES",
    "Breaker",
    "FailMode",
    "Pacer",
    "RedisState",
    "Retry",
    "RetryBudget",
]


#: Statuses worth another attempt: timeouts, conflicts, rate limits, overload, gateways.
DEFAULT_RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})


# Never retried, whatever `statuses` says: the request itself is wrong.
_NEVER_RETRY = frozenset({400, 401, 403, 404, 422})


@dataclasses.dataclass(frozen=True, slots=True)
class Retry:
    """How one call retries. Every attempt and every wait fits inside its total deadline.

    Args:
        attempts: attempts in all, the first included (1 = never retry). Default 3.
        backoff_base: the first backoff window, in seconds. Default 0.5.
        backoff_max: the largest backoff window. Default 8. The wait before attempt n+1 is
            uniform in [0, min(backoff_max, backoff_base * 2**(n-1))] ("full jitter").
        retry_after_max: the longest server-requested wait (``Retry-After``,
            ``retry-after-ms``) honoured; longer requests are clamped to it. Default 60.
        statuses: HTTP statuses that are retried. Default 408, 409, 429, 500, 502, 503,
            504, 529. 400, 401, 403, 404 and 422 are never retried.

    What is retried: connect errors, connect and pool timeouts, and any timeout, reset or
    truncation that happens before content reached the caller. A stream is retried until
    its first content chunk and never after. ``x-should-retry: true|false`` from the
    server overrides the status rule. Malformed answers, size caps, caller errors, an open
    circuit and the total timeout are never retried.

    If the server's Retry-After (after clamping) or the backoff does not fit in the time
    left, the call fails at once with `RetryWouldExceedDeadline` instead of sleeping into
    a certain timeout.
    """

    attempts: int = 3
    backoff_base: float = 0.5
    backoff_max: float = 8.0
    retry_after_max: float = 60.0
    statuses: frozenset[int] = DEFAULT_RETRY_STATUSES

    def __post_init__(self) -> None:
        check_int("Retry.attempts", self.attempts, minimum=1)
        check_number("Retry.backoff_base", self.backoff_base, above=0)
        check_number("Retry.backoff_max", self.backoff_max, above=0)
        check_number("Retry.retry_after_max", self.retry_after_max, minimum=0)
        statuses = frozenset(self.statuses)
        for code in statuses:
            check_int("each of Retry.statuses", code, minimum=100, maximum=599)
        object.__setattr__(self, "statuses", statuses)

    def backoff(self, attempt: int, u: float) -> float:
        """The wait after failed attempt number ``attempt`` (1-based), for ``u`` in [0, 1)."""
        window = min(self.backoff_max, self.backoff_base * 2.0 ** (attempt - 1))
        return window * u

    def retryable(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt under this policy (budget aside).

        The client calls this only for failures before content reached the caller: a
        stream's attempt ends at its first content chunk.
        """
        if not isinstance(error, exc.StallproofError):
            return False
        if isinstance(error, exc.APIStatusError):
            hint = error.headers.get("x-should-retry")
            if error.status_code in _NEVER_RETRY:
                return False
            if hint == "true":
                return True
            if hint == "false":
                return False
            return error.status_code in self.statuses
        if isinstance(error, (exc.TotalTimeout, exc.CircuitOpen)):
            return False
        return isinstance(error, (exc.TimeoutException, exc.TransportError, exc.TruncatedResponse))


@dataclasses.dataclass(frozen=True, slots=True)
class RetryBudget:
    """A client-wide cap on retries, gRPC's retry throttling (a token bucket).

    The bucket starts full at ``max_tokens``. Every attempt that fails with a retryable
    error takes one token; every success puts back ``token_ratio``. A retry is allowed only
    while more than half the bucket is left. So when most calls fail, retries stop and
    calls fail fast instead of multiplying the load; as successes return, retries resume.

    Args:
        max_tokens: bucket size. Default 10: from full, at most 4 retries go out in a burst
            of failures before retries stop (the 5th failure brings it to the half mark).
        token_ratio: tokens returned per success. Default 0.1: in steady state retries are
            at most about 10% of successful calls.
    """

    max_tokens: float = 10.0
    token_ratio: float = 0.1

    def __post_init__(self) -> None:
        check_number("RetryBudget.max_tokens", self.max_tokens, above=0)
        check_number("RetryBudget.token_ratio", self.token_ratio, above=0)


@dataclasses.dataclass(frozen=True, slots=True)
class Pacer:
    """How a client paces its calls. Every wait fits inside the call's total deadline.

    All limits are optional; with none, calls are never held but still counted and visible
    in `Client.pacer_state`.

    Args:
        max_concurrent: calls in flight at once. Default None (no limit).
        requests_per_minute: calls started in any 60 s window. Default None.
        tokens_per_minute: tokens of the calls started in any 60 s window: their estimates
            (`estimate_tokens`) until the call's usage is known. Default None.
        adaptive: shrink the concurrency limit under overload and grow it back (AIMD, see
            the module docstring). Needs max_concurrent. Default True.
        min_concurrent: the adaptive limit never goes below this. Default 1.
        decrease_factor: the limit is multiplied by this on overload, rounded down.
            Default 0.5.
        increase_step: added to the limit after each window of successes (as many
            successful calls as the current limit). Default 1.
        weights: agent name -> share of the turns (0.01 to 100); others weigh 1. Default None.
        chars_per_token: characters per token when estimating a request. Default 4.
        shared: a `RedisState` to share every limit with the other processes that use it
            (docs/fleet.md). Default None: this process only.

    Example:
        >>> Client(base_url=..., pacer=Pacer(max_concurrent=8, requests_per_minute=600))
    """

    max_concurrent: int | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    adaptive: bool = True
    min_concurrent: int = 1
    decrease_factor: float = 0.5
    increase_step: float = 1.0
    weights: Mapping[str, float] | None = dataclasses.field(default=None, hash=False)
    chars_per_token: float = 4.0
    shared: RedisState | None = None

    def __post_init__(self) -> None:
        if self.shared is not None and not isinstance(self.shared, RedisState):
            raise invalid("Pacer.shared", "None or a RedisState", self.shared)
        most = self.max_concurrent
        check_int("Pacer.max_concurrent", most, minimum=1, optional=True)
        for name in ("requests_per_minute", "tokens_per_minute"):
            check_number(f"Pacer.{name}", getattr(self, name), minimum=1, optional=True)
        check_bool("Pacer.adaptive", self.adaptive)
        check_int("Pacer.min_concurrent", self.min_concurrent, minimum=1, maximum=most)
        check_number("Pacer.decrease_factor", self.decrease_factor, above=0, below=1)
        for name in ("increase_step", "chars_per_token"):
            check_number(f"Pacer.{name}", getattr(self, name), above=0)
        if self.weights is not None:
            if not isinstance(self.weights, Mapping):
                raise invalid(
                    "Pacer.weights", "None or a mapping of agent names to shares", self.weights
                )
            weights = dict(self.weights)
            for agent, weight in weights.items():
                if not isinstance(agent, str):
                    raise invalid("Pacer.weights keys", "agent names (str)", agent)
                check_number(f"Pacer.weights[{agent!r}]", weight, minimum=0.01, maximum=100)
            object.__setattr__(self, "weights", types.MappingProxyType(weights))

    def estimate_tokens(self, messages: object, *, max_tokens: int | None = None) -> int:
        """What a request counts against ``tokens_per_minute`` before it is sent.

        Every string in ``messages`` (contents, content parts, tool-call arguments, names) at
        ``chars_per_token`` characters a token, rounded up, plus ``max_tokens``: providers
        reserve the completion allowance against the limit when the request arrives.
        """
        return math.ceil(_chars(messages) / self.chars_per_token) + (max_tokens or 0)


def _chars(value: object) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, Mapping):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_chars(v) for v in value)
    return 0


@dataclasses.dataclass(frozen=True, slots=True)
class Breaker:
    """Circuit-breaker policy, one circuit per upstream.

    Args:
        fail_max: consecutive failed attempts that open the circuit. Default 5.
        reset_timeout: seconds the circuit stays open before one probe is let through.
            Default 30.
        success_threshold: successful probes needed to close it again. Default 1.
        per_model: keep a separate circuit per (base URL, model) instead of per base URL.
            Default False.
        max_open: the longest a server's Retry-After may hold the circuit open. Default 300.
        shared: a `RedisState` to share each circuit with the other processes that use it
            (docs/fleet.md). Default None: this process only.

    Example:
        >>> Client(base_url=..., breaker=Breaker(fail_max=3, reset_timeout=10))
    """

    fail_max: int = 5
    reset_timeout: float = 30.0
    success_threshold: int = 1
    per_model: bool = False
    max_open: float = 300.0
    shared: RedisState | None = None

    def __post_init__(self) -> None:
        if self.shared is not None and not isinstance(self.shared, RedisState):
            raise invalid("Breaker.shared", "None or a RedisState", self.shared)
        for name in ("fail_max", "success_threshold"):
            check_int(f"Breaker.{name}", getattr(self, name), minimum=1)
        for name in ("reset_timeout", "max_open"):
            check_number(f"Breaker.{name}", getattr(self, name), above=0)
        check_bool("Breaker.per_model", self.per_model)


FailMode = str  # "open" or "closed"


@dataclasses.dataclass(frozen=True, slots=True)
class RedisState:
    """Share a `Pacer`'s limits or a `Breaker`'s circuits across processes, through Redis.

    Pass the same settings to every worker of the fleet:
    ``Pacer(..., shared=RedisState(url))``, ``Breaker(..., shared=RedisState(url))``.
    Needs the ``stallproof[redis]`` extra (redis-py) and an asyncio event loop.

    Args:
        url: a redis:// or rediss:// URL. A password in it never appears in a repr or a log.
        prefix: the key prefix. Workers with the same prefix share one pacer; give each
            provider limit its own. Default "stallproof".
        op_timeout: the bound on each Redis operation, in seconds, clipped to the call's
            deadline. Default 0.1.
        fail: what a call does when Redis cannot answer in time. "open" (default): go on
            with this process's own state. "closed": fail with `SharedStateUnavailable`.
        retry_interval: after a failure, seconds before Redis is tried again. Default 1.
        lease_ttl: the longest a concurrency lease lives, in seconds; a lease also ends at
            its call's total deadline. A crashed worker's slots come back by then.
            Default 300.
        poll_interval: how often a call waiting for fleet capacity asks again. Default 0.05.

    Example:
        >>> shared = RedisState("redis://redis:6379/0", prefix="openai")
        >>> Client(..., pacer=Pacer(requests_per_minute=600, shared=shared))
    """

    url: str
    prefix: str = "stallproof"
    op_timeout: float = 0.1
    fail: FailMode = "open"
    retry_interval: float = 1.0
    lease_ttl: float = 300.0
    poll_interval: float = 0.05

    def __post_init__(self) -> None:
        if not _redis_url(self.url):
            raise exc.InvalidRequestError(
                "RedisState.url must be a redis://, rediss:// or unix:// URL,"
                f" got {_mask(self.url)!r}"
            )
        if not isinstance(self.prefix, str) or not self.prefix or "{" in self.prefix:
            raise exc.InvalidRequestError(
                f"RedisState.prefix must be a non-empty str without braces, got {self.prefix!r}"
            )
        if self.fail not in ("open", "closed"):
            raise exc.InvalidRequestError(
                f"RedisState.fail must be 'open' or 'closed', got {self.fail!r}"
            )
        for name, most in (
            ("op_timeout", 60.0),
            ("retry_interval", 3600.0),
            ("lease_ttl", 86400.0),
            ("poll_interval", 60.0),
        ):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or not 0 < value <= most
            ):
                raise exc.InvalidRequestError(
                    f"RedisState.{name} must be a number > 0 and <= {most:g}, got {value!r}"
                )

    def __repr__(self) -> str:
        return (
            f"RedisState(url={_mask(self.url)!r}, prefix={self.prefix!r},"
            f" op_timeout={self.op_timeout!r}, fail={self.fail!r})"
        )


def _redis_url(url: object) -> bool:
    """A str that splits as a redis://, rediss:// or unix:// URL, its port (if any) in range."""
    if not isinstance(url, str):
        return False
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError:  # "Invalid IPv6 URL", "Port out of range 0-65535"
        return False
    return parts.scheme in ("redis", "rediss", "unix")


def _mask(url: object) -> object:
    """The URL with any password replaced by ``***``."""
    if not isinstance(url, str):
        return url
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
    except ValueError:
        return "<unparsable url>"
