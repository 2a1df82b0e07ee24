"""Fault specs: ``name;k=v;k=v`` text parsed into a validated `FaultSpec`.

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

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import quote, unquote

from ._catalogue import FAULTS
from ._params import GENERIC_PARAMS, FaultInfo, FaultSpecError, ParamInfo, ParamValue

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
