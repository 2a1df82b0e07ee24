"""The fault catalogue, and parsing of ``name;k=v;k=v`` specs into a validated `FaultSpec`.

A spec selects one fault for one request. It arrives either as a path segment
(``/fault/trickle_body;interval=0.5/v1/chat/completions``) or as an ``X-Fault`` header with
the same text; the header wins. Values are URL-decoded after splitting on ``;`` and ``=``,
so a value may carry ``%3B`` for a semicolon. A spec made only of parameters
(``delay=0.5;tokens=3``) means ``healthy`` with those parameters.

Every value is checked here, before any byte is sent, so that a typo gives a 400 that names
the fault, the parameter and the bad value instead of a server that misbehaves in some other
way than the test meant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal
from urllib.parse import quote, unquote

__all__ = [
    "FAULTS",
    "GENERIC_PARAMS",
    "FaultInfo",
    "FaultSpec",
    "FaultSpecError",
    "ParamInfo",
    "ParamValue",
    "parse_fault",
]

ParamValue = float | int | str | bool | None
ParamKind = Literal["float", "int", "str", "bool", "choice"]

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
    """One entry of the catalogue: a fault's name, what it does on the wire, its parameters."""

    name: str
    description: str
    params: tuple[ParamInfo, ...] = ()

    def param(self, name: str) -> ParamInfo | None:
        """The parameter called ``name``, generic ones included, or None."""
        for info in self.params:
            if info.name == name:
                return info
        return GENERIC_PARAMS.get(name)


def _float(name: str, default: float | None, help: str, minimum: float = 0.0) -> ParamInfo:
    return ParamInfo(name, "float", default, help, minimum=minimum)


def _int(
    name: str, default: int | None, help: str, minimum: int = 0, maximum: int | None = None
) -> ParamInfo:
    return ParamInfo(name, "int", default, help, minimum=minimum, maximum=maximum)


_MIB = 1024 * 1024

GENERIC_PARAMS: Mapping[str, ParamInfo] = MappingProxyType(
    {
        p.name: p
        for p in (
            ParamInfo(
                "key", "str", None, "Name a sequence: counts requests per key (see `first`)."
            ),
            _int(
                "first",
                None,
                "Apply the fault to the first N requests with this `key` only; later ones "
                "are served plain healthy (default parameters). Needs `key`.",
            ),
            _float(
                "hold",
                None,
                "Most seconds the fault keeps the connection before the server closes it "
                "itself (default and cap: the server's max_hold).",
            ),
            _float("delay", 0.0, "Seconds to wait after the request, before the first byte."),
            _float("token_interval", 0.0, "Seconds between streamed content chunks."),
            _int("tokens", 8, "Content tokens (words) to produce.", maximum=100_000),
        )
    }
)

_INTERVAL_HELP = "Seconds between sends."
_AFTER_HELP = "Content chunks sent first (after the role chunk) when streaming."

_CATALOGUE = (
    FaultInfo("healthy", "A normal response; with delay/token_interval, healthy but slow."),
    FaultInfo(
        "half_open",
        "Accept, never answer: the request is not parsed past its head, nothing is ever "
        "sent; the server closes after `hold`.",
    ),
    FaultInfo(
        "stall_headers",
        "Read the whole request, never send a status line; close after `hold`.",
    ),
    FaultInfo(
        "trickle_body",
        "200 with a correct Content-Length at once, then the normal body (JSON, or the SSE "
        "stream) `chunk` bytes every `interval` seconds, until done or `hold`.",
        (_float("interval", 1.0, _INTERVAL_HELP), _int("chunk", 1, "Bytes per send.", 1)),
    ),
    FaultInfo(
        "sse_keepalive",
        "Stream: 200 text/event-stream, then ': keep-alive' comments every `interval` with "
        "no data, until `hold`. Non-stream: 200 chunked application/json, then a newline "
        "every `interval`, until `hold`.",
        (_float("interval", 0.5, _INTERVAL_HELP),),
    ),
    FaultInfo(
        "sse_stall",
        "Stream: the role chunk and `after` content chunks, then silence with the socket "
        "open until `hold`. Non-stream: headers with Content-Length and half the body, then "
        "silence until `hold`.",
        (_int("after", 2, _AFTER_HELP),),
    ),
    FaultInfo(
        "sse_empty_deltas",
        "Always an SSE stream (whatever `stream` says): a role chunk, then valid chunks whose "
        "delta is {} or has content '' every `interval`, never any content, until `hold`.",
        (_float("interval", 0.5, _INTERVAL_HELP),),
    ),
    FaultInfo(
        "reset",
        "Abort with a TCP RST. when=before: read the request, send nothing, RST. when=mid: "
        "headers and part of the body (stream: role + `after` content chunks; non-stream: "
        "half the body), then RST.",
        (
            ParamInfo("when", "choice", "before", "When to reset.", choices=("before", "mid")),
            _int("after", 1, _AFTER_HELP),
        ),
    ),
    FaultInfo(
        "close_mid_body",
        "Headers (Content-Length of the full body; stream: chunked SSE), part of the body "
        "(stream: role + `after` content chunks, no [DONE], no chunk terminator; non-stream: "
        "half), then a clean FIN.",
        (_int("after", 2, _AFTER_HELP),),
    ),
    FaultInfo(
        "content_length_lie",
        "Content-Length `extra` bytes larger than the body; send the whole body (stream: up "
        "to and with [DONE]), then keep the socket open, sending nothing, until `hold`.",
        (_int("extra", 100, "Bytes promised but never sent.", 1),),
    ),
    FaultInfo(
        "status",
        "An HTTP error with an OpenAI-shaped error body and optional retry headers. The "
        "response is well formed and the connection stays usable.",
        (
            _int("code", 500, "The status code.", 200, 599),
            ParamInfo("retry_after", "str", None, "Retry-After header, verbatim."),
            _float("retry_after_ms", None, "retry-after-ms header."),
            ParamInfo("should_retry", "bool", None, "x-should-retry header: true or false."),
            ParamInfo("body", "str", None, "Body to send instead of the error JSON."),
        ),
    ),
    FaultInfo(
        "malformed_json",
        '200, but non-stream the body is the truncated JSON \'{"id": "x", "choices": [\' '
        "and stream one valid chunk is followed by 'data: {not json', then [DONE].",
    ),
    FaultInfo(
        "huge_body",
        "200 with a body of `size` bytes, generated as it is sent: non-stream one valid JSON "
        "completion with Content-Length; stream a single `data:` line of `size` bytes, then "
        "[DONE]. Ends at `hold` if the client reads too slowly.",
        (_int("size", 64 * _MIB, "Bytes of body (non-stream) or of the data line.", 1024),),
    ),
    FaultInfo(
        "no_done",
        "Stream: every chunk, the chunked terminator and a clean close, but no "
        "'data: [DONE]'. Non-stream: a normal response.",
    ),
)

