"""Fixtures: canned answers for the requests that match, to script a whole conversation.

A fixture is a `FixtureMatch` (model, the last message's text by substring or regex, tools
offered, headers, key, path) and an answer: a ``reply`` (the assistant's text), a
``tool_call`` (a function name and its arguments; ``tool_calls``, several at once), or
neither, with a ``fault`` that
delivers it (``status;code=503``, ``token_rate;tps=5``...). Requests take the first
fixture that matches and has uses left (``times``), as they take scenario rules.

Fixtures come from a JSON file (``FaultServer(fixtures=...)``, ``fault-server --fixtures``),
the control API (``/_fault/fixtures``) or `FaultServer.fixture`. Everything is checked whole
before anything changes: a bad file or payload is a `FaultSpecError` naming the fixture and
field (a 400 over HTTP). Bounded: at most `MAX_FIXTURES` fixtures, files of at most
`MAX_FILE` bytes, patterns of at most `MAX_PATTERN` characters without a repeat inside a
repeat (the shape whose backtracking is exponential), matched against at most `MAX_TEXT`
characters of the text: a fixture cannot make matching hang the server.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
import re
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._json_depth import loads as loads_limited
from ._openai import ChatRequest
from ._scenarios import spec_of
from ._spec import FaultSpec, FaultSpecError

__all__ = [
    "MAX_FILE",
    "MAX_FIXTURES",
    "Fixture",
    "FixtureMatch",
    "Fixtures",
    "MAX_PATTERN",
    "MAX_TEXT",
    "load_fixtures",
]

MAX_FIXTURES = 10_000
MAX_FILE = 8 * 1024 * 1024
MAX_PATTERN = 1000
MAX_TEXT = 64 * 1024  # characters of a message's text a pattern is matched against.
_MATCH_FIELDS = ("model", "contains", "regex", "tools", "headers", "key", "path")
_FIELDS = ("id", "match", "reply", "tool_call", "tool_calls", "fault", "times")
MAX_CALLS = 16  # tool calls in one answer.


@dataclass(frozen=True, slots=True)
class FixtureMatch:
    """Which requests a fixture answers; a field left out matches anything.

    Args:
        model: a glob on the request's ``model``.
        contains: a substring of the last message's text (whatever its role: a tool's
            result too), case-sensitive.
        regex: a regular expression searched in that text.
        tools: tool names the request must all offer.
        headers: request headers that must be present with these values (names
            case-insensitive, values exact).
        key: the request's sequence key (``key=`` in its spec, or ``X-Fault-Key``).
        path: a glob on the path, ``/v1/chat/*``.
    """

    model: str | None = None
    contains: str | None = None
    regex: str | None = None
    tools: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    key: str | None = None
    path: str | None = None
    _pattern: re.Pattern[str] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("model", "contains", "regex", "key", "path"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise FaultSpecError(f"match {name!r} must be a non-empty string, got {value!r}")
        if not all(isinstance(t, str) and t for t in self.tools):
            raise FaultSpecError(f"match 'tools' must be a list of names, got {self.tools!r}")
        if not all(isinstance(n, str) and isinstance(v, str) and n for n, v in self.headers):
            raise FaultSpecError("match 'headers' must map header names to strings")
        object.__setattr__(self, "headers", tuple((n.lower(), v) for n, v in self.headers))
        if self.regex is not None:
            object.__setattr__(self, "_pattern", _compile(self.regex))

    def matches(
        self, chat: ChatRequest, key: str | None, path: str, headers: Mapping[str, str]
    ) -> bool:
        text = chat.last_text[-MAX_TEXT:]
        return (
            (self.model is None or fnmatch.fnmatchcase(chat.model, self.model))
            and (self.contains is None or self.contains in text)
            and (self._pattern is None or self._pattern.search(text) is not None)
            and all(t in chat.tools for t in self.tools)
            and all(headers.get(n) == v for n, v in self.headers)
            and (self.key is None or key == self.key)
            and (self.path is None or fnmatch.fnmatchcase(path, self.path))
        )

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in _MATCH_FIELDS:
            value = getattr(self, name)
            if name == "headers" and value:
                out[name] = dict(value)
            elif name == "tools" and value:
                out[name] = list(value)
            elif value and name not in ("headers", "tools"):
                out[name] = value
        return out


@dataclass(frozen=True, slots=True)
class Fixture:
    """One canned answer: what to answer, to which requests, how many times.

    Attributes:
        id: names it; adding a fixture with an id already loaded replaces it.
        match: which requests it answers.
        reply: the assistant's text (the whole answer, word by word when streamed).
        tool_calls: ``(name, arguments JSON)`` of each function the answer calls, in order
            (parallel tool calls when there are several).
        fault: the fault that delivers the answer (healthy if None); a request's own
            ``X-Fault`` header and a scenario rule win over it, as over a path's fault.
        times: how many requests it answers; None for every one.
        remaining, used: set by the server in snapshots.
    """

    id: str
    match: FixtureMatch = field(default_factory=FixtureMatch)
    reply: str | None = None
    tool_calls: tuple[tuple[str, str], ...] = ()
    fault: FaultSpec | None = None
    times: int | None = None
    remaining: int | None = None
    used: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or len(self.id) > 200:
            raise FaultSpecError(f"fixture id must be a non-empty string, got {self.id!r}")
        if self.reply is not None and not isinstance(self.reply, str):
            raise FaultSpecError(f"'reply' must be a string, got {self.reply!r}")
        if self.reply is not None and self.tool_calls:
            raise FaultSpecError("a fixture answers a 'reply' or a 'tool_call', not both")
        if self.reply is None and not self.tool_calls and self.fault is None:
            raise FaultSpecError("a fixture needs a 'reply', a 'tool_call' or a 'fault'")
        if len(self.tool_calls) > MAX_CALLS:
            raise FaultSpecError(f"a fixture makes at most {MAX_CALLS} tool calls")
        times = self.times
        if times is not None and (isinstance(times, bool) or not isinstance(times, int)):
            raise FaultSpecError(f"'times' must be a positive integer or null, got {times!r}")
        if times is not None and times < 1:
            raise FaultSpecError(f"'times' must be a positive integer or null, got {times!r}")
        if self.fault is not None:
            if self.fault.info.scope == "connection":
                raise FaultSpecError(
                    f"fault {self.fault.name!r} acts on a connection before any request is "
                    "read: a fixture cannot deliver it"
                )
            if "first" in self.fault.params:
                raise FaultSpecError("a fixture counts its uses with 'times', not 'first'")
        if self.remaining is None and times is not None:
            object.__setattr__(self, "remaining", times - self.used)

    def answer(self, chat: ChatRequest) -> ChatRequest:
        """``chat`` with this fixture's reply or tool calls as its answer."""
        if self.reply is not None:
            return _replace(chat, reply=self.reply, tool_name=None, json_text=None)
        if self.tool_calls:
            (name, arguments), *more = self.tool_calls
            return _replace(
                chat,
                tool_name=name,
                tool_arguments=arguments,
                more_calls=tuple(more),
                json_text=None,
            )
        return chat

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "match": self.match.as_dict()}
        if self.reply is not None:
            out["reply"] = self.reply
        if self.tool_calls:
            out["tool_calls"] = [
                {"name": name, "arguments": json.loads(arguments)}
                for name, arguments in self.tool_calls
            ]
        if self.fault is not None:
            out["fault"] = str(self.fault)
        out.update(times=self.times, remaining=self.remaining, used=self.used)
        return out

    @classmethod
    def from_json(cls, data: object, default_id: str) -> Fixture:
        """A fixture from its JSON form (see docs/fault_control.md#fixtures).

        Raises:
            FaultSpecError: naming the bad field.
        """
        data = _fields(data, "a fixture", "fixture", _FIELDS)
        fault = data.get("fault")
        return cls(
            id=data.get("id", default_id),
            match=_match_of(data.get("match")),
            reply=data.get("reply"),
            tool_calls=_tool_calls_of(data),
            fault=None if fault is None else spec_of(fault),
            times=data.get("times"),
        )


def _match_of(match: object) -> FixtureMatch:
    if match is None:
        return FixtureMatch()
    match = _fields(match, "'match'", "match", _MATCH_FIELDS)
    tools = match.get("tools", [])
    if not isinstance(tools, list):
        raise FaultSpecError(f"match 'tools' must be a list of names, got {tools!r}")
    headers = match.get("headers", {})
    if not isinstance(headers, dict):
        raise FaultSpecError(f"match 'headers' must be an object, got {headers!r}")
    fields = {k: v for k, v in match.items() if k not in ("tools", "headers")}
    return FixtureMatch(**fields, tools=tuple(tools), headers=tuple(headers.items()))


def _fields(data: object, what: str, kind: str, known: tuple[str, ...]) -> dict[str, Any]:
    """``data``, a JSON object with no field but the ``known`` ones.

    Raises:
        FaultSpecError: naming what is wrong.
    """
    if not isinstance(data, dict):
        raise FaultSpecError(f"{what} must be a JSON object, got {data!r}")
    unknown = set(data) - set(known)
    if unknown:
        raise FaultSpecError(
            f"unknown {kind} field(s) {sorted(unknown)}; known: {', '.join(known)}"
        )
    return data


def _tool_calls_of(data: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """``tool_call`` (one) or ``tool_calls`` (a list), validated."""
    if data.get("tool_call") is not None and data.get("tool_calls") is not None:
        raise FaultSpecError("give 'tool_call' (one) or 'tool_calls' (a list), not both")
    if data.get("tool_call") is not None:
        return (_tool_call_of(data["tool_call"]),)
    calls = data.get("tool_calls")
    if calls is None:
        return ()
    if not isinstance(calls, list) or not calls:
        raise FaultSpecError(f"'tool_calls' must be a non-empty list, got {calls!r}")
    return tuple(_tool_call_of(call) for call in calls)


def _tool_call_of(call: object) -> tuple[str, str]:
    if not isinstance(call, dict) or set(call) - {"name", "arguments"} or "name" not in call:
        raise FaultSpecError(
            f'\'tool_call\' must be {{"name": ..., "arguments": {{...}}}}, got {call!r}'
        )
    name, arguments = call["name"], call.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise FaultSpecError(f"'tool_call' name must be a non-empty string, got {name!r}")
    if not isinstance(arguments, dict):
        raise FaultSpecError(f"'tool_call' arguments must be an object, got {arguments!r}")
    return name, json.dumps(arguments)


def _compile(pattern: str) -> re.Pattern[str]:
    if len(pattern) > MAX_PATTERN:
        raise FaultSpecError(f"match 'regex' is longer than {MAX_PATTERN} characters")
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        raise FaultSpecError(f"match 'regex' {pattern!r} does not compile: {exc}") from None
    if _nested_repeat(pattern):
        raise FaultSpecError(
            f"match 'regex' {pattern!r} repeats a repeat or an alternation (like (a+)+): its "
            "matching can take exponential time; write it without the nesting"
        )
    return compiled


def _nested_repeat(pattern: str) -> bool:
    """Whether ``pattern`` has a repeat (or alternation) inside a repeat."""
    parser: Any = sys.modules.get("re._parser") or sys.modules.get("sre_parse")
    if parser is None:  # pragma: no cover - re imports one of them.
        return False
    constants: Any = sys.modules.get("re._constants") or sys.modules.get("sre_constants")
    repeats = {constants.MAX_REPEAT, constants.MIN_REPEAT}
    repeats |= {getattr(constants, "POSSESSIVE_REPEAT", constants.MAX_REPEAT)}

    def walk(items: Iterable[Any], inside: bool) -> bool:
        for op, av in items:
            if op in repeats:
                found = inside or walk(av[2], True)
            elif op is constants.BRANCH:
                found = inside or any(walk(branch, inside) for branch in av[1])
            elif op is constants.SUBPATTERN:
                found = walk(av[-1], inside)
            elif op in (constants.ASSERT, constants.ASSERT_NOT):
                found = walk(av[1], inside)
            else:
                found = False
            if found:
                return True
        return False

    return walk(parser.parse(pattern), False)


def _replace(chat: ChatRequest, **changes: Any) -> ChatRequest:
    return dataclasses.replace(chat, **changes)


def load_fixtures(path: str | os.PathLike[str]) -> list[Fixture]:
    """The fixtures of a JSON file: ``{"fixtures": [...]}`` or a list.

    Raises:
        FaultSpecError: a file that cannot be read, is too large, is not JSON, or holds a
            bad fixture (named by its position).
    """
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_FILE + 1)
    except OSError as exc:
        raise FaultSpecError(f"cannot read the fixtures file {os.fspath(path)!r}: {exc}") from None
    if len(data) > MAX_FILE:
        raise FaultSpecError(f"the fixtures file is larger than {MAX_FILE} bytes")
    try:
        parsed = loads_limited(data)
    except (ValueError, UnicodeDecodeError) as exc:
        hint = ""
        if os.fspath(path).endswith((".yaml", ".yml")):
            hint = " (fixtures files are JSON: no YAML parser is among fault_server's needs)"
        raise FaultSpecError(f"the fixtures file is not valid JSON{hint}: {exc}") from None
    return fixtures_of(parsed, "file")


def fixtures_of(data: object, prefix: str) -> list[Fixture]:
    """Fixtures from JSON: ``{"fixtures": [...]}`` or a list; those without an id are named
    ``<prefix>-<position>`` (so loading the same list twice replaces, not adds).

    Raises:
        FaultSpecError: naming the position and the field of a bad one.
    """
    if isinstance(data, dict) and set(data) == {"fixtures"}:
        data = data["fixtures"]
    if not isinstance(data, list):
        raise FaultSpecError('fixtures must be {"fixtures": [...]} or a list')
    if len(data) > MAX_FIXTURES:
        raise FaultSpecError(f"at most {MAX_FIXTURES} fixtures can be loaded at once")
    out = []
    for i, item in enumerate(data):
        try:
            out.append(Fixture.from_json(item, f"{prefix}-{i + 1}"))
        except FaultSpecError as exc:
            raise FaultSpecError(f"fixture {i}: {exc}") from None
    return out


class _Live:
    __slots__ = ("fixture", "remaining", "used")

    def __init__(self, fixture: Fixture) -> None:
        self.fixture = fixture
        self.remaining = fixture.times
        self.used = 0


class Fixtures:
    """The loaded fixtures, in order; every method is atomic and safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: list[_Live] = []

    def __bool__(self) -> bool:
        return bool(self._live)

    def add(self, fixtures: Iterable[Fixture]) -> None:
        """Add at the end; one whose id is loaded replaces it, uses restored.

        Raises:
            FaultSpecError: past `MAX_FIXTURES` (nothing is added).
        """
        with self._lock:
            live = list(self._live)
            where = {f.fixture.id: i for i, f in enumerate(live)}
            for fixture in fixtures:
                if fixture.id in where:
                    live[where[fixture.id]] = _Live(fixture)
                else:
                    where[fixture.id] = len(live)
                    live.append(_Live(fixture))
            if len(live) > MAX_FIXTURES:
                raise FaultSpecError(f"at most {MAX_FIXTURES} fixtures can be loaded at once")
            self._live = live

    def replace(self, fixtures: Iterable[Fixture]) -> None:
        with self._lock:
            self._live = []
        self.add(fixtures)

    def clear(self, key: str | None = None) -> int:
        """Unload every fixture (or those whose match has ``key``); returns how many."""
        with self._lock:
            kept = [] if key is None else [f for f in self._live if f.fixture.match.key != key]
            count, self._live = len(self._live) - len(kept), kept
            return count

    def fixtures(self) -> tuple[Fixture, ...]:
        with self._lock:
            copies = [(f.fixture, f.remaining, f.used) for f in self._live]
        return tuple(_snapshot(*copy) for copy in copies)

    def take(
        self, chat: ChatRequest, key: str | None, path: str, headers: Mapping[str, str]
    ) -> Fixture | None:
        """The first fixture with uses left that matches, with one use taken."""
        if not self._live:  # the common case, without the lock.
            return None
        with self._lock:
            for live in self._live:
                if live.remaining != 0 and live.fixture.match.matches(chat, key, path, headers):
                    if live.remaining is not None:
                        live.remaining -= 1
                    live.used += 1
                    return _snapshot(live.fixture, live.remaining, live.used)
        return None


def _snapshot(fixture: Fixture, remaining: int | None, used: int) -> Fixture:
    return dataclasses.replace(fixture, remaining=remaining, used=used)
