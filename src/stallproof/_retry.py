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

import logging
import random
from collections.abc import Callable
from typing import Any

import anyio
import tenacity

from . import _exceptions as exc
from ._call import Call
from ._policies import Retry, RetryBudget

__all__ = ["RetryTokens", "make_retrying"]

logger = logging.getLogger("stallproof")


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
