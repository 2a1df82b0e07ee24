"""Validation shared by every configuration object: one set of rules, one message shape.

`Timeouts`, `Limits`, `Retry`, `RetryBudget`, `Pacer` and `Breaker` check their fields here
in ``__post_init__``. Every failure is an `InvalidRequestError` that names the parameter,
what it must be and the value given: ``Pacer.max_concurrent must be None or an int >= 1,
got 0``. A bool is never taken for a number (``True`` is not 1 second), and every number is
finite: no bound can be switched off with ``inf`` or ``nan``.
"""

from __future__ import annotations

import math
from typing import TypeGuard

from ._exceptions import InvalidRequestError

__all__ = [
    "check_bool",
    "check_int",
    "check_number",
    "invalid",
    "is_int",
    "is_number",
    "seconds",
]


def invalid(name: str, want: str, value: object) -> InvalidRequestError:
    """The error for a parameter ``name`` that is not ``want``."""
    return InvalidRequestError(f"{name} must be {want}, got {value!r}")


def is_int(value: object) -> TypeGuard[int]:
    """An int, never a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """A finite int or float, never a bool."""
    return is_int(value) or (isinstance(value, float) and math.isfinite(value))


def check_int(
    name: str,
    value: object,
    *,
    minimum: int = 1,
    maximum: int | None = None,
    optional: bool = False,
) -> None:
    """Raise unless ``value`` is an int in [minimum, maximum] (or None when optional)."""
    if optional and value is None:
        return
    if not (is_int(value) and _within(float(value), minimum, None, None, maximum)):
        raise invalid(name, _want("an int", optional, minimum, None, None, maximum), value)


def check_number(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    maximum: float | None = None,
    optional: bool = False,
) -> None:
    """Raise unless ``value`` is a finite number within the bounds given (``minimum`` and
    ``maximum`` inclusive, ``above`` and ``below`` exclusive), or None when optional."""
    if optional and value is None:
        return
    if not (is_number(value) and _within(float(value), minimum, above, below, maximum)):
        want = _want("a finite number", optional, minimum, above, below, maximum)
        raise invalid(name, want, value)


def check_bool(name: str, value: object) -> None:
    """Raise unless ``value`` is True or False."""
    if not isinstance(value, bool):
        raise invalid(name, "a bool", value)


def seconds(name: str, value: object, *, allow_zero: bool = False) -> float:
    """``value`` as a float number of seconds: finite, > 0 (or >= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(
            f"{name} must be a number of seconds, got {value!r} ({type(value).__name__})"
        )
    v = float(value)
    if not math.isfinite(v):
        raise InvalidRequestError(f"{name} must be finite, got {value!r}: every bound is finite")
    if v < 0 or (v == 0 and not allow_zero):
        raise InvalidRequestError(f"{name} must be > 0 seconds, got {value!r}")
    return v


def _within(
    value: float,
    minimum: float | None,
    above: float | None,
    below: float | None,
    maximum: float | None,
) -> bool:
    return not (
        (minimum is not None and value < minimum)
        or (above is not None and value <= above)
        or (below is not None and value >= below)
        or (maximum is not None and value > maximum)
    )


def _want(
    kind: str,
    optional: bool,
    minimum: float | None,
    above: float | None,
    below: float | None,
    maximum: float | None,
) -> str:
    bounds = [
        f"{op} {bound:g}"
        for op, bound in ((">=", minimum), (">", above), ("<", below), ("<=", maximum))
        if bound is not None
    ]
    want = " and ".join([kind + (" " + bounds[0] if bounds else ""), *bounds[1:]])
    return ("None or " if optional else "") + want
