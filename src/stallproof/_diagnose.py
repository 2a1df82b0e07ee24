"""``stallproof diagnose``: the four probes of the origin story in one command, and a verdict.

1. **The fleet's calls** by phase: the tables processes publish (Redis, or local sockets;
   `_top.fetch`) — how many are stalled, how many wait on headers.
2. **The server's own counts**: running and waiting requests, scraped from its Prometheus
   endpoint (vLLM's and SGLang's gauge names, or names given with ``--gauge``), each
   summed over its label sets (one per model, per engine...).
3. **A fresh probe**: one streamed chat request with ``max_tokens=16`` through
   `stallproof.Client`, bounded by ``--timeout``; its time to first token.
4. **The verdict** (`judge`), from the mismatch between them, with its evidence in numbers:

   ===================== ===========================================================
   verdict               when
   ===================== ===========================================================
   ``client_stuck``      the probe answers, and more fleet calls are stalled than the
                         server reports running + waiting: it is not holding them
   ``server_queueing``   the server reports requests waiting (as many as it runs, or
                         the probe was slow or got no answer), or refused the probe
                         (429, 503)
   ``server_stalled``    the probe got no answer in time, and nothing is waiting
   ``server_error``      the probe got another error status, or a broken answer
   ``slow_but_alive``    the probe answered, slower than ``--slow-ttft``; or calls are
                         stalled that the server reports holding
   ``healthy``           none of the above
   ===================== ===========================================================

Every probe is bounded; an address that cannot be reached or metrics that are not
Prometheus text end the command with a message (`DiagnoseError`), never a hang.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from openai.types.chat import ChatCompletionMessageParam

from . import _exceptions as exc
from ._client import Client
from ._config import Limits, Timeouts
from ._faces._transport import AsyncTransport
from ._top import Snapshot, Source, SourceError, fetch

__all__ = [
    "DEFAULT_GAUGES",
    "HEADLINES",
    "DiagnoseError",
    "Fleet",
    "MetricsError",
    "Probe",
    "Report",
    "Server",
    "diagnose",
    "judge",
    "parse_prometheus",
    "render",
]

#: The gauge names read by default, per count: vLLM's, then SGLang's.
DEFAULT_GAUGES: Mapping[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
}
#: Each verdict in words, as the summary starts.
HEADLINES: Mapping[str, str] = {
    "client_stuck": "client-side stuck",
    "server_queueing": "server queueing",
    "server_stalled": "server stalled",
    "server_error": "server error",
    "slow_but_alive": "slow but alive",
    "healthy": "healthy",
}
# Phases of a call that has no response head yet.
_BEFORE_HEADERS = frozenset(
    {"pool wait", "connecting", "tls handshake", "sending", "awaiting headers"}
)
_MAX_METRICS_BYTES = 16 * 1024 * 1024
_PROMPT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Reply with the word OK."}]


class DiagnoseError(Exception):
    """A probe could not run (an address unreachable, bad input): the message says why."""


class MetricsError(DiagnoseError, ValueError):
    """The metrics endpoint's answer is not Prometheus text."""


# -- the server's gauges --------------------------------------------------------------------

_SAMPLE = re.compile(
    r"""^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
    (?P<labels>\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?
    [ \t]+(?P<value>\S+)
    (?:[ \t]+-?\d+)?          # a timestamp
    (?:[ \t]+\#.*)?           # an OpenMetrics exemplar
    [ \t]*$""",
    re.VERBOSE,
)


def parse_prometheus(text: str) -> dict[str, float]:
    """Each metric's value summed over its label sets, from Prometheus text.

    Comments (``# HELP``, ``# TYPE``) and blank lines are skipped; every other line must be
    a sample, ``name{labels} value [timestamp]``.

    Raises:
        MetricsError: a line is not a sample (its number and start are named), a value is
            not a number, or there is no sample at all.
    """
    sums: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        value = _number(m.group("value")) if m else None
        if m is None or value is None:
            raise MetricsError(f"line {number} is not a Prometheus sample: {line[:80]!r}")
        name = m.group("name")
        sums[name] = sums.get(name, 0.0) + value
    if not sums:
        raise MetricsError("no Prometheus samples in the answer")
    return sums


def _number(text: str) -> float | None:
    try:
        return float(text)  # also NaN, +Inf, -Inf, as Prometheus writes them
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True)
class Server:
    """The server's own counts, or why they are not known."""

    url: str
    running: float | None = None
    waiting: float | None = None
    #: The gauge names found, per count.
    found: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    problem: str | None = None


