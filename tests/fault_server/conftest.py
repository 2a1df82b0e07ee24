"""Fixtures of the fault server tests.

`no_server_errors` is opt-in, per module (``pytestmark =
pytest.mark.usefixtures("no_server_errors")``), as it was before the tests were grouped;
making it autouse for the whole group is a separate change.
`upstream` and `proxy` are one upstream server and a proxy in front of it, per module.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

import fault_server
from fault_server import ServerThread


@pytest.fixture
def no_server_errors(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A handler that fails, or a task that dies noisily, fails the test that caused it."""
    caplog.set_level(logging.WARNING)
    yield
    noisy = [
        r
        for r in caplog.records
        if r.name in {"fault_server", "asyncio"} and r.levelno >= logging.ERROR
    ]
    assert not noisy, [r.getMessage() for r in noisy]


@pytest.fixture
def srv(fault_server: ServerThread) -> ServerThread:
    return fault_server


@pytest.fixture
def own() -> Iterator[ServerThread]:
    """A server of this test's own, for exact counts."""
    with fault_server.running(port=0, max_hold=5.0) as server:
        yield server


@pytest.fixture(scope="module")
def upstream() -> Iterator[ServerThread]:
    with fault_server.running(max_hold=5) as server:
        yield server


@pytest.fixture(scope="module")
def proxy(upstream: ServerThread) -> Iterator[ServerThread]:
    with fault_server.running(max_hold=5, upstream=upstream.url()) as server:
        yield server
