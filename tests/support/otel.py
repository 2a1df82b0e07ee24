"""OpenTelemetry as tests read it: attribute values and metric points, checked and typed.

The SDK types an attribute as any `AttributeValue` and a metric's points as the union of
every kind; a test knows which it expects, and these helpers assert it, so a wrong kind
fails as an assertion naming the key rather than as a ``TypeError`` deep in a comparison.
"""

from __future__ import annotations

from typing import TypeVar

from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric
from opentelemetry.sdk.trace import Event, ReadableSpan

ValueT = TypeVar("ValueT")
PointT = TypeVar("PointT")


def attribute(item: ReadableSpan | Event, key: str, kind: type[ValueT]) -> ValueT:
    """The span's (or event's) attribute ``key``, asserted to be a ``kind``."""
    value = (item.attributes or {}).get(key)
    assert isinstance(value, kind), f"{item.name}: {key}={value!r} is not a {kind.__name__}"
    return value


def number(item: ReadableSpan | Event, key: str) -> float:
    """A numeric attribute (int or float, never a bool)."""
    value = (item.attributes or {}).get(key)
    assert isinstance(value, (int, float)) and not isinstance(value, bool), (
        f"{item.name}: {key}={value!r} is not a number"
    )
    return value


def seconds(span: ReadableSpan) -> float:
    """How long an ended span lasted."""
    assert span.start_time is not None and span.end_time is not None, f"{span.name} not ended"
    return (span.end_time - span.start_time) / 1e9


def metrics(reader: InMemoryMetricReader) -> dict[str, Metric]:
    """Every metric the reader collected, by name (asserting it collected any)."""
    data = reader.get_metrics_data()
    assert data is not None, "no metrics collected"
    return {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }


def points(metric: Metric, kind: type[PointT]) -> list[PointT]:
    """The metric's data points, asserted all of ``kind`` (`NumberDataPoint` for a counter,
    `HistogramDataPoint` for a histogram)."""
    found = list(metric.data.data_points)
    typed = [p for p in found if isinstance(p, kind)]
    assert len(typed) == len(found), f"{metric.name}: points are not all {kind.__name__}"
    return typed