def read_gauges(
    samples: Mapping[str, float], gauges: Mapping[str, Sequence[str]]
) -> dict[str, tuple[float | None, str | None]]:
    """Per count (``running``, ``waiting``): the first of its gauge names present (its
    value summed over its label sets) and that name; ``(None, None)`` when none is.

    The names of a count are alternatives — vLLM's, then SGLang's — not parts to add: a
    server that exposes both families (as the fault server does) counts each request once.
    """
    out: dict[str, tuple[float | None, str | None]] = {}
    for count, names in gauges.items():
        found = next((n for n in names if n in samples), None)
        out[count] = (samples[found], found) if found is not None else (None, None)
    return out


async def scrape(
    urls: Sequence[str], gauges: Mapping[str, Sequence[str]], *, timeout: float, required: bool
) -> Server:
    """GET each endpoint through stallproof (each bounded by ``timeout``) and add up its
    gauges: one endpoint per engine (a prefill and a decode engine, say) gives the whole
    server's counts.

    Raises:
        DiagnoseError: ``required`` and an endpoint could not be read, or an answer is not
            Prometheus text (required or not).
    """
    totals: dict[str, float | None] = {"running": None, "waiting": None}
    found: dict[str, list[str]] = {count: [] for count in gauges}
    problems: list[str] = []
    for url in urls:
        samples, problem = await _scrape_one(url, timeout=timeout, required=required)
        if samples is None:
            problems.append(f"{url} not read ({problem}); pass --metrics URL")
            continue
        for count, (value, name) in read_gauges(samples, gauges).items():
            if value is None or name is None:
                problems.append(
                    f"{url} has no gauge for {count} ({' or '.join(gauges[count])});"
                    " name one with --gauge"
                )
                continue
            totals[count] = (totals.get(count) or 0.0) + value
            if name not in found[count]:
                found[count].append(name)
    return Server(
        ", ".join(urls),
        totals["running"],
        totals["waiting"],
        {count: tuple(names) for count, names in found.items()},
        problem="; ".join(problems) or None,
    )


async def _scrape_one(
    url: str, *, timeout: float, required: bool
) -> tuple[dict[str, float] | None, str | None]:
    transport = AsyncTransport(
        timeout=Timeouts(connect=min(timeout, 10.0), total=timeout),
        retry=None,
        limits=Limits(max_response_bytes=_MAX_METRICS_BYTES),
    )
    problem: str | None = None
    async with httpx.AsyncClient(transport=transport) as http:
        try:
            response = await http.get(url)
            body = response.text
        except exc.StallproofError as e:
            problem = f"{type(e).__name__}: {e}"
        else:
            if response.status_code != 200:
                problem = f"HTTP {response.status_code}"
    if problem is not None:
        if required:
            raise DiagnoseError(f"cannot read the server's metrics at {url}: {problem}")
        return None, problem
    try:
        return parse_prometheus(body), None
    except MetricsError as e:
        raise MetricsError(f"the metrics at {url} are not Prometheus text: {e}") from None


def metrics_url(base_url: str) -> str:
    """Where vLLM and SGLang serve their metrics: ``/metrics`` at the base URL's origin."""
    parts = urlsplit(base_url)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


# -- the probe ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Probe:
    """The fresh request: ``answered``, ``stalled`` (a bound fired before it finished),
    ``refused`` (429/503) or ``error``; its timings and what it got."""

    model: str
    outcome: str
    ttft_s: float | None = None
    total_s: float | None = None
    chunks: int = 0
    detail: str | None = None
    status: int | None = None


async def probe(base_url: str, *, api_key: str | None, model: str | None, timeout: float) -> Probe:
    """One streamed request, ``max_tokens=16``, through `stallproof.Client`: its first
    token and each gap after it bounded by ``timeout``, the whole answer by twice that.

    Raises:
        DiagnoseError: the base URL cannot be reached or used (refused, unknown host, bad
            URL), the key is refused, or no model is named and none is listed.
    """
    # The first token, and each gap after it, within ``timeout``; the 16 tokens in all
    # within twice that.
    bounds = Timeouts(
        connect=min(timeout, 10.0), first_token=timeout, idle=timeout, total=2 * timeout
    )
    try:
        async with Client(
            base_url=base_url, api_key=api_key or "none", timeout=bounds, retry=None
        ) as client:
            if model is None:
                model = await _first_model(client, base_url)
            return await _probe(client, model, timeout)
    except exc.InvalidRequestError as e:
        raise DiagnoseError(f"cannot probe {base_url}: {e}") from None


