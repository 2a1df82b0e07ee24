"""Pytest fixtures for the fault server (the ``fault_server`` pytest11 entry point).

- ``fault_server`` (session): a `ServerThread` on a free loopback port, shared by every test.
  It runs its own asyncio loop in a daemon thread, so sync, asyncio and trio tests can all use
  it, and a test whose client blocks cannot stall it.
- ``fault_key`` (function): a key unique to the test, so that ``key=...;first=N`` sequences
  and `key_stats` never mix between tests (or between runs of a shared server). When the
  test ends the shared server forgets it (journal entries, counts, rules, mix draws), so a
  long session's server holds only what running tests made.
- ``fault_scope`` (function): a `FaultScope` of the shared server with the test's key:
  URLs, scenarios, stats, journal and verdict for that key only; its scenarios (and its
  mix) are disarmed and the key forgotten when the test ends.

The ``fault_server_max_hold`` ini option caps every fault's ``hold`` (default 30 s).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator

import pytest

from ._scope import FaultScope
from ._server_thread import ServerThread, running

__all__ = ["fault_key", "fault_scope", "fault_server"]

_DEFAULT_MAX_HOLD = 30.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "fault_server_max_hold",
        "Most seconds any fault of the fault_server fixture keeps a connection (default 30).",
        default=str(_DEFAULT_MAX_HOLD),
    )


@pytest.fixture(scope="session")
def fault_server(pytestconfig: pytest.Config) -> Iterator[ServerThread]:
    """A fault server on 127.0.0.1 and a free port, for the whole session."""
    max_hold = float(pytestconfig.getini("fault_server_max_hold"))
    with running(host="127.0.0.1", port=0, max_hold=max_hold) as srv:
        yield srv


@pytest.fixture
def fault_key(request: pytest.FixtureRequest) -> Iterator[str]:
    """A key unique to this test: its name made URL-safe, and random hex. When the test
    ends, the shared server (if the test used it) forgets the key."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-")[:60]
    key = f"{name}-{secrets.token_hex(4)}"
    yield key
    if "fault_server" in request.fixturenames:
        server: ServerThread = request.getfixturevalue("fault_server")
        server.forget(key)


@pytest.fixture
def fault_scope(fault_server: ServerThread, fault_key: str) -> Iterator[FaultScope]:
    """The shared server seen through this test's key; disarmed and forgotten when the
    test ends."""
    scope = fault_server.scope(fault_key)
    try:
        yield scope
    finally:
        scope.forget()
