"""Fixtures of the SDK and transport tests."""

from __future__ import annotations

# An autouse fixture: the SDKs' models are built before the first timed call.
from ..support.sdk_catalogue import sdk_types_built  # noqa: F401