async def _first_model(client: Client, base_url: str) -> str:
    try:
        async for m in client.models.list():
            return str(m.id)
    except exc.ConnectError as e:
        raise DiagnoseError(f"cannot reach {base_url}: {e}") from None
    except exc.StallproofError as e:
        raise DiagnoseError(
            f"cannot list the models at {base_url} ({type(e).__name__}: {e}): pass --model"
        ) from None
    raise DiagnoseError(f"{base_url} lists no model: pass --model")


async def _probe(client: Client, model: str, timeout: float) -> Probe:
    start = time.monotonic()
    ttft: float | None = None
    chunks = 0
    try:
        stream = await client.chat.completions.create(
            model=model, messages=_PROMPT, max_tokens=16, stream=True
        )
        async with stream:
            async for chunk in stream:
                if any(c.delta.content for c in chunk.choices):
                    chunks += 1
                    if ttft is None:
                        ttft = time.monotonic() - start
    except exc.ConnectError as e:
        raise DiagnoseError(f"cannot reach {client.base_url}: {e}") from None
    except exc.TimeoutException as e:
        return Probe(
            model,
            "stalled",
            ttft,
            None,
            chunks,
            f"{type(e).__name__} after {time.monotonic() - start:.2f}s in phase {e.phase!r}",
        )
    except exc.APIStatusError as e:
        if e.status_code in (401, 403, 404):
            raise DiagnoseError(
                f"the probe got HTTP {e.status_code} from {client.base_url}"
                f" ({_short(e)}): check --api-key and --model"
            ) from None
        outcome = "refused" if e.status_code in (429, 503) else "error"
        return Probe(model, outcome, detail=_short(e), status=e.status_code)
    except exc.StallproofError as e:
        return Probe(model, "error", ttft, None, chunks, f"{type(e).__name__}: {_short(e)}")
    if ttft is None:
        return Probe(model, "error", None, time.monotonic() - start, 0, "no content in the answer")
    return Probe(model, "answered", ttft, time.monotonic() - start, chunks)


def _short(e: BaseException) -> str:
    return str(e).splitlines()[0][:200] if str(e) else type(e).__name__


# -- the fleet ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fleet:
    """The fleet's calls, as the published tables showed them (None: not observed)."""

    source: str
    processes: int
    calls: int
    stalled: int
    before_headers: int
    by_phase: Mapping[str, int]
    problems: tuple[str, ...] = ()


def fleet_counts(snap: Snapshot) -> Fleet:
    calls = snap.calls
    phases: dict[str, int] = {}
    for c in calls:
        phases[c.phase] = phases.get(c.phase, 0) + 1
    return Fleet(
        snap.source,
        snap.processes,
        len(calls) + snap.hidden,
        sum(c.stalled for c in calls),
        sum(c.phase in _BEFORE_HEADERS for c in calls),
        phases,
        snap.problems,
    )


# -- the verdict ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Report:
    fleet: Fleet | None
    server: Server
    probe: Probe
    verdict: str
    summary: str
    evidence: tuple[str, ...]

    def numbers(self) -> dict[str, float | int | None]:
        """The numbers the verdict rests on (None: not known)."""
        fleet = self.fleet
        return {
            "fleet_calls": fleet.calls if fleet else None,
            "fleet_stalled": fleet.stalled if fleet else None,
            "fleet_before_headers": fleet.before_headers if fleet else None,
            "server_running": self.server.running,
            "server_waiting": self.server.waiting,
            "probe_ttft_s": _rounded(self.probe.ttft_s),
            "probe_total_s": _rounded(self.probe.total_s),
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "numbers": self.numbers(),
            "fleet": dataclasses.asdict(self.fleet) if self.fleet is not None else None,
            "server": {**dataclasses.asdict(self.server), "found": dict(self.server.found)},
            "probe": {
                **dataclasses.asdict(self.probe),
                "ttft_s": _rounded(self.probe.ttft_s),
                "total_s": _rounded(self.probe.total_s),
            },
        }


def judge(
    fleet: Fleet | None, server: Server, probe: Probe, *, slow_ttft: float
) -> tuple[str, str, tuple[str, ...]]:
    """The verdict, a one-line summary, and the evidence in numbers (see the module's
    table)."""
    verdict, summary = _verdict(fleet, server, probe, slow_ttft)
    evidence = (_fleet_words(fleet), _server_words(server), _probe_words(probe))
    return verdict, f"{HEADLINES[verdict]}: {summary}", evidence


