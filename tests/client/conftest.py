"""Fixtures of the client tests: fleet state on a real Redis, worker processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..support.fleet import FleetWorkers, RedisServer, started_redis

# An autouse fixture: openai's chat models are built before the first timed call.
from ..support.sdk_catalogue import chat_types_built  # noqa: F401


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the session (tests keep apart by `redis_prefix`)."""
    server = started_redis()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test alone, for tests that kill and restart it."""
    server = started_redis()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_prefix(fault_key: str) -> str:
    """A key prefix unique to the test: its fleet state is its own."""
    return f"test-{fault_key}"


@pytest.fixture
def fleet_workers() -> Iterator[FleetWorkers]:
    workers = FleetWorkers()
    try:
        yield workers
    finally:
        workers.kill_all()


@pytest.fixture
def inflight_workers() -> Iterator[FleetWorkers]:
    """Worker processes with calls in flight (tests/support/inflight_worker.py), killed at
    the end of the test."""
    workers = FleetWorkers("inflight_worker.py")
    try:
        yield workers
    finally:
        workers.kill_all()