FAULTS: Mapping[str, FaultInfo] = MappingProxyType({info.name: info for info in _CATALOGUE})


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """One fault with its explicitly given parameters, every value validated and typed.

    Args:
        name: a key of `FAULTS`.
        params: parameter names to values; text values are parsed as in a URL.

    Raises:
        FaultSpecError: for an unknown fault or parameter, or a bad value.

    Example:
        >>> str(FaultSpec("trickle_body", {"interval": "0.5"}))
        'trickle_body;interval=0.5'
    """

    name: str = "healthy"
    params: Mapping[str, ParamValue] = field(default_factory=dict)

    def __post_init__(self) -> None:
        info = FAULTS.get(self.name)
        if info is None:
            raise FaultSpecError(f"unknown fault {self.name!r}; known faults: {', '.join(FAULTS)}")
        clean: dict[str, ParamValue] = {}
        for pname, raw in self.params.items():
            pinfo = info.param(pname)
            if pinfo is None:
                known = [p.name for p in info.params] + list(GENERIC_PARAMS)
                raise FaultSpecError(
                    f"unknown parameter {pname!r} for fault {self.name!r}; "
                    f"known: {', '.join(known)}"
                )
            clean[pname] = pinfo.coerce(raw, self.name)
        if clean.get("first") is not None and clean.get("key") is None:
            raise FaultSpecError(f"parameter 'first' of fault {self.name!r} needs a 'key'")
        object.__setattr__(self, "params", MappingProxyType(clean))

    def __hash__(self) -> int:
        return hash((self.name, tuple(self.params.items())))

    def __str__(self) -> str:
        parts = [self.name]
        for pname, value in self.params.items():
            if value is None:
                continue
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            parts.append(f"{pname}={quote(text, safe='')}")
        return ";".join(parts)

    @property
    def info(self) -> FaultInfo:
        """The catalogue entry of this fault."""
        return FAULTS[self.name]

    def get(self, name: str) -> ParamValue:
        """The value of parameter ``name``: the one given, else its default."""
        if name in self.params:
            return self.params[name]
        pinfo = self.info.param(name)
        if pinfo is None:
            raise KeyError(name)
        return pinfo.default

    def number(self, name: str) -> float:
        """A float or int parameter that has a value (given or default)."""
        value = self.get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"parameter {name!r} of {self.name!r} is not a number: {value!r}")
        return float(value)

    def integer(self, name: str) -> int:
        """An int parameter that has a value (given or default)."""
        return int(self.number(name))

    def text(self, name: str) -> str | None:
        """A text or choice parameter, or None when not given and without default."""
        value = self.get(name)
        return None if value is None else str(value)

    @property
    def key(self) -> str | None:
        """The sequence key, if any."""
        return self.text("key")

    @property
    def first(self) -> int | None:
        """How many requests with `key` get the fault, or None for all of them."""
        value = self.get("first")
        return None if value is None else int(value)


def parse_fault(text: str) -> FaultSpec:
    """Parse ``name;k=v;k=v`` (values URL-encoded) into a validated `FaultSpec`.

    A spec whose first item already has ``=`` is ``healthy`` with parameters.

    Raises:
        FaultSpecError: for an empty spec, a repeated or malformed parameter, an unknown
            fault or parameter, or a bad value.
    """
    items = [item.strip() for item in text.split(";")]
    items = [item for item in items if item]
    if not items:
        raise FaultSpecError("empty fault spec; expected 'name;key=value;...'")
    name = "healthy" if "=" in items[0] else unquote(items.pop(0))
    params: dict[str, str] = {}
    for item in items:
        pname, eq, value = item.partition("=")
        pname = unquote(pname).strip()
        if not eq or not pname:
            raise FaultSpecError(f"malformed parameter {item!r} in fault spec; expected k=v")
        if pname in params:
            raise FaultSpecError(f"parameter {pname!r} given twice in fault spec {text!r}")
        params[pname] = unquote(value)
    return FaultSpec(name, params)