def _verdict(
    fleet: Fleet | None, server: Server, probe: Probe, slow_ttft: float
) -> tuple[str, str]:
    running, waiting = server.running, server.waiting
    counts = f"{_n(running)} running, {_n(waiting)} waiting"
    stalled = fleet.stalled if fleet is not None else 0
    if probe.outcome == "stalled":
        if waiting is not None and waiting > 0:
            return "server_queueing", (
                f"the server reports {counts}, and a fresh probe stalled in its queue"
            )
        return "server_stalled", (
            f"a fresh probe stalled too, and the server reports {counts}: requests reach it"
            " and get no answer"
        )
    if probe.outcome == "refused":
        return "server_queueing", f"it refused a fresh probe with HTTP {probe.status}"
    if probe.outcome == "error" or probe.ttft_s is None:
        return "server_error", f"a fresh probe failed ({probe.detail})"
    ttft = probe.ttft_s
    held = (running or 0) + (waiting or 0)
    if stalled > 0 and stalled > held:
        before = fleet.before_headers if fleet is not None else 0
        server_side = (
            f"the server reports only {counts}"
            if running is not None or waiting is not None
            else "the server's own counts are unknown"
        )
        return "client_stuck", (
            f"{stalled} calls are stalled in the fleet ({before} before headers),"
            f" {server_side}, and a fresh probe answered (first token in {ttft:.3f}s): the"
            " server is not holding them; look at the clients (pool, proxy, connections"
            " that died silently)"
        )
    if (
        waiting is not None
        and waiting > 0
        and (waiting >= max(running or 0, 1) or ttft > slow_ttft)
    ):
        return "server_queueing", f"the server reports {counts}"
    if ttft > slow_ttft:
        return "slow_but_alive", (
            f"the probe's first token took {ttft:.3f}s (over --slow-ttft {slow_ttft:g}s)"
        )
    if stalled > 0:
        return "slow_but_alive", (
            f"{stalled} fleet calls are stalled, and the server holds {_n(held)} requests"
            " and answers new ones"
        )
    return (
        "healthy",
        f"the probe answered (first token in {ttft:.3f}s) and no fleet call is stalled",
    )


def _rounded(value: float | None) -> float | None:
    return round(value, 3) if value is not None else None


def _n(value: float | None) -> str:
    if value is None:
        return "?"
    return str(int(value)) if math.isfinite(value) and value == int(value) else f"{value:g}"


def _fleet_words(fleet: Fleet | None) -> str:
    if fleet is None:
        return "fleet: not observed (no --redis, and no local socket answered)"
    phases = ", ".join(f"{p} {n}" for p, n in fleet.by_phase.items()) or "none"
    return (
        f"fleet: {fleet.calls} calls in flight in {fleet.processes}"
        f" process{'es' if fleet.processes != 1 else ''},"
        f" {fleet.stalled} stalled, {fleet.before_headers} before headers ({phases})"
    )


def _server_words(server: Server) -> str:
    text = f"server: {_n(server.running)} running, {_n(server.waiting)} waiting ({server.url})"
    return f"{text}; {server.problem}" if server.problem else text


def _probe_words(probe: Probe) -> str:
    if probe.outcome == "answered":
        return (
            f"probe: answered, first token in {probe.ttft_s:.3f}s, {probe.chunks} chunks in"
            f" {probe.total_s:.3f}s (model {probe.model!r}, max_tokens=16)"
        )
    return f"probe: {probe.outcome} ({probe.detail}) (model {probe.model!r}, max_tokens=16)"


# -- the command ----------------------------------------------------------------------------


async def diagnose(
    *,
    base_url: str,
    source: Source | None,
    metrics: Sequence[str],
    gauges: Mapping[str, Sequence[str]],
    api_key: str | None,
    model: str | None,
    timeout: float,
    slow_ttft: float,
) -> Report:
    """Run the probes in order — fleet, server gauges, fresh request — then judge.

    Raises:
        DiagnoseError: a probe could not run (its message says which and why).
    """
    if urlsplit(base_url).scheme not in ("http", "https"):
        raise DiagnoseError(f"--base-url must be an http:// or https:// URL, got {base_url!r}")
    fleet = None
    if source is not None:
        try:
            snap = await fetch(source)
        except SourceError as e:
            raise DiagnoseError(str(e)) from None
        if source.redis is not None or snap.tables:
            fleet = fleet_counts(snap)
    server = await scrape(
        metrics or [metrics_url(base_url)], gauges, timeout=timeout, required=bool(metrics)
    )
    answer = await probe(base_url, api_key=api_key, model=model, timeout=timeout)
    verdict, summary, evidence = judge(fleet, server, answer, slow_ttft=slow_ttft)
    return Report(fleet, server, answer, verdict, summary, evidence)


def render(report: Report) -> str:
    return "\n".join([f"verdict: {report.summary}", *(f"  {e}" for e in report.evidence)])
