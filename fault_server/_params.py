"""What a fault's parameters are: their types, defaults, bounds, and how text becomes a value.

`ParamInfo` turns URL text (or a Python value) into a typed value, or raises a
`FaultSpecError` that names the fault, the parameter and the bad value. `GENERIC_PARAMS` are
the parameters every fault takes. The catalogue itself is in `_catalogue`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

__all__ = [
    "GENERIC_PARAMS",
    "FaultInfo",
    "FaultSpecError",
    "ParamInfo",
    "ParamValue",
    "MIB",
    "after",
    "choice",
    "flag",
    "interval",
    "number",
    "integer",
    "text",
]

ParamValue = float | int | str | bool | None
ParamKind = Literal["float", "int", "str", "bool", "choice"]
Group = Literal["socket", "http", "sse", "status", "time"]
Scope = Literal["request", "connection"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class FaultSpecError(ValueError):
    """A fault spec names an unknown fault or parameter, or gives a parameter a bad value."""


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """One parameter of a fault: its type, default, bounds and what it does."""

    name: str
    kind: ParamKind
    default: ParamValue
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()

    def coerce(self, raw: object, fault: str) -> ParamValue:
        """Turn ``raw`` (URL text or a Python value) into this parameter's type, or raise.

        Raises:
            FaultSpecError: naming the fault, the parameter and the bad value.
        """
        try:
            value = self._convert(raw)
        except (TypeError, ValueError, OverflowError):
            value = _BAD
        if isinstance(value, _Bad) or not self._in_bounds(value):
            raise FaultSpecError(
                f"parameter {self.name!r} of fault {fault!r} must be {self._describe()}, "
                f"got {raw!r}"
            )
        return value

    def _convert(self, raw: object) -> ParamValue | _Bad:
        if raw is None:
            return None
        if self.kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            return True if text in _TRUE else False if text in _FALSE else _BAD
        if isinstance(raw, bool):  # bool is an int: never let True mean 1 second.
            return _BAD
        if self.kind == "float":
            value = float(raw) if isinstance(raw, (int, float, str)) else _BAD
            return value if isinstance(value, float) and math.isfinite(value) else _BAD
        if self.kind == "int":
            if isinstance(raw, float):
                return int(raw) if raw.is_integer() else _BAD
            return int(raw) if isinstance(raw, (int, str)) else _BAD
        text = str(raw)
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
            return _BAD  # it may end up in a header: no CR, LF or other controls.
        if self.kind == "choice":
            return text if text in self.choices else _BAD
        return text

    def _in_bounds(self, value: object) -> bool:
        if value is None or not isinstance(value, (int, float)) or isinstance(value, bool):
            return True
        if self.minimum is not None and value < self.minimum:
            return False
        return self.maximum is None or value <= self.maximum

    def _describe(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "bool":
            return "true or false"
        if self.kind == "str":
            return "text without control characters"
        what = "a number" if self.kind == "float" else "an integer"
        if self.minimum is not None and self.maximum is not None:
            return f"{what} in [{self.minimum:g}, {self.maximum:g}]"
        if self.minimum is not None:
            return f"{what} >= {self.minimum:g}"
        return what


class _Bad:
    """Marks a value that could not be converted."""


_BAD = _Bad()


@dataclass(frozen=True, slots=True)
class FaultInfo:
    """One entry of the catalogue: a fault's name, what it does on the wire, its parameters.

    ``group`` is the layer it breaks (socket, http, sse, status, time). ``scope`` is
    ``"connection"`` for a fault that acts before any request is read (``slow_accept``):
    such a fault is armed by a scenario, never named by a request.
    """

    name: str
    description: str
    params: tuple[ParamInfo, ...] = ()
    group: Group = "http"
    scope: Scope = "request"

    def param(self, name: str) -> ParamInfo | None:
        """The parameter called ``name``, generic ones included, or None."""
        for info in self.params:
            if info.name == name:
                return info
        return GENERIC_PARAMS.get(name)


def number(
    name: str,
    default: float | None,
    help: str,
    minimum: float = 0.0,
    maximum: float | None = None,
) -> ParamInfo:
    """A float parameter (seconds, rates)."""
    return ParamInfo(name, "float", default, help, minimum=minimum, maximum=maximum)


def integer(
    name: str, default: int | None, help: str, minimum: int = 0, maximum: int | None = None
) -> ParamInfo:
    """An int parameter (counts, sizes)."""
    return ParamInfo(name, "int", default, help, minimum=minimum, maximum=maximum)


def choice(name: str, default: str, help: str, *choices: str) -> ParamInfo:
    """A parameter that takes one of a few words."""
    return ParamInfo(name, "choice", default, help, choices=choices)


def text(name: str, help: str) -> ParamInfo:
    """A free-text parameter without default (it may end up in a header: no controls)."""
    return ParamInfo(name, "str", None, help)


def flag(name: str, default: bool | None, help: str) -> ParamInfo:
    """A true/false parameter."""
    return ParamInfo(name, "bool", default, help)


MIB = 1024 * 1024


def after(default: int) -> ParamInfo:
    """``after``: how many content chunks a fault sends before it breaks the stream."""
    return integer(
        "after", default, "Content chunks sent first (after the role chunk) when streaming."
    )


def interval(default: float) -> ParamInfo:
    """``interval``: the seconds between a fault's sends."""
    return number("interval", default, "Seconds between sends.")


GENERIC_PARAMS: Mapping[str, ParamInfo] = MappingProxyType(
    {
        p.name: p
        for p in (
            ParamInfo(
                "key", "str", None, "Name a sequence: counts requests per key (see `first`)."
            ),
            integer(
                "first",
                None,
                "Apply the fault to the first N requests with this `key` only; later ones "
                "are served plain healthy (default parameters). Needs `key`.",
            ),
            number(
                "hold",
                None,
                "Most seconds the fault keeps the connection before the server closes it "
                "itself (default and cap: the server's max_hold).",
            ),
            number("delay", 0.0, "Seconds to wait after the request, before the first byte."),
            number("token_interval", 0.0, "Seconds between streamed content chunks."),
            integer("tokens", 8, "Content tokens (words) to produce.", maximum=100_000),
        )
    }
)
