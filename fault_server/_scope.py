"""`FaultScope`: one test's view of a shared fault server, through one key.

A session-wide server is shared by every test; a key keeps what one test arms, counts and
judges apart from the others. A scope puts that key on everything: the URLs it builds carry
it, the scenarios it arms match only it, its stats, journal and verdict are its own, and
`clear` disarms only its rules. The ``fault_scope`` pytest fixture gives each test one and
forgets it afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._fixtures import Fixture
from ._journal import ConnectionRecord
from ._mix import Mix
from ._scenarios import Rule, build_spec
from ._spec import FaultSpec, FaultSpecError, ParamValue
from ._stats import KeyStats
from ._verdict import Verdict

if TYPE_CHECKING:  # the controls make scopes.
    from ._control_surface import ServerControls

__all__ = ["FaultScope"]


class FaultScope:
    """URLs, scenarios, stats and verdicts for the requests that carry one key.

    Args:
        server: a `FaultServer` or `ServerThread`.
        key: the key; a test's own (the ``fault_key`` fixture) keeps tests apart.

    Example:
        >>> scope = srv.scope("job-7")  # doctest: +SKIP
        >>> scope.fail_first(2, "status", code=503)  # doctest: +SKIP
        >>> client = openai.OpenAI(base_url=scope.url(), api_key="x")  # doctest: +SKIP
        >>> scope.verdict().attempts  # doctest: +SKIP
        3
    """

    def __init__(self, server: ServerControls, key: str) -> None:
        FaultSpec("healthy", {"key": key})  # validates the key.
        self.server = server
        self.key = key

    def __repr__(self) -> str:
        return f"FaultScope(key={self.key!r})"

    def url(self, fault: str | None = None, /, **params: ParamValue) -> str:
        """The server's ``url()`` with this key: every request it makes is in the scope."""
        if "key" in params:
            raise FaultSpecError("a FaultScope sets 'key' itself")
        return self.server.url(fault, key=self.key, **params)

    def headers(self, fault: str | None = None, /, **params: ParamValue) -> dict[str, str]:
        """Headers that put one request in the scope: ``X-Fault-Key``, and an ``X-Fault``
        with this key when ``fault`` or ``params`` are given."""
        if "key" in params:
            raise FaultSpecError("a FaultScope sets 'key' itself")
        if fault is None and not params:
            return {"X-Fault-Key": self.key}
        spec = build_spec(fault or "healthy", {**params, "key": self.key})
        return {"X-Fault": str(spec), "X-Fault-Key": self.key}

    def scenario(
        self,
        fault: str | FaultSpec = "healthy",
        /,
        *,
        times: int | None = None,
        path: str | None = None,
        method: str | None = None,
        stream: bool | None = None,
        model: str | None = None,
        rule_id: str | None = None,
        **params: ParamValue,
    ) -> Rule:
        """Arm a rule that matches only this key (see `FaultServer.scenario`)."""
        return self.server.scenario(
            fault,
            times=times,
            key=self.key,
            path=path,
            method=method,
            stream=stream,
            model=model,
            rule_id=rule_id,
            **params,
        )

    def fail_first(
        self, n: int, fault: str | FaultSpec = "status", /, **params: ParamValue
    ) -> Rule:
        """The first ``n`` requests of the scope meet ``fault``; later ones are answered."""
        return self._arm(fault, n, params)

    def then(
        self, fault: str | FaultSpec, /, times: int | None = 1, **params: ParamValue
    ) -> FaultScope:
        """Arm ``fault`` for the next ``times`` requests after the rules already armed;
        chainable: ``scope.then("reset").then("status", code=503).then("sse_stall")``."""
        self._arm(fault, times, params)
        return self

    def _arm(
        self, fault: str | FaultSpec, times: int | None, params: Mapping[str, ParamValue]
    ) -> Rule:
        return self.server.scenario(
            build_spec(fault, params),
            times=times,
            key=self.key,
            path=None,
            method=None,
            stream=None,
            model=None,
            rule_id=None,
        )

    def fixture(self, **fields: Any) -> Fixture:
        """Load a fixture that answers only this key's requests (see
        `FaultServer.fixture`, whose arguments it takes but ``key``)."""
        if "key" in fields:
            raise FaultSpecError("a FaultScope sets 'key' itself")
        return self.server.fixture(**fields, key=self.key)

    def fixtures(self) -> tuple[Fixture, ...]:
        return tuple(f for f in self.server.fixtures() if f.match.key == self.key)

    def scenarios(self) -> tuple[Rule, ...]:
        return self.server.scenarios(self.key)

    def set_mix(self, weights: Mapping[str, float], *, seed: int = 0) -> Mix:
        """Install a seeded mix for this key only (it replaces any mix in force)."""
        return self.server.set_mix(weights, seed=seed, key=self.key)

    def clear(self) -> None:
        """Disarm this scope's rules and fixtures, and the mix if it is this scope's."""
        self.server.clear_scenarios(self.key)
        self.server.clear_fixtures(self.key)
        mix = self.server.mix
        if mix is not None and mix.key == self.key:
            self.server.clear_mix()

    def forget(self) -> None:
        """`clear`, then drop everything the server keeps for this key: journal entries,
        counts, mix draws. The ``fault_scope`` fixture does it when its test ends."""
        self.clear()
        self.server.forget(self.key)

    def stats(self) -> KeyStats:
        return self.server.key_stats(self.key)

    def journal(self) -> tuple[ConnectionRecord, ...]:
        return self.server.journal(self.key)

    def verdict(self) -> Verdict:
        return self.server.verdict(self.key)
