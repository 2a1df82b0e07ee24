"""Retry policy, the shared retry budget, and the tenacity wiring that keeps both inside
the call's total deadline.

tenacity runs the loop (`AsyncRetrying`); stallproof supplies what tenacity cannot know:
which errors are safe to retry, how long the server asked us to wait, whether the client's
retry budget allows another attempt, and whether the wait still fits in the time left.
tenacity's own ``stop_after_delay`` is not used: it is checked only between attempts and
never cancels a running one. The total deadline is an anyio cancel scope around the whole
loop, so it cancels an attempt wherever it is.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable
from typing import Any

import anyio
import tenacity

from . import _exceptions as exc
from ._call import Call
from ._validate import check_int, check_number

__all__ = ["DEFAULT_RETRY_STATUSES", "Retry", "RetryBudget", "RetryTokens", "make_retrying"]

logger = logging.getLogger("stallproof")

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


class RetryTokens:
    """The running state of a `RetryBudget`, shared by every call of one client.

    Like the client, it belongs to one event loop: its changes never await, so they need no
    lock.
    """

    def __init__(self, budget: RetryBudget) -> None:
        self.budget = budget
        self._tokens = budget.max_tokens

    @property
    def tokens(self) -> float:
        """Tokens left (retries are allowed while this is above ``max_tokens / 2``)."""
        return self._tokens

    def record_failure(self) -> bool:
        """Take a token for a failed attempt; return whether a retry is still allowed."""
        self._tokens = max(0.0, self._tokens - 1.0)
        return self._tokens > self.budget.max_tokens / 2

    def record_success(self) -> None:
        self._tokens = min(self.budget.max_tokens, self._tokens + self.budget.token_ratio)


def _outcome_error(state: tenacity.RetryCallState) -> BaseException | None:
    outcome = state.outcome
    return None if outcome is None else outcome.exception()


def make_retrying(
    policy: Retry,
    call: Call,
    tokens: RetryTokens | None,
    *,
    rng: random.Random,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> tenacity.AsyncRetrying:
    """The tenacity loop for one call: its predicate, wait and deadline check."""

    def should_retry(error: BaseException) -> bool:
        if policy.attempts == 1 or not policy.retryable(error):
            return False
        # Only failures the policy would retry draw on the budget, as in gRPC.
        return tokens.record_failure() if tokens is not None else True

    def wait(state: tenacity.RetryCallState) -> float:
        error = _outcome_error(state)
        server_wait = getattr(error, "retry_after", None)
        if isinstance(server_wait, float):
            return min(server_wait, policy.retry_after_max)
        return policy.backoff(state.attempt_number, rng.random())

    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = _outcome_error(state)
        assert error is not None  # tenacity only sleeps after a failed attempt
        delay = state.upcoming_sleep
        left = call.remaining()
        if delay >= left:
            raise exc.RetryWouldExceedDeadline(
                f"attempt {state.attempt_number} failed ({type(error).__name__}) and the "
                f"next attempt would start after {delay:.3f}s, but only {left:.3f}s of the "
                f"total {call.timeouts.total:g}s budget is left",
                limit=call.timeouts.total,
                elapsed=call.elapsed(),
                phase="retry wait",
                request_id=call.request_id,
                server_request_id=call.server_request_id,
                method=call.method,
                url=call.url,
                retry_after=delay,
                remaining=max(left, 0.0),
            ) from error
        call.set_phase("retry wait")
        logger.info(
            "retrying after %s in %.3fs (attempt %d/%d) request_id=%s",
            type(error).__name__,
            delay,
            state.attempt_number + 1,
            policy.attempts,
            call.request_id,
        )
        if on_retry is not None:
            on_retry(error, delay)

    return tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(policy.attempts),
        wait=wait,
        retry=tenacity.retry_if_exception(should_retry),
        before_sleep=before_sleep,
        sleep=_sleep,
        reraise=True,
    )


async def _sleep(seconds: float) -> Any:
    await anyio.sleep(seconds)
