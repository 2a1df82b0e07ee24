"""Scenarios: faults armed on the server for the requests that match, a number of times.

A request names its own fault with its path or an ``X-Fault`` header. A test can also arm
faults on the server, so that a client it does not control meets them: an ordered list of
rules, each a fault spec, a `Match` (key, path, method, stream, model) and how many
``times`` it applies. A request takes the first rule that matches and has uses left; an
exhausted rule stays listed (``remaining=0``) until cleared. "Fail twice, then succeed" is
one rule with ``times=2``: the third request finds no rule and gets what it would have got
without one. (The seeded random mix, for requests nothing chose, is in `_mix`.)

Rules are changed from any thread (the control API, `FaultServer.scenario`) and read on the
server's loop; one lock keeps every change atomic. A rule's remaining count is taken under
the lock, so two concurrent requests never both take a rule's last use.
"""

from __future__ import annotations

import fnmatch
import heapq
import itertools
import threading
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ._bounded import MAX_RULES
from ._spec import FaultSpec, FaultSpecError, ParamValue, parse_fault

__all__ = [
    "Match",
    "RequestInfo",
    "Rule",
    "Scenarios",
    "build_spec",
    "spec_of",
]

# Connection-level faults a plain listener applies; the TLS listener takes ``tls_stall``.
_PLAIN_CONNECTION = frozenset({"slow_accept", "refuse"})


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What a rule can match on. ``stream`` and ``model`` are None until the body is read."""

    key: str | None
    path: str
    method: str
    stream: bool | None = None
    model: str | None = None


@dataclass(frozen=True, slots=True)
class Match:
    """Which requests a rule applies to; a field left None matches anything.

    Args:
        key: the request's sequence key (``key=`` in its spec, or ``X-Fault-Key``).
        path: a glob on the path without the ``/fault/<spec>`` prefix, like ``/v1/chat/*``.
        method: ``GET``, ``POST``... (case-insensitive).
        stream: whether the chat request asked for a stream.
        model: a glob on the request's ``model``.
    """

    key: str | None = None
    path: str | None = None
    method: str | None = None
    stream: bool | None = None
    model: str | None = None

    def __post_init__(self) -> None:
        for name in ("key", "path", "method", "model"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise FaultSpecError(f"match {name!r} must be a non-empty string, got {value!r}")
        if self.stream is not None and not isinstance(self.stream, bool):
            raise FaultSpecError(f"match 'stream' must be true or false, got {self.stream!r}")
        if self.method is not None:
            object.__setattr__(self, "method", self.method.upper())

    @property
    def empty(self) -> bool:
        return all(getattr(self, n) is None for n in ("key", "path", "method", "stream", "model"))

    @property
    def needs_body(self) -> bool:
        """Whether matching needs fields read from the request body."""
        return self.stream is not None or self.model is not None

    def head_matches(self, info: RequestInfo) -> bool:
        return (
            (self.key is None or info.key == self.key)
            and (self.path is None or fnmatch.fnmatchcase(info.path, self.path))
            and (self.method is None or info.method.upper() == self.method)
        )

    def matches(self, info: RequestInfo) -> bool:
        return (
            self.head_matches(info)
            and (self.stream is None or info.stream is self.stream)
            and (self.model is None or (info.model is not None and _glob(info.model, self.model)))
        )


@dataclass(frozen=True, slots=True)
class Rule:
    """One armed fault: what to do, to which requests, how many times.

    Attributes:
        id: names the rule; adding a rule with an id already armed replaces it, so
            re-sending the same rule is idempotent.
        spec: the fault to apply.
        match: which requests it applies to.
        times: how many requests it applies to; None for every one.
        remaining: uses left (None: unlimited). Set by the server in snapshots.
        used: requests it was applied to so far.
    """

    id: str
    spec: FaultSpec
    match: Match = field(default_factory=Match)
    times: int | None = None
    remaining: int | None = None
    used: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id or len(self.id) > 200:
            raise FaultSpecError(f"rule id must be a non-empty string, got {self.id!r}")
        times = self.times
        if times is not None and (isinstance(times, bool) or not isinstance(times, int)):
            raise FaultSpecError(f"'times' must be a positive integer or null, got {times!r}")
        if times is not None and times < 1:
            raise FaultSpecError(f"'times' must be a positive integer or null, got {times!r}")
        if "first" in self.spec.params:
            raise FaultSpecError("a rule counts its uses with 'times', not 'first'")
        if self.spec.info.scope == "connection" and not _key_only(self.match):
            raise FaultSpecError(
                f"fault {self.spec.name!r} acts on a connection before any request is read: "
                "its rule can match a key only (then it takes the connection whose first "
                "request carries that key), not path, method, stream or model"
            )
        if self.spec.name == "tls_stall" and self.match.key is not None:
            raise FaultSpecError(
                "tls_stall stalls the TLS handshake, before any request can carry a key: "
                "its rule cannot match one"
            )
        if self.remaining is None and times is not None:
            object.__setattr__(self, "remaining", times - self.used)

    @property
    def connection_level(self) -> bool:
        return self.spec.info.scope == "connection"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "fault": str(self.spec),
            "match": {k: v for k, v in asdict(self.match).items() if v is not None},
            "times": self.times,
            "remaining": self.remaining,
            "used": self.used,
        }

    @classmethod
    def from_json(cls, data: object, default_id: str) -> Rule:
        """A rule from its JSON form: ``{"fault": "status;code=503", "times": 2, "match":
        {"key": "k"}, "id": "r1"}``; only ``fault`` is required.

        Raises:
            FaultSpecError: naming the bad field.
        """
        if not isinstance(data, dict):
            raise FaultSpecError(f"a scenario must be a JSON object, got {data!r}")
        unknown = set(data) - {"fault", "times", "match", "id"}
        if unknown:
            raise FaultSpecError(
                f"unknown scenario field(s) {sorted(unknown)}; known: fault, times, match, id"
            )
        if "fault" not in data:
            raise FaultSpecError("a scenario needs 'fault', a spec like 'status;code=503'")
        match = data.get("match")
        if match is None:  # absent or null: every request, like an empty object.
            match = {}
        if not isinstance(match, dict):  # "" or [] or false would silently match everything.
            raise FaultSpecError(f"'match' must be a JSON object or null, got {match!r}")
        fields = {"key", "path", "method", "stream", "model"}
        if set(match) - fields:
            raise FaultSpecError(
                f"unknown match field(s) {sorted(set(match) - fields)}; known: "
                + ", ".join(sorted(fields))
            )
        return cls(
            id=data.get("id", default_id),
            spec=spec_of(data["fault"]),
            match=Match(**match),
            times=data.get("times"),
        )


def build_spec(fault: object, params: Mapping[str, ParamValue]) -> FaultSpec:
    """``fault`` (a name, a spec text or a `FaultSpec`) with ``params`` added over its own.

    Raises:
        FaultSpecError: for a bad fault or parameter.
    """
    base = spec_of(fault)
    return FaultSpec(base.name, {**base.params, **params}) if params else base


def spec_of(fault: object) -> FaultSpec:
    """A `FaultSpec` from a spec or its text.

    Raises:
        FaultSpecError: for anything else, or a bad spec.
    """
    if isinstance(fault, FaultSpec):
        return fault
    if not isinstance(fault, str):
        raise FaultSpecError(f"a fault must be a spec like 'status;code=503', got {fault!r}")
    return parse_fault(fault)


class _Live:
    __slots__ = ("remaining", "rule", "seq", "used")

    def __init__(self, rule: Rule, seq: int) -> None:
        self.rule = rule
        self.seq = seq  # its place in the queue: requests take rules in this order.
        self.remaining = rule.times
        self.used = 0


class Scenarios:
    """The ordered rule queue; every method is atomic and safe from any thread.

    Rules are indexed by the key they match (None: any key), so that a request looks only
    at the rules of its own key and those of no key: 10,000 rules armed by other tests'
    scopes cost it nothing. And by id (the first rule with it), so that arming a rule costs
    the same with 10,000 armed as with none.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[_Live] = []
        self._by_key: dict[str | None, list[_Live]] = {}
        self._by_id: dict[str, _Live] = {}
        self._ids = itertools.count(1)
        self._seqs = itertools.count()

    def new_id(self) -> str:
        return f"rule-{next(self._ids)}"

    def add(self, rule: Rule) -> Rule:
        """Arm ``rule`` at the end of the queue, or in place of the rule with its id."""
        with self._lock:
            old = self._by_id.get(rule.id)
            if old is not None:
                live = _Live(rule, old.seq)
                self._rules[self._rules.index(old)] = live
                self._reindex()
            else:
                self._make_room(1)
                live = _Live(rule, next(self._seqs))
                self._rules.append(live)
                self._by_key.setdefault(rule.match.key, []).append(live)
                self._by_id[rule.id] = live
            return _snapshot(live)

    def _reindex(self) -> None:
        """Rebuild the indexes by key and by id (the lock is held)."""
        self._by_key = {}
        self._by_id = {}
        for live in self._rules:
            self._by_key.setdefault(live.rule.match.key, []).append(live)
            self._by_id.setdefault(live.rule.id, live)

    def _make_room(self, n: int) -> None:
        """Drop the oldest exhausted rules until ``n`` more fit under `MAX_RULES` (the
        lock is held).

        Raises:
            FaultSpecError: if live rules alone would exceed it.
        """
        excess = len(self._rules) + n - MAX_RULES
        if excess <= 0:
            return
        exhausted = [i for i, r in enumerate(self._rules) if r.remaining == 0][:excess]
        if len(exhausted) < excess:
            raise FaultSpecError(
                f"at most {MAX_RULES} rules can be armed at once; clear some first"
            )
        dropped = set(exhausted)
        self._rules = [r for i, r in enumerate(self._rules) if i not in dropped]
        self._reindex()

    def replace(self, rules: list[Rule], key: str | None = None) -> None:
        """Replace every rule (or, with ``key``, every rule matching that key) at once."""
        if len(rules) > MAX_RULES:
            raise FaultSpecError(f"at most {MAX_RULES} rules can be armed at once")
        with self._lock:
            kept = [] if key is None else [r for r in self._rules if r.rule.match.key != key]
            old, self._rules = self._rules, kept
            try:
                self._make_room(len(rules))
            except FaultSpecError:
                self._rules = old
                raise
            self._rules += [_Live(rule, next(self._seqs)) for rule in rules]
            self._reindex()

    def clear(self, key: str | None = None) -> int:
        """Disarm every rule (or those whose match has ``key``); returns how many."""
        with self._lock:
            before = len(self._rules)
            if key is None:
                self._rules = []
            else:
                self._rules = [r for r in self._rules if r.rule.match.key != key]
            self._reindex()
            return before - len(self._rules)

    def rules(self, key: str | None = None) -> tuple[Rule, ...]:
        """The rules (of ``key``) with their counts; the lock is held only to copy them."""
        with self._lock:
            copies = [
                (r.rule, r.remaining, r.used)
                for r in self._rules
                if key is None or r.rule.match.key == key
            ]
        return tuple(
            Rule(rule.id, rule.spec, rule.match, rule.times, remaining, used)
            for rule, remaining, used in copies
        )

    def needs_body(self, info: RequestInfo) -> bool:
        """Whether a live rule might match ``info`` once its body is read."""
        if not self._rules:  # the common case, without the lock.
            return False
        with self._lock:
            return any(
                r.remaining != 0
                and not r.rule.connection_level
                and r.rule.match.needs_body
                and r.rule.match.head_matches(info)
                for r in self._candidates(info.key)
            )

    def take(self, info: RequestInfo) -> Rule | None:
        """The first live request rule that matches ``info``, with one use taken."""
        if not self._rules:
            return None
        return self._take(
            info.key, lambda rule: not rule.connection_level and rule.match.matches(info)
        )

    def take_connection(
        self, names: Collection[str] = _PLAIN_CONNECTION, key: str | None = None
    ) -> Rule | None:
        """The first live connection-level rule among ``names`` (by default those of a plain
        TCP listener: ``slow_accept``, ``refuse``), with one use taken: one armed for no key
        (a connection just accepted), or with ``key`` one armed for that key (the
        connection's first request carries it)."""
        if not self._rules:  # the common case, without the lock.
            return None
        return self._take(
            key,
            lambda rule: (
                rule.connection_level and rule.spec.name in names and rule.match.key == key
            ),
        )

    def _candidates(self, key: str | None) -> Iterable[_Live]:
        """The rules a request with ``key`` may take, in queue order (the lock is held)."""
        anyone = self._by_key.get(None, ())
        if key is None:
            return anyone
        own = self._by_key.get(key, ())
        if not own:
            return anyone
        if not anyone:
            return own
        return heapq.merge(anyone, own, key=lambda live: live.seq)

    def _take(self, key: str | None, wanted: Any) -> Rule | None:
        with self._lock:
            for live in self._candidates(key):
                if live.remaining != 0 and wanted(live.rule):
                    if live.remaining is not None:
                        live.remaining -= 1
                    live.used += 1
                    return _snapshot(live)
        return None


def _snapshot(live: _Live) -> Rule:
    rule = live.rule
    return Rule(rule.id, rule.spec, rule.match, rule.times, live.remaining, live.used)


def _key_only(match: Match) -> bool:
    return all(getattr(match, n) is None for n in ("path", "method", "stream", "model"))


def _glob(value: str, pattern: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern)
