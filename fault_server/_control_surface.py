"""`ServerControls`: the one control surface of `FaultServer` and `ServerThread`.

Every method here reads or changes the server's thread-safe state (`ServerState`: the
scenarios, the mix, the counters and the journal are guarded by locks of their own) or
builds a URL, so it is safe from any thread: a `ServerThread` shares its `FaultServer`'s
state and so the very same methods, and `FaultScope` is written against this class.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._fixtures import Fixture, fixtures_of, load_fixtures
from ._journal import ConnectionRecord
from ._mix import Mix
from ._scenarios import Match, Rule, build_spec
from ._scope import FaultScope
from ._spec import FaultSpec, ParamValue
from ._state import ServerState
from ._stats import KeyStats, ServerStats
from ._verdict import Verdict, judge

__all__ = ["ServerControls"]


class ServerControls:
    """URLs, stats, scenarios, the mix, the journal and verdicts of a running server.

    A subclass sets ``_state`` and gives `base_url`.
    """

    _state: ServerState

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT``, without ``/v1``."""
        raise NotImplementedError

    @property
    def max_hold(self) -> float:
        """The cap on every fault's ``hold``, in seconds."""
        return self._state.max_hold

    @property
    def upstream(self) -> str | None:
        """The real server's base URL in proxy mode, else None."""
        return None if self._state.upstream is None else self._state.upstream.url

    def url(self, fault: str | None = None, /, **params: ParamValue) -> str:
        """The ``base_url`` for an OpenAI client that should meet ``fault``.

        Args:
            fault: a name from `FAULTS`; None (or ``"healthy"`` without params) gives the
                plain ``/v1`` URL.
            **params: the fault's parameters and the generic ones (``key``, ``first``,
                ``hold``, ``delay``, ``token_interval``, ``tokens``).

        Raises:
            FaultSpecError: for an unknown fault, parameter or bad value, before any request.

        Example:
            >>> srv.url("trickle_body", interval=0.5)  # doctest: +SKIP
            'http://127.0.0.1:41000/fault/trickle_body;interval=0.5/v1'
        """
        spec = FaultSpec(fault or "healthy", params)
        if spec.name == "healthy" and not spec.params:
            return f"{self.base_url}/v1"
        return f"{self.base_url}/fault/{spec}/v1"

    # -- stats -------------------------------------------------------------------------

    def stats(self) -> ServerStats:
        """Counts since start or the last `reset_stats`. Safe from any thread."""
        return self._state.counters.snapshot()

    def key_stats(self, key: str) -> KeyStats:
        """Counts for requests that carried ``key``; zeros for a key never seen."""
        return self._state.counters.key(key)

    def reset_stats(self) -> None:
        """Zero the counts and the per-key sequences (``first=N`` starts over), restart the
        mix's draws and empty the journal. Armed scenarios and the mix stay."""
        self._state.reset()

    def reset(self) -> None:
        """`reset_stats`, and disarm every scenario and the mix: as freshly started."""
        self._state.scenarios.clear()
        self._state.mix.set(None)
        self._state.reset()

    # -- scenarios and mix ---------------------------------------------------------------

    def scenario(
        self,
        fault: str | FaultSpec = "healthy",
        /,
        *,
        times: int | None = None,
        key: str | None = None,
        path: str | None = None,
        method: str | None = None,
        stream: bool | None = None,
        model: str | None = None,
        rule_id: str | None = None,
        **params: ParamValue,
    ) -> Rule:
        """Arm ``fault`` for the requests that match, ``times`` times (None: every time).

        Requests take the first armed rule that matches them and has uses left; a request
        that names its fault in an ``X-Fault`` header ignores the rules. "Fail twice, then
        answer" is ``scenario("status", code=503, times=2, key=k)``.

        Args:
            fault: a name from `FAULTS` (with ``params``), a spec text, or a `FaultSpec`.
            times: how many requests it applies to; None for all of them.
            key, path, method, stream, model: what a request must match (see `Match`);
                ``key`` is the request's sequence key (``url(key=...)`` or ``X-Fault-Key``).
            rule_id: names the rule; re-arming the same id replaces it.
            **params: the fault's parameters.

        Raises:
            FaultSpecError: for a bad fault, parameter, match or ``times``.

        Example:
            >>> srv.scenario("status", code=503, times=2, key="job-7")  # doctest: +SKIP
        """
        spec = build_spec(fault, params)
        rule = Rule(
            id=rule_id or self._state.scenarios.new_id(),
            spec=spec,
            match=Match(key=key, path=path, method=method, stream=stream, model=model),
            times=times,
        )
        return self._state.scenarios.add(rule)

    def scenarios(self, key: str | None = None) -> tuple[Rule, ...]:
        """The armed rules (those matching ``key`` if given), with their uses left."""
        return self._state.scenarios.rules(key)

    def clear_scenarios(self, key: str | None = None) -> int:
        """Disarm every rule, or those matching ``key``; returns how many."""
        return self._state.scenarios.clear(key)

    def set_mix(
        self,
        weights: Mapping[str, float] | Mapping[FaultSpec, float],
        *,
        seed: int = 0,
        key: str | None = None,
    ) -> Mix:
        """Serve a seeded random mix of faults to requests that nothing else chose.

        Args:
            weights: fault spec (text or `FaultSpec`) to probability; they sum to at most 1,
                the rest is healthy.
            seed: the same seed gives the same faults to the n-th request of each key.
            key: apply only to requests with this key.

        Raises:
            FaultSpecError: for a bad spec, weight or seed.

        Example:
            >>> srv.set_mix({"status;code=503": 0.2, "sse_stall": 0.1}, seed=7)  # doctest: +SKIP
        """
        mix = Mix.of(weights, seed, key)
        self._state.mix.set(mix)
        return mix

    def clear_mix(self) -> None:
        """Stop the mix."""
        self._state.mix.set(None)

    @property
    def mix(self) -> Mix | None:
        """The mix in force, if any."""
        return self._state.mix.mix

    # -- fixtures --------------------------------------------------------------------------

    def fixture(
        self,
        *,
        reply: str | None = None,
        tool_call: Mapping[str, Any] | None = None,
        tool_calls: Sequence[Mapping[str, Any]] | None = None,
        fault: str | FaultSpec | None = None,
        times: int | None = None,
        fixture_id: str | None = None,
        model: str | None = None,
        contains: str | None = None,
        regex: str | None = None,
        tools: Sequence[str] = (),
        headers: Mapping[str, str] | None = None,
        key: str | None = None,
        path: str | None = None,
    ) -> Fixture:
        """Answer the requests that match with a canned ``reply`` or ``tool_call`` (and/or
        deliver it with ``fault``), ``times`` times (None: every time).

        Args:
            reply: the assistant's text.
            tool_call: ``{"name": ..., "arguments": {...}}``: the answer calls it.
            tool_calls: several such calls, made at once (parallel tool calls).
            fault: the fault that delivers the answer.
            times: how many requests it answers; None for all of them.
            fixture_id: names it; loading the same id again replaces it.
            model, contains, regex, tools, headers, key, path: what a request must match
                (see `FixtureMatch`): ``contains`` and ``regex`` look at the last
                message's text, whatever its role.

        Raises:
            FaultSpecError: for a bad field, naming it.

        Example:
            >>> srv.fixture(contains="weather", tool_call={"name": "get_weather",
            ...     "arguments": {"city": "Paris"}})  # doctest: +SKIP
        """
        match = {
            "model": model,
            "contains": contains,
            "regex": regex,
            "tools": list(tools) or None,
            "headers": dict(headers) if headers else None,
            "key": key,
            "path": path,
        }
        data: dict[str, Any] = {
            "match": {k: v for k, v in match.items() if v is not None},
            "reply": reply,
            "tool_call": None if tool_call is None else dict(tool_call),
            "tool_calls": None if tool_calls is None else [dict(c) for c in tool_calls],
            "fault": None if fault is None else str(fault),
            "times": times,
        }
        if fixture_id is not None:
            data["id"] = fixture_id
        (made,) = fixtures_of([data], self._state.scenarios.new_id())
        self._state.fixtures.add([made])
        (armed,) = (f for f in self._state.fixtures.fixtures() if f.id == made.id)
        return armed

    def load_fixtures(self, source: str | os.PathLike[str] | Sequence[Any]) -> int:
        """Add the fixtures of a JSON file (``{"fixtures": [...]}`` or a list), or of that
        data itself; one whose ``id`` is loaded replaces it. Returns how many.

        Raises:
            FaultSpecError: a file that cannot be read or a bad fixture: none is added.
        """
        if isinstance(source, (str, os.PathLike)):
            loaded = load_fixtures(source)
        else:
            loaded = fixtures_of(list(source), self._state.scenarios.new_id())
        self._state.fixtures.add(loaded)
        return len(loaded)

    def fixtures(self) -> tuple[Fixture, ...]:
        """The loaded fixtures, in order, with their uses left."""
        return self._state.fixtures.fixtures()

    def clear_fixtures(self, key: str | None = None) -> int:
        """Unload every fixture, or those matching ``key``; returns how many."""
        return self._state.fixtures.clear(key)

    # -- journal and verdicts ------------------------------------------------------------

    def journal(
        self,
        key: str | None = None,
        *,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> tuple[ConnectionRecord, ...]:
        """What each connection did, oldest first; filtered, the connections with requests
        that match (and only those requests). Safe from any thread."""
        return self._state.journal.snapshot(
            key=key, request_id=request_id, idempotency_key=idempotency_key
        )

    def verdict(
        self,
        key: str | None = None,
        *,
        request_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Verdict:
        """How the client behaved over the requests with this key, x-request-id or
        Idempotency-Key: attempts and their spacing, when it gave up, what it left
        dangling, whether it honoured Retry-After. See `Verdict`.

        Raises:
            ValueError: if no filter is given.
        """
        if key is None and request_id is None and idempotency_key is None:
            raise ValueError("verdict() needs a key, a request_id or an idempotency_key")
        return judge(self.journal(key, request_id=request_id, idempotency_key=idempotency_key))

    def forget(self, key: str) -> dict[str, int]:
        """Drop everything the server keeps for ``key``: its journal entries, its counts
        (its ``first=N`` sequence starts over), its mix draws, its rules and its fixtures.
        Safe from any thread. Returns how many ``requests``, ``counts``, ``rules``,
        ``draws`` and ``fixtures`` went."""
        return self._state.forget(key)

    def scope(self, key: str) -> FaultScope:
        """A `FaultScope`: URLs, scenarios, stats and verdicts for one key."""
        return FaultScope(self, key)
