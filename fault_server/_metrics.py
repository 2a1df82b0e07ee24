"""`GET /metrics`: the server's own gauges, in Prometheus's text exposition format.

Each request being handled is in one **phase**; the ones named after vLLM's and SGLang's
gauges count as an inference server's would, so a tool that reads those servers (a
``diagnose`` command, a dashboard) reads this one the same way:

=========  ===========================================================================
phase      a request that...
=========  ===========================================================================
reading    had its head read, and its body not (yet): it never reached "the engine".
           ``half_open`` stays here, whatever it read: it never answers, by design.
waiting    was read whole and is held before its answer starts: its ``delay``, and
           ``stall_headers`` all along (an engine's queue: accepted, not scheduled).
running    is being answered: from the moment its fault starts to produce the answer
           (a healthy stream, ``trickle_body``, ``slow_first_token``, ``sse_stall``,
           a ``status`` error...) until it ends.
=========  ===========================================================================

Connections held by a connection-level fault (``slow_accept``, ``refuse``, ``tls_stall``)
or idle between requests have no request: they are counted apart, never as running or
waiting.

=================================================  =====  ==================================
name                                               type   value
=================================================  =====  ==================================
``fault_server_requests_in_flight{fault,phase}``   gauge  requests by fault name and phase
``fault_server_connections_open``                  gauge  connections open on the main port
``fault_server_connections_held{fault}``           gauge  connections a connection-level
                                                          fault holds before any request
``fault_server_connections_accepted_total``        count  since start or the last reset
``fault_server_requests_total``                    count  request heads read (not control)
``vllm:num_requests_running{model_name}``          gauge  phase ``running``
``vllm:num_requests_waiting{model_name}``          gauge  phase ``waiting``
``sglang:num_running_reqs{model_name}``            gauge  phase ``running``
``sglang:num_queue_reqs{model_name}``              gauge  phase ``waiting``
=================================================  =====  ==================================

``model_name`` is always ``fault-model``: one series per name, whatever models the requests
named. The gauges are read from the live requests when scraped, never kept as counters that
could drift.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

from ._openai import Whole

if TYPE_CHECKING:
    from ._state import ServerState

__all__ = ["PATH", "Flight", "Flights", "Phase", "exposition"]

PATH = "/metrics"
Phase = Literal["reading", "waiting", "running"]
PHASES: tuple[Phase, ...] = ("reading", "waiting", "running")
# Faults that keep their request out of ``running`` while they hold it.
_HOLDING: dict[str, Phase] = {"half_open": "reading", "stall_headers": "waiting"}
_MODEL = "fault-model"
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Flight:
    """One request being handled: its fault's name and its phase (set on the server's loop,
    read by a scrape in another thread)."""

    __slots__ = ("fault", "phase")

    def __init__(self) -> None:
        self.fault = "healthy"
        self.phase: Phase = "reading"

    def queued(self, fault: str) -> None:
        """The request, read whole (but by ``half_open``), waits its ``delay``."""
        self.fault = fault
        self.phase = "reading" if fault == "half_open" else "waiting"

    def answering(self, fault: str) -> None:
        """The fault ``fault`` starts on the request."""
        self.fault = fault
        self.phase = _HOLDING.get(fault, "running")


class Flights:
    """The requests in flight, and the connections held by connection-level faults."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: set[Flight] = set()
        self._held: Counter[str] = Counter()

    @contextmanager
    def request(self) -> Iterator[Flight]:
        """A request in flight for the duration of the block."""
        flight = Flight()
        with self._lock:
            self._flights.add(flight)
        try:
            yield flight
        finally:
            with self._lock:
                self._flights.discard(flight)

    @contextmanager
    def holding(self, fault: str) -> Iterator[None]:
        """A connection held by the connection-level ``fault`` for the block."""
        with self._lock:
            self._held[fault] += 1
        try:
            yield
        finally:
            with self._lock:
                self._held[fault] -= 1

    def counts(self) -> tuple[Counter[tuple[str, Phase]], Counter[str]]:
        """Requests by (fault, phase), and held connections by fault, now."""
        with self._lock:
            flights = list(self._flights)
            held = Counter({k: v for k, v in self._held.items() if v > 0})
        return Counter((f.fault, f.phase) for f in flights), held


def exposition(state: ServerState) -> Whole:
    """The metrics, as a Prometheus scrape reads them."""
    requests, held = state.flights.counts()
    stats = state.counters.snapshot()
    by_phase = Counter[str]()
    for (_, phase), n in requests.items():
        by_phase[phase] += n
    running, waiting = by_phase["running"], by_phase["waiting"]
    model = f'{{model_name="{_MODEL}"}}'
    lines = [
        *_family(
            "fault_server_requests_in_flight",
            "gauge",
            "Requests being handled, by fault and phase (reading, waiting, running).",
        ),
        *(
            f'fault_server_requests_in_flight{{fault="{fault}",phase="{phase}"}} {n}'
            for (fault, phase), n in sorted(requests.items())
        ),
        *_family("fault_server_connections_open", "gauge", "Connections open on the main port."),
        f"fault_server_connections_open {stats.connections_open}",
        *_family(
            "fault_server_connections_held",
            "gauge",
            "Connections a connection-level fault holds before any request is read.",
        ),
        *(f'fault_server_connections_held{{fault="{f}"}} {n}' for f, n in sorted(held.items())),
        *_family(
            "fault_server_connections_accepted_total",
            "counter",
            "Connections accepted on the main port since start or the last reset.",
        ),
        f"fault_server_connections_accepted_total {stats.connections_accepted}",
        *_family(
            "fault_server_requests_total",
            "counter",
            "Request heads read, not counting the control API, since start or the last reset.",
        ),
        f"fault_server_requests_total {stats.requests}",
        *_family("vllm:num_requests_running", "gauge", "Requests being answered (vLLM's name)."),
        f"vllm:num_requests_running{model} {running}",
        *_family(
            "vllm:num_requests_waiting",
            "gauge",
            "Requests read and held before their answer starts (vLLM's name).",
        ),
        f"vllm:num_requests_waiting{model} {waiting}",
        *_family("sglang:num_running_reqs", "gauge", "Requests being answered (SGLang's name)."),
        f"sglang:num_running_reqs{model} {running}",
        *_family(
            "sglang:num_queue_reqs",
            "gauge",
            "Requests read and held before their answer starts (SGLang's name).",
        ),
        f"sglang:num_queue_reqs{model} {waiting}",
    ]
    return Whole(200, ("\n".join(lines) + "\n").encode(), content_type=_CONTENT_TYPE)


def _family(name: str, kind: str, help_text: str) -> tuple[str, str]:
    return f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"
