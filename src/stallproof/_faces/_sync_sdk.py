"""What the sync SDK faces add to `FaceMixin`: the views read on the engine loop.

`stallproof.openai.OpenAI` and `stallproof.anthropic.Anthropic` are the SDKs' sync clients
over a `Transport2` (`stallproof._faces._sync_transport`): every request is handed to the
process's engine loop, so the bounds, retries, breaker, pacer and registry are the async
faces' own. The engine's state belongs to that loop, so its views are read there too.
"""

from __future__ import annotations

from typing import Any

from .._breaker import CircuitState
from .._inflight import InflightCall
from .._pacer import PacerState
from ._engine_loop import home_of
from ._sdk import FaceMixin
from ._streams import without_cycle

__all__ = ["SyncFaceMixin"]


class SyncFaceMixin(FaceMixin):
    """`FaceMixin` for a sync SDK client: the views run on the engine loop's thread."""

    _sync = True

    def _process_response(self, **kwargs: Any) -> Any:
        # The SDK's sync `_process_response`; a stream dropped unread is freed at once, its
        # call ended, as for the async faces (`_faces._streams`).
        return without_cycle(super(FaceMixin, self)._process_response(**kwargs))  # type: ignore[misc]

    def inflight(self, *, stalled_after: float = 5.0) -> tuple[InflightCall, ...]:
        """Every call through this client's engine in progress now, longest first."""
        engine = self._stallproof.engine
        return home_of(engine).run_sync(lambda: engine.inflight(stalled_after=stalled_after))

    def pacer_state(self) -> PacerState | None:
        """The pacer's state, or None without a pacer."""
        return home_of(self._stallproof.engine).run_sync(self._stallproof.engine.pacer_state)

    def circuits(self) -> dict[str, CircuitState]:
        """The breaker's circuits by upstream (empty without a breaker)."""
        return home_of(self._stallproof.engine).run_sync(self._stallproof.engine.circuits)
