"""Print the span tree of a real call that is retried, then ends at its total deadline.

Runs the fault server in-process, makes one call through `stallproof.Client` inside a
caller's span, and prints every span with its attributes and events: the picture in
docs/telemetry.md comes from this script (`.venv/bin/python scripts/show_trace.py`).
"""

from __future__ import annotations

import anyio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stallproof
from fault_server import running

SHOWN = (
    "gen_ai.",
    "error.type",
    "http.",
    "server.",
    "stallproof.bound",
    "stallproof.phase",
    "stallproof.retry.",
)


def _lines(
    span: ReadableSpan, children: dict[int, list[ReadableSpan]], t0: int, depth: int
) -> list[str]:
    start = ((span.start_time or 0) - t0) / 1e9
    end = ((span.end_time or 0) - t0) / 1e9
    pad = "    " * depth
    out = [f"{pad}{span.name}  [{start:.3f}s → {end:.3f}s]  {span.status.status_code.name}"]
    for k, v in sorted((span.attributes or {}).items()):
        if k.startswith(SHOWN):
            out.append(f"{pad}  · {k} = {v!r}")
    for e in span.events:
        attrs = ", ".join(
            f"{k}={v!r}" for k, v in (e.attributes or {}).items() if k.startswith(SHOWN)
        )
        out.append(f"{pad}  ⚑ {e.name} ({attrs})")
    for child in sorted(children.get(span.context.span_id, []), key=lambda s: s.start_time or 0):
        out.extend(_lines(child, children, t0, depth + 1))
    return out


async def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("harness")
    with running(host="127.0.0.1", port=0) as server:
        # First attempt: 503 (retried); then the server accepts and never answers.
        server.scenario("status", code=503, times=1, key="trace-demo")
        server.scenario("half_open", key="trace-demo")
        url = server.url(key="trace-demo")
        async with stallproof.Client(
            base_url=url,
            api_key="sk-demo",
            timeout=stallproof.Timeouts(total=1.0),
            retry=stallproof.Retry(attempts=3, backoff_base=0.1, backoff_max=0.1),
            tracer_provider=provider,
        ) as client:
            with tracer.start_as_current_span("agent step"):
                try:
                    await client.chat.completions.create(
                        model="gpt-4o-mini",
                        messages=[{"role": "user", "content": "hi"}],
                        agent="planner",
                    )
                except stallproof.TotalTimeout as e:
                    print(f"# raised: {e!r}\n")
    spans = exporter.get_finished_spans()
    children: dict[int, list[ReadableSpan]] = {}
    for s in spans:
        if s.parent is not None:
            children.setdefault(s.parent.span_id, []).append(s)
    (root,) = [s for s in spans if s.parent is None]
    print("\n".join(_lines(root, children, root.start_time or 0, 0)))


if __name__ == "__main__":
    anyio.run(main)
